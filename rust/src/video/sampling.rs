//! Which frames of a clip are read: frame numbers only, from the clip's frame count and average
//! frame rate, before anything is decoded.
//!
//! Two references, which pick the same number of frames but not the same frames:
//! - [`Rule::QwenVlUtils`] (the default): `qwen-vl-utils` 0.0.14's `fetch_video` through its
//!   TorchCodec and decord readers: `calculate_video_frame_range` (the clip's start and end
//!   times to a range of frames), `smart_nframes` (how many) and
//!   `torch.linspace(first, last, n).round()` (which): spread from the range's first frame to
//!   its last. This is Qwen's own pipeline, the one its models were trained with.
//! - [`Rule::Transformers`]: transformers 5.24's `Qwen2VLVideoProcessor.sample_frames`:
//!   `torch.arange(0, total, total / n).int()`, which starts at frame 0 and stops up to one
//!   sampling step short of the last frame (at 60 fps and 2 frames a second, up to 29 frames).
//!   It takes no clip times; here it samples the same range of frames as the default rule,
//!   numbered from the range's first frame.
//!
//! The count differs too where `min_frames` is odd: `qwen-vl-utils` rounds it up to the
//! temporal patch first, transformers does not.
//!
//! Both pick by frame number, the frame rate being the clip's average (frames / duration): on a
//! variable-frame-rate clip the `i`-th frame is not at `i / fps` seconds, so the frames are
//! spread evenly over the frames, not over time (a stretch filmed at a higher rate gets more of
//! them), and clip times convert to frame numbers at the average rate, as both references do.
//!
//! The frame numbers are the references' bit for bit, their float32 arithmetic included:
//! `torch.linspace` computes in float32 with fused multiply-adds (torch's AVX2 and AVX-512 CPU
//! kernels; its scalar "default" kernel rounds twice and can pick a neighbouring frame), and
//! `torch.arange` of a float32 range computes in float64 by lanes of 8 and rounds to float32
//! (torch's AVX2 and default kernels; AVX-512's lanes of 16 can differ, and so can a range over
//! 32,768 frames, which torch splits over threads).

use thiserror::Error;

/// `qwen-vl-utils`' and transformers' default frames a second (`FPS`, `fps`).
pub const DEFAULT_FPS: f64 = 2.0;
/// `qwen-vl-utils`' `FPS_MIN_FRAMES` (transformers' `min_frames`).
pub const DEFAULT_MIN_FRAMES: u32 = 4;
/// `qwen-vl-utils`' `FPS_MAX_FRAMES` (transformers' `max_frames`).
pub const DEFAULT_MAX_FRAMES: u32 = 768;
/// The most frames a clip may have: frame numbers are computed in float32, as torch does,
/// which holds every integer up to 2^24 (77 hours at 60 fps).
pub const MAX_CLIP_FRAMES: u64 = 1 << 24;

/// A clip as its container describes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clip {
    /// The frames in the clip.
    pub total_frames: u64,
    /// The average frame rate: frames / duration (TorchCodec's `average_fps`, decord's
    /// `get_avg_fps()`). On a variable-frame-rate clip it converts times to frame numbers only
    /// on average (see the module's doc).
    pub fps: f64,
}

/// Which reference picks the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `qwen-vl-utils`' `fetch_video`: from the first frame to the last.
    QwenVlUtils,
    /// transformers' `Qwen2VLVideoProcessor.sample_frames`: from frame 0 by equal steps.
    Transformers,
}

impl Rule {
    fn name(self) -> &'static str {
        match self {
            Rule::QwenVlUtils => "qwen-vl-utils",
            Rule::Transformers => "transformers",
        }
    }
}

/// How many frames are sampled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Count {
    /// `fps` frames a second of the clip, at least `min_frames` and at most `max_frames`,
    /// rounded down to the temporal patch.
    Fps {
        fps: f64,
        min_frames: u32,
        max_frames: u32,
    },
    /// This many frames (`nframes`, `num_frames`), rounded to the temporal patch.
    Frames(u32),
}

