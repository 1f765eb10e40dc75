//! The NaFlex kind's token-budget batches: the count pass, and the running pipeline of one
//! reader (planned as the packed kind's, a batch a position).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{
    json_to_py, naflex_spec, present, refuse_unknown, sample_spec, source_options, SAMPLE_KEYS,
    SOURCE_KEYS,
};
use super::pipeline::{MetaToPy, Pipeline};
use super::units::{count_list, share, ReaderTuple, UnitTuple};
use crate::batch::naflex::{
    self as naflex, count_unit, BudgetBatchMeta, BudgetCount, BudgetInput, BudgetSpec,
};
use crate::batch::units::count_files;
use crate::plan::budget::BudgetShape;
use crate::tokenize::shared;

/// The spec of `config`: its sample keys, `naflex` tuple, `max_patches_per_batch`, `buckets`
/// (ascending patch bounds), `max_images_per_batch` (0: no cap) and `max_member_bytes`.
/// The keys of the budget kind's config besides the sample's and the source's: the count's,
/// then the pipeline's.
const BUDGET_KEYS: &[&str] = &[
    "naflex",
    "max_patches_per_batch",
    "buckets",
    "max_images_per_batch",
    "max_member_bytes",
    "threads",
    "crop_seed",
    "tokenizer",
];

fn budget_spec(config: &Bound<'_, PyDict>) -> PyResult<BudgetSpec> {
    refuse_unknown(
        config,
        "token-budget NaFlex",
        &[BUDGET_KEYS, SAMPLE_KEYS, SOURCE_KEYS],
    )?;
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
    let counted = py
        .detach(|| count_files(&urls, threads, &opts, |u, s| count_unit(u, &spec, &opts, s)))
        .map_err(PyValueError::new_err)?;
    count_list(py, counted, |d, c: &BudgetCount| {
        d.set_item("samples", c.samples)?;
        d.set_item("batches", c.batches)?;
        d.set_item("patches", c.patches)?;
        d.set_item("slots", c.slots)?;
        d.set_item("fixed_slots", c.fixed_slots)?;
        d.set_item("skipped", json_to_py(py, &serde_json::json!(c.skipped))?)?;
        d.set_item("examples", json_to_py(py, &serde_json::json!(c.examples))?)
    })
}

impl MetaToPy for BudgetBatchMeta {
    /// (images, length, grids, texts, keys, urls).
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let m = self;
        let tuple = (m.images, m.length, m.grids, m.texts, m.keys, m.urls);
        Ok(tuple.into_pyobject(py)?.into_any().unbind())
    }
}

/// Starts the token-budget pipeline of one `reader` of the plan over `units` and their batch
/// `counts` (count order), whose shape has batch_size, seq_len and block_rows 1 (one batch a
/// position); `config`: the count's keys, `threads`, `crop_seed`, `tokenizer` and the source
/// options.
#[pyfunction]
pub fn budget_pipeline(
    units: Vec<UnitTuple>,
    counts: Vec<u64>,
    reader: ReaderTuple,
    config: &Bound<'_, PyDict>,
) -> PyResult<Pipeline> {
    let current = reader.3;
    BudgetShape::one_batch_a_position((current.2, current.3, current.4))
        .map_err(PyValueError::new_err)?;
    let share = share(units, counts, reader)?;
    let tokenizer = match present(config, "tokenizer")? {
        Some(v) => {
            let (kind, path, ctx): (String, String, usize) = v.extract()?;
            Some(shared(&kind, &path, ctx).map_err(|e| PyValueError::new_err(e.to_string()))?)
        }
        None => None,
    };
    let input = Arc::new(BudgetInput {
        units: share.units,
        unit_batches: share.weights,
        spec: budget_spec(config)?,
        source: source_options(Some(config))?,
        crop_seed: present(config, "crop_seed")?.map_or(Ok(0), |v| v.extract())?,
        tokenizer,
    });
    let threads = present(config, "threads")?.map_or(Ok(1), |v| v.extract())?;
    let pipeline = naflex::start(input, &share.order, share.reader, threads);
    Ok(Pipeline::new(pipeline))
}
