//! The exact-epoch plan: a pure function of (shard counts, seed, epoch, world size, workers per
//! rank, batch size, block size) that says which samples every reader reads and in which order,
//! and how an interrupted epoch resumes, also onto another world size.
//!
//! The contract, with the reasons for every rule, is `docs/epoch-plan.md`. In short:
//!
//! 1. **Sequence.** Phase 0 orders the shards by a permutation of (seed, epoch), rotates the valid
//!    ordinals of every shard by an offset of (seed, epoch, shard) and concatenates them: N samples,
//!    held as runs of consecutive ordinals (memory grows with shards, not samples).
//! 2. **Cut.** With G = world x batch, rank r gets the r-th contiguous slice of the first
//!    N - N % G samples; the N % G tail is the reported remainder and the ranks' reserve of
//!    replacements for samples that turn out corrupt at run time (`drop_last = false` instead
//!    gives every rank one short batch of the same size, padded with repeats).
//! 3. **Readers.** A rank's K readers (DataLoader workers; one when K = 0) get contiguous,
//!    balanced batch ranges, so torch's round-robin over workers yields them in a known order.
//! 4. **Blocks.** Each reader's sequence is cut into blocks of `block_size` samples; each block is
//!    emitted in a permutation of (seed, epoch, phase, rank, reader, block). Batches are
//!    consecutive `batch_size` samples of the emitted order.
//! 5. **Resume.** A state records, per phase, the configuration and the batches every rank
//!    yielded. The same configuration continues exactly; another one removes what was consumed
//!    and plans the rest, in sequence order, as a new phase.
//!
//! Nothing here knows about Python, I/O or tensors; all randomness comes from [`crate::rng`].

use crate::rng::{derive_seed, permutation, SplitMix64};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Domain tags, the first part of every derived seed, so the streams can never coincide.
const TAG_SHARD_ORDER: u64 = 1;
const TAG_ROTATION: u64 = 2;
const TAG_BLOCK: u64 = 3;
const TAG_NO_INDEX: u64 = 4;

/// `format` of a serialized [`EpochState`].
pub const STATE_FORMAT: &str = "shardstream-epoch-state";
/// The state version this code writes and reads.
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("invalid plan configuration: {0}")]
    Config(String),
    #[error("invalid shard counts: {0}")]
    Input(String),
    #[error("cannot resume from this loader state: {0}")]
    State(String),
    #[error(
        "cannot resume: the loader state was saved for another dataset index \
         (state fingerprint {state:016x}, this index {index:016x})"
    )]
    OtherDataset { state: u64, index: u64 },
}

/// Consecutive sample ordinals `start..end` of one shard (ordinals count every sample of the
/// shard in file order, invalid ones included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Run {
    pub shard: u32,
    pub start: u64,
    pub end: u64,
}

impl Run {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// What the plan needs to know of one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Samples in the shard, invalid ones included.
    pub num_samples: u64,
    /// Ordinals of invalid samples (any order; [`PlanInput::new`] sorts them).
    pub invalid: Vec<u64>,
}

/// The dataset as the plan sees it: per-shard counts and a fingerprint that identifies the
/// dataset in resume states (`Index::fingerprint` for an index).
#[derive(Clone, Debug)]
pub struct PlanInput {
    /// Shared: every plan of the dataset keeps a handle (the phase sequence reads invalid
    /// ordinals from it), and a clone costs nothing.
    shards: Arc<Vec<ShardCounts>>,
    fingerprint: u64,
    num_valid: u64,
}

impl PlanInput {
    /// Checks the counts (invalid ordinals in range) and sorts and deduplicates invalid ordinals.
    pub fn new(mut shards: Vec<ShardCounts>, fingerprint: u64) -> Result<Self, PlanError> {
        if shards.len() > u32::MAX as usize {
            return Err(PlanError::Input(format!(
                "{} shards, at most {} supported",
                shards.len(),
                u32::MAX
            )));
        }
        let mut num_valid: u64 = 0;
        for (i, shard) in shards.iter_mut().enumerate() {
            shard.invalid.sort_unstable();
            shard.invalid.dedup();
            if let Some(&bad) = shard.invalid.last() {
                if bad >= shard.num_samples {
                    return Err(PlanError::Input(format!(
                        "shard {i}: invalid ordinal {bad} but the shard has {} samples",
                        shard.num_samples
                    )));
                }
            }
            num_valid = num_valid
                .checked_add(shard.num_samples - shard.invalid.len() as u64)
                .ok_or_else(|| PlanError::Input("sample count overflows u64".into()))?;
        }
        Ok(Self {
            shards: Arc::new(shards),
            fingerprint,
            num_valid,
        })
    }

    /// Invalid ordinals of `shard`, sorted.
    fn invalid(&self, shard: u32) -> &[u64] {
        &self.shards[shard as usize].invalid
    }

    /// Valid samples among ordinals `start..end` of `shard`.
    fn valid_in(&self, shard: u32, start: u64, end: u64) -> u64 {
        let inv = self.invalid(shard);
        let bad = inv.partition_point(|&o| o < end) - inv.partition_point(|&o| o < start);
        end - start - bad as u64
    }

    /// The ordinal of the `k`-th valid sample (from 0) at or after ordinal `start` of `shard`.
    fn nth_valid(&self, shard: u32, start: u64, k: u64) -> u64 {
        let inv = self.invalid(shard);
        let mut ordinal = start + k;
        for &bad in &inv[inv.partition_point(|&o| o < start)..] {
            if bad > ordinal {
                break;
            }
            ordinal += 1;
        }
        ordinal
    }

    /// Shards with these sample counts and no invalid samples; the fingerprint hashes the counts.
    /// For tests and for datasets known only by counts.
    pub fn from_counts(counts: &[u64]) -> Self {
        let fingerprint = derive_seed(&[counts.len() as u64, derive_seed(counts)]);
        let shards = counts
            .iter()
            .map(|&n| ShardCounts {
                num_samples: n,
                invalid: Vec::new(),
            })
            .collect();
        Self::new(shards, fingerprint).expect("counts without invalid samples are always valid")
    }

    pub fn shards(&self) -> &[ShardCounts] {
        &self.shards
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Valid samples over all shards.
    pub fn num_valid(&self) -> u64 {
        self.num_valid
    }
}

/// How one phase of an epoch is laid out. A fresh epoch is one phase; every resume under a
/// different configuration starts another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PhaseConfig {
    /// Ranks (W).
    pub world_size: u32,
    /// DataLoader worker processes per rank (K); 0 means one reader in the main process.
    pub workers: u32,
    /// Samples per batch on one rank (B).
    pub batch_size: u64,
    /// Samples per shuffle block (C): each reader emits every block of C consecutive samples of
    /// its sequence in a random order. Memory of a reader grows with C.
    pub block_size: u64,
    /// true: drop the tail (< one global batch) and keep it as the reserve. false: every rank
    /// yields one more, short batch of the same size; padded with repeated samples.
    pub drop_last: bool,
}

impl PhaseConfig {
    /// Readers per rank: the workers, or 1 for the main process.
    pub fn readers_per_rank(&self) -> u32 {
        self.workers.max(1)
    }

    /// world_size x batch_size.
    pub fn global_batch(&self) -> u64 {
        self.world_size as u64 * self.batch_size
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.world_size == 0 {
            return Err(PlanError::Config("world_size must be at least 1".into()));
        }
        if self.batch_size == 0 {
            return Err(PlanError::Config("batch_size must be at least 1".into()));
        }
        if self.block_size == 0 || self.block_size > u32::MAX as u64 {
            return Err(PlanError::Config(format!(
                "block_size must be between 1 and {}, got {}",
                u32::MAX,
                self.block_size
            )));
        }
        if (self.world_size as u64)
            .checked_mul(self.batch_size)
            .is_none()
        {
            return Err(PlanError::Config(
                "world_size x batch_size overflows u64".into(),
            ));
        }
        Ok(())
    }
}

/// How many batches reader `reader` of a rank's `readers` has yielded once the rank yielded
/// `rank_batches`: the rank's n-th batch comes from reader n mod K (torch's DataLoader
/// round-robin, with balanced reader batch counts, earlier readers holding the extra batch).
pub fn reader_batches_done(rank_batches: u64, readers: u32, reader: u32) -> u64 {
    let (n, k, w) = (rank_batches, readers.max(1) as u64, reader as u64);
    if n > w {
        (n - w).div_ceil(k)
    } else {
        0
    }
}