impl Default for Count {
    fn default() -> Self {
        Count::Fps {
            fps: DEFAULT_FPS,
            min_frames: DEFAULT_MIN_FRAMES,
            max_frames: DEFAULT_MAX_FRAMES,
        }
    }
}

/// How a clip's frames are sampled for the Qwen path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub rule: Rule,
    pub count: Count,
    /// Frames a temporal patch holds: the count is a multiple of it (`FRAME_FACTOR`, 2 in
    /// `qwen-vl-utils`; the processor's `temporal_patch_size`).
    pub temporal_patch_size: u32,
    /// The clip's start time in seconds (`video_start`), if it starts after the first frame.
    pub start: Option<f64>,
    /// The clip's end time in seconds (`video_end`), if it ends before the last frame.
    pub end: Option<f64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            rule: Rule::QwenVlUtils,
            count: Count::default(),
            temporal_patch_size: 2,
            start: None,
            end: None,
        }
    }
}

/// The frames a clip is read at.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The frame numbers, ascending (a number may repeat when a CLIP clip asks for more frames
    /// than the range holds).
    pub indices: Vec<u32>,
    /// The frames of the range sampled from (all the clip's without start and end times).
    pub range_frames: u32,
    /// Sampled frames a second: `len(indices) / range_frames * fps`, as both references
    /// compute it (`sample_fps`, `VideoMetadata.sampled_fps`).
    pub sample_fps: f64,
}

/// Why a clip has no frame plan: each a case the references raise on (or divide by zero in).
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SamplingError {
    #[error("total_frames must be at least 1: the clip has no frames")]
    NoFrames,
    #[error("total_frames is {0}, over the {MAX_CLIP_FRAMES} frames a frame plan takes")]
    TooManyFrames(u64),
    #[error("video_fps (the clip's average frame rate) must be positive and finite, not {0}")]
    ClipFps(f64),
    #[error("fps must be positive and finite, not {0}")]
    Fps(f64),
    #[error("temporal_patch_size must be 1..=8, not {0}")]
    TemporalPatch(u32),
    #[error("num_frames must be at least 1: a CLIP clip needs a frame")]
    NoClipFrames,
    #[error("{name} must be a finite number of seconds, not {value}")]
    Time { name: &'static str, value: f64 },
    #[error(
        "video_start {} and video_end {} hold frames {first} to {last} of {total}: a range needs \
         two frames",
        seconds(.start),
        seconds(.end)
    )]
    EmptyRange {
        first: i64,
        last: i64,
        total: u64,
        start: Option<f64>,
        end: Option<f64>,
    },
    #[error(
        "the {rule} rule samples {frames} frames (nframes, or fps within min_frames and \
         max_frames) of a range of {available}: it needs {least} to {available}"
    )]
    FrameCount {
        rule: &'static str,
        frames: u32,
        available: u32,
        least: u32,
    },
}

/// A clip time as an error message writes it.
fn seconds(time: &Option<f64>) -> String {
    time.map_or_else(|| "not given".to_string(), |t| format!("{t} s"))
}

/// Checks the clip and returns the (first, last) frame of the range its times hold:
/// `qwen-vl-utils`' `calculate_video_frame_range`. A time is clamped to the clip; the start
/// rounds up to a frame, the end down; a range must hold two frames.
fn frame_range(
    clip: Clip,
    start: Option<f64>,
    end: Option<f64>,
) -> Result<(u32, u32), SamplingError> {
    if clip.total_frames == 0 {
        return Err(SamplingError::NoFrames);
    }
    if clip.total_frames > MAX_CLIP_FRAMES {
        return Err(SamplingError::TooManyFrames(clip.total_frames));
    }
    if !(clip.fps.is_finite() && clip.fps > 0.0) {
        return Err(SamplingError::ClipFps(clip.fps));
    }
    for (name, time) in [("video_start", start), ("video_end", end)] {
        if let Some(value) = time.filter(|t| !t.is_finite()) {
            return Err(SamplingError::Time { name, value });
        }
    }
    let last_frame = clip.total_frames as i64 - 1;
    if start.is_none() && end.is_none() {
        return Ok((0, last_frame as u32));
    }
    let duration = clip.total_frames as f64 / clip.fps;
    // Python's max(0.0, min(t, duration)) for a finite t.
    let clamp = |t: f64| t.min(duration).max(0.0);
    let first = start.map_or(0, |t| (clamp(t) * clip.fps).ceil() as i64);
    let last = end.map_or(last_frame, |t| {
        ((clamp(t) * clip.fps).floor() as i64).min(last_frame)
    });
    if first >= last {
        return Err(SamplingError::EmptyRange {
            first,
            last,
            total: clip.total_frames,
            start,
            end,
        });
    }
    Ok((first as u32, last as u32))
}

