//! The square image-text kind's slot: one sample from raw members to its caption and its
//! `[3, S, S]` pixels in a batch slot (the pixel cap read from the header, the crop, resize and
//! layout). Shared by the loader and by `validate` (`check::scan`), so both accept and refuse
//! exactly the same samples.

use crate::batch::kit::sample::{
    caption, image_bytes, probe_capped, Rejection, SampleSpec, Worker,
};
use crate::image::resize::crop_box;
use crate::read::group::RawSample;
use crate::rng::{derive_seed, hash_bytes, SplitMix64};

/// Validates and decodes `raw`, writing [3, S, S] pixels into `slot`; returns the caption.
/// `crop_seed` makes random crops a function of (seed, epoch, key), independent of threading.
pub fn prepare(
    raw: &RawSample,
    spec: &SampleSpec,
    crop_seed: u64,
    worker: &mut Worker,
    slot: &mut [u8],
) -> Result<String, Rejection> {
    if let Some(defect) = &raw.defect {
        return Err(defect.clone());
    }
    let bytes = image_bytes(raw, &spec.image_keys)?;
    let text = caption(raw, &spec.caption)?;
    prepare_image(bytes, &raw.key, spec, crop_seed, worker, slot)?;
    Ok(text)
}

/// Decodes one encoded image into `slot` ([3, S, S]) as the loader does: the pixel cap from the
/// header, the crop (random crops seeded by `crop_seed` and `crop_key`), resize and layout.
pub fn prepare_image(
    bytes: &[u8],
    crop_key: &str,
    spec: &SampleSpec,
    crop_seed: u64,
    worker: &mut Worker,
    slot: &mut [u8],
) -> Result<(), Rejection> {
    let probe = probe_capped(&mut worker.decoder, bytes, spec.max_pixels)?;
    let displayed = probe.oriented_size();
    let mut rng = SplitMix64::new(derive_seed(&[crop_seed, hash_bytes(crop_key.as_bytes())]));
    let region = crop_box(displayed.0, displayed.1, spec.crop, &mut rng);
    let img = worker
        .decoder
        .decode(
            bytes,
            &probe,
            region,
            spec.image_size,
            spec.max_pixels,
            !worker.whole_images,
        )
        .map_err(|e| (e.reason, e.detail))?;
    let scaled = region.rescaled(displayed, img.size());
    worker
        .transformer
        .resize_into_chw(&img, scaled, spec.image_size, slot)
        .map_err(|e| (e.reason, e.detail))
}

/// The key an image decoded on its own (`decode_image`) is cropped as. Random crops are seeded by
/// (seed, sample key) so that they do not depend on threading; an image outside a shard has no
/// key, so it takes this fixed one: the same image and seed always give the same crop, the crop
/// a sample keyed "image" would get from the loader.
pub const STANDALONE_CROP_KEY: &str = "image";