/// The order in which a rank yields its readers' batches, as (reader, batch of that reader):
/// round-robin over the readers, skipping readers that have no batch left, which is what a
/// torch DataLoader with `in_order=True` does over its iterable workers. With the balanced
/// counts of a plan it agrees with [`reader_batches_done`].
pub fn rank_batch_order(counts: &[u64]) -> Vec<(u32, u64)> {
    let total: u64 = counts.iter().sum();
    let mut next = vec![0u64; counts.len()];
    let mut order = Vec::with_capacity(total as usize);
    while (order.len() as u64) < total {
        for (w, &count) in counts.iter().enumerate() {
            if next[w] < count {
                order.push((w as u32, next[w]));
                next[w] += 1;
            }
        }
    }
    order
}

/// A sequence of samples held as runs, with the end position of each run for lookups.
///
/// A phase's sequence (the whole dataset's) keeps a shard's invalid ordinals inside its runs, so
/// it holds about two runs per shard however many samples validation rejected: `ends` count
/// valid samples only, and positions are found with the plan input's invalid ordinals. A
/// reader's sequence (few shards) is split around them, so its runs hold valid samples only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Sequence {
    runs: Vec<Run>,
    ends: Vec<u64>,
}

/// Where a sequence's runs may hold invalid ordinals: the input that knows them.
type Invalids<'a> = Option<&'a PlanInput>;

fn valid_len(invalids: Invalids<'_>, run: &Run) -> u64 {
    match invalids {
        Some(input) => input.valid_in(run.shard, run.start, run.end),
        None => run.len(),
    }
}

impl Sequence {
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Appends a run, merging it into the last one when it continues it.
    fn push(&mut self, run: Run, invalids: Invalids<'_>) {
        let valid = valid_len(invalids, &run);
        if valid == 0 {
            return;
        }
        if let (Some(last), Some(end)) = (self.runs.last_mut(), self.ends.last_mut()) {
            if last.shard == run.shard && last.end == run.start {
                last.end = run.end;
                *end += valid;
                return;
            }
        }
        let end = self.len() + valid;
        self.runs.push(run);
        self.ends.push(end);
    }

    /// Appends the samples at positions `from..to` (to <= len) to `out`. `invalids`: this
    /// sequence's runs may hold invalid ordinals (a phase sequence). With `split`, `out` gets
    /// only valid ordinals (a reader's sequence); without, runs keep what they hold.
    fn copy_range(
        &self,
        invalids: Invalids<'_>,
        from: u64,
        to: u64,
        out: &mut Sequence,
        split: bool,
    ) {
        if from >= to {
            return;
        }
        let mut i = self.ends.partition_point(|&e| e <= from);
        let mut pos = from;
        while pos < to {
            let run = self.runs[i];
            let run_first = self.ends[i] - valid_len(invalids, &run);
            let take = self.ends[i].min(to) - pos;
            let (skip, last) = (pos - run_first, pos - run_first + take - 1);
            let (start, end) = match invalids {
                Some(input) => (
                    input.nth_valid(run.shard, run.start, skip),
                    input.nth_valid(run.shard, run.start, last) + 1,
                ),
                None => (run.start + skip, run.start + last + 1),
            };
            match invalids {
                Some(input) if split => {
                    push_valid(out, run.shard, start, end, input.invalid(run.shard))
                }
                _ => out.push(
                    Run {
                        shard: run.shard,
                        start,
                        end,
                    },
                    if split { None } else { invalids },
                ),
            }
            pos += take;
            i += 1;
        }
    }

    /// The samples at positions `from..to` as (shard, ordinal), of a sequence of valid runs.
    fn samples(&self, from: u64, to: u64) -> Vec<(u32, u64)> {
        let mut part = Sequence::default();
        self.copy_range(None, from, to, &mut part, true);
        part.runs
            .iter()
            .flat_map(|r| (r.start..r.end).map(move |o| (r.shard, o)))
            .collect()
    }

    /// This phase sequence without the positions in `removed` (sorted, disjoint ranges), in order.
    fn without(&self, input: &PlanInput, removed: &[(u64, u64)]) -> Sequence {
        // Each removed range splits at most one run in two: reserve once instead of doubling.
        let capacity = self.runs.len() + removed.len() + 1;
        let mut out = Sequence {
            runs: Vec::with_capacity(capacity),
            ends: Vec::with_capacity(capacity),
        };
        let mut pos = 0;
        for &(a, b) in removed {
            self.copy_range(Some(input), pos, a, &mut out, false);
            pos = b;
        }
        self.copy_range(Some(input), pos, self.len(), &mut out, false);
        out.runs.shrink_to_fit();
        out.ends.shrink_to_fit();
        out
    }
}

/// Appends the valid ordinals `start..end` of a shard, split around its invalid ordinals.
fn push_valid(seq: &mut Sequence, shard: u32, start: u64, end: u64, invalid: &[u64]) {
    let mut cur = start;
    for &bad in &invalid[invalid.partition_point(|&x| x < start)..] {
        if bad >= end {
            break;
        }
        seq.push(
            Run {
                shard,
                start: cur,
                end: bad,
            },
            None,
        );
        cur = bad + 1;
    }
    seq.push(
        Run {
            shard,
            start: cur,
            end,
        },
        None,
    );
}

/// Phase 0's sequence: shards in a permuted order, each shard's valid ordinals rotated.
fn global_sequence(input: &PlanInput, seed: u64, epoch: u64) -> Sequence {
    let order = permutation(
        input.shards.len(),
        derive_seed(&[TAG_SHARD_ORDER, seed, epoch]),
    );
    let mut seq = Sequence::default();
    for shard in order {
        let counts = &input.shards[shard as usize];
        if counts.num_samples == 0 {
            continue;
        }
        let rotation = SplitMix64::new(derive_seed(&[TAG_ROTATION, seed, epoch, shard as u64]))
            .below(counts.num_samples);
        // Invalid ordinals stay inside the runs (see `Sequence`): two runs per shard.
        seq.push(
            Run {
                shard,
                start: rotation,
                end: counts.num_samples,
            },
            Some(input),
        );
        seq.push(
            Run {
                shard,
                start: 0,
                end: rotation,
            },
            Some(input),
        );
    }
    seq
}

/// `total * i / parts` without overflow: the start of part `i` when `total` is split evenly.
fn share(total: u64, parts: u64, i: u64) -> u64 {
    (total as u128 * i as u128 / parts as u128) as u64
}

/// The block shuffle of one reader: its sequence of `len` samples is cut into blocks of
/// `block_size`, and block b is emitted in the order `permutation(len_b, derive_seed([base, b]))`
/// (sample j of the emitted block is sample `perm[j]` of the block in sequence order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockShuffle {
    base_seed: u64,
    block_size: u64,
    len: u64,
}

impl BlockShuffle {
    fn new(
        seed: u64,
        epoch: u64,
        phase: u32,
        rank: u32,
        reader: u32,
        block_size: u64,
        len: u64,
    ) -> Self {
        let base_seed = derive_seed(&[
            TAG_BLOCK,
            seed,
            epoch,
            phase as u64,
            rank as u64,
            reader as u64,
        ]);
        Self {
            base_seed,
            block_size,
            len,
        }
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Block b is permuted with `derive_seed([base_seed, b])`; the pipeline needs only this.
    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    /// Samples in the reader's whole sequence (all blocks).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn num_blocks(&self) -> u64 {
        self.len.div_ceil(self.block_size)
    }

    /// Samples in block `block`: `block_size`, less for the last one.
    pub fn block_len(&self, block: u64) -> u64 {
        self.block_size
            .min(self.len.saturating_sub(block * self.block_size))
    }

    /// The emission order of block `block`: emitted sample j is the block's `perm[j]`-th sample.
    pub fn block_permutation(&self, block: u64) -> Vec<u32> {
        permutation(
            self.block_len(block) as usize,
            derive_seed(&[self.base_seed, block]),
        )
    }
}

/// One rank's reader sequence as ranges of the phase sequence: its contiguous full batches,
/// and for `drop_last = false` maybe the rank's short batch (whose positions wrap past the end).
#[derive(Clone, Copy, Debug)]
struct Segments {
    parts: [(u64, u64); 2],
    seq_len: u64,
}

