//! Crop geometry and the resize into the batch tensor.
//!
//! The crop box is computed on the image as displayed, at full resolution; the decoder may
//! hand us a DCT-reduced image, so the box is scaled to it and the SIMD convolution resizer
//! (fast_image_resize: SSE4.1/AVX2/AVX-512/NEON picked at run time) maps it straight to
//! `size x size`. The result is written channel-planar ([3, H, W]) into the caller's slot.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::decode::{DecodeError, Rgb};
use crate::error::Reason;
use crate::rng::SplitMix64;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CropMode {
    /// Shorter side resized to the target, then the centre square: evaluation and benchmarks.
    Center,
    /// Random area fraction and aspect ratio, then resized to a square: training augmentation
    /// (the torchvision RandomResizedCrop rule), seeded per sample.
    RandomResized {
        scale: (f64, f64),
        ratio: (f64, f64),
    },
}

/// A region of the displayed image, in pixels (fractional edges allowed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CropBox {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl CropBox {
    pub fn min_side(&self) -> u32 {
        self.w.min(self.h).floor() as u32
    }

    /// The same region in an image of another resolution (the DCT-reduced decode).
    pub fn rescaled(&self, from: (u32, u32), to: (u32, u32)) -> CropBox {
        let sx = to.0 as f64 / from.0 as f64;
        let sy = to.1 as f64 / from.1 as f64;
        let x = (self.x * sx).max(0.0);
        let y = (self.y * sy).max(0.0);
        CropBox {
            x,
            y,
            w: (self.w * sx).min(to.0 as f64 - x),
            h: (self.h * sy).min(to.1 as f64 - y),
        }
    }
}

pub fn crop_box(width: u32, height: u32, mode: CropMode, rng: &mut SplitMix64) -> CropBox {
    let (w, h) = (width as f64, height as f64);
    let center = |cw: f64, ch: f64| CropBox {
        x: (w - cw) / 2.0,
        y: (h - ch) / 2.0,
        w: cw,
        h: ch,
    };
    match mode {
        CropMode::Center => {
            let side = w.min(h);
            center(side, side)
        }
        CropMode::RandomResized { scale, ratio } => {
            let area = w * h;
            let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
            for _ in 0..10 {
                let target = area * (scale.0 + (scale.1 - scale.0) * rng.unit_f64());
                let aspect = (log_lo + (log_hi - log_lo) * rng.unit_f64()).exp();
                let cw = (target * aspect).sqrt().round();
                let ch = (target / aspect).sqrt().round();
                if cw > 0.0 && ch > 0.0 && cw <= w && ch <= h {
                    let x = rng.below((w - cw) as u64 + 1) as f64;
                    let y = rng.below((h - ch) as u64 + 1) as f64;
                    return CropBox { x, y, w: cw, h: ch };
                }
            }
            // Fallback, as torchvision: the whole image, clamped to the ratio range.
            let in_ratio = w / h;
            if in_ratio < ratio.0 {
                center(w, (w / ratio.0).round())
            } else if in_ratio > ratio.1 {
                center((h * ratio.1).round(), h)
            } else {
                center(w, h)
            }
        }
    }
}

/// Per-thread resize state: the resizer (with its SIMD choice) and an interleaved scratch image.
pub struct Transformer {
    resizer: Resizer,
    hwc: Vec<u8>,
}

impl Default for Transformer {
    fn default() -> Self {
        Self::new()
    }
}

impl Transformer {
    pub fn new() -> Self {
        Self {
            resizer: Resizer::new(),
            hwc: Vec::new(),
        }
    }

    /// Resizes `region` of `img` to `size x size` (Catmull-Rom = Pillow's BICUBIC, antialiased
    /// when shrinking) and writes it as [3, size, size] into `out`.
    pub fn resize_into_chw(
        &mut self,
        img: &Rgb<'_>,
        region: CropBox,
        size: u32,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let n = size as usize * size as usize;
        assert_eq!(out.len(), 3 * n, "slot must hold one [3, size, size] image");
        let fail = |e: String| DecodeError {
            reason: Reason::CorruptImage,
            detail: format!("resize: {e}"),
        };
        let src = ImageRef::new(img.width, img.height, img.pixels, PixelType::U8x3)
            .map_err(|e| fail(e.to_string()))?;
        crate::decode::grow(&mut self.hwc, 3 * n);
        let mut dst = Image::from_slice_u8(size, size, &mut self.hwc[..3 * n], PixelType::U8x3)
            .map_err(|e| fail(e.to_string()))?;
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom))
            .crop(region.x, region.y, region.w.max(1.0), region.h.max(1.0));
        self.resizer
            .resize(&src, &mut dst, &options)
            .map_err(|e| fail(e.to_string()))?;
        let (r, rest) = out.split_at_mut(n);
        let (g, b) = rest.split_at_mut(n);
        for (i, px) in self.hwc[..3 * n].chunks_exact(3).enumerate() {
            r[i] = px[0];
            g[i] = px[1];
            b[i] = px[2];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn center_box_is_the_centred_square() {
        let b = crop_box(400, 300, CropMode::Center, &mut SplitMix64::new(0));
        assert_eq!(
            b,
            CropBox {
                x: 50.0,
                y: 0.0,
                w: 300.0,
                h: 300.0
            }
        );
    }

    #[test]
    fn random_boxes_stay_inside_and_are_seeded() {
        let mode = CropMode::RandomResized {
            scale: (0.08, 1.0),
            ratio: (0.75, 4.0 / 3.0),
        };
        for seed in 0..200 {
            let a = crop_box(640, 480, mode, &mut SplitMix64::new(seed));
            let b = crop_box(640, 480, mode, &mut SplitMix64::new(seed));
            assert_eq!(a, b);
            assert!(a.x >= 0.0 && a.y >= 0.0 && a.x + a.w <= 640.0 && a.y + a.h <= 480.0);
        }
    }

    #[test]
    fn uniform_image_stays_uniform_and_is_planar() {
        let pixels: Vec<u8> = std::iter::repeat([10u8, 20, 30])
            .take(64 * 48)
            .flatten()
            .collect();
        let img = Rgb {
            width: 64,
            height: 48,
            pixels: &pixels,
        };
        let mut out = vec![0u8; 3 * 16 * 16];
        let region = crop_box(64, 48, CropMode::Center, &mut SplitMix64::new(0));
        Transformer::new()
            .resize_into_chw(&img, region, 16, &mut out)
            .unwrap();
        assert!(out[..256].iter().all(|&v| v == 10));
        assert!(out[256..512].iter().all(|&v| v == 20));
        assert!(out[512..].iter().all(|&v| v == 30));
    }
}
