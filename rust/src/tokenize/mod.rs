//! Tokenizers, one family for every kind that needs tokens: the caption path of the image-text
//! kinds and the packed text kind use them alike.
//!
//! `clip` (open_clip's CLIP tokenizer, token for token, or a `tokenizer.json` run by the
//! `tokenizers` library, into fixed-length caption rows), `clean` (open_clip's caption
//! cleaning), `documents` (a `tokenizer.json` encoding whole documents with BOS/EOS, for
//! packing) and `windows` (where a long document may be cut so that encoding it in pieces gives
//! the same ids).

pub mod bpe;
pub mod clean;
pub mod clip;
pub mod documents;
mod fxhash;
mod windows;

pub use clean::{clean, ftfy_lite, html_unescape};
pub use clip::{shared, ClipTokenizer, TokenizerError, DEFAULT_CONTEXT_LENGTH};
pub use documents::{DocumentEncoder, EncoderError};
