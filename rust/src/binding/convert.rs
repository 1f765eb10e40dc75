//! Conversions between Python values and the core's types: the config dicts the Python side
//! passes (sample spec, reader options, a loader's pipeline config), the error policy and crop
//! names, JSON values, the core's defaults, and a Python signer callable.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::settings::{settings, Settings};

use crate::batch::kit::patches::NaFlexSpec;
use crate::batch::kit::sample::{CaptionSource, SampleSpec};
use crate::batch::square::config::{OnError, PipelineConfig, SampleKind};
use crate::defaults;
use crate::image::resize::CropMode;
use crate::read::source::{Signed, Signer, SourceOptions};

/// `_core.DEFAULTS`: the core's defaults (`defaults.rs`) by the names of the loader's options,
/// durations in seconds. `shardstream.config` reads them into its typed view.
pub(super) fn defaults_dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
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
    d.set_item("random_crop_ratio", RANDOM_CROP_RATIO)?;
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
    d.set_item("retry_after_max", RETRY_AFTER_MAX.as_secs_f64())?;
    d.set_item("cache_max_bytes", CACHE_MAX_BYTES)?;
    Ok(d)
}

pub(super) fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

pub(super) fn on_error(s: &str) -> PyResult<OnError> {
    match s {
        "skip" => Ok(OnError::Skip),
        "raise" => Ok(OnError::Raise),
        other => Err(PyValueError::new_err(format!(
            "on_error must be 'skip' or 'raise', not {other:?}"
        ))),
    }
}

pub(super) fn crop_mode(crop: &str, scale: (f64, f64), ratio: (f64, f64)) -> PyResult<CropMode> {
    // The crop samples the aspect log-uniformly in the range: both ends must be finite and > 0.
    if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "random_crop_ratio must be two aspect ratios 0 < low <= high, not {ratio:?}"
        )));
    }
    match crop {
        "center" => Ok(CropMode::Center),
        "random" => Ok(CropMode::RandomResized { scale, ratio }),
        other => Err(PyValueError::new_err(format!(
            "crop must be 'center' or 'random', not {other:?}"
        ))),
    }
}

settings! {
    /// A sample's settings (the image-text kinds'); absent: the core's defaults.
    pub(super) struct SampleSettings ("sample") {
        image_size: u32 = defaults::IMAGE_SIZE,
        caption_key: String = defaults::CAPTION_KEY.into(),
        image_keys: Vec<String> = defaults::image_keys(),
        max_pixels: u64 = defaults::MAX_PIXELS,
        random_crop_scale: (f64, f64) = defaults::RANDOM_CROP_SCALE,
        random_crop_ratio: (f64, f64) = defaults::RANDOM_CROP_RATIO,
        crop: String = defaults::CROP.into(),
    }
}

impl SampleSettings {
    /// The core's `SampleSpec` of these settings.
    pub(super) fn spec(&self) -> PyResult<SampleSpec> {
        Ok(SampleSpec {
            image_size: self.image_size,
            caption: CaptionSource::parse(&self.caption_key),
            image_keys: self.image_keys.clone(),
            max_pixels: self.max_pixels,
            crop: crop_mode(&self.crop, self.random_crop_scale, self.random_crop_ratio)?,
        })
    }
}

/// A duration option in seconds; a negative, infinite or NaN one is a `ValueError` naming it
/// (`Duration::from_secs_f64` would panic).
fn seconds(secs: f64, name: &str) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, got {secs}"
        ))
    })
}

settings! {
    /// The reader's settings (every reading function's); absent: the core's defaults.
    pub(super) struct SourceSettings ("source") {
        connect_timeout: f64 = defaults::CONNECT_TIMEOUT.as_secs_f64(),
        read_timeout: f64 = defaults::READ_TIMEOUT.as_secs_f64(),
        max_retries: u32 = defaults::MAX_RETRIES,
        backoff_initial: f64 = defaults::BACKOFF_INITIAL.as_secs_f64(),
        backoff_max: f64 = defaults::BACKOFF_MAX.as_secs_f64(),
        retry_after_max: f64 = defaults::RETRY_AFTER_MAX.as_secs_f64(),
        /// None: no local cache.
        cache_dir: Option<std::path::PathBuf> = None,
        cache_max_bytes: u64 = defaults::CACHE_MAX_BYTES,
        ca_bundle: Option<std::path::PathBuf> = None,
        /// A callable `url -> presigned url` or `(url, headers)`.
        signer: Option<Py<PyAny>> = None,
    }
}

impl SourceSettings {
    /// The core's `SourceOptions` of these settings.
    pub(super) fn options(&self, py: Python<'_>) -> PyResult<SourceOptions> {
        Ok(SourceOptions {
            connect_timeout: seconds(self.connect_timeout, "connect_timeout")?,
            read_timeout: seconds(self.read_timeout, "read_timeout")?,
            max_retries: self.max_retries,
            backoff_initial: seconds(self.backoff_initial, "backoff_initial")?,
            backoff_max: seconds(self.backoff_max, "backoff_max")?,
            retry_after_max: seconds(self.retry_after_max, "retry_after_max")?,
            cache: self
                .cache_dir
                .clone()
                .map(|dir| crate::read::source::CacheOptions {
                    dir,
                    max_bytes: self.cache_max_bytes,
                }),
            ca_bundle: self.ca_bundle.clone(),
            signer: self.signer.as_ref().map(|s| python_signer(s.clone_ref(py))),
            ..SourceOptions::default()
        })
    }
}

