//! Where a unit's documents are and how large they may be (`DocumentSpec`, `Layout`), and the
//! rules every layout's documents pass: aligned text and image lists, and the caps on images
//! and bytes.

use super::captions::CaptionKeys;
use super::conversation::ChatFormat;
use super::parts::Part;
use crate::batch::kit::sample::Rejection;
use crate::error::Reason;
use crate::read::parquet::lists::List;

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
            (None, Some(b)) => Part::visual(b),
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
