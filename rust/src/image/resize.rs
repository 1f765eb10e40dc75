//! Crop geometry and the resize into the batch tensor.
//!
//! The crop box is computed on the image as displayed, at full resolution; the decoder may
//! hand us a DCT-reduced image, so the box is scaled to it and mapped straight to
//! `size x size`, written channel-planar ([3, H, W]) into the caller's slot (or, for the NaFlex
//! kind, any grid of patches, written as patches row by row). JPEG planes are
//! resized each at its own resolution by [`convolve`] (chroma straight from its subsampled
//! plane) and converted to RGB at the output size; packed RGB images (PNG, WebP, CMYK or
//! rotated JPEGs) go through fast_image_resize (SSE4.1/AVX2/AVX-512/NEON picked at run time).

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{Filter, FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::error::Reason;
use crate::image::convolve::{self, Kernel, Weights};
use crate::image::decode::{DecodeError, Pixels, Planes, Rgb, YCbCr};
use crate::image::patches;
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

/// Per-thread resize state: the resizer (with its SIMD choice) and scratch images (interleaved
/// RGB, or resized Y/Cb/Cr planes).
pub struct Transformer {
    resizer: Resizer,
    hwc: Vec<u8>,
    ycc: Vec<u8>,
    /// RGB on its way to patches (a grid row's pixels, or a whole image from packed RGB).
    planar: Vec<u8>,
    /// One resizer each, so that each keeps its weights: a dataset of one image size (as
    /// img2dataset writes them) then computes none after the first image.
    luma: PlaneResizer,
    chroma: PlaneResizer,
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
            ycc: Vec::new(),
            planar: Vec::new(),
            luma: PlaneResizer::default(),
            chroma: PlaneResizer::default(),
        }
    }

    /// Resizes `region` of `img` to `size x size` (Catmull-Rom = Pillow's BICUBIC, antialiased
    /// when shrinking) and writes it as RGB [3, size, size] into `out`.
    pub fn resize_into_chw(
        &mut self,
        img: &Pixels<'_>,
        region: CropBox,
        size: u32,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        self.resize_into_planar(img, region, (size, size), Kernel::Bicubic, out)
    }

    /// Resizes `region` of `img` to `width x height` with `kernel` (antialiased when
    /// shrinking) and writes it as RGB [3, height, width] into `out`.
    pub fn resize_into_planar(
        &mut self,
        img: &Pixels<'_>,
        region: CropBox,
        size: (u32, u32),
        kernel: Kernel,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let n = size.0 as usize * size.1 as usize;
        assert_eq!(
            out.len(),
            3 * n,
            "slot must hold one [3, height, width] image"
        );
        match img {
            Pixels::Rgb(rgb) => self.rgb_into_chw(rgb, region, size, kernel, out),
            Pixels::YCbCr(planes) => self.ycbcr_into_chw(planes, region, size, kernel, out),
        }
    }

    /// Resizes `region` of `img` to a `(rows, cols)` grid of `patch`-pixel patches with
    /// `kernel` (antialiased when shrinking) and writes it as flattened RGB patches, the layout
    /// of [`patches::planar_to_patches`], into `out` (`rows * cols * 3 * patch²` bytes). Each
    /// row is converted to RGB and interleaved while it is in cache, straight into its
    /// patches: no planar image is written in between.
    pub fn resize_into_patches(
        &mut self,
        img: &Pixels<'_>,
        region: CropBox,
        (rows, cols): (u32, u32),
        patch: u32,
        kernel: Kernel,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let size = (cols * patch, rows * patch);
        let (width, height) = (size.0 as usize, size.1 as usize);
        let n = width * height;
        assert_eq!(out.len(), 3 * n, "out must hold the grid's patches");
        let grid = (rows, cols);
        let ycbcr = match img {
            Pixels::Rgb(rgb) => {
                // Packed RGB (PNG, WebP, CMYK or rotated JPEGs) is the rare case: through a
                // planar image.
                let mut planar = std::mem::take(&mut self.planar);
                crate::image::decode::grow(&mut planar, 3 * n);
                let resized = self.rgb_into_chw(rgb, region, size, kernel, &mut planar[..3 * n]);
                if resized.is_ok() {
                    patches::planar_to_patches(&planar[..3 * n], grid, patch, out);
                }
                self.planar = planar;
                return resized;
            }
            Pixels::YCbCr(ycbcr) => ycbcr,
        };
        crate::image::decode::grow(&mut self.ycc, 3 * n);
        let (luma, chroma_out) = self.ycc[..3 * n].split_at_mut(n);
        self.luma.resize(ycbcr.luma, region, size, kernel, luma)?;
        let Some(chroma) = ycbcr.chroma else {
            for (y, row) in luma.chunks_exact(width).enumerate() {
                patches::rgb_row_to_patches([row, row, row], y, grid, patch, out);
            }
            return Ok(());
        };
        let chroma_region = chroma_region(region, ycbcr.subsampling);
        self.chroma
            .resize(chroma, chroma_region, size, kernel, chroma_out)?;
        let (cb, cr) = chroma_out.split_at(n);
        // One grid row of patches at a time: its pixels in RGB stay in the first-level cache
        // until they are interleaved.
        let band = patch as usize * width;
        crate::image::decode::grow(&mut self.planar, 3 * band);
        let rgb = &mut self.planar[..3 * band];
        for (i, at) in (0..n).step_by(band).enumerate() {
            let pixels = at..at + band;
            ycbcr_to_rgb_planar(&luma[pixels.clone()], &cb[pixels.clone()], &cr[pixels], rgb);
            let (r, rest) = rgb.split_at(band);
            let (g, b) = rest.split_at(band);
            for (k, row) in (0..band).step_by(width).enumerate() {
                let line = [
                    &r[row..row + width],
                    &g[row..row + width],
                    &b[row..row + width],
                ];
                patches::rgb_row_to_patches(line, i * patch as usize + k, grid, patch, out);
            }
        }
        Ok(())
    }

    fn ycbcr_into_chw(
        &mut self,
        img: &YCbCr<'_>,
        region: CropBox,
        size: (u32, u32),
        kernel: Kernel,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let n = size.0 as usize * size.1 as usize;
        let Some(chroma) = img.chroma else {
            let (gray, rest) = out.split_at_mut(n);
            self.luma.resize(img.luma, region, size, kernel, gray)?;
            rest[..n].copy_from_slice(gray);
            rest[n..].copy_from_slice(gray);
            return Ok(());
        };
        crate::image::decode::grow(&mut self.ycc, 3 * n);
        let (luma_out, chroma_out) = self.ycc[..3 * n].split_at_mut(n);
        self.luma.resize(img.luma, region, size, kernel, luma_out)?;
        self.chroma.resize(
            chroma,
            chroma_region(region, img.subsampling),
            size,
            kernel,
            chroma_out,
        )?;
        let (cb_out, cr_out) = chroma_out.split_at(n);
        ycbcr_to_rgb_planar(luma_out, cb_out, cr_out, out);
        Ok(())
    }

    fn rgb_into_chw(
        &mut self,
        img: &Rgb<'_>,
        region: CropBox,
        (width, height): (u32, u32),
        kernel: Kernel,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let n = width as usize * height as usize;
        let src = ImageRef::new(img.width, img.height, img.pixels, PixelType::U8x3)
            .map_err(|e| fail(e.to_string()))?;
        crate::image::decode::grow(&mut self.hwc, 3 * n);
        let mut dst = Image::from_slice_u8(width, height, &mut self.hwc[..3 * n], PixelType::U8x3)
            .map_err(|e| fail(e.to_string()))?;
        self.resizer
            .resize(&src, &mut dst, &options(region, kernel))
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

/// `region` of the luma plane, in the coordinates of a chroma plane subsampled by `(sh, sv)`.
fn chroma_region(region: CropBox, (sh, sv): (u32, u32)) -> CropBox {
    let (sh, sv) = (sh as f64, sv as f64);
    CropBox {
        x: region.x / sh,
        y: region.y / sv,
        w: region.w / sh,
        h: region.h / sv,
    }
}

/// The part of a plane that resizing a region of it reads: columns `x.0..x.1`, rows `y.0..y.1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub x: (u32, u32),
    pub y: (u32, u32),
}

