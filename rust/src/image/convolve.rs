//! Separable resampling of 8-bit planes, the JPEG-plane path's resize.
//!
//! Pillow's BICUBIC weights (Catmull-Rom, widened by the scale when shrinking, so it
//! antialiases), or its BILINEAR ones (the triangle, widened the same way: what SigLIP 2's
//! processors resize with), in 14-bit fixed point, computed once per pass into flat arrays; a vertical pass
//! that is vectorised across the row (AVX2 when the CPU has it, detected at run time); and an
//! SSE2 transpose, so the horizontal pass is the vertical one run over the transposed image.

/// Fixed-point bits of the weights: a weight of 1.0 is `1 << PRECISION`.
const PRECISION: u32 = 14;

/// Per output line, the first input line and the weights of the lines from there on.
#[derive(Default)]
pub struct Weights {
    window: usize,
    starts: Vec<u32>,
    counts: Vec<u32>,
    values: Vec<i16>,
    /// The arguments of the last `compute`: datasets of one image size reuse the weights.
    computed_for: Option<(Kernel, u32, u64, u64, u32)>,
    centers: Vec<f64>,
    scratch: Vec<f64>,
    scales: Vec<f64>,
    rounded: Vec<i32>,
}

/// Pillow's BICUBIC kernel: the Catmull-Rom cubic (a = -0.5), support 2. Both pieces are
/// evaluated and one is selected, so that the compiler emits no unpredictable branch.
#[inline(always)]
pub(crate) fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    let near = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = (((x - 5.0) * x + 8.0) * x - 4.0) * A;
    let w = if x < 1.0 { near } else { far };
    if x < 2.0 {
        w
    } else {
        0.0
    }
}

/// Pillow's BILINEAR kernel: the triangle, support 1.
#[inline(always)]
pub(crate) fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// The resampling filter of a resize (both as Pillow defines them, antialiased when shrinking).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// Catmull-Rom (a = -0.5), support 2: the square kind's resize.
    #[default]
    Bicubic,
    /// The triangle, support 1: SigLIP 2's processors (`resample=BILINEAR`).
    Bilinear,
}

impl Kernel {
    /// Half-width of the kernel at scale 1, in input samples.
    pub fn support(self) -> f64 {
        match self {
            Kernel::Bicubic => 2.0,
            Kernel::Bilinear => 1.0,
        }
    }
}

impl Weights {
    /// Bicubic weights mapping the input span `[in0, in1)` of an axis `in_size` long onto
    /// `out_size` samples; taps past the axis ends are dropped and the rest renormalised, as
    /// Pillow does.
    pub fn compute(&mut self, in_size: u32, in0: f64, in1: f64, out_size: u32) {
        self.compute_with(Kernel::Bicubic, in_size, in0, in1, out_size)
    }

