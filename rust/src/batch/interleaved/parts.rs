//! A document's parts (text the model learns, prompts it is given, encoded images and videos) and the
//! document they make; the part every layout takes out of a tar sample by name (`take_member`).
//! The lowest of the kind's document files: `captions`, `conversation`, `document_spec`,
//! `parquet_documents` and `documents` build on it.

use crate::batch::kit::sample::Rejection;
use crate::error::Reason;
use crate::read::group::RawSample;

/// One part of a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text the model learns (its tokens are labels).
    Text(String),
    /// Text the model is given but does not learn (a conversation's prompts, under
    /// `assistant_only`): its labels are masked.
    Prompt(String),
    /// An encoded image (JPEG, PNG or WebP).
    Image(Vec<u8>),
    /// A video file (a container FFmpeg opens: MP4, WebM, MKV, MOV, ...).
    Video(Vec<u8>),
}

/// A document: its key and its parts in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    pub key: String,
    pub parts: Vec<Part>,
}

impl Document {
    /// Bytes of its texts and encoded images.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(Part::bytes).sum()
    }
}

impl Part {
    /// Bytes of its text or encoded image.
    pub fn bytes(&self) -> usize {
        match self {
            Part::Text(t) | Part::Prompt(t) => t.len(),
            Part::Image(b) | Part::Video(b) => b.len(),
        }
    }
}

impl Part {
    /// An entry of a document's image list: a video when its bytes open as an ISO media file
    /// (MP4, MOV: an `ftyp` box first) or a Matroska one (WebM, MKV: the EBML magic), the
    /// containers video datasets ship; else an image (whose format its decoder judges). So a
    /// document holds a video where it holds an image, in a Parquet list as in a tar's JSON.
    pub fn visual(bytes: Vec<u8>) -> Part {
        let iso_media = bytes.len() >= 12 && &bytes[4..8] == b"ftyp";
        let matroska = bytes.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]);
        if iso_media || matroska {
            Part::Video(bytes)
        } else {
            Part::Image(bytes)
        }
    }
}

/// A document, or its key and why it was skipped.
pub type DocumentResult = Result<Document, (String, Rejection)>;

/// The member image entry `i` names by its extension (`"0.jpg"` for `KEY.0.jpg`), moved out of
/// the sample, or copied when a later entry names it `again`. A URL is never fetched
/// (`image_url_only`); a member the sample lacks is `missing_image`.
pub(super) fn take_member(
    raw: &mut RawSample,
    i: usize,
    name: &str,
    again: bool,
) -> Result<Vec<u8>, Rejection> {
    if name.contains("://") {
        return Err((
            Reason::ImageUrlOnly,
            format!("image {i} is given only as a URL; nothing is fetched"),
        ));
    }
    let ext = name.to_lowercase();
    let Some(at) = raw.members.iter().position(|(e, _)| *e == ext) else {
        return Err((
            Reason::MissingImage,
            format!(
                "image {i} names the member {}.{name}, which the sample lacks",
                raw.key
            ),
        ));
    };
    let member = &mut raw.members[at].1;
    Ok(if again {
        member.clone()
    } else {
        std::mem::take(member)
    })
}