/// What resizing `region` (luma coordinates) of a JPEG's planes to `size` (width, height)
/// reads of the luma plane (`luma` = its width and height) and, for colour images, of the
/// chroma plane (its size, and the luma pixels per chroma sample), with either kernel (the
/// bicubic window, the wider). A decoder may skip everything else.
pub fn planes_windows(
    region: CropBox,
    size: (u32, u32),
    luma: (u32, u32),
    chroma: Option<((u32, u32), (u32, u32))>,
) -> (Window, Option<Window>) {
    let luma_window = PlaneResizer::window(region, size, luma);
    let chroma_window = chroma.map(|(plane, subsampling)| {
        PlaneResizer::window(chroma_region(region, subsampling), size, plane)
    });
    (luma_window, chroma_window)
}

fn fail(e: String) -> DecodeError {
    DecodeError {
        reason: Reason::CorruptImage,
        detail: format!("resize: {e}"),
    }
}

/// Pillow's BICUBIC ([`convolve::bicubic`]), except that inside its support it never returns an
/// exact zero. fast_image_resize 6.1 drops leading zero weights from each output pixel's window;
/// the cubic's zero at distance 1 can then start the first pixel's window after the second's,
/// and its u8 resize computes the width of what it reads from the first window's start (a
/// wrapped-around u32 and an out-of-bounds read). A weight of 1e-12 rounds to 0 in its 16-bit
/// coefficients, so the pixels are unchanged.
fn bicubic_never_zero(x: f64) -> f64 {
    match convolve::bicubic(x) {
        0.0 if x.abs() < 2.0 => 1e-12,
        w => w,
    }
}