/// Reader options from a config dict that may hold other settings too (an index's, a plan's,
/// a scan's: the keys of the source are read, others are the caller's); none: the defaults.
pub(super) fn source_options(config: Option<&Bound<'_, PyDict>>) -> PyResult<SourceOptions> {
    match config {
        Some(c) => SourceSettings::fields(c, SourceSettings::KIND)?.options(c.py()),
        None => Ok(SourceOptions::default()),
    }
}

/// A [`Signer`] that calls a Python callable (`url -> presigned url`, or `(url, headers)`) from
/// the reader threads.
/// The callers of every reading function release the GIL while they wait, so this can take it.
/// A reader thread still running while the interpreter shuts down gets an error instead of
/// attaching to a finalising interpreter.
fn python_signer(callable: Py<PyAny>) -> Signer {
    Signer(Arc::new(move |url: &str| {
        Python::try_attach(|py| {
            callable
                .call1(py, (url,))
                .and_then(|answer| {
                    // A URL, or (URL, [(header, value), ...]) for a source that needs headers.
                    if let Ok(url) = answer.extract::<String>(py) {
                        return Ok(url.into());
                    }
                    let (url, headers) = answer.extract::<(String, Vec<(String, String)>)>(py)?;
                    Ok(Signed { url, headers })
                })
                .map_err(|e| e.value(py).to_string())
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".into()))
    }))
}

settings! {
    /// A `Loader`'s config (`LoaderConfig.core_config` and the sample kind's): a `None` field
    /// keeps `PipelineConfig::default()`'s value.
    pub(super) struct LoaderSettings ("loader") {
        batch_size: Option<usize> = None,
        threads: Option<usize> = None,
        read_ahead: Option<usize> = None,
        span_queue: Option<usize> = None,
        block_size: Option<usize> = None,
        shuffle_seed: Option<u64> = None,
        first_block: Option<u64> = None,
        crop_seed: Option<u64> = None,
        skip_emitted: Option<u64> = None,
        planned: Option<bool> = None,
        cycle: Option<bool> = None,
        drop_last: Option<bool> = None,
        max_member_bytes: Option<u64> = None,
        num_batches: Option<u64> = None,
        last_batch_size: Option<usize> = None,
        /// "skip" or "raise".
        on_error: Option<String> = None,
        /// A mixture's sources: (first shard, caption key or None).
        sources: Option<Vec<(u32, Option<String>)>> = None,
        /// The NaFlex kind's spec: a dict of [`NaFlexSettings`].
        naflex: Option<NaFlexSettings> = None,
        undecoded: bool = false,
        /// The captions' tokenizer: a dict of [`CaptionTokenizer`].
        tokenizer: Option<CaptionTokenizer> = None,
    }
    groups {
        sample: SampleSettings,
        source: SourceSettings,
    }
}

pub(super) fn pipeline_config(config: &Bound<'_, PyDict>) -> PyResult<PipelineConfig> {
    let s = LoaderSettings::from_config(config)?;
    let py = config.py();
    let mut cfg = PipelineConfig {
        spec: s.sample.spec()?,
        source: s.source.options(py)?,
        ..PipelineConfig::default()
    };
    macro_rules! take {
        ($($field:ident),*) => {$(
            if let Some(v) = s.$field {
                cfg.$field = v.into();
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
    if let Some(v) = &s.on_error {
        cfg.on_error = on_error(v)?;
    }
    if let Some(v) = s.sources {
        cfg.sources = cfg.source_specs(v);
    }
    if let Some(v) = &s.naflex {
        cfg.kind = SampleKind::NaFlex(naflex_spec(v)?);
    }
    if s.undecoded {
        cfg.kind = SampleKind::Undecoded;
    }
    if let Some(t) = &s.tokenizer {
        cfg.tokenizer = Some(t.open()?);
    }
    Ok(cfg)
}

settings! {
    /// The captions' tokenizer of the sample kinds (`shardstream.tokenizer.core_tokenizer`):
    /// which one, its file and the tokens a caption is padded or cut to.
    pub(super) struct CaptionTokenizer ("caption tokenizer") {
        /// "bpe" (open_clip's CLIP BPE file) or "json" (a `tokenizer.json`).
        kind: String,
        path: String,
        context_length: usize,
    }
}

impl CaptionTokenizer {
    /// The tokenizer, parsed once per process and settings (`tokenize::shared`).
    pub(super) fn open(&self) -> PyResult<Arc<crate::tokenize::ClipTokenizer>> {
        crate::tokenize::shared(&self.kind, &self.path, self.context_length)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

settings! {
    /// The NaFlex kind's spec (`kinds.naflex.NaFlex.core_config()["naflex"]`).
    pub(super) struct NaFlexSettings ("NaFlex spec") {
        patch_size: u32,
        max_num_patches: u32,
        /// 0: no floor.
        min_num_patches: u32 = 0,
        /// The random crop's (scale, ratio); None: no random crop.
        random_crop: Option<((f64, f64), (f64, f64))> = None,
    }
}

/// The NaFlex kind's spec of its settings, validated.
pub(super) fn naflex_spec(s: &NaFlexSettings) -> PyResult<NaFlexSpec> {
    let spec = NaFlexSpec {
        patch_size: s.patch_size,
        max_num_patches: s.max_num_patches,
        min_num_patches: s.min_num_patches,
        random_crop: s.random_crop,
    };
    spec.validate().map_err(PyValueError::new_err)?;
    Ok(spec)
}
