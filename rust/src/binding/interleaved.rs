//! The interleaved image-text kind: its count pass, and the running pipeline of one reader
//! (planned as the token-budget kind's, a batch a position).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{json_to_py, present, refuse_unknown, source_options, SOURCE_KEYS};
use super::pipeline::{MetaToPy, Pipeline};
use super::units::{count_list, share, ReaderTuple, UnitTuple};
use crate::batch::interleaved::{
    self, count_files, CaptionKeys, ChatFormat, DocumentSpec, InterleavedCount, InterleavedInput,
    InterleavedMeta, InterleavedSpec, Layout, NaFlexVlSpec, PackShape, QwenVlSpec, VisionSpec,
};
use crate::plan::budget::BudgetShape;
use crate::tokenize::DocumentEncoder;

fn need<'py, T: FromPyObjectOwned<'py>>(config: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    present(config, key)?
        .ok_or_else(|| PyValueError::new_err(format!("config needs {key}")))?
        .extract()
        .map_err(Into::into)
}

/// The vision spec of `config`: `vision_kind` "naflex" (`vision`: patch_size,
/// max_num_patches) or else Qwen2-VL (`vision`: patch_size, merge_size, temporal_patch_size,
/// min_pixels, max_pixels); `vision_tokens`: the start, end and pad tokens, looked up in
/// `encoder`'s vocabulary.
fn vision_spec(
    config: &Bound<'_, PyDict>,
    encoder: &DocumentEncoder,
    tokenizer: &str,
) -> PyResult<VisionSpec> {
    let names: (String, String, String) = need(config, "vision_tokens")?;
    let id = |name: &str| {
        encoder.token_id(name).ok_or_else(|| {
            PyValueError::new_err(format!("the tokenizer {tokenizer} has no token {name:?}"))
        })
    };
    let (start, end, pad) = (id(&names.0)?, id(&names.1)?, id(&names.2)?);
    let kind: Option<String> = present(config, "vision_kind")?
        .map(|v| v.extract())
        .transpose()?;
    if kind.as_deref() == Some("naflex") {
        let (patch_size, max_num_patches) = need(config, "vision")?;
        return Ok(VisionSpec::NaFlex(NaFlexVlSpec {
            patch_size,
            max_num_patches,
            image_start: start,
            image_end: end,
            image_pad: pad,
        }));
    }
    let (patch_size, merge_size, temporal_patch_size, min_pixels, max_pixels) =
        need(config, "vision")?;
    Ok(VisionSpec::Qwen(QwenVlSpec {
        patch_size,
        merge_size,
        temporal_patch_size,
        min_pixels,
        max_pixels,
        vision_start: start,
        vision_end: end,
        image_pad: pad,
    }))
}

/// The layout of `config["layout"]`: None (lists), or a dict with `kind` "conversations" (and
/// `ChatFormat`'s fields, `roles` a dict) or "captions" (`image_keys`, `caption_key`).
fn layout(config: &Bound<'_, PyDict>) -> PyResult<Layout> {
    let Some(c) = present(config, "layout")? else {
        return Ok(Layout::Lists);
    };
    let c = c.cast::<PyDict>()?;
    let kind: String = need(c, "kind")?;
    let keys: &[&str] = match kind.as_str() {
        "captions" => &["kind", "image_keys", "caption_key"],
        "conversations" => &[
            "kind",
            "field",
            "placeholder",
            "system",
            "turn_start",
            "turn_end",
            "turn_separator",
            "roles",
            "assistant_only",
        ],
        other => {
            return Err(PyValueError::new_err(format!(
                "layout kind must be 'conversations' or 'captions', not {other:?}"
            )))
        }
    };
    refuse_unknown(c, &format!("interleaved {kind} layout"), &[keys])?;
    if kind == "captions" {
        return Ok(Layout::Captions(CaptionKeys {
            image_keys: need(c, "image_keys")?,
            caption_key: need(c, "caption_key")?,
        }));
    }
    let roles: std::collections::BTreeMap<String, String> = need(c, "roles")?;
    Ok(Layout::Conversations(ChatFormat {
        field: need(c, "field")?,
        placeholder: need(c, "placeholder")?,
        system: present(c, "system")?.map(|v| v.extract()).transpose()?,
        turn_start: need(c, "turn_start")?,
        turn_end: need(c, "turn_end")?,
        turn_separator: need(c, "turn_separator")?,
        roles: roles.into_iter().collect(),
        assistant_only: need(c, "assistant_only")?,
    }))
}

