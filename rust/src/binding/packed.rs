//! The packed text kind: token counting, its plan, and the running pipeline of one reader.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rayon::prelude::*;

use super::convert::{json_to_py, source_options};
use super::errors::fault_to_py;
use crate::batch::packed::{
    count_unit, PackedConfig, PackedPipeline, RowsBuffer, StreamInput, TextSpec, TextUnit,
    UnitCount,
};
use crate::batch::sample::CaptionSource;
use crate::error::{Fault, Reason, SourceKind};
use crate::plan::packed::{PackPhase, PackShape, PackedPlan, UnitOrder};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{object_version, Expected, SourceOptions, SourceStats};
use crate::tokenize::DocumentEncoder;

/// (world_size, workers, batch_size, seq_len, block_rows)
pub(super) type ShapeTuple = (u32, u32, u32, u32, u32);
/// (url, first_row, rows or None, identity or None)
pub(super) type UnitTuple = (String, u64, Option<u64>, Option<String>);

pub(super) fn shape(t: ShapeTuple) -> PackShape {
    PackShape {
        world_size: t.0,
        workers: t.1,
        batch_size: t.2,
        seq_len: t.3,
        block_rows: t.4,
    }
}

pub(super) fn plan(
    total: u64,
    seed: u64,
    epoch: u64,
    phases: Vec<(ShapeTuple, u64)>,
    current: ShapeTuple,
) -> PyResult<PackedPlan> {
    let phases = phases
        .into_iter()
        .map(|(s, batches_done)| PackPhase {
            shape: shape(s),
            batches_done,
        })
        .collect();
    PackedPlan::new(total, seed, epoch, phases, shape(current))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

fn encoder(tokenizer: &str, eos: Option<&str>, bos: Option<&str>) -> PyResult<DocumentEncoder> {
    DocumentEncoder::from_file(tokenizer, eos, bos)
        .map_err(|e| PyValueError::new_err(e.to_string()))
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

/// The units of one file: its row groups (Parquet), or the whole file (a JSONL file, a tar
/// shard), with its identity.
pub(super) fn file_units(
    url: &str,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Vec<TextUnit>, Fault> {
    let unreadable = |detail: String, kind: SourceKind| Fault {
        reason: Reason::Unreadable,
        url: crate::read::source::redact_url(url),
        key: String::new(),
        detail,
        kind,
    };
    let version = object_version(url, &Expected::default(), opts, stats)
        .map_err(|e| unreadable(e.to_string(), e.kind()))?;
    let identity = match (&version.etag, version.size) {
        (Some(etag), _) => Some(format!("etag:{etag}")),
        (None, Some(size)) => Some(format!("size:{size}")),
        _ => None,
    };
    if !is_parquet_name(url) {
        return Ok(vec![TextUnit {
            url: url.to_string(),
            first_row: 0,
            rows: None,
            identity,
        }]);
    }
    let file = ParquetFile::open(
        url,
        &Expected::from_identity(identity.as_deref()),
        opts,
        stats,
    )
    .map_err(|f| unreadable(f.detail, f.kind))?;
    let mut first = 0;
    Ok(file
        .row_counts()
        .into_iter()
        .map(|rows| {
            let unit = TextUnit {
                url: url.to_string(),
                first_row: first,
                rows: Some(rows),
                identity: identity.clone(),
            };
            first += rows;
            unit
        })
        .collect())
}

fn count_dict<'py>(
    py: Python<'py>,
    unit: Option<&TextUnit>,
    url: &str,
    result: Result<UnitCount, Fault>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("url", unit.map_or(url, |u| u.url.as_str()))?;
    d.set_item("first_row", unit.map_or(0, |u| u.first_row))?;
    d.set_item("rows", unit.and_then(|u| u.rows))?;
    d.set_item("identity", unit.and_then(|u| u.identity.clone()))?;
    match result {
        Ok(c) => {
            d.set_item("documents", c.documents)?;
            d.set_item("tokens", c.tokens)?;
            d.set_item("skipped", json_to_py(py, &serde_json::json!(c.skipped))?)?;
            d.set_item("examples", json_to_py(py, &serde_json::json!(c.examples))?)?;
            d.set_item("error", py.None())?;
        }
        Err(f) => {
            d.set_item("documents", 0)?;
            d.set_item("tokens", 0)?;
            d.set_item("skipped", PyDict::new(py))?;
            d.set_item("examples", PyList::empty(py))?;
            d.set_item("error", json_to_py(py, &serde_json::json!(f))?)?;
        }
    }
    Ok(d)
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
    let enc = encoder(tokenizer, eos_token, bos_token)?;
    let spec = text_spec(text_key, max_document_bytes)?;
    let opts = source_options(config)?;
    let stats = Arc::new(SourceStats::default());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("shardstream-count-{i}"))
        .build()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    type Counted = (String, Option<TextUnit>, Result<UnitCount, Fault>);
    let counted: Vec<Counted> = py.detach(|| {
        pool.install(|| {
            urls.par_iter()
                .flat_map_iter(|url| match file_units(url, &opts, &stats) {
                    Err(f) => vec![(url.clone(), None, Err(f))],
                    Ok(units) => units
                        .into_iter()
                        .map(|u| {
                            let c = count_unit(&u, &spec, &enc, &opts, &stats);
                            (url.clone(), Some(u), c)
                        })
                        .collect(),
                })
                .collect()
        })
    });
    let out = PyList::empty(py);
    for (url, unit, result) in counted {
        out.append(count_dict(py, unit.as_ref(), &url, result)?)?;
    }
    Ok(out)
}

/// (batches per rank from the recorded position, the current phase's batches per rank, tokens
/// of the remainder) of an epoch's packed plan.
#[pyfunction]
pub fn packed_plan_counts(
    total: u64,
    seed: u64,
    epoch: u64,
    phases: Vec<(ShapeTuple, u64)>,
    current: ShapeTuple,
) -> PyResult<(u64, u64, u64)> {
    let p = plan(total, seed, epoch, phases, current)?;
    Ok((p.batches_left(), p.phase_batches(), p.remainder_tokens()))
}

/// The running packed pipeline of one reader. Python lends `[B, L]` buffers (`submit`) and
/// takes back finished batches (`next_batch`) in the same order.
#[pyclass(module = "shardstream._core")]
pub struct PackedLoader {
    pipeline: Option<PackedPipeline>,
    ids_bytes: usize,
    positions_len: usize,
}

#[pymethods]
impl PackedLoader {
    /// `units` and their token `counts` (index order); the plan `(seed, epoch, phases,
    /// current shape)`; this reader's `(rank, worker)`; `config`: text_key, tokenizer,
    /// eos_token, bos_token, max_document_bytes, threads, int32, boundaries and the source
    /// options.
    #[new]
    #[pyo3(signature = (units, counts, seed, epoch, phases, current, rank, worker, config))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        units: Vec<UnitTuple>,
        counts: Vec<u64>,
        seed: u64,
        epoch: u64,
        phases: Vec<(ShapeTuple, u64)>,
        current: ShapeTuple,
        rank: u32,
        worker: u32,
        config: &Bound<'_, PyDict>,
    ) -> PyResult<Self> {
        if units.len() != counts.len() {
            return Err(PyValueError::new_err("one token count per unit"));
        }
        let get = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
            Ok(config.get_item(key)?.filter(|v| !v.is_none()))
        };
        let text_key: String = get("text_key")?.map_or(Ok("text".into()), |v| v.extract())?;
        let tokenizer: String = get("tokenizer")?
            .ok_or_else(|| PyValueError::new_err("config needs tokenizer"))?
            .extract()?;
        let eos: Option<String> = get("eos_token")?.map(|v| v.extract()).transpose()?;
        let bos: Option<String> = get("bos_token")?.map(|v| v.extract()).transpose()?;
        let max_bytes: u64 = get("max_document_bytes")?.map_or(Ok(64 << 20), |v| v.extract())?;
        let threads: usize = get("threads")?.map_or(Ok(1), |v| v.extract())?;
        let int32: bool = get("int32")?.map_or(Ok(false), |v| v.extract())?;
        let boundaries: bool = get("boundaries")?.map_or(Ok(false), |v| v.extract())?;
        let enc = Arc::new(encoder(&tokenizer, eos.as_deref(), bos.as_deref())?);
        let total: u64 = counts.iter().sum();
        let p = plan(total, seed, epoch, phases, current)?;
        let reader = p
            .reader(rank, worker)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let order = UnitOrder::new(&counts, seed, epoch);
        let input = Arc::new(StreamInput {
            units: Arc::new(
                units
                    .into_iter()
                    .map(|(url, first_row, rows, identity)| TextUnit {
                        url,
                        first_row,
                        rows,
                        identity,
                    })
                    .collect(),
            ),
            unit_tokens: Arc::new(counts),
            spec: text_spec(&text_key, max_bytes)?,
            source: source_options(Some(config))?,
        });
        let (b, l) = (current.2 as usize, current.3 as usize);
        let cfg = PackedConfig {
            batch_size: b,
            threads,
            int32,
            boundaries,
        };
        Ok(Self {
            ids_bytes: b * l * if int32 { 4 } else { 8 },
            positions_len: if boundaries { b * l } else { 0 },
            pipeline: Some(PackedPipeline::start(input, &order, reader, enc, cfg)),
        })
    }

    /// Batches this reader yields from its position on.
    #[getter]
    fn batches_left(&self) -> u64 {
        self.pipeline.as_ref().map_or(0, |p| p.batches_left)
    }

    /// Lends a batch's ids (`ids_bytes` at `ids_ptr`) and, with boundaries, its int64 position
    /// ids, inside `owner`, which the pipeline keeps alive while it may write there.
    #[pyo3(signature = (owner, ids_ptr, ids_bytes, positions_ptr = 0, positions_len = 0))]
    fn submit(
        &self,
        owner: Py<PyAny>,
        ids_ptr: usize,
        ids_bytes: usize,
        positions_ptr: usize,
        positions_len: usize,
    ) -> PyResult<bool> {
        if ids_ptr == 0 || ids_bytes < self.ids_bytes {
            return Err(PyValueError::new_err(format!(
                "ids buffer of {ids_bytes} bytes; a batch needs {}",
                self.ids_bytes
            )));
        }
        if self.positions_len > 0 && (positions_ptr == 0 || positions_len < self.positions_len) {
            return Err(PyValueError::new_err(format!(
                "positions buffer of {positions_len} int64; a batch needs {}",
                self.positions_len
            )));
        }
        let Some(p) = &self.pipeline else {
            return Ok(false);
        };
        Ok(p.submit(RowsBuffer {
            ids: ids_ptr as *mut u8,
            ids_bytes,
            positions: (self.positions_len > 0)
                .then_some((positions_ptr as *mut i64, positions_len)),
            owner: Some(Box::new(owner)),
        }))
    }

    /// (rows, cu_seqlens, max_seqlen) of the next batch, or None at the end of the share.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<(usize, Vec<i32>, u32)>> {
        let Some(p) = &self.pipeline else {
            return Ok(None);
        };
        match py.detach(|| p.next_batch()) {
            None => Ok(None),
            Some(Err(fault)) => Err(fault_to_py(fault)),
            Some(Ok(meta)) => Ok(Some((meta.rows, meta.cu_seqlens, meta.max_seqlen))),
        }
    }

    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.pipeline {
            Some(p) => json_to_py(py, &p.stats.snapshot()),
            None => Ok(PyDict::new(py).into_any().unbind()),
        }
    }

    /// Stops every thread; afterwards no lent buffer is written any more.
    fn close(&mut self, py: Python<'_>) {
        if let Some(p) = self.pipeline.take() {
            py.detach(move || drop(p));
        }
    }
}
