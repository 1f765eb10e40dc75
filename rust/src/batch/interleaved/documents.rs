//! A unit's interleaved documents, in file order: each an ordered sequence of text segments and
//! encoded images, checked (aligned, present, valid UTF-8, within the caps) but not decoded.
//!
//! The layouts:
//! - Parquet (OBELICS, OmniCorpus): aligned list columns `texts` (strings) and `images`
//!   (binary, or the `datasets` Image struct `bytes`, `path`); at each position exactly one of
//!   the two holds a value. A unit is the whole file, read a row group at a time and a row group
//!   a piece of rows at a time (`parquet_documents`), so a row group's size never sets memory.
//! - WebDataset tars (MINT-1T, Energon): `KEY.json` holding `texts` and `images` lists whose
//!   image entries name members of the same sample by extension (`"0.jpg"` for `KEY.0.jpg`).
//! - Conversations (LLaVA, LLaVA-OneVision, the Cauldron), in tars or Parquet: see
//!   `conversation`, which renders them into parts, and `parquet_documents`.
//! - Image-caption pairs, in tars or Parquet: see `captions` (one-image documents).
//!
//! A document that cannot be used is a counted skip with a typed reason, the same in the count
//! pass and the loader.

use std::sync::Arc;

use super::captions::{caption_document, CaptionKeys};
use super::conversation::{conversation_document, ChatFormat};
use super::parquet_documents::ParquetRows;
use crate::batch::packed::TextUnit;
use crate::batch::sample::Rejection;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{open_shard, RawSample, SampleReader};
use crate::read::parquet::lists::List;
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{Expected, SourceOptions, SourceStats};

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
            Part::Image(b) => b.len(),
        }
    }
}

/// A document, or its key and why it was skipped.
pub type DocumentResult = Result<Document, (String, Rejection)>;

/// Where a document's lists are and how large it may be.
#[derive(Clone, Debug)]
pub struct DocumentSpec {
    /// The text list: a Parquet column, or the field of a tar sample's JSON member.
    pub texts: String,
    /// The image list, likewise.
    pub images: String,
    /// A document with more images is skipped (`too_many_images`).
    pub max_images: u32,
    /// A document (or a tar member) of more bytes is skipped (`member_too_large`).
    pub max_document_bytes: u64,
    /// What a sample is (`texts` and `images` serve `Layout::Lists` alone).
    pub layout: Layout,
}

/// How a unit's samples are documents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Aligned `texts` and `images` lists: Parquet columns, or a tar sample's JSON member.
    #[default]
    Lists,
    /// A LLaVA conversation (a tar sample's JSON, or a Parquet row's turns column), rendered by
    /// this chat format.
    Conversations(ChatFormat),
    /// An image-caption pair (a tar sample's members, or a Parquet row's columns), as a
    /// one-image document.
    Captions(CaptionKeys),
}

enum Rows {
    Parquet(Box<super::parquet_documents::ParquetRows>),
    Tar(Box<SampleReader>),
}

/// The documents of one unit, in order.
pub struct UnitDocuments {
    rows: Rows,
    spec: DocumentSpec,
    display: String,
}

