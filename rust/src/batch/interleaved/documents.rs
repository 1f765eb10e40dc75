//! A unit's interleaved documents, in file order: each an ordered sequence of text segments and
//! encoded images, checked (aligned, present, valid UTF-8, within the caps) but not decoded.
//!
//! Two layouts:
//! - Parquet (OBELICS, OmniCorpus): aligned list columns `texts` (strings) and `images`
//!   (binary, or the `datasets` Image struct `bytes`, `path`); at each position exactly one of
//!   the two holds a value. A unit is the whole file, read a row group at a time (each row group
//!   whole: this kind does not read Parquet in pieces yet).
//! - WebDataset tars (MINT-1T, Energon): `KEY.json` holding `texts` and `images` lists whose
//!   image entries name members of the same sample by extension (`"0.jpg"` for `KEY.0.jpg`).
//! - Conversations in tars (LLaVA): see `conversation`, which renders them into parts.
//! - Image-caption pairs in tars: see `captions` (one-image documents).
//!
//! A document that cannot be used is a counted skip with a typed reason, the same in the count
//! pass and the loader.

use std::collections::VecDeque;
use std::sync::Arc;

use super::captions::{caption_document, CaptionKeys};
use super::conversation::{conversation_document, ChatFormat};
use crate::batch::packed::TextUnit;
use crate::batch::sample::Rejection;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{open_shard, RawSample, SampleReader};
use crate::read::parquet::lists::{read_lists, List};
use crate::read::parquet::values::read_leaf;
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
    /// A tar sample's LLaVA conversation, rendered by this chat format.
    Conversations(ChatFormat),
    /// A tar sample's image-caption pair, as a one-image document.
    Captions(CaptionKeys),
}

enum Rows {
    Parquet(Box<ParquetRows>),
    Tar(Box<SampleReader>),
}

