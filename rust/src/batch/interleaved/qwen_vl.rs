//! The vision spec of a model family: how an image of `height x width` pixels becomes its patch
//! grid, its run of image tokens in the text, and its rows of `pixel_values`. Another family is
//! another spec, not another kind.
//!
//! Qwen2-VL (and Qwen2.5-VL's image path): `smart_resize` to sides that are multiples of
//! `patch_size * merge_size` (28) with the pixels between `min_pixels` and `max_pixels`, the
//! aspect kept; a grid of 14-pixel patches; in the text `<|vision_start|>`, then one
//! `<|image_pad|>` per 2x2 block of patches, then `<|vision_end|>`; in `pixel_values` one row
//! per patch, rows in 2x2 merge blocks (block row, block column, row in block, column in
//! block), each row `[channel, temporal, y, x]` with the image repeated over the
//! `temporal_patch_size` frames, as `Qwen2VLImageProcessor` lays them out.

use crate::batch::kit::sample::Rejection;
use crate::error::Reason;
use crate::video::{Sampling, Sizing};

/// The widest aspect `smart_resize` takes (its processors refuse a wider one).
pub const MAX_ASPECT: f64 = 200.0;

/// The patch grid of one image: frames (1 for an image), rows and columns of patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub t: u32,
    pub h: u32,
    pub w: u32,
}

impl Grid {
    pub fn patches(&self) -> u64 {
        self.t as u64 * self.h as u64 * self.w as u64
    }
}

/// Qwen2-VL's image spec, with the ids of its three vision tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenVlSpec {
    pub patch_size: u32,
    pub merge_size: u32,
    pub temporal_patch_size: u32,
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub vision_start: u32,
    pub vision_end: u32,
    pub image_pad: u32,
    /// How a document's videos are read (None: a document with a video is refused).
    pub video: Option<QwenVideoSpec>,
}

/// Qwen2-VL's video rule (`qwen-vl-utils`' `fetch_video`, or transformers' sampler as an
/// option): which frames are sampled, the size each is resized to, and the id of
/// `<|video_pad|>`. A video's run is `<|vision_start|>`, one pad per merge block of each
/// temporal patch, `<|vision_end|>`; its grid is `(frames / temporal_patch_size, rows,
/// columns)`.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenVideoSpec {
    /// The rule and frame count (`start` and `end` unset: a document's video is all of it).
    pub sampling: Sampling,
    /// The pixel budgets (its geometry is the image spec's).
    pub sizing: Sizing,
    pub video_pad: u32,
    /// A video longer (by its header) is refused before anything is decoded (0.0: no cap).
    pub max_seconds: f64,
    /// Qwen2.5-VL's `vision_config.tokens_per_second`: temporal positions scaled by the seconds
    /// a temporal patch spans (None: Qwen2-VL's, one a temporal patch).
    pub tokens_per_second: Option<f64>,
}

