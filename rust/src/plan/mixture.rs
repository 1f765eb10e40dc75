//! Mixtures: several sources in one epoch, each shuffle block holding every source in
//! proportion to its share (the contract, with its reasons: docs/epoch-plan.md section 7).
//!
//! **Streams.** Each source is an endless stream of *passes*; pass p is the source's own
//! sequence (its shards permuted, each rotated) for (seed, source, p). Epoch e takes stream
//! positions `[e q, (e + 1) q)` of a source with quota q samples per epoch: a small source
//! repeats, a large one goes on next epoch where it stopped, and no sample repeats before its
//! source was used once.
//!
//! **Interleave.** The epoch's sequence of T = sum of quotas positions interleaves the sources
//! by *ticks*: source i's k-th sample sits at time `(2k + 1) / (2 q_i)`, ties going to the lower
//! source, and position p is the p-th tick in time. Any range of positions then holds each
//! source within about one sample of its share, and the number of source-i samples before p is
//! found in O(m log q) without holding the sequence (which would cost memory per sample).
//!
//! **Reading.** The layout (ranks, readers, blocks) cuts positions as for one dataset. Within a
//! block the samples are grouped by source (source 0's, then source 1's, ...) before the block
//! permutation, so that a reader reads each source as one sequential stream
//! ([`MixedStreams`]) and takes each block's share of each.

use super::sequence::Sequence;
use super::state::merge_ranges;
use super::{PlanError, PlanInput, Run, ShardCounts, TAG_MIX, TAG_MIX_ORDER, TAG_MIX_ROTATION};
use crate::rng::{derive_seed, permutation, SplitMix64};
use std::sync::Arc;