/// `qwen-vl-utils`' `smart_nframes` over a range of `total` frames.
fn qwen_count(count: Count, total: u32, clip_fps: f64, factor: u32) -> Result<u32, SamplingError> {
    let f = factor as f64;
    let n = match count {
        // round_by_factor: Python's round, half to even.
        Count::Frames(n) => (n as f64 / f).round_ties_even() * f,
        Count::Fps {
            fps,
            min_frames,
            max_frames,
        } => {
            let least = (min_frames as f64 / f).ceil() * f;
            let most = (max_frames as f64 / f).floor() * f;
            let n = total as f64 / clip_fps * fps;
            ((n.max(least).min(most).min(total as f64)) / f).floor() * f
        }
    };
    if !(f <= n && n <= total as f64) {
        return Err(SamplingError::FrameCount {
            rule: Rule::QwenVlUtils.name(),
            frames: n as u32,
            available: total,
            least: factor,
        });
    }
    Ok(n as u32)
}

/// transformers' `Qwen2VLVideoProcessor.sample_frames` count over a range of `total` frames
/// (`min_frames` taken as it is, not rounded to the patch).
fn transformers_count(
    count: Count,
    total: u32,
    clip_fps: f64,
    factor: u32,
) -> Result<u32, SamplingError> {
    let f = factor as f64;
    let n = match count {
        Count::Frames(n) => (n as f64 / f).round_ties_even() * f,
        Count::Fps {
            fps,
            min_frames,
            max_frames,
        } => {
            let most = (max_frames.min(total) as f64 / f).floor() * f;
            let n = total as f64 / clip_fps * fps;
            (n.max(min_frames as f64).min(most).min(total as f64) / f).floor() * f
        }
    };
    // Over the range it raises; zero frames it divides by (`total / num_frames`).
    if !(1.0 <= n && n <= total as f64) {
        return Err(SamplingError::FrameCount {
            rule: Rule::Transformers.name(),
            frames: n as u32,
            available: total,
            least: 1,
        });
    }
    Ok(n as u32)
}

/// The frames `sampling` reads of `clip`.
pub fn sample(clip: Clip, sampling: &Sampling) -> Result<Sampled, SamplingError> {
    if !(1..=8).contains(&sampling.temporal_patch_size) {
        return Err(SamplingError::TemporalPatch(sampling.temporal_patch_size));
    }
    if let Count::Fps { fps, .. } = sampling.count {
        if !(fps.is_finite() && fps > 0.0) {
            return Err(SamplingError::Fps(fps));
        }
    }
    let (first, last) = frame_range(clip, sampling.start, sampling.end)?;
    let total = last - first + 1;
    let factor = sampling.temporal_patch_size;
    let indices = match sampling.rule {
        Rule::QwenVlUtils => {
            let n = qwen_count(sampling.count, total, clip.fps, factor)?;
            linspace_rounded(first, last, n)
        }
        Rule::Transformers => {
            let n = transformers_count(sampling.count, total, clip.fps, factor)?;
            arange_truncated(total, n)
                .into_iter()
                .map(|i| first + i)
                .collect()
        }
    };
    Ok(sampled(indices, total, clip.fps))
}

