//! The unit-stream plan every kind planned by unit weights stands on (packed text, NaFlex
//! token-budget batches, interleaved documents): the epoch as one stream of positions, each
//! unit weighing its count of positions (text: tokens; the image kinds: batches), cut into equal
//! shares, so that every rank yields the same number of full batches. Below, text's words.
//!
//! 1. **Stream.** Every unit (a tar shard, a Parquet row group) carries the number of tokens its
//!    documents encode to under one tokenizer, counted once before training (`count_tokens`).
//!    Epoch e orders the units by a permutation of (seed, e) and concatenates their tokens: a
//!    stream of T tokens, each at one position in [0, T).
//! 2. **Cut.** A global batch is W ranks x B rows x L tokens. Phase 0 gives every rank
//!    `n = T / (W B L)` batches: rank r reads positions [r n B L, (r+1) n B L); the last
//!    `T mod (W B L)` tokens are the phase's remainder, reported.
//! 3. **Readers.** A rank's K readers (DataLoader workers; one when K = 0) get contiguous,
//!    balanced batch ranges of its share, as the sample plan does (earlier readers hold the
//!    extra batch; torch's round-robin then yields them in a known order).
//! 4. **Blocks.** A reader's rows (L consecutive tokens of its share each) are cut into blocks of
//!    `block_rows`; each block is emitted in a permutation of (seed, epoch, phase, rank, reader,
//!    block). Batches are B consecutive rows of the emitted order.
//! 5. **Resume.** A state records per phase its shape and the batches every rank yielded (the
//!    same on every rank). The same shape continues: each reader skips its emitted rows. Another
//!    shape starts a phase over what is left: every reader's rows not yet emitted, then the
//!    phase's remainder, in stream order: a list of ranges, cut as in 2. Every token of the
//!    epoch is thus in exactly one emitted row, except the last phase's remainder.
//! 6. **Padded later phases.** A plan may instead read every position of its later phases
//!    (`Rest::Padded`, for a mixture's source, whose epoch end was fixed on the first phase's
//!    world size): from the second phase on, each rank gets `ceil(len / (W B L))` batches and
//!    the positions past the stream's end are padding, so a phase has no remainder. A rank's
//!    padding is at the end of its last reader's rows.
//!
//! Only positions are planned here; which documents and units a range covers is the reader's
//! business (`batch::text`, `batch::naflex`, `batch::interleaved`). Nothing here knows about
//! I/O or tokenizers.

use serde::{Deserialize, Serialize};

use super::{block_order, reader_batches_done, PlanError};
use crate::rng::{derive_seed, permutation};

/// The domain tags of this plan's seeds (see `plan::TAG_*`; these never coincide with those).
const TAG_PACKED_ORDER: u64 = 101;
const TAG_PACKED_BLOCK: u64 = 102;

/// A half-open range of stream positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub start: u64,
    pub end: u64,
}

impl Span {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// How one phase is laid out: ranks, readers per rank, rows per batch, tokens per row, rows per
/// shuffle block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamShape {
    pub world_size: u32,
    /// DataLoader workers per rank; 0: one reader in the main process.
    pub workers: u32,
    pub batch_size: u32,
    pub seq_len: u32,
    pub block_rows: u32,
}

impl StreamShape {
    pub fn validate(&self) -> Result<(), PlanError> {
        let positive = [
            ("world_size", self.world_size),
            ("batch_size", self.batch_size),
            ("seq_len", self.seq_len),
            ("block_rows", self.block_rows),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(PlanError::Config(format!("{name} must be positive")));
            }
        }
        Ok(())
    }

    fn readers(&self) -> u32 {
        self.workers.max(1)
    }

    fn batch_tokens(&self) -> u64 {
        self.batch_size as u64 * self.seq_len as u64
    }
}

/// One phase of an epoch: its shape and the batches every rank yielded in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPhase {
    pub shape: StreamShape,
    pub batches_done: u64,
}

/// The units of an epoch in stream order and where each starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitOrder {
    /// Unit numbers (as counted) in stream order.
    pub order: Vec<u32>,
    /// `starts[i]`: the stream position of the first token of `order[i]`; one more entry: T.
    pub starts: Vec<u64>,
}

impl UnitOrder {
    /// Epoch `epoch`'s order of units weighing `tokens` each: a permutation of (seed, epoch).
    pub fn new(tokens: &[u64], seed: u64, epoch: u64) -> Self {
        let order = permutation(tokens.len(), derive_seed(&[TAG_PACKED_ORDER, seed, epoch]));
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut at = 0u64;
        for &u in &order {
            starts.push(at);
            at += tokens[u as usize];
        }
        starts.push(at);
        Self { order, starts }
    }

