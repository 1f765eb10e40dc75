//! A unit's documents: the text of each sample of a tar shard (a member such as `txt` or `py`,
//! or a field of its JSON member), of each row of a Parquet row group (a string column) or of
//! each line of a JSONL file (a field; see `jsonl`), in file order, checked (present, valid UTF-8, not over the size limit) but never trimmed: code
//! keeps its indentation. A document that cannot be used is a counted skip with a typed reason,
//! the same in the token count and in the loader, so both see the same tokens.

use std::sync::Arc;

use super::jsonl::{is_jsonl_name, JsonlDocuments};
use crate::batch::kit::sample::CaptionSource;
use crate::batch::kit::unit::{unit_fault, Opened, Unit};
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{RawSample, ShardFault};
use crate::read::parquet::{is_parquet_name, ColumnKind, ParquetFile};
use crate::read::source::{SourceOptions, SourceStats};

/// Where a document's text is and how large it may be.
#[derive(Clone, Debug)]
pub struct TextSpec {
    /// A Parquet column, a JSONL field or a tar member extension (`text`, `txt`, `py`), or
    /// `json:field` (a field of a tar sample's JSON member, or of a JSONL line).
    pub source: CaptionSource,
    /// A larger document is skipped (`member_too_large`), never held whole.
    pub max_document_bytes: u64,
}

/// A document, or why it was skipped (its key and reason, counted by the caller).
pub type Document = Result<String, Fault>;

/// Where a unit's documents come from.
enum Rows {
    /// Tar samples or Parquet rows, the text taken out of each by `document_text`.
    Samples(Box<dyn Iterator<Item = Result<RawSample, ShardFault>> + Send>),
    /// The lines of a JSONL file, each already its document.
    Jsonl(Box<JsonlDocuments>),
}

/// The documents of `unit`, in order; Err when the unit cannot be opened or its reading fails.
pub struct UnitDocuments {
    rows: Rows,
    left: Option<u64>,
    spec: TextSpec,
    display: String,
    /// Whether the samples are a Parquet file's rows: a skipped document's detail then names
    /// its row (its key may be a key column's value).
    parquet: bool,
}

impl UnitDocuments {
    pub fn open(
        unit: &Unit,
        spec: &TextSpec,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, Fault> {
        let display = unit.display();
        if is_jsonl_name(&unit.url) {
            let field = match &spec.source {
                CaptionSource::Member(name) => name,
                CaptionSource::JsonField { member, field } if member == "json" => field,
                other => {
                    let detail = format!(
                        "a JSONL file's text is a field, named FIELD or json:FIELD, not {other:?}"
                    );
                    return Err(unit_fault(
                        &display,
                        Reason::MissingColumn,
                        detail,
                        SourceKind::Other,
                    ));
                }
            };
            let docs = JsonlDocuments::open(
                &unit.url,
                field,
                spec.max_document_bytes,
                &unit.expected(),
                opts,
                stats,
                &display,
            )?;
            return Ok(Self {
                rows: Rows::Jsonl(Box::new(docs)),
                left: unit.rows,
                spec: spec.clone(),
                display,
                parquet: false,
            });
        }
        let rows: Box<dyn Iterator<Item = Result<RawSample, ShardFault>> + Send> =
            match unit.open(&display, spec.max_document_bytes, opts, stats)? {
                Opened::Parquet(file) => {
                    let file = *file;
                    let column = match &spec.source {
                        CaptionSource::Member(name) => name.clone(),
                        other => {
                            return Err(unit_fault(
                                &display,
                                Reason::MissingColumn,
                                format!("a Parquet file's text is a column, not {other:?}"),
                                SourceKind::Other,
                            ))
                        }
                    };
                    check_column(&file, &column).map_err(|detail| {
                        unit_fault(&display, Reason::MissingColumn, detail, SourceKind::Other)
                    })?;
                    Box::new(
                        file.samples(unit.first_row, Some(std::slice::from_ref(&column)))
                            .with_max_member_bytes(spec.max_document_bytes),
                    )
                }
                Opened::Tar(reader) => reader,
            };
        Ok(Self {
            rows: Rows::Samples(rows),
            left: unit.rows,
            spec: spec.clone(),
            display,
            parquet: is_parquet_name(&unit.url),
        })
    }

    /// The next document, or the fault that ends the unit.
    pub fn next_document(&mut self) -> Option<Result<Document, Fault>> {
        if self.left == Some(0) {
            return None;
        }
        let rows = match &mut self.rows {
            Rows::Samples(rows) => rows,
            Rows::Jsonl(lines) => return lines.next_document(),
        };
        let row = rows.next()?;
        if let Some(left) = &mut self.left {
            *left -= 1;
        }
        Some(match row {
            Err(f) => Err(unit_fault(&self.display, f.reason, f.detail, f.kind)),
            Ok(raw) => {
                let key = raw.key.clone();
                let row = self.parquet.then_some(raw.ordinal);
                Ok(
                    document_text(raw, &self.spec.source).map_err(|(reason, detail)| Fault {
                        reason,
                        url: self.display.clone(),
                        key,
                        detail: match row {
                            Some(row) => format!("row {row}: {detail}"),
                            None => detail,
                        },
                        kind: SourceKind::Other,
                    }),
                )
            }
        })
    }
}

/// The text of one document: the named member or field, as it is (not trimmed).
pub fn document_text(
    mut raw: RawSample,
    source: &CaptionSource,
) -> Result<String, (Reason, String)> {
    if let Some(defect) = raw.defect.take() {
        return Err(defect);
    }
    let take = |raw: &mut RawSample, name: &str| {
        raw.members
            .iter()
            .position(|(e, _)| e == name)
            .map(|i| raw.members.swap_remove(i).1)
            .ok_or_else(|| (Reason::MissingText, format!("no {name:?} member")))
    };
    match source {
        CaptionSource::None => Err((Reason::MissingText, "no text source named".into())),
        CaptionSource::Member(name) => {
            let bytes = take(&mut raw, name)?;
            String::from_utf8(bytes)
                .map_err(|e| (Reason::BadUtf8, format!("{name:?}: {}", e.utf8_error())))
        }
        CaptionSource::JsonField { member, field } => {
            let bytes = take(&mut raw, member)?;
            let text = std::str::from_utf8(&bytes)
                .map_err(|e| (Reason::BadUtf8, format!("{member:?}: {e}")))?;
            let mut value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                (
                    Reason::BadJson,
                    format!("{member:?} member is not valid JSON: {e}"),
                )
            })?;
            match value.get_mut(field).map(serde_json::Value::take) {
                Some(serde_json::Value::String(s)) => Ok(s),
                Some(serde_json::Value::Null) | None => Err((
                    Reason::MissingText,
                    format!("{member:?} has no field {field:?}"),
                )),
                Some(_) => Err((
                    Reason::WrongType,
                    format!("{member:?} field {field:?} is not a string"),
                )),
            }
        }
    }
}

/// That `column` is a top-level string or binary column of `file`.
fn check_column(file: &ParquetFile, column: &str) -> Result<(), String> {
    let listing = || {
        file.schema
            .columns
            .iter()
            .map(|c| format!("{} ({})", c.name, c.kind.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match file.schema.column(column) {
        None => Err(format!(
            "no text column {column:?} (its columns: {})",
            listing()
        )),
        Some(c) if matches!(c.kind, ColumnKind::Text | ColumnKind::Binary) => Ok(()),
        Some(c) => Err(format!(
            "the text column {column:?} holds {}, not strings",
            c.kind.as_str()
        )),
    }
}