    /// As [`compute`](Self::compute), with `kernel`'s weights.
    pub fn compute_with(
        &mut self,
        kernel: Kernel,
        in_size: u32,
        in0: f64,
        in1: f64,
        out_size: u32,
    ) {
        let key = (kernel, in_size, in0.to_bits(), in1.to_bits(), out_size);
        if self.computed_for == Some(key) {
            return;
        }
        self.computed_for = Some(key);
        let out = out_size as usize;
        let axis = Axis::new(in0, in1, out_size, kernel.support());
        let (scale, filter_scale, radius) = (axis.scale, axis.filter_scale, axis.radius);
        let window = radius.ceil() as usize * 2 + 1;
        self.window = window;
        self.starts.clear();
        self.counts.clear();
        self.centers.clear();
        for o in 0..out {
            let center = in0 + (o as f64 + 0.5) * scale;
            let (lo, hi) = axis.taps(center, in_size);
            self.starts.push(lo);
            self.counts.push((hi - lo).min(window as u32));
            self.centers.push(center);
        }
        // Every (tap, output) pair, tap-major, so that the loops run over the outputs and
        // vectorise; each weight rounded to fixed point after normalising by its output's sum.
        self.scratch.clear();
        self.scratch.resize(window * out, 0.0);
        self.rounded.clear();
        self.rounded.resize(window * out, 0);
        let taps = Taps {
            starts: &self.starts,
            counts: &self.counts,
            centers: &self.centers,
            inverse_filter_scale: 1.0 / filter_scale,
        };
        self.scales.resize(out, 0.0);
        taps.evaluate(
            kernel,
            &mut self.scratch,
            &mut self.scales,
            &mut self.rounded,
        );

        self.values.clear();
        self.values.resize(window * out, 0);
        for (o, row) in self.values.chunks_exact_mut(window).enumerate() {
            let count = self.counts[o] as usize;
            let mut sum = 0i32;
            for (k, w) in row[..count].iter_mut().enumerate() {
                let v = self.rounded[k * out + o];
                *w = v as i16;
                sum += v;
            }
            // Give the rounding error to the weight nearest the centre (the largest), so that
            // the weights sum to exactly 1.0 and flat areas stay exactly flat.
            let lo = self.starts[o];
            let largest = ((self.centers[o] as u32).saturating_sub(lo) as usize).min(count - 1);
            row[largest] += ((1 << PRECISION) - sum) as i16;
            // Taps that rounded to zero cost a row read each: drop them from both ends (an
            // upscale or a 1:1 copy often needs only two or one of its five).
            let first = row[..count].iter().position(|&w| w != 0).unwrap_or(0);
            let last = row[..count].iter().rposition(|&w| w != 0).unwrap_or(0);
            row.copy_within(first..=last, 0);
            self.starts[o] = lo + first as u32;
            self.counts[o] = (last - first + 1) as u32;
        }
    }
}

/// The resampling of one axis: the span `[in0, in1)` onto `out` samples.
struct Axis {
    scale: f64,
    filter_scale: f64,
    radius: f64,
}

impl Axis {
    fn new(in0: f64, in1: f64, out: u32, support: f64) -> Axis {
        let scale = (in1 - in0) / out as f64;
        let filter_scale = scale.max(1.0);
        Axis {
            scale,
            filter_scale,
            radius: support * filter_scale,
        }
    }

    /// The input samples `lo..hi` the output centred at `center` reads.
    #[inline]
    fn taps(&self, center: f64, in_size: u32) -> (u32, u32) {
        // Casts truncate toward zero: floor and ceil without a libm call (x86-64's baseline
        // has no rounding instruction).
        let lo = (center - self.radius).max(0.0) as u32;
        let hi = ((center + self.radius + 1.0) as u32)
            .min(in_size)
            .max(lo + 1);
        (lo, hi)
    }
}

/// The input samples `first..end` that resampling `[in0, in1)` of an axis `in_size` long onto
/// `out_size` samples reads (what [`Weights::compute`] gives, before it drops zero weights):
/// the rows of an image a decoder must produce for the vertical pass. Bicubic's, the wider
/// kernel: a superset of what a bilinear resize reads.
pub fn input_span(in_size: u32, in0: f64, in1: f64, out_size: u32) -> (u32, u32) {
    let axis = Axis::new(in0, in1, out_size, Kernel::Bicubic.support());
    // Centres grow with the output index, and so do the taps' bounds: the first output reads
    // the lowest sample, the last the highest.
    let first = axis.taps(in0 + 0.5 * axis.scale, in_size).0;
    let end = axis
        .taps(in0 + (out_size as f64 - 0.5) * axis.scale, in_size)
        .1;
    (first, end)
}

/// What [`Weights::compute`] knows per output before evaluating the kernel.
struct Taps<'a> {
    starts: &'a [u32],
    counts: &'a [u32],
    centers: &'a [f64],
    inverse_filter_scale: f64,
}