/// Pillow's BILINEAR (the triangle), never an exact zero up to and including its support's
/// edge, for the same reason as [`bicubic_never_zero`]: a tap exactly 1 away weighs 0.
fn bilinear_never_zero(x: f64) -> f64 {
    match convolve::bilinear(x) {
        0.0 if x.abs() <= 1.0 => 1e-12,
        w => w,
    }
}

fn options(region: CropBox, kernel: Kernel) -> ResizeOptions {
    let filter = match kernel {
        Kernel::Bicubic => Filter::new("bicubic", bicubic_never_zero, 2.0),
        Kernel::Bilinear => Filter::new("bilinear", bilinear_never_zero, 1.0),
    }
    .expect("positive finite support");
    ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Custom(filter)))
        .crop(region.x, region.y, region.w.max(1.0), region.h.max(1.0))
}

/// Resizes single-channel planes with two vertical passes and two transposes: the vertical
/// kernel works on a whole row at once, which one channel alone cannot give a horizontal
/// kernel. Planes side by side (Cb and Cr) share the weights of both passes.
#[derive(Default)]
struct PlaneResizer {
    down: Weights,
    across: Weights,
    rows: Vec<u8>,
    columns: Vec<u8>,
}

impl PlaneResizer {
    /// Columns the horizontal filter (either kernel: bicubic's radius, the wider) can touch
    /// when resizing to `size` columns, with a pixel to spare: the pass over the transposed
    /// strip then sees exactly the neighbourhood a one-pass resize would.
    fn strip(region: CropBox, size: u32, width: u32) -> (u32, u32) {
        let radius = 2.0 * (region.w / size as f64).max(1.0);
        let x0 = (region.x - radius - 1.0).floor().max(0.0) as u32;
        let x1 = ((region.x + region.w + radius + 1.0).ceil() as u32).min(width);
        (x0, x1)
    }

    /// What [`resize`](Self::resize) to `(out_w, out_h)` reads of a `width x height` plane:
    /// the strip's columns, and the rows of the vertical pass's weights.
    fn window(region: CropBox, (out_w, out_h): (u32, u32), (width, height): (u32, u32)) -> Window {
        Window {
            x: Self::strip(region, out_w, width),
            y: convolve::input_span(height, region.y, region.y + region.h, out_h),
        }
    }

