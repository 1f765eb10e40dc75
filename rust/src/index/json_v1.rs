//! The version-1 index: one JSON document (plain or gzip) holding every shard's counts, offsets
//! and keys. Still read and written; it suits datasets small enough for every rank to hold their
//! per-sample detail (the version-2 layout, `manifest` + `detail`, is for the rest).

use super::{
    shard_error, Index, IndexError, InvalidSample, ShardEntry, ShardExtra, INDEX_FORMAT,
    INDEX_VERSION,
};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::{Read, Write};

/// Tar headers start on 512-byte boundaries, so offsets are written in these units when they can be.
const TAR_BLOCK: u64 = 512;

#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct WireShard {
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default)]
    compressed: bool,
    num_samples: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    invalid: Vec<InvalidSample>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keys: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offsets: Option<WireOffsets>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<Box<str>>,
    /// A Parquet file's rows per row group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    row_groups: Option<Vec<u64>>,
}

/// Offsets on disk: a plain list of byte offsets (accepted on input), or the compact form this
/// code writes, `{"encoding": "delta", "unit": 512, "values": [...]}` where offset i is
/// `unit * (values[0] + ... + values[i])`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireOffsets {
    Plain(Vec<u64>),
    Delta {
        encoding: String,
        unit: u64,
        values: Vec<u64>,
    },
}

impl WireOffsets {
    fn encode(offsets: &[u64]) -> Self {
        let unit = if offsets.iter().all(|o| o % TAR_BLOCK == 0) {
            TAR_BLOCK
        } else {
            1
        };
        let mut prev = 0;
        let values = offsets
            .iter()
            .map(|&o| {
                let d = (o - prev) / unit;
                prev = o;
                d
            })
            .collect();
        WireOffsets::Delta {
            encoding: "delta".into(),
            unit,
            values,
        }
    }

    fn decode(self, url: &str) -> Result<Vec<u64>, IndexError> {
        match self {
            WireOffsets::Plain(offsets) => Ok(offsets),
            WireOffsets::Delta {
                encoding,
                unit,
                values,
            } => {
                if encoding != "delta" || unit == 0 {
                    return Err(shard_error(
                        url,
                        format!("unknown offsets encoding {encoding:?} with unit {unit}"),
                    ));
                }
                let mut sum: u64 = 0;
                values
                    .into_iter()
                    .map(|d| {
                        sum = d
                            .checked_mul(unit)
                            .and_then(|b| sum.checked_add(b))
                            .ok_or_else(|| shard_error(url, "offsets overflow u64"))?;
                        Ok(sum)
                    })
                    .collect()
            }
        }
    }
}

/// Reads the bytes as they are, or gunzipped when they start with the gzip magic.
fn maybe_gunzip(bytes: &[u8], limit: u64) -> Result<Cow<'_, [u8]>, IndexError> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| IndexError::Format(format!("corrupt gzip: {e}")))?;
    if out.len() as u64 > limit {
        return Err(IndexError::Format(format!(
            "more than {limit} bytes once decompressed"
        )));
    }
    Ok(Cow::Owned(out))
}

/// The invalid samples as version 1 writes them: with their details when in memory, else (an
/// index loaded from a folder, whose details stay in its detail blocks) by ordinal only.
fn invalid_details(shard: &ShardEntry) -> Vec<InvalidSample> {
    if !shard.invalid_details().is_empty() || shard.invalid.is_empty() {
        return shard.invalid_details().to_vec();
    }
    shard
        .invalid
        .iter()
        .map(|&ordinal| InvalidSample {
            ordinal,
            key: String::new(),
            reason: crate::error::Reason::Unreadable,
            detail: "recorded in the folder index's detail block".into(),
        })
        .collect()
}

pub fn parse(bytes: &[u8], limit: u64) -> Result<Index, IndexError> {
    let bytes = maybe_gunzip(bytes, limit)?;
    // The header first, so that a newer version is reported as such, not as a parse error.
    let header: Header = serde_json::from_slice(&bytes)
        .map_err(|e| IndexError::Format(format!("malformed JSON: {e}")))?;
    if header.format.as_deref() != Some(INDEX_FORMAT) {
        return Err(IndexError::Format(format!(
            "\"format\" is {:?}, expected {INDEX_FORMAT:?}",
            header.format.unwrap_or_default()
        )));
    }
    match header.version {
        Some(v) if v == INDEX_VERSION as u64 => {}
        Some(found) => return Err(IndexError::Version { found }),
        None => return Err(IndexError::Format("no \"version\"".into())),
    }
    #[derive(Deserialize)]
    struct Body {
        shards: Vec<WireShard>,
    }
    let body: Body = serde_json::from_slice(&bytes)
        .map_err(|e| IndexError::Format(format!("bad index: {e}")))?;
    let shards = body
        .shards
        .into_iter()
        .map(|w| {
            let offsets = w.offsets.map(|o| o.decode(&w.url)).transpose()?;
            let mut entry = ShardEntry::new(w.url, w.num_samples);
            entry.size = w.size;
            entry.compressed = w.compressed;
            entry.invalid =
                crate::plan::shared_ordinals(w.invalid.iter().map(|i| i.ordinal).collect());
            entry.identity = w.identity;
            entry.set_extra(ShardExtra {
                offsets,
                keys: w.keys,
                invalid_details: w.invalid,
                selection: None,
                row_groups: w.row_groups,
            });
            Ok(entry)
        })
        .collect::<Result<Vec<_>, IndexError>>()?;
    Index::new(shards)
}

pub fn write(index: &Index) -> Vec<u8> {
    let mut out = Vec::new();
    write!(
        out,
        "{{\"format\":\"{INDEX_FORMAT}\",\"version\":{INDEX_VERSION},\"shards\":["
    )
    .unwrap();
    for (i, shard) in index.shards().iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"\n" } else { b",\n" });
        let wire = WireShard {
            url: shard.url.clone(),
            size: shard.size,
            compressed: shard.compressed,
            num_samples: shard.num_samples,
            invalid: invalid_details(shard),
            keys: shard.keys().map(<[String]>::to_vec),
            offsets: shard.offsets().map(WireOffsets::encode),
            identity: shard.identity.clone(),
            row_groups: shard.row_groups().map(<[u64]>::to_vec),
        };
        serde_json::to_writer(&mut out, &wire).expect("an index entry always serializes");
    }
    out.extend_from_slice(b"\n]}\n");
    out
}

pub fn write_gz(index: &Index) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(&write(index))
        .expect("writing to memory cannot fail");
    encoder.finish().expect("writing to memory cannot fail")
}
