//! The NaFlex kind's token-budget batches: the count pass, and the running pipeline of one
//! reader (planned as the packed kind's, a batch a position).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::json;

use super::convert::{
    naflex_spec, CaptionTokenizer, NaFlexSettings, SampleSettings, SourceSettings,
};
use super::pipeline::{MetaToPy, Pipeline};
use super::settings::{settings, Settings};
use super::units::{batch_share, count_list, ReaderTuple, UnitTuple};
use crate::batch::naflex::{
    self as naflex, count_unit, BudgetBatchMeta, BudgetCount, BudgetInput, BudgetSpec,
};
use crate::batch::units::count_files;
use crate::plan::budget::BudgetShape;

settings! {
    /// The token-budget NaFlex kind's config (`count_patches`' and `NaFlexBudgetLoader`'s):
    /// the count's keys, then the pipeline's (`threads`, `crop_seed`, `tokenizer`).
    pub(super) struct BudgetSettings ("token-budget NaFlex") {
        /// The NaFlex kind's spec: a dict of `NaFlexSettings`.
        naflex: NaFlexSettings,
        max_patches_per_batch: u32,
        /// Ascending patch bounds, the last `max_num_patches`.
        buckets: Vec<u32>,
        /// 0: no cap.
        max_images_per_batch: u32 = 0,
        max_member_bytes: u64 = crate::defaults::MAX_MEMBER_BYTES,
        threads: usize = 1,
        crop_seed: u64 = 0,
        /// The captions' tokenizer: a dict of `CaptionTokenizer`.
        tokenizer: Option<CaptionTokenizer> = None,
    }
    groups {
        sample: SampleSettings,
        source: SourceSettings,
    }
}

impl BudgetSettings {
    /// The core's spec of these settings, validated.
    fn spec(&self) -> PyResult<BudgetSpec> {
        let naflex = naflex_spec(&self.naflex)?;
        let shape = BudgetShape {
            max_patches_per_batch: self.max_patches_per_batch,
            buckets: self.buckets.clone(),
            max_images_per_batch: self.max_images_per_batch,
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
            sample: self.sample.spec()?,
            naflex,
            shape,
            max_member_bytes: self.max_member_bytes,
        })
    }
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
    let s = BudgetSettings::from_config(config)?;
    let spec = s.spec()?;
    let opts = s.source.options(py)?;
    let counted = py
        .detach(|| count_files(&urls, threads, &opts, |u, s| count_unit(u, &spec, &opts, s)))
        .map_err(PyValueError::new_err)?;
    count_list(
        py,
        counted,
        |c| [json!(c.skipped), json!(c.examples)],
        |d, c: &BudgetCount| {
            d.set_item("samples", c.samples)?;
            d.set_item("batches", c.batches)?;
            d.set_item("patches", c.patches)?;
            d.set_item("slots", c.slots)?;
            d.set_item("fixed_slots", c.fixed_slots)
        },
    )
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
    let s = BudgetSettings::from_config(config)?;
    let share = batch_share(units, counts, reader)?;
    let tokenizer = s
        .tokenizer
        .as_ref()
        .map(CaptionTokenizer::open)
        .transpose()?;
    let input = Arc::new(BudgetInput {
        units: share.units,
        unit_batches: share.weights,
        spec: s.spec()?,
        source: s.source.options(config.py())?,
        crop_seed: s.crop_seed,
        tokenizer,
    });
    let pipeline = naflex::start(input, &share.order, share.reader, s.threads);
    Ok(Pipeline::new(pipeline))
}
