//! A unit's documents: the text of each sample of a tar shard (a member such as `txt` or `py`,
//! or a field of its JSON member), of each row of a Parquet row group (a string column) or of
//! each line of a JSONL file (a field; see `jsonl`), in file order, checked (present, valid UTF-8, not over the size limit) but never trimmed: code
//! keeps its indentation. A document that cannot be used is a counted skip with a typed reason,
//! the same in the token count and in the loader, so both see the same tokens.

use std::sync::Arc;

use super::jsonl::{is_jsonl_name, JsonlDocuments};
use crate::batch::sample::CaptionSource;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{open_shard, RawSample, SampleReader, ShardFault};
use crate::read::parquet::{is_parquet_name, ColumnKind, ParquetFile};
use crate::read::source::{redact_url, Expected, SourceOptions, SourceStats};

/// One unit of a text corpus: a tar shard, a JSONL file, or one row group of a Parquet file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextUnit {
    pub url: String,
    /// The first row of a Parquet row group (0 for a tar or a JSONL file).
    pub first_row: u64,
    /// The rows of a Parquet row group; None: the whole shard.
    pub rows: Option<u64>,
    /// The file's content identity when counted (`etag:...` or `size:N`): a file replaced since
    /// is refused as `changed` instead of read with stale counts.
    pub identity: Option<String>,
}

impl TextUnit {
    pub fn display(&self) -> String {
        match self.rows {
            Some(_) => format!("{} (rows from {})", redact_url(&self.url), self.first_row),
            None => redact_url(&self.url),
        }
    }
}

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
        unit: &TextUnit,
        spec: &TextSpec,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, Fault> {
        let display = unit.display();
        let expected = Expected::from_identity(unit.identity.as_deref());
        let fault = |f: ShardFault| Fault {
            reason: f.reason,
            url: display.clone(),
            key: String::new(),
            detail: f.detail,
            kind: f.kind,
        };
        if is_jsonl_name(&unit.url) {
            let field = match &spec.source {
                CaptionSource::Member(name) => name,
                CaptionSource::JsonField { member, field } if member == "json" => field,
                other => {
                    return Err(Fault {
                        reason: Reason::MissingColumn,
                        url: display,
                        key: String::new(),
                        detail: format!(
                        "a JSONL file's text is a field, named FIELD or json:FIELD, not {other:?}"
                    ),
                        kind: SourceKind::Other,
                    })
                }
            };
            let docs = JsonlDocuments::open(
                &unit.url,
                field,
                spec.max_document_bytes,
                &expected,
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
            if is_parquet_name(&unit.url) {
                let file = ParquetFile::open(&unit.url, &expected, opts, stats).map_err(fault)?;
                let column = match &spec.source {
                    CaptionSource::Member(name) => name.clone(),
                    other => {
                        return Err(Fault {
                            reason: Reason::MissingColumn,
                            url: display,
                            key: String::new(),
                            detail: format!("a Parquet file's text is a column, not {other:?}"),
                            kind: SourceKind::Other,
                        })
                    }
                };
                check_column(&file, &column).map_err(|detail| Fault {
                    reason: Reason::MissingColumn,
                    url: display.clone(),
                    key: String::new(),
                    detail,
                    kind: SourceKind::Other,
                })?;
                Box::new(
                    file.samples(unit.first_row, Some(std::slice::from_ref(&column)))
                        .with_max_member_bytes(spec.max_document_bytes),
                )
            } else {
                let reader: SampleReader = open_shard(
                    &unit.url,
                    0,
                    0,
                    spec.max_document_bytes,
                    &expected,
                    opts,
                    stats,
                )
                .map_err(fault)?;
                Box::new(reader)
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
            Err(f) => Err(Fault {
                reason: f.reason,
                url: self.display.clone(),
                key: String::new(),
                detail: f.detail,
                kind: f.kind,
            }),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::batch::packed::count::count_unit;
    use crate::batch::sample::fixtures::scratch_dir;
    use crate::read::parquet::tests::write_one_bad_document;
    use crate::tokenize::DocumentEncoder;

    const GPT2_STYLE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenizers/captions-bpe.json"
    );

    #[test]
    fn a_parquet_document_of_invalid_utf8_is_skipped_alone_by_the_count_and_the_reader() {
        let dir = scratch_dir("documents-bad-utf8");
        let path = dir.join("docs.parquet");
        let docs = write_one_bad_document(&path);
        let spec = TextSpec {
            source: CaptionSource::Member("text".into()),
            max_document_bytes: 64 << 20,
        };
        let opts = SourceOptions::default();
        let stats = Arc::new(SourceStats::default());
        let units = [0, 50].map(|first_row| TextUnit {
            url: path.to_str().unwrap().into(),
            first_row,
            rows: Some(50),
            identity: None,
        });
        let (mut good, mut skipped) = (Vec::new(), Vec::new());
        for unit in &units {
            let mut unit_docs = UnitDocuments::open(unit, &spec, &opts, &stats).unwrap();
            while let Some(doc) = unit_docs.next_document() {
                match doc.expect("no unit fails") {
                    Ok(text) => good.push(text),
                    Err(fault) => skipped.push(fault),
                }
            }
        }
        let want: Vec<String> = docs
            .iter()
            .enumerate()
            .filter(|(row, _)| *row != 37)
            .map(|(_, d)| String::from_utf8(d.clone()).unwrap())
            .collect();
        assert_eq!(good, want, "the 99 good documents, in order");
        assert_eq!(skipped.len(), 1);
        let fault = &skipped[0];
        assert_eq!(
            (fault.reason, fault.key.as_str()),
            (Reason::BadUtf8, "docs/37")
        );
        // File, row and the first invalid byte's offset; never the document.
        assert!(fault.url.contains("docs.parquet"), "{}", fault.url);
        assert!(
            fault.detail.contains("row 37") && fault.detail.contains("index 5"),
            "{}",
            fault.detail
        );
        let text = String::from_utf8_lossy(&docs[37]);
        assert!(
            !fault.detail.contains(&text[..4]) && fault.detail.len() < 120,
            "{}",
            fault.detail
        );
        // The counting pass skips the same document, so the plan's tokens are the reader's.
        let encoder = DocumentEncoder::from_file(GPT2_STYLE, None, None).unwrap();
        let counts: Vec<_> = units
            .iter()
            .map(|u| count_unit(u, &spec, &encoder, &opts, &stats).unwrap())
            .collect();
        assert_eq!((counts[0].documents, counts[1].documents), (49, 50));
        assert_eq!(counts[0].skipped, BTreeMap::from([("bad_utf8", 1)]));
        assert!(counts[1].skipped.is_empty());
        let tokens: usize = want.iter().map(|d| encoder.encode(d).unwrap().len()).sum();
        assert_eq!(counts[0].tokens + counts[1].tokens, tokens as u64);
    }
}
