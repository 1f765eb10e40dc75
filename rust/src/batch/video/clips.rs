//! A video-text sample as a CLIP clip: which samples are clips (judged from the container's
//! header alone, by the count pass and the loader alike, so both number the same clips), and a
//! clip's `T` frames sampled uniformly, decoded and fitted straight into its slot of the batch,
//! `uint8 [T, 3, S, S]`.

use crate::batch::kit::sample::{caption, image_bytes, Rejection, SampleSpec};
use crate::error::Reason;
use crate::read::group::RawSample;

use crate::video::decode::{probe, Fit, OpenClip};
use crate::video::fault::{Caps, VideoFault};
use crate::video::sampling::{uniform, Clip};
use crate::video::StreamInfo;

pub use crate::defaults::VIDEO_KEYS;

/// What makes a sample a clip: its members (`sample.image_keys` are the video members tried in
/// order; `sample.max_pixels` caps a frame) and the caps checked from the header.
#[derive(Clone, Debug)]
pub struct ClipSpec {
    pub sample: SampleSpec,
    /// Most seconds a clip may last (0.0: no cap).
    pub max_seconds: f64,
    pub max_member_bytes: u64,
    /// Where a sample's clip starts and ends in its video, if it says.
    pub times: Option<ClipTimes>,
}

/// A JSON member's two fields that give the seconds a sample's clip starts and ends at in its
/// video (InternVid-style: `{"start": 12.5, "end": 20.0}`). A sample without the member or the
/// fields is its whole video; fields that are not numbers refuse it (`bad_json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClipTimes {
    pub member: String,
    pub start: String,
    pub end: String,
}

impl ClipTimes {
    /// The (start, end) seconds of `raw`'s clip: None each where it does not say.
    pub fn of(&self, raw: &RawSample) -> Result<(Option<f64>, Option<f64>), Rejection> {
        let Some(bytes) = raw.get(&self.member) else {
            return Ok((None, None));
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
            let member = &self.member;
            (
                Reason::BadJson,
                format!("{member:?} member is not JSON: {e}"),
            )
        })?;
        let field = |name: &str| -> Result<Option<f64>, Rejection> {
            match value.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Number(n)) => match n.as_f64() {
                    Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(t)),
                    _ => Err((
                        Reason::BadJson,
                        format!("{name:?} is {n}, not seconds >= 0"),
                    )),
                },
                Some(other) => Err((
                    Reason::BadJson,
                    format!("{name:?} is {other}, not a number of seconds"),
                )),
            }
        };
        let (start, end) = (field(&self.start)?, field(&self.end)?);
        if let (Some(a), Some(b)) = (start, end) {
            if a >= b {
                let detail = format!("the clip starts at {a} s, not before its end at {b} s");
                return Err((Reason::BadJson, detail));
            }
        }
        Ok((start, end))
    }
}

impl ClipSpec {
    pub fn caps(&self) -> Caps {
        Caps {
            max_pixels: self.sample.max_pixels,
            max_seconds: self.max_seconds,
        }
    }
}

/// How a clip's frames are laid out in its slot: `frames` frames, each `size` pixels square.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClipShape {
    pub frames: u32,
    pub size: u32,
}

impl ClipShape {
    /// Bytes of one clip's slot: `frames * 3 * size * size`.
    pub fn slot_bytes(&self) -> usize {
        self.frames as usize * 3 * self.size as usize * self.size as usize
    }
}

/// A clip decoded into its slot: its caption, the frame numbers sampled and the frames the
/// decoder output for them.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedClip {
    pub text: String,
    pub indices: Vec<u32>,
    pub frames_decoded: u64,
}

/// A video fault as the reason a sample is refused for (a missing FFmpeg is not the sample's
/// fault: the caller stops on it).
pub fn rejection(fault: VideoFault) -> Result<Rejection, VideoFault> {
    match fault.reason() {
        Some(reason) => Ok((reason, fault.to_string())),
        None => Err(fault),
    }
}

/// The sample's video member: the first of `spec.sample.image_keys` it holds.
fn video_bytes<'a>(raw: &'a RawSample, spec: &ClipSpec) -> Result<&'a [u8], Rejection> {
    image_bytes(raw, &spec.sample.image_keys).map_err(|_| {
        let keys = &spec.sample.image_keys;
        (
            Reason::MissingVideo,
            format!("no member with extension {keys:?}"),
        )
    })
}

/// The sample's video header, or why the sample is not a clip: a defect, no video member or
/// caption, or a header that does not open, holds no video stream, names a codec this FFmpeg
/// cannot decode, or is over the caps. Decodes no frame.
pub fn judge(
    raw: &RawSample,
    spec: &ClipSpec,
) -> Result<Result<StreamInfo, Rejection>, VideoFault> {
    let checked = || -> Result<&[u8], Rejection> {
        if let Some(defect) = &raw.defect {
            return Err(defect.clone());
        }
        let bytes = video_bytes(raw, spec)?;
        caption(raw, &spec.sample.caption)?;
        if let Some(times) = &spec.times {
            times.of(raw)?;
        }
        Ok(bytes)
    };
    let bytes = match checked() {
        Ok(bytes) => bytes,
        Err(rejected) => return Ok(Err(rejected)),
    };
    match probe(bytes, &spec.caps()) {
        Ok(info) => Ok(Ok(info)),
        Err(fault) => rejection(fault).map(Err),
    }
}

/// Decodes the clip of `raw` (already judged a clip) into `slot`: `shape.frames` frames spread
/// uniformly from its first frame to its last (`sampling::uniform`; those of its start..end
/// range where `spec.times` gives one), each the centred square of its displayed frame resized
/// to `shape.size`.
pub fn decode_clip(
    raw: &RawSample,
    spec: &ClipSpec,
    shape: ClipShape,
    slot: &mut [u8],
) -> Result<Result<DecodedClip, Rejection>, VideoFault> {
    let text = match caption(raw, &spec.sample.caption) {
        Ok(text) => text,
        Err(rejected) => return Ok(Err(rejected)),
    };
    let bytes = match video_bytes(raw, spec) {
        Ok(bytes) => bytes,
        Err(rejected) => return Ok(Err(rejected)),
    };
    let (start, end) = match spec.times.as_ref().map(|t| t.of(raw)).transpose() {
        Ok(times) => times.unwrap_or((None, None)),
        Err(rejected) => return Ok(Err(rejected)),
    };
    let decoded = (|| {
        let clip = OpenClip::open(bytes, &spec.caps())?;
        let info = clip.info();
        let total = clip.frame_total();
        let fps = if info.fps > 0.0 && info.fps.is_finite() {
            info.fps
        } else {
            1.0 // only sample_fps, which a CLIP clip does not report, depends on it
        };
        let clip_frames = Clip {
            total_frames: total,
            fps,
        };
        let sampled = uniform(clip_frames, start, end, shape.frames).map_err(|e| {
            VideoFault::Corrupt(format!("no {} frames to sample: {e}", shape.frames))
        })?;
        let size = (shape.size, shape.size);
        let frames_decoded = clip.decode_into(&sampled.indices, size, Fit::CentreSquare, slot)?;
        Ok(DecodedClip {
            text,
            indices: sampled.indices,
            frames_decoded,
        })
    })();
    match decoded {
        Ok(clip) => Ok(Ok(clip)),
        Err(fault) => rejection(fault).map(Err),
    }
}