/// Decodes one image that belongs to no sample into [3, S, S] pixels as the loader would (see
/// [`prepare_image`], cropped as key [`STANDALONE_CROP_KEY`]). `whole`: decode every row, as
/// validation does, so that corruption anywhere in the image is found.
pub fn decode_standalone_image(
    bytes: &[u8],
    spec: &SampleSpec,
    crop_seed: u64,
    whole: bool,
) -> Result<Vec<u8>, Rejection> {
    let mut worker = if whole {
        Worker::validating()
    } else {
        Worker::default()
    };
    let side = spec.image_size as usize;
    let mut pixels = vec![0u8; 3 * side * side];
    prepare_image(
        bytes,
        STANDALONE_CROP_KEY,
        spec,
        crop_seed,
        &mut worker,
        &mut pixels,
    )?;
    Ok(pixels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Reason;
    use crate::fixtures::jpeg;
    use crate::image::resize::CropMode;

    fn raw(members: &[(&str, &[u8])]) -> RawSample {
        crate::fixtures::raw("000042", members)
    }

    /// A random-resized crop to `size`, small enough a part of the image that where it falls shows.
    fn random_crop(size: u32) -> SampleSpec {
        SampleSpec {
            crop: CropMode::RandomResized {
                scale: (0.1, 0.3),
                ratio: (0.75, 1.333),
            },
            ..spec(size)
        }
    }

    fn spec(size: u32) -> SampleSpec {
        SampleSpec {
            image_size: size,
            ..SampleSpec::default()
        }
    }

    fn reason<T: std::fmt::Debug>(r: Result<T, Rejection>) -> Reason {
        r.unwrap_err().0
    }

    #[test]
    fn prepare_writes_the_slot_and_returns_the_caption_or_the_first_refusal() {
        let image = jpeg(40, 30);
        let mut worker = Worker::default();
        let mut slot = vec![0u8; 3 * 16 * 16];
        let good = raw(&[("jpg", &image), ("txt", b" a red square ")]);
        let text = prepare(&good, &spec(16), 0, &mut worker, &mut slot).unwrap();
        assert_eq!(text, "a red square");
        assert!(slot.iter().any(|&p| p != 0));
        // A defect found while reading comes first; then the image, then the caption.
        let mut defective = good.clone();
        defective.defect = Some((Reason::DuplicateMember, "two jpg".into()));
        let no_image = raw(&[("txt", b"t")]);
        let no_caption = raw(&[("jpg", &image)]);
        let neither = raw(&[("json", b"{}")]);
        let mut refused = |r: &RawSample| reason(prepare(r, &spec(16), 0, &mut worker, &mut slot));
        assert_eq!(refused(&defective), Reason::DuplicateMember);
        assert_eq!(refused(&no_image), Reason::MissingImage);
        assert_eq!(refused(&neither), Reason::MissingImage);
        assert_eq!(refused(&no_caption), Reason::MissingCaption);
        let garbage = raw(&[("jpg", b"not an image at all"), ("txt", b"t")]);
        assert!(matches!(
            refused(&garbage),
            Reason::CorruptImage | Reason::UnsupportedFormat
        ));
    }

    #[test]
    fn max_pixels_is_refused_from_the_header_before_any_pixel_is_decoded() {
        let image = jpeg(40, 30);
        // The header and the start of the entropy-coded data only: not decodable.
        let sos = image
            .windows(2)
            .position(|w| w == [0xFF, 0xDA])
            .expect("a start of scan");
        let header_only = &image[..sos + 16];
        let mut worker = Worker::validating();
        let mut slot = vec![0u8; 3 * 8 * 8];
        let capped = SampleSpec {
            max_pixels: 40 * 30 - 1,
            ..spec(8)
        };
        let (why, detail) =
            prepare_image(header_only, "k", &capped, 0, &mut worker, &mut slot).unwrap_err();
        assert_eq!(why, Reason::TooManyPixels);
        assert_eq!(detail, "40x30 exceeds max_pixels=1199");
        // At exactly the cap the image is decoded.
        let at_cap = SampleSpec {
            max_pixels: 40 * 30,
            ..spec(8)
        };
        prepare_image(&image, "k", &at_cap, 0, &mut worker, &mut slot).unwrap();
    }

    #[test]
    fn a_random_crop_is_a_function_of_the_seed_and_the_key_only() {
        let image = jpeg(64, 48);
        let random = random_crop(16);
        let pixels = |key: &str, seed: u64, worker: &mut Worker| {
            let mut slot = vec![0u8; 3 * 16 * 16];
            prepare_image(&image, key, &random, seed, worker, &mut slot).unwrap();
            slot
        };
        let mut worker = Worker::default();
        let first = pixels("a", 7, &mut worker);
        // The same on another worker, after other samples: no state carries over.
        let mut other = Worker::default();
        pixels("b", 1, &mut other);
        assert_eq!(pixels("a", 7, &mut other), first);
        let others: Vec<Vec<u8>> = (0..8).map(|s| pixels("a", s, &mut worker)).collect();
        assert!(
            others.iter().any(|p| *p != first),
            "the seed moves the crop"
        );
        let keys: Vec<Vec<u8>> = ["c", "d", "e", "f"]
            .iter()
            .map(|k| pixels(k, 7, &mut worker))
            .collect();
        assert!(keys.iter().any(|p| *p != first), "the key moves the crop");
        // A centre crop does not depend on either.
        let mut center = |key: &str, seed: u64| {
            let mut slot = vec![0u8; 3 * 16 * 16];
            prepare_image(&image, key, &spec(16), seed, &mut worker, &mut slot).unwrap();
            slot
        };
        assert_eq!(center("a", 1), center("z", 2));
    }

    #[test]
    fn a_standalone_image_is_decoded_as_the_sample_keyed_image_would_be() {
        let image = jpeg(64, 48);
        let random = random_crop(16);
        let mut as_sample = vec![0u8; 3 * 16 * 16];
        prepare_image(
            &image,
            "image",
            &random,
            5,
            &mut Worker::default(),
            &mut as_sample,
        )
        .unwrap();
        assert_eq!(
            decode_standalone_image(&image, &random, 5, false).unwrap(),
            as_sample
        );
        assert_eq!(
            decode_standalone_image(&image, &random, 5, true).unwrap(),
            as_sample
        );
        let truncated = &image[..image.len() / 3];
        assert_eq!(
            reason(decode_standalone_image(truncated, &spec(16), 0, true)),
            Reason::CorruptImage
        );
    }
}
