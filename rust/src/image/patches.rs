//! NaFlex geometry (SigLIP 2's native-resolution input): an image's patch grid under a patch
//! budget, the aspect-jittered random crop, and the layout of a resized image as a sequence of
//! flattened patches. Pure arithmetic: nothing here decodes or allocates.

use crate::image::resize::CropBox;
use crate::rng::SplitMix64;

/// The patch grid (rows, columns) that `transformers`' `get_image_size_for_max_num_patches`
/// (Siglip2ImageProcessor and its PIL twin) gives an image of `height x width` pixels: a binary
/// search for the largest scale in (1e-6, 100) at which both sides, rounded up to a multiple
/// of `patch` and at least one patch, hold at most `max_patches` patches. The same f64
/// operations in the same order, so the grid is identical for every size.
///
/// With `max_patches == 0` no scale fits and the reference's answer, one patch, is returned;
/// callers refuse a budget under one patch before they get here. `patch` must be positive.
pub fn grid_for_max_patches(height: u32, width: u32, patch: u32, max_patches: u32) -> (u32, u32) {
    const EPS: f64 = 1e-5;
    let p = patch as f64;
    let scaled = |scale: f64, size: u32| -> f64 {
        let s = size as f64 * scale;
        ((s / p).ceil() * p).max(p)
    };
    let (mut lo, mut hi) = (EPS / 10.0, 100.0f64);
    while hi - lo >= EPS {
        let scale = (lo + hi) / 2.0;
        let patches = (scaled(scale, height) / p) * (scaled(scale, width) / p);
        if patches <= max_patches as f64 {
            lo = scale;
        } else {
            hi = scale;
        }
    }
    // Sides are whole multiples of `patch` (at most 100x the image, within f64's integers).
    let rows = (scaled(lo, height) / p) as u64;
    let cols = (scaled(lo, width) / p) as u64;
    (
        rows.min(u32::MAX as u64) as u32,
        cols.min(u32::MAX as u64) as u32,
    )
}

/// A random crop for NaFlex training: an area fraction drawn from `scale`, an aspect ratio that
/// is the image's own times a factor drawn log-uniformly from `ratio` (jitter around the
/// image's shape, not a square's: the kind keeps aspect ratios), at a random position. After
/// ten draws that do not fit, the whole image (as torchvision's RandomResizedCrop falls back).
pub fn jittered_crop(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SplitMix64,
) -> CropBox {
    let (w, h) = (width as f64, height as f64);
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let area = w * h * (scale.0 + (scale.1 - scale.0) * rng.unit_f64());
        let aspect = (w / h) * (log_lo + (log_hi - log_lo) * rng.unit_f64()).exp();
        let cw = (area * aspect).sqrt().round();
        let ch = (area / aspect).sqrt().round();
        if cw >= 1.0 && ch >= 1.0 && cw <= w && ch <= h {
            let x = rng.below((w - cw) as u64 + 1) as f64;
            let y = rng.below((h - ch) as u64 + 1) as f64;
            return CropBox { x, y, w: cw, h: ch };
        }
    }
    CropBox {
        x: 0.0,
        y: 0.0,
        w,
        h,
    }
}

/// Writes a channel-planar image (`[3, rows * patch, cols * patch]`) as its patches, row-major
/// over the grid, each patch flattened as (y, x, channel): `convert_image_to_patches`'s
/// `reshape(C, rows, p, cols, p).permute(1, 3, 2, 4, 0)`. `out` holds exactly
/// `rows * cols * 3 * patch * patch` bytes. The loader writes each row as it is made
/// ([`rgb_row_to_patches`]); this is that layout for a whole image.
pub fn planar_to_patches(planar: &[u8], (rows, cols): (u32, u32), patch: u32, out: &mut [u8]) {
    let (height, width) = ((rows * patch) as usize, (cols * patch) as usize);
    let plane = height * width;
    assert_eq!(planar.len(), 3 * plane, "planar image of the grid's size");
    let (r, rest) = planar.split_at(plane);
    let (g, b) = rest.split_at(plane);
    for y in 0..height {
        let row = y * width..(y + 1) * width;
        let rgb = [&r[row.clone()], &g[row.clone()], &b[row]];
        rgb_row_to_patches(rgb, y, (rows, cols), patch, out);
    }
}

