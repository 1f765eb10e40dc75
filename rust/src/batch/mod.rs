//! The batch stage: raw samples to batch tensors.
//!
//! `pipeline` is the one pipeline every kind runs on (work pool, lent buffers, stop and drop,
//! panics as faults); a kind is a `pipeline::Kind`. `sample_batches` is the sample kinds'
//! (square images, and NaFlex at a fixed count), built of one module a step: `span` (what a
//! reader reads of a shard, and how it opens), `reader` (the read-ahead threads), `mix` (a
//! mixture's sources), `shuffle` (the block shuffle), `assemble` (the batcher and its phases),
//! `reserve` (the spans that refill a planned batch), `stats`, `config` and `panics`. `sample` turns one raw sample
//! into its caption and its pixels in a batch slot (shared by the loader and validation);
//! `text` tokenizes captions into the batch's token tensor; `columns` chooses the Parquet
//! columns a spec reads from each file.
//!
//! That is the square image-text kind. Other kinds sit beside it, each a module owning only
//! what turns a raw sample into its slot of a batch: `naflex` (images at their own aspect
//! ratio as patch sequences, in the square kind's pipeline with another slot layout: see
//! `config::SampleKind`) and `packed` (text documents packed into token rows, planned by
//! `plan::packed`); `budget` makes the NaFlex kind's token-budget batches (as many images as fit
//! a patch budget, by length bucket, planned over the batches each unit holds). The kinds planned
//! over unit weights (packed and budget) share `units`: a file's units, the count pass over
//! them, and a reader's share of the plan.

mod assemble;
pub mod budget;
pub mod columns;
pub mod config;
#[cfg(test)]
mod fixtures;
pub mod interleaved;
mod mix;
pub mod naflex;
pub mod packed;
mod panics;
pub mod pipeline;
mod reader;
mod reserve;
pub mod sample;
pub mod sample_batches;
mod shuffle;
pub mod span;
pub mod stats;
pub mod units;
