//! `Loader`: the running pipeline of one reader. Python lends output buffers and takes back
//! finished batches; every wait releases the GIL.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{json_to_py, pipeline_config};
use super::errors::fault_to_py;
use super::plan::PlannedSpans;
use crate::batch::config::SampleKind;
use crate::batch::pipeline::{display_table, MainSpans, OutBuffer, Pipeline};
use crate::batch::span::ShardSpan;
use crate::read::source::Expected;

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

/// (samples, keys, texts, shard URLs, reserve positions used so far, the NaFlex kind's patch
/// grids (rows, columns) or None) of one batch.
type BatchTuple = (
    usize,
    Py<PyList>,
    Py<PyList>,
    Py<PyList>,
    u64,
    Option<Py<PyList>>,
);

/// The running pipeline of one reader. Python lends output buffers (`submit`) and takes back
/// finished batches (`next_batch`) in the same order.
#[pyclass(module = "shardstream._core")]
pub struct Loader {
    pipeline: Option<Pipeline>,
    display: HashMap<u32, String>,
    batch_bytes: usize,
    /// int64 elements of a batch's tokens (0 without a tokenizer).
    token_len: usize,
    /// Batches carry patch grids (the NaFlex kind).
    naflex: bool,
}

/// A loader's spans: planned ones as the plan built them, or (streaming) tuples with the
/// display names of every shard.
#[derive(FromPyObject)]
enum SpanInput<'py> {
    Planned(PyRef<'py, PlannedSpans>),
    Tuples(Vec<SpanTuple>),
}

#[pymethods]
impl Loader {
    /// `spans`: a reader's `PlannedSpans`, or (url, shard, start_offset, first_ordinal,
    /// skip_before, end_ordinal, stride) tuples named by `display_urls` (by shard number).
    #[new]
    #[pyo3(signature = (spans_list, config, display_urls = Vec::new()))]
    fn new(
        spans_list: SpanInput<'_>,
        config: &Bound<'_, PyDict>,
        display_urls: Vec<String>,
    ) -> PyResult<Self> {
        let cfg = pipeline_config(config)?;
        cfg.validate().map_err(PyValueError::new_err)?;
        let (batch_bytes, token_len) = (cfg.batch_bytes(), cfg.token_len());
        let naflex = matches!(cfg.kind, SampleKind::NaFlex(_));
        let (main, reserve) = match spans_list {
            SpanInput::Planned(p) => (p.main(), p.reserve.clone()),
            SpanInput::Tuples(t) => (MainSpans::Spans(spans(t, &display_urls)), Vec::new()),
        };
        let display = display_table(main.iter().chain(&reserve));
        let pipeline = Pipeline::start(main, reserve, cfg);
        Ok(Self {
            pipeline: Some(pipeline),
            display,
            batch_bytes,
            token_len,
            naflex,
        })
    }

    #[getter]
    fn token_len(&self) -> usize {
        self.token_len
    }

    #[getter]
    fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// Lends `nbytes` at address `ptr`, inside `owner` (the tensor or array that holds that
    /// memory; the pipeline keeps a reference to it while it may write there). The caller leaves
    /// the memory untouched until the batch filled into it is returned by `next_batch`.
    #[pyo3(signature = (owner, ptr, nbytes, tokens_ptr = 0, tokens_len = 0))]
    fn submit(
        &self,
        owner: Py<PyAny>,
        ptr: usize,
        nbytes: usize,
        tokens_ptr: usize,
        tokens_len: usize,
    ) -> PyResult<bool> {
        if self.token_len > 0 && (tokens_ptr == 0 || tokens_len < self.token_len) {
            return Err(PyValueError::new_err(format!(
                "token buffer of {tokens_len} int64; a batch needs {}",
                self.token_len
            )));
        }
        if nbytes < self.batch_bytes {
            return Err(PyValueError::new_err(format!(
                "buffer of {nbytes} bytes; a batch needs {}",
                self.batch_bytes
            )));
        }
        let Some(p) = &self.pipeline else {
            return Ok(false);
        };
        Ok(p.submit(OutBuffer {
            ptr: ptr as *mut u8,
            len: nbytes,
            owner: Some(Box::new(owner)),
            tokens: (self.token_len > 0).then_some((tokens_ptr as *mut i64, tokens_len)),
        }))
    }

    /// (n, keys, texts, shard_urls, reserve_used, grids) of the next batch, or None at the end
    /// of the epoch; `reserve_used` counts the reserve positions this reader consumed up to this
    /// batch; `grids` is the NaFlex kind's (rows, columns) per sample, None for square images.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<BatchTuple>> {
        let Some(p) = &self.pipeline else {
            return Ok(None);
        };
        match py.detach(|| p.next_batch()) {
            None => Ok(None),
            Some(Err(fault)) => Err(fault_to_py(fault)),
            Some(Ok(meta)) => {
                let urls: Vec<&str> = meta
                    .shards
                    .iter()
                    .map(|&s| self.display.get(&s).map_or("", |u| u.as_str()))
                    .collect();
                Ok(Some((
                    meta.len,
                    PyList::new(py, &meta.keys)?.unbind(),
                    PyList::new(py, &meta.texts)?.unbind(),
                    PyList::new(py, urls)?.unbind(),
                    meta.reserve_used,
                    self.naflex
                        .then(|| PyList::new(py, &meta.grids).map(Bound::unbind))
                        .transpose()?,
                )))
            }
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