/// How much of the epoch a source takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// A share of the samples not fixed by [`Share::Samples`], in proportion to the weight.
    Weight(f64),
    /// Exactly this many samples every epoch.
    Samples(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SourceInfo {
    pub(super) first_shard: u32,
    pub(super) num_shards: u32,
    pub(super) num_valid: u64,
    /// Samples per epoch.
    pub(super) quota: u64,
}

/// Several datasets planned as one: what [`super::EpochPlan::mixture`] plans.
#[derive(Clone, Debug)]
pub struct Mixture {
    /// Every source's shards, source after source: the plan names shards by this position.
    pub(super) input: PlanInput,
    pub(super) sources: Vec<SourceInfo>,
    pub(super) total: u64,
    pub(super) fingerprint: u64,
}

impl Mixture {
    /// `parts[i]` is source i's dataset and `shares[i]` its share. `epoch_samples`: the
    /// epoch's length T (default: all sources' valid samples together); sources with
    /// [`Share::Samples`] take their count of it, the rest is apportioned to the weights
    /// (largest remainder, ties to the lower source).
    pub fn new(
        parts: &[PlanInput],
        shares: &[Share],
        epoch_samples: Option<u64>,
    ) -> Result<Self, PlanError> {
        if parts.is_empty() || parts.len() != shares.len() {
            return Err(PlanError::Config(format!(
                "a mixture needs one share per source ({} sources, {} shares)",
                parts.len(),
                shares.len()
            )));
        }
        for (i, (part, share)) in parts.iter().zip(shares).enumerate() {
            match *share {
                Share::Weight(w) if !(w.is_finite() && w > 0.0) => {
                    return Err(PlanError::Config(format!(
                        "source {i}: weight must be a positive number, got {w}"
                    )))
                }
                Share::Samples(0) => {
                    return Err(PlanError::Config(format!(
                        "source {i}: samples_per_epoch must be at least 1"
                    )))
                }
                _ => {}
            }
            if part.num_valid() == 0 {
                return Err(PlanError::Input(format!(
                    "source {i} has no sample to schedule (no valid or selected sample in its {} shards)",
                    part.shards().len()
                )));
            }
        }
        let fixed: u64 = shares
            .iter()
            .map(|s| match s {
                Share::Samples(n) => *n,
                Share::Weight(_) => 0,
            })
            .sum();
        let any_weight = shares.iter().any(|s| matches!(s, Share::Weight(_)));
        let total = match epoch_samples {
            Some(t) => t,
            None if any_weight => parts.iter().map(|p| p.num_valid()).sum(),
            None => fixed,
        };
        if fixed > total || (!any_weight && fixed != total) {
            return Err(PlanError::Config(format!(
                "the sources' samples_per_epoch add up to {fixed}, but the epoch has {total} samples"
            )));
        }
        let quotas = apportion(shares, total - fixed)?;
        let mut shards: Vec<ShardCounts> = Vec::new();
        let mut whole: Vec<bool> = Vec::new();
        let mut sources = Vec::with_capacity(parts.len());
        let mut parts_fp = Vec::with_capacity(2 * parts.len() + 2);
        parts_fp.extend([TAG_MIX, total]);
        for (part, &quota) in parts.iter().zip(&quotas) {
            let first_shard = u32::try_from(shards.len())
                .map_err(|_| PlanError::Input("too many shards in the mixture".into()))?;
            shards.extend(part.shards().iter().cloned());
            whole.extend((0..part.shards().len() as u32).map(|s| part.is_whole(s)));
            sources.push(SourceInfo {
                first_shard,
                num_shards: part.shards().len() as u32,
                num_valid: part.num_valid(),
                quota,
            });
            parts_fp.extend([part.fingerprint(), quota]);
        }
        let fingerprint = derive_seed(&parts_fp);
        Ok(Self {
            input: PlanInput::with_whole(shards, &whole, fingerprint)?,
            sources,
            total,
            fingerprint,
        })
    }

    /// Samples per epoch of each source.
    pub fn quotas(&self) -> Vec<u64> {
        self.sources.iter().map(|s| s.quota).collect()
    }

    /// The first shard of each source in the mixture's shard numbering.
    pub fn first_shards(&self) -> Vec<u32> {
        self.sources.iter().map(|s| s.first_shard).collect()
    }

    /// Samples per epoch (T).
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    pub fn input(&self) -> &PlanInput {
        &self.input
    }

    /// Phase 0 of epoch `epoch`: every source's slice of its stream, interleaved.
    pub(super) fn sequence(&self, seed: u64, epoch: u64) -> MixedSequence {
        let slices = (0..self.sources.len())
            .map(|i| self.source_slice(seed, epoch, i))
            .collect();
        MixedSequence {
            slices: Arc::new(slices),
            quotas: Arc::new(self.quotas()),
            removed: Arc::new(Vec::new()),
            kept_before: Arc::new(Vec::new()),
            shift_after: Arc::new(Vec::new()),
            len: self.total,
        }
    }

    /// Stream positions `[epoch q, (epoch + 1) q)` of source `i`, as runs that keep invalid
    /// ordinals inside (as a phase sequence does).
    fn source_slice(&self, seed: u64, epoch: u64, i: usize) -> Sequence {
        let s = &self.sources[i];
        let (n, q) = (s.num_valid as u128, s.quota as u128);
        let (mut pos, end) = (epoch as u128 * q, (epoch as u128 + 1) * q);
        let mut out = Sequence::default();
        while pos < end {
            let (pass, offset) = ((pos / n) as u64, (pos % n) as u64);
            let take = (end - pos).min(n - offset as u128) as u64;
            let seq = self.pass_sequence(seed, i, pass);
            seq.copy_range(Some(&self.input), offset, offset + take, &mut out, false);
            pos += take as u128;
        }
        out
    }

    /// Pass `pass` of source `i`: its shards permuted, each shard's ordinals rotated.
    fn pass_sequence(&self, seed: u64, i: usize, pass: u64) -> Sequence {
        let s = &self.sources[i];
        let order = permutation(
            s.num_shards as usize,
            derive_seed(&[TAG_MIX_ORDER, seed, i as u64, pass]),
        );
        let mut seq = Sequence::default();
        for local in order {
            let shard = s.first_shard + local;
            let counts = &self.input.shards()[shard as usize];
            let n = counts.num_samples;
            if n == 0 {
                continue;
            }
            let rotation = if self.input.is_whole(shard) {
                0
            } else {
                SplitMix64::new(derive_seed(&[
                    TAG_MIX_ROTATION,
                    seed,
                    i as u64,
                    pass,
                    local as u64,
                ]))
                .below(n)
            };
            for (start, end) in [(rotation, n), (0, rotation)] {
                seq.push(Run { shard, start, end }, Some(&self.input));
            }
        }
        seq
    }
}

/// The quotas of `shares`, the weighted ones sharing `rest` by largest remainder.
fn apportion(shares: &[Share], rest: u64) -> Result<Vec<u64>, PlanError> {
    let weight_sum: f64 = shares
        .iter()
        .map(|s| match s {
            Share::Weight(w) => *w,
            Share::Samples(_) => 0.0,
        })
        .sum();
    let mut quotas = vec![0u64; shares.len()];
    let mut fractions = Vec::new();
    let mut given = 0u64;
    for (i, share) in shares.iter().enumerate() {
        match *share {
            Share::Samples(n) => quotas[i] = n,
            Share::Weight(w) => {
                let exact = rest as f64 * (w / weight_sum);
                let whole = (exact.floor() as u64).min(rest);
                quotas[i] = whole;
                given += whole;
                fractions.push((exact - whole as f64, i));
            }
        }
    }
    fractions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in fractions
        .iter()
        .cycle()
        .take(rest.saturating_sub(given) as usize)
    {
        quotas[i] += 1;
    }
    if let Some(i) = (0..shares.len()).find(|&i| quotas[i] == 0) {
        return Err(PlanError::Config(format!(
            "source {i}: its weight gives it no sample of an epoch of {rest} weighted samples"
        )));
    }
    Ok(quotas)
}

/// Source-`j` samples before source `i`'s `k`-th in the mixed order (ticks: see the module).
fn ticks_before(quotas: &[u64], i: usize, k: u64, j: usize) -> u64 {
    if i == j {
        return k;
    }
    // Source j's tick o (odd numerator) is earlier when o q_i < (2k + 1) q_j; ties go first
    // when j < i.
    let x = (2 * k as u128 + 1) * quotas[j] as u128;
    let qi = quotas[i] as u128;
    let last_odd = if j < i { x / qi } else { (x - 1) / qi };
    (last_odd.div_ceil(2) as u64).min(quotas[j])
}

/// Mixed position of source `i`'s `k`-th sample of the epoch.
fn position_of(quotas: &[u64], i: usize, k: u64) -> u64 {
    (0..quotas.len())
        .map(|j| ticks_before(quotas, i, k, j))
        .sum()
}

/// Source-`i` samples among mixed positions `0..p`.
fn count_before(quotas: &[u64], i: usize, p: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, quotas[i]);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if position_of(quotas, i, mid) < p {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// A mixture's phase sequence: phase 0's interleave of the sources' slices, less the positions
/// earlier phases consumed. Nothing per sample is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MixedSequence {
    slices: Arc<Vec<Sequence>>,
    quotas: Arc<Vec<u64>>,
    /// Phase-0 position ranges consumed by earlier phases: sorted, disjoint, not touching.
    removed: Arc<Vec<(u64, u64)>>,
    /// Per removed range: positions kept before it.
    kept_before: Arc<Vec<u64>>,
    /// Per removed range: phase-0 position minus phase position of what follows it.
    shift_after: Arc<Vec<u64>>,
    len: u64,
}

impl MixedSequence {
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn num_sources(&self) -> usize {
        self.quotas.len()
    }

    /// Calls `f` with the phase-0 ranges of phase positions `from..to`, in order.
    fn phase0_ranges(&self, from: u64, to: u64, mut f: impl FnMut(u64, u64)) {
        let mut pos = from;
        while pos < to {
            let r = self.kept_before.partition_point(|&kept| kept <= pos);
            let shift = if r == 0 { 0 } else { self.shift_after[r - 1] };
            let limit = self.kept_before.get(r).copied().unwrap_or(u64::MAX);
            let take = to.min(limit) - pos;
            f(pos + shift, pos + shift + take);
            pos += take;
        }
    }

    /// The phase position of phase-0 position `p0` (which no earlier phase consumed).
    fn phase_position(&self, p0: u64) -> u64 {
        let r = self.removed.partition_point(|&(_, end)| end <= p0);
        p0 - if r == 0 { 0 } else { self.shift_after[r - 1] }
    }

    /// The samples of phase ranges `ranges`, grouped by source: `per_source[i]` gets source
    /// i's, in order (valid ordinals only).
    pub(super) fn pieces(
        &self,
        input: &PlanInput,
        ranges: &[(u64, u64)],
        per_source: &mut [Sequence],
    ) {
        for (i, out) in per_source.iter_mut().enumerate() {
            for &(a, b) in ranges {
                self.phase0_ranges(a, b, |x, y| {
                    let (s, e) = (
                        count_before(&self.quotas, i, x),
                        count_before(&self.quotas, i, y),
                    );
                    self.slices[i].copy_range(Some(input), s, e, out, true);
                });
            }
        }
    }

    /// The samples of phase positions `from..to`, grouped by source (the order a block holds).
    pub(super) fn copy_range(&self, input: &PlanInput, from: u64, to: u64, out: &mut Sequence) {
        let mut per_source = vec![Sequence::default(); self.num_sources()];
        self.pieces(input, &[(from, to)], &mut per_source);
        for piece in per_source {
            for run in piece.runs {
                out.push(run, None);
            }
        }
    }

    /// The phase positions of the samples of `ranges`, in the grouped order of [`Self::pieces`].
    pub(super) fn grouped_positions(&self, ranges: &[(u64, u64)]) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..self.num_sources() {
            for &(a, b) in ranges {
                self.phase0_ranges(a, b, |x, y| {
                    let (s, e) = (
                        count_before(&self.quotas, i, x),
                        count_before(&self.quotas, i, y),
                    );
                    out.extend(
                        (s..e).map(|k| self.phase_position(position_of(&self.quotas, i, k))),
                    );
                });
            }
        }
        out
    }

    /// This sequence without the phase positions in `removed` (sorted, disjoint ranges).
    pub(super) fn without(&self, removed: &[(u64, u64)]) -> Self {
        let mut all: Vec<(u64, u64)> = self.removed.to_vec();
        for &(a, b) in removed {
            self.phase0_ranges(a, b, |x, y| all.push((x, y)));
        }
        merge_ranges(&mut all);
        let (mut kept_before, mut shift_after) = (Vec::new(), Vec::new());
        let mut gone = 0;
        for &(a, b) in &all {
            kept_before.push(a - gone);
            gone += b - a;
            shift_after.push(gone);
        }
        let total: u64 = self.quotas.iter().sum();
        Self {
            slices: self.slices.clone(),
            quotas: self.quotas.clone(),
            removed: Arc::new(all),
            kept_before: Arc::new(kept_before),
            shift_after: Arc::new(shift_after),
            len: total - gone,
        }
    }
}