impl Taps<'_> {
    /// Fills `kernel` and `rounded` (both `window x outputs`, tap-major); `scales` (one per
    /// output) is scratch.
    fn evaluate(
        &self,
        filter: Kernel,
        kernel: &mut [f64],
        scales: &mut [f64],
        rounded: &mut [i32],
    ) {
        // One monomorphised loop per filter: no per-tap branch on the kind.
        match filter {
            Kernel::Bicubic => self.evaluate_dispatch(bicubic, kernel, scales, rounded),
            Kernel::Bilinear => self.evaluate_dispatch(bilinear, kernel, scales, rounded),
        }
    }

    #[inline(always)]
    fn evaluate_dispatch<F: Fn(f64) -> f64>(
        &self,
        f: F,
        kernel: &mut [f64],
        scales: &mut [f64],
        rounded: &mut [i32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (no FMA is enabled: weights are the same on every CPU).
            return unsafe { self.evaluate_avx2(f, kernel, scales, rounded) };
        }
        self.evaluate_any(f, kernel, scales, rounded)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn evaluate_avx2<F: Fn(f64) -> f64>(
        &self,
        f: F,
        kernel: &mut [f64],
        scales: &mut [f64],
        rounded: &mut [i32],
    ) {
        self.evaluate_any(f, kernel, scales, rounded)
    }

    #[inline(always)]
    fn evaluate_any<F: Fn(f64) -> f64>(
        &self,
        f: F,
        kernel: &mut [f64],
        scales: &mut [f64],
        rounded: &mut [i32],
    ) {
        let out = self.starts.len();
        // First each output's sum of weights, then in its place the factor that normalises them.
        scales.fill(0.0);
        for (k, row) in kernel.chunks_exact_mut(out).enumerate() {
            let taps = row.iter_mut().zip(self.starts).zip(self.counts);
            for (((w, &lo), &count), (&center, total)) in
                taps.zip(self.centers.iter().zip(scales.iter_mut()))
            {
                let x = (lo as f64 + k as f64 + 0.5 - center) * self.inverse_filter_scale;
                *w = if (k as u32) < count { f(x) } else { 0.0 };
                *total += *w;
            }
        }
        // An output whose taps all fell outside the kernel (not reachable with support 1 or 2,
        // but cheap to rule out) copies its first input. Checked apart, so the loop below vectorises.
        if scales.contains(&0.0) {
            for (o, total) in scales.iter_mut().enumerate() {
                if *total == 0.0 {
                    kernel[o] = 1.0;
                    *total = 1.0;
                }
            }
        }
        for total in scales.iter_mut() {
            *total = (1i32 << PRECISION) as f64 / *total;
        }
        for (row, fixed) in kernel.chunks_exact(out).zip(rounded.chunks_exact_mut(out)) {
            for ((&w, r), &scale) in row.iter().zip(fixed).zip(&*scales) {
                let v = w * scale;
                // |v| <= 2^15 (a weight is at most about 1.0 and the total at least 0.5) and
                // finite, so the conversion needs no saturation, whose per-value NaN and range
                // checks kept this loop scalar.
                debug_assert!(v.abs() <= 65536.0);
                // SAFETY: finite and within i32, as above.
                *r = unsafe { (v + 0.5f64.copysign(v)).to_int_unchecked::<i32>() };
            }
        }
    }
}

/// Resamples along the vertical axis: output row `o` of `dst` (rows `dst_stride` apart) is
/// the weighted sum of input rows of `src` (rows `src_stride` apart), over `width` columns.
pub fn vertical(
    src: &[u8],
    src_stride: usize,
    width: usize,
    weights: &Weights,
    dst: &mut [u8],
    dst_stride: usize,
) {
    for (o, (&start, &count)) in weights.starts.iter().zip(&weights.counts).enumerate() {
        let taps = &weights.values[o * weights.window..][..count as usize];
        let first = start as usize * src_stride;
        let last_row_end = first + (count as usize - 1) * src_stride + width;
        assert!(last_row_end <= src.len(), "weights reach past the source");
        let out = &mut dst[o * dst_stride..][..width];
        let rows = &src[first..last_row_end];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2; `rows` holds `taps.len()` rows of `width` bytes.
            unsafe { avx2::weighted_rows(rows, src_stride, taps, out) };
            continue;
        }
        weighted_rows_scalar(rows, src_stride, taps, 0, out);
    }
}