/// The encoder and spec of `config`: `tokenizer`, `eos_token`, `vision` (patch_size,
/// merge_size, temporal_patch_size, min_pixels, max_pixels), `vision_tokens` (start, end, pad
/// names), `texts`, `images`, `max_images_per_document`, `max_document_bytes`, `seq_len`,
/// `batch_size`, `max_patches_per_batch`, `max_pixels`, `layout` (None or a dict).
/// The keys of the interleaved kind's config besides the source's: the count's, then the
/// pipeline's.
const INTERLEAVED_KEYS: &[&str] = &[
    "tokenizer",
    "eos_token",
    "vision_kind",
    "vision",
    "vision_tokens",
    "texts",
    "images",
    "max_images_per_document",
    "max_document_bytes",
    "seq_len",
    "batch_size",
    "max_patches_per_batch",
    "max_pixels",
    "layout",
    "threads",
    "pad_id",
];

fn interleaved_spec(
    config: &Bound<'_, PyDict>,
) -> PyResult<(Arc<DocumentEncoder>, InterleavedSpec)> {
    refuse_unknown(config, "interleaved", &[INTERLEAVED_KEYS, SOURCE_KEYS])?;
    let bad = |e: String| PyValueError::new_err(e);
    let tokenizer: String = need(config, "tokenizer")?;
    let eos: Option<String> = present(config, "eos_token")?
        .map(|v| v.extract())
        .transpose()?;
    let encoder = DocumentEncoder::shared(&tokenizer, eos.as_deref(), None)
        .map_err(|e| bad(e.to_string()))?;
    let vision = vision_spec(config, &encoder, &tokenizer)?;
    let spec = InterleavedSpec {
        documents: DocumentSpec {
            texts: need(config, "texts")?,
            images: need(config, "images")?,
            max_images: need(config, "max_images_per_document")?,
            max_document_bytes: need(config, "max_document_bytes")?,
            layout: layout(config)?,
        },
        vision,
        shape: PackShape {
            seq_len: need(config, "seq_len")?,
            rows: need(config, "batch_size")?,
            max_patches: need(config, "max_patches_per_batch")?,
        },
        max_pixels: need(config, "max_pixels")?,
    };
    spec.validate(&encoder).map_err(bad)?;
    Ok((encoder, spec))
}

/// (the tokenizer's fingerprint, eos id, (vision start, end, pad) ids) under `config`.
#[pyfunction]
pub fn interleaved_tokens(config: &Bound<'_, PyDict>) -> PyResult<(String, u32, (u32, u32, u32))> {
    let (e, s) = interleaved_spec(config)?;
    Ok((e.fingerprint.clone(), e.eos, s.vision.token_ids()))
}

/// Counts the batches of every unit of `urls` (Parquet files, tar shards) on `threads`
/// threads without the GIL, reading only image headers: a list of dicts (url, first_row, rows,
/// identity, documents, batches, text_tokens, image_tokens, images, patches, slots,
/// padded_slots, skipped, examples, error), units in file order.
#[pyfunction]
#[pyo3(signature = (urls, config, threads = 1))]
pub fn count_interleaved<'py>(
    py: Python<'py>,
    urls: Vec<String>,
    config: &Bound<'py, PyDict>,
    threads: usize,
) -> PyResult<Bound<'py, PyList>> {
    let (encoder, spec) = interleaved_spec(config)?;
    let opts = source_options(Some(config))?;
    let counted = py
        .detach(|| count_files(&urls, threads, &opts, &spec, &encoder))
        .map_err(PyValueError::new_err)?;
    count_list(py, counted, |d, c: &InterleavedCount| {
        d.set_item("documents", c.documents)?;
        d.set_item("batches", c.batches)?;
        d.set_item("text_tokens", c.text_tokens)?;
        d.set_item("image_tokens", c.image_tokens)?;
        d.set_item("images", c.images)?;
        d.set_item("patches", c.patches)?;
        d.set_item("slots", c.slots)?;
        d.set_item("padded_slots", c.padded_slots)?;
        d.set_item("skipped", json_to_py(py, &serde_json::json!(c.skipped))?)?;
        d.set_item("examples", json_to_py(py, &serde_json::json!(c.examples))?)
    })
}

impl MetaToPy for InterleavedMeta {
    /// (patches, grids, cu_seqlens, max_seqlen, documents, keys, tokens).
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
    let current = reader.3;
    BudgetShape::one_batch_a_position((current.2, current.3, current.4))
        .map_err(PyValueError::new_err)?;
    let share = share(units, counts, reader)?;
    let (encoder, spec) = interleaved_spec(config)?;
    let input = Arc::new(InterleavedInput {
        units: share.units,
        unit_batches: share.weights,
        pad_id: present(config, "pad_id")?.map_or(Ok(encoder.eos), |v| v.extract())?,
        encoder,
        spec,
        source: source_options(Some(config))?,
    });
    let threads = present(config, "threads")?.map_or(Ok(1), |v| v.extract())?;
    Ok(Pipeline::new(interleaved::start(
        input,
        &share.order,
        share.reader,
        &share.unread,
        threads,
    )))
}
