//! shardstream core: streaming WebDataset shards into training batches.
//!
//! The crate is laid out by stage, in the order a sample passes through it: `read` (shard
//! bytes to raw samples), `image` (pixels), `tokenize` (text to token ids), `batch` (samples
//! to batch tensors); beside them `plan` (the epoch plan and resume state), `index` (the dataset
//! index and its subsets) and `check` (validation and fuzzing). Each module has one job; none of them knows about Python.
//! The PyO3 layer lives in `binding` and is compiled only with the `python` feature (maturin
//! turns it on).

pub mod batch;
pub mod check;
pub mod defaults;
pub mod error;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod image;
pub mod index;
pub mod plan;
pub mod read;
pub mod rng;
pub mod tokenize;
pub mod video;

#[cfg(feature = "python")]
mod binding;
