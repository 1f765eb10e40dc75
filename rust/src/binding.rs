//! The PyO3 layer: thin wrappers that convert arguments, release the GIL around Rust work, and
//! turn faults into Python exceptions. No logic lives here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::decode::Decoder;
use crate::defaults;
use crate::error::Fault;
use crate::index::Index;
use crate::pipeline::{
    display_table, MainSpans, OnError, OutBuffer, Pipeline, PipelineConfig, ShardSpan,
};
use crate::plan::{self, EpochPlan, EpochState, PhaseConfig};
use crate::resize::CropMode;
use crate::rng;
use crate::sample::{decode_standalone_image, CaptionSource, SampleSpec};
use crate::scan::ShardReport;
use crate::scan::{scan_shard as scan, ScanOptions};
use crate::shard_samples::ShardSamples;
use crate::source::{redact_url, Expected, Signer, SourceOptions};
use crate::spans::{PlannedPart, PlannedShards, ShardNames};
use crate::text::ClipTokenizer;

create_exception!(
    _core,
    CoreFault,
    PyException,
    "A shard or sample fault: args = (reason, url, key, detail)."
);

fn fault_to_py(f: Fault) -> PyErr {
    CoreFault::new_err((f.reason.as_str(), f.url, f.key, f.detail, f.kind.as_str()))
}

/// `_core.DEFAULTS`: the core's defaults (`defaults.rs`) by the names of the loader's options,
/// durations in seconds. `shardstream.config` reads them into its typed view.
fn defaults_dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    use defaults::*;
    let d = PyDict::new(py);
    d.set_item("image_size", IMAGE_SIZE)?;
    d.set_item("scan_image_size", SCAN_IMAGE_SIZE)?;
    d.set_item("caption_key", CAPTION_KEY)?;
    d.set_item("image_keys", IMAGE_KEYS.to_vec())?;
    d.set_item("max_pixels", MAX_PIXELS)?;
    d.set_item("max_member_bytes", MAX_MEMBER_BYTES)?;
    d.set_item("crop", CROP)?;
    d.set_item("random_crop_scale", RANDOM_CROP_SCALE)?;
    d.set_item("loader_on_error", LOADER_ON_ERROR)?;
    d.set_item("read_samples_on_error", READ_SAMPLES_ON_ERROR)?;
    d.set_item("shuffle_buffer", SHUFFLE_BUFFER)?;
    d.set_item("read_ahead", READ_AHEAD)?;
    d.set_item("prefetch", PREFETCH)?;
    d.set_item("connect_timeout", CONNECT_TIMEOUT.as_secs_f64())?;
    d.set_item("read_timeout", READ_TIMEOUT.as_secs_f64())?;
    d.set_item("max_retries", MAX_RETRIES)?;
    d.set_item("backoff_initial", BACKOFF_INITIAL.as_secs_f64())?;
    d.set_item("backoff_max", BACKOFF_MAX.as_secs_f64())?;
    d.set_item("cache_max_bytes", CACHE_MAX_BYTES)?;
    Ok(d)
}

fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

fn on_error(s: &str) -> PyResult<OnError> {
    match s {
        "skip" => Ok(OnError::Skip),
        "raise" => Ok(OnError::Raise),
        other => Err(PyValueError::new_err(format!(
            "on_error must be 'skip' or 'raise', not {other:?}"
        ))),
    }
}

fn crop_mode(crop: &str, scale: (f64, f64)) -> PyResult<CropMode> {
    match crop {
        "center" => Ok(CropMode::Center),
        "random" => Ok(CropMode::RandomResized {
            scale,
            ratio: defaults::RANDOM_CROP_RATIO,
        }),
        other => Err(PyValueError::new_err(format!(
            "crop must be 'center' or 'random', not {other:?}"
        ))),
    }
}