/// The `frames` frames of a CLIP clip: spread from the first frame of the clip's range to its
/// last as the default rule spreads them (`linspace`, rounded), with no temporal patch; a
/// range of fewer frames than `frames` repeats some.
pub fn uniform(
    clip: Clip,
    start: Option<f64>,
    end: Option<f64>,
    frames: u32,
) -> Result<Sampled, SamplingError> {
    if frames == 0 {
        return Err(SamplingError::NoClipFrames);
    }
    let (first, last) = frame_range(clip, start, end)?;
    let total = last - first + 1;
    Ok(sampled(
        linspace_rounded(first, last, frames),
        total,
        clip.fps,
    ))
}

fn sampled(indices: Vec<u32>, range_frames: u32, fps: f64) -> Sampled {
    let sample_fps = indices.len() as f64 / range_frames as f64 * fps;
    Sampled {
        indices,
        range_frames,
        sample_fps,
    }
}

/// `torch.linspace(start, end, steps).round()` on the CPU, bit for bit: float32, the step
/// `(end - start) / (steps - 1)`, the first half counted up from `start` and the second down
/// from `end`, each value one fused multiply-add (as torch's AVX2 and AVX-512 kernels compile
/// it), rounded half to even. `start` and `end` are under 2^24, so exact in float32.
pub fn linspace_rounded(start: u32, end: u32, steps: u32) -> Vec<u32> {
    if steps <= 1 {
        return (0..steps).map(|_| start).collect();
    }
    let (s, e) = (start as f32, end as f32);
    let step = (e - s) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            let v = if i < half {
                step.mul_add(i as f32, s)
            } else {
                (-step).mul_add((steps - 1 - i) as f32, e)
            };
            v.round_ties_even() as u32
        })
        .collect()
}

/// Lanes of torch's `Vectorized<float>` in its AVX2 (and default) CPU kernels.
const TORCH_LANES: usize = 8;

