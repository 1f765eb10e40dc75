//! The shared kit: what every kind of the batch stage stands on, written once.
//!
//! A kind may take from here:
//! - `unit`: the planned unit (`Unit`: a file, or one row group of a Parquet file, with the
//!   content identity it was counted with) that every planned kind reads;
//! - `visits`: a reader's visits (`visits`, `Visit`), the ranges of the planned stream it reads,
//!   per unit touched, that a kind's read thread walks;
//! - `read_thread`: that walk (`read_visits`): each visited unit opened and its items sent in
//!   chunks (`Chunk`, `ChunkBounds`) until the consumer is done with it, the kind giving how a
//!   unit is opened and what its next item is;
//! - `sample`: how an image-text sample is taken (`CaptionSource`, `SampleSpec`, `caption`,
//!   `image_bytes`), a refusal (`Rejection`), the per-thread decoder (`Worker`) and an image's
//!   header read under the pixel cap before anything is decoded (`probe_capped`);
//! - `slots`: a batch decoded in parallel, finished: failed slots dropped and counted by
//!   reason (`keep_decoded`), the kept captions tokenized into the lent token region
//!   (`tokenize_captions`);
//! - `columns`: the Parquet columns a sample spec reads from each file, and under which names;
//! - `patches`: the NaFlex patch slot (`NaFlexSpec`, its limits, an image to its patches),
//!   which the square kind's sample pipeline lays out at a fixed count, the NaFlex kind in
//!   token-budget batches, and the interleaved kind's NaFlex spec bounds by.
//!
//! The kit imports no kind: a kind stands on it, not it on a kind (`check::layout`).

pub mod columns;
pub mod patches;
pub mod read_thread;
pub mod sample;
pub mod slots;
pub mod unit;
pub mod visits;