    /// Tokens in the whole stream (T).
    pub fn total(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// The index into `order` of the unit that holds position `at` (< T), skipping empty units.
    pub fn locate(&self, at: u64) -> usize {
        self.starts.partition_point(|&s| s <= at) - 1
    }
}

/// What one reader reads in the current phase and how it emits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReader {
    /// Stream positions the reader's rows are cut from, in order (their lengths sum to
    /// `rows * seq_len`, or less in a padded phase: the rows past them are padding).
    pub ranges: Vec<Span>,
    /// Rows of the reader's whole share in this phase.
    pub rows: u64,
    /// Rows already emitted (a resume inside this phase): skipped, not read twice.
    pub skip_rows: u64,
    pub seq_len: u32,
    pub block_rows: u32,
    /// Block b is emitted in `block_order(block_seed, b, its rows)`.
    pub block_seed: u64,
}

impl StreamReader {
    /// Batches this reader yields from its position on.
    pub fn batches_left(&self, batch_size: u32) -> u64 {
        (self.rows - self.skip_rows) / batch_size as u64
    }
}

/// What a phase after the first does with the positions that do not divide among its ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rest {
    /// They are the phase's remainder, read by no rank (as in the first phase).
    #[default]
    Remainder,
    /// Every position is read: shares rounded up, the positions past the stream's end padding.
    /// For a mixture's source: its stream ends where the mixture's epoch does, and a document
    /// begun before a resume must be read to its end after it.
    Padded,
}

/// An epoch's packed plan: the stream's length, the seed and the phases (the last is current).
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub total: u64,
    pub seed: u64,
    pub epoch: u64,
    pub phases: Vec<StreamPhase>,
    /// How phases after the first cut their stream.
    pub rest: Rest,
}

impl StreamPlan {
    /// The plan of a fresh epoch, or of `phases` (a resume state) continued with `shape`: the
    /// same shape continues the last phase, another starts a new one after it. Later phases
    /// leave a remainder (`Rest::Remainder`).
    pub fn new(
        total: u64,
        seed: u64,
        epoch: u64,
        phases: Vec<StreamPhase>,
        shape: StreamShape,
    ) -> Result<Self, PlanError> {
        Self::with_rest(total, seed, epoch, phases, shape, Rest::Remainder)
    }

    /// As [`StreamPlan::new`], with later phases cut as `rest` says.
    pub fn with_rest(
        total: u64,
        seed: u64,
        epoch: u64,
        mut phases: Vec<StreamPhase>,
        shape: StreamShape,
        rest: Rest,
    ) -> Result<Self, PlanError> {
        shape.validate()?;
        for p in &phases {
            p.shape.validate()?;
        }
        if phases.last().map(|p| p.shape) != Some(shape) {
            phases.push(StreamPhase {
                shape,
                batches_done: 0,
            });
        }
        let plan = Self {
            total,
            seed,
            epoch,
            phases,
            rest,
        };
        // Every recorded phase must fit the stream it was cut from.
        let mut stream = vec![Span {
            start: 0,
            end: total,
        }];
        for (i, p) in plan.phases.iter().enumerate() {
            let planned = plan.batches_per_rank(i, ranges_len(&stream));
            if p.batches_done > planned {
                return Err(PlanError::State(format!(
                    "phase {i} records {} batches per rank, but its stream holds {planned}",
                    p.batches_done
                )));
            }
            if i + 1 < plan.phases.len() {
                stream = plan.remaining_after(&stream, i);
            }
        }
        Ok(plan)
    }

    /// Batches per rank of phase `i` over a stream of `len` positions: rounded down (the rest
    /// is the phase's remainder), or up in a padded later phase.
    fn batches_per_rank(&self, i: usize, len: u64) -> u64 {
        let shape = self.phases[i].shape;
        let global = shape.world_size as u64 * shape.batch_tokens();
        if i > 0 && self.rest == Rest::Padded {
            len.div_ceil(global)
        } else {
            len / global
        }
    }

    fn current(&self) -> (usize, &StreamPhase) {
        let i = self.phases.len() - 1;
        (i, &self.phases[i])
    }

