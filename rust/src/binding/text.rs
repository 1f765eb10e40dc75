//! The packed text kind: token counting, its plan, and starting the pipeline of one reader.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::json;

use super::convert::SourceSettings;
use super::pipeline::{MetaToPy, Pipeline};
use super::settings::{settings, Settings};
use super::units::{count_list, plan, share, EndTuple, ReaderTuple, ShapeTuple, UnitTuple};
use crate::batch::kit::sample::CaptionSource;
use crate::batch::text::{
    self as text, count_unit, PackedConfig, RowsMeta, StreamInput, TextSpec, UnitCount,
};
use crate::batch::units::count_files;
use crate::tokenize::DocumentEncoder;

fn encoder(
    tokenizer: &str,
    eos: Option<&str>,
    bos: Option<&str>,
) -> PyResult<Arc<DocumentEncoder>> {
    DocumentEncoder::shared(tokenizer, eos, bos).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn text_spec(text_key: &str, max_document_bytes: u64) -> PyResult<TextSpec> {
    if text_key.is_empty() {
        return Err(PyValueError::new_err(
            "text_key must name a column, member or json:field",
        ));
    }
    Ok(TextSpec {
        source: CaptionSource::parse(text_key),
        max_document_bytes,
    })
}

/// The tokenizer file's (fingerprint, eos id, bos id or None) under these settings.
#[pyfunction]
#[pyo3(signature = (tokenizer, eos_token = None, bos_token = None))]
pub fn packed_encoder(
    tokenizer: &str,
    eos_token: Option<&str>,
    bos_token: Option<&str>,
) -> PyResult<(String, u32, Option<u32>)> {
    let e = encoder(tokenizer, eos_token, bos_token)?;
    Ok((e.fingerprint.clone(), e.eos, e.bos))
}

/// Which encoder the loader runs for this tokenizer file: (true, "") the fast byte-level BPE
/// path, or (false, why not) the tokenizers library.
#[pyfunction]
#[pyo3(signature = (tokenizer, eos_token = None, bos_token = None))]
pub fn packed_fast_path(
    tokenizer: &str,
    eos_token: Option<&str>,
    bos_token: Option<&str>,
) -> PyResult<(bool, String)> {
    let e = encoder(tokenizer, eos_token, bos_token)?;
    Ok(match e.fast_path() {
        Ok(()) => (true, String::new()),
        Err(why) => (false, why.to_string()),
    })
}

/// Token ids of `texts` as the loader encodes documents (BOS, ids, EOS), for tests and tools.
#[pyfunction]
#[pyo3(signature = (tokenizer, texts, eos_token = None, bos_token = None))]
pub fn packed_encode(
    py: Python<'_>,
    tokenizer: &str,
    texts: Vec<String>,
    eos_token: Option<&str>,
    bos_token: Option<&str>,
) -> PyResult<Vec<Vec<u32>>> {
    let e = encoder(tokenizer, eos_token, bos_token)?;
    py.detach(|| {
        texts
            .iter()
            .map(|t| e.encode(t))
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(PyValueError::new_err)
}

/// Counts the tokens of every unit of `urls` (Parquet row groups, JSONL files, tar shards) on
/// `threads` threads without the GIL: a list of dicts (url, first_row, rows, identity,
/// documents, tokens, skipped, examples, error), units in file order.
#[pyfunction]
#[pyo3(signature = (urls, tokenizer, text_key, eos_token = None, bos_token = None, max_document_bytes = 64 << 20, threads = 1, config = None))]
#[allow(clippy::too_many_arguments)]
pub fn count_tokens<'py>(
    py: Python<'py>,
    urls: Vec<String>,
    tokenizer: &str,
    text_key: &str,
    eos_token: Option<&str>,
    bos_token: Option<&str>,
    max_document_bytes: u64,
    threads: usize,
    config: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let opts = match config {
        Some(c) => CountSettings::from_config(c)?.source.options(py)?,
        None => Default::default(),
    };
    let enc = encoder(tokenizer, eos_token, bos_token)?;
    let spec = text_spec(text_key, max_document_bytes)?;
    let counted = py
        .detach(|| {
            count_files(&urls, threads, &opts, |u, s| {
                count_unit(u, &spec, &enc, &opts, s)
            })
        })
        .map_err(PyValueError::new_err)?;
    count_list(
        py,
        counted,
        |c| [json!(c.skipped), json!(c.examples)],
        |d, c: &UnitCount| {
            d.set_item("documents", c.documents)?;
            d.set_item("tokens", c.tokens)
        },
    )
}

/// (batches per rank from the recorded position, the current phase's batches per rank, tokens
/// of the remainder, positions of padding) of an epoch's packed plan up to `end`.
#[pyfunction]
pub fn packed_plan_counts(
    end: EndTuple,
    seed: u64,
    epoch: u64,
    phases: Vec<(ShapeTuple, u64)>,
    current: ShapeTuple,
) -> PyResult<(u64, u64, u64, u64)> {
    let p = plan(end, seed, epoch, phases, current)?;
    Ok((
        p.batches_left(),
        p.phase_batches(),
        p.remainder_tokens(),
        p.padding_tokens(),
    ))
}

impl MetaToPy for RowsMeta {
    /// (rows, cu_seqlens, max_seqlen).
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let tuple = (self.rows, self.cu_seqlens, self.max_seqlen);
        Ok(tuple.into_pyobject(py)?.into_any().unbind())
    }
}

settings! {
    /// `count_tokens`'s `config`: the source's settings only (the rest are arguments).
    pub(super) struct CountSettings ("token count") {}
    groups {
        source: SourceSettings,
    }
}

settings! {
    /// The packed text kind's config (`TextLoader`'s).
    pub(super) struct PackedSettings ("packed text") {
        text_key: String = "text".into(),
        /// Path of a `tokenizer.json`.
        tokenizer: String,
        eos_token: Option<String> = None,
        bos_token: Option<String> = None,
        max_document_bytes: u64 = 64 << 20,
        threads: usize = 1,
        int32: bool = false,
        boundaries: bool = false,
    }
    groups {
        source: SourceSettings,
    }
}

/// Starts the packed pipeline of one `reader` of the plan over `units` and their token
/// `counts` (count order); `config`: text_key, tokenizer, eos_token, bos_token,
/// max_document_bytes, threads, int32, boundaries and the source options.
#[pyfunction]
pub fn packed_pipeline(
    units: Vec<UnitTuple>,
    counts: Vec<u64>,
    reader: ReaderTuple,
    config: &Bound<'_, PyDict>,
) -> PyResult<Pipeline> {
    let s = PackedSettings::from_config(config)?;
    let batch_size = reader.3 .2 as usize;
    let share = share(units, counts, reader)?;
    let cfg = PackedConfig {
        batch_size,
        threads: s.threads,
        int32: s.int32,
        boundaries: s.boundaries,
    };
    let input = Arc::new(StreamInput {
        units: share.units,
        unit_tokens: share.weights,
        spec: text_spec(&s.text_key, s.max_document_bytes)?,
        source: s.source.options(config.py())?,
    });
    let enc = encoder(&s.tokenizer, s.eos_token.as_deref(), s.bos_token.as_deref())?;
    let pipeline = text::start(input, &share.order, share.reader, enc, cfg);
    Ok(Pipeline::new(pipeline))
}
