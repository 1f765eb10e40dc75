//! The packed text kind: token counting, its plan, and starting the pipeline of one reader.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{json_to_py, present, refuse_unknown, source_options, SOURCE_KEYS};
use super::pipeline::{MetaToPy, Pipeline};
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
    if let Some(config) = config {
        refuse_unknown(config, "token count", &[SOURCE_KEYS])?;
    }
    let enc = encoder(tokenizer, eos_token, bos_token)?;
    let spec = text_spec(text_key, max_document_bytes)?;
    let opts = source_options(config)?;
    let counted = py
        .detach(|| {
            count_files(&urls, threads, &opts, |u, s| {
                count_unit(u, &spec, &enc, &opts, s)
            })
        })
        .map_err(PyValueError::new_err)?;
    count_list(py, counted, |d, c: &UnitCount| {
        d.set_item("documents", c.documents)?;
        d.set_item("tokens", c.tokens)?;
        d.set_item("skipped", json_to_py(py, &serde_json::json!(c.skipped))?)?;
        d.set_item("examples", json_to_py(py, &serde_json::json!(c.examples))?)
    })
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

/// The keys of the packed text kind's config besides the source's.
const PACKED_KEYS: &[&str] = &[
    "text_key",
    "tokenizer",
    "eos_token",
    "bos_token",
    "max_document_bytes",
    "threads",
    "int32",
    "boundaries",
];

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
    refuse_unknown(config, "packed text", &[PACKED_KEYS, SOURCE_KEYS])?;
    let batch_size = reader.3 .2 as usize;
    let share = share(units, counts, reader)?;
    let text_key: String =
        present(config, "text_key")?.map_or(Ok("text".into()), |v| v.extract())?;
    let tokenizer: String = present(config, "tokenizer")?
        .ok_or_else(|| PyValueError::new_err("config needs tokenizer"))?
        .extract()?;
    let eos: Option<String> = present(config, "eos_token")?
        .map(|v| v.extract())
        .transpose()?;
    let bos: Option<String> = present(config, "bos_token")?
        .map(|v| v.extract())
        .transpose()?;
    let max_bytes = present(config, "max_document_bytes")?.map_or(Ok(64 << 20), |v| v.extract())?;
    let cfg = PackedConfig {
        batch_size,
        threads: present(config, "threads")?.map_or(Ok(1), |v| v.extract())?,
        int32: present(config, "int32")?.map_or(Ok(false), |v| v.extract())?,
        boundaries: present(config, "boundaries")?.map_or(Ok(false), |v| v.extract())?,
    };
    let input = Arc::new(StreamInput {
        units: share.units,
        unit_tokens: share.weights,
        spec: text_spec(&text_key, max_bytes)?,
        source: source_options(Some(config))?,
    });
    let enc = encoder(&tokenizer, eos.as_deref(), bos.as_deref())?;
    let pipeline = text::start(input, &share.order, share.reader, enc, cfg);
    Ok(Pipeline::new(pipeline))
}