/// Output pixels `from..` of one row: the same arithmetic as the SIMD kernel, one at a time.
fn weighted_rows_scalar(rows: &[u8], stride: usize, taps: &[i16], from: usize, out: &mut [u8]) {
    for (x, px) in out.iter_mut().enumerate().skip(from) {
        let mut acc = 1i32 << (PRECISION - 1);
        for (k, &w) in taps.iter().enumerate() {
            acc += rows[k * stride + x] as i32 * w as i32;
        }
        *px = (acc >> PRECISION).clamp(0, 255) as u8;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{weighted_rows_scalar, PRECISION};

    /// Weighted sum of `taps.len()` rows, 32 pixels at a time: bytes of two rows are
    /// interleaved and widened to 16-bit pairs, so one `madd` applies two taps to eight pixels.
    #[target_feature(enable = "avx2")]
    pub unsafe fn weighted_rows(rows: &[u8], stride: usize, taps: &[i16], out: &mut [u8]) {
        let zero = _mm256_setzero_si256();
        let round = _mm256_set1_epi32(1 << (PRECISION - 1));
        let width = out.len();
        if width < 32 {
            return weighted_rows_scalar(rows, stride, taps, 0, out);
        }
        let mut x = 0;
        loop {
            let mut acc = [round; 4];
            let mut k = 0;
            while k < taps.len() {
                let (w0, w1) = (taps[k], taps.get(k + 1).copied().unwrap_or(0));
                let second = if k + 1 < taps.len() { k + 1 } else { k };
                let a = _mm256_loadu_si256(rows.as_ptr().add(k * stride + x) as *const __m256i);
                let b =
                    _mm256_loadu_si256(rows.as_ptr().add(second * stride + x) as *const __m256i);
                let pair = _mm256_set1_epi32((w0 as u16 as i32) | ((w1 as i32) << 16));
                // Per 128-bit lane: `lo` holds pixels 0-7 (a, b interleaved), `hi` pixels 8-15.
                let lo = _mm256_unpacklo_epi8(a, b);
                let hi = _mm256_unpackhi_epi8(a, b);
                let parts = [
                    _mm256_unpacklo_epi8(lo, zero),
                    _mm256_unpackhi_epi8(lo, zero),
                    _mm256_unpacklo_epi8(hi, zero),
                    _mm256_unpackhi_epi8(hi, zero),
                ];
                for (sum, part) in acc.iter_mut().zip(parts) {
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(part, pair));
                }
                k += 2;
            }
            let acc = acc.map(|v| _mm256_srai_epi32::<{ PRECISION as i32 }>(v));
            // The packs undo the lane-wise interleaving: pixels come out in order.
            let words_lo = _mm256_packs_epi32(acc[0], acc[1]);
            let words_hi = _mm256_packs_epi32(acc[2], acc[3]);
            let bytes = _mm256_packus_epi16(words_lo, words_hi);
            _mm256_storeu_si256(out.as_mut_ptr().add(x) as *mut __m256i, bytes);
            if x + 32 == width {
                return;
            }
            // The ragged end: the last 32 pixels again, overlapping (same values rewritten).
            x = (x + 32).min(width - 32);
        }
    }
}

/// Writes the `width x height` image at the start of `src` (rows `src_stride` apart)
/// transposed, `height x width`, to the start of `dst` (rows `dst_stride` apart).
pub fn transpose(
    src: &[u8],
    src_stride: usize,
    width: usize,
    height: usize,
    dst: &mut [u8],
    dst_stride: usize,
) {
    if width == 0 || height == 0 {
        return;
    }
    assert!(src.len() >= (height - 1) * src_stride + width);
    assert!(dst.len() >= (width - 1) * dst_stride + height);
    let (full_w, full_h) = (width - width % 8, height - height % 8);
    for y in (0..full_h).step_by(8) {
        for x in (0..full_w).step_by(8) {
            // SAFETY: the tile's rows y..y+8, columns x..x+8 of src and rows x..x+8, columns
            // y..y+8 of dst lie inside the slices, as asserted above.
            unsafe {
                transpose_8x8(
                    src.as_ptr().add(y * src_stride + x),
                    src_stride,
                    dst.as_mut_ptr().add(x * dst_stride + y),
                    dst_stride,
                )
            }
        }
    }
    // The ragged right and bottom edges.
    for y in 0..height {
        let xs = if y < full_h { full_w..width } else { 0..width };
        for x in xs {
            dst[x * dst_stride + y] = src[y * src_stride + x];
        }
    }
}