impl Segments {
    fn len(&self) -> u64 {
        self.parts.iter().map(|(a, b)| b - a).sum()
    }

    /// Calls `f` with the phase-sequence ranges (each inside 0..seq_len) of reader positions
    /// `from..to`.
    fn for_each(&self, from: u64, to: u64, mut f: impl FnMut(u64, u64)) {
        let mut base = 0;
        for &(a, b) in &self.parts {
            let (lo, hi) = (from.max(base), to.min(base + (b - a)));
            let (mut p, end) = (a + lo.saturating_sub(base), a + hi.saturating_sub(base));
            while lo < hi && p < end {
                let q = p % self.seq_len;
                let take = (end - p).min(self.seq_len - q);
                f(q, q + take);
                p += take;
            }
            base += b - a;
        }
    }
}

/// Where every reader's batches and reserve lie in a phase sequence of `len` samples.
#[derive(Clone, Copy, Debug)]
struct Layout {
    config: PhaseConfig,
    len: u64,
    /// Full batches per rank.
    full: u64,
    /// Size of every rank's short last batch (`drop_last = false`), 0 when there is none.
    partial: u64,
}

impl Layout {
    fn new(len: u64, config: PhaseConfig) -> Self {
        let g = config.global_batch();
        let rest = len % g;
        let partial = if config.drop_last || rest == 0 {
            0
        } else {
            rest.div_ceil(config.world_size as u64)
        };
        Self {
            config,
            len,
            full: len / g,
            partial,
        }
    }

    fn readers(&self) -> u64 {
        self.config.readers_per_rank() as u64
    }

    fn batches_per_rank(&self) -> u64 {
        self.full + u64::from(self.partial > 0)
    }

    fn tail_start(&self) -> u64 {
        self.full * self.config.global_batch()
    }

    /// Samples no rank yields (`drop_last = true`): the remainder, used as the reserve.
    fn tail_len(&self) -> u64 {
        if self.config.drop_last {
            self.len - self.tail_start()
        } else {
            0
        }
    }

    /// Repeated samples that fill the short batches (`drop_last = false`).
    fn padding(&self) -> u64 {
        if self.partial > 0 {
            self.partial * self.config.world_size as u64 - (self.len - self.tail_start())
        } else {
            0
        }
    }

    /// (first, count) of reader `w`'s full batches within its rank's slice.
    fn reader_full(&self, w: u64) -> (u64, u64) {
        let (base, extra) = (self.full / self.readers(), self.full % self.readers());
        (w * base + w.min(extra), base + u64::from(w < extra))
    }

    /// The reader whose last batch is the rank's short one: the one the round-robin reaches at
    /// the rank's last position.
    fn owns_partial(&self, w: u64) -> bool {
        self.partial > 0 && self.full % self.readers() == w
    }

    fn reader_batches(&self, w: u64) -> u64 {
        self.reader_full(w).1 + u64::from(self.owns_partial(w))
    }

    fn reader_segments(&self, rank: u64, w: u64) -> Segments {
        let b = self.config.batch_size;
        let (first, count) = self.reader_full(w);
        let rank_base = rank * self.full * b;
        let full = (rank_base + first * b, rank_base + (first + count) * b);
        let short = if self.owns_partial(w) {
            let a = self.tail_start() + rank * self.partial;
            (a, a + self.partial)
        } else {
            (0, 0)
        };
        Segments {
            parts: [full, short],
            seq_len: self.len,
        }
    }

    /// Phase-sequence range of reader `w`'s reserve: its even share of its rank's share of the tail.
    fn reserve_range(&self, rank: u64, w: u64) -> (u64, u64) {
        let (tail, world) = (self.tail_len(), self.config.world_size as u64);
        let ra = self.tail_start() + share(tail, world, rank);
        let rlen = share(tail, world, rank + 1) - share(tail, world, rank);
        (
            ra + share(rlen, self.readers(), w),
            ra + share(rlen, self.readers(), w + 1),
        )
    }
}

/// Reserve samples a reader used as replacements for samples that failed at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReserveUse {
    pub rank: u32,
    /// The phase reader ([`ReaderPlan::reader`]), not the DataLoader worker id.
    pub reader: u32,
    pub used: u64,
}

/// One phase of a resume state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseRecord {
    #[serde(flatten)]
    pub config: PhaseConfig,
    /// Batches every rank yielded in this phase (the same on all ranks).
    pub batches_done: u64,
    /// Reserve samples used, per reader; readers that used none are left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserve_used: Vec<ReserveUse>,
}

/// Everything needed to resume an epoch: small, identical on every rank, serialized as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochState {
    pub format: String,
    pub version: u32,
    pub seed: u64,
    pub epoch: u64,
    /// The dataset's fingerprint, written as 16 hex digits.
    #[serde(with = "hex_u64")]
    pub index_fingerprint: u64,
    /// Valid samples in the dataset, a second check that the state fits the index.
    pub num_samples: u64,
    pub phases: Vec<PhaseRecord>,
}

impl EpochState {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an epoch state always serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, PlanError> {
        let state: Self = serde_json::from_slice(bytes)
            .map_err(|e| PlanError::State(format!("malformed state JSON: {e}")))?;
        if state.format != STATE_FORMAT {
            return Err(PlanError::State(format!(
                "format is {:?}, expected {STATE_FORMAT:?}",
                state.format
            )));
        }
        if state.version != STATE_VERSION {
            return Err(PlanError::State(format!(
                "state version {} is not supported (this shardstream reads version {STATE_VERSION})",
                state.version
            )));
        }
        Ok(state)
    }
}

mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{value:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

/// The plan of one epoch in its current phase; cheap to build (linear in shards), and every
/// rank builds the same one. Hand [`EpochPlan::reader`] to each reader.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    seed: u64,
    epoch: u64,
    fingerprint: u64,
    num_valid: u64,
    /// Earlier phases of this epoch, as recorded in the state we resumed from.
    history: Vec<PhaseRecord>,
    phase: u32,
    layout: Layout,
    /// The phase sequence; its runs hold invalid ordinals, which `input` knows.
    sequence: Sequence,
    input: PlanInput,
    /// Batches per rank already yielded in this phase before this plan starts.
    start: u64,
    /// Reserve samples already used in this phase before this plan starts.
    reserve_used: Vec<ReserveUse>,
}

impl EpochPlan {
    /// The plan of a fresh epoch.
    pub fn new(
        input: &PlanInput,
        seed: u64,
        epoch: u64,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        config.validate()?;
        let sequence = global_sequence(input, seed, epoch);
        Ok(Self {
            seed,
            epoch,
            fingerprint: input.fingerprint,
            num_valid: input.num_valid,
            history: Vec::new(),
            phase: 0,
            layout: Layout::new(sequence.len(), config),
            sequence,
            input: input.clone(),
            start: 0,
            reserve_used: Vec::new(),
        })
    }

    /// The plan that continues the epoch recorded in `state`. With the configuration of the
    /// state's last phase, the phase continues exactly where it stopped; with any other, what was
    /// consumed is removed and the rest is planned as a new phase (seed and epoch come from the
    /// state).
    pub fn resume(
        input: &PlanInput,
        state: &EpochState,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        if state.index_fingerprint != input.fingerprint {
            return Err(PlanError::OtherDataset {
                state: state.index_fingerprint,
                index: input.fingerprint,
            });
        }
        if state.num_samples != input.num_valid {
            return Err(PlanError::State(format!(
                "the state counts {} valid samples, this index {}",
                state.num_samples, input.num_valid
            )));
        }
        config.validate()?;
        let (seed, epoch) = (state.seed, state.epoch);
        let mut sequence = global_sequence(input, seed, epoch);
        for (p, record) in state.phases.iter().enumerate() {
            let phase = u32::try_from(p).map_err(|_| PlanError::State("too many phases".into()))?;
            record.config.validate()?;
            let layout = Layout::new(sequence.len(), record.config);
            check_record(&layout, record)?;
            if p + 1 == state.phases.len() && record.config == config {
                return Ok(Self {
                    seed,
                    epoch,
                    fingerprint: input.fingerprint,
                    num_valid: input.num_valid,
                    history: state.phases[..p].to_vec(),
                    phase,
                    layout,
                    sequence,
                    input: input.clone(),
                    start: record.batches_done,
                    reserve_used: record.reserve_used.clone(),
                });
            }
            let consumed = consumed_ranges(&layout, seed, epoch, phase, record);
            sequence = sequence.without(input, &consumed);
        }
        let phase = u32::try_from(state.phases.len())
            .map_err(|_| PlanError::State("too many phases".into()))?;
        Ok(Self {
            seed,
            epoch,
            fingerprint: input.fingerprint,
            num_valid: input.num_valid,
            history: state.phases.clone(),
            phase,
            layout: Layout::new(sequence.len(), config),
            sequence,
            input: input.clone(),
            start: 0,
            reserve_used: Vec::new(),
        })
    }

