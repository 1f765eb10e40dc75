//! One reader's plan: what it reads, in order, and how it emits and batches it.

use super::mixture::MixedStreams;
use super::sequence::Sequence;
use super::shuffle::BlockShuffle;
use super::Run;

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
    pub(super) sequence: Sequence,
    pub(super) reserve: Vec<Run>,
    /// A mixture's reader: each source's runs as one stream, and each block's share of each
    /// (`runs()` is then those shares, block after block, source after source).
    pub streams: Option<MixedStreams>,
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
    pub(super) plan: &'a ReaderPlan,
    pub(super) next_block: u64,
    /// Samples of `plan.sequence` already loaded into blocks.
    pub(super) read: u64,
    pub(super) block: Vec<(u32, u64)>,
    pub(super) perm: Vec<u32>,
    pub(super) at: usize,
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
