//! Shards and images outside the loader: raw samples (`SampleIter`, behind `read_samples`),
//! whole-shard validation (`scan_shard`), and one image probed or decoded as the loader does.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::convert::{crop_mode, json_to_py, on_error, source_options};
use super::errors::fault_to_py;
use crate::batch::kit::sample::{CaptionSource, SampleSpec};
use crate::batch::square::sample::decode_standalone_image;
use crate::check::scan::{scan_shard as scan, ScanOptions};
use crate::defaults;
use crate::image::decode::Decoder;
use crate::read::shard_samples::ShardSamples;

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
pub(super) fn scan_shard(
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
pub(super) fn probe_image(data: &[u8]) -> PyResult<(String, u32, u32)> {
    let probe = Decoder::new()
        .probe(data)
        .map_err(|e| PyValueError::new_err(format!("{}: {}", e.reason, e.detail)))?;
    let (w, h) = probe.oriented_size();
    Ok((probe.format.name().to_string(), w, h))
}

/// Decodes one image exactly as the loader does: [3, size, size] uint8 bytes. `crop`,
/// `random_crop_scale`, `random_crop_ratio` and `crop_seed` as in the loader's config; `whole`
/// decodes every row, as validation does.
#[pyfunction]
#[pyo3(signature = (
    data, size = defaults::IMAGE_SIZE, max_pixels = defaults::MAX_PIXELS, *,
    crop = defaults::CROP, random_crop_scale = defaults::RANDOM_CROP_SCALE,
    random_crop_ratio = defaults::RANDOM_CROP_RATIO, crop_seed = 0, whole = false,
))]
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_image(
    py: Python<'_>,
    data: &[u8],
    size: u32,
    max_pixels: u64,
    crop: &str,
    random_crop_scale: (f64, f64),
    random_crop_ratio: (f64, f64),
    crop_seed: u64,
    whole: bool,
) -> PyResult<Py<PyBytes>> {
    let spec = SampleSpec {
        image_size: size,
        max_pixels,
        crop: crop_mode(crop, random_crop_scale, random_crop_ratio)?,
        ..SampleSpec::default()
    };
    let pixels = py
        .detach(|| decode_standalone_image(data, &spec, crop_seed, whole))
        .map_err(|(reason, detail)| PyValueError::new_err(format!("{reason}: {detail}")))?;
    Ok(PyBytes::new(py, &pixels).unbind())
}