    /// The current phase's stream: what earlier phases left, in stream order.
    pub fn stream(&self) -> Vec<Span> {
        let mut stream = vec![Span {
            start: 0,
            end: self.total,
        }];
        for i in 0..self.phases.len() - 1 {
            stream = self.remaining_after(&stream, i);
        }
        stream
    }

    /// Batches every rank yields in the current phase, from its beginning.
    pub fn phase_batches(&self) -> u64 {
        let (i, _) = self.current();
        self.batches_per_rank(i, ranges_len(&self.stream()))
    }

    /// Batches every rank yields from the recorded position to the end of the epoch.
    pub fn batches_left(&self) -> u64 {
        self.phase_batches() - self.current().1.batches_done
    }

    /// Tokens of the current phase that no rank reads: the epoch's remainder.
    pub fn remainder_tokens(&self) -> u64 {
        let (len, assigned) = self.stream_and_shares();
        len.saturating_sub(assigned)
    }

    /// Positions of the current phase's shares past the stream's end: padding (only in a
    /// padded later phase).
    pub fn padding_tokens(&self) -> u64 {
        let (len, assigned) = self.stream_and_shares();
        assigned.saturating_sub(len)
    }

    /// The current phase's stream length and the positions its ranks' shares cover.
    fn stream_and_shares(&self) -> (u64, u64) {
        let (i, phase) = self.current();
        let len = ranges_len(&self.stream());
        let shape = phase.shape;
        let assigned =
            self.batches_per_rank(i, len) * shape.world_size as u64 * shape.batch_tokens();
        (len, assigned)
    }

    /// The remainder's ranges (stream positions).
    pub fn remainder(&self) -> Vec<Span> {
        let stream = self.stream();
        let len = ranges_len(&stream);
        slice(&stream, len - self.remainder_tokens(), len)
    }

    /// What DataLoader worker `reader` (0 without workers) of rank `rank` reads in the current
    /// phase.
    pub fn reader(&self, rank: u32, reader: u32) -> Result<StreamReader, PlanError> {
        let (i, phase) = self.current();
        let shape = phase.shape;
        if rank >= shape.world_size || reader >= shape.readers() {
            return Err(PlanError::Config(format!(
                "reader {reader} of rank {rank} is outside {} ranks x {} readers",
                shape.world_size,
                shape.readers()
            )));
        }
        // A DataLoader started anew asks its worker 0 first; the uninterrupted epoch's next
        // batch would have come from reader `batches_done mod K`: worker k plays that reader
        // and the ones after it, so the batches follow in the same order.
        let reader = (reader as u64 + phase.batches_done) % shape.readers() as u64;
        let reader = reader as u32;
        let stream = self.stream();
        let batches = self.batches_per_rank(i, ranges_len(&stream));
        let (first, count) = reader_batch_range(batches, shape.readers(), reader);
        let tokens = shape.batch_tokens();
        let start = (rank as u64 * batches + first) * tokens;
        let done = reader_batches_done(phase.batches_done, shape.readers(), reader).min(count);
        Ok(StreamReader {
            ranges: slice(&stream, start, start + count * tokens),
            rows: count * shape.batch_size as u64,
            skip_rows: done * shape.batch_size as u64,
            seq_len: shape.seq_len,
            block_rows: shape.block_rows,
            block_seed: self.block_seed(i, rank, reader),
        })
    }

    fn block_seed(&self, phase: usize, rank: u32, reader: u32) -> u64 {
        derive_seed(&[
            TAG_PACKED_BLOCK,
            self.seed,
            self.epoch,
            phase as u64,
            rank as u64,
            reader as u64,
        ])
    }

