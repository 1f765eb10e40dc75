//! The square image-text kind: samples of a WebDataset or Parquet dataset to batches of
//! `[B, 3, S, S]` pixels and their captions (and, with the sample spec's NaFlex layout
//! (`config::SampleKind`), to NaFlex patch slots at a fixed count).
//!
//! `sample_batches` is the kind on the pipeline, built of one module a step: `span` (how a
//! shard span opens; the span itself is `read::span`), `reader` (the read-ahead threads), `mix`
//! (a mixture's sources), `shuffle` (the block shuffle), `assemble` (the batcher and its
//! phases), `reserve` (the spans that refill a planned batch), `stats` and `config`. `sample`
//! turns one raw sample into its caption and its pixels in a batch slot (shared by the loader
//! and validation).

mod assemble;
pub mod config;
#[cfg(test)]
mod fixtures;
mod mix;
mod reader;
mod reserve;
pub mod sample;
pub mod sample_batches;
mod shuffle;
mod span;
pub mod stats;
