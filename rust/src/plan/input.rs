//! What the plan knows of the dataset: per shard its sample count and invalid ordinals.

use super::PlanError;
use crate::rng::derive_seed;
use std::sync::Arc;

/// `ordinals` as the shared list that the index and the plan input hold. An empty list is one
/// allocation for the whole process, cloned: `Arc<[u64]>` allocates its counts even for no
/// elements, which cost every rank 32 bytes a shard (41 MB at 1.28 M shards) when nearly every
/// shard has no invalid sample.
pub fn shared_ordinals(ordinals: Vec<u64>) -> Arc<[u64]> {
    static EMPTY: std::sync::OnceLock<Arc<[u64]>> = std::sync::OnceLock::new();
    if ordinals.is_empty() {
        EMPTY.get_or_init(|| Arc::from([])).clone()
    } else {
        ordinals.into()
    }
}

/// What the plan needs to know of one shard. Every rank holds one per shard (and a mixture
/// another): 24 bytes, pinned by a test; per-shard flags go in bitsets beside them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Samples in the shard, invalid ones included.
    pub num_samples: u64,
    /// Ordinals of invalid samples (any order; [`PlanInput::new`] sorts them).
    /// Shared with the index that holds them (a clone costs nothing): a validated index of
    /// millions of invalid samples is held once per rank, not twice.
    pub invalid: Arc<[u64]>,
}

/// The dataset as the plan sees it: per-shard counts and a fingerprint that identifies the
/// dataset in resume states (`Index::fingerprint` for an index).
#[derive(Clone, Debug)]
pub struct PlanInput {
    /// Shared: every plan of the dataset keeps a handle (the phase sequence reads invalid
    /// ordinals from it), and a clone costs nothing.
    pub(super) shards: Arc<Vec<ShardCounts>>,
    /// One bit per shard: read whole, from its first sample, so not rotated in the phase
    /// sequence. A Parquet row group is decoded whole whichever row a read starts at, so a
    /// rotated one would be read twice (from the rotation to its end, then from its start); the
    /// block shuffle still changes its samples' order every epoch. Empty when no shard is
    /// (a tar dataset). A bitset beside the counts, not a flag in them: a flag padded every
    /// shard's counts by 8 bytes, on every rank.
    whole: Arc<[u64]>,
    pub(super) fingerprint: u64,
    pub(super) num_valid: u64,
}

impl PlanInput {
    /// Checks the counts (invalid ordinals in range) and sorts and deduplicates invalid ordinals.
    /// No shard is read whole (see [`PlanInput::with_whole`]).
    pub fn new(shards: Vec<ShardCounts>, fingerprint: u64) -> Result<Self, PlanError> {
        Self::with_whole(shards, &[], fingerprint)
    }

    /// [`PlanInput::new`], with shard i read whole when `whole[i]` (missing entries: false).
    pub fn with_whole(
        mut shards: Vec<ShardCounts>,
        whole: &[bool],
        fingerprint: u64,
    ) -> Result<Self, PlanError> {
        if shards.len() > u32::MAX as usize {
            return Err(PlanError::Input(format!(
                "{} shards, at most {} supported",
                shards.len(),
                u32::MAX
            )));
        }
        let mut num_valid: u64 = 0;
        for (i, shard) in shards.iter_mut().enumerate() {
            if !shard.invalid.windows(2).all(|w| w[0] < w[1]) {
                let mut sorted = shard.invalid.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                shard.invalid = sorted.into();
            }
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
        let mut bits = Vec::new();
        if whole.iter().any(|&w| w) {
            bits = vec![0u64; shards.len().div_ceil(64)];
            for (i, _) in whole
                .iter()
                .take(shards.len())
                .enumerate()
                .filter(|(_, &w)| w)
            {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        Ok(Self {
            shards: Arc::new(shards),
            whole: bits.into(),
            fingerprint,
            num_valid,
        })
    }

    /// Whether `shard` is read whole, from its first sample (not rotated).
    pub fn is_whole(&self, shard: u32) -> bool {
        self.whole
            .get(shard as usize / 64)
            .is_some_and(|bits| bits >> (shard % 64) & 1 == 1)
    }

    /// Invalid ordinals of `shard`, sorted.
    pub(super) fn invalid(&self, shard: u32) -> &[u64] {
        &self.shards[shard as usize].invalid
    }

    /// Valid samples among ordinals `start..end` of `shard`.
    pub(super) fn valid_in(&self, shard: u32, start: u64, end: u64) -> u64 {
        let inv = self.invalid(shard);
        let bad = inv.partition_point(|&o| o < end) - inv.partition_point(|&o| o < start);
        end - start - bad as u64
    }

    /// The ordinal of the `k`-th valid sample (from 0) at or after ordinal `start` of `shard`.
    pub(super) fn nth_valid(&self, shard: u32, start: u64, k: u64) -> u64 {
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
                invalid: shared_ordinals(Vec::new()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the per-shard counts at 24 bytes (a bool beside them had made 32: 10 MB a rank at
    /// 1.28 M shards), and checks that the whole-unit bitset is read back per shard.
    #[test]
    fn counts_stay_small_and_whole_units_are_kept_apart() {
        assert!(std::mem::size_of::<ShardCounts>() <= 24);
        let counts = |n| ShardCounts {
            num_samples: n,
            invalid: shared_ordinals(Vec::new()),
        };
        let shards: Vec<_> = (0..130).map(|_| counts(4)).collect();
        let mut whole = vec![false; 130];
        whole[1] = true;
        whole[129] = true;
        let input = PlanInput::with_whole(shards.clone(), &whole, 7).unwrap();
        let read: Vec<bool> = (0..130).map(|s| input.is_whole(s)).collect();
        assert_eq!(read, whole);
        let plain = PlanInput::new(shards, 7).unwrap();
        assert!((0..130).all(|s| !plain.is_whole(s)) && plain.whole.is_empty());
        assert!(Arc::ptr_eq(
            &plain.shards()[0].invalid,
            &shared_ordinals(Vec::new())
        ));
    }
}
