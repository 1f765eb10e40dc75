//! One sample from raw members to (pixels in a batch slot, caption): the per-sample hot path
//! shared by the loader and by `validate`, so both accept and reject exactly the same samples.

use crate::defaults;
use crate::error::Reason;
use crate::image::decode::Decoder;
use crate::image::resize::{crop_box, CropMode, Transformer};
use crate::read::group::RawSample;
use crate::rng::{derive_seed, hash_bytes, SplitMix64};

/// Where the caption comes from: a text member (`txt`), or a field of a JSON member
/// (`json:caption` reads `caption` from the `json` member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptionSource {
    Member(String),
    JsonField {
        member: String,
        field: String,
    },
    /// No caption wanted (image-only datasets).
    None,
}

impl CaptionSource {
    pub fn parse(spec: &str) -> CaptionSource {
        if spec.is_empty() {
            return CaptionSource::None;
        }
        match spec.split_once(':') {
            Some((member, field)) => CaptionSource::JsonField {
                member: member.to_string(),
                field: field.to_string(),
            },
            None => CaptionSource::Member(spec.to_string()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct SampleSpec {
    /// Extensions tried in order for the image.
    pub image_keys: Vec<String>,
    pub caption: CaptionSource,
    pub image_size: u32,
    pub crop: CropMode,
    pub max_pixels: u64,
}

impl Default for SampleSpec {
    fn default() -> Self {
        Self {
            image_keys: defaults::image_keys(),
            caption: CaptionSource::parse(defaults::CAPTION_KEY),
            image_size: defaults::IMAGE_SIZE,
            crop: CropMode::Center,
            max_pixels: defaults::MAX_PIXELS,
        }
    }
}

pub type Rejection = (Reason, String);

/// Per-thread state for the hot path.
#[derive(Default)]
pub struct Worker {
    pub decoder: Decoder,
    pub transformer: Transformer,
    /// Decode every row of an image even when the crop needs fewer, so that corruption
    /// anywhere in it is found: what validation and index scans want; the loader does not.
    pub whole_images: bool,
}

impl Worker {
    /// A worker that checks whole images (see [`Worker::whole_images`]).
    pub fn validating() -> Worker {
        Worker {
            whole_images: true,
            ..Worker::default()
        }
    }
}

/// The caption of a sample, checked (UTF-8, present).
pub fn caption(raw: &RawSample, source: &CaptionSource) -> Result<String, Rejection> {
    match source {
        CaptionSource::None => Ok(String::new()),
        CaptionSource::Member(ext) => {
            let bytes = raw
                .get(ext)
                .ok_or_else(|| (Reason::MissingCaption, format!("no {ext:?} member")))?;
            std::str::from_utf8(bytes)
                .map(|s| s.trim().to_string())
                .map_err(|e| (Reason::BadUtf8, format!("{ext:?} member: {e}")))
        }
        CaptionSource::JsonField { member, field } => {
            let bytes = raw
                .get(member)
                .ok_or_else(|| (Reason::MissingCaption, format!("no {member:?} member")))?;
            let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
                (
                    Reason::BadUtf8,
                    format!("{member:?} member is not valid JSON: {e}"),
                )
            })?;
            match value.get(field) {
                Some(serde_json::Value::String(s)) => Ok(s.trim().to_string()),
                Some(serde_json::Value::Null) | None => Err((
                    Reason::MissingCaption,
                    format!("{member:?} has no field {field:?}"),
                )),
                Some(other) => Ok(other.to_string()),
            }
        }
    }
}

/// The image member of a sample.
pub fn image_bytes<'a>(raw: &'a RawSample, keys: &[String]) -> Result<&'a [u8], Rejection> {
    keys.iter().find_map(|k| raw.get(k)).ok_or_else(|| {
        (
            Reason::MissingImage,
            format!("no member with extension {keys:?}"),
        )
    })
}

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
    let probe = worker
        .decoder
        .probe(bytes)
        .map_err(|e| (e.reason, e.detail))?;
    if probe.width as u64 * probe.height as u64 > spec.max_pixels {
        return Err((
            Reason::TooManyPixels,
            format!(
                "{}x{} exceeds max_pixels={}",
                probe.width, probe.height, spec.max_pixels
            ),
        ));
    }
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

