//! One sample from raw members to (pixels in a batch slot, caption): the per-sample hot path
//! shared by the loader and by `validate`, so both accept and reject exactly the same samples.

use crate::decode::Decoder;
use crate::error::Reason;
use crate::group::RawSample;
use crate::resize::{crop_box, CropMode, Transformer};
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
            image_keys: ["jpg", "jpeg", "png", "webp"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            caption: CaptionSource::Member("txt".into()),
            image_size: 224,
            crop: CropMode::Center,
            max_pixels: 64_000_000,
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

/// Real inputs for the crate's unit tests: JPEGs encoded here, tar shards written the way
/// webdataset writers write them, and a scratch directory per test.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    /// A `w` x `h` baseline JPEG of a colour gradient, encoded by the `image` crate.
    pub fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + y) % 256) as u8,
            ])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
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