/// Writes row `y` of an image on a `(rows, cols)` grid of `patch`-pixel patches, given as its
/// red, green and blue rows (`cols * patch` pixels each), as line `y % patch` of each patch of
/// grid row `y / patch` in `out` (the layout of [`planar_to_patches`]; `out` holds the whole
/// grid). Interleaving straight into the batch saves a planar image and a pass over it.
pub fn rgb_row_to_patches(
    [r, g, b]: [&[u8]; 3],
    y: usize,
    (rows, cols): (u32, u32),
    patch: u32,
    out: &mut [u8],
) {
    let (rows, cols, p) = (rows as usize, cols as usize, patch as usize);
    assert!(y < rows * p, "row {y} is outside the grid");
    assert_eq!(
        out.len(),
        rows * cols * 3 * p * p,
        "one flattened patch per grid cell"
    );
    let width = cols * p;
    assert!(
        r.len() == width && g.len() == width && b.len() == width,
        "rows of the grid's width"
    );
    // Line y % p of the first patch of grid row y / p; each next patch is 3p² further on.
    let first = (y / p) * cols * 3 * p * p + (y % p) * 3 * p;
    #[cfg(target_arch = "x86_64")]
    if p % 16 == 0 && is_x86_feature_detected!("ssse3") {
        // SAFETY: the CPU has SSSE3 (checked at run time); every slice bound is checked above.
        return unsafe { interleave_ssse3([r, g, b], first, p, out) };
    }
    for j in 0..cols {
        let line = &mut out[first + j * 3 * p * p..][..3 * p];
        let pixels = r[j * p..][..p]
            .iter()
            .zip(&g[j * p..][..p])
            .zip(&b[j * p..][..p]);
        for (px, ((&r, &g), &b)) in line.chunks_exact_mut(3).zip(pixels) {
            px.copy_from_slice(&[r, g, b]);
        }
    }
}

/// [`rgb_row_to_patches`]'s lines for a patch a multiple of 16 pixels wide: 16 pixels of each
/// channel become 48 interleaved bytes in nine byte shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
unsafe fn interleave_ssse3([r, g, b]: [&[u8]; 3], first: usize, p: usize, out: &mut [u8]) {
    use std::arch::x86_64::*;
    let masks: [[__m128i; 3]; 3] = std::array::from_fn(|part| {
        // SAFETY: an unaligned load of 16 bytes from a 16-byte array.
        std::array::from_fn(|c| unsafe { _mm_loadu_si128(INTERLEAVE[part][c].as_ptr().cast()) })
    });
    for (j, x) in (0..r.len()).step_by(p).enumerate() {
        let line = &mut out[first + j * 3 * p * p..][..3 * p];
        for k in 0..p / 16 {
            let at = x + 16 * k;
            // SAFETY: at + 16 <= r.len() == g.len() == b.len() (x + p <= width, 16 * k < p), and
            // the stores below are inside `line` (48 * k + 48 <= 3p).
            unsafe {
                let src = [&r[at..at + 16], &g[at..at + 16], &b[at..at + 16]]
                    .map(|s| _mm_loadu_si128(s.as_ptr().cast()));
                let dst = line[48 * k..48 * k + 48].as_mut_ptr();
                for (part, m) in masks.iter().enumerate() {
                    let v = _mm_or_si128(
                        _mm_or_si128(
                            _mm_shuffle_epi8(src[0], m[0]),
                            _mm_shuffle_epi8(src[1], m[1]),
                        ),
                        _mm_shuffle_epi8(src[2], m[2]),
                    );
                    _mm_storeu_si128(dst.add(16 * part).cast(), v);
                }
            }
        }
    }
}

