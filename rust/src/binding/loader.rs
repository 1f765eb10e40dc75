//! Starting the sample kinds' pipeline of one reader (square, NaFlex at a fixed count), and
//! their batch metadata for Python.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::pipeline_config;
use super::pipeline::{MetaToPy, Pipeline};
use super::plan::PlannedSpans;
use crate::batch::square::sample_batches::{self, BatchMeta, MainSpans};
use crate::read::source::Expected;
use crate::read::span::ShardSpan;

/// (url, shard, start_offset, first_ordinal, skip_before, end_ordinal, stride)
type SpanTuple = (String, u32, u64, u64, u64, Option<u64>, Option<(u64, u64)>);

fn spans(list: Vec<SpanTuple>, display: &[String]) -> Vec<ShardSpan> {
    list.into_iter()
        .map(
            |(url, shard, start_offset, first_ordinal, skip_before, end_ordinal, stride)| {
                ShardSpan {
                    keep: None,
                    keep_bytes: None,
                    selection: None,
                    display: display.get(shard as usize).cloned().unwrap_or_default(),
                    url,
                    shard,
                    start_offset,
                    first_ordinal,
                    skip_before,
                    end_ordinal,
                    stride,
                    detail: None,
                    expected: Expected::default(),
                }
            },
        )
        .collect()
}

impl MetaToPy for BatchMeta {
    /// (n, keys, texts, shard_urls, reserve_used, grids): `reserve_used` counts the reserve
    /// positions this reader consumed up to this batch; `grids` is the NaFlex kind's (rows,
    /// columns) per sample, None for square images.
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let grids = (!self.grids.is_empty()).then_some(self.grids);
        let tuple = (
            self.len,
            self.keys,
            self.texts,
            self.urls,
            self.reserve_used,
            grids,
        );
        Ok(tuple.into_pyobject(py)?.into_any().unbind())
    }
}

/// A loader's spans: planned ones as the plan built them, or (streaming) tuples with the
/// display names of every shard.
#[derive(FromPyObject)]
pub(super) enum SpanInput<'py> {
    Planned(PyRef<'py, PlannedSpans>),
    Tuples(Vec<SpanTuple>),
}

/// Starts the pipeline of one reader of the sample kinds (square, NaFlex at a fixed count).
/// `spans_list`: a reader's `PlannedSpans`, or (url, shard, start_offset, first_ordinal,
/// skip_before, end_ordinal, stride) tuples named by `display_urls` (by shard number).
#[pyfunction]
#[pyo3(signature = (spans_list, config, display_urls = Vec::new()))]
pub fn sample_pipeline(
    spans_list: SpanInput<'_>,
    config: &Bound<'_, PyDict>,
    display_urls: Vec<String>,
) -> PyResult<Pipeline> {
    let cfg = pipeline_config(config)?;
    cfg.validate().map_err(PyValueError::new_err)?;
    let (main, reserve) = match spans_list {
        SpanInput::Planned(p) => (p.main(), p.reserve.clone()),
        SpanInput::Tuples(t) => (MainSpans::Spans(spans(t, &display_urls)), Vec::new()),
    };
    Ok(Pipeline::new(sample_batches::start(main, reserve, cfg)))
}
