//! The video kind's functions (issue 54): which frames of a clip are read and the size they are
//! resized to, from numbers alone, and a clip's header and sampled frames decoded from its
//! bytes; and the video-text CLIP kind's count pass (`count_clips`) and pipeline
//! (`video_pipeline`). Conversion only: the rules are `batch::video`'s. A bad argument is a
//! `ValueError` naming it; a bad clip is a `CoreFault` with its reason; no FFmpeg is
//! `FfmpegUnavailable`.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use serde_json::json;

use crate::batch::kit::sample::{CaptionSource, SampleSpec};
use crate::batch::units::count_files;
use crate::batch::video::{
    self as video, count_unit, ClipBatchMeta, ClipCount, ClipInput, ClipShape, ClipSpec, ClipTimes,
};
use crate::defaults;
use crate::error::SourceKind;
use crate::video::sampling::{self, DEFAULT_FPS};
use crate::video::{
    decode_frames, probe, Caps, Clip, Count, Rule, Sampled, Sampling, Sizing, StreamInfo,
    VideoFault,
};

use super::convert::{CaptionTokenizer, SourceSettings};
use super::errors::{CoreFault, FfmpegUnavailable};
use super::pipeline::{MetaToPy, Pipeline};
use super::settings::{settings, Settings};
use super::units::{count_list, share, ReaderTuple, UnitTuple};

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

pub(super) fn parse_rule(name: &str) -> PyResult<Rule> {
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

/// Most frames a CLIP clip samples, and most pixels a side of its frames.
const MAX_CLIP_FRAMES: u32 = 1024;
const MAX_CLIP_SIZE: u32 = 4096;

settings! {
    /// The video-text CLIP kind's config (`count_clips`' and `VideoLoader`'s): which samples
    /// are clips, then the loader's (`frames`, `size`, `batch_size`, `threads`, `tokenizer`).
    pub(super) struct ClipSettings ("video clips") {
        /// Video member extensions (or Parquet columns), tried in order.
        video_keys: Vec<String>,
        caption_key: String = defaults::CAPTION_KEY.into(),
        max_pixels: u64 = defaults::MAX_PIXELS,
        /// 0.0: no cap.
        max_seconds: f64 = 0.0,
        max_member_bytes: u64 = defaults::MAX_MEMBER_BYTES,
        /// (JSON member, start field, end field) of each clip's seconds in its video; None:
        /// whole videos.
        clip_times: Option<Vec<String>> = None,
        frames: u32 = 8,
        size: u32 = 224,
        batch_size: u32 = 1,
        threads: usize = 1,
        /// The captions' tokenizer: a dict of `CaptionTokenizer`.
        tokenizer: Option<CaptionTokenizer> = None,
    }
    groups {
        source: SourceSettings,
    }
}

impl ClipSettings {
    /// The core's spec of which samples are clips, validated.
    fn spec(&self) -> PyResult<ClipSpec> {
        if self.video_keys.is_empty() {
            return Err(PyValueError::new_err(
                "video_keys must name at least one extension",
            ));
        }
        caps(
            self.max_pixels.min(i64::MAX as u64) as i64,
            self.max_seconds,
        )?;
        Ok(ClipSpec {
            sample: SampleSpec {
                image_keys: self.video_keys.clone(),
                caption: CaptionSource::parse(&self.caption_key),
                max_pixels: self.max_pixels,
                ..SampleSpec::default()
            },
            max_seconds: self.max_seconds,
            max_member_bytes: self.max_member_bytes,
            times: match self.clip_times.as_deref() {
                None => None,
                Some([member, start, end]) => Some(ClipTimes {
                    member: member.clone(),
                    start: start.clone(),
                    end: end.clone(),
                }),
                Some(other) => {
                    return Err(PyValueError::new_err(format!(
                        "clip_times must be (member, start field, end field), not {other:?}"
                    )))
                }
            },
        })
    }

    /// The clips' layout, validated.
    fn shape(&self) -> PyResult<ClipShape> {
        if !(1..=MAX_CLIP_FRAMES).contains(&self.frames) {
            return Err(PyValueError::new_err(format!(
                "frames must be in 1..={MAX_CLIP_FRAMES}, not {}",
                self.frames
            )));
        }
        if !(1..=MAX_CLIP_SIZE).contains(&self.size) {
            return Err(PyValueError::new_err(format!(
                "size must be in 1..={MAX_CLIP_SIZE}, not {}",
                self.size
            )));
        }
        Ok(ClipShape {
            frames: self.frames,
            size: self.size,
        })
    }
}

/// Loads FFmpeg before anything is read: its absence is the environment's, never a unit's.
pub(super) fn require_ffmpeg() -> PyResult<()> {
    crate::video::ffmpeg::ffmpeg()
        .map(|_| ())
        .map_err(|e| FfmpegUnavailable::new_err(e.to_string()))
}

/// Counts the clips of every unit of `urls` (tar shards, Parquet row groups) on `threads`
/// threads without the GIL, reading only the clips' container headers: a list of dicts (url,
/// first_row, rows, identity, samples, clips, seconds, skipped, examples, error), units in
/// file order.
#[pyfunction]
#[pyo3(signature = (urls, config, threads = 1))]
pub fn count_clips<'py>(
    py: Python<'py>,
    urls: Vec<String>,
    config: &Bound<'py, PyDict>,
    threads: usize,
) -> PyResult<Bound<'py, PyList>> {
    let s = ClipSettings::from_config(config)?;
    let spec = s.spec()?;
    let opts = s.source.options(py)?;
    require_ffmpeg()?;
    let counted = py
        .detach(|| count_files(&urls, threads, &opts, |u, s| count_unit(u, &spec, &opts, s)))
        .map_err(PyValueError::new_err)?;
    count_list(
        py,
        counted,
        |c| [json!(c.skipped), json!(c.examples)],
        |d, c: &ClipCount| {
            d.set_item("samples", c.samples)?;
            d.set_item("clips", c.clips)?;
            d.set_item("seconds", c.seconds)
        },
    )
}