    /// Resizes `region` of each of `src`'s planes to `out_w x out_h` with `kernel`, written one
    /// after another into `out` (`src.count * out_w * out_h` bytes).
    fn resize(
        &mut self,
        src: Planes<'_>,
        region: CropBox,
        (out_w, out_h): (u32, u32),
        kernel: Kernel,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let (count, width, pitch) = (src.count as usize, src.width as usize, src.pitch as usize);
        let (cols, rows) = (out_w as usize, out_h as usize);
        let area = cols * rows;
        assert_eq!(out.len(), count * area, "output must hold every plane");
        assert!(pitch >= width, "a plane's rows hold its width");
        if region.w <= 0.0 || region.h <= 0.0 || width == 0 || src.height == 0 {
            return Err(fail(format!("empty region {region:?}")));
        }
        let (x0, x1) = Self::strip(region, out_w, width as u32);
        let (x0, strip) = (x0 as usize, (x1 - x0) as usize);
        crate::image::decode::grow(&mut self.rows, count * (strip * rows).max(area));
        crate::image::decode::grow(&mut self.columns, count * strip * rows);
        // The transposed strips side by side: `strip` rows of `wide` (each plane's `rows`).
        let wide = count * rows;

        self.down
            .compute_with(kernel, src.height, region.y, region.y + region.h, out_h);
        for p in 0..count {
            let tall = &mut self.rows[p * strip * rows..][..strip * rows];
            convolve::vertical(
                &src.data[p * pitch + x0..],
                count * pitch,
                strip,
                &self.down,
                tall,
                strip,
            );
            // The strip turned on its side, next to the other planes': `strip` rows of `wide`.
            convolve::transpose(
                tall,
                strip,
                strip,
                rows,
                &mut self.columns[p * rows..],
                wide,
            );
        }

        let from = region.x - x0 as f64;
        self.across
            .compute_with(kernel, strip as u32, from, from + region.w, out_w);
        let sideways = &mut self.rows[..wide * cols];
        convolve::vertical(&self.columns, wide, wide, &self.across, sideways, wide);
        for (p, plane_out) in out.chunks_exact_mut(area).enumerate() {
            convolve::transpose(&sideways[p * rows..], wide, rows, cols, plane_out, cols);
        }
        Ok(())
    }
}

