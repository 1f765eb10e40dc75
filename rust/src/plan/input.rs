//! What the plan knows of the dataset: per shard its sample count and invalid ordinals.

use super::PlanError;
use crate::rng::derive_seed;
use std::sync::Arc;

/// What the plan needs to know of one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardCounts {
    /// Samples in the shard, invalid ones included.
    pub num_samples: u64,
    /// Ordinals of invalid samples (any order; [`PlanInput::new`] sorts them).
    /// Shared with the index that holds them (a clone costs nothing): a validated index of
    /// millions of invalid samples is held once per rank, not twice.
    pub invalid: Arc<[u64]>,
    /// Read whole, from its first sample: not rotated in the phase sequence. A Parquet row
    /// group is decoded whole whichever row a read starts at, so a rotated one would be read
    /// twice (from the rotation to its end, then from its start); the block shuffle still
    /// changes its samples' order every epoch.
    pub whole: bool,
}

/// The dataset as the plan sees it: per-shard counts and a fingerprint that identifies the
/// dataset in resume states (`Index::fingerprint` for an index).
#[derive(Clone, Debug)]
pub struct PlanInput {
    /// Shared: every plan of the dataset keeps a handle (the phase sequence reads invalid
    /// ordinals from it), and a clone costs nothing.
    pub(super) shards: Arc<Vec<ShardCounts>>,
    pub(super) fingerprint: u64,
    pub(super) num_valid: u64,
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
        Ok(Self {
            shards: Arc::new(shards),
            fingerprint,
            num_valid,
        })
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
                whole: false,
                num_samples: n,
                invalid: Arc::from([]),
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
