//! The size every sampled frame of a clip is resized to on the Qwen path, its patch grid and
//! the seconds a temporal patch spans, before anything is decoded.
//!
//! The rule is `qwen-vl-utils` 0.0.14's `fetch_video`: a frame budget of pixels between
//! `min_pixels` (128 tokens of 28x28 pixels) and the smaller of 768 tokens and the clip's share
//! of `total_pixels` (90% of a 128,000-token context, `MODEL_SEQ_LEN`) — `total_pixels /
//! frames * temporal_patch_size`, never under `min_pixels * 1.05` — then its own `smart_resize`
//! to sides that are multiples of `patch_size * merge_size`. Its `smart_resize` is not
//! transformers' (the image rule of the interleaved kind): the rounded sides are held at one
//! merge block before the budget is checked, not after, so it is written here for video.
//! `total_pixels / frames` is in float64 as in Python (transformers' own video processor,
//! with `cap_pixels_per_frame`, divides integers and can differ by a pixel of budget).

use thiserror::Error;

/// The widest aspect either reference takes (`MAX_RATIO`).
pub const MAX_RATIO: f64 = 200.0;
/// Tokens a frame has at least (`VIDEO_MIN_TOKEN_NUM`).
pub const VIDEO_MIN_TOKENS: u64 = 128;
/// Tokens a frame has at most (`VIDEO_MAX_TOKEN_NUM`).
pub const VIDEO_MAX_TOKENS: u64 = 768;
/// The context the default total budget is 90% of (`MODEL_SEQ_LEN`, which `qwen-vl-utils`
/// reads from the environment; pass `total_pixels` for another).
pub const MODEL_SEQ_LEN: u64 = 128_000;

/// How the frames of a clip are sized: the Qwen2-VL video processor's patch geometry and
/// `qwen-vl-utils`' pixel budgets (`None`: its default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizing {
    /// Pixels a patch side (14; Qwen3-VL's 16).
    pub patch_size: u32,
    /// Patches a merge block side (`SPATIAL_MERGE_SIZE`, 2).
    pub merge_size: u32,
    /// Frames a temporal patch (2): the budget's `FRAME_FACTOR` and the grid's frames.
    pub temporal_patch_size: u32,
    /// A frame's least pixels (default `VIDEO_MIN_TOKENS` merge blocks).
    pub min_pixels: Option<f64>,
    /// A cap under the frame's budget (never raises it).
    pub max_pixels: Option<f64>,
    /// The clip's pixels in all (default 90% of `MODEL_SEQ_LEN` merge blocks).
    pub total_pixels: Option<f64>,
}

impl Default for Sizing {
    fn default() -> Self {
        Sizing {
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: None,
            max_pixels: None,
            total_pixels: None,
        }
    }
}

/// The patch grid of a clip: temporal patches, rows and columns of patches
/// (`video_grid_thw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VideoGrid {
    pub t: u32,
    pub h: u32,
    pub w: u32,
}

/// Why a clip's frames have no size.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SizingError {
    #[error(
        "patch_size must be 1..=64, merge_size 1..=8 and temporal_patch_size 1..=8, not {0}, \
         {1} and {2}"
    )]
    Geometry(u32, u32, u32),
    #[error("{name} must be a positive finite number of pixels, not {value}")]
    Pixels { name: &'static str, value: f64 },
    #[error("nframes must be at least 1: a clip of no frames has no size")]
    NoFrames,
    #[error(
        "height {height} and width {width}: the frame has no size, its aspect is over {MAX_RATIO} or \
         a side is 0"
    )]
    Aspect { height: u32, width: u32 },
    #[error("the frame budget is under its least pixels: max_pixels {max} < min_pixels {min}")]
    Bounds { min: f64, max: f64 },
    #[error(
        "a {width}x{height} frame resizes to {resized_width}x{resized_height}: a side under one \
         merge block"
    )]
    UnderOneBlock {
        height: u32,
        width: u32,
        resized_height: u32,
        resized_width: u32,
    },
}

