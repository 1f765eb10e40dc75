//! The block shuffle: a reader's sequence cut into blocks, each emitted in a seeded order.

use super::TAG_BLOCK;
use crate::rng::{derive_seed, permutation};

/// The block shuffle of one reader: its sequence of `len` samples is cut into blocks of
/// `block_size`, and block b is emitted in the order `permutation(len_b, derive_seed([base, b]))`
/// (sample j of the emitted block is sample `perm[j]` of the block in sequence order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockShuffle {
    pub(super) base_seed: u64,
    pub(super) block_size: u64,
    pub(super) len: u64,
}

impl BlockShuffle {
    pub(super) fn new(
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
        block_order(self.base_seed, block, self.block_len(block) as usize)
    }
}

/// The one definition of a block's emission order: block `block` of `len` samples of a reader
/// whose shuffle seed is `base_seed` ([`BlockShuffle::base_seed`]) is emitted as
/// `permutation(len, derive_seed([base_seed, block]))`. The plan and the pipeline (which sees
/// only the seed and the samples it read) both call this.
pub fn block_order(base_seed: u64, block: u64, len: usize) -> Vec<u32> {
    permutation(len, derive_seed(&[base_seed, block]))
}
