//! What every kind that reads image-text samples takes a sample by: where its caption and image
//! are (`CaptionSource`, `SampleSpec`), the checked caption and image member, a refusal
//! (`Rejection`), the per-thread decoder (`Worker`), and an image's header read under the pixel
//! cap before any pixel is decoded (`probe_capped`). The loader, `validate` and the count passes
//! use these same functions, so all of them accept and refuse exactly the same samples.

use crate::defaults;
use crate::error::Reason;
use crate::image::decode::{Decoder, Probe};
use crate::image::resize::{CropMode, Transformer};
use crate::read::group::RawSample;

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

/// Why a sample (or a document, or an image) is not used: its typed reason and a detail.
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

/// The header of an encoded image, nothing decoded; refused when it does not parse, or when the
/// image stores more than `max_pixels` pixels (a pixel bomb is refused before any decoding).
pub fn probe_capped(
    decoder: &mut Decoder,
    bytes: &[u8],
    max_pixels: u64,
) -> Result<Probe, Rejection> {
    let probe = decoder.probe(bytes).map_err(|e| (e.reason, e.detail))?;
    if probe.width as u64 * probe.height as u64 > max_pixels {
        return Err((
            Reason::TooManyPixels,
            format!(
                "{}x{} exceeds max_pixels={max_pixels}",
                probe.width, probe.height
            ),
        ));
    }
    Ok(probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(members: &[(&str, &[u8])]) -> RawSample {
        crate::fixtures::raw("000042", members)
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
}