fn sample_spec(config: &Bound<'_, PyDict>) -> PyResult<SampleSpec> {
    let mut spec = SampleSpec::default();
    if let Some(v) = config.get_item("image_size")? {
        spec.image_size = v.extract()?;
    }
    if let Some(v) = config.get_item("caption_key")? {
        spec.caption = CaptionSource::parse(&v.extract::<String>()?);
    }
    if let Some(v) = config.get_item("image_keys")? {
        if !v.is_none() {
            spec.image_keys = v.extract()?;
        }
    }
    if let Some(v) = config.get_item("max_pixels")? {
        spec.max_pixels = v.extract()?;
    }
    let scale: (f64, f64) = match config.get_item("random_crop_scale")? {
        Some(v) => v.extract()?,
        None => defaults::RANDOM_CROP_SCALE,
    };
    if let Some(v) = config.get_item("crop")? {
        spec.crop = crop_mode(&v.extract::<String>()?, scale)?;
    }
    Ok(spec)
}

/// Reader options from a config dict (any of its keys may be absent); none: the defaults.
fn source_options(config: Option<&Bound<'_, PyDict>>) -> PyResult<SourceOptions> {
    let mut opts = SourceOptions::default();
    let Some(config) = config else {
        return Ok(opts);
    };
    if let Some(v) = config.get_item("connect_timeout")? {
        opts.connect_timeout = std::time::Duration::from_secs_f64(v.extract()?);
    }
    if let Some(v) = config.get_item("read_timeout")? {
        opts.read_timeout = std::time::Duration::from_secs_f64(v.extract()?);
    }
    if let Some(v) = config.get_item("max_retries")? {
        opts.max_retries = v.extract()?;
    }
    if let Some(v) = config.get_item("backoff_initial")? {
        opts.backoff_initial = std::time::Duration::from_secs_f64(v.extract()?);
    }
    if let Some(v) = config.get_item("backoff_max")? {
        opts.backoff_max = std::time::Duration::from_secs_f64(v.extract()?);
    }
    if let Some(dir) = config.get_item("cache_dir")?.filter(|v| !v.is_none()) {
        let max_bytes = match config.get_item("cache_max_bytes")?.filter(|v| !v.is_none()) {
            Some(v) => v.extract()?,
            None => defaults::CACHE_MAX_BYTES,
        };
        opts.cache = Some(crate::source::CacheOptions {
            dir: dir.extract::<std::path::PathBuf>()?,
            max_bytes,
        });
    }
    if let Some(v) = config.get_item("ca_bundle")?.filter(|v| !v.is_none()) {
        opts.ca_bundle = Some(v.extract::<std::path::PathBuf>()?);
    }
    if let Some(signer) = config.get_item("signer")?.filter(|v| !v.is_none()) {
        opts.signer = Some(python_signer(signer.unbind()));
    }
    Ok(opts)
}

/// A [`Signer`] that calls a Python callable (`url -> presigned url`) from the reader threads.
/// The callers of every reading function release the GIL while they wait, so this can take it.
/// A reader thread still running while the interpreter shuts down gets an error instead of
/// attaching to a finalising interpreter.
fn python_signer(callable: Py<PyAny>) -> Signer {
    Signer(Arc::new(move |url: &str| {
        Python::try_attach(|py| {
            callable
                .call1(py, (url,))
                .and_then(|signed| signed.extract::<String>(py))
                .map_err(|e| e.value(py).to_string())
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".into()))
    }))
}

/// Raw samples of a list of shards, grouped as webdataset groups them (`shard_samples`).
#[pyclass(module = "shardstream._core")]
pub struct SampleIter {
    inner: Mutex<ShardSamples>,
}

#[pymethods]
impl SampleIter {
    #[new]
    #[pyo3(signature = (urls, display_urls, on_error = defaults::READ_SAMPLES_ON_ERROR,
                        max_member_bytes = defaults::MAX_MEMBER_BYTES, config = None))]
    fn new(
        urls: Vec<String>,
        display_urls: Vec<String>,
        on_error: &str,
        max_member_bytes: u64,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let source = source_options(config)?;
        let inner = ShardSamples::new(
            urls,
            display_urls,
            self::on_error(on_error)?,
            max_member_bytes,
            source,
        )
        .map_err(PyValueError::new_err)?;
        Ok(Self {
            inner: Mutex::new(inner),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Samples skipped (with `on_error="skip"`) so far.
    #[getter]
    fn skipped(&self) -> u64 {
        self.inner.lock().expect("reader lock").skipped()
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let next = py.detach(|| self.inner.lock().expect("reader lock").next_sample());
        let Some((raw, shard)) = next.map_err(fault_to_py)? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("__key__", &raw.key)?;
        d.set_item("__url__", shard)?;
        for (ext, data) in &raw.members {
            d.set_item(ext, PyBytes::new(py, data))?;
        }
        Ok(Some(d.into_any().unbind()))
    }
}

/// Validates one shard (structure, grouping, and with `decode` the loader's decode path).
#[pyfunction]
#[pyo3(signature = (url, *, decode = true, caption_key = defaults::CAPTION_KEY, image_keys = None,
                    require_caption = true, max_pixels = defaults::MAX_PIXELS,
                    max_member_bytes = defaults::MAX_MEMBER_BYTES, image_size = defaults::SCAN_IMAGE_SIZE,
                    config = None, capture = None))]