impl QwenVlSpec {
    /// What a pipeline cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.patch_size) || !(1..=8).contains(&self.merge_size) {
            return Err(format!(
                "patch_size must be 1..=64 and merge_size 1..=8, not {} and {}",
                self.patch_size, self.merge_size
            ));
        }
        if !(1..=8).contains(&self.temporal_patch_size) {
            return Err(format!(
                "temporal_patch_size must be 1..=8, not {}",
                self.temporal_patch_size
            ));
        }
        if let Some(video) = &self.video {
            let geometry = (self.patch_size, self.merge_size, self.temporal_patch_size);
            let s = &video.sizing;
            if (s.patch_size, s.merge_size, s.temporal_patch_size) != geometry
                || video.sampling.temporal_patch_size != self.temporal_patch_size
            {
                return Err("the video rule's patch geometry must be the image spec's".into());
            }
            s.validate().map_err(|e| format!("video: {e}"))?;
            if let Some(tps) = video
                .tokens_per_second
                .filter(|t| !(t.is_finite() && *t > 0.0))
            {
                return Err(format!(
                    "video tokens_per_second must be a positive number, not {tps}"
                ));
            }
            if video.max_seconds.is_nan() || video.max_seconds < 0.0 {
                return Err(format!(
                    "video max_seconds must be 0 (no cap) or more, not {}",
                    video.max_seconds
                ));
            }
        }
        let factor = self.factor() as u64;
        if self.max_pixels < factor * factor || self.min_pixels > self.max_pixels {
            return Err(format!(
                "need min_pixels <= max_pixels and max_pixels >= {} (one merge block), not {} and {}",
                factor * factor,
                self.min_pixels,
                self.max_pixels
            ));
        }
        Ok(())
    }

    /// Pixels a side of one merge block: resized sides are multiples of it.
    pub fn factor(&self) -> u32 {
        self.patch_size * self.merge_size
    }

    /// The resized (height, width): transformers' `smart_resize` (Python's `round` rounds half
    /// to even, and so does this).
    pub fn resized(&self, height: u32, width: u32) -> Result<(u32, u32), Rejection> {
        let (h, w) = (height as f64, width as f64);
        if height == 0 || width == 0 || h.max(w) / h.min(w) > MAX_ASPECT {
            return Err((
                Reason::TooFewPatches,
                format!("{width}x{height}: an aspect ratio over {MAX_ASPECT} has no grid"),
            ));
        }
        let factor = self.factor() as f64;
        let mut h_bar = (h / factor).round_ties_even() * factor;
        let mut w_bar = (w / factor).round_ties_even() * factor;
        if h_bar * w_bar > self.max_pixels as f64 {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            h_bar = factor.max((h / beta / factor).floor() * factor);
            w_bar = factor.max((w / beta / factor).floor() * factor);
        } else if h_bar * w_bar < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            h_bar = (h * beta / factor).ceil() * factor;
            w_bar = (w * beta / factor).ceil() * factor;
        }
        if h_bar < factor || w_bar < factor {
            return Err((
                Reason::TooFewPatches,
                format!("{width}x{height} resizes to {w_bar}x{h_bar}, under one merge block"),
            ));
        }
        Ok((h_bar as u32, w_bar as u32))
    }

    /// The grid of an image of `height x width` pixels.
    pub fn grid(&self, height: u32, width: u32) -> Result<Grid, Rejection> {
        let (h, w) = self.resized(height, width)?;
        Ok(Grid {
            t: 1,
            h: h / self.patch_size,
            w: w / self.patch_size,
        })
    }

    /// Tokens of an image's run in the text: start, one pad per merge block, end.
    pub fn tokens(&self, grid: Grid) -> usize {
        (grid.patches() / (self.merge_size as u64).pow(2)) as usize + 2
    }

    /// An image's run of tokens: start, pads, end.
    pub fn run(&self, grid: Grid) -> impl Iterator<Item = u32> {
        let pads = std::iter::repeat_n(self.image_pad, self.tokens(grid) - 2);
        std::iter::once(self.vision_start)
            .chain(pads)
            .chain(std::iter::once(self.vision_end))
    }

    /// A video's run of tokens: start, one `<|video_pad|>` per merge block, end.
    pub fn video_run(&self, grid: Grid, video_pad: u32) -> impl Iterator<Item = u32> {
        let pads = std::iter::repeat_n(video_pad, self.tokens(grid) - 2);
        std::iter::once(self.vision_start)
            .chain(pads)
            .chain(std::iter::once(self.vision_end))
    }

    /// Writes a video's sampled frames, `frames` = RGB `[grid.t * temporal_patch_size, 3,
    /// h * p, w * p]`, as its `grid.patches()` rows of `pixel_values_videos` into `out`, as
    /// `Qwen2VLVideoProcessor` lays them out: temporal patch, then merge blocks as an image's
    /// rows, each row `[channel, frame of the temporal patch, y, x]`.
    pub fn write_video_rows(&self, frames: &[u8], grid: Grid, out: &mut [u8]) {
        let (p, m) = (self.patch_size as usize, self.merge_size as usize);
        let (gh, gw) = (grid.h as usize, grid.w as usize);
        let (width, plane) = (gw * p, gh * p * gw * p);
        let t = self.temporal_patch_size as usize;
        assert_eq!(
            frames.len(),
            grid.t as usize * t * 3 * plane,
            "the video's frames"
        );
        assert_eq!(
            out.len(),
            grid.patches() as usize * self.row_len(),
            "the grid's rows"
        );
        let mut rows = out.chunks_exact_mut(self.row_len());
        for gt in 0..grid.t as usize {
            for bh in 0..gh / m {
                for bw in 0..gw / m {
                    for mh in 0..m {
                        for mw in 0..m {
                            let (r, c) = (bh * m + mh, bw * m + mw);
                            let row = rows.next().expect("one row a patch");
                            let mut lines = row.chunks_exact_mut(p);
                            for ch in 0..3 {
                                for k in 0..t {
                                    let frame = (gt * t + k) * 3 * plane + ch * plane;
                                    for y in 0..p {
                                        let from = frame + (r * p + y) * width + c * p;
                                        let line = lines.next().expect("p lines a frame");
                                        line.copy_from_slice(&frames[from..from + p]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Bytes of one row of `pixel_values`: `3 * temporal_patch_size * patch_size²`.
    pub fn row_len(&self) -> usize {
        3 * self.temporal_patch_size as usize * (self.patch_size as usize).pow(2)
    }

    /// Writes an image resized to the grid's pixels, `planar` = RGB `[3, h * p, w * p]`, as
    /// its `grid.patches()` rows of `pixel_values` into `out`, in the processor's order.
    pub fn write_rows(&self, planar: &[u8], grid: Grid, out: &mut [u8]) {
        let (p, m) = (self.patch_size as usize, self.merge_size as usize);
        let (gh, gw) = (grid.h as usize, grid.w as usize);
        let (width, plane) = (gw * p, gh * p * gw * p);
        let t = self.temporal_patch_size as usize;
        assert_eq!(planar.len(), 3 * plane, "one [3, h, w] image");
        assert_eq!(out.len(), gh * gw * self.row_len(), "the grid's rows");
        let mut rows = out.chunks_exact_mut(self.row_len());
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let (r, c) = (bh * m + mh, bw * m + mw);
                        let row = rows.next().expect("one row a patch");
                        // Per channel, the first frame's p x p pixels, then the same block
                        // again for each further frame (one copy, not p small ones).
                        let frame = p * p;
                        for (ch, block) in row.chunks_exact_mut(t * frame).enumerate() {
                            let (first, rest) = block.split_at_mut(frame);
                            for (y, line) in first.chunks_exact_mut(p).enumerate() {
                                let from = ch * plane + (r * p + y) * width + c * p;
                                line.copy_from_slice(&planar[from..from + p]);
                            }
                            for copy in rest.chunks_exact_mut(frame) {
                                copy.copy_from_slice(first);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// How image runs are positioned: M-RoPE with this merge size, or 1-D (NaFlex).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    MRope { merge: u32 },
    Flat,
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn qwen(min_pixels: u64, max_pixels: u64) -> QwenVlSpec {
        QwenVlSpec {
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels,
            max_pixels,
            vision_start: 1,
            vision_end: 2,
            image_pad: 3,
            video: None,
        }
    }

    #[test]
    fn smart_resize_rounds_half_to_even_and_keeps_the_pixels_in_bounds() {
        let spec = qwen(56 * 56, 28 * 28 * 1280);
        // 42 / 28 = 1.5 rounds to 2 (even), 70 / 28 = 2.5 rounds to 2 (even): then under
        // min_pixels, so scaled up.
        assert_eq!(spec.resized(42 * 4, 70 * 4).unwrap(), (168, 280));
        assert_eq!(spec.resized(28 * 3, 28 * 5).unwrap(), (84, 140));
        // Over max_pixels: scaled down, sides floored to multiples of 28.
        let (h, w) = spec.resized(3000, 4000).unwrap();
        assert!(h as u64 * w as u64 <= 28 * 28 * 1280 && h % 28 == 0 && w % 28 == 0);
        // Tiny: scaled up to min_pixels.
        let (h, w) = spec.resized(10, 10).unwrap();
        assert!(h as u64 * w as u64 >= 56 * 56, "{h}x{w}");
        assert_eq!(spec.resized(1, 300).unwrap_err().0, Reason::TooFewPatches);
        let grid = spec.grid(28 * 3, 28 * 5).unwrap();
        assert_eq!(grid, Grid { t: 1, h: 6, w: 10 });
        assert_eq!(spec.tokens(grid), 15 + 2);
    }

    #[test]
    fn rows_are_merge_blocks_of_channel_temporal_y_x() {
        let spec = QwenVlSpec {
            patch_size: 2,
            ..qwen(0, 1 << 20)
        };
        let grid = Grid { t: 1, h: 2, w: 4 };
        let (h, w) = (4usize, 8usize);
        // Pixel value encodes (channel, y, x).
        let planar: Vec<u8> = (0..3 * h * w)
            .map(|i| ((i / (h * w)) * 64 + (i % (h * w))) as u8)
            .collect();
        let mut out = vec![0u8; grid.patches() as usize * spec.row_len()];
        spec.write_rows(&planar, grid, &mut out);
        let pixel = |ch: usize, y: usize, x: usize| (ch * 64 + y * w + x) as u8;
        // Row 1 is block (0, 0)'s patch at grid (0, 1); row 4 is block (0, 1)'s first, grid (0, 2).
        let row = &out[spec.row_len()..2 * spec.row_len()];
        assert_eq!(
            &row[..4],
            &[
                pixel(0, 0, 2),
                pixel(0, 0, 3),
                pixel(0, 1, 2),
                pixel(0, 1, 3)
            ]
        );
        assert_eq!(&row[4..8], &row[..4], "the second frame repeats the first");
        assert_eq!(row[8], pixel(1, 0, 2));
        let row = &out[4 * spec.row_len()..5 * spec.row_len()];
        assert_eq!(row[0], pixel(0, 0, 4));
        let row = &out[2 * spec.row_len()..3 * spec.row_len()];
        assert_eq!(row[0], pixel(0, 2, 0), "row 2 is grid (1, 0)");
    }

    #[test]
    fn video_rows_are_temporal_patches_of_merge_blocks_each_channel_frame_y_x() {
        let spec = QwenVlSpec {
            patch_size: 2,
            ..qwen(0, 1 << 20)
        };
        // 4 frames (2 temporal patches) of 4 x 4 pixels: a grid of 2 x 2 x 2 patches.
        let grid = Grid { t: 2, h: 2, w: 2 };
        let (h, w, n) = (4usize, 4usize, 4usize);
        let value = |f: usize, ch: usize, y: usize, x: usize| (f * 48 + ch * 16 + y * w + x) as u8;
        let mut frames = vec![0u8; n * 3 * h * w];
        for f in 0..n {
            for ch in 0..3 {
                for y in 0..h {
                    for x in 0..w {
                        frames[((f * 3 + ch) * h + y) * w + x] = value(f, ch, y, x);
                    }
                }
            }
        }
        let mut out = vec![0u8; grid.patches() as usize * spec.row_len()];
        spec.write_video_rows(&frames, grid, &mut out);
        let row = |i: usize| &out[i * spec.row_len()..(i + 1) * spec.row_len()];
        // Row 0: temporal patch 0, patch (0, 0): channel 0 of frame 0, then of frame 1.
        assert_eq!(
            &row(0)[..4],
            &[
                value(0, 0, 0, 0),
                value(0, 0, 0, 1),
                value(0, 0, 1, 0),
                value(0, 0, 1, 1)
            ]
        );
        assert_eq!(row(0)[4], value(1, 0, 0, 0));
        assert_eq!(row(0)[8], value(0, 1, 0, 0));
        // Row 3 is patch (1, 1); row 4 begins the second temporal patch (frames 2 and 3).
        assert_eq!(row(3)[0], value(0, 0, 2, 2));
        assert_eq!(&row(4)[..2], &[value(2, 0, 0, 0), value(2, 0, 0, 1)]);
        assert_eq!(row(4)[4], value(3, 0, 0, 0));
        let run: Vec<u32> = spec.video_run(grid, 9).collect();
        assert_eq!(
            run,
            vec![1, 9, 9, 2],
            "one pad per merge block of each temporal patch"
        );
    }
}