/// Real inputs for the crate's unit tests: JPEGs encoded here, tar shards written the way
/// webdataset writers write them, and a scratch directory per test.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    use crate::read::group::RawSample;

    /// A sample as grouping yields it, keyed `key`, holding `members` (extension, bytes).
    pub fn raw(key: &str, members: &[(&str, &[u8])]) -> RawSample {
        RawSample {
            key: key.into(),
            members: members
                .iter()
                .map(|(e, d)| (e.to_string(), d.to_vec()))
                .collect(),
            offset: 0,
            ordinal: 0,
            defect: None,
        }
    }

    /// A `w` x `h` baseline JPEG of a colour gradient, encoded by the `image` crate.
    pub fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = ::image::RgbImage::from_fn(w, h, |x, y| {
            ::image::Rgb([
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + y) % 256) as u8,
            ])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ::image::ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    /// An uncompressed ustar archive of these members, with its end-of-archive blocks.
    pub fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            let mut header = [0u8; 512];
            header[..name.len()].copy_from_slice(name.as_bytes());
            header[100..107].copy_from_slice(b"0000644");
            header[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
            header[136..147].copy_from_slice(b"00000000000");
            header[156] = b'0';
            header[257..263].copy_from_slice(b"ustar\0");
            header[263..265].copy_from_slice(b"00");
            header[148..156].fill(b' ');
            let sum: u32 = header.iter().map(|&b| b as u32).sum();
            header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
            out.extend_from_slice(&header);
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    /// An empty directory of its own for one test (`name` tells the tests apart).
    pub fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ss-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::jpeg;
    use super::*;

    fn raw(members: &[(&str, &[u8])]) -> RawSample {
        super::fixtures::raw("000042", members)
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
    fn a_caption_source_is_a_member_a_json_field_or_none() {
        assert_eq!(CaptionSource::parse(""), CaptionSource::None);
        assert_eq!(
            CaptionSource::parse("txt"),
            CaptionSource::Member("txt".into())
        );
        assert_eq!(
            CaptionSource::parse("json:caption"),
            CaptionSource::JsonField {
                member: "json".into(),
                field: "caption".into()
            }
        );
    }

    #[test]
    fn captions_are_read_trimmed_from_their_source_and_refused_with_a_reason() {
        let txt = CaptionSource::parse("txt");
        let json = CaptionSource::parse("json:caption");
        let sample = raw(&[
            ("txt", b"  a dog on a beach \n"),
            (
                "json",
                br#"{"caption": " from json ", "n": 5, "gone": null}"#,
            ),
        ]);
        assert_eq!(caption(&sample, &txt).unwrap(), "a dog on a beach");
        assert_eq!(caption(&sample, &json).unwrap(), "from json");
        // A field that is not a string is its JSON text.
        assert_eq!(
            caption(&sample, &CaptionSource::parse("json:n")).unwrap(),
            "5"
        );
        assert_eq!(caption(&sample, &CaptionSource::None).unwrap(), "");
        let missing = [
            CaptionSource::parse("json:gone"),
            CaptionSource::parse("json:absent"),
            CaptionSource::parse("caption"),
        ];
        for source in &missing {
            assert_eq!(reason(caption(&sample, source)), Reason::MissingCaption);
        }
        let bad = raw(&[("txt", b"caf\xe9"), ("json", b"{not json")]);
        assert_eq!(reason(caption(&bad, &txt)), Reason::BadUtf8);
        assert_eq!(reason(caption(&bad, &json)), Reason::BadUtf8);
    }

    #[test]
    fn the_image_is_the_first_member_with_one_of_the_image_extensions() {
        let keys = SampleSpec::default().image_keys;
        let sample = raw(&[("txt", b"t"), ("webp", b"W"), ("jpeg", b"J")]);
        // Extensions are tried in the spec's order, not the tar's.
        assert_eq!(image_bytes(&sample, &keys).unwrap(), b"J");
        let (why, detail) = image_bytes(&raw(&[("txt", b"t")]), &keys).unwrap_err();
        assert_eq!(why, Reason::MissingImage);
        assert!(detail.contains("jpg"), "{detail}");
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
