//! The check stage: shards and parsers checked rather than loaded.
//!
//! `scan` validates a whole shard (what `shardstream validate` reports and `shardstream index`
//! records), with `parquet`'s column checks for Parquet files. `fuzzing` holds the fuzz targets' seeds and checks, shared by the proptest driver
//! (`fuzz`, run by `cargo test`) and the libFuzzer targets in `fuzz/`. `layout` (tests only) checks
//! the batch stage's module layout from the source files: no kind imports another, no import
//! circle, and the read stage imports nothing from `batch`.

#[cfg(test)]
mod fuzz;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(test)]
mod layout;
pub mod parquet;
pub mod scan;
