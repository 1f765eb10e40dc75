//! The interleaved image-text kind (VLM pretraining and multi-image samples): documents, each an
//! ordered sequence of text segments and images, tokenized and packed into rows of `seq_len`
//! tokens with their images' patches, exact across ranks, workers and resume.
//!
//! One job a module: `parts` (a document's parts), `document_spec` (where a unit's documents
//! are, and the caps and aligned lists every document passes), `documents` (a unit's documents
//! from Parquet list columns or a tar's JSON member), `conversation` (a tar's LLaVA conversation rendered by a chat format), `captions`
//! (a tar's image-caption pair as a one-image document), `qwen_vl` (Qwen2-VL's image and video rules: grid,
//! token run, `pixel_values` layout), `videos` (a document's video measured from its container,
//! and its sampled frames decoded into rows), `vision` (the spec a corpus is read under: Qwen2-VL or
//! NaFlex), `measure` (a document's tokens and grids, no decoding), `pack` (documents into batches of
//! rows, deterministically per unit), `positions` (each run's positions as the model gives them to
//! the run alone: text and M-RoPE), `count` (the count pass: batches per unit) and `pipeline`
//! (one reader's planned batches, decoded into the lent buffers).
//!
//! Its plan is `plan::unit_stream` over batches, one position per batch, as the token-budget NaFlex
//! kind's: every rank yields the same number of batches, and a resume continues at the exact
//! next batch, also onto another world size.

mod captions;
mod conversation;
mod count;
mod document_spec;
mod documents;
mod measure;
mod pack;
mod parquet_documents;
mod parts;
mod pipeline;
mod positions;
mod qwen_vl;
mod videos;
mod vision;

pub use captions::CaptionKeys;
pub use conversation::ChatFormat;
pub use count::{count_files, count_unit, InterleavedCount};
pub use document_spec::{DocumentSpec, Layout};
/// A unit's documents, for the fuzz targets' checks (`check::fuzzing::readers`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use documents::UnitDocuments;
pub use pack::PackShape;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use parts::Part;
pub use pipeline::{start, InterleavedInput, InterleavedMeta, InterleavedPipeline, IGNORE};
pub use qwen_vl::{QwenVideoSpec, QwenVlSpec};
pub use vision::{NaFlexVlSpec, VisionSpec};

use measure::Measure;

use crate::tokenize::DocumentEncoder;

/// Everything that decides a unit's batches (the count's identity): where documents are, the
/// vision spec, the batch shape and the pixel cap.
#[derive(Clone, Debug)]
pub struct InterleavedSpec {
    pub documents: DocumentSpec,
    pub vision: VisionSpec,
    pub shape: PackShape,
    /// An image of more pixels (by its header) is skipped with its document
    /// (`too_many_pixels`), never decoded.
    pub max_pixels: u64,
}

impl InterleavedSpec {
    /// What a pipeline cannot run with under `encoder`.
    pub fn validate(&self, encoder: &DocumentEncoder) -> Result<(), String> {
        self.vision.validate()?;
        if let Layout::Conversations(format) = &self.documents.layout {
            format.validate(encoder)?;
        }
        let s = &self.shape;
        if s.seq_len < 8 || s.rows == 0 {
            return Err(format!(
                "seq_len must be at least 8 and batch_size at least 1, not {} and {}",
                s.seq_len, s.rows
            ));
        }
        // The largest image the spec gives must fit a batch's patch cap.
        let largest = self.vision.largest_image();
        if s.max_patches < largest {
            return Err(format!(
                "max_patches_per_batch={} is under one largest image of the spec ({largest} patches)",
                s.max_patches
            ));
        }
        if self.documents.max_images == 0 {
            return Err("max_images_per_document must be at least 1".into());
        }
        Ok(())
    }

    fn measure<'a>(&'a self, encoder: &'a DocumentEncoder, keep_bytes: bool) -> Measure<'a> {
        Measure {
            encoder,
            vision: &self.vision,
            max_pixels: self.max_pixels,
            seq_len: self.shape.seq_len,
            max_patches: self.shape.max_patches,
            keep_bytes,
        }
    }
}
