//! A phase's sequence: one dataset's runs, or a mixture's interleave of its sources.

use super::mixture::MixedSequence;
use super::sequence::Sequence;
use super::PlanInput;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum PhaseSequence {
    /// One dataset: runs that keep invalid ordinals inside (see [`Sequence`]).
    Plain(Sequence),
    Mixed(MixedSequence),
}

impl PhaseSequence {
    pub(super) fn len(&self) -> u64 {
        match self {
            Self::Plain(seq) => seq.len(),
            Self::Mixed(mixed) => mixed.len(),
        }
    }

    /// Appends the valid samples of positions `from..to` to `out`, in *block order*: sequence
    /// order for one dataset, grouped by source for a mixture.
    pub(super) fn copy_range(&self, input: &PlanInput, from: u64, to: u64, out: &mut Sequence) {
        match self {
            Self::Plain(seq) => seq.copy_range(Some(input), from, to, out, true),
            Self::Mixed(mixed) => mixed.copy_range(input, from, to, out),
        }
    }

    /// The positions of the samples of `ranges` in the block order of [`Self::copy_range`]
    /// (applied range by range for one dataset, over all ranges at once for a mixture).
    pub(super) fn grouped_positions(&self, ranges: &[(u64, u64)]) -> Vec<u64> {
        match self {
            Self::Plain(_) => ranges.iter().flat_map(|&(a, b)| a..b).collect(),
            Self::Mixed(mixed) => mixed.grouped_positions(ranges),
        }
    }

    /// This sequence without the positions in `removed` (sorted, disjoint ranges), in order.
    pub(super) fn without(&self, input: &PlanInput, removed: &[(u64, u64)]) -> Self {
        match self {
            Self::Plain(seq) => Self::Plain(seq.without(input, removed)),
            Self::Mixed(mixed) => Self::Mixed(mixed.without(removed)),
        }
    }
}

#[cfg(test)]
impl PhaseSequence {
    /// Runs held by one dataset's sequence (0 for a mixture, which holds none per position).
    pub(super) fn plain_runs(&self) -> usize {
        match self {
            Self::Plain(seq) => seq.runs.len(),
            Self::Mixed(_) => 0,
        }
    }
}
