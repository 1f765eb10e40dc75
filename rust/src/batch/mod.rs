//! The batch stage: raw samples to batch tensors.
//!
//! Laid out by what a kind may take:
//! - `pipeline` is the one pipeline every kind runs on (work pool, lent buffers, stop and drop,
//!   panics as faults, via `panics`); a kind is a `pipeline::Kind`. `units` serves the kinds
//!   planned over unit weights: a file's units, the count pass over them, and a reader's share
//!   of the plan.
//! - `kit` is what every kind stands on, written once: the planned unit, a reader's visits, how a
//!   sample is taken (caption, image member, the pixel cap, refusals, the per-thread decoder),
//!   the Parquet columns a sample spec reads, and the NaFlex patch slot.
//! - One folder a kind, side by side: `square` (image-text samples as `[3, S, S]` pixels, and the
//!   sample pipeline that also lays out NaFlex slots at a fixed count), `naflex` (token-budget
//!   NaFlex batches), `text` (documents packed into token rows, planned by `plan::unit_stream`),
//!   `interleaved` (documents of text and images packed into rows with their patches) and
//!   `video` (clips at their sampled frames; so far the sampling and sizing rules only).
//!
//! A kind imports the kit, `pipeline`, `units` and the stages below (`read`, `image`,
//! `tokenize`, `plan`, `error`), never another kind's folder; the kit and the shared files import
//! no kind; the read stage imports nothing from here. `check::layout` tests these rules.

pub mod interleaved;
pub mod kit;
pub mod naflex;
mod panics;
pub mod pipeline;
pub mod square;
pub mod text;
pub mod units;
pub mod video;