/// Byte-shuffle masks of [`interleave_ssse3`]: for output part (16 bytes of the 48) and
/// channel, the index of the pixel whose channel lands at each byte, or 0x80 (a zero).
#[cfg(target_arch = "x86_64")]
const INTERLEAVE: [[[u8; 16]; 3]; 3] = {
    let mut masks = [[[0x80u8; 16]; 3]; 3];
    let mut k = 0;
    while k < 48 {
        masks[k / 16][k % 3][k % 16] = (k / 3) as u8;
        k += 1;
    }
    masks
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Grids computed by transformers 5.24's `get_image_size_for_max_num_patches` (pixels /
    /// patch), including its answers for the bad inputs: a 1x1 image is upscaled 100x (7x7 of
    /// 16), a 1x10000 one is held at one patch row, and a budget of 1 gives one patch.
    #[test]
    fn grids_are_the_reference_processors() {
        let cases = [
            ((480, 640), 16, 256, (224, 288)),
            ((480, 640), 14, 729, (322, 434)),
            ((1, 10000), 16, 256, (16, 4096)),
            ((1, 10000), 14, 729, (14, 10206)),
            ((10000, 1), 16, 64, (1024, 16)),
            ((1, 1), 16, 256, (112, 112)),
            ((300, 451), 16, 256, (208, 304)),
            ((300, 451), 16, 64, (96, 160)),
            ((1000, 3), 14, 729, (5096, 28)),
            ((224, 224), 16, 256, (256, 256)),
            ((17, 2000), 16, 256, (32, 2048)),
            ((7, 9), 14, 729, (336, 420)),
            ((512, 512), 16, 1, (16, 16)),
        ];
        for ((h, w), p, max, (th, tw)) in cases {
            assert_eq!(
                grid_for_max_patches(h, w, p, max),
                (th / p, tw / p),
                "{h}x{w} p={p} max={max}"
            );
        }
        // No budget at all: the reference's one patch (callers refuse such a budget).
        assert_eq!(grid_for_max_patches(480, 640, 16, 0), (1, 1));
    }

    #[test]
    fn grids_never_exceed_the_budget() {
        for (h, w) in [(1, 1), (3, 4000), (4000, 3), (999, 1001), (65535, 2)] {
            for max in [1, 2, 7, 64, 256, 1024] {
                let (r, c) = grid_for_max_patches(h, w, 16, max);
                assert!(r >= 1 && c >= 1 && r * c <= max, "{h}x{w} {max}: {r}x{c}");
            }
        }
    }

    #[test]
    fn patches_are_row_major_cells_of_y_x_channel() {
        let (rows, cols, p) = (2u32, 3u32, 2u32);
        let (h, w) = ((rows * p) as usize, (cols * p) as usize);
        // Each value encodes (channel, y, x).
        let planar: Vec<u8> = (0..3 * h * w)
            .map(|i| {
                let (c, y, x) = (i / (h * w), i / w % h, i % w);
                (c * 100 + y * 10 + x) as u8
            })
            .collect();
        let mut out = vec![0u8; planar.len()];
        planar_to_patches(&planar, (rows, cols), p, &mut out);
        let patch = (3 * p * p) as usize;
        for cell in 0..(rows * cols) as usize {
            let (i, j) = (cell / cols as usize, cell % cols as usize);
            for py in 0..p as usize {
                for px in 0..p as usize {
                    for c in 0..3 {
                        let (y, x) = (i * p as usize + py, j * p as usize + px);
                        let got = out[cell * patch + (py * p as usize + px) * 3 + c];
                        assert_eq!(got as usize, c * 100 + y * 10 + x);
                    }
                }
            }
        }
    }

    /// The shuffled path (patches a multiple of 16 wide, on x86-64) and the scalar one (any
    /// other width) write the same layout as the reference formula, on a grid of several rows
    /// and columns, with every byte distinct enough to catch a swapped channel or pixel.
    #[test]
    fn rows_go_to_their_patch_lines_at_every_patch_width() {
        for p in [1usize, 14, 16, 32] {
            let (rows, cols) = (3usize, 5usize);
            let (h, w) = (rows * p, cols * p);
            let value = |c: usize, y: usize, x: usize| ((c * 89 + y * 31 + x * 7) % 251) as u8;
            let planar: Vec<u8> = (0..3 * h * w)
                .map(|i| value(i / (h * w), i / w % h, i % w))
                .collect();
            let mut out = vec![0u8; planar.len()];
            planar_to_patches(&planar, (rows as u32, cols as u32), p as u32, &mut out);
            for (at, &got) in out.iter().enumerate() {
                let (cell, inside) = (at / (3 * p * p), at % (3 * p * p));
                let (py, px, c) = (inside / (3 * p), inside / 3 % p, inside % 3);
                let (y, x) = (cell / cols * p + py, cell % cols * p + px);
                assert_eq!(got, value(c, y, x), "p {p}, byte {at}");
            }
        }
    }

    #[test]
    fn jittered_crops_stay_inside_near_the_image_aspect_and_are_seeded() {
        for (w, h) in [(640, 480), (100, 900), (1, 10000), (1, 1)] {
            for seed in 0..100 {
                let a = jittered_crop(w, h, (0.5, 1.0), (0.8, 1.25), &mut SplitMix64::new(seed));
                let b = jittered_crop(w, h, (0.5, 1.0), (0.8, 1.25), &mut SplitMix64::new(seed));
                assert_eq!(a, b);
                assert!(a.x >= 0.0 && a.y >= 0.0 && a.w >= 1.0 && a.h >= 1.0);
                assert!(a.x + a.w <= w as f64 && a.y + a.h <= h as f64, "{a:?}");
                if w >= 100 {
                    let jitter = (a.w / a.h) / (w as f64 / h as f64);
                    assert!(jitter > 0.75 && jitter < 1.35, "{w}x{h}: {a:?}");
                }
            }
        }
    }
}