/// Transposes one 8x8 tile of bytes with SSE2 (part of every x86-64 CPU).
#[cfg(target_arch = "x86_64")]
unsafe fn transpose_8x8(src: *const u8, src_stride: usize, dst: *mut u8, dst_stride: usize) {
    use std::arch::x86_64::*;
    let row = |i: usize| _mm_loadl_epi64(src.add(i * src_stride) as *const __m128i);
    // Interleave bytes, then 16-bit pairs, then 32-bit quads: each 64-bit half of the last
    // stage holds one source column.
    let b0 = _mm_unpacklo_epi8(row(0), row(1));
    let b1 = _mm_unpacklo_epi8(row(2), row(3));
    let b2 = _mm_unpacklo_epi8(row(4), row(5));
    let b3 = _mm_unpacklo_epi8(row(6), row(7));
    let c0 = _mm_unpacklo_epi16(b0, b1);
    let c1 = _mm_unpackhi_epi16(b0, b1);
    let c2 = _mm_unpacklo_epi16(b2, b3);
    let c3 = _mm_unpackhi_epi16(b2, b3);
    let columns = [
        _mm_unpacklo_epi32(c0, c2),
        _mm_unpackhi_epi32(c0, c2),
        _mm_unpacklo_epi32(c1, c3),
        _mm_unpackhi_epi32(c1, c3),
    ];
    for (i, pair) in columns.into_iter().enumerate() {
        _mm_storel_epi64(dst.add(2 * i * dst_stride) as *mut __m128i, pair);
        _mm_storel_epi64(
            dst.add((2 * i + 1) * dst_stride) as *mut __m128i,
            _mm_unpackhi_epi64(pair, pair),
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_8x8(src: *const u8, src_stride: usize, dst: *mut u8, dst_stride: usize) {
    for y in 0..8 {
        for x in 0..8 {
            *dst.add(x * dst_stride + y) = *src.add(y * src_stride + x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_round_trips_ragged_sizes() {
        for (w, h) in [(1, 1), (8, 8), (13, 21), (224, 37), (40, 9)] {
            let src: Vec<u8> = (0..w * h).map(|i| (i * 31 % 256) as u8).collect();
            let mut t = vec![0u8; w * h];
            transpose(&src, w, w, h, &mut t, h);
            for y in 0..h {
                for x in 0..w {
                    assert_eq!(t[x * h + y], src[y * w + x]);
                }
            }
        }
    }

    #[test]
    fn weights_sum_to_one_and_stay_inside_the_axis() {
        let mut w = Weights::default();
        for (in_size, in0, in1, out) in [
            (400, 10.5, 390.25, 224),
            (131, 9.25, 121.25, 224),
            (20, 0.0, 20.0, 3),
        ] {
            w.compute(in_size, in0, in1, out);
            for o in 0..out as usize {
                let taps = &w.values[o * w.window..][..w.counts[o] as usize];
                assert_eq!(taps.iter().map(|&t| t as i32).sum::<i32>(), 1 << PRECISION);
                assert!(w.starts[o] + w.counts[o] <= in_size);
            }
        }
    }

    /// The SIMD kernel and the scalar one give identical bytes (every tap count, odd widths).
    #[test]
    fn vertical_pass_matches_scalar_arithmetic() {
        let (width, height) = (77, 50);
        let src: Vec<u8> = (0..width * height).map(|i| (i * 97 % 256) as u8).collect();
        let mut w = Weights::default();
        for out_rows in [13, 50, 120] {
            w.compute(height as u32, 0.0, height as f64, out_rows);
            let mut simd = vec![0u8; width * out_rows as usize];
            vertical(&src, width, width, &w, &mut simd, width);
            for o in 0..out_rows as usize {
                let taps = &w.values[o * w.window..][..w.counts[o] as usize];
                let rows = &src[w.starts[o] as usize * width..];
                let mut scalar = vec![0u8; width];
                weighted_rows_scalar(rows, width, taps, 0, &mut scalar);
                assert_eq!(&simd[o * width..][..width], &scalar[..]);
            }
        }
    }
}
