//! Without an index: shards split between readers, batches fixed by `samples_per_epoch`.

use super::shuffle::BlockShuffle;
use super::{config::PhaseConfig, PlanError, TAG_NO_INDEX};
use crate::rng::{derive_seed, permutation};

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
