//! The interleaved image-text kind: its count pass, and the running pipeline of one reader
//! (planned as the token-budget kind's, a batch a position).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::json;

use super::convert::SourceSettings;
use super::pipeline::{MetaToPy, Pipeline};
use super::settings::{settings, tagged, Settings};
use super::units::{batch_share, count_list, ReaderTuple, UnitTuple};
use crate::batch::interleaved::{
    self, count_files, CaptionKeys, ChatFormat, DocumentSpec, InterleavedCount, InterleavedInput,
    InterleavedMeta, InterleavedSpec, Layout, NaFlexVlSpec, PackShape, QwenVideoSpec, QwenVlSpec,
    VisionSpec,
};
use crate::tokenize::DocumentEncoder;
use crate::video::{Count, Sampling, Sizing};

use super::video::{parse_rule, require_ffmpeg};

settings! {
    /// The Qwen2-VL family's vision spec (`QwenVL.settings()` with `family` "qwen").
    pub(super) struct QwenVision ("QwenVL vision spec") {
        /// The tag: "qwen" (matched by `VisionSettings`, kept as a key it takes).
        #[allow(dead_code)]
        family: String,
        patch_size: u32,
        merge_size: u32,
        temporal_patch_size: u32,
        min_pixels: u64,
        max_pixels: u64,
        /// The (start, end, pad) tokens' names.
        vision_tokens: [String; 3],
        /// How documents' videos are read (None: a document with a video is refused).
        video: Option<QwenVideoSettings> = None,
    }
}

settings! {
    /// Qwen2-VL's video rule (`QwenVideo.settings()`): the sampler, the pixel budgets, the
    /// `<|video_pad|>` token and the duration cap.
    pub(super) struct QwenVideoSettings ("QwenVideo video rule") {
        rule: String,
        fps: f64,
        min_frames: u32,
        max_frames: u32,
        min_pixels: Option<f64> = None,
        max_pixels: Option<f64> = None,
        total_pixels: Option<f64> = None,
        max_seconds: f64,
        video_token: String,
        tokens_per_second: Option<f64> = None,
    }
}

impl QwenVideoSettings {
    /// The core's rule for `qwen`'s patch geometry, `<|video_pad|>` being `video_pad`.
    fn spec(&self, q: &QwenVision, video_pad: u32) -> PyResult<QwenVideoSpec> {
        Ok(QwenVideoSpec {
            sampling: Sampling {
                rule: parse_rule(&self.rule)?,
                count: Count::Fps {
                    fps: self.fps,
                    min_frames: self.min_frames,
                    max_frames: self.max_frames,
                },
                temporal_patch_size: q.temporal_patch_size,
                start: None,
                end: None,
            },
            sizing: Sizing {
                patch_size: q.patch_size,
                merge_size: q.merge_size,
                temporal_patch_size: q.temporal_patch_size,
                min_pixels: self.min_pixels,
                max_pixels: self.max_pixels,
                total_pixels: self.total_pixels,
            },
            video_pad,
            max_seconds: self.max_seconds,
            tokens_per_second: self.tokens_per_second,
        })
    }
}

settings! {
    /// SigLIP 2's NaFlex vision spec (`NaFlexVL.settings()`, `family` "naflex").
    pub(super) struct NaFlexVision ("NaFlexVL vision spec") {
        /// The tag: "naflex" (matched by `VisionSettings`, kept as a key it takes).
        #[allow(dead_code)]
        family: String,
        patch_size: u32,
        max_num_patches: u32,
        /// The (start, end, pad) tokens' names.
        vision_tokens: [String; 3],
    }
}

/// The interleaved kind's vision spec: a dict tagged by `family`, "qwen" or "naflex" (the
/// Python specs' `core_config()["vision"]`).
pub(super) enum VisionSettings {
    /// `QwenVL`.
    Qwen(QwenVision),
    /// `NaFlexVL`.
    NaFlex(NaFlexVision),
}

impl<'a, 'py> FromPyObject<'a, 'py> for VisionSettings {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let (family, dict) = tagged(obj, "family", "interleaved vision spec")?;
        match family.as_str() {
            "qwen" => Ok(Self::Qwen(QwenVision::from_config(&dict)?)),
            "naflex" => Ok(Self::NaFlex(NaFlexVision::from_config(&dict)?)),
            other => Err(PyValueError::new_err(format!(
                "vision family must be 'qwen' or 'naflex', not {other:?}"
            ))),
        }
    }
}

