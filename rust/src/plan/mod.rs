//! The exact-epoch plan: a pure function of (shard counts, seed, epoch, world size, workers per
//! rank, batch size, block size) that says which samples every reader reads and in which order,
//! and how an interrupted epoch resumes, also onto another world size.
//!
//! The contract, with the reasons for every rule, is `docs/epoch-plan.md`. In short:
//!
//! 1. **Sequence.** Phase 0 orders the shards by a permutation of (seed, epoch), rotates the valid
//!    ordinals of every shard by an offset of (seed, epoch, shard) and concatenates them: N samples,
//!    held as runs of consecutive ordinals (memory grows with shards, not samples).
//! 2. **Cut.** With G = world x batch, rank r gets the r-th contiguous slice of the first
//!    N - N % G samples; the N % G tail is the reported remainder and the ranks' reserve of
//!    replacements for samples that turn out corrupt at run time (`drop_last = false` instead
//!    gives every rank one short batch of the same size, padded with repeats).
//! 3. **Readers.** A rank's K readers (DataLoader workers; one when K = 0) get contiguous,
//!    balanced batch ranges, so torch's round-robin over workers yields them in a known order.
//! 4. **Blocks.** Each reader's sequence is cut into blocks of `block_size` samples; each block is
//!    emitted in a permutation of (seed, epoch, phase, rank, reader, block). Batches are
//!    consecutive `batch_size` samples of the emitted order.
//! 5. **Resume.** A state records, per phase, the configuration and the batches every rank
//!    yielded. The same configuration continues exactly; another one removes what was consumed
//!    and plans the rest, in sequence order, as a new phase.
//!
//! Nothing here knows about Python, I/O or tensors; all randomness comes from [`crate::rng`].
//!
//! A *mixture* of several datasets is planned the same way over an interleave of the sources'
//! sequences (`mixture`; docs/epoch-plan.md section 7).
//!
//! One algorithm per module: `input` (what the plan knows of the dataset), `config` (a
//! phase's configuration and the readers' round-robin order), `sequence` (the phase sequence
//! as runs), `mixture` (several sources in one epoch), `phase` (one dataset's or a mixture's
//! phase sequence), `layout` (cutting it into ranks, readers, batches and reserve), `shuffle` (the
//! block shuffle), `epoch` (the plan of an epoch and its phases), `state` (the resume state
//! and what a phase consumed), `reader` (one reader's plan), `streaming` (no index); `unit_stream`
//! plans the kinds weighed by units (packed text, NaFlex budgets, interleaved documents) the
//! same way, by positions in one stream of unit weights; `budget` groups a unit's images into
//! token-budget batches (planned by `unit_stream`, a batch a position).

use serde::{Deserialize, Serialize};

pub mod budget;
mod config;
mod epoch;
mod input;
mod layout;
mod mixture;
mod phase;
mod reader;
mod sequence;
mod shuffle;
mod state;
mod streaming;
#[cfg(test)]
mod tests;
pub mod unit_stream;

pub use config::{rank_batch_order, reader_batches_done, PhaseConfig};
pub use epoch::EpochPlan;
pub use input::{shared_ordinals, PlanInput, ShardCounts};
pub use mixture::{MixedStreams, Mixture, Share};
pub use reader::{Emitted, ReaderPlan};
pub use shuffle::{block_order, BlockShuffle};
pub use state::{EpochState, PhaseRecord, ReserveUse};
pub use streaming::{assign_shards, ShardAssignment};

/// Domain tags, the first part of every derived seed, so the streams can never coincide.
pub(crate) const TAG_SHARD_ORDER: u64 = 1;
pub(crate) const TAG_ROTATION: u64 = 2;
pub(crate) const TAG_BLOCK: u64 = 3;
pub(crate) const TAG_NO_INDEX: u64 = 4;
pub(crate) const TAG_MIX: u64 = 5;
pub(crate) const TAG_MIX_ORDER: u64 = 6;
pub(crate) const TAG_MIX_ROTATION: u64 = 7;

/// `format` of a serialized [`EpochState`].
pub const STATE_FORMAT: &str = "shardstream-epoch-state";
/// The state version this code writes and reads.
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("invalid plan configuration: {0}")]
    Config(String),
    #[error("invalid shard counts: {0}")]
    Input(String),
    #[error("cannot resume from this loader state: {0}")]
    State(String),
    #[error(
        "cannot resume: the loader state was saved for another dataset index \
         (state fingerprint {state:016x}, this index {index:016x})"
    )]
    OtherDataset { state: u64, index: u64 },
}

/// Consecutive sample ordinals `start..end` of one shard (ordinals count every sample of the
/// shard in file order, invalid ones included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Run {
    pub shard: u32,
    pub start: u64,
    pub end: u64,
}

impl Run {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}
