//! Image-caption pairs (a WebDataset tar of `KEY.jpg` + `KEY.txt`, as CLIP data is) as
//! one-image documents: the image, then its caption, which the model learns. This is how a VLM
//! mixture takes caption data beside interleaved documents.

use super::parts::{Document, DocumentResult, Part};
use crate::batch::kit::sample::Rejection;
use crate::error::Reason;
use crate::read::group::RawSample;

/// Which members of a sample are its image and its caption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptionKeys {
    /// The image member: the first of these extensions the sample has.
    pub image_keys: Vec<String>,
    /// The caption member's extension.
    pub caption_key: String,
}

/// A tar sample's pair as a document, or why it cannot be one.
pub fn caption_document(mut raw: RawSample, keys: &CaptionKeys) -> DocumentResult {
    let key = raw.key.clone();
    caption_parts(&mut raw, keys)
        .map(|parts| Document {
            key: key.clone(),
            parts,
        })
        .map_err(|r| (key, r))
}

fn caption_parts(raw: &mut RawSample, keys: &CaptionKeys) -> Result<Vec<Part>, Rejection> {
    if let Some(defect) = raw.defect.take() {
        return Err(defect);
    }
    let mut take = |ext: &str| {
        raw.members
            .iter_mut()
            .find(|(e, _)| e == ext)
            .map(|(_, bytes)| std::mem::take(bytes))
    };
    let image = keys
        .image_keys
        .iter()
        .find_map(|k| take(k))
        .ok_or_else(|| {
            (
                Reason::MissingImage,
                format!("no image member (looked for {:?})", keys.image_keys),
            )
        })?;
    let caption = take(&keys.caption_key).ok_or_else(|| {
        (
            Reason::MissingText,
            format!("no caption member {:?}", keys.caption_key),
        )
    })?;
    let caption = String::from_utf8(caption)
        .map_err(|e| (Reason::BadUtf8, format!("caption: {}", e.utf8_error())))?;
    if caption.trim().is_empty() {
        return Err((Reason::MissingText, "an empty caption".into()));
    }
    Ok(vec![Part::Image(image), Part::Text(caption)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(members: &[(&str, &[u8])]) -> RawSample {
        RawSample {
            key: "k".into(),
            members: members
                .iter()
                .map(|(e, b)| (e.to_string(), b.to_vec()))
                .collect(),
            offset: 0,
            ordinal: 0,
            defect: None,
        }
    }

    fn keys() -> CaptionKeys {
        CaptionKeys {
            image_keys: vec!["jpg".into(), "png".into()],
            caption_key: "txt".into(),
        }
    }

    #[test]
    fn a_pair_is_its_image_then_its_caption() {
        let doc = caption_document(sample(&[("txt", b"a cat"), ("png", b"P")]), &keys()).unwrap();
        assert_eq!(
            doc.parts,
            vec![Part::Image(b"P".to_vec()), Part::Text("a cat".into())]
        );
    }

    #[test]
    fn a_pair_without_its_image_or_caption_is_refused_with_the_reason() {
        let reason = |m: &[(&str, &[u8])]| caption_document(sample(m), &keys()).unwrap_err().1 .0;
        assert_eq!(reason(&[("txt", b"a cat")]), Reason::MissingImage);
        assert_eq!(reason(&[("jpg", b"J")]), Reason::MissingText);
        assert_eq!(
            reason(&[("jpg", b"J"), ("txt", b"  ")]),
            Reason::MissingText
        );
        assert_eq!(reason(&[("jpg", b"J"), ("txt", b"\xff")]), Reason::BadUtf8);
    }
}