impl VisionSettings {
    /// The core's spec, the tokens looked up in `encoder`'s vocabulary.
    fn spec(&self, encoder: &DocumentEncoder, tokenizer: &str) -> PyResult<VisionSpec> {
        let names = match self {
            Self::Qwen(q) => &q.vision_tokens,
            Self::NaFlex(n) => &n.vision_tokens,
        };
        let id = |name: &str| {
            encoder.token_id(name).ok_or_else(|| {
                PyValueError::new_err(format!("the tokenizer {tokenizer} has no token {name:?}"))
            })
        };
        let (start, end, pad) = (id(&names[0])?, id(&names[1])?, id(&names[2])?);
        let video = match self {
            Self::Qwen(QwenVision { video: Some(v), .. }) => {
                require_ffmpeg()?;
                let Self::Qwen(q) = self else { unreachable!() };
                Some(v.spec(q, id(&v.video_token)?)?)
            }
            _ => None,
        };
        Ok(match self {
            Self::Qwen(q) => VisionSpec::Qwen(QwenVlSpec {
                patch_size: q.patch_size,
                merge_size: q.merge_size,
                temporal_patch_size: q.temporal_patch_size,
                min_pixels: q.min_pixels,
                max_pixels: q.max_pixels,
                vision_start: start,
                vision_end: end,
                image_pad: pad,
                video,
            }),
            Self::NaFlex(n) => VisionSpec::NaFlex(NaFlexVlSpec {
                patch_size: n.patch_size,
                max_num_patches: n.max_num_patches,
                image_start: start,
                image_end: end,
                image_pad: pad,
            }),
        })
    }
}

settings! {
    /// The captions layout (`Captions.settings()`): image-text samples as one-image documents.
    pub(super) struct CaptionsLayout ("interleaved captions layout") {
        /// The tag: "captions" (matched by `LayoutSettings`, kept as a key it takes).
        #[allow(dead_code)]
        kind: String,
        image_keys: Vec<String>,
        caption_key: String,
    }
}

settings! {
    /// The conversations layout (`Conversations.settings()`): `ChatFormat`'s fields.
    pub(super) struct ConversationsLayout ("interleaved conversations layout") {
        /// The tag: "conversations" (matched by `LayoutSettings`, kept as a key it takes).
        #[allow(dead_code)]
        kind: String,
        field: String,
        placeholder: String,
        video_placeholder: String = "<video>".to_string(),
        system: Option<String> = None,
        turn_start: String,
        turn_end: String,
        turn_separator: String,
        roles: std::collections::BTreeMap<String, String>,
        assistant_only: bool,
    }
}

/// The interleaved kind's layout: a dict tagged by `kind` (None: the lists).
pub(super) enum LayoutSettings {
    /// Image-text samples.
    Captions(CaptionsLayout),
    /// Conversations.
    Conversations(ConversationsLayout),
}

impl<'a, 'py> FromPyObject<'a, 'py> for LayoutSettings {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let (kind, dict) = tagged(obj, "kind", "interleaved layout")?;
        match kind.as_str() {
            "captions" => Ok(Self::Captions(CaptionsLayout::from_config(&dict)?)),
            "conversations" => Ok(Self::Conversations(ConversationsLayout::from_config(
                &dict,
            )?)),
            other => Err(PyValueError::new_err(format!(
                "layout kind must be 'conversations' or 'captions', not {other:?}"
            ))),
        }
    }
}

/// The core's layout of `layout` (None: the lists).
fn layout(layout: Option<&LayoutSettings>) -> Layout {
    match layout {
        None => Layout::Lists,
        Some(LayoutSettings::Captions(c)) => Layout::Captions(CaptionKeys {
            image_keys: c.image_keys.clone(),
            caption_key: c.caption_key.clone(),
        }),
        Some(LayoutSettings::Conversations(c)) => Layout::Conversations(ChatFormat {
            field: c.field.clone(),
            placeholder: c.placeholder.clone(),
            video_placeholder: c.video_placeholder.clone(),
            system: c.system.clone(),
            turn_start: c.turn_start.clone(),
            turn_end: c.turn_end.clone(),
            turn_separator: c.turn_separator.clone(),
            roles: c.roles.clone().into_iter().collect(),
            assistant_only: c.assistant_only,
        }),
    }
}

settings! {
    /// The interleaved kind's config (`count_interleaved`'s and `InterleavedLoader`'s): the
    /// count's keys, then the pipeline's (`threads`, `pad_id`).
    pub(super) struct InterleavedSettings ("interleaved") {
        /// Path of a `tokenizer.json`.
        tokenizer: String,
        eos_token: Option<String> = None,
        vision: VisionSettings,
        texts: String,
        images: String,
        max_images_per_document: u32,
        max_document_bytes: u64,
        seq_len: usize,
        batch_size: usize,
        max_patches_per_batch: u64,
        max_pixels: u64,
        /// None: the lists.
        layout: Option<LayoutSettings> = None,
        threads: usize = 1,
        /// None: the EOS id.
        pad_id: Option<u32> = None,
    }
    groups {
        source: SourceSettings,
    }
}

