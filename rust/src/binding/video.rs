//! The video kind's functions (issue 54): which frames of a clip are read and the size they are
//! resized to, from numbers alone, and a clip's header and sampled frames decoded from its
//! bytes. Conversion only: the rules are `batch::video`'s. A bad argument is a `ValueError`
//! naming it; a bad clip is a `CoreFault` with its reason; no FFmpeg is `FfmpegUnavailable`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::batch::video::sampling::{self, DEFAULT_FPS};
use crate::batch::video::{
    decode_frames, probe, Caps, Clip, Count, Rule, Sampled, Sampling, Sizing, StreamInfo,
    VideoFault,
};
use crate::defaults;
use crate::error::SourceKind;

use super::errors::{CoreFault, FfmpegUnavailable};

/// (indices, range_frames, sample_fps): what `video_sample_frames` and `video_clip_frames`
/// return.
type SampledTuple = (Vec<u32>, u32, f64);

/// A non-negative integer argument as `T`, or a `ValueError` naming it (PyO3's own
/// `OverflowError` for a negative int names no argument).
fn count<T: TryFrom<i64>>(name: &str, value: i64) -> PyResult<T> {
    T::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a non-negative integer in range, not {value}"
        ))
    })
}

fn parse_rule(name: &str) -> PyResult<Rule> {
    match name {
        "qwen-vl-utils" => Ok(Rule::QwenVlUtils),
        "transformers" => Ok(Rule::Transformers),
        other => Err(PyValueError::new_err(format!(
            "rule must be \"qwen-vl-utils\" or \"transformers\", not {other:?}"
        ))),
    }
}

fn tuple(s: Sampled) -> SampledTuple {
    (s.indices, s.range_frames, s.sample_fps)
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The frames of a clip of `total_frames` frames at `video_fps` (its average frame rate) the
/// Qwen path reads: (indices, range_frames, sample_fps).
#[pyfunction]
#[pyo3(signature = (
    total_frames,
    video_fps,
    *,
    rule = "qwen-vl-utils",
    fps = None,
    nframes = None,
    min_frames = sampling::DEFAULT_MIN_FRAMES as i64,
    max_frames = sampling::DEFAULT_MAX_FRAMES as i64,
    video_start = None,
    video_end = None,
    temporal_patch_size = 2,
))]
#[allow(clippy::too_many_arguments)]
pub fn video_sample_frames(
    total_frames: i64,
    video_fps: f64,
    rule: &str,
    fps: Option<f64>,
    nframes: Option<i64>,
    min_frames: i64,
    max_frames: i64,
    video_start: Option<f64>,
    video_end: Option<f64>,
    temporal_patch_size: i64,
) -> PyResult<SampledTuple> {
    let how_many = match (fps, nframes) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "fps and nframes are mutually exclusive: pass one",
            ))
        }
        (_, Some(n)) => Count::Frames(count("nframes", n)?),
        (fps, None) => Count::Fps {
            fps: fps.unwrap_or(DEFAULT_FPS),
            min_frames: count("min_frames", min_frames)?,
            max_frames: count("max_frames", max_frames)?,
        },
    };
    let s = Sampling {
        rule: parse_rule(rule)?,
        count: how_many,
        temporal_patch_size: count("temporal_patch_size", temporal_patch_size)?,
        start: video_start,
        end: video_end,
    };
    let clip = Clip {
        total_frames: count("total_frames", total_frames)?,
        fps: video_fps,
    };
    sampling::sample(clip, &s).map(tuple).map_err(value_error)
}

/// The `num_frames` frames of a CLIP clip, spread from the first frame of its range to the last:
/// (indices, range_frames, sample_fps).
#[pyfunction]
#[pyo3(signature = (total_frames, video_fps, num_frames, *, video_start = None, video_end = None))]
pub fn video_clip_frames(
    total_frames: i64,
    video_fps: f64,
    num_frames: i64,
    video_start: Option<f64>,
    video_end: Option<f64>,
) -> PyResult<SampledTuple> {
    let clip = Clip {
        total_frames: count("total_frames", total_frames)?,
        fps: video_fps,
    };
    let frames = count("num_frames", num_frames)?;
    sampling::uniform(clip, video_start, video_end, frames)
        .map(tuple)
        .map_err(value_error)
}