impl MetaToPy for ClipBatchMeta {
    /// (clips, texts, keys, urls, indices).
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let m = self;
        let tuple = (m.clips, m.texts, m.keys, m.urls, m.indices);
        Ok(tuple.into_pyobject(py)?.into_any().unbind())
    }
}

/// Starts the CLIP clip pipeline of one `reader` of the plan over `units` and their clip
/// `counts` (count order), a clip a position (shape: batch_size B, seq_len 1, block_rows 1);
/// `config`: the count's keys, `frames`, `size`, `batch_size`, `threads`, `tokenizer` and the
/// source options.
#[pyfunction]
pub fn video_pipeline(
    units: Vec<UnitTuple>,
    counts: Vec<u64>,
    reader: ReaderTuple,
    config: &Bound<'_, PyDict>,
) -> PyResult<Pipeline> {
    let s = ClipSettings::from_config(config)?;
    let current = reader.3;
    if (current.2, current.3, current.4) != (s.batch_size, 1, 1) {
        return Err(PyValueError::new_err(format!(
            "a clip plan's shape has batch_size {}, seq_len 1 and block_rows 1, not {:?}",
            s.batch_size,
            (current.2, current.3, current.4)
        )));
    }
    require_ffmpeg()?;
    let share = share(units, counts, reader)?;
    let tokenizer = s
        .tokenizer
        .as_ref()
        .map(CaptionTokenizer::open)
        .transpose()?;
    let input = Arc::new(ClipInput {
        units: share.units,
        unit_clips: share.weights,
        spec: s.spec()?,
        shape: s.shape()?,
        batch_size: s.batch_size,
        source: s.source.options(config.py())?,
        tokenizer,
    });
    let pipeline = video::start(input, &share.order, share.reader, s.threads);
    Ok(Pipeline::new(pipeline))
}