#[allow(clippy::too_many_arguments)]
fn scan_shard(
    py: Python<'_>,
    url: &str,
    decode: bool,
    caption_key: &str,
    image_keys: Option<Vec<String>>,
    require_caption: bool,
    max_pixels: u64,
    max_member_bytes: u64,
    image_size: u32,
    config: Option<&Bound<'_, PyDict>>,
    capture: Option<String>,
) -> PyResult<Py<PyAny>> {
    let mut spec = SampleSpec {
        caption: CaptionSource::parse(caption_key),
        max_pixels,
        image_size,
        ..SampleSpec::default()
    };
    if let Some(keys) = image_keys {
        spec.image_keys = keys;
    }
    let opts = ScanOptions {
        decode,
        require_caption,
        max_member_bytes,
        spec,
        source: source_options(config)?,
        capture,
    };
    let report = py.detach(|| scan(url, &opts));
    let value = serde_json::to_value(&report).map_err(|e| PyValueError::new_err(e.to_string()))?;
    json_to_py(py, &value)
}

/// (format, width, height) from an image's header, without decoding pixels.
#[pyfunction]
fn probe_image(data: &[u8]) -> PyResult<(String, u32, u32)> {
    let probe = Decoder::new()
        .probe(data)
        .map_err(|e| PyValueError::new_err(format!("{}: {}", e.reason, e.detail)))?;
    let (w, h) = probe.oriented_size();
    Ok((probe.format.name().to_string(), w, h))
}

/// Decodes one image exactly as the loader does: [3, size, size] uint8 bytes. `crop` and
/// `random_crop_scale` and `crop_seed` as in the loader's config; `whole` decodes every row, as
/// validation does.
#[pyfunction]
#[pyo3(signature = (
    data, size = defaults::IMAGE_SIZE, max_pixels = defaults::MAX_PIXELS, *,
    crop = defaults::CROP, random_crop_scale = defaults::RANDOM_CROP_SCALE, crop_seed = 0,
    whole = false,
))]
#[allow(clippy::too_many_arguments)]
fn decode_image(
    py: Python<'_>,
    data: &[u8],
    size: u32,
    max_pixels: u64,
    crop: &str,
    random_crop_scale: (f64, f64),
    crop_seed: u64,
    whole: bool,
) -> PyResult<Py<PyBytes>> {
    let spec = SampleSpec {
        image_size: size,
        max_pixels,
        crop: crop_mode(crop, random_crop_scale)?,
        ..SampleSpec::default()
    };
    let pixels = py
        .detach(|| decode_standalone_image(data, &spec, crop_seed, whole))
        .map_err(|(reason, detail)| PyValueError::new_err(format!("{reason}: {detail}")))?;
    Ok(PyBytes::new(py, &pixels).unbind())
}

#[pyfunction]
#[pyo3(name = "redact_url")]
fn py_redact_url(url: &str) -> String {
    redact_url(url)
}

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

