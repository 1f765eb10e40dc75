//! Why a clip yields no frames, and the caps checked from its header before decoding: shared by
//! the container input (`ffmpeg::input`) and the decoder (`decode`).

use crate::error::Reason;

use super::ffmpeg::library::FfmpegUnavailable;

/// Limits checked from the stream header before anything is decoded (and on every frame).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Most pixels of one coded frame (width x height).
    pub max_pixels: u64,
    /// Most seconds of a clip (0.0: no cap).
    pub max_seconds: f64,
}

impl Caps {
    pub fn check_pixels(&self, width: u64, height: u64) -> Result<(), VideoFault> {
        if width.saturating_mul(height) > self.max_pixels {
            return Err(VideoFault::TooManyPixels {
                width,
                height,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }

    pub fn check_seconds(&self, seconds: f64) -> Result<(), VideoFault> {
        if self.max_seconds > 0.0 && seconds > self.max_seconds {
            return Err(VideoFault::TooLong {
                seconds,
                max_seconds: self.max_seconds,
            });
        }
        Ok(())
    }
}

/// Why a clip yields no frames.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum VideoFault {
    /// No usable FFmpeg in this process: the environment's fault, never a sample's.
    #[error(transparent)]
    Unavailable(#[from] FfmpegUnavailable),
    /// The container does not open or parse, is truncated, or a packet does not decode.
    #[error("{0}")]
    Corrupt(String),
    #[error("the file holds no video stream")]
    NoVideoStream,
    #[error("the video stream's codec {0:?} has no decoder in this FFmpeg")]
    UnsupportedCodec(String),
    #[error("a frame of {width}x{height} is over max_pixels={max_pixels}")]
    TooManyPixels {
        width: u64,
        height: u64,
        max_pixels: u64,
    },
    #[error("the clip lasts {seconds:.3} s, over max_seconds={max_seconds}")]
    TooLong { seconds: f64, max_seconds: f64 },
    #[error("frame {index} was asked for, but the clip ends after {frames} decoded frames")]
    PastTheEnd { index: u32, frames: u64 },
}

impl VideoFault {
    /// The skip reason a loader counts this under (None: not the sample's fault).
    pub fn reason(&self) -> Option<Reason> {
        match self {
            VideoFault::Unavailable(_) => None,
            VideoFault::Corrupt(_) | VideoFault::PastTheEnd { .. } => Some(Reason::CorruptVideo),
            VideoFault::NoVideoStream => Some(Reason::NoVideoStream),
            VideoFault::UnsupportedCodec(_) => Some(Reason::UnsupportedCodec),
            VideoFault::TooManyPixels { .. } => Some(Reason::TooManyPixels),
            VideoFault::TooLong { .. } => Some(Reason::VideoTooLong),
        }
    }
}