/// The settings, encoder and spec of `config`.
fn interleaved_spec(
    config: &Bound<'_, PyDict>,
) -> PyResult<(InterleavedSettings, Arc<DocumentEncoder>, InterleavedSpec)> {
    let s = InterleavedSettings::from_config(config)?;
    let bad = |e: String| PyValueError::new_err(e);
    let encoder = DocumentEncoder::shared(&s.tokenizer, s.eos_token.as_deref(), None)
        .map_err(|e| bad(e.to_string()))?;
    let spec = InterleavedSpec {
        documents: DocumentSpec {
            texts: s.texts.clone(),
            images: s.images.clone(),
            max_images: s.max_images_per_document,
            max_document_bytes: s.max_document_bytes,
            layout: layout(s.layout.as_ref()),
        },
        vision: s.vision.spec(&encoder, &s.tokenizer)?,
        shape: PackShape {
            seq_len: s.seq_len,
            rows: s.batch_size,
            max_patches: s.max_patches_per_batch,
        },
        max_pixels: s.max_pixels,
    };
    spec.validate(&encoder).map_err(bad)?;
    Ok((s, encoder, spec))
}

/// The ids a loader's batches are read with under `config`.
type TokenIds = (String, u32, (u32, u32, u32), Option<u32>);

/// (the tokenizer's fingerprint, eos id, (vision start, end, pad) ids, the video pad id or
/// None) under `config`.
#[pyfunction]
pub fn interleaved_tokens(config: &Bound<'_, PyDict>) -> PyResult<TokenIds> {
    let (_, e, s) = interleaved_spec(config)?;
    let video_pad = match &s.vision {
        VisionSpec::Qwen(q) => q.video.as_ref().map(|v| v.video_pad),
        VisionSpec::NaFlex(_) => None,
    };
    Ok((
        e.fingerprint.clone(),
        e.eos,
        s.vision.token_ids(),
        video_pad,
    ))
}

/// Counts the batches of every unit of `urls` (Parquet files, tar shards) on `threads`
/// threads without the GIL, reading only image headers: a list of dicts (url, first_row, rows,
/// identity, documents, batches, text_tokens, image_tokens, images, video_tokens, videos, patches, slots,
/// padded_slots, skipped, examples, error), units in file order.
#[pyfunction]
#[pyo3(signature = (urls, config, threads = 1))]
pub fn count_interleaved<'py>(
    py: Python<'py>,
    urls: Vec<String>,
    config: &Bound<'py, PyDict>,
    threads: usize,
) -> PyResult<Bound<'py, PyList>> {
    let (s, encoder, spec) = interleaved_spec(config)?;
    let opts = s.source.options(py)?;
    let counted = py
        .detach(|| count_files(&urls, threads, &opts, &spec, &encoder))
        .map_err(PyValueError::new_err)?;
    count_list(
        py,
        counted,
        |c| [json!(c.skipped), json!(c.examples)],
        |d, c: &InterleavedCount| {
            d.set_item("documents", c.documents)?;
            d.set_item("batches", c.batches)?;
            d.set_item("text_tokens", c.text_tokens)?;
            d.set_item("image_tokens", c.image_tokens)?;
            d.set_item("images", c.images)?;
            d.set_item("video_tokens", c.video_tokens)?;
            d.set_item("videos", c.videos)?;
            d.set_item("patches", c.patches)?;
            d.set_item("slots", c.slots)?;
            d.set_item("padded_slots", c.padded_slots)
        },
    )
}

impl MetaToPy for InterleavedMeta {
    /// (patches, grids, cu_seqlens, max_seqlen, documents, keys, tokens, grid_is_video).
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let m = self;
        let tuple = (
            m.patches,
            m.grids,
            m.cu_seqlens,
            m.max_seqlen,
            m.documents,
            m.keys,
            m.tokens,
            m.grid_is_video,
        );
        Ok(tuple.into_pyobject(py)?.into_any().unbind())
    }
}

/// Starts the interleaved pipeline of one `reader` of the plan over `units` and their batch
/// `counts` (count order), whose shape has batch_size, seq_len and block_rows 1 (one batch a
/// position); `config`: the count's keys, `threads`, `pad_id` and the source options.
#[pyfunction]
pub fn interleaved_pipeline(
    units: Vec<UnitTuple>,
    counts: Vec<u64>,
    reader: ReaderTuple,
    config: &Bound<'_, PyDict>,
) -> PyResult<Pipeline> {
    let share = batch_share(units, counts, reader)?;
    let (s, encoder, spec) = interleaved_spec(config)?;
    let input = Arc::new(InterleavedInput {
        units: share.units,
        unit_batches: share.weights,
        pad_id: s.pad_id.unwrap_or(encoder.eos),
        encoder,
        spec,
        source: s.source.options(config.py())?,
    });
    let threads = s.threads;
    Ok(Pipeline::new(interleaved::start(
        input,
        &share.order,
        share.reader,
        &share.unread,
        threads,
    )))
}
