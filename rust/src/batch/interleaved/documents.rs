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

use super::captions::caption_document;
use super::conversation::conversation_document;
use super::document_spec::{check_caps, DocumentSpec, Layout};
use super::parquet_documents::ParquetRows;
pub use super::parts::DocumentResult;
use super::parts::{take_member, Document, Part};
use crate::batch::kit::sample::Rejection;
use crate::batch::kit::unit::{unit_fault, Opened, Unit};
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{RawSample, SampleReader};
use crate::read::source::{SourceOptions, SourceStats};

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
        unit: &Unit,
        spec: &DocumentSpec,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, Fault> {
        let display = unit.display();
        let rows = match unit.open(&display, spec.max_document_bytes, opts, stats)? {
            Opened::Parquet(file) => {
                let rows = ParquetRows::new(*file, unit.first_row, unit.rows, &unit.url).map_err(
                    |detail| unit_fault(&display, Reason::Unreadable, detail, SourceKind::Other),
                )?;
                Rows::Parquet(Box::new(rows))
            }
            Opened::Tar(reader) => Rows::Tar(reader),
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
            Rows::Parquet(rows) => rows
                .next_document(&self.spec)
                .map(|r| r.map_err(|f| unit_fault(&self.display, f.reason, f.detail, f.kind))),
            Rows::Tar(reader) => Some(match reader.next()? {
                Err(f) => Err(unit_fault(&self.display, f.reason, f.detail, f.kind)),
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
                    Ok(bytes) => Part::visual(bytes),
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