    /// What phase `i` (cut from `stream`) left: every reader's rows not yet emitted, then the
    /// phase's remainder, in stream order.
    fn remaining_after(&self, stream: &[Span], i: usize) -> Vec<Span> {
        let phase = self.phases[i];
        let shape = phase.shape;
        let len = ranges_len(stream);
        let batches = self.batches_per_rank(i, len);
        let tokens = shape.batch_tokens();
        let row = shape.seq_len as u64;
        let mut left = Vec::new();
        for rank in 0..shape.world_size {
            for reader in 0..shape.readers() {
                let (first, count) = reader_batch_range(batches, shape.readers(), reader);
                let start = (rank as u64 * batches + first) * tokens;
                let mine = slice(stream, start, start + count * tokens);
                let rows = count * shape.batch_size as u64;
                let done = reader_batches_done(phase.batches_done, shape.readers(), reader)
                    .min(count)
                    * shape.batch_size as u64;
                let block = shape.block_rows as u64;
                let current = done / block;
                let emitted_in_block = (done % block) as usize;
                let block_start = current * block;
                if emitted_in_block > 0 {
                    let block_len = block.min(rows - block_start) as usize;
                    let order = block_order(self.block_seed(i, rank, reader), current, block_len);
                    let mut emitted = vec![false; block_len];
                    for &r in &order[..emitted_in_block] {
                        emitted[r as usize] = true;
                    }
                    for (r, _) in emitted.iter().enumerate().filter(|(_, &e)| !e) {
                        let at = (block_start + r as u64) * row;
                        push_all(&mut left, slice(&mine, at, at + row));
                    }
                    push_all(
                        &mut left,
                        slice(&mine, (block_start + block_len as u64) * row, rows * row),
                    );
                } else {
                    push_all(&mut left, slice(&mine, block_start * row, rows * row));
                }
            }
        }
        let assigned = (batches * shape.world_size as u64 * tokens).min(len);
        push_all(&mut left, slice(stream, assigned, len));
        left
    }
}

/// Reader `reader`'s first batch and batch count among `readers` sharing `batches`: balanced,
/// earlier readers holding the extra batch (as `plan::reader_batches_done` assumes).
fn reader_batch_range(batches: u64, readers: u32, reader: u32) -> (u64, u64) {
    let (k, w) = (readers.max(1) as u64, reader as u64);
    let (base, extra) = (batches / k, batches % k);
    let count = base + u64::from(w < extra);
    let first = w * base + w.min(extra);
    (first, count)
}

/// Tokens in `ranges`.
pub fn ranges_len(ranges: &[Span]) -> u64 {
    ranges.iter().map(Span::len).sum()
}

/// Positions [from, to) of the concatenation of `ranges`, as ranges of the stream.
pub fn slice(ranges: &[Span], from: u64, to: u64) -> Vec<Span> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for r in ranges {
        let (lo, hi) = (at, at + r.len());
        at = hi;
        if hi <= from {
            continue;
        }
        if lo >= to {
            break;
        }
        let start = r.start + from.saturating_sub(lo);
        let end = r.end - hi.saturating_sub(to);
        if start < end {
            out.push(Span { start, end });
        }
    }
    out
}

