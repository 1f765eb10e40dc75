//! shardstream core: streaming WebDataset shards into training batches.
//!
//! Each module has one job; none of them knows about Python. The PyO3 layer lives in
//! `binding` and is compiled only with the `python` feature (maturin turns it on).

pub mod convolve;
pub mod decode;
pub mod defaults;
pub mod error;
#[cfg(test)]
mod fuzz;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod group;
pub mod index;
pub mod jpeg;
pub mod jpeg_raw;
pub mod pipeline;
pub mod plan;
pub mod resize;
pub mod rng;
pub mod sample;
pub mod scan;
pub mod seek;
pub mod shard_samples;
pub mod source;
pub mod spans;
pub mod subset;
pub mod tar;
pub mod text;

#[cfg(feature = "python")]
mod binding;
