//! The packed text kind (`batch::text`, planned by `plan::unit_stream`): documents tokenized and packed into rows of `seq_len` tokens.
//!
//! A kind owns what turns raw samples into its slot of a batch, and its batch layout; reading,
//! sources, fault handling and the plan's arithmetic are shared. This kind's parts, one job
//! each: `documents` (a unit's documents: a tar member, a JSON field or a Parquet string
//! column, checked, not trimmed), `jsonl` (a JSONL file's lines, plain, gzip or zstd, each held
//! only up to the document cap), `count` (each unit's token count under a
//! `tokenize::DocumentEncoder`, once, what the plan cuts), `stream` (a reader's planned
//! token positions, read unit by unit), `rows` (a block's rows in its seeded order, with
//! document boundaries), `pipeline` (the threads and the lent buffers) and `stats`.
//!
//! Its plan is `plan::unit_stream`: token positions instead of sample ordinals, so that every rank
//! yields the same number of full rows and a resume continues at the exact next token.

pub mod count;
pub mod documents;
pub mod jsonl;
pub mod pipeline;
mod rows;
pub mod stats;
pub mod stream;

pub use count::{count_unit, UnitCount};
pub use documents::TextSpec;
pub use pipeline::{start, PackedConfig, PackedPipeline, RowBatcher, RowsMeta};
pub use stream::StreamInput;