/// Appends `more` to `ranges`, joining a range that starts where the last one ends.
fn push_all(ranges: &mut Vec<Span>, more: Vec<Span>) {
    for r in more {
        match ranges.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => ranges.push(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(world: u32, workers: u32, batch: u32, seq: u32, block: u32) -> StreamShape {
        StreamShape {
            world_size: world,
            workers,
            batch_size: batch,
            seq_len: seq,
            block_rows: block,
        }
    }

    /// A padding position in `emitted_rows`.
    const PADDING: u64 = u64::MAX;

    /// Every row a reader emits, in order, as the stream positions of its tokens (`PADDING`
    /// past its ranges, in a padded phase).
    fn emitted_rows(reader: &StreamReader) -> Vec<Vec<u64>> {
        let row = reader.seq_len as usize;
        let mut positions: Vec<u64> = reader.ranges.iter().flat_map(|r| r.start..r.end).collect();
        positions.resize(reader.rows as usize * row, PADDING);
        let block = reader.block_rows as u64;
        let mut rows = Vec::new();
        let mut b = 0u64;
        while b * block < reader.rows {
            let len = block.min(reader.rows - b * block) as usize;
            for i in block_order(reader.block_seed, b, len) {
                let r = (b * block) as usize + i as usize;
                rows.push(positions[r * row..(r + 1) * row].to_vec());
            }
            b += 1;
        }
        rows.split_off(reader.skip_rows as usize)
    }

    /// The rows of every rank, batch by batch in the rank's order (reader round-robin).
    fn rank_batches(plan: &StreamPlan, rank: u32) -> Vec<Vec<Vec<u64>>> {
        let shape = plan.phases.last().unwrap().shape;
        let readers: Vec<Vec<Vec<u64>>> = (0..shape.workers.max(1))
            .map(|k| emitted_rows(&plan.reader(rank, k).unwrap()))
            .collect();
        let counts: Vec<u64> = readers
            .iter()
            .map(|r| (r.len() / shape.batch_size as usize) as u64)
            .collect();
        let b = shape.batch_size as usize;
        super::super::rank_batch_order(&counts)
            .into_iter()
            .map(|(k, j)| readers[k as usize][j as usize * b..(j as usize + 1) * b].to_vec())
            .collect()
    }

    #[test]
    fn an_epoch_reads_every_token_once_but_the_remainder_with_equal_batches_per_rank() {
        let plan = StreamPlan::new(10_007, 3, 1, vec![], shape(3, 2, 4, 16, 5)).unwrap();
        let mut seen = vec![0u32; 10_007];
        let mut counts = vec![];
        for rank in 0..3 {
            let batches = rank_batches(&plan, rank);
            counts.push(batches.len());
            for row in batches.iter().flatten() {
                assert_eq!(row.len(), 16);
                for &p in row {
                    seen[p as usize] += 1;
                }
            }
        }
        assert!(
            counts.iter().all(|&c| c as u64 == plan.phase_batches()),
            "{counts:?}"
        );
        assert_eq!(plan.phase_batches(), 10_007 / (3 * 4 * 16));
        let remainder: Vec<u64> = plan
            .remainder()
            .iter()
            .flat_map(|r| r.start..r.end)
            .collect();
        assert_eq!(remainder.len() as u64, plan.remainder_tokens());
        for (p, &n) in seen.iter().enumerate() {
            let expected = u32::from(!remainder.contains(&(p as u64)));
            assert_eq!(n, expected, "position {p}");
        }
    }

    #[test]
    fn the_same_seed_and_epoch_give_the_same_rows_and_another_epoch_other_blocks() {
        let a = StreamPlan::new(5_000, 7, 0, vec![], shape(2, 0, 2, 8, 16)).unwrap();
        let b = StreamPlan::new(5_000, 7, 0, vec![], shape(2, 0, 2, 8, 16)).unwrap();
        let c = StreamPlan::new(5_000, 7, 1, vec![], shape(2, 0, 2, 8, 16)).unwrap();
        assert_eq!(rank_batches(&a, 1), rank_batches(&b, 1));
        assert_ne!(rank_batches(&a, 1), rank_batches(&c, 1));
    }

    #[test]
    fn a_resume_with_the_same_shape_yields_exactly_the_batches_that_would_have_followed() {
        let fresh = StreamPlan::new(20_000, 1, 2, vec![], shape(2, 3, 4, 10, 7)).unwrap();
        for rank in 0..2 {
            let whole = rank_batches(&fresh, rank);
            for done in [0u64, 1, 5, 17, whole.len() as u64] {
                let phases = vec![StreamPhase {
                    shape: shape(2, 3, 4, 10, 7),
                    batches_done: done,
                }];
                let resumed = StreamPlan::new(20_000, 1, 2, phases, shape(2, 3, 4, 10, 7)).unwrap();
                assert_eq!(resumed.batches_left(), whole.len() as u64 - done);
                assert_eq!(
                    rank_batches(&resumed, rank),
                    whole[done as usize..].to_vec(),
                    "rank {rank} after {done}"
                );
            }
        }
    }

    #[test]
    fn an_elastic_resume_reads_every_token_left_exactly_once_on_the_new_world_size() {
        let total = 30_011u64;
        let first = shape(2, 2, 3, 12, 5);
        let fresh = StreamPlan::new(total, 9, 0, vec![], first).unwrap();
        let done = 13u64;
        let mut seen = vec![0u32; total as usize];
        for rank in 0..2 {
            for row in rank_batches(&fresh, rank)[..done as usize].iter().flatten() {
                for &p in row {
                    seen[p as usize] += 1;
                }
            }
        }
        let mut phases = vec![StreamPhase {
            shape: first,
            batches_done: done,
        }];
        // 2 ranks -> 3 ranks, 7 batches in, then -> 1 rank with no workers to the end.
        let second = shape(3, 0, 2, 12, 4);
        let middle = StreamPlan::new(total, 9, 0, phases.clone(), second).unwrap();
        for rank in 0..3 {
            for row in rank_batches(&middle, rank)[..7].iter().flatten() {
                for &p in row {
                    seen[p as usize] += 1;
                }
            }
        }
        phases.push(StreamPhase {
            shape: second,
            batches_done: 7,
        });
        let last = StreamPlan::new(total, 9, 0, phases, shape(1, 0, 5, 12, 3)).unwrap();
        for row in rank_batches(&last, 0).iter().flatten() {
            for &p in row {
                seen[p as usize] += 1;
            }
        }
        let remainder: std::collections::HashSet<u64> = last
            .remainder()
            .iter()
            .flat_map(|r| r.start..r.end)
            .collect();
        assert!(remainder.len() < 5 * 12, "{}", remainder.len());
        for (p, &n) in seen.iter().enumerate() {
            assert_eq!(
                n,
                u32::from(!remainder.contains(&(p as u64))),
                "position {p}"
            );
        }
    }

    /// Adds the positions of `batches` to `seen`; returns the padding positions among them.
    fn mark(seen: &mut [u32], batches: &[Vec<Vec<u64>>]) -> u64 {
        let mut padding = 0;
        for &p in batches.iter().flatten().flatten() {
            if p == PADDING {
                padding += 1;
            } else {
                seen[p as usize] += 1;
            }
        }
        padding
    }

    #[test]
    fn padded_later_phases_read_every_position_once_with_equal_batches_per_rank() {
        // A mixture's source: the first phase divides (its end was chosen so), the later ones
        // are cut on other world sizes and must leave nothing unread.
        let first = shape(2, 2, 3, 12, 5);
        let total = 2 * 3 * 12 * 40;
        let fresh = StreamPlan::with_rest(total, 9, 0, vec![], first, Rest::Padded).unwrap();
        assert_eq!((fresh.remainder_tokens(), fresh.padding_tokens()), (0, 0));
        let mut seen = vec![0u32; total as usize];
        for rank in 0..2 {
            mark(&mut seen, &rank_batches(&fresh, rank)[..13]);
        }
        let mut phases = vec![StreamPhase {
            shape: first,
            batches_done: 13,
        }];
        // 2 ranks -> 3 ranks with 2 readers each, 7 batches in, then -> 4 ranks to the end.
        let second = shape(3, 2, 2, 12, 4);
        let middle = StreamPlan::with_rest(total, 9, 0, phases.clone(), second, Rest::Padded);
        let middle = middle.unwrap();
        for rank in 0..3 {
            let batches = rank_batches(&middle, rank);
            assert_eq!(batches.len() as u64, middle.phase_batches());
            mark(&mut seen, &batches[..7]);
        }
        phases.push(StreamPhase {
            shape: second,
            batches_done: 7,
        });
        let third = shape(4, 0, 7, 12, 3);
        let last = StreamPlan::with_rest(total, 9, 0, phases, third, Rest::Padded).unwrap();
        assert_eq!(last.remainder_tokens(), 0);
        assert!(last.remainder().is_empty());
        let mut padding = 0;
        for rank in 0..4 {
            let batches = rank_batches(&last, rank);
            assert_eq!(batches.len() as u64, last.phase_batches(), "rank {rank}");
            padding += mark(&mut seen, &batches);
        }
        assert!(
            padding > 0,
            "the case must leave positions that do not divide"
        );
        assert_eq!(padding, last.padding_tokens());
        assert!(
            padding < 4 * 7 * 12,
            "less than one batch per rank: {padding}"
        );
        for (p, &n) in seen.iter().enumerate() {
            assert_eq!(n, 1, "position {p}");
        }
        // Without padding the same resume leaves a remainder no rank reads.
        let mut phases = vec![StreamPhase {
            shape: first,
            batches_done: 13,
        }];
        phases.push(StreamPhase {
            shape: second,
            batches_done: 7,
        });
        let floor = StreamPlan::new(total, 9, 0, phases, third).unwrap();
        assert!(floor.remainder_tokens() > 0);
    }

    #[test]
    fn bad_shapes_and_states_are_refused_by_name() {
        let err = StreamPlan::new(100, 0, 0, vec![], shape(1, 0, 0, 8, 4)).unwrap_err();
        assert!(err.to_string().contains("batch_size"), "{err}");
        let phases = vec![StreamPhase {
            shape: shape(1, 0, 1, 10, 4),
            batches_done: 11,
        }];
        let err = StreamPlan::new(100, 0, 0, phases, shape(1, 0, 1, 10, 4)).unwrap_err();
        assert!(err.to_string().contains("holds 10"), "{err}");
    }

    #[test]
    fn units_are_located_by_position_in_a_seeded_order() {
        let order = UnitOrder::new(&[5, 0, 7, 3], 1, 0);
        assert_eq!(order.total(), 15);
        let mut sorted = order.order.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3]);
        for at in 0..15 {
            let i = order.locate(at);
            assert!(order.starts[i] <= at && at < order.starts[i + 1], "{at}");
        }
        assert_ne!(
            UnitOrder::new(&[1; 50], 1, 0).order,
            UnitOrder::new(&[1; 50], 1, 1).order
        );
    }
}
