//! The manifest of a version-2 index: what every rank loads at start-up, O(shards). Per shard
//! its URL, size, sample count, content identity, invalid samples, and where its detail block
//! ([`super::detail`]) lies; nothing per valid sample.
//!
//! Layout: the 8 bytes `SSINDEX2`, then gzip of: a varint-length JSON header (`format`,
//! `version`, `num_shards`, `fingerprint`, `detail_files`), one record per shard, and the
//! checksum of all of it. A record: URL, size + 1 (0: unknown), sample count, a flags byte (1:
//! gzip shard, 2: has a detail block), identity (empty: unknown), the block's file number,
//! offset and length when flagged, then the invalid ordinals (count, then the first ordinal and
//! the gaps to each next one): what the plan skips; their keys and reasons are in the detail
//! block; then a subset's count and hash (flag 4), and a Parquet file's rows per row group
//! (flag 8: the count of row groups, then each one's rows). Integers are LEB128 varints, strings length-prefixed UTF-8.
//! docs/epoch-plan.md documents it for other implementations.

use super::codec::{put_checksum, put_ordinals, put_str, put_varint, Decoder};
use super::detail::MAX_SHARD_SAMPLES;
use super::{DetailRef, Index, IndexError, ShardEntry, INDEX_FORMAT};
use serde::{Deserialize, Serialize};
use std::io::{BufReader, Write};

pub const MAGIC: &[u8; 8] = b"SSINDEX2";
pub const MANIFEST_VERSION: u64 = 2;
const COMPRESSED: u8 = 1;
const HAS_DETAIL: u8 = 2;
const HAS_SELECTION: u8 = 4;
const HAS_ROW_GROUPS: u8 = 8;
const MAX_URL: u64 = 16 << 10;
const MAX_TEXT: u64 = 64 << 10;
const MAX_HEADER: u64 = 16 << 20;

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u64,
    num_shards: u64,
    fingerprint: String,
    #[serde(default)]
    detail_files: Vec<String>,
}

