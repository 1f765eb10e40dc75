//! The phase sequence: every valid sample of the epoch, in order, held as runs of ordinals.

use super::{PlanInput, Run, TAG_ROTATION, TAG_SHARD_ORDER};
use crate::rng::{derive_seed, permutation, SplitMix64};

/// A sequence of samples held as runs, with the end position of each run for lookups.
///
/// A phase's sequence (the whole dataset's) keeps a shard's invalid ordinals inside its runs, so
/// it holds about two runs per shard however many samples validation rejected: `ends` count
/// valid samples only, and positions are found with the plan input's invalid ordinals. A
/// reader's sequence (few shards) is split around them, so its runs hold valid samples only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Sequence {
    pub(super) runs: Vec<Run>,
    pub(super) ends: Vec<u64>,
}

/// Where a sequence's runs may hold invalid ordinals: the input that knows them.
pub(super) type Invalids<'a> = Option<&'a PlanInput>;

pub(super) fn valid_len(invalids: Invalids<'_>, run: &Run) -> u64 {
    match invalids {
        Some(input) => input.valid_in(run.shard, run.start, run.end),
        None => run.len(),
    }
}

impl Sequence {
    pub(super) fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Appends a run, merging it into the last one when it continues it.
    pub(super) fn push(&mut self, run: Run, invalids: Invalids<'_>) {
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
    pub(super) fn copy_range(
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
    pub(super) fn samples(&self, from: u64, to: u64) -> Vec<(u32, u64)> {
        let mut part = Sequence::default();
        self.copy_range(None, from, to, &mut part, true);
        part.runs
            .iter()
            .flat_map(|r| (r.start..r.end).map(move |o| (r.shard, o)))
            .collect()
    }

    /// This phase sequence without the positions in `removed` (sorted, disjoint ranges), in order.
    pub(super) fn without(&self, input: &PlanInput, removed: &[(u64, u64)]) -> Sequence {
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
pub(super) fn push_valid(seq: &mut Sequence, shard: u32, start: u64, end: u64, invalid: &[u64]) {
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
pub(super) fn global_sequence(input: &PlanInput, seed: u64, epoch: u64) -> Sequence {
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
        let rotation = if input.is_whole(shard) {
            0
        } else {
            SplitMix64::new(derive_seed(&[TAG_ROTATION, seed, epoch, shard as u64]))
                .below(counts.num_samples)
        };
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