/// JFIF (full-range BT.601) YCbCr to planar RGB, in libjpeg's 16-bit fixed point. Colour
/// conversion is affine, so converting after the resize equals converting before it up to
/// rounding.
fn ycbcr_to_rgb_planar(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked at run time; wheels assume only x86-64's SSE2).
        return unsafe { ycbcr_to_rgb_planar_avx2(y, cb, cr, out) };
    }
    ycbcr_to_rgb_planar_any(y, cb, cr, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn ycbcr_to_rgb_planar_avx2(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    ycbcr_to_rgb_planar_any(y, cb, cr, out)
}

/// The conversion loop, written for the auto-vectoriser; inlined into each target's variant.
#[inline(always)]
fn ycbcr_to_rgb_planar_any(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    const R_CR: i32 = 91_881; // 1.40200 * 2^16
    const G_CB: i32 = 22_554; // 0.34414 * 2^16
    const G_CR: i32 = 46_802; // 0.71414 * 2^16
    const B_CB: i32 = 116_130; // 1.77200 * 2^16
    let n = y.len();
    let (r, rest) = out.split_at_mut(n);
    let (g, b) = rest.split_at_mut(n);
    let clamp = |v: i32| (v >> 16).clamp(0, 255) as u8;
    let pixels = y.iter().zip(&cb[..n]).zip(&cr[..n]);
    let outputs = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut());
    for (((&y, &u), &v), ((r, g), b)) in pixels.zip(outputs) {
        let luma = ((y as i32) << 16) + (1 << 15);
        let (u, v) = (u as i32 - 128, v as i32 - 128);
        *r = clamp(luma + R_CR * v);
        *g = clamp(luma - G_CB * u - G_CR * v);
        *b = clamp(luma + B_CB * u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised conversion (this CPU's path) equals the portable one and libjpeg's 16-bit
    /// fixed-point JFIF form for every (Y, Cb, Cr).
    #[test]
    fn colour_conversion_matches_libjpegs_fixed_point_form_everywhere() {
        let clamp = |v: i32| (v >> 16).clamp(0, 255) as u8;
        let (mut y, mut cb, mut cr) = (vec![], vec![], vec![]);
        for l in 0..=255u8 {
            for u in 0..=255u8 {
                for v in 0..=255u8 {
                    y.push(l);
                    cb.push(u);
                    cr.push(v);
                }
            }
        }
        let n = y.len();
        let mut fast = vec![0u8; 3 * n];
        let mut portable = vec![0u8; 3 * n];
        ycbcr_to_rgb_planar(&y, &cb, &cr, &mut fast);
        ycbcr_to_rgb_planar_any(&y, &cb, &cr, &mut portable);
        for i in 0..n {
            let luma = ((y[i] as i32) << 16) + (1 << 15);
            let (u, v) = (cb[i] as i32 - 128, cr[i] as i32 - 128);
            let direct = [
                clamp(luma + 91_881 * v),
                clamp(luma - 22_554 * u - 46_802 * v),
                clamp(luma + 116_130 * u),
            ];
            for (c, want) in direct.into_iter().enumerate() {
                assert_eq!(
                    fast[c * n + i],
                    want,
                    "channel {c} of {:?}",
                    (y[i], cb[i], cr[i])
                );
                assert_eq!(portable[c * n + i], want);
            }
        }
    }

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
    fn random_boxes_have_an_aspect_in_the_ratio_range() {
        // Single, narrow and wide ranges; a box that falls back to the whole image is clamped to
        // the range too.
        for ratio in [(2.0, 2.0), (0.5, 0.6), (1.2, 1.8)] {
            let mode = CropMode::RandomResized {
                scale: (0.2, 0.4),
                ratio,
            };
            for seed in 0..100 {
                let b = crop_box(640, 480, mode, &mut SplitMix64::new(seed));
                // Each side is rounded to whole pixels: the aspect is within that of the range.
                let aspect = b.w / b.h;
                assert!(
                    aspect > ratio.0 * 0.99 && aspect < ratio.1 * 1.01,
                    "{ratio:?}: {b:?}"
                );
            }
        }
    }

    /// A 2x upscale whose first output pixel sits exactly on a source pixel: fast_image_resize's
    /// own Catmull-Rom read out of bounds here (a crash in release builds, an overflow panic in
    /// debug ones), as chroma planes of 4:2:0 JPEGs at DCT scale 1/2 met it on ordinary photos.
    /// Both resize paths must survive it and agree.
    #[test]
    fn upscale_aligned_on_a_source_pixel_stays_in_bounds() {
        let data: Vec<u8> = (0..131 * 112).map(|i| (i * 7 % 251) as u8).collect();
        let plane = Planes {
            count: 1,
            width: 131,
            height: 112,
            pitch: 131,
            data: &data,
        };
        let region = CropBox {
            x: 9.25,
            y: 0.0,
            w: 112.0,
            h: 112.0,
        };
        let mut out = vec![0u8; 224 * 224];
        PlaneResizer::default()
            .resize(plane, region, (224, 224), Kernel::Bicubic, &mut out)
            .unwrap();
        let rgb: Vec<u8> = data.iter().flat_map(|&v| [v, v, v]).collect();
        let img = Pixels::Rgb(Rgb {
            width: 131,
            height: 112,
            pixels: &rgb,
        });
        let mut chw = vec![0u8; 3 * 224 * 224];
        Transformer::new()
            .resize_into_chw(&img, region, 224, &mut chw)
            .unwrap();
        assert_eq!(&chw[..224 * 224], &out[..]);
    }

    /// To a non-square size (NaFlex's targets), shrinking one axis and growing the other, the
    /// plane path and the packed-RGB path (fast_image_resize) agree with either kernel: the
    /// plane path's transposes keep rows and columns apart. Within 1 with the triangle, 2 with
    /// the cubic: the paths run their passes in opposite orders and round to u8 in between,
    /// and the cubic's overshoot is clamped there (a square 48x48 is held to the same bound).
    #[test]
    fn plane_and_rgb_paths_agree_on_non_square_targets() {
        let (w, h) = (131u32, 97u32);
        let data: Vec<u8> = (0..w * h)
            .map(|i| ((i % w) * 255 / w + (i / w) * 3 % 40) as u8)
            .collect();
        let plane = Planes {
            count: 1,
            width: w,
            height: h,
            pitch: w,
            data: &data,
        };
        let rgb: Vec<u8> = data.iter().flat_map(|&v| [v, v, v]).collect();
        let img = Pixels::Rgb(Rgb {
            width: w,
            height: h,
            pixels: &rgb,
        });
        let region = CropBox {
            x: 3.0,
            y: 0.0,
            w: 120.0,
            h: 97.0,
        };
        for kernel in [Kernel::Bilinear, Kernel::Bicubic] {
            let tolerance = if kernel == Kernel::Bilinear { 1 } else { 2 };
            for (ow, oh) in [(48u32, 160u32), (176, 32), (16, 16), (48, 48)] {
                let n = (ow * oh) as usize;
                let mut planes = vec![0u8; n];
                PlaneResizer::default()
                    .resize(plane, region, (ow, oh), kernel, &mut planes)
                    .unwrap();
                let mut chw = vec![0u8; 3 * n];
                Transformer::new()
                    .resize_into_planar(&img, region, (ow, oh), kernel, &mut chw)
                    .unwrap();
                let worst = planes
                    .iter()
                    .zip(&chw[..n])
                    .map(|(&a, &b)| (a as i16 - b as i16).abs())
                    .max()
                    .unwrap();
                assert!(worst <= tolerance, "{kernel:?} {ow}x{oh}: off by {worst}");
                // Red grows along x in both: the resize did not swap the axes.
                assert!(
                    planes[ow as usize - 1] > planes[0] + 150,
                    "{kernel:?} {ow}x{oh}"
                );
            }
        }
    }

    /// Patches written row by row (colour and grey JPEG planes, packed RGB) are exactly the
    /// planar resize laid out as patches, at a patch width the shuffles take and one they don't.
    #[test]
    fn patches_written_by_rows_equal_the_planar_image_as_patches() {
        let (w, h) = (97u32, 61u32);
        let value = |i: u32, k: u32| ((i % w) * 5 + (i / w) * k % 97) as u8;
        let luma: Vec<u8> = (0..w * h).map(|i| value(i, 3)).collect();
        let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
        // Cb and Cr side by side in each row, as the raw decoder writes them.
        let chroma: Vec<u8> = (0..2 * cw * ch).map(|i| 60 + value(i, 7) / 2).collect();
        let rgb: Vec<u8> = (0..3 * w * h).map(|i| value(i, 11)).collect();
        let plane = |count, width, height, data| Planes {
            count,
            width,
            height,
            pitch: width,
            data,
        };
        let images = [
            Pixels::YCbCr(YCbCr {
                width: w,
                height: h,
                luma: plane(1, w, h, &luma),
                chroma: Some(plane(2, cw, ch, &chroma)),
                subsampling: (2, 2),
            }),
            Pixels::YCbCr(YCbCr {
                width: w,
                height: h,
                luma: plane(1, w, h, &luma),
                chroma: None,
                subsampling: (1, 1),
            }),
            Pixels::Rgb(Rgb {
                width: w,
                height: h,
                pixels: &rgb,
            }),
        ];
        let region = CropBox {
            x: 2.0,
            y: 1.5,
            w: 90.0,
            h: 57.0,
        };
        for img in &images {
            for (patch, grid) in [(16u32, (3u32, 5u32)), (14, (2, 3)), (16, (5, 8))] {
                let size = (grid.1 * patch, grid.0 * patch);
                let n = (3 * size.0 * size.1) as usize;
                let mut planar = vec![0u8; n];
                Transformer::new()
                    .resize_into_planar(img, region, size, Kernel::Bilinear, &mut planar)
                    .unwrap();
                let mut want = vec![0u8; n];
                patches::planar_to_patches(&planar, grid, patch, &mut want);
                let mut got = vec![0u8; n];
                Transformer::new()
                    .resize_into_patches(img, region, grid, patch, Kernel::Bilinear, &mut got)
                    .unwrap();
                assert!(got == want, "patch {patch}, grid {grid:?}");
            }
        }
    }

    #[test]
    fn uniform_image_stays_uniform_and_is_planar() {
        let pixels: Vec<u8> = std::iter::repeat_n([10u8, 20, 30], 64 * 48)
            .flatten()
            .collect();
        let img = Pixels::Rgb(Rgb {
            width: 64,
            height: 48,
            pixels: &pixels,
        });
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