/// How a mixture reader reads: one sequential stream per source, and per block (from
/// `first_block`) how many samples of each source it takes, in source order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MixedStreams {
    pub runs: Vec<Vec<Run>>,
    /// `block_counts[b * sources + i]`: source i's samples in the reader's b-th block.
    pub block_counts: Vec<u32>,
}

#[cfg(test)]
impl Mixture {
    /// Every sample of epoch `epoch`, source after source (valid ordinals only).
    pub(super) fn epoch_samples(&self, seed: u64, epoch: u64) -> Vec<Vec<(u32, u64)>> {
        (0..self.sources.len())
            .map(|i| {
                let slice = self.source_slice(seed, epoch, i);
                let mut out = Sequence::default();
                slice.copy_range(Some(&self.input), 0, slice.len(), &mut out, true);
                out.samples(0, out.len())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_interleave_every_prefix_within_two_samples_of_its_share() {
        for quotas in [
            vec![600u64, 300, 100],
            vec![7, 1, 1],
            vec![1, 1000],
            vec![5, 5, 5, 5],
        ] {
            let total: u64 = quotas.iter().sum();
            let mut seen = vec![0u64; quotas.len()];
            let mut order: Vec<(u64, usize)> = Vec::new();
            for (i, &q) in quotas.iter().enumerate() {
                for k in 0..q {
                    order.push((position_of(&quotas, i, k), i));
                }
            }
            order.sort_unstable();
            // Positions are exactly 0..T: the ticks are a total order.
            assert!(order
                .iter()
                .enumerate()
                .all(|(p, &(pos, _))| pos == p as u64));
            for p in 0..=total {
                let counts: Vec<u64> = (0..quotas.len())
                    .map(|i| count_before(&quotas, i, p))
                    .collect();
                assert_eq!(counts.iter().sum::<u64>(), p);
                assert_eq!(counts, seen, "prefix {p} of {quotas:?}");
                for (i, &c) in counts.iter().enumerate() {
                    let share = p as f64 * quotas[i] as f64 / total as f64;
                    assert!(
                        (c as f64 - share).abs() < 2.0,
                        "{quotas:?} p={p} i={i}: {c} vs {share}"
                    );
                }
                if let Some(&(_, i)) = order.get(p as usize) {
                    seen[i] += 1;
                }
            }
        }
    }

    #[test]
    fn weights_are_apportioned_exactly_and_bad_shares_refused() {
        let w = |x: f64| Share::Weight(x);
        assert_eq!(
            apportion(&[w(0.6), w(0.3), w(0.1)], 1000).unwrap(),
            vec![600, 300, 100]
        );
        assert_eq!(
            apportion(&[w(1.0), w(1.0), w(1.0)], 10).unwrap(),
            vec![4, 3, 3]
        );
        assert_eq!(
            apportion(&[w(1.0), Share::Samples(7)], 5).unwrap(),
            vec![5, 7]
        );
        assert!(apportion(&[w(1.0), w(1e-9)], 100).is_err());
        let part = PlanInput::from_counts(&[10, 10]);
        for bad in [w(0.0), w(-1.0), w(f64::NAN), Share::Samples(0)] {
            let err =
                Mixture::new(&[part.clone(), part.clone()], &[w(1.0), bad], None).unwrap_err();
            assert!(matches!(err, PlanError::Config(_)), "{bad:?}: {err}");
        }
        let empty = PlanInput::from_counts(&[0]);
        let err = Mixture::new(&[part.clone(), empty], &[w(1.0), w(1.0)], None).unwrap_err();
        assert!(err.to_string().contains("source 1 has no sample"), "{err}");
    }

    #[test]
    fn a_source_repeats_only_after_a_full_pass_and_continues_across_epochs() {
        let small = PlanInput::from_counts(&[3, 4]);
        let large = PlanInput::from_counts(&[50, 50]);
        let m = Mixture::new(
            &[small, large],
            &[Share::Weight(0.5), Share::Weight(0.5)],
            Some(20),
        )
        .unwrap();
        assert_eq!(m.quotas(), vec![10, 10]);
        let stream = |i: usize, epochs: u64| -> Vec<(u32, u64)> {
            (0..epochs)
                .flat_map(|e| m.source_slice(9, e, i).samples(0, 10))
                .collect()
        };
        let small_stream = stream(0, 3);
        // Passes of 7: each window of 7 aligned to a pass holds every sample once.
        for pass in small_stream.chunks(7).filter(|c| c.len() == 7) {
            let set: std::collections::HashSet<_> = pass.iter().collect();
            assert_eq!(set.len(), 7);
        }
        let large_stream = stream(1, 10);
        let set: std::collections::HashSet<_> = large_stream.iter().collect();
        assert_eq!(
            set.len(),
            100,
            "10 epochs of 10 use the 100 large samples once each"
        );
    }
}
