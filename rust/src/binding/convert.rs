//! Conversions between Python values and the core's types: the config dicts the Python side
//! passes (sample spec, reader options, a loader's pipeline config), the error policy and crop
//! names, JSON values, the core's defaults, and a Python signer callable.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::UnknownSetting;

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

pub(super) fn sample_spec(config: &Bound<'_, PyDict>) -> PyResult<SampleSpec> {
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
    let ratio: (f64, f64) = match config.get_item("random_crop_ratio")? {
        Some(v) => v.extract()?,
        None => defaults::RANDOM_CROP_RATIO,
    };
    if let Some(v) = config.get_item("crop")? {
        spec.crop = crop_mode(&v.extract::<String>()?, scale, ratio)?;
    }
    Ok(spec)
}

/// A duration option in seconds; a negative, infinite or NaN one is a `ValueError` naming it
/// (`Duration::from_secs_f64` would panic).
fn seconds(value: &Bound<'_, PyAny>, name: &str) -> PyResult<std::time::Duration> {
    let secs: f64 = value.extract()?;
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, got {secs}"
        ))
    })
}

/// The keys [`source_options`] reads.
pub(super) const SOURCE_KEYS: &[&str] = &[
    "connect_timeout",
    "read_timeout",
    "max_retries",
    "backoff_initial",
    "backoff_max",
    "retry_after_max",
    "cache_dir",
    "cache_max_bytes",
    "ca_bundle",
    "signer",
];

/// The keys [`sample_spec`] reads.
pub(super) const SAMPLE_KEYS: &[&str] = &[
    "image_size",
    "caption_key",
    "image_keys",
    "max_pixels",
    "random_crop_scale",
    "random_crop_ratio",
    "crop",
];

/// Refuses a key of `config` that none of the lists in `known` holds: a setting the binding of
/// `kind` does not read (misspelt, or meant for another kind) would otherwise be ignored, its
/// default taken in silence. The error names the key, the kind and the keys it takes.
pub(super) fn refuse_unknown(
    config: &Bound<'_, PyDict>,
    kind: &str,
    known: &[&[&str]],
) -> PyResult<()> {
    for key in config.keys() {
        let key: String = key.extract()?;
        if !known.iter().any(|k| k.contains(&key.as_str())) {
            let mut takes: Vec<&str> = known.concat();
            takes.sort_unstable();
            return Err(UnknownSetting::new_err((
                key.clone(),
                kind.to_string(),
                format!(
                    "the {kind} core takes no setting {key:?} (it takes: {})",
                    takes.join(", ")
                ),
            )));
        }
    }
    Ok(())
}

/// Reader options from a config dict (any of its keys may be absent); none: the defaults.
pub(super) fn source_options(config: Option<&Bound<'_, PyDict>>) -> PyResult<SourceOptions> {
    let mut opts = SourceOptions::default();
    let Some(config) = config else {
        return Ok(opts);
    };
    if let Some(v) = config.get_item("connect_timeout")? {
        opts.connect_timeout = seconds(&v, "connect_timeout")?;
    }
    if let Some(v) = config.get_item("read_timeout")? {
        opts.read_timeout = seconds(&v, "read_timeout")?;
    }
    if let Some(v) = config.get_item("max_retries")? {
        opts.max_retries = v.extract()?;
    }
    if let Some(v) = config.get_item("backoff_initial")? {
        opts.backoff_initial = seconds(&v, "backoff_initial")?;
    }
    if let Some(v) = config.get_item("backoff_max")? {
        opts.backoff_max = seconds(&v, "backoff_max")?;
    }
    if let Some(v) = config.get_item("retry_after_max")? {
        opts.retry_after_max = seconds(&v, "retry_after_max")?;
    }
    if let Some(dir) = config.get_item("cache_dir")?.filter(|v| !v.is_none()) {
        let max_bytes = present(config, "cache_max_bytes")?
            .map_or(Ok(defaults::CACHE_MAX_BYTES), |v| v.extract())?;
        opts.cache = Some(crate::read::source::CacheOptions {
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

/// A `Loader`'s config dict as a `PipelineConfig`: keys that are absent or None keep the core's
/// defaults.
/// The keys [`pipeline_config`] reads besides the sample's and the source's.
const PIPELINE_KEYS: &[&str] = &[
    "batch_size",
    "threads",
    "read_ahead",
    "span_queue",
    "block_size",
    "shuffle_seed",
    "first_block",
    "crop_seed",
    "skip_emitted",
    "planned",
    "cycle",
    "drop_last",
    "max_member_bytes",
    "num_batches",
    "last_batch_size",
    "on_error",
    "sources",
    "naflex",
    "undecoded",
    "tokenizer",
];

pub(super) fn pipeline_config(config: &Bound<'_, PyDict>) -> PyResult<PipelineConfig> {
    refuse_unknown(config, "loader", &[PIPELINE_KEYS, SAMPLE_KEYS, SOURCE_KEYS])?;
    let mut cfg = PipelineConfig {
        spec: sample_spec(config)?,
        source: source_options(Some(config))?,
        ..PipelineConfig::default()
    };
    take_plain_fields(&mut cfg, config)?;
    if let Some(v) = present(config, "on_error")? {
        cfg.on_error = on_error(&v.extract::<String>()?)?;
    }
    if let Some(v) = present(config, "sources")? {
        cfg.sources = cfg.source_specs(v.extract()?);
    }
    if let Some(v) = present(config, "naflex")? {
        cfg.kind = SampleKind::NaFlex(naflex_spec(&v)?);
    }
    if present(config, "undecoded")?.map_or(Ok(false), |v| v.extract())? {
        cfg.kind = SampleKind::Undecoded;
    }
    if let Some(v) = present(config, "tokenizer")? {
        let (kind, path, ctx): (String, String, usize) = v.extract()?;
        let tok = crate::tokenize::shared(&kind, &path, ctx)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        cfg.tokenizer = Some(tok);
    }
    Ok(cfg)
}

/// The NaFlex kind's spec from its tuple (`kinds.naflex.NaFlex.core_config`): (patch_size,
/// max_num_patches, min_num_patches, random crop (scale, ratio) or None).
pub(super) fn naflex_spec(value: &Bound<'_, PyAny>) -> PyResult<NaFlexSpec> {
    type NaFlexTuple = (u32, u32, u32, Option<((f64, f64), (f64, f64))>);
    let (patch_size, max_num_patches, min_num_patches, random_crop): NaFlexTuple =
        value.extract()?;
    let spec = NaFlexSpec {
        patch_size,
        max_num_patches,
        min_num_patches,
        random_crop,
    };
    spec.validate().map_err(PyValueError::new_err)?;
    Ok(spec)
}

/// `config[key]`, or `None` when the key is absent or its value is None.
pub(super) fn present<'py>(
    config: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(config.get_item(key)?.filter(|v| !v.is_none()))
}

/// The config's values for the `PipelineConfig` fields that Python passes as they are.
fn take_plain_fields(cfg: &mut PipelineConfig, config: &Bound<'_, PyDict>) -> PyResult<()> {
    macro_rules! take {
        ($($field:ident),*) => {$(
            if let Some(v) = present(config, stringify!($field))? {
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
    Ok(())
}