/// A Parquet unit's row groups, read one at a time.
struct ParquetRows {
    file: ParquetFile,
    /// The next row group, its first row, and the row the unit ends at (None: the file's end).
    group: usize,
    first_row: u64,
    end_row: Option<u64>,
    ready: VecDeque<DocumentResult>,
    /// The file's name, for keys of rows without a key column.
    stem: String,
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
            if spec.layout != Layout::Lists {
                return Err(fault(
                    Reason::Unreadable,
                    "conversations and caption pairs are read from WebDataset tars, not Parquet"
                        .into(),
                    SourceKind::Other,
                ));
            }
            let file = ParquetFile::open(&unit.url, &expected, opts, stats)
                .map_err(|f| fault(f.reason, f.detail, f.kind))?;
            let counts = file.row_counts();
            let mut first = 0;
            let group = counts
                .iter()
                .position(|&n| {
                    let here = first == unit.first_row;
                    first += n;
                    here
                })
                .unwrap_or(counts.len());
            if group == counts.len() && unit.first_row > 0 {
                return Err(fault(
                    Reason::Unreadable,
                    format!(
                        "no row group starts at row {} (the file changed?)",
                        unit.first_row
                    ),
                    SourceKind::Other,
                ));
            }
            Rows::Parquet(Box::new(ParquetRows {
                file,
                group,
                first_row: unit.first_row,
                end_row: unit.rows.map(|r| unit.first_row + r),
                ready: VecDeque::new(),
                stem: file_stem(&unit.url),
            }))
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
            Rows::Parquet(rows) => loop {
                if let Some(doc) = rows.ready.pop_front() {
                    return Some(Ok(doc));
                }
                let counts = rows.file.row_counts();
                let ended = rows.end_row.is_some_and(|end| rows.first_row >= end);
                if rows.group >= counts.len() || ended {
                    return None;
                }
                let group = rows.group;
                match group_documents(&rows.file, (group, rows.first_row), &rows.stem, &self.spec) {
                    Ok(docs) => rows.ready = docs,
                    Err((reason, detail)) => {
                        rows.group = counts.len();
                        return Some(Err(Fault {
                            reason,
                            url: self.display.clone(),
                            key: String::new(),
                            detail,
                            kind: SourceKind::Other,
                        }));
                    }
                }
                rows.first_row += counts[group];
                rows.group += 1;
            },
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

/// The documents of row group `group` (its first row `first_row`), read whole.
fn group_documents(
    file: &ParquetFile,
    (group, first_row): (usize, u64),
    stem: &str,
    spec: &DocumentSpec,
) -> Result<VecDeque<DocumentResult>, Rejection> {
    let missing = |e: String| (Reason::MissingColumn, e);
    let texts = file.list_column(&spec.texts).map_err(missing)?;
    let images = file.list_column(&spec.images).map_err(missing)?;
    let rows = file.row_counts()[group] as usize;
    let key = file
        .schema
        .members(Some(&[]))
        .columns
        .into_iter()
        .find(|c| file.schema.key().is_some_and(|k| k.name == c.name));
    let mut leaves = vec![texts.values, images.values];
    leaves.extend(images.paths);
    leaves.extend(key.as_ref().map(|k| k.leaf));
    let reader = file
        .row_group_reader(group, &leaves, spec.max_document_bytes, first_row)
        .map_err(|f| (f.reason, f.detail))?;
    let corrupt = |what: &str, e: parquet::errors::ParquetError| {
        let f = file.corrupt(format!("row group {group}: {what}: {e}"));
        (f.reason, f.detail)
    };
    let text_lists = read_lists(&reader, texts.values, rows).map_err(|e| corrupt("texts", e))?;
    let image_lists = read_lists(&reader, images.values, rows).map_err(|e| corrupt("images", e))?;
    let path_lists = match images.paths {
        Some(leaf) => Some(read_lists(&reader, leaf, rows).map_err(|e| corrupt("paths", e))?),
        None => None,
    };
    let keys = match &key {
        Some(k) => Some(read_leaf(&reader, k.leaf, rows).map_err(|e| corrupt("key", e))?),
        None => None,
    };
    if text_lists.len() != rows || image_lists.len() != rows {
        return Err((
            Reason::CorruptParquet,
            format!("row group {group}: the lists hold fewer rows than the footer's {rows}"),
        ));
    }
    let mut paths = path_lists.map(|p| p.into_iter());
    let mut keys = keys.map(|k| k.into_iter());
    Ok(text_lists
        .into_iter()
        .zip(image_lists)
        .enumerate()
        .map(|(i, (texts, images))| {
            let row = first_row + i as u64;
            let key = keys
                .as_mut()
                .and_then(|k| k.next().flatten())
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| format!("{stem}/{row}"));
            let paths = paths.as_mut().and_then(|p| p.next()).flatten();
            aligned(texts, images, paths, spec)
                .map(|parts| Document {
                    key: key.clone(),
                    parts,
                })
                .map_err(|(reason, detail)| (key, (reason, format!("row {row}: {detail}"))))
        })
        .collect())
}

/// The parts of aligned `texts` and `images` lists (with the images' `path`s, when the images
/// are structs).
fn aligned(
    texts: List,
    images: List,
    paths: List,
    spec: &DocumentSpec,
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
    check_caps(&parts, spec)?;
    Ok(parts)
}

/// A document's images and bytes within the caps, and not empty.
pub(super) fn check_caps(parts: &[Part], spec: &DocumentSpec) -> Result<(), Rejection> {
    let images = parts.iter().filter(|p| matches!(p, Part::Image(_))).count();
    let bytes = parts.iter().map(Part::bytes).sum::<usize>();
    if images > spec.max_images as usize {
        return Err((
            Reason::TooManyImages,
            format!(
                "{images} images, more than max_images_per_document={}",
                spec.max_images
            ),
        ));
    }
    if bytes as u64 > spec.max_document_bytes {
        return Err((
            Reason::MemberTooLarge,
            format!(
                "{bytes} bytes, more than max_document_bytes={}",
                spec.max_document_bytes
            ),
        ));
    }
    if parts.is_empty() {
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

/// The file name without its folder and `.parquet`.
fn file_stem(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet").unwrap_or(name).to_string()
}