impl Sizing {
    /// What the sizes cannot be computed with.
    pub fn validate(&self) -> Result<(), SizingError> {
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        if !(1..=64).contains(&p) || !(1..=8).contains(&m) || !(1..=8).contains(&t) {
            return Err(SizingError::Geometry(p, m, t));
        }
        let given = [
            ("min_pixels", self.min_pixels),
            ("max_pixels", self.max_pixels),
            ("total_pixels", self.total_pixels),
        ];
        for (name, value) in given {
            if let Some(value) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(SizingError::Pixels { name, value });
            }
        }
        Ok(())
    }

    /// Pixels a side of one merge block: resized sides are multiples of it.
    pub fn factor(&self) -> u32 {
        self.patch_size * self.merge_size
    }

    /// A frame's (least, most) pixels in a clip of `frames` sampled frames, as
    /// `fetch_video` computes them (Python's float arithmetic, in its order).
    pub fn pixel_bounds(&self, frames: u32) -> Result<(f64, f64), SizingError> {
        if frames == 0 {
            return Err(SizingError::NoFrames);
        }
        let block = (self.factor() as u64).pow(2);
        let min = self.min_pixels.unwrap_or((VIDEO_MIN_TOKENS * block) as f64);
        let total = self
            .total_pixels
            .unwrap_or((MODEL_SEQ_LEN * block) as f64 * 0.9);
        let share = total / frames as f64 * self.temporal_patch_size as f64;
        let budget = ((VIDEO_MAX_TOKENS * block) as f64)
            .min(share)
            .max((min * 1.05).trunc());
        let max = self.max_pixels.map_or(budget, |cap| cap.min(budget));
        Ok((min, max))
    }

    /// The (height, width) every frame of a `height x width` clip of `frames` sampled frames is
    /// resized to: `qwen-vl-utils`' `smart_resize` under [`Sizing::pixel_bounds`].
    pub fn resized(&self, height: u32, width: u32, frames: u32) -> Result<(u32, u32), SizingError> {
        self.validate()?;
        let (min_pixels, max_pixels) = self.pixel_bounds(frames)?;
        if max_pixels < min_pixels {
            return Err(SizingError::Bounds {
                min: min_pixels,
                max: max_pixels,
            });
        }
        let (h, w) = (height as f64, width as f64);
        if height == 0 || width == 0 || h.max(w) / h.min(w) > MAX_RATIO {
            return Err(SizingError::Aspect { height, width });
        }
        let f = self.factor() as f64;
        // round_by_factor is Python's round: half to even.
        let mut h_bar = f.max((h / f).round_ties_even() * f);
        let mut w_bar = f.max((w / f).round_ties_even() * f);
        // `height * width` is an exact integer in Python; under 2^53 here, so exact too.
        let area = (height as u64 * width as u64) as f64;
        if h_bar * w_bar > max_pixels {
            let beta = (area / max_pixels).sqrt();
            h_bar = (h / beta / f).floor() * f;
            w_bar = (w / beta / f).floor() * f;
        } else if h_bar * w_bar < min_pixels {
            let beta = (min_pixels / area).sqrt();
            h_bar = (h * beta / f).ceil() * f;
            w_bar = (w * beta / f).ceil() * f;
        }
        let (resized_height, resized_width) = (h_bar as u32, w_bar as u32);
        // Scaled down at an aspect near MAX_RATIO, a side can floor to 0: the reference hands
        // that to its resize, which fails.
        if h_bar < f || w_bar < f {
            return Err(SizingError::UnderOneBlock {
                height,
                width,
                resized_height,
                resized_width,
            });
        }
        Ok((resized_height, resized_width))
    }

    /// The grid of `frames` frames resized to `height x width`: the frames padded to whole
    /// temporal patches (the processor repeats the last), the sides in patches.
    pub fn grid(&self, frames: u32, height: u32, width: u32) -> VideoGrid {
        VideoGrid {
            t: frames.div_ceil(self.temporal_patch_size),
            h: height / self.patch_size,
            w: width / self.patch_size,
        }
    }

    /// Seconds a temporal patch spans at `sample_fps` sampled frames a second: Qwen2.5-VL's
    /// `second_per_grid_ts`, `temporal_patch_size / sampled_fps`, which its M-RoPE scales the
    /// temporal positions by.
    pub fn second_per_grid_ts(&self, sample_fps: f64) -> f64 {
        self.temporal_patch_size as f64 / sample_fps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budgets_are_qwen_vl_utils() {
        let s = Sizing::default();
        // 128 and 768 tokens of 28x28; 90% of 128,000 tokens over 20 frames, times 2.
        assert_eq!(s.pixel_bounds(20).unwrap(), (100_352.0, 602_112.0));
        let (_, max) = s.pixel_bounds(768).unwrap();
        assert_eq!(max, 100_352_000.0 * 0.9 / 768.0 * 2.0);
        // Never under min_pixels * 1.05, truncated.
        let (_, max) = s.pixel_bounds(100_000).unwrap();
        assert_eq!(max, 105_369.0);
        let capped = Sizing {
            max_pixels: Some(200_000.0),
            ..s
        };
        assert_eq!(capped.pixel_bounds(20).unwrap().1, 200_000.0);
        let raised = Sizing {
            max_pixels: Some(1e9),
            ..s
        };
        assert_eq!(
            raised.pixel_bounds(20).unwrap().1,
            602_112.0,
            "a cap never raises"
        );
    }

    #[test]
    fn frames_resize_to_merge_blocks_within_the_budget() {
        let s = Sizing::default();
        // 640x480 (307,200 pixels) is inside [100,352, 602,112]: rounded to 28s (half to even).
        assert_eq!(s.resized(480, 640, 20).unwrap(), (476, 644));
        // 1920x1080 is over 602,112: scaled down, floored to 28s.
        let (h, w) = s.resized(1080, 1920, 20).unwrap();
        assert!(
            h as f64 * w as f64 <= 602_112.0 && h % 28 == 0 && w % 28 == 0,
            "{h}x{w}"
        );
        assert_eq!((h, w), (560, 1008));
        // 320x240 is under 100,352: scaled up, ceiled to 28s.
        let (h, w) = s.resized(240, 320, 20).unwrap();
        assert!(
            h as f64 * w as f64 >= 100_352.0 && h % 28 == 0 && w % 28 == 0,
            "{h}x{w}"
        );
        // Many frames share the total budget: 768 frames of 1080p get ~235,200 pixels each.
        let (h, w) = s.resized(1080, 1920, 768).unwrap();
        assert!((h * w) as f64 <= 100_352_000.0 * 0.9 / 768.0 * 2.0);
    }

    #[test]
    fn extreme_and_empty_frames_are_errors() {
        let s = Sizing::default();
        assert!(matches!(
            s.resized(10, 2001, 4),
            Err(SizingError::Aspect { .. })
        ));
        assert!(matches!(
            s.resized(0, 100, 4),
            Err(SizingError::Aspect { .. })
        ));
        assert!(
            s.resized(10, 2000, 4).is_ok(),
            "an aspect of exactly 200 is taken"
        );
        // 200:1 scaled down into a small budget floors its short side to 0.
        assert!(matches!(
            s.resized(40, 8000, 100_000),
            Err(SizingError::UnderOneBlock {
                resized_height: 0,
                ..
            })
        ));
        assert_eq!(s.resized(480, 640, 0), Err(SizingError::NoFrames));
        let bad = Sizing {
            min_pixels: Some(f64::NAN),
            ..s
        };
        assert!(matches!(
            bad.resized(480, 640, 4),
            Err(SizingError::Pixels {
                name: "min_pixels",
                ..
            })
        ));
        let inverted = Sizing {
            max_pixels: Some(50_000.0),
            ..s
        };
        assert!(matches!(
            inverted.resized(480, 640, 4),
            Err(SizingError::Bounds { .. })
        ));
        let geometry = Sizing { patch_size: 0, ..s };
        assert_eq!(geometry.validate(), Err(SizingError::Geometry(0, 2, 2)));
    }

    #[test]
    fn the_grid_and_seconds_per_temporal_patch() {
        let s = Sizing::default();
        assert_eq!(
            s.grid(20, 476, 644),
            VideoGrid {
                t: 10,
                h: 34,
                w: 46
            }
        );
        assert_eq!(s.grid(5, 28, 28).t, 3, "padded to whole temporal patches");
        assert_eq!(s.second_per_grid_ts(2.0), 1.0);
        assert_eq!(s.second_per_grid_ts(0.5), 4.0);
    }
}
