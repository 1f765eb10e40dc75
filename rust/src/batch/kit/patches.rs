//! The NaFlex patch slot (SigLIP 2's native resolution): one sample to its caption and its slot
//! of `[B, N, 3 * p * p]` patches, N = `max_num_patches`. In the kit because three kinds use
//! it: the square kind's sample pipeline lays samples out this way at a fixed count
//! (`square::config::SampleKind::NaFlex`), the NaFlex kind in token-budget batches
//! (`batch::naflex`), and the interleaved kind's NaFlex spec is bounded by its patch budget.
//!
//! The image keeps its aspect ratio: its patch grid is the one `Siglip2ImageProcessor` gives
//! (`image::patches::grid_for_max_patches`), it is decoded at the smallest DCT scale that
//! covers the grid's pixels, resized to them with Pillow's BILINEAR (the processors'
//! `resample`), and written as flattened patches in the processors' order. The slot's patches
//! past the grid are zeros; the grid (rows, columns) is returned, and the batch's
//! `spatial_shapes` and `pixel_attention_mask` are made from it. uint8, as the square kind:
//! rescaling and normalisation belong on the device.

use crate::batch::kit::sample::{
    caption, image_bytes, probe_capped, Rejection, SampleSpec, Worker,
};
use crate::error::Reason;
use crate::image::convolve::Kernel;
use crate::image::patches::{grid_for_max_patches, jittered_crop};
use crate::image::resize::CropBox;
use crate::read::group::RawSample;
use crate::rng::{derive_seed, hash_bytes, SplitMix64};

/// The largest patch a slot takes (pixels a side): SigLIP 2 uses 14 or 16; the bound keeps a
/// mistyped value from asking for an absurd buffer.
pub const MAX_PATCH_SIZE: u32 = 256;

/// The largest budget of patches per image: 64 Ki patches (a 4096 x 4096 image at 16 px).
pub const MAX_NUM_PATCHES: u32 = 65_536;

/// How a NaFlex sample is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NaFlexSpec {
    /// Pixels a side of a square patch.
    pub patch_size: u32,
    /// Patches of the largest grid, and the slot's length in patches (N).
    pub max_num_patches: u32,
    /// An image whose grid has fewer patches is refused (`too_few_patches`); 0 = none.
    pub min_num_patches: u32,
    /// `None`: the whole image, as the reference processors see it (evaluation). Some((scale,
    /// ratio)): a random crop of that area fraction and of the image's aspect times a factor in
    /// `ratio` (training; see `image::patches::jittered_crop`).
    pub random_crop: Option<((f64, f64), (f64, f64))>,
}

impl NaFlexSpec {
    /// What a pipeline cannot run with: no patch, no budget, a minimum above the budget, or a
    /// crop range that is not one.
    pub fn validate(&self) -> Result<(), String> {
        if self.patch_size == 0 || self.patch_size > MAX_PATCH_SIZE {
            return Err(format!(
                "patch_size must be 1..={MAX_PATCH_SIZE}, not {}",
                self.patch_size
            ));
        }
        if self.max_num_patches == 0 || self.max_num_patches > MAX_NUM_PATCHES {
            return Err(format!(
                "max_num_patches must be 1..={MAX_NUM_PATCHES} (a budget under one patch holds no image), not {}",
                self.max_num_patches
            ));
        }
        if self.min_num_patches > self.max_num_patches {
            return Err(format!(
                "min_num_patches ({}) exceeds max_num_patches ({})",
                self.min_num_patches, self.max_num_patches
            ));
        }
        if let Some((scale, ratio)) = self.random_crop {
            let range =
                |(lo, hi): (f64, f64)| lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi;
            if !range(scale) || scale.1 > 1.0 || !range(ratio) {
                return Err(format!(
                    "random crop needs 0 < scale low <= high <= 1 and 0 < ratio low <= high, not scale {scale:?} ratio {ratio:?}"
                ));
            }
        }
        Ok(())
    }

    /// Bytes of one flattened patch: `3 * p * p`.
    pub fn patch_len(&self) -> usize {
        3 * (self.patch_size as usize).pow(2)
    }

    /// Bytes of one sample's slot: `max_num_patches` patches.
    pub fn slot_len(&self) -> usize {
        self.max_num_patches as usize * self.patch_len()
    }
}