/// The (resized_height, resized_width, (t, h, w) grid) of `nframes` sampled frames of a
/// `height x width` clip on the Qwen path.
#[pyfunction]
#[pyo3(signature = (
    height,
    width,
    nframes,
    *,
    patch_size = 14,
    merge_size = 2,
    temporal_patch_size = 2,
    min_pixels = None,
    max_pixels = None,
    total_pixels = None,
))]
#[allow(clippy::too_many_arguments)]
pub fn video_frame_size(
    height: i64,
    width: i64,
    nframes: i64,
    patch_size: i64,
    merge_size: i64,
    temporal_patch_size: i64,
    min_pixels: Option<f64>,
    max_pixels: Option<f64>,
    total_pixels: Option<f64>,
) -> PyResult<(u32, u32, (u32, u32, u32))> {
    let sizing = Sizing {
        patch_size: count("patch_size", patch_size)?,
        merge_size: count("merge_size", merge_size)?,
        temporal_patch_size: count("temporal_patch_size", temporal_patch_size)?,
        min_pixels,
        max_pixels,
        total_pixels,
    };
    let (height, width, nframes) = (
        count("height", height)?,
        count("width", width)?,
        count("nframes", nframes)?,
    );
    let (h, w) = sizing
        .resized(height, width, nframes)
        .map_err(value_error)?;
    let grid = sizing.grid(nframes, h, w);
    Ok((h, w, (grid.t, grid.h, grid.w)))
}

/// (pixels, height, width, frames_decoded, header info): what `video_decode_frames` returns.
type DecodedTuple<'py> = (Py<PyBytes>, u32, u32, u64, Bound<'py, PyDict>);

fn video_fault(e: VideoFault) -> PyErr {
    match e.reason() {
        None => FfmpegUnavailable::new_err(e.to_string()),
        Some(reason) => CoreFault::new_err((
            reason.as_str(),
            "",
            "",
            e.to_string(),
            SourceKind::Other.as_str(),
        )),
    }
}

fn caps(max_pixels: i64, max_seconds: f64) -> PyResult<Caps> {
    if max_seconds.is_nan() || max_seconds < 0.0 {
        return Err(PyValueError::new_err(format!(
            "max_seconds must be >= 0 (0 for no cap), not {max_seconds}"
        )));
    }
    Ok(Caps {
        max_pixels: count("max_pixels", max_pixels)?,
        max_seconds,
    })
}

fn info_dict<'py>(py: Python<'py>, info: &StreamInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("codec", &info.codec)?;
    d.set_item("width", info.width)?;
    d.set_item("height", info.height)?;
    d.set_item("rotation", info.rotation)?;
    d.set_item("fps", info.fps)?;
    d.set_item("frames", info.frames)?;
    d.set_item("seconds", info.seconds)?;
    Ok(d)
}

/// What a clip's stream header says: {codec, width, height, rotation, fps, frames, seconds}.
#[pyfunction]
#[pyo3(signature = (data, *, max_pixels = defaults::MAX_PIXELS as i64, max_seconds = 0.0))]
pub fn video_probe<'py>(
    py: Python<'py>,
    data: &[u8],
    max_pixels: i64,
    max_seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let caps = caps(max_pixels, max_seconds)?;
    let info = py.detach(|| probe(data, &caps)).map_err(video_fault)?;
    info_dict(py, &info)
}

/// A clip's frames `indices`, decoded and converted to RGB at `size` (height, width), turned
/// upright: (pixels [len(indices), 3, height, width] as bytes, height, width, frames_decoded,
/// header info dict).
#[pyfunction]
#[pyo3(signature = (
    data, indices, *, size = None, max_pixels = defaults::MAX_PIXELS as i64, max_seconds = 0.0,
))]
pub fn video_decode_frames<'py>(
    py: Python<'py>,
    data: &[u8],
    indices: Vec<i64>,
    size: Option<(i64, i64)>,
    max_pixels: i64,
    max_seconds: f64,
) -> PyResult<DecodedTuple<'py>> {
    let caps = caps(max_pixels, max_seconds)?;
    let indices = indices
        .into_iter()
        .map(|i| count::<u32>("indices", i))
        .collect::<PyResult<Vec<_>>>()?;
    let size = match size {
        None => None,
        Some((h, w)) if h > 0 && w > 0 => Some((count("size", h)?, count("size", w)?)),
        Some((h, w)) => {
            return Err(PyValueError::new_err(format!(
                "size must be (height, width) of positive integers, not ({h}, {w})"
            )))
        }
    };
    let frames = py
        .detach(|| decode_frames(data, &indices, size, &caps))
        .map_err(video_fault)?;
    Ok((
        PyBytes::new(py, &frames.pixels).unbind(),
        frames.height,
        frames.width,
        frames.frames_decoded,
        info_dict(py, &frames.info)?,
    ))
}
