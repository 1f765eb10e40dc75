//! `DatasetIndex`: an index in either layout, its subsets (`with_selections`, `shard_samples`),
//! renamed shards, an index assembled from parts or built from scan reports or img2dataset
//! stats, pickling, and its epoch plan.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::convert::source_options;
use super::errors::index_err;
use super::plan::{EpochPlanView, PlanRequest};
use crate::check::scan::ShardReport;
use crate::index::units::Units;
use crate::index::Index;
use crate::plan::{self, EpochPlan};
use crate::read::spans::{PlannedPart, PlannedShards, ShardNames};

/// What `DatasetIndex.__reduce__` returns: its constructor and arguments.
type Reduced<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A dataset index (rust/src/index/ defines both layouts), with where it was loaded from (its
/// detail files are found there) and, optionally, other URLs to open its shards by.
#[pyclass(module = "shardstream._core", frozen)]
pub struct DatasetIndex {
    pub(super) index: Arc<Index>,
    location: Option<String>,
    names: Arc<ShardNames>,
    /// The plan's input, made once: every plan of every epoch starts from it.
    plan_input: Arc<std::sync::OnceLock<plan::PlanInput>>,
    /// The plan's units (row groups of Parquet files), made once.
    units: Arc<std::sync::OnceLock<Arc<Units>>>,
}

impl DatasetIndex {
    fn wrap(index: Index, location: Option<String>) -> Self {
        Self {
            index: Arc::new(index),
            location,
            names: Arc::new(ShardNames::default()),
            plan_input: Arc::default(),
            units: Arc::default(),
        }
    }
}

#[pymethods]
impl DatasetIndex {
    /// Parses an index in either layout: a version-2 manifest (its detail files are looked up
    /// beside `location`, the folder or URL it came from) or version-1 JSON.
    #[staticmethod]
    #[pyo3(signature = (data, location = None))]
    fn from_bytes(py: Python<'_>, data: &[u8], location: Option<String>) -> PyResult<Self> {
        let index = py.detach(|| Index::from_bytes(data)).map_err(index_err)?;
        Ok(Self::wrap(index, location))
    }

    /// An in-memory index from its layout bytes (`to_layout`): how a subset pickles.
    #[staticmethod]
    fn from_layout(py: Python<'_>, manifest: &[u8], detail: &[u8]) -> PyResult<Self> {
        let index = py
            .detach(|| Index::from_layout(manifest, detail))
            .map_err(index_err)?;
        Ok(Self::wrap(index, None))
    }

    /// Parses a version-1 JSON index (plain or gzip-compressed).
    #[staticmethod]
    fn from_json(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let index = py.detach(|| Index::from_json(data)).map_err(index_err)?;
        Ok(Self::wrap(index, None))
    }

    /// The version-2 layout: (manifest bytes, detail file bytes), the offsets and keys held in
    /// memory going to a detail file the manifest names `detail_file`.
    fn to_layout(&self, py: Python<'_>, detail_file: &str) -> (Py<PyBytes>, Py<PyBytes>) {
        let (manifest, detail) = py.detach(|| self.index.to_layout(detail_file));
        (
            PyBytes::new(py, &manifest).unbind(),
            PyBytes::new(py, &detail).unbind(),
        )
    }

    /// The subset of this index keeping ordinals `selections[i]` of shard i (valid samples),
    /// its per-sample detail read into memory (from the detail files, with reader options
    /// `config`) so that the subset can be written with its own.
    #[pyo3(signature = (selections, config = None))]
    fn with_selections(
        &self,
        py: Python<'_>,
        selections: Vec<Vec<u64>>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let opts = source_options(config)?;
        let subset = py
            .detach(|| {
                crate::index::subset::with_selections(
                    &self.index,
                    self.location.as_deref(),
                    selections,
                    &opts,
                )
            })
            .map_err(PyValueError::new_err)?;
        Ok(Self {
            names: self.names.clone(),
            ..Self::wrap(subset, None)
        })
    }

    /// (ordinals the plan schedules, keys or None) of shard `shard`, from memory or its detail
    /// block (read with reader options `config`).
    #[pyo3(signature = (shard, config = None))]
    fn shard_samples(
        &self,
        py: Python<'_>,
        shard: u32,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(Vec<u64>, Option<Vec<String>>)> {
        let opts = source_options(config)?;
        py.detach(|| {
            crate::index::subset::shard_samples(&self.index, self.location.as_deref(), shard, &opts)
        })
        .map_err(PyValueError::new_err)
    }

    /// Whether the index is a subset (its shards keep only selected samples).
    #[getter]
    fn is_subset(&self) -> bool {
        self.index.shards().iter().any(|s| s.selection().is_some())
    }

    /// The same index, opening shard i at `urls[i]` and naming it `displays[i]` in messages.
    fn with_shard_names(&self, urls: Vec<String>, displays: Vec<String>) -> PyResult<Self> {
        if urls.len() != self.index.len() || displays.len() != urls.len() {
            return Err(PyValueError::new_err(format!(
                "{} URLs and {} names for an index of {} shards",
                urls.len(),
                displays.len(),
                self.index.len()
            )));
        }
        Ok(Self {
            index: self.index.clone(),
            location: self.location.clone(),
            names: Arc::new(ShardNames { urls, displays }),
            plan_input: self.plan_input.clone(),
            units: self.units.clone(),
        })
    }

    /// An index whose shard i is shard `parts[i][1]` of index `parts[i][0]` (unchanged shards
    /// of an old index, then newly scanned ones), with detail files found beside `location`.
    #[staticmethod]
    #[pyo3(signature = (parts, location = None))]
    fn assemble(
        parts: Vec<(PyRef<'_, DatasetIndex>, u32)>,
        location: Option<String>,
    ) -> PyResult<Self> {
        let refs: Vec<(&Index, u32)> = parts.iter().map(|(d, i)| (d.index.as_ref(), *i)).collect();
        Ok(Self::wrap(
            Index::assemble(&refs).map_err(index_err)?,
            location,
        ))
    }

    /// Per shard (URL, size, identity) as recorded: what an update compares with the shards now.
    fn shard_identities(&self) -> Vec<(String, Option<u64>, Option<String>)> {
        self.index
            .shards()
            .iter()
            .map(|s| {
                (
                    s.url.clone(),
                    s.size,
                    s.identity.as_deref().map(String::from),
                )
            })
            .collect()
    }

    /// Where the index was loaded from (its detail files are beside it).
    #[getter]
    fn location(&self) -> Option<String> {
        self.location.clone()
    }

    /// True when per-sample detail sits in detail files (version 2), not in memory.
    #[getter]
    fn has_detail_files(&self) -> bool {
        !self.index.detail_files().is_empty()
    }

    /// The URL shard `i` is opened at: the one `with_shard_names` gave, else the index's own.
    fn url(&self, i: usize) -> PyResult<String> {
        let named = self.names.urls.get(i).cloned();
        self.index
            .shards()
            .get(i)
            .map(|s| named.unwrap_or_else(|| s.url.clone()))
            .ok_or_else(|| {
                PyValueError::new_err(format!("no shard {i} in an index of {}", self.index.len()))
            })
    }

    /// The distinct URL schemes of the shards (`local`, `file`, `http`, `https`, `s3`).
    fn schemes(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.index.shards() {
            let scheme = match s.url.split_once("://") {
                Some((scheme, _)) => scheme.to_ascii_lowercase(),
                None => "local".to_string(),
            };
            if !out.contains(&scheme) {
                out.push(scheme);
            }
        }
        out
    }

    /// Builds an index from `scan_shard` reports (as JSON text) and the URLs users name them by.
    #[staticmethod]
    #[pyo3(signature = (reports_json, urls, with_keys = true))]
    fn from_scan_reports(reports_json: &str, urls: Vec<String>, with_keys: bool) -> PyResult<Self> {
        let reports: Vec<ShardReport> = serde_json::from_str(reports_json)
            .map_err(|e| PyValueError::new_err(format!("scan reports: {e}")))?;
        if reports.len() != urls.len() {
            return Err(PyValueError::new_err("one URL per scan report is needed"));
        }
        let entries = reports
            .iter()
            .zip(&urls)
            .map(|(r, u)| r.to_index_entry(u, with_keys))
            .collect();
        Ok(Self::wrap(Index::new(entries).map_err(index_err)?, None))
    }

    /// An index from img2dataset's per-shard stats files: (shard URL, `NNNNN_stats.json` bytes).
    /// Sample counts only: epochs are exact, readers read each shard from its start.
    #[staticmethod]
    fn from_img2dataset_stats(entries: Vec<(String, Vec<u8>)>) -> PyResult<Self> {
        let index =
            Index::from_img2dataset_stats(entries.iter().map(|(u, b)| (u.as_str(), b.as_slice())))
                .map_err(index_err)?;
        Ok(Self::wrap(index, None))
    }

    /// Where img2dataset writes the stats of a shard (`00001.tar` -> `00001_stats.json`).
    #[staticmethod]
    fn img2dataset_stats_url(shard_url: &str) -> Option<String> {
        crate::index::img2dataset_stats_url(shard_url)
    }

    fn to_json(&self, py: Python<'_>) -> Py<PyBytes> {
        PyBytes::new(py, &self.index.to_json()).unbind()
    }

    /// Pickles as its bytes (a manifest when its detail is in detail files, else version-1
    /// JSON) and location, so that DataLoader workers started by spawn receive it. Shard
    /// renames do not travel: the planner pickles its own.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let me = slf.get();
        let py = slf.py();
        if me.index.detail_files().is_empty() && me.is_subset() {
            // Version-1 JSON has no place for a selection: the layout, detail inline.
            let (manifest, detail) = me.index.to_layout("inline");
            let from_layout = slf.get_type().getattr("from_layout")?;
            let args = (PyBytes::new(py, &manifest), PyBytes::new(py, &detail));
            return Ok((from_layout, args.into_pyobject(py)?.into_any()));
        }
        let bytes = if me.index.detail_files().is_empty() {
            me.index.to_json()
        } else {
            crate::index::manifest::encode(&me.index)
        };
        let from_bytes = slf.get_type().getattr("from_bytes")?;
        let args = (PyBytes::new(py, &bytes), me.location.clone());
        Ok((from_bytes, args.into_pyobject(py)?.into_any()))
    }

    #[getter]
    fn urls(&self) -> Vec<String> {
        self.index.shards().iter().map(|s| s.url.clone()).collect()
    }

    #[getter]
    fn num_samples(&self) -> u64 {
        self.index.num_samples()
    }

    #[getter]
    fn num_valid(&self) -> u64 {
        self.index.num_valid()
    }

    #[getter]
    fn fingerprint(&self) -> u64 {
        self.index.fingerprint()
    }

    fn __len__(&self) -> usize {
        self.index.len()
    }

    /// The epoch plan `request` asks for (see `PlanRequest`).
    fn plan(&self, py: Python<'_>, request: &PlanRequest) -> PyResult<EpochPlanView> {
        let input = self.plan_input();
        let shards = Arc::new(PlannedShards::new(vec![self.part()]));
        request.plan_view(py, shards, |state| match state {
            None => EpochPlan::new(input, request.seed, request.epoch, request.config),
            Some(st) => EpochPlan::resume(input, &st, request.config),
        })
    }
}

impl DatasetIndex {
    fn plan_input(&self) -> &plan::PlanInput {
        self.plan_input.get_or_init(|| self.index.plan_input())
    }

    pub(super) fn part(&self) -> PlannedPart {
        PlannedPart {
            index: self.index.clone(),
            location: self.location.clone(),
            names: self.names.clone(),
            units: self
                .units
                .get_or_init(|| Arc::new(self.index.units()))
                .clone(),
        }
    }
}