    pub fn config(&self) -> PhaseConfig {
        self.layout.config
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Index of the current phase (0 for a fresh epoch).
    pub fn phase(&self) -> u32 {
        self.phase
    }

    /// Samples in the current phase's sequence (all valid samples in phase 0).
    pub fn num_samples(&self) -> u64 {
        self.layout.len
    }

    /// Batches every rank yields from here on (what `len()` of a loader reports).
    pub fn num_batches(&self) -> u64 {
        self.layout.batches_per_rank() - self.start
    }

    /// Batches every rank yields in the whole current phase.
    pub fn phase_batches(&self) -> u64 {
        self.layout.batches_per_rank()
    }

    /// Batches per rank already yielded in this phase when this plan starts.
    pub fn batches_done(&self) -> u64 {
        self.start
    }

    /// The samples dropped by `drop_last` (fewer than one global batch), in sequence order.
    /// They are also the reserve: those a reader used as replacements were yielded after all.
    pub fn remainder(&self) -> Vec<Run> {
        let mut out = Sequence::default();
        self.sequence.copy_range(
            Some(&self.input),
            self.layout.tail_start(),
            self.layout.tail_start() + self.layout.tail_len(),
            &mut out,
            true,
        );
        out.runs
    }

    pub fn remainder_len(&self) -> u64 {
        self.layout.tail_len()
    }

    /// Repeated samples that pad the short last batches when `drop_last` is false.
    pub fn padding(&self) -> u64 {
        self.layout.padding()
    }

    /// The plan of DataLoader worker `worker` (0 when `workers` is 0) of rank `rank`.
    ///
    /// After a resume inside a phase, the DataLoader starts its round-robin at worker 0 again,
    /// so worker d plays the phase reader `(d + batches_done) mod K`: that keeps the batches in
    /// exactly the order an uninterrupted run would have yielded them.
    pub fn reader(&self, rank: u32, worker: u32) -> Result<ReaderPlan, PlanError> {
        let config = self.layout.config;
        if rank >= config.world_size {
            return Err(PlanError::Config(format!(
                "rank {rank} is outside world_size {}",
                config.world_size
            )));
        }
        let k = config.readers_per_rank();
        if worker >= k {
            return Err(PlanError::Config(format!(
                "worker {worker} is outside {} readers per rank",
                k
            )));
        }
        let reader = ((worker as u64 + self.start) % k as u64) as u32;
        let (r, w) = (rank as u64, reader as u64);
        let segments = self.layout.reader_segments(r, w);
        let len = segments.len();
        let total = self.layout.reader_batches(w);
        let done = reader_batches_done(self.start, k, reader);
        let emitted = (done * config.batch_size).min(len);
        let block_size = config.block_size;
        let first_block = emitted / block_size;
        let mut sequence = Sequence::default();
        segments.for_each(first_block * block_size, len, |a, b| {
            self.sequence
                .copy_range(Some(&self.input), a, b, &mut sequence, true)
        });
        let used = find_reserve_use(&self.reserve_used, rank, reader);
        let (ra, rb) = self.layout.reserve_range(r, w);
        let mut reserve = Sequence::default();
        self.sequence.copy_range(
            Some(&self.input),
            (ra + used).min(rb),
            rb,
            &mut reserve,
            true,
        );
        let num_batches = total - done;
        let last_batch_size = match num_batches {
            0 => 0,
            _ if self.layout.owns_partial(w) => self.layout.partial,
            _ => config.batch_size,
        };
        Ok(ReaderPlan {
            rank,
            worker,
            reader,
            phase: self.phase,
            shuffle: BlockShuffle::new(
                self.seed, self.epoch, self.phase, rank, reader, block_size, len,
            ),
            first_block,
            skip_emitted: emitted % block_size,
            num_batches,
            batch_size: config.batch_size,
            last_batch_size,
            sequence,
            reserve: reserve.runs,
        })
    }

    /// The state after every rank yielded `batches_yielded` more batches of this plan, and readers
    /// used `reserve_used` more reserve samples (gathered from all ranks; may be empty).
    pub fn state(
        &self,
        batches_yielded: u64,
        reserve_used: &[ReserveUse],
    ) -> Result<EpochState, PlanError> {
        let batches_done = self.start + batches_yielded;
        let mut merged = self.reserve_used.clone();
        for u in reserve_used {
            match merged
                .iter_mut()
                .find(|m| m.rank == u.rank && m.reader == u.reader)
            {
                Some(m) => m.used += u.used,
                None => merged.push(*u),
            }
        }
        merged.retain(|u| u.used > 0);
        merged.sort_by_key(|u| (u.rank, u.reader));
        let record = PhaseRecord {
            config: self.layout.config,
            batches_done,
            reserve_used: merged,
        };
        check_record(&self.layout, &record)?;
        let mut phases = self.history.clone();
        phases.push(record);
        Ok(EpochState {
            format: STATE_FORMAT.to_string(),
            version: STATE_VERSION,
            seed: self.seed,
            epoch: self.epoch,
            index_fingerprint: self.fingerprint,
            num_samples: self.num_valid,
            phases,
        })
    }
}

fn find_reserve_use(uses: &[ReserveUse], rank: u32, reader: u32) -> u64 {
    uses.iter()
        .filter(|u| u.rank == rank && u.reader == reader)
        .map(|u| u.used)
        .sum()
}

/// Checks that a phase record can have happened under its layout.
fn check_record(layout: &Layout, record: &PhaseRecord) -> Result<(), PlanError> {
    let total = layout.batches_per_rank();
    if record.batches_done > total {
        return Err(PlanError::State(format!(
            "{} batches done, but this phase has only {total} batches per rank",
            record.batches_done
        )));
    }
    for u in &record.reserve_used {
        if u.rank >= layout.config.world_size || u.reader >= layout.config.readers_per_rank() {
            return Err(PlanError::State(format!(
                "reserve use for unknown reader {} of rank {}",
                u.reader, u.rank
            )));
        }
        let (a, b) = layout.reserve_range(u.rank as u64, u.reader as u64);
        if find_reserve_use(&record.reserve_used, u.rank, u.reader) > b - a {
            return Err(PlanError::State(format!(
                "reader {} of rank {} used more than its {} reserve samples",
                u.reader,
                u.rank,
                b - a
            )));
        }
    }
    Ok(())
}

/// Phase-sequence positions consumed in a phase: every reader's first emitted samples of its
/// done batches, plus the reserve samples it used. Sorted, disjoint ranges.
fn consumed_ranges(
    layout: &Layout,
    seed: u64,
    epoch: u64,
    phase: u32,
    record: &PhaseRecord,
) -> Vec<(u64, u64)> {
    let config = layout.config;
    let (k, block_size) = (config.readers_per_rank(), config.block_size);
    let mut ranges = Vec::new();
    for rank in 0..config.world_size {
        for reader in 0..k {
            let (r, w) = (rank as u64, reader as u64);
            let segments = layout.reader_segments(r, w);
            let len = segments.len();
            let emitted =
                (reader_batches_done(record.batches_done, k, reader) * config.batch_size).min(len);
            let whole = emitted / block_size * block_size;
            segments.for_each(0, whole, |a, b| ranges.push((a, b)));
            if emitted > whole {
                let shuffle = BlockShuffle::new(seed, epoch, phase, rank, reader, block_size, len);
                let mut picked = shuffle.block_permutation(emitted / block_size);
                picked.truncate((emitted - whole) as usize);
                picked.sort_unstable();
                // Consecutive picks make one range: fewer ranges to sort and merge.
                let mut i = 0;
                while i < picked.len() {
                    let first = picked[i] as u64;
                    let mut end = first + 1;
                    i += 1;
                    while i < picked.len() && picked[i] as u64 == end {
                        end += 1;
                        i += 1;
                    }
                    segments.for_each(whole + first, whole + end, |a, b| ranges.push((a, b)));
                }
            }
            let used = find_reserve_use(&record.reserve_used, rank, reader);
            if used > 0 {
                let (a, _) = layout.reserve_range(r, w);
                ranges.push((a, a + used));
            }
        }
    }
    ranges.sort_unstable();
    // Merge overlapping and touching ranges in place (padding repeats may overlap).
    ranges.dedup_by(|next, kept| {
        if next.0 <= kept.1 {
            kept.1 = kept.1.max(next.1);
            true
        } else {
            false
        }
    });
    ranges
}

/// What one reader reads and emits.
///
/// Reading: the `runs` in order, sequentially (they start at the first block that still has
/// samples to emit). Emitting: cut what is read into blocks of [`BlockShuffle::block_len`]
/// (blocks `first_block`, `first_block + 1`, ...), emit each block in the order of
/// [`ReaderPlan::block_permutation`], skipping the first `skip_emitted` emitted samples of the
/// first block (they were yielded before a resume). Batches are consecutive `batch_size` emitted
/// samples; the last one has `last_batch_size`. A sample that fails at run time is replaced by
/// the next unused `reserve` sample (and counted); when the reserve is exhausted the pipeline
/// must fill the place some other way (for example by repeating a sample of the same batch,
/// counted as padding) so that the batch count stays `num_batches`.
#[derive(Clone, Debug)]
pub struct ReaderPlan {
    pub rank: u32,
    /// The DataLoader worker id this plan was made for (0 in the main process).
    pub worker: u32,
    /// The phase reader it plays, which names it in [`ReserveUse`] and seeds its blocks.
    pub reader: u32,
    pub phase: u32,
    pub shuffle: BlockShuffle,
    pub first_block: u64,
    pub skip_emitted: u64,
    pub num_batches: u64,
    pub batch_size: u64,
    /// Size of the last batch: `batch_size`, or the short batch of `drop_last = false`; 0 when
    /// there are no batches.
    pub last_batch_size: u64,
    sequence: Sequence,
    reserve: Vec<Run>,
}

impl ReaderPlan {
    /// What to read, in order: from the start of `first_block` to the end of the sequence.
    pub fn runs(&self) -> &[Run] {
        &self.sequence.runs
    }

