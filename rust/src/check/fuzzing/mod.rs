//! Fuzzing support, compiled for `cargo test` and with the `fuzzing` feature only.
//!
//! Two drivers share these inputs and checks:
//! - `crate::check::fuzz`: proptest, structure-aware mutations of the seeds, a fixed budget in
//!   `cargo test` (and so in CI);
//! - `fuzz/` (a separate crate): coverage-guided libFuzzer binaries built on stable Rust with
//!   sanitizer-coverage instrumentation and no sanitizer (`scripts/fuzz.sh`).

pub mod checks;
pub mod reader_seeds;
pub mod readers;
pub mod seeds;
pub mod targets;
