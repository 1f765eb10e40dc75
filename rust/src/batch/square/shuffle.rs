//! The block shuffle: the stream is cut into blocks of `block_size` items, and each block is
//! emitted in the plan's seeded permutation (`plan::block_order`), so a reader's order is the
//! plan's order, from any block on (`first_block`, when a reader resumes).

use crate::batch::square::config::PipelineConfig;
use crate::batch::square::mix::MixedReader;
use crate::batch::square::reader::{Item, MergedReader, StreamError};
use crate::plan;

/// Where the block shuffle takes its items from.
pub(super) enum ItemSource {
    Merged(MergedReader),
    Mixed(MixedReader),
}

impl ItemSource {
    /// See [`MergedReader::cycle_items`] (a mixture never cycles).
    fn cycle_items(&self) -> Option<u64> {
        match self {
            Self::Merged(reader) => reader.cycle_items(),
            Self::Mixed(_) => None,
        }
    }

    fn next(&mut self) -> Result<Option<Item>, StreamError> {
        match self {
            Self::Merged(reader) => reader.next(),
            Self::Mixed(reader) => reader.next(),
        }
    }
}

/// The emitted stream: blocks of `block_size` items, each emitted in the order
/// [`plan::block_order`] gives it (the plan's definition; `seed` is the reader's
/// `plan::BlockShuffle::base_seed`, `block_index` the block's number in the reader's sequence).
pub(super) struct ShuffledItems {
    source: ItemSource,
    block_size: usize,
    seed: u64,
    block_index: u64,
    pending: Vec<Option<Item>>,
    order: Vec<u32>,
    pos: usize,
}

impl ShuffledItems {
    pub(super) fn new(source: ItemSource, cfg: &PipelineConfig) -> Self {
        Self {
            source,
            block_size: cfg.block_size,
            seed: cfg.shuffle_seed,
            block_index: cfg.first_block,
            pending: vec![],
            order: vec![],
            pos: 0,
        }
    }

    /// Consecutive items that, once emitted, hold every item of a full cycle over the spans
    /// (streaming with a quota): a cycle's items, plus a block, since a block's items come out
    /// permuted. None until the first cycle is complete.
    pub(super) fn cycle_window(&self) -> Option<u64> {
        self.source
            .cycle_items()
            .map(|n| n + self.block_size.max(1) as u64)
    }

    pub(super) fn next(&mut self) -> Result<Option<Item>, StreamError> {
        loop {
            if self.pos < self.order.len() {
                let i = self.order[self.pos] as usize;
                self.pos += 1;
                return Ok(self.pending[i].take());
            }
            self.pending.clear();
            while self.pending.len() < self.block_size.max(1) {
                match self.source.next()? {
                    Some(item) => self.pending.push(Some(item)),
                    None => break,
                }
            }
            if self.pending.is_empty() {
                return Ok(None);
            }
            self.order = if self.block_size > 1 {
                plan::block_order(self.seed, self.block_index, self.pending.len())
            } else {
                vec![0]
            };
            self.block_index += 1;
            self.pos = 0;
        }
    }
}