    /// Replacements for samples that fail at run time, in the order to use them.
    pub fn reserve(&self) -> &[Run] {
        &self.reserve
    }

    /// Samples this reader emits from here on: `(num_batches - 1) * batch_size + last_batch_size`.
    pub fn num_samples(&self) -> u64 {
        self.shuffle.len() - self.first_block * self.shuffle.block_size() - self.skip_emitted
    }

    /// Lengths of the blocks to read, from `first_block` on.
    pub fn block_lengths(&self) -> impl Iterator<Item = u64> + '_ {
        (self.first_block..self.shuffle.num_blocks()).map(|b| self.shuffle.block_len(b))
    }

    /// Emission order of block `block` (an absolute block number, `first_block` or later).
    pub fn block_permutation(&self, block: u64) -> Vec<u32> {
        self.shuffle.block_permutation(block)
    }

    /// The (shard, ordinal) of every sample this reader emits, in emission order. Holds one block.
    pub fn emitted(&self) -> Emitted<'_> {
        Emitted {
            plan: self,
            next_block: self.first_block,
            read: 0,
            block: Vec::new(),
            perm: Vec::new(),
            at: 0,
        }
    }
}

/// Iterator over a reader's emitted samples, see [`ReaderPlan::emitted`].
pub struct Emitted<'a> {
    plan: &'a ReaderPlan,
    next_block: u64,
    /// Samples of `plan.sequence` already loaded into blocks.
    read: u64,
    block: Vec<(u32, u64)>,
    perm: Vec<u32>,
    at: usize,
}

impl Iterator for Emitted<'_> {
    type Item = (u32, u64);

    fn next(&mut self) -> Option<(u32, u64)> {
        loop {
            if let Some(&j) = self.perm.get(self.at) {
                self.at += 1;
                return Some(self.block[j as usize]);
            }
            let shuffle = &self.plan.shuffle;
            if self.next_block >= shuffle.num_blocks() {
                return None;
            }
            let len = shuffle.block_len(self.next_block);
            self.block = self.plan.sequence.samples(self.read, self.read + len);
            self.perm = shuffle.block_permutation(self.next_block);
            self.at = if self.next_block == self.plan.first_block {
                self.plan.skip_emitted as usize
            } else {
                0
            };
            self.read += len;
            self.next_block += 1;
        }
    }
}

/// A reader's share of the shards when there is no index (no counts: no exact epochs).
///
/// The shards are permuted by (seed, epoch) and dealt to the R = world_size x K readers, reader
/// i = rank x K + worker. With at least R shards, reader i gets every R-th shard of the
/// permutation starting at i (`stride` 1). With fewer, shard `order[i mod S]` is shared by the
/// readers with the same `i mod S`, and reader i keeps the samples whose ordinal mod `stride`
/// equals `offset` (`stride` = number of readers sharing it, `offset` = i div S); its list goes
/// on with the other shards in rotation (same ordinal class), read only once its own share is
/// exhausted, so a share that is empty (a 1-sample shard) cannot starve it. The reader
/// reads its shards in order, keeps its samples, and cycles through the same list again until it
/// has emitted `num_batches x batch_size` samples; `shuffle` is its block shuffle over those
/// samples. Every rank has `samples_per_epoch / (world_size x batch_size)` batches, split among
/// its workers like the indexed plan (earlier workers hold the extra batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardAssignment {
    pub shards: Vec<u32>,
    pub stride: u64,
    pub offset: u64,
    pub num_batches: u64,
    pub batch_size: u64,
    pub shuffle: BlockShuffle,
}