fn index_err(e: crate::index::IndexError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// What `DatasetIndex.__reduce__` returns: its constructor and arguments.
type Reduced<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A dataset index (rust/src/index/ defines both layouts), with where it was loaded from (its
/// detail files are found there) and, optionally, other URLs to open its shards by.
#[pyclass(module = "shardstream._core", frozen)]
pub struct DatasetIndex {
    index: Arc<Index>,
    location: Option<String>,
    names: Arc<ShardNames>,
    /// The plan's input, made once: every plan of every epoch starts from it.
    plan_input: Arc<std::sync::OnceLock<plan::PlanInput>>,
}

impl DatasetIndex {
    fn wrap(index: Index, location: Option<String>) -> Self {
        Self {
            index: Arc::new(index),
            location,
            names: Arc::new(ShardNames::default()),
            plan_input: Arc::default(),
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
                crate::subset::with_selections(
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
            crate::subset::shard_samples(&self.index, self.location.as_deref(), shard, &opts)
        })
        .map_err(PyValueError::new_err)
    }

    /// Whether the index is a subset (its shards keep only selected samples).
    #[getter]
    fn is_subset(&self) -> bool {
        self.index.shards().iter().any(|s| s.selection.is_some())
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
            .map(|s| (s.url.clone(), s.size, s.identity.clone()))
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

    fn part(&self) -> PlannedPart {
        PlannedPart {
            index: self.index.clone(),
            location: self.location.clone(),
            names: self.names.clone(),
        }
    }
}

/// Several indexes planned as one epoch, each source taking its share (`plan::Mixture`).
#[pyclass(module = "shardstream._core", frozen)]
pub struct MixturePlan {
    mixture: plan::Mixture,
    shards: Arc<PlannedShards>,
}

#[pymethods]
impl MixturePlan {
    /// `shares[i]`: ("weight", w) or ("samples", n) for `sources[i]`.
    #[new]
    #[pyo3(signature = (sources, shares, epoch_samples = None))]
    fn new(
        py: Python<'_>,
        sources: Vec<PyRef<'_, DatasetIndex>>,
        shares: Vec<(String, f64)>,
        epoch_samples: Option<u64>,
    ) -> PyResult<Self> {
        let shares = shares
            .into_iter()
            .map(|(kind, value)| match kind.as_str() {
                "weight" => Ok(plan::Share::Weight(value)),
                "samples" if value >= 0.0 && value.fract() == 0.0 => {
                    Ok(plan::Share::Samples(value as u64))
                }
                _ => Err(PyValueError::new_err(format!(
                    "a share is (\"weight\", w) or (\"samples\", n), got ({kind:?}, {value})"
                ))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        // Made here and dropped once the mixture holds its own copy: a source's index is not
        // planned on its own, so it keeps no plan input of its own.
        let inputs: Vec<plan::PlanInput> = sources.iter().map(|s| s.index.plan_input()).collect();
        let parts = sources.iter().map(|s| s.part()).collect();
        let mixture = py
            .detach(|| plan::Mixture::new(&inputs, &shares, epoch_samples))
            .map_err(plan_err)?;
        Ok(Self {
            mixture,
            shards: Arc::new(PlannedShards::new(parts)),
        })
    }

    /// Samples per epoch of each source.
    #[getter]
    fn quotas(&self) -> Vec<u64> {
        self.mixture.quotas()
    }

    /// Each source's first shard in the mixture's numbering (`Batch` shard numbers).
    #[getter]
    fn first_shards(&self) -> Vec<u32> {
        self.mixture.first_shards()
    }

    #[getter]
    fn num_samples(&self) -> u64 {
        self.mixture.total()
    }

    #[getter]
    fn fingerprint(&self) -> u64 {
        self.mixture.fingerprint()
    }

    /// As `DatasetIndex.plan`, over the mixture.
    fn plan(&self, py: Python<'_>, request: &PlanRequest) -> PyResult<EpochPlanView> {
        let mixture = &self.mixture;
        request.plan_view(py, self.shards.clone(), |state| match state {
            None => EpochPlan::mixture(mixture, request.seed, request.epoch, request.config),
            Some(st) => EpochPlan::resume_mixture(mixture, &st, request.config),
        })
    }
}

/// What `DatasetIndex.plan` and `MixturePlan.plan` are asked for, declared once: the phase's
/// configuration, and where the epoch starts (fresh at (seed, epoch), or from `state`).
#[pyclass(module = "shardstream._core", frozen)]
pub struct PlanRequest {
    seed: u64,
    epoch: u64,
    config: PhaseConfig,
    /// A `state_dict` JSON: the rest of the epoch it describes, re-planned onto `config` if
    /// that differs from the state's.
    state: Option<String>,
}

#[pymethods]
impl PlanRequest {
    #[new]
    #[pyo3(signature = (*, seed, epoch, world_size, workers, batch_size, block_size, drop_last, state = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        epoch: u64,
        world_size: u32,
        workers: u32,
        batch_size: u64,
        block_size: u64,
        drop_last: bool,
        state: Option<String>,
    ) -> Self {
        let config = PhaseConfig::new(world_size, workers, batch_size, block_size, drop_last);
        Self {
            seed,
            epoch,
            config,
            state,
        }
    }
}

impl PlanRequest {
    /// The plan `make` gives for the parsed `state` (None: a fresh epoch), without the GIL.
    fn plan_view(
        &self,
        py: Python<'_>,
        shards: Arc<PlannedShards>,
        make: impl FnOnce(Option<EpochState>) -> Result<EpochPlan, plan::PlanError> + Send,
    ) -> PyResult<EpochPlanView> {
        let plan = py
            .detach(|| {
                let state = self
                    .state
                    .as_deref()
                    .map(|json| EpochState::from_json(json.as_bytes()))
                    .transpose()?;
                make(state)
            })
            .map_err(plan_err)?;
        Ok(EpochPlanView { plan, shards })
    }
}

/// The spans one planned reader opens (built in Rust, handed to `Loader` as they are).
#[pyclass(module = "shardstream._core", frozen)]
pub struct PlannedSpans {
    spans: Vec<ShardSpan>,
    reserve: Vec<ShardSpan>,
    /// A mixture's reader: its spans per source and each block's count of each.
    mixed: Option<(Vec<Vec<ShardSpan>>, Vec<u32>)>,
}

impl PlannedSpans {
    fn main(&self) -> MainSpans {
        match &self.mixed {
            None => MainSpans::Spans(self.spans.clone()),
            Some((streams, counts)) => MainSpans::Mixed {
                streams: streams.clone(),
                block_counts: counts.clone(),
            },
        }
    }
}

/// One epoch's plan over an index: what each reader reads, and the resumable state.
#[pyclass(module = "shardstream._core", frozen)]
pub struct EpochPlanView {
    plan: EpochPlan,
    shards: Arc<PlannedShards>,
}

impl EpochPlanView {
    fn spans(&self, runs: &[plan::Run]) -> PyResult<Vec<ShardSpan>> {
        self.shards.spans(runs).map_err(PyValueError::new_err)
    }
}

#[pymethods]
impl EpochPlanView {
    /// Batches per rank from here on (the same on every rank).
    #[getter]
    fn num_batches(&self) -> u64 {
        self.plan.num_batches()
    }

    #[getter]
    fn remainder_len(&self) -> u64 {
        self.plan.remainder_len()
    }

    /// Keys of the samples left out of this epoch (the tail < one global batch), when the index
    /// holds keys: in memory, or in the detail blocks of the few shards that hold the tail,
    /// fetched with the reader options in `config`.
    #[pyo3(signature = (config = None))]
    fn remainder_keys(
        &self,
        py: Python<'_>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<String>> {
        let opts = source_options(config)?;
        let runs = self.plan.remainder();
        py.detach(|| self.shards.keys(&runs, &opts))
            .map_err(|e: String| PyValueError::new_err(e))
    }

    /// What reader (rank, worker) reads: its spans and reserve spans (`PlannedSpans`, for
    /// `Loader`) and the block shuffle.
    fn reader(&self, py: Python<'_>, rank: u32, worker: u32) -> PyResult<Py<PyAny>> {
        let r = self.plan.reader(rank, worker).map_err(plan_err)?;
        let d = PyDict::new(py);
        let mixed = match &r.streams {
            None => None,
            Some(m) => Some((
                m.runs
                    .iter()
                    .map(|runs| self.spans(runs))
                    .collect::<PyResult<_>>()?,
                m.block_counts.clone(),
            )),
        };
        let spans = PlannedSpans {
            spans: if mixed.is_some() {
                Vec::new()
            } else {
                self.spans(r.runs())?
            },
            reserve: self.spans(r.reserve())?,
            mixed,
        };
        d.set_item("spans", Py::new(py, spans)?)?;
        d.set_item("num_batches", r.num_batches)?;
        d.set_item("last_batch_size", r.last_batch_size)?;
        d.set_item("block_size", r.shuffle.block_size())?;
        d.set_item("shuffle_seed", r.shuffle.base_seed())?;
        d.set_item("first_block", r.first_block)?;
        d.set_item("skip_emitted", r.skip_emitted)?;
        d.set_item("reader", r.reader)?;
        Ok(d.into_any().unbind())
    }

    /// The resumable state after `batches` batches of this plan were consumed on every rank and
    /// readers used `reserve_used` = [(rank, phase reader, reserve positions)] since it started.
    #[pyo3(signature = (batches, reserve_used = Vec::new()))]
    fn state(&self, batches: u64, reserve_used: Vec<(u32, u32, u64)>) -> PyResult<String> {
        let uses: Vec<plan::ReserveUse> = reserve_used
            .into_iter()
            .map(|(rank, reader, used)| plan::ReserveUse { rank, reader, used })
            .collect();
        Ok(self.plan.state(batches, &uses).map_err(plan_err)?.to_json())
    }
}

/// (samples, keys, texts, shard URLs, reserve positions used so far) of one batch.
type BatchTuple = (usize, Py<PyList>, Py<PyList>, Py<PyList>, u64);

/// (shard ids in reading order, (stride, offset), batches, shuffle base seed).
type ShardAssignmentTuple = (Vec<u32>, (u64, u64), u64, u64);

/// A `Loader`'s config dict as a `PipelineConfig`: keys that are absent or None keep the core's
/// defaults.
fn pipeline_config(config: &Bound<'_, PyDict>) -> PyResult<PipelineConfig> {
    let get = |k: &str| config.get_item(k).map(|v| v.filter(|v| !v.is_none()));
    let mut cfg = PipelineConfig {
        spec: sample_spec(config)?,
        source: source_options(Some(config))?,
        ..PipelineConfig::default()
    };
    macro_rules! take {
        ($($field:ident),*) => {$(
            if let Some(v) = get(stringify!($field))? {
                cfg.$field = v.extract()?;
            }
        )*};
    }
    take!(
        batch_size,
        threads,
        read_ahead,
        span_queue,
        block_size,
        shuffle_seed,
        first_block,
        crop_seed,
        skip_emitted,
        planned,
        cycle,
        drop_last,
        max_member_bytes,
        num_batches,
        last_batch_size
    );
    if let Some(v) = get("on_error")? {
        cfg.on_error = on_error(&v.extract::<String>()?)?;
    }
    if let Some(v) = get("sources")? {
        cfg.sources = cfg.source_specs(v.extract()?);
    }
    if let Some(v) = get("tokenizer")? {
        let (kind, path, ctx): (String, String, usize) = v.extract()?;
        let tok = crate::text::shared(&kind, &path, ctx)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        cfg.tokenizer = Some(tok);
    }
    Ok(cfg)
}

/// The running pipeline of one reader. Python lends output buffers (`submit`) and takes back
/// finished batches (`next_batch`) in the same order.
#[pyclass(module = "shardstream._core")]
pub struct Loader {
    pipeline: Option<Pipeline>,
    display: HashMap<u32, String>,
    batch_bytes: usize,
    /// int64 elements of a batch's tokens (0 without a tokenizer).
    token_len: usize,
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

    /// (n, keys, texts, shard_urls, reserve_used) of the next batch, or None at the end of the
    /// epoch; `reserve_used` counts the reserve positions this reader consumed up to this batch.
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

fn plan_err(e: crate::plan::PlanError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The seed derivation used everywhere in the crate (`rng::derive_seed`).
#[pyfunction]
fn derive_seed(parts: Vec<u64>) -> u64 {
    rng::derive_seed(&parts)
}

/// One reader's shards without an index: see `plan::assign_shards`.
/// Returns (shard ids in reading order, (stride, offset), batches, shuffle base seed).
#[pyfunction]
#[pyo3(signature = (num_shards, *, seed, epoch, world_size, workers, batch_size, block_size, samples_per_epoch, rank, worker))]
#[allow(clippy::too_many_arguments)]
fn assign_shards(
    num_shards: usize,
    seed: u64,
    epoch: u64,
    world_size: u32,
    workers: u32,
    batch_size: u64,
    block_size: u64,
    samples_per_epoch: u64,
    rank: u32,
    worker: u32,
) -> PyResult<ShardAssignmentTuple> {
    let config = PhaseConfig::new(world_size, workers, batch_size, block_size, true);
    let a = plan::assign_shards(
        num_shards,
        seed,
        epoch,
        config,
        samples_per_epoch,
        rank,
        worker,
    )
    .map_err(plan_err)?;
    Ok((
        a.shards,
        (a.stride, a.offset),
        a.num_batches,
        a.shuffle.base_seed(),
    ))
}

/// The Rust CLIP tokenizer on its own (tests and benches; the loader tokenizes in its threads).
#[pyclass(module = "shardstream._core", name = "ClipTokenizer")]
pub struct PyClipTokenizer {
    inner: ClipTokenizer,
}

#[pymethods]
impl PyClipTokenizer {
    /// `kind`: "bpe" (open_clip's merges file) or "json" (a Hugging Face tokenizer.json).
    #[new]
    fn new(kind: &str, path: &str, context_length: usize) -> PyResult<Self> {
        let inner = match kind {
            "bpe" => ClipTokenizer::from_bpe_file(path, context_length),
            "json" => ClipTokenizer::from_tokenizer_json(path, context_length),
            other => return Err(PyValueError::new_err(format!("tokenizer kind {other:?}"))),
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    #[getter]
    fn context_length(&self) -> usize {
        self.inner.context_length
    }

    /// The cleaned text the tokenizer splits (for listing differences).
    #[staticmethod]
    fn clean(text: &str) -> String {
        crate::text::clean(text)
    }

    /// Tokenizes `texts` into `len` int64 at `ptr` (`[len(texts), context_length]`), on this
    /// thread, without the GIL.
    fn tokenize_into(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        ptr: usize,
        len: usize,
    ) -> PyResult<()> {
        let ctx = self.inner.context_length;
        if ptr == 0 || len < texts.len() * ctx {
            return Err(PyValueError::new_err("token buffer too small"));
        }
        py.detach(|| {
            // SAFETY: the caller passes a live, writable int64 buffer of `len` elements.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut i64, len) };
            for (row, text) in out.chunks_mut(ctx).zip(&texts) {
                self.inner.tokenize_into(text, row);
            }
        });
        Ok(())
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreFault", m.py().get_type::<CoreFault>())?;
    m.add("DEFAULTS", defaults_dict(m.py())?)?;
    m.add_class::<SampleIter>()?;
    m.add_class::<Loader>()?;
    m.add_class::<DatasetIndex>()?;
    m.add_class::<PlanRequest>()?;
    m.add_class::<EpochPlanView>()?;
    m.add_class::<MixturePlan>()?;
    m.add_class::<PlannedSpans>()?;
    m.add_class::<PyClipTokenizer>()?;
    m.add_function(wrap_pyfunction!(scan_shard, m)?)?;
    m.add_function(wrap_pyfunction!(probe_image, m)?)?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(py_redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(derive_seed, m)?)?;
    m.add_function(wrap_pyfunction!(assign_shards, m)?)?;
    Ok(())
}