pub fn is_manifest(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The manifest bytes of `index` (its detail references as they are).
pub fn encode(index: &Index) -> Vec<u8> {
    let header = Header {
        format: INDEX_FORMAT.into(),
        version: MANIFEST_VERSION,
        num_shards: index.len() as u64,
        fingerprint: format!("{:016x}", index.fingerprint()),
        detail_files: index.detail_files.clone(),
    };
    let mut body = Vec::with_capacity(64 + index.len() * 64);
    let header = serde_json::to_vec(&header).expect("a header always serializes");
    put_varint(&mut body, header.len() as u64);
    body.extend_from_slice(&header);
    for s in index.shards() {
        put_str(&mut body, &s.url);
        put_varint(&mut body, s.size.map_or(0, |v| v + 1));
        put_varint(&mut body, s.num_samples);
        let flags = if s.compressed { COMPRESSED } else { 0 }
            | if s.detail_ref.is_some() {
                HAS_DETAIL
            } else {
                0
            }
            | if s.selection().is_some() {
                HAS_SELECTION
            } else {
                0
            }
            | if s.row_groups().is_some() {
                HAS_ROW_GROUPS
            } else {
                0
            };
        body.push(flags);
        put_str(&mut body, s.identity.as_deref().unwrap_or(""));
        if let Some(r) = &s.detail_ref {
            put_varint(&mut body, r.file as u64);
            put_varint(&mut body, r.offset);
            put_varint(&mut body, r.len.get() as u64);
        }
        put_ordinals(&mut body, &s.invalid);
        if let Some(selection) = s.selection() {
            put_varint(&mut body, selection.count);
            body.extend_from_slice(&selection.hash.to_le_bytes());
        }
        if let Some(groups) = s.row_groups() {
            put_varint(&mut body, groups.len() as u64);
            for &g in groups.iter() {
                put_varint(&mut body, g);
            }
        }
    }
    put_checksum(&mut body);
    let mut gz = flate2::write::GzEncoder::new(MAGIC.to_vec(), flate2::Compression::default());
    gz.write_all(&body).expect("writing to memory cannot fail");
    gz.finish().expect("writing to memory cannot fail")
}

fn format_error(what: impl std::fmt::Display) -> IndexError {
    IndexError::Format(format!("manifest: {what}"))
}

/// Parses a manifest, streaming: the decompressed records are never held whole.
pub fn decode(bytes: &[u8]) -> Result<Index, IndexError> {
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| format_error("not a version-2 manifest (wrong magic)"))?;
    let gz = flate2::read::MultiGzDecoder::new(rest);
    let mut d = Decoder::new(BufReader::with_capacity(1 << 16, gz));
    let io = |e: std::io::Error| format_error(e);
    let header_len = d.bounded(MAX_HEADER, "header length").map_err(io)? as usize;
    let header: Header = serde_json::from_slice(&d.bytes(header_len).map_err(io)?)
        .map_err(|e| format_error(format!("bad header: {e}")))?;
    if header.format != INDEX_FORMAT {
        return Err(format_error(format!("\"format\" is {:?}", header.format)));
    }
    if header.version != MANIFEST_VERSION {
        return Err(IndexError::Version {
            found: header.version,
        });
    }
    if header.num_shards > u32::MAX as u64 {
        return Err(format_error(format!("{} shards", header.num_shards)));
    }
    let files = header.detail_files.len() as u64;
    // Reserve for what the header claims only up to a bound: the records prove the rest.
    let mut shards = Vec::with_capacity(header.num_shards.min(1 << 22) as usize);
    for _ in 0..header.num_shards {
        let url = d.string(MAX_URL, "URL length").map_err(io)?;
        let size = d.varint().map_err(io)?.checked_sub(1);
        let num_samples = d.bounded(MAX_SHARD_SAMPLES, "sample count").map_err(io)?;
        let flags = d.byte().map_err(io)?;
        let identity = d.string(MAX_TEXT, "identity length").map_err(io)?;
        let detail_ref = if flags & HAS_DETAIL != 0 {
            if files == 0 {
                return Err(super::shard_error(
                    &url,
                    "a detail block is named, but the header lists no detail file",
                ));
            }
            let file = d
                .bounded(files.saturating_sub(1), "detail file number")
                .map_err(|e| {
                    super::shard_error(&url, format!("{e} (the header lists {files} detail files)"))
                })?;
            Some(DetailRef {
                file: file as u32,
                offset: d.varint().map_err(io)?,
                len: std::num::NonZeroU32::new(
                    d.bounded(u32::MAX as u64, "detail length").map_err(io)? as u32,
                )
                .ok_or_else(|| super::shard_error(&url, "its detail block is 0 bytes long"))?,
            })
        } else {
            None
        };
        let invalid = d
            .ordinals(num_samples, num_samples, "invalid samples")
            .map_err(|e| super::shard_error(&url, e.to_string()))?;
        let selection = if flags & HAS_SELECTION != 0 {
            let count = d.bounded(num_samples, "subset count").map_err(io)?;
            let hash = u64::from_le_bytes(d.bytes(8).map_err(io)?.try_into().expect("8 bytes"));
            if detail_ref.is_none() {
                return Err(super::shard_error(
                    &url,
                    "a subset is recorded, but no detail block holds its samples",
                ));
            }
            Some(super::Selection {
                count,
                hash,
                ordinals: None,
            })
        } else {
            None
        };
        let row_groups = if flags & HAS_ROW_GROUPS != 0 {
            // A row group holds at least one row, so there are no more groups than samples.
            let n = d
                .bounded(num_samples, "row group count")
                .map_err(|e| super::shard_error(&url, e.to_string()))?;
            let groups = (0..n)
                .map(|_| d.bounded(num_samples, "row group rows"))
                .collect::<std::io::Result<Vec<u64>>>()
                .map_err(|e| super::shard_error(&url, e.to_string()))?;
            Some(groups)
        } else {
            None
        };
        // Neither a selection nor row groups: no extra fields (a plain tar shard's case).
        let extra = (selection.is_some() || row_groups.is_some()).then(|| {
            Box::new(super::ShardExtra {
                selection,
                row_groups,
                ..Default::default()
            })
        });
        shards.push(ShardEntry {
            compressed: flags & COMPRESSED != 0,
            url,
            size,
            num_samples,
            invalid: crate::plan::shared_ordinals(invalid),
            identity: (!identity.is_empty()).then(|| identity.into_boxed_str()),
            detail_ref,
            extra,
        });
    }
    d.verify_checksum().map_err(io)?;
    if !d.at_end().map_err(io)? {
        return Err(format_error("bytes after the checksum"));
    }
    let index = Index::with_detail_files(shards, header.detail_files)?;
    let fingerprint = format!("{:016x}", index.fingerprint());
    if fingerprint != header.fingerprint {
        return Err(format_error(format!(
            "its records give fingerprint {fingerprint}, its header says {}",
            header.fingerprint
        )));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::super::detail;
    use super::*;

    fn index() -> Index {
        let mut a = ShardEntry::new("s3://b/laion/00000.tar", 3);
        a.size = Some(6144);
        a.extra_mut().offsets = Some(vec![0, 1536, 3072, 4608]);
        a.extra_mut().keys = Some(vec!["k0".into(), "k1".into(), "k2".into()]);
        a.identity = Some("etag:\"9b2cf535f27731c974343645a3985328\"".into());
        a.set_invalid(vec![super::super::InvalidSample {
            ordinal: 1,
            key: "k1".into(),
            reason: crate::error::Reason::CorruptImage,
            detail: "JPEG: premature end".into(),
        }]);
        let b = ShardEntry::new("s3://b/laion/00001.tar.gz", 2); // img2dataset counts only
        Index::new(vec![a, b]).unwrap()
    }

    #[test]
    fn layout_round_trips_with_detail_out_of_the_manifest() {
        let original = index();
        let (manifest, blob) = original.to_layout("detail-00000.bin");
        assert!(is_manifest(&manifest));
        let loaded = Index::from_bytes(&manifest).unwrap();
        assert_eq!(loaded.fingerprint(), original.fingerprint());
        assert_eq!(loaded.detail_files(), ["detail-00000.bin".to_string()]);
        let (a, b) = (&loaded.shards()[0], &loaded.shards()[1]);
        assert!(
            a.offsets().is_none() && a.keys().is_none(),
            "nothing per sample in the manifest"
        );
        assert_eq!(
            (
                a.size,
                a.num_samples,
                &a.invalid[..],
                a.invalid_details().len()
            ),
            (Some(6144), 3, &[1u64][..], 0)
        );
        assert_eq!(a.identity, original.shards()[0].identity);
        assert!(b.compressed && b.detail_ref.is_none() && b.size.is_none());
        let r = a.detail_ref.unwrap();
        let block = &blob[r.offset as usize..(r.offset + r.len.get() as u64) as usize];
        let d = detail::decode(block, &a.url, 3).unwrap();
        assert_eq!(d.offsets.as_deref(), original.shards()[0].offsets());
        assert_eq!(d.keys.as_deref(), original.shards()[0].keys());
        assert_eq!(
            d.invalid,
            original.shards()[0].invalid_details(),
            "keys and reasons of invalid samples"
        );
        // Assembled with a newly scanned shard (an update): references are kept and remapped.
        let mut fresh = ShardEntry::new("s3://b/laion/00002.tar", 1);
        fresh.extra_mut().offsets = Some(vec![0, 2048]);
        let scanned = Index::new(vec![fresh]).unwrap();
        let updated = Index::assemble(&[(&scanned, 0), (&loaded, 0), (&loaded, 1)]).unwrap();
        assert_eq!(updated.detail_files(), ["detail-00000.bin".to_string()]);
        assert_eq!(updated.shards()[1].detail_ref, Some(r));
        let (m2, blob2) = updated.to_layout("detail-00001.bin");
        let back = Index::from_bytes(&m2).unwrap();
        assert_eq!(back.detail_files().len(), 2);
        let r2 = back.shards()[0].detail_ref.unwrap();
        assert_eq!(back.detail_files()[r2.file as usize], "detail-00001.bin");
        let b2 = &blob2[r2.offset as usize..(r2.offset + r2.len.get() as u64) as usize];
        assert_eq!(
            detail::decode(b2, &back.shards()[0].url, 1)
                .unwrap()
                .offsets,
            Some(vec![0, 2048])
        );
        assert!(Index::assemble(&[(&loaded, 9)]).is_err());
        // Rewritten again (a grown dataset re-indexed): existing references are kept.
        let (again, more) = loaded.to_layout("detail-00001.bin");
        assert!(more.is_empty());
        assert_eq!(Index::from_bytes(&again).unwrap(), loaded);
    }

    #[test]
    fn damaged_or_inconsistent_manifests_are_refused() {
        let (manifest, _) = index().to_layout("d.bin");
        assert!(decode(&manifest[..manifest.len() - 3]).is_err());
        let mut flipped = manifest.clone();
        let at = flipped.len() - 12;
        flipped[at] ^= 1;
        assert!(decode(&flipped).is_err());
        assert!(decode(b"SSINDEX2not gzip").is_err());
        // A header claiming more shards than its records hold.
        let mut body = Vec::new();
        let header =
            br#"{"format":"shardstream-index","version":2,"num_shards":5,"fingerprint":"0"}"#;
        put_varint(&mut body, header.len() as u64);
        body.extend_from_slice(header);
        put_checksum(&mut body);
        let mut gz = flate2::write::GzEncoder::new(MAGIC.to_vec(), flate2::Compression::fast());
        gz.write_all(&body).unwrap();
        assert!(decode(&gz.finish().unwrap()).is_err());
        // A detail block of 0 bytes (a block ends in its checksum): refused by name.
        let mut body = Vec::new();
        let header = br#"{"format":"shardstream-index","version":2,"num_shards":1,"fingerprint":"0","detail_files":["d.bin"]}"#;
        put_varint(&mut body, header.len() as u64);
        body.extend_from_slice(header);
        put_str(&mut body, "s3://b/00000.tar");
        for v in [0, 1] {
            put_varint(&mut body, v); // size unknown, 1 sample
        }
        body.push(HAS_DETAIL);
        put_str(&mut body, "");
        for v in [0, 0, 0, 0] {
            put_varint(&mut body, v); // file 0, offset 0, length 0; no invalid sample
        }
        put_checksum(&mut body);
        let mut gz = flate2::write::GzEncoder::new(MAGIC.to_vec(), flate2::Compression::fast());
        gz.write_all(&body).unwrap();
        let err = decode(&gz.finish().unwrap()).unwrap_err().to_string();
        assert!(
            err.contains("00000.tar") && err.contains("0 bytes long"),
            "{err}"
        );
        // A newer version is named as such.
        let mut body = Vec::new();
        let header =
            br#"{"format":"shardstream-index","version":3,"num_shards":0,"fingerprint":"0"}"#;
        put_varint(&mut body, header.len() as u64);
        body.extend_from_slice(header);
        let mut gz = flate2::write::GzEncoder::new(MAGIC.to_vec(), flate2::Compression::fast());
        gz.write_all(&body).unwrap();
        assert!(matches!(
            decode(&gz.finish().unwrap()),
            Err(IndexError::Version { found: 3 })
        ));
    }
}