/// `torch.arange(0, total, total / n).int()` on the CPU, bit for bit. The length is
/// `ceil(total / (total / n))` in float64 (it can be `n + 1`). Values are float64 rounded to
/// float32, then truncated: torch fills blocks of two vectors of 8 lanes, each vector's first
/// value `step * i` rounded to float32 and each lane that float32 plus `k * step` in float64,
/// and the last values, past the blocks, one by one as `step * i`.
pub fn arange_truncated(total: u32, n: u32) -> Vec<u32> {
    let step = total as f64 / n as f64;
    let len = (total as f64 / step).ceil() as usize;
    let mut out = Vec::with_capacity(len);
    let blocks = len / (2 * TORCH_LANES) * (2 * TORCH_LANES);
    for base_index in (0..blocks).step_by(TORCH_LANES) {
        let base = (step * base_index as f64) as f32;
        for k in 0..TORCH_LANES {
            let v = (base as f64 + k as f64 * step) as f32;
            out.push(v as u32);
        }
    }
    for i in blocks..len {
        out.push((step * i as f64) as f32 as u32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clip(total_frames: u64, fps: f64) -> Clip {
        Clip { total_frames, fps }
    }

    fn fps_count(fps: f64, min_frames: u32, max_frames: u32) -> Count {
        Count::Fps {
            fps,
            min_frames,
            max_frames,
        }
    }

    #[test]
    fn two_frames_a_second_from_the_first_frame_to_the_last() {
        // 10 s at 30 fps: 20 frames over frames 0..=299.
        let s = sample(clip(300, 30.0), &Sampling::default()).unwrap();
        assert_eq!(s.indices.len(), 20);
        assert_eq!((s.indices[0], s.indices[19]), (0, 299));
        assert_eq!(s.range_frames, 300);
        assert_eq!(s.sample_fps, 2.0);
    }

    #[test]
    fn one_frame_has_no_plan_and_two_frames_are_the_least() {
        let one = sample(clip(1, 25.0), &Sampling::default()).unwrap_err();
        assert!(
            matches!(one, SamplingError::FrameCount { frames: 0, .. }),
            "{one}"
        );
        for rule in [Rule::QwenVlUtils, Rule::Transformers] {
            let sampling = Sampling {
                rule,
                ..Sampling::default()
            };
            assert!(sample(clip(1, 25.0), &sampling).is_err(), "{rule:?}");
            // Fewer frames than min_frames: every frame, rounded down to the patch.
            assert_eq!(sample(clip(2, 25.0), &sampling).unwrap().indices, [0, 1]);
            assert_eq!(sample(clip(3, 25.0), &sampling).unwrap().indices.len(), 2);
        }
        assert_eq!(
            sample(clip(3, 25.0), &Sampling::default()).unwrap().indices,
            [0, 2]
        );
        assert_eq!(
            sample(clip(0, 25.0), &Sampling::default()),
            Err(SamplingError::NoFrames)
        );
    }

    #[test]
    fn short_clips_get_min_frames_and_long_ones_max_frames() {
        // 1 s at 24 fps: 2 frames a second is under min_frames (4).
        let s = sample(clip(24, 24.0), &Sampling::default()).unwrap();
        assert_eq!(s.indices, [0, 8, 15, 23]);
        // 30 min at 30 fps: 3,600 at 2 fps, capped at 768.
        let s = sample(clip(54_000, 30.0), &Sampling::default()).unwrap();
        assert_eq!(s.indices.len(), 768);
        assert_eq!(*s.indices.last().unwrap(), 53_999);
        let capped = Sampling {
            count: fps_count(2.0, 4, 101),
            ..Sampling::default()
        };
        assert_eq!(
            sample(clip(54_000, 30.0), &capped).unwrap().indices.len(),
            100
        );
    }

    #[test]
    fn counts_round_to_the_temporal_patch() {
        // 7 s at 1 fps of a 10 fps clip: 7 frames, down to 6.
        let seven = Sampling {
            count: fps_count(1.0, 4, 768),
            ..Sampling::default()
        };
        assert_eq!(sample(clip(70, 10.0), &seven).unwrap().indices.len(), 6);
        // nframes rounds half to even: 5 / 2 = 2.5 to 2, 7 / 2 = 3.5 to 4.
        for (asked, got) in [(5, 4), (7, 8), (6, 6)] {
            for rule in [Rule::QwenVlUtils, Rule::Transformers] {
                let s = Sampling {
                    rule,
                    count: Count::Frames(asked),
                    ..Sampling::default()
                };
                assert_eq!(sample(clip(100, 10.0), &s).unwrap().indices.len(), got);
            }
        }
        // An odd min_frames: qwen-vl-utils rounds it up, transformers' count rounds it down.
        for (rule, got) in [(Rule::QwenVlUtils, 6), (Rule::Transformers, 4)] {
            let s = Sampling {
                rule,
                count: fps_count(2.0, 5, 768),
                ..Sampling::default()
            };
            assert_eq!(sample(clip(30, 30.0), &s).unwrap().indices.len(), got);
        }
        let bad = Sampling {
            temporal_patch_size: 0,
            ..Sampling::default()
        };
        assert_eq!(
            sample(clip(30, 30.0), &bad),
            Err(SamplingError::TemporalPatch(0))
        );
    }

    #[test]
    fn start_and_end_times_narrow_the_range() {
        // 10 s at 30 fps, 2 s to 4.5 s: frames 60..=135, 5 frames at 2 fps -> 4.
        let s = Sampling {
            start: Some(2.0),
            end: Some(4.5),
            ..Sampling::default()
        };
        let got = sample(clip(300, 30.0), &s).unwrap();
        assert_eq!(got.range_frames, 76);
        assert_eq!(got.indices, [60, 85, 110, 135]);
        // transformers' rule over the same range, from its first frame.
        let t = Sampling {
            rule: Rule::Transformers,
            ..s
        };
        assert_eq!(
            sample(clip(300, 30.0), &t).unwrap().indices,
            [60, 79, 98, 117]
        );
        // Times outside the clip are clamped; a start past the end is an error.
        let wide = Sampling {
            start: Some(-5.0),
            end: Some(99.0),
            ..Sampling::default()
        };
        assert_eq!(sample(clip(300, 30.0), &wide).unwrap().range_frames, 300);
        let backwards = Sampling {
            start: Some(5.0),
            end: Some(4.0),
            ..Sampling::default()
        };
        assert!(matches!(
            sample(clip(300, 30.0), &backwards),
            Err(SamplingError::EmptyRange {
                first: 150,
                last: 120,
                ..
            })
        ));
        let nan = Sampling {
            end: Some(f64::NAN),
            ..Sampling::default()
        };
        assert!(matches!(
            sample(clip(300, 30.0), &nan),
            Err(SamplingError::Time {
                name: "video_end",
                ..
            })
        ));
    }

    #[test]
    fn bad_rates_are_errors() {
        for fps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = sample(clip(30, fps), &Sampling::default()).unwrap_err();
            assert!(matches!(err, SamplingError::ClipFps(_)), "{err}");
            let s = Sampling {
                count: fps_count(fps, 4, 768),
                ..Sampling::default()
            };
            assert!(matches!(
                sample(clip(30, 30.0), &s),
                Err(SamplingError::Fps(_))
            ));
        }
        assert_eq!(
            sample(clip(MAX_CLIP_FRAMES + 1, 30.0), &Sampling::default()),
            Err(SamplingError::TooManyFrames(MAX_CLIP_FRAMES + 1))
        );
    }

    #[test]
    fn the_two_rules_differ_at_the_end() {
        // 60 s at 60 fps: 120 frames each; qwen-vl-utils ends on the last frame, transformers
        // 29 frames before it.
        let clip = clip(3600, 60.0);
        let q = sample(clip, &Sampling::default()).unwrap();
        let t = sample(
            clip,
            &Sampling {
                rule: Rule::Transformers,
                ..Sampling::default()
            },
        )
        .unwrap();
        assert_eq!(q.indices.len(), t.indices.len());
        assert_eq!(*q.indices.last().unwrap(), 3599);
        assert_eq!(*t.indices.last().unwrap(), 3570);
        assert_eq!(t.indices[..3], [0, 30, 60]);
    }

    #[test]
    fn linspace_rounds_half_to_even_in_float32() {
        // 0, 1.5, 3: 1.5 rounds to 2; 0, 0.5, 1: 0.5 rounds to 0.
        assert_eq!(linspace_rounded(0, 3, 3), [0, 2, 3]);
        assert_eq!(linspace_rounded(0, 1, 3), [0, 0, 1]);
        assert_eq!(linspace_rounded(7, 7, 1), [7]);
        assert!(linspace_rounded(7, 9, 0).is_empty());
        // A float32 step: torch.linspace(1033, 8806, 122)[15] is 1996.5951 in float32 (FMA),
        // 1996.5950 rounded twice.
        let v = linspace_rounded(1033, 8806, 122);
        assert_eq!((v.len(), v[0], v[121]), (122, 1033, 8806));
    }

    #[test]
    fn arange_can_hold_one_more_value_than_asked() {
        assert_eq!(arange_truncated(10, 4), [0, 2, 5, 7]);
        assert_eq!(arange_truncated(4, 4), [0, 1, 2, 3]);
        // 17 values past the first block of 16: the lane path and the tail agree.
        assert_eq!(
            arange_truncated(34, 17),
            (0..34).step_by(2).collect::<Vec<_>>()
        );
        // ceil(total / (total / n)) is n + 1 where total / n rounds down in float64.
        let over = (1..2000u32)
            .flat_map(|t| (1..=t.min(64)).map(move |n| (t, n)))
            .find(|&(t, n)| arange_truncated(t, n).len() as u32 == n + 1);
        if let Some((t, n)) = over {
            assert_eq!((t as f64 / (t as f64 / n as f64)).ceil() as u32, n + 1);
        }
    }

    #[test]
    fn a_clip_of_t_frames_repeats_frames_when_short() {
        let c = uniform(clip(300, 30.0), None, None, 8).unwrap();
        assert_eq!(c.indices, [0, 43, 85, 128, 171, 214, 256, 299]);
        assert_eq!(
            uniform(clip(3, 30.0), None, None, 5).unwrap().indices,
            [0, 0, 1, 2, 2]
        );
        assert_eq!(
            uniform(clip(1, 30.0), None, None, 2).unwrap().indices,
            [0, 0]
        );
        assert_eq!(
            uniform(clip(3, 30.0), None, None, 0),
            Err(SamplingError::NoClipFrames)
        );
    }
}
