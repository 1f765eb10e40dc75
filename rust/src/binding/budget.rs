//! The NaFlex kind's token-budget batches: the count pass, and the running pipeline of one
//! reader (planned as the packed kind's, a batch a position).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rayon::prelude::*;

use super::convert::{json_to_py, naflex_spec, present, sample_spec, source_options};
use super::errors::fault_to_py;
use super::packed::{file_units, plan, ShapeTuple, UnitTuple};
use crate::batch::budget::{
    count_unit, BudgetBuffer, BudgetCount, BudgetInput, BudgetPipeline, BudgetSpec,
};
use crate::batch::packed::TextUnit;
use crate::error::Fault;
use crate::plan::budget::BudgetShape;
use crate::plan::packed::UnitOrder;
use crate::read::source::SourceStats;

/// The spec of `config`: its sample keys, `naflex` tuple, `max_patches_per_batch`, `buckets`
/// (ascending patch bounds), `max_images_per_batch` (0: no cap) and `max_member_bytes`.
fn budget_spec(config: &Bound<'_, PyDict>) -> PyResult<BudgetSpec> {
    let naflex = naflex_spec(
        &present(config, "naflex")?.ok_or_else(|| PyValueError::new_err("config needs naflex"))?,
    )?;
    let max_patches_per_batch: u32 = present(config, "max_patches_per_batch")?
        .ok_or_else(|| PyValueError::new_err("config needs max_patches_per_batch"))?
        .extract()?;
    let buckets: Vec<u32> = present(config, "buckets")?
        .ok_or_else(|| PyValueError::new_err("config needs buckets"))?
        .extract()?;
    let max_images_per_batch: u32 =
        present(config, "max_images_per_batch")?.map_or(Ok(0), |v| v.extract())?;
    let shape = BudgetShape {
        max_patches_per_batch,
        buckets,
        max_images_per_batch,
    };
    shape.validate().map_err(PyValueError::new_err)?;
    if shape.buckets.last() != Some(&naflex.max_num_patches) {
        return Err(PyValueError::new_err(format!(
            "the last length bucket must be max_num_patches={}, not {:?}",
            naflex.max_num_patches,
            shape.buckets.last()
        )));
    }
    Ok(BudgetSpec {
        sample: sample_spec(config)?,
        naflex,
        shape,
        max_member_bytes: present(config, "max_member_bytes")?
            .map_or(Ok(crate::defaults::MAX_MEMBER_BYTES), |v| v.extract())?,
    })
}

fn count_dict<'py>(
    py: Python<'py>,
    unit: Option<&TextUnit>,
    url: &str,
    result: Result<BudgetCount, Fault>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("url", unit.map_or(url, |u| u.url.as_str()))?;
    d.set_item("first_row", unit.map_or(0, |u| u.first_row))?;
    d.set_item("rows", unit.and_then(|u| u.rows))?;
    d.set_item("identity", unit.and_then(|u| u.identity.clone()))?;
    let c = result.as_ref().cloned().unwrap_or_default();
    d.set_item("samples", c.samples)?;
    d.set_item("batches", c.batches)?;
    d.set_item("patches", c.patches)?;
    d.set_item("slots", c.slots)?;
    d.set_item("fixed_slots", c.fixed_slots)?;
    d.set_item("skipped", json_to_py(py, &serde_json::json!(c.skipped))?)?;
    d.set_item("examples", json_to_py(py, &serde_json::json!(c.examples))?)?;
    match result {
        Ok(_) => d.set_item("error", py.None())?,
        Err(f) => d.set_item("error", json_to_py(py, &serde_json::json!(f))?)?,
    }
    Ok(d)
}

