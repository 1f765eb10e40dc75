//! What scanning a Parquet file adds to a tar's scan: its columns checked against the sample
//! spec before any row is read (a missing column, a column of the wrong type), and the
//! footer-only scan that an index without decoding needs (row counts, and keys from the key
//! column when there is one).

use std::sync::Arc;

use crate::batch::kit::columns::{resolve, FileColumns};
use crate::batch::kit::sample::CaptionSource;
use crate::check::scan::{ScanOptions, ShardFatal, ShardReport};
use crate::error::{Reason, SourceKind};
use crate::read::parquet::{ColumnKind, FileSchema, ParquetFile};
use crate::read::source::{redact_url, SourceStats};

/// The columns to read (and the member names some are read as: `columns::resolve`), or why
/// the file cannot give the spec's samples.
pub fn checked_columns(
    url: &str,
    schema: &FileSchema,
    opts: &ScanOptions,
) -> Result<FileColumns, ShardFatal> {
    let fatal = |reason, detail: String| ShardFatal {
        reason,
        kind: SourceKind::Other,
        detail: format!("{}: {detail}", redact_url(url)),
    };
    let mut chosen =
        resolve(&opts.spec, schema).map_err(|(reason, detail)| fatal(reason, detail))?;
    // The column a member is read from: the one renamed to it, else its own name.
    let column = |member: &str| {
        let name = chosen
            .renamed
            .iter()
            .find(|(_, m)| m == member)
            .map_or(member, |(c, _)| c.as_str());
        schema.column(name)
    };
    let names = || {
        schema
            .columns
            .iter()
            .map(|c| format!("{} ({})", c.name, c.kind.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let image_keys = &opts.spec.image_keys;
    match image_keys.iter().find_map(|k| column(k)) {
        None => {
            return Err(fatal(
                Reason::MissingColumn,
                format!(
                    "no image column {} (its columns: {})",
                    image_keys.join(" or "),
                    names()
                ),
            ))
        }
        Some(c) if !c.kind.holds_image() => {
            return Err(fatal(
                Reason::WrongType,
                format!(
                    "the image column {:?} is {}, not binary or an image struct (bytes, path)",
                    c.name,
                    c.kind.as_str()
                ),
            ))
        }
        Some(_) => {}
    }
    let caption = match &opts.spec.caption {
        CaptionSource::Member(m) | CaptionSource::JsonField { member: m, .. } => Some(m),
        CaptionSource::None => None,
    };
    if let Some(m) = caption {
        match column(m) {
            None if opts.require_caption => {
                return Err(fatal(
                    Reason::MissingColumn,
                    format!("no caption column {m:?} (its columns: {})", names()),
                ))
            }
            Some(c) if !matches!(c.kind, ColumnKind::Text | ColumnKind::Binary) => {
                return Err(fatal(
                    Reason::WrongType,
                    format!(
                        "the caption column {m:?} is {}, not a string",
                        c.kind.as_str()
                    ),
                ))
            }
            _ => {}
        }
    }
    chosen.wanted.extend(opts.capture.iter().cloned());
    Ok(chosen)
}

/// A scan that reads the footer and the key column only: row counts, each row's number as its
/// "offset", and its key. For an index built without decoding.
pub fn footer_scan(file: ParquetFile, report: &mut ShardReport, stats: &Arc<SourceStats>) {
    let rows = file.num_rows();
    let size = file.len();
    for item in file.samples(0, Some(&[])) {
        match item {
            Ok(raw) => {
                report.samples += 1;
                report.offsets.push(raw.ordinal);
                report.keys.push(raw.key);
            }
            Err(f) => {
                report.fatal = Some(f.into());
                break;
            }
        }
    }
    if report.fatal.is_none() {
        report.offsets.push(rows);
    }
    let _ = stats;
    report.bytes = size;
}