impl UnitDocuments {
    pub fn open(
        unit: &TextUnit,
        spec: &DocumentSpec,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, Fault> {
        let display = unit.display();
        let expected = Expected::from_identity(unit.identity.as_deref());
        let fault = |reason: Reason, detail: String, kind: SourceKind| Fault {
            reason,
            url: display.clone(),
            key: String::new(),
            detail,
            kind,
        };
        let rows = if is_parquet_name(&unit.url) {
            let file = ParquetFile::open(&unit.url, &expected, opts, stats)
                .map_err(|f| fault(f.reason, f.detail, f.kind))?;
            let rows = ParquetRows::new(file, unit.first_row, unit.rows, &unit.url)
                .map_err(|detail| fault(Reason::Unreadable, detail, SourceKind::Other))?;
            Rows::Parquet(Box::new(rows))
        } else {
            let reader = open_shard(
                &unit.url,
                0,
                0,
                spec.max_document_bytes,
                &expected,
                opts,
                stats,
            )
            .map_err(|f| fault(f.reason, f.detail, f.kind))?;
            Rows::Tar(Box::new(reader))
        };
        Ok(Self {
            rows,
            spec: spec.clone(),
            display,
        })
    }

    /// The next document, or the fault that ends the unit.
    pub fn next_document(&mut self) -> Option<Result<DocumentResult, Fault>> {
        match &mut self.rows {
            Rows::Parquet(rows) => rows.next_document(&self.spec).map(|r| {
                r.map_err(|f| Fault {
                    reason: f.reason,
                    url: self.display.clone(),
                    key: String::new(),
                    detail: f.detail,
                    kind: f.kind,
                })
            }),
            Rows::Tar(reader) => Some(match reader.next()? {
                Err(f) => Err(Fault {
                    reason: f.reason,
                    url: self.display.clone(),
                    key: String::new(),
                    detail: f.detail,
                    kind: f.kind,
                }),
                Ok(raw) => Ok(self.document(raw)),
            }),
        }
    }
}

impl UnitDocuments {
    /// A tar sample's document under the layout, within the caps.
    fn document(&self, raw: RawSample) -> DocumentResult {
        let doc = match &self.spec.layout {
            Layout::Lists => return tar_document(raw, &self.spec),
            Layout::Conversations(format) => conversation_document(raw, format)?,
            Layout::Captions(keys) => caption_document(raw, keys)?,
        };
        match check_caps(&doc.parts, &self.spec) {
            Ok(()) => Ok(doc),
            Err(r) => Err((doc.key, r)),
        }
    }
}

/// The parts of aligned `texts` and `images` lists (with the images' `path`s, when the images
/// are structs).
/// `oversized`: the document's bytes when a list's values passed `max_document_bytes` as they
/// were read (those from there on are empty here): it is refused for its size, after the checks
/// of its shape.
pub(super) fn aligned(
    texts: List,
    images: List,
    paths: List,
    spec: &DocumentSpec,
    oversized: Option<u64>,
) -> Result<Vec<Part>, Rejection> {
    let misaligned = |detail: String| Err((Reason::MisalignedDocument, detail));
    let (texts, images) = match (texts, images) {
        (Some(t), Some(i)) => (t, i),
        _ => return misaligned("a null texts or images list".into()),
    };
    if texts.len() != images.len() {
        return misaligned(format!(
            "{} texts but {} images: the lists must be aligned",
            texts.len(),
            images.len()
        ));
    }
    let mut parts = Vec::with_capacity(texts.len());
    for (i, (text, image)) in texts.into_iter().zip(images).enumerate() {
        let path = paths.as_ref().and_then(|p| p.get(i).cloned().flatten());
        let part = match (text, image) {
            (Some(_), Some(_)) => {
                return misaligned(format!("position {i} holds both a text and an image"))
            }
            (Some(t), None) => match String::from_utf8(t) {
                Ok(t) => Part::Text(t),
                Err(e) => return Err((Reason::BadUtf8, format!("text {i}: {}", e.utf8_error()))),
            },
            (None, Some(b)) => Part::Image(b),
            (None, None) if path.is_some() => {
                return Err((
                    Reason::ImageUrlOnly,
                    format!("image {i} is given only as a URL or path; nothing is fetched"),
                ))
            }
            (None, None) => return misaligned(format!("position {i} holds neither")),
        };
        parts.push(part);
    }
    let images = parts.iter().filter(|p| matches!(p, Part::Image(_))).count();
    let bytes = oversized.unwrap_or_else(|| parts.iter().map(|p| p.bytes() as u64).sum());
    caps(images, bytes, parts.is_empty(), spec)?;
    Ok(parts)
}

/// A document's images and bytes within the caps, and not empty.
pub(super) fn check_caps(parts: &[Part], spec: &DocumentSpec) -> Result<(), Rejection> {
    let images = parts.iter().filter(|p| matches!(p, Part::Image(_))).count();
    let bytes = parts.iter().map(|p| p.bytes() as u64).sum();
    caps(images, bytes, parts.is_empty(), spec)
}

/// A document of `images` images and `bytes` bytes within the caps, and not `empty`.
fn caps(images: usize, bytes: u64, empty: bool, spec: &DocumentSpec) -> Result<(), Rejection> {
    if images > spec.max_images as usize {
        return Err((
            Reason::TooManyImages,
            format!(
                "{images} images, more than max_images_per_document={}",
                spec.max_images
            ),
        ));
    }
    if bytes > spec.max_document_bytes {
        return Err((
            Reason::MemberTooLarge,
            format!(
                "{bytes} bytes, more than max_document_bytes={}",
                spec.max_document_bytes
            ),
        ));
    }
    if empty {
        return Err((Reason::MissingText, "an empty document".into()));
    }
    Ok(())
}

/// A tar sample's document: its JSON member's lists, images named as members.
fn tar_document(mut raw: RawSample, spec: &DocumentSpec) -> DocumentResult {
    let key = raw.key.clone();
    let fail = |r: Rejection| Err((key.clone(), r));
    if let Some(defect) = raw.defect.take() {
        return fail(defect);
    }
    let Some(json) = raw.get("json") else {
        return fail((Reason::MissingText, "no json member".into()));
    };
    let mut value: serde_json::Value = match serde_json::from_slice(json) {
        Ok(v) => v,
        Err(e) => return fail((Reason::BadJson, format!("json member: {e}"))),
    };
    let mut list = |name: &str| match value.get_mut(name).map(serde_json::Value::take) {
        Some(serde_json::Value::Array(items)) => Ok(items),
        _ => Err((
            Reason::MisalignedDocument,
            format!("the json member has no {name:?} list"),
        )),
    };
    let (texts, images) = match (list(&spec.texts), list(&spec.images)) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    if texts.len() != images.len() {
        return fail((
            Reason::MisalignedDocument,
            format!(
                "{} texts but {} images: the lists must be aligned",
                texts.len(),
                images.len()
            ),
        ));
    }
    let mut parts = Vec::with_capacity(texts.len());
    for (i, (text, image)) in texts.into_iter().zip(&images).enumerate() {
        use serde_json::Value::{Null, String as Text};
        let part = match (text, image) {
            (Text(t), Null) => Part::Text(t),
            (Null, Text(name)) => {
                let again = images[i + 1..].iter().any(|n| n.as_str() == Some(name));
                match take_member(&mut raw, i, name, again) {
                    Ok(bytes) => Part::Image(bytes),
                    Err(r) => return fail(r),
                }
            }
            _ => {
                return fail((
                    Reason::MisalignedDocument,
                    format!(
                    "position {i} must hold a text string or an image name, not both or neither"
                ),
                ))
            }
        };
        parts.push(part);
    }
    if let Err(r) = check_caps(&parts, spec) {
        return fail(r);
    }
    Ok(Document { key, parts })
}

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