/// Counts the token-budget batches of every unit of `urls` (tar shards, Parquet row groups) on
/// `threads` threads without the GIL, reading only image headers: a list of dicts (url,
/// first_row, rows, identity, samples, batches, patches, slots, fixed_slots, skipped,
/// examples, error), units in file order.
#[pyfunction]
#[pyo3(signature = (urls, config, threads = 1))]
pub fn count_patches<'py>(
    py: Python<'py>,
    urls: Vec<String>,
    config: &Bound<'py, PyDict>,
    threads: usize,
) -> PyResult<Bound<'py, PyList>> {
    let spec = budget_spec(config)?;
    let opts = source_options(Some(config))?;
    let stats = Arc::new(SourceStats::default());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("shardstream-count-{i}"))
        .build()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    type Counted = (String, Option<TextUnit>, Result<BudgetCount, Fault>);
    let counted: Vec<Counted> = py.detach(|| {
        pool.install(|| {
            urls.par_iter()
                .flat_map_iter(|url| match file_units(url, &opts, &stats) {
                    Err(f) => vec![(url.clone(), None, Err(f))],
                    Ok(units) => units
                        .into_iter()
                        .map(|u| {
                            let c = count_unit(&u, &spec, &opts, &stats);
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

/// (images, length, grids, texts, keys, urls) of one batch.
type BatchTuple = (
    usize,
    u32,
    Vec<(u32, u32)>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
);

/// The running token-budget pipeline of one reader. Python lends buffers of
/// `max_patches_per_batch * 3 p p` bytes (`submit`) and takes back finished batches
/// (`next_batch`) in the same order.
#[pyclass(module = "shardstream._core")]
pub struct BudgetLoader {
    pipeline: Option<BudgetPipeline>,
    batch_bytes: usize,
    /// int64 elements of a batch's token buffer (0 without a tokenizer).
    token_len: usize,
}

#[pymethods]
impl BudgetLoader {
    /// `units` and their batch `counts` (count order); the plan `(seed, epoch, phases, current
    /// shape)` with batch_size, seq_len and block_rows 1; this reader's `(rank, worker)`;
    /// `config`: the count's keys, `threads`, `crop_seed` and the source options.
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
            return Err(PyValueError::new_err("one batch count per unit"));
        }
        if (current.2, current.3, current.4) != (1, 1, 1) {
            return Err(PyValueError::new_err(
                "a budget plan has one batch per position: batch_size, seq_len and block_rows 1",
            ));
        }
        let spec = budget_spec(config)?;
        let threads: usize = present(config, "threads")?.map_or(Ok(1), |v| v.extract())?;
        let crop_seed: u64 = present(config, "crop_seed")?.map_or(Ok(0), |v| v.extract())?;
        let tokenizer = match present(config, "tokenizer")? {
            Some(v) => {
                let (kind, path, ctx): (String, String, usize) = v.extract()?;
                Some(
                    crate::tokenize::shared(&kind, &path, ctx)
                        .map_err(|e| PyValueError::new_err(e.to_string()))?,
                )
            }
            None => None,
        };
        let total: u64 = counts.iter().sum();
        let p = plan(total, seed, epoch, phases, current)?;
        let reader = p
            .reader(rank, worker)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let order = UnitOrder::new(&counts, seed, epoch);
        let batch_bytes = spec.shape.max_patches_per_batch as usize * spec.naflex.patch_len();
        let input = Arc::new(BudgetInput {
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
            unit_batches: Arc::new(counts),
            spec,
            source: source_options(Some(config))?,
            crop_seed,
            tokenizer,
        });
        let token_len = input
            .tokenizer
            .as_ref()
            .map_or(0, |t| input.max_images() * t.context_length.max(1));
        Ok(Self {
            pipeline: Some(BudgetPipeline::start(input, &order, reader, threads)),
            batch_bytes,
            token_len,
        })
    }

    /// Batches this reader yields from its position on.
    #[getter]
    fn batches_left(&self) -> u64 {
        self.pipeline.as_ref().map_or(0, |p| p.batches_left)
    }

    /// Bytes a lent buffer must hold.
    #[getter]
    fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// int64 elements a lent token buffer must hold (0 without a tokenizer).
    #[getter]
    fn token_len(&self) -> usize {
        self.token_len
    }

    /// Lends a buffer of `nbytes` at `ptr` (and, with a tokenizer, `tokens_len` int64 at
    /// `tokens_ptr`), inside `owner`, which the pipeline keeps alive while it may write there.
    #[pyo3(signature = (owner, ptr, nbytes, tokens_ptr = 0, tokens_len = 0))]
    fn submit(
        &self,
        owner: Py<PyAny>,
        ptr: usize,
        nbytes: usize,
        tokens_ptr: usize,
        tokens_len: usize,
    ) -> PyResult<bool> {
        if ptr == 0 || nbytes < self.batch_bytes {
            return Err(PyValueError::new_err(format!(
                "buffer of {nbytes} bytes; a batch needs {}",
                self.batch_bytes
            )));
        }
        if self.token_len > 0 && (tokens_ptr == 0 || tokens_len < self.token_len) {
            return Err(PyValueError::new_err(format!(
                "token buffer of {tokens_len} int64; a batch needs {}",
                self.token_len
            )));
        }
        let Some(p) = &self.pipeline else {
            return Ok(false);
        };
        Ok(p.submit(BudgetBuffer {
            ptr: ptr as *mut u8,
            bytes: nbytes,
            tokens: (self.token_len > 0).then_some((tokens_ptr as *mut i64, tokens_len)),
            owner: Some(Box::new(owner)),
        }))
    }

    /// The next batch, or None at the end of the share.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<BatchTuple>> {
        let Some(p) = &self.pipeline else {
            return Ok(None);
        };
        match py.detach(|| p.next_batch()) {
            None => Ok(None),
            Some(Err(fault)) => Err(fault_to_py(fault)),
            Some(Ok(m)) => Ok(Some((m.images, m.length, m.grids, m.texts, m.keys, m.urls))),
        }
    }

    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.pipeline {
            Some(p) => json_to_py(py, &p.stats.to_json()),
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