/// Validates and decodes `raw` into `slot` (its patches, zeros after them); returns the
/// caption and the patch grid (rows, columns).
pub fn prepare(
    raw: &RawSample,
    spec: &SampleSpec,
    naflex: &NaFlexSpec,
    crop_seed: u64,
    worker: &mut Worker,
    slot: &mut [u8],
) -> Result<(String, (u32, u32)), Rejection> {
    if let Some(defect) = &raw.defect {
        return Err(defect.clone());
    }
    let bytes = image_bytes(raw, &spec.image_keys)?;
    let text = caption(raw, &spec.caption)?;
    let grid = prepare_image(
        bytes, &raw.key, spec, naflex, crop_seed, false, worker, slot,
    )?;
    Ok((text, grid))
}

/// Decodes one encoded image into `slot` as NaFlex patches (random crops seeded by `crop_seed`
/// and `crop_key`, as the square kind's); returns its grid (rows, columns). `slot` holds whole
/// patches, at least as many as the grid (`max_num_patches` of them, or a token-budget
/// bucket's length). With `whole_image_grid` the grid is the whole image's even when a random
/// crop is taken (the crop is resized to it): token-budget batches plan every image's patch
/// count from its header, before any crop is drawn.
#[allow(clippy::too_many_arguments)]
pub fn prepare_image(
    bytes: &[u8],
    crop_key: &str,
    spec: &SampleSpec,
    naflex: &NaFlexSpec,
    crop_seed: u64,
    whole_image_grid: bool,
    worker: &mut Worker,
    slot: &mut [u8],
) -> Result<(u32, u32), Rejection> {
    assert_eq!(
        slot.len() % naflex.patch_len(),
        0,
        "a NaFlex slot holds whole patches"
    );
    let Worker {
        decoder,
        transformer,
        whole_images,
    } = worker;
    let probe = probe_capped(decoder, bytes, spec.max_pixels)?;
    let (width, height) = probe.oriented_size();
    let region = match naflex.random_crop {
        None => CropBox {
            x: 0.0,
            y: 0.0,
            w: width as f64,
            h: height as f64,
        },
        Some((scale, ratio)) => {
            let mut rng =
                SplitMix64::new(derive_seed(&[crop_seed, hash_bytes(crop_key.as_bytes())]));
            jittered_crop(width, height, scale, ratio, &mut rng)
        }
    };
    let p = naflex.patch_size;
    // Crop sides are whole pixels (the whole image, or jittered_crop's rounded sides).
    let (basis_h, basis_w) = if whole_image_grid {
        (height, width)
    } else {
        (region.h as u32, region.w as u32)
    };
    let (rows, cols) = grid_for_max_patches(basis_h, basis_w, p, naflex.max_num_patches);
    let patches = rows as u64 * cols as u64;
    if patches < naflex.min_num_patches as u64 {
        return Err((
            Reason::TooFewPatches,
            format!(
                "{}x{} gives a {rows}x{cols} grid of {p}px patches under max_num_patches={}, fewer than min_num_patches={}",
                region.w, region.h, naflex.max_num_patches, naflex.min_num_patches
            ),
        ));
    }
    // validate() keeps the budget at least one patch, and a token-budget bucket is at least
    // its images' grids, so the grid fits the slot; checked anyway, since a grid past the slot
    // would write past the batch.
    let slot_patches = (slot.len() / naflex.patch_len()) as u64;
    if patches > naflex.max_num_patches as u64 || patches > slot_patches {
        return Err((
            Reason::Internal,
            format!(
                "grid {rows}x{cols} exceeds max_num_patches={} or its slot of {slot_patches} patches",
                naflex.max_num_patches
            ),
        ));
    }
    let target = (cols * p, rows * p);
    let img = decoder
        .decode_to(
            bytes,
            &probe,
            region,
            target,
            spec.max_pixels,
            !*whole_images,
        )
        .map_err(|e| (e.reason, e.detail))?;
    let scaled = region.rescaled((width, height), img.size());
    let (filled, padding) = slot.split_at_mut(patches as usize * naflex.patch_len());
    transformer
        .resize_into_patches(&img, scaled, (rows, cols), p, Kernel::Bilinear, filled)
        .map_err(|e| (e.reason, e.detail))?;
    padding.fill(0);
    Ok((rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{jpeg, raw};

    fn spec(patch_size: u32, max_num_patches: u32) -> NaFlexSpec {
        NaFlexSpec {
            patch_size,
            max_num_patches,
            min_num_patches: 0,
            random_crop: None,
        }
    }

    fn run(
        image: &[u8],
        key: &str,
        naflex: &NaFlexSpec,
        seed: u64,
    ) -> Result<(Vec<u8>, (u32, u32)), Rejection> {
        let mut slot = vec![7u8; naflex.slot_len()];
        let grid = prepare_image(
            image,
            key,
            &SampleSpec::default(),
            naflex,
            seed,
            false,
            &mut Worker::default(),
            &mut slot,
        )?;
        Ok((slot, grid))
    }

    #[test]
    fn a_sample_gives_its_caption_its_grid_and_zeros_after_its_patches() {
        let image = jpeg(64, 48);
        let naflex = spec(4, 50);
        let mut slot = vec![7u8; naflex.slot_len()];
        let sample = raw("k", &[("jpg", &image), ("txt", b" a gradient ")]);
        let (text, grid) = prepare(
            &sample,
            &SampleSpec::default(),
            &naflex,
            0,
            &mut Worker::default(),
            &mut slot,
        )
        .unwrap();
        assert_eq!(text, "a gradient");
        assert_eq!(grid, grid_for_max_patches(48, 64, 4, 50));
        let used = (grid.0 * grid.1) as usize * naflex.patch_len();
        assert!(used < slot.len());
        assert!(
            slot[used..].iter().all(|&v| v == 0),
            "padding patches are zeros"
        );
        assert!(slot[..used].iter().any(|&v| v != 0));
        // The gradient's red grows along x: the first patch's first pixel is redder at the
        // right end of the first row of patches than at the left.
        let cols = grid.1 as usize;
        assert!(slot[(cols - 1) * naflex.patch_len()] > slot[0] + 100);
    }

    #[test]
    fn bad_inputs_give_the_reference_grid_or_a_typed_reason() {
        // 1 x 10000 (a PNG: the JPEG encoder caps sides at 65535 but this stays small).
        let line =
            ::image::RgbImage::from_fn(10000, 1, |x, _| ::image::Rgb([(x % 256) as u8, 0, 0]));
        let mut png = std::io::Cursor::new(Vec::new());
        line.write_to(&mut png, ::image::ImageFormat::Png).unwrap();
        let (_, grid) = run(png.get_ref(), "k", &spec(16, 256), 0).unwrap();
        assert_eq!(grid, (1, 256), "the reference's 16x4096");
        let dot = ::image::RgbImage::from_pixel(1, 1, ::image::Rgb([200, 100, 50]));
        let mut png = std::io::Cursor::new(Vec::new());
        dot.write_to(&mut png, ::image::ImageFormat::Png).unwrap();
        let (slot, grid) = run(png.get_ref(), "k", &spec(16, 256), 0).unwrap();
        assert_eq!(grid, (7, 7), "the reference's 112x112");
        assert_eq!(&slot[..3], &[200, 100, 50]);
        // An aspect that holds one side at one patch has fewer patches than a minimum asks.
        let min = NaFlexSpec {
            min_num_patches: 200,
            ..spec(16, 256)
        };
        // 8 x 1200 at 16 px: one column holds at most 150 rows (scale 2); a second column
        // would need 151 rows more, past the budget. The reference gives 150 patches.
        let tall = jpeg(8, 1200);
        assert_eq!(run(&tall, "k", &spec(16, 256), 0).unwrap().1, (150, 1));
        let (why, detail) = run(&tall, "k", &min, 0).unwrap_err();
        assert_eq!(why, Reason::TooFewPatches);
        assert!(detail.contains("min_num_patches=200"), "{detail}");
        // Budgets under one patch, or a minimum above the budget, are refused up front.
        assert!(spec(16, 0)
            .validate()
            .unwrap_err()
            .contains("max_num_patches"));
        assert!(spec(0, 16).validate().unwrap_err().contains("patch_size"));
        assert!(min.validate().is_ok());
        let over = NaFlexSpec {
            min_num_patches: 300,
            ..spec(16, 256)
        };
        assert!(over.validate().unwrap_err().contains("min_num_patches"));
    }

    #[test]
    fn random_crops_are_seeded_by_seed_and_key_and_the_whole_image_by_neither() {
        let image = jpeg(96, 64);
        let random = NaFlexSpec {
            random_crop: Some(((0.3, 0.6), (0.8, 1.25))),
            ..spec(4, 64)
        };
        let a = run(&image, "a", &random, 3).unwrap();
        assert_eq!(run(&image, "a", &random, 3).unwrap(), a);
        let moved = (0..8).any(|s| run(&image, "a", &random, s).unwrap() != a);
        assert!(moved, "the seed moves the crop");
        let whole = spec(4, 64);
        assert_eq!(
            run(&image, "a", &whole, 1).unwrap(),
            run(&image, "b", &whole, 2).unwrap()
        );
    }
}
