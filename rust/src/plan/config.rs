//! A phase's configuration, and the order in which a rank yields its readers' batches.

use super::PlanError;
use serde::{Deserialize, Serialize};

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
    /// A configuration as given; [`PhaseConfig::validate`] is where bad values are refused, so
    /// that a plan reports them instead of silently planning something else.
    pub fn new(
        world_size: u32,
        workers: u32,
        batch_size: u64,
        block_size: u64,
        drop_last: bool,
    ) -> Self {
        Self {
            world_size,
            workers,
            batch_size,
            block_size,
            drop_last,
        }
    }

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