/// Assigns shards to one reader for the no-index mode, see [`ShardAssignment`].
/// `config.drop_last` is ignored (the batch count is fixed by `samples_per_epoch`).
pub fn assign_shards(
    num_shards: usize,
    seed: u64,
    epoch: u64,
    config: PhaseConfig,
    samples_per_epoch: u64,
    rank: u32,
    worker: u32,
) -> Result<ShardAssignment, PlanError> {
    config.validate()?;
    if num_shards == 0 || num_shards > u32::MAX as usize {
        return Err(PlanError::Input(format!(
            "{num_shards} shards: need between 1 and {}",
            u32::MAX
        )));
    }
    let k = config.readers_per_rank();
    if rank >= config.world_size || worker >= k {
        return Err(PlanError::Config(format!(
            "rank {rank} / worker {worker} outside world_size {} / {k} readers",
            config.world_size
        )));
    }
    let readers = config.world_size as u64 * k as u64;
    let i = rank as u64 * k as u64 + worker as u64;
    let s = num_shards as u64;
    let order = permutation(num_shards, derive_seed(&[TAG_NO_INDEX, seed, epoch]));
    let (shards, stride, offset) = if s >= readers {
        let mine = order
            .iter()
            .skip(i as usize)
            .step_by(readers as usize)
            .copied()
            .collect();
        (mine, 1, 0)
    } else {
        // Reader i's own share is shard order[i mod S]; the other shards follow in rotation so
        // that a reader whose share of a tiny shard is empty still finds samples (it takes the
        // same ordinal class of them) instead of failing its quota.
        let sharing = (readers - i % s).div_ceil(s);
        let rotation = (0..s).map(|t| order[((i + t) % s) as usize]).collect();
        (rotation, sharing, i / s)
    };
    let rank_batches = samples_per_epoch / config.global_batch();
    let num_batches =
        rank_batches / k as u64 + u64::from((worker as u64) < rank_batches % k as u64);
    let shuffle = BlockShuffle::new(
        seed,
        epoch,
        0,
        rank,
        worker,
        config.block_size,
        num_batches * config.batch_size,
    );
    Ok(ShardAssignment {
        shards,
        stride,
        offset,
        num_batches,
        batch_size: config.batch_size,
        shuffle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    type Sample = (u32, u64);

    fn config(
        world_size: u32,
        workers: u32,
        batch_size: u64,
        block_size: u64,
        drop_last: bool,
    ) -> PhaseConfig {
        PhaseConfig {
            world_size,
            workers,
            batch_size,
            block_size,
            drop_last,
        }
    }

    /// Uneven shards: a 1-sample shard, an empty one, invalid samples (one shard all invalid).
    fn uneven_input() -> PlanInput {
        let shape: [(u64, &[u64]); 8] = [
            (17, &[0, 5, 6]),
            (1, &[]),
            (23, &[22]),
            (0, &[]),
            (40, &[10, 11, 12, 39]),
            (3, &[0, 1, 2]),
            (9, &[]),
            (31, &[30, 0]),
        ];
        let shards = shape
            .iter()
            .map(|&(n, bad)| ShardCounts {
                num_samples: n,
                invalid: bad.to_vec(),
            })
            .collect();
        PlanInput::new(shards, 77).unwrap()
    }

    fn valid_samples(input: &PlanInput) -> HashSet<Sample> {
        let mut all = HashSet::new();
        for (s, c) in input.shards().iter().enumerate() {
            for o in 0..c.num_samples {
                if c.invalid.binary_search(&o).is_err() {
                    all.insert((s as u32, o));
                }
            }
        }
        all
    }

    fn expand(runs: &[Run]) -> Vec<Sample> {
        runs.iter()
            .flat_map(|r| (r.start..r.end).map(move |o| (r.shard, o)))
            .collect()
    }

    /// A reader's emitted samples cut into its batches (checks the counts on the way).
    fn reader_batches(reader: &ReaderPlan) -> Vec<Vec<Sample>> {
        let emitted: Vec<Sample> = reader.emitted().collect();
        assert_eq!(emitted.len() as u64, reader.num_samples());
        let mut batches = Vec::new();
        let mut rest = &emitted[..];
        for i in 0..reader.num_batches {
            let size = if i + 1 == reader.num_batches {
                reader.last_batch_size
            } else {
                reader.batch_size
            };
            batches.push(rest[..size as usize].to_vec());
            rest = &rest[size as usize..];
        }
        assert!(rest.is_empty());
        batches
    }

    /// What a rank yields, batch by batch, in DataLoader order.
    fn rank_batches(plan: &EpochPlan, rank: u32) -> Vec<Vec<Sample>> {
        let readers: Vec<ReaderPlan> = (0..plan.config().readers_per_rank())
            .map(|w| plan.reader(rank, w).unwrap())
            .collect();
        let per_reader: Vec<Vec<Vec<Sample>>> = readers.iter().map(reader_batches).collect();
        let counts: Vec<u64> = readers.iter().map(|r| r.num_batches).collect();
        rank_batch_order(&counts)
            .into_iter()
            .map(|(w, j)| per_reader[w as usize][j as usize].clone())
            .collect()
    }

    fn all_batches(plan: &EpochPlan) -> Vec<Vec<Vec<Sample>>> {
        (0..plan.config().world_size)
            .map(|r| rank_batches(plan, r))
            .collect()
    }

    fn configs() -> Vec<PhaseConfig> {
        let mut out = Vec::new();
        for w in [1, 2, 3] {
            for k in [0, 2] {
                for (b, c) in [(1, 1), (3, 5), (4, 64), (5, 2)] {
                    for drop_last in [true, false] {
                        out.push(config(w, k, b, c, drop_last));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_valid_sample_exactly_once_minus_a_small_remainder() {
        for input in [uneven_input(), PlanInput::from_counts(&[5, 2])] {
            let valid = valid_samples(&input);
            for cfg in configs().into_iter().filter(|c| c.drop_last) {
                let plan = EpochPlan::new(&input, 3, 1, cfg).unwrap();
                let ranks = all_batches(&plan);
                let mut seen = HashSet::new();
                for batches in &ranks {
                    assert_eq!(batches.len() as u64, plan.num_batches(), "{cfg:?}");
                    for batch in batches {
                        assert_eq!(batch.len() as u64, cfg.batch_size);
                        for &s in batch {
                            assert!(seen.insert(s), "{s:?} twice under {cfg:?}");
                        }
                    }
                }
                let remainder = expand(&plan.remainder());
                assert_eq!(remainder.len() as u64, plan.remainder_len());
                assert!(plan.remainder_len() < cfg.global_batch());
                for &s in &remainder {
                    assert!(seen.insert(s), "{s:?} yielded and in the remainder");
                }
                assert_eq!(seen, valid, "{cfg:?}");
                // The reserves split the remainder, each sample to one reader.
                let mut reserve: Vec<Sample> = Vec::new();
                for r in 0..cfg.world_size {
                    for w in 0..cfg.readers_per_rank() {
                        reserve.extend(expand(plan.reader(r, w).unwrap().reserve()));
                    }
                }
                reserve.sort_unstable();
                let mut sorted = remainder.clone();
                sorted.sort_unstable();
                assert_eq!(reserve, sorted);
            }
        }
    }

    #[test]
    fn without_drop_last_every_sample_appears_and_short_batches_match_across_ranks() {
        for input in [
            uneven_input(),
            PlanInput::from_counts(&[5, 2]),
            PlanInput::from_counts(&[1]),
        ] {
            let valid = valid_samples(&input);
            for cfg in configs().into_iter().filter(|c| !c.drop_last) {
                let plan = EpochPlan::new(&input, 3, 1, cfg).unwrap();
                let ranks = all_batches(&plan);
                let sizes: Vec<usize> = ranks[0].iter().map(Vec::len).collect();
                let mut counts: HashMap<Sample, u64> = HashMap::new();
                for batches in &ranks {
                    assert_eq!(
                        batches.iter().map(Vec::len).collect::<Vec<_>>(),
                        sizes,
                        "{cfg:?}"
                    );
                    for &s in batches.iter().flatten() {
                        *counts.entry(s).or_default() += 1;
                    }
                }
                assert_eq!(counts.keys().copied().collect::<HashSet<_>>(), valid);
                let repeats: u64 = counts.values().map(|c| c - 1).sum();
                assert_eq!(repeats, plan.padding(), "{cfg:?}");
                assert!(plan.padding() < cfg.world_size as u64);
                assert_eq!(plan.remainder_len(), 0);
            }
        }
    }

    #[test]
    fn same_inputs_give_the_same_order_and_epochs_and_seeds_differ() {
        let input = uneven_input();
        let cfg = config(2, 2, 3, 5, true);
        let a = all_batches(&EpochPlan::new(&input, 9, 4, cfg).unwrap());
        assert_eq!(a, all_batches(&EpochPlan::new(&input, 9, 4, cfg).unwrap()));
        assert_ne!(a, all_batches(&EpochPlan::new(&input, 9, 5, cfg).unwrap()));
        assert_ne!(a, all_batches(&EpochPlan::new(&input, 10, 4, cfg).unwrap()));
        // Within-shard order changes too, not only the shard order.
        let big = PlanInput::from_counts(&[1000]);
        let one = config(1, 0, 10, 1, true);
        let e0: Vec<_> = rank_batches(&EpochPlan::new(&big, 0, 0, one).unwrap(), 0);
        let e1: Vec<_> = rank_batches(&EpochPlan::new(&big, 0, 1, one).unwrap(), 0);
        assert_ne!(e0[0][0], e1[0][0]);
    }

    #[test]
    fn reading_stays_sequential() {
        // 200 shards of 500 samples, 6 readers, blocks of 64: each reader's runs are a handful
        // per shard it touches (the rotation splits a shard in two).
        let input = PlanInput::from_counts(&[500; 200]);
        let plan = EpochPlan::new(&input, 1, 0, config(3, 2, 32, 64, true)).unwrap();
        for r in 0..3 {
            for w in 0..2 {
                let reader = plan.reader(r, w).unwrap();
                let samples = reader.runs().iter().map(Run::len).sum::<u64>();
                assert_eq!(samples, reader.num_samples());
                let shards: HashSet<u32> = reader.runs().iter().map(|r| r.shard).collect();
                assert!(
                    reader.runs().len() <= 2 * shards.len() + 1,
                    "{} runs",
                    reader.runs().len()
                );
                assert!(samples / reader.runs().len() as u64 > 200);
            }
        }
    }

    #[test]
    fn round_robin_order_matches_reader_batches_done() {
        for k in 1..5u32 {
            for total in 0..20u64 {
                let counts: Vec<u64> = (0..k)
                    .map(|w| total / k as u64 + u64::from((w as u64) < total % k as u64))
                    .collect();
                let order = rank_batch_order(&counts);
                assert_eq!(order.len() as u64, total);
                for n in 0..=total {
                    for w in 0..k {
                        let done =
                            order[..n as usize].iter().filter(|(x, _)| *x == w).count() as u64;
                        assert_eq!(reader_batches_done(n, k, w), done);
                    }
                }
            }
        }
    }

    #[test]
    fn resume_with_the_same_configuration_continues_exactly() {
        let input = uneven_input();
        for cfg in configs() {
            let plan = EpochPlan::new(&input, 5, 2, cfg).unwrap();
            let full = all_batches(&plan);
            for n in 0..=plan.num_batches() {
                let json = plan.state(n, &[]).unwrap().to_json();
                let state = EpochState::from_json(json.as_bytes()).unwrap();
                let resumed = EpochPlan::resume(&input, &state, cfg).unwrap();
                assert_eq!(resumed.num_batches(), plan.num_batches() - n);
                let rest = all_batches(&resumed);
                for rank in 0..cfg.world_size as usize {
                    assert_eq!(rest[rank][..], full[rank][n as usize..], "{cfg:?} n={n}");
                }
                // And a second resume later in the same phase.
                let m = (plan.num_batches() - n) / 2;
                let again =
                    EpochPlan::resume(&input, &resumed.state(m, &[]).unwrap(), cfg).unwrap();
                for (rank, batches) in all_batches(&again).iter().enumerate() {
                    assert_eq!(batches[..], full[rank][(n + m) as usize..]);
                }
            }
        }
    }

    /// Runs an epoch through a chain of configurations, stopping after the given batch counts,
    /// and checks that nothing is yielded twice and nothing but the final remainder is lost
    /// (a `drop_last = false` phase may repeat up to its padding, with its short batch).
    fn run_chain(input: &PlanInput, chain: &[(PhaseConfig, u64)], seed: u64) {
        let mut counts: HashMap<Sample, u64> = HashMap::new();
        let mut allowed_repeats = 0;
        let mut plan = EpochPlan::new(input, seed, 6, chain[0].0).unwrap();
        for i in 0..=chain.len() {
            let last = i == chain.len();
            if i > 0 && !last {
                let json = plan
                    .state(chain[i - 1].1.min(plan.num_batches()), &[])
                    .unwrap()
                    .to_json();
                let state = EpochState::from_json(json.as_bytes()).unwrap();
                plan = EpochPlan::resume(input, &state, chain[i].0).unwrap();
            }
            // Phase i yields its first `stop` batches; after the chain, the last phase finishes.
            let stop = chain[i.min(chain.len() - 1)].1.min(plan.num_batches());
            let range = if last {
                stop..plan.num_batches()
            } else {
                0..stop
            };
            if range.end == plan.num_batches() && !range.is_empty() {
                allowed_repeats += plan.padding();
            }
            for batches in all_batches(&plan) {
                assert_eq!(batches.len() as u64, plan.num_batches());
                for &s in batches[range.start as usize..range.end as usize]
                    .iter()
                    .flatten()
                {
                    *counts.entry(s).or_default() += 1;
                }
            }
        }
        for s in expand(&plan.remainder()) {
            *counts.entry(s).or_default() += 1;
        }
        assert!(plan.remainder_len() < plan.config().global_batch());
        let repeats: u64 = counts.values().map(|c| c - 1).sum();
        assert!(
            repeats <= allowed_repeats,
            "{repeats} repeats in chain {chain:?}"
        );
        assert_eq!(
            counts.keys().copied().collect::<HashSet<_>>(),
            valid_samples(input),
            "chain {chain:?}"
        );
    }

    #[test]
    fn elastic_resume_chains_are_exactly_once() {
        let inputs = [
            uneven_input(),
            PlanInput::from_counts(&[50, 1, 7, 33, 64, 2]),
        ];
        for input in &inputs {
            for (b, c) in [(2, 3), (4, 7), (3, 1)] {
                for stops in [
                    (0, 0, 0),
                    (1, 1, 0),
                    (2, 3, 1),
                    (3, 0, 2),
                    (5, 4, 100),
                    (100, 2, 1),
                ] {
                    let chain = [
                        (config(3, 2, b, c, true), stops.0),
                        (config(2, 0, b, c, true), stops.1),
                        (config(3, 2, b, c, true), stops.2),
                    ];
                    run_chain(input, &chain, 11);
                    // Batch and block sizes may change between phases as well.
                    let chain = [
                        (config(3, 2, b, c, true), stops.0),
                        (config(1, 3, b + 1, c + 2, true), stops.1),
                        (config(2, 2, b, 1, true), stops.2),
                    ];
                    run_chain(input, &chain, 12);
                }
            }
        }
    }

    #[test]
    fn elastic_resume_after_drop_last_false_short_batches() {
        let input = PlanInput::from_counts(&[10, 3, 8]);
        // 21 samples, W=2, B=4: 2 full batches per rank, then one short batch of 3 (1 repeat).
        let first = config(2, 2, 4, 3, false);
        let plan = EpochPlan::new(&input, 0, 0, first).unwrap();
        assert_eq!((plan.num_batches(), plan.padding()), (3, 1));
        for n in 0..=2 {
            run_chain(&input, &[(first, n), (config(3, 0, 2, 5, true), 1)], 0);
        }
    }

    #[test]
    fn used_reserve_samples_are_not_planned_again() {
        // 47 samples, W=3, B=4: 3 batches per rank, tail of 11 as reserve.
        let input = PlanInput::from_counts(&[20, 27]);
        let cfg = config(3, 2, 4, 5, true);
        let plan = EpochPlan::new(&input, 2, 0, cfg).unwrap();
        assert_eq!(plan.remainder_len(), 11);
        // Rank 1's DataLoader worker 0 hit a corrupt sample in its first batch and replaced it.
        let reader = plan.reader(1, 0).unwrap();
        let failed = reader.emitted().next().unwrap();
        let replacement = expand(reader.reserve())[0];
        let uses = [ReserveUse {
            rank: 1,
            reader: reader.reader,
            used: 1,
        }];
        let state = plan.state(1, &uses).unwrap();
        assert_eq!(state.phases[0].reserve_used, uses);
        let mut seen: HashSet<Sample> = HashSet::new();
        for batches in all_batches(&plan) {
            for &s in batches[0].iter() {
                seen.insert(if s == failed { replacement } else { s });
            }
        }
        // Same configuration: the reader skips its used reserve sample.
        let same = EpochPlan::resume(&input, &state, cfg).unwrap();
        let again = same.reader(1, (reader.reader + 2 - 1) % 2).unwrap();
        assert_eq!(again.reader, reader.reader);
        assert!(!expand(again.reserve()).contains(&replacement));
        // Another configuration: neither the failed sample nor the replacement comes back.
        let other = EpochPlan::resume(&input, &state, config(2, 0, 3, 4, true)).unwrap();
        for batches in all_batches(&other) {
            for &s in batches.iter().flatten() {
                assert!(s != failed && s != replacement);
                assert!(seen.insert(s));
            }
        }
        seen.extend(expand(&other.remainder()));
        seen.insert(failed);
        assert_eq!(seen, valid_samples(&input));
    }

    #[test]
    fn resumed_readers_start_inside_a_block() {
        let input = PlanInput::from_counts(&[100]);
        let cfg = config(1, 0, 3, 10, true);
        let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
        let resumed = EpochPlan::resume(&input, &plan.state(4, &[]).unwrap(), cfg).unwrap();
        let reader = resumed.reader(0, 0).unwrap();
        // 12 samples emitted: block 1, 2 samples in.
        assert_eq!((reader.first_block, reader.skip_emitted), (1, 2));
        assert_eq!(reader.runs().iter().map(Run::len).sum::<u64>(), 99 - 10);
        // 99 samples planned (one global batch of 3 fits 33 times): blocks 1..=8 full, block 9 short.
        assert_eq!(
            reader.block_lengths().collect::<Vec<_>>(),
            [vec![10; 8], vec![9]].concat()
        );
        assert_eq!(reader.num_samples(), 99 - 12);
    }

    #[test]
    fn state_is_small_and_round_trips() {
        let input = uneven_input();
        let plan = EpochPlan::new(&input, 1, 2, config(3, 2, 2, 4, true)).unwrap();
        let mid = EpochPlan::resume(
            &input,
            &plan.state(3, &[]).unwrap(),
            config(2, 4, 2, 4, true),
        )
        .unwrap();
        let readers = (0..2).flat_map(|r| (0..4).map(move |w| (r, w)));
        let with_reserve = readers
            .map(|(r, w)| mid.reader(r, w).unwrap())
            .find(|p| !p.reserve().is_empty())
            .unwrap();
        let uses = [ReserveUse {
            rank: with_reserve.rank,
            reader: with_reserve.reader,
            used: 1,
        }];
        let state = mid.state(1, &uses).unwrap();
        let json = state.to_json();
        assert!(json.len() < 600, "{json}");
        assert_eq!(EpochState::from_json(json.as_bytes()).unwrap(), state);
        assert_eq!(state.phases.len(), 2);
        assert!(
            json.contains("\"index_fingerprint\":\"000000000000004d\""),
            "{json}"
        );
    }

    #[test]
    fn bad_states_and_configurations_are_refused() {
        let input = uneven_input();
        let cfg = config(2, 0, 3, 4, true);
        let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
        let state = plan.state(1, &[]).unwrap();
        let other = PlanInput::from_counts(&[5, 5]);
        assert!(matches!(
            EpochPlan::resume(&other, &state, cfg),
            Err(PlanError::OtherDataset { .. })
        ));
        assert!(plan.state(plan.num_batches() + 1, &[]).is_err());
        assert!(plan
            .state(
                0,
                &[ReserveUse {
                    rank: 0,
                    reader: 0,
                    used: 1000
                }]
            )
            .is_err());
        assert!(plan
            .state(
                0,
                &[ReserveUse {
                    rank: 5,
                    reader: 0,
                    used: 1
                }]
            )
            .is_err());
        let mut wrong = state.clone();
        wrong.version = 99;
        assert!(EpochState::from_json(wrong.to_json().as_bytes())
            .unwrap_err()
            .to_string()
            .contains("version 99"));
        assert!(EpochState::from_json(b"{}").is_err());
        for bad in [
            config(0, 0, 1, 1, true),
            config(1, 0, 0, 1, true),
            config(1, 0, 1, 0, true),
        ] {
            assert!(matches!(
                EpochPlan::new(&input, 0, 0, bad),
                Err(PlanError::Config(_))
            ));
        }
        assert!(plan.reader(2, 0).is_err());
        assert!(plan.reader(0, 1).is_err());
        let bad_input = vec![ShardCounts {
            num_samples: 3,
            invalid: vec![3],
        }];
        assert!(PlanInput::new(bad_input, 0).is_err());
    }

    #[test]
    fn the_phase_sequence_keeps_two_runs_per_shard_however_many_samples_are_invalid() {
        // 1,000 shards of 1,000 samples, 1 % invalid: the runs must not split around them
        // (that made a validated index cost ~30 bytes per invalid sample on every rank).
        let shards = (0..1000u64)
            .map(|s| ShardCounts {
                num_samples: 1000,
                invalid: (0..10).map(|i| (s * 7 + i * 97) % 1000).collect(),
            })
            .collect();
        let input = PlanInput::new(shards, 1).unwrap();
        let plan = EpochPlan::new(&input, 3, 0, config(4, 2, 16, 100, true)).unwrap();
        assert!(
            plan.sequence.runs.len() <= 2 * 1000,
            "{}",
            plan.sequence.runs.len()
        );
        assert_eq!(plan.sequence.len(), 1000 * 990);
        // Readers get only valid ordinals, and the union is every valid sample but the tail.
        let mut seen = HashSet::new();
        for rank in 0..4 {
            for worker in 0..2 {
                for (shard, ordinal) in plan.reader(rank, worker).unwrap().emitted() {
                    assert!(input.shards()[shard as usize]
                        .invalid
                        .binary_search(&ordinal)
                        .is_err());
                    assert!(seen.insert((shard, ordinal)));
                }
            }
        }
        assert_eq!(seen.len() as u64 + plan.remainder_len(), 990_000);
        // An elastic re-plan from the middle keeps the property too.
        let state = plan.state(plan.num_batches() / 2, &[]).unwrap();
        let resumed = EpochPlan::resume(&input, &state, config(3, 2, 16, 100, true)).unwrap();
        assert!(
            resumed.sequence.runs.len() < 2 * 1000 + 8 * 100,
            "{}",
            resumed.sequence.runs.len()
        );
    }

    #[test]
    fn an_empty_dataset_plans_nothing() {
        let input = PlanInput::from_counts(&[0, 0]);
        for cfg in configs() {
            let plan = EpochPlan::new(&input, 0, 0, cfg).unwrap();
            assert_eq!(plan.num_batches(), 0);
            assert!(all_batches(&plan).iter().all(Vec::is_empty));
        }
    }

    #[test]
    fn block_permutations_cover_each_block() {
        let input = PlanInput::from_counts(&[37]);
        let plan = EpochPlan::new(&input, 0, 0, config(1, 0, 37, 10, true)).unwrap();
        let reader = plan.reader(0, 0).unwrap();
        assert_eq!(
            reader.block_lengths().collect::<Vec<_>>(),
            vec![10, 10, 10, 7]
        );
        let emitted: Vec<Sample> = reader.emitted().collect();
        let read = expand(reader.runs());
        for (b, chunk) in emitted.chunks(10).enumerate() {
            let perm = reader.block_permutation(b as u64);
            let expected: Vec<Sample> = perm.iter().map(|&j| read[b * 10 + j as usize]).collect();
            assert_eq!(chunk, &expected[..]);
        }
    }

    #[test]
    fn shard_assignment_without_index_covers_every_shard() {
        for (shards, w, k) in [
            (10usize, 2u32, 2u32),
            (4, 3, 2),
            (1, 2, 0),
            (7, 1, 0),
            (6, 3, 2),
        ] {
            let cfg = config(w, k, 4, 8, true);
            let mut covered: HashMap<(u32, u64), u32> = HashMap::new();
            let mut per_rank = vec![0u64; w as usize];
            for rank in 0..w {
                for worker in 0..cfg.readers_per_rank() {
                    let a = assign_shards(shards, 3, 0, cfg, 100, rank, worker).unwrap();
                    per_rank[rank as usize] += a.num_batches;
                    assert_eq!(a.shuffle.len(), a.num_batches * 4);
                    // the first shard is the reader's own share; the rest is its fallback
                    let readers = (w * cfg.readers_per_rank()) as usize;
                    for &s in a
                        .shards
                        .iter()
                        .take(if shards < readers { 1 } else { usize::MAX })
                    {
                        *covered.entry((s, a.offset)).or_default() += 1;
                        if a.stride > 1 {
                            assert!(a.offset < a.stride);
                        }
                    }
                }
            }
            assert!(
                per_rank.iter().all(|&n| n == 100 / (w as u64 * 4)),
                "{per_rank:?}"
            );
            assert!(covered.values().all(|&c| c == 1), "{covered:?}");
            let distinct: HashSet<u32> = covered.keys().map(|(s, _)| *s).collect();
            assert_eq!(distinct.len(), shards);
        }
        let cfg = config(2, 2, 4, 8, true);
        assert_ne!(
            assign_shards(100, 0, 0, cfg, 800, 0, 0).unwrap().shards,
            assign_shards(100, 0, 1, cfg, 800, 0, 0).unwrap().shards
        );
        assert!(assign_shards(0, 0, 0, cfg, 800, 0, 0).is_err());
    }

    #[test]
    fn many_random_datasets_and_chains() {
        let mut rng = SplitMix64::new(42);
        for trial in 0..40u64 {
            let num_shards = 1 + rng.below(12) as usize;
            let shards: Vec<ShardCounts> = (0..num_shards)
                .map(|_| {
                    let n = rng.below(30);
                    let invalid = (0..n).filter(|_| rng.below(8) == 0).collect();
                    ShardCounts {
                        num_samples: n,
                        invalid,
                    }
                })
                .collect();
            let input = PlanInput::new(shards, trial).unwrap();
            let mut random_config = |drop_last: bool| {
                config(
                    1 + rng.below(4) as u32,
                    rng.below(4) as u32,
                    1 + rng.below(5),
                    1 + rng.below(9),
                    drop_last,
                )
            };
            let chain: Vec<(PhaseConfig, u64)> = (0..3)
                .map(|i| (random_config(i > 0 || trial % 2 == 0), 0))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|(c, _)| (c, rng.below(6)))
                .collect();
            run_chain(&input, &chain, trial);
        }
    }
}
