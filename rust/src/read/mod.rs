//! The read stage: shard bytes to raw samples.
//!
//! A source opens a shard URL at a byte offset (`source`: files, HTTP(S) with retries and
//! resume, S3 over presigned URLs, the shard cache); the tar reader streams its members
//! (`tar`); the grouping rule makes them samples (`group`). A shard span is the piece of a shard a
//! reader reads (`span`); a planned reader's spans say where each run of a shard starts (`spans`), fetching a shard's detail block when a span starts in
//! its middle (`seek`). A Parquet file is a shard too (`parquet`): its rows are the samples.
//! `shard_samples` is the raw-sample reader behind `read_samples`. Nothing
//! here decodes an image.

pub mod group;
pub mod parquet;
pub mod seek;
pub mod shard_samples;
pub mod source;
pub mod span;
pub mod spans;
pub mod tar;
