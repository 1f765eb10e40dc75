//! Per-shard detail of a version-2 index: the byte offsets and keys of one shard's samples, in
//! one self-checking block that a reader fetches with one range read when it opens that shard
//! (the manifest says where the block is). Nothing per sample is loaded at start-up.
//!
//! A block is gzip of: `SSD2`, varint sample count, the shard name's 64-bit hash (little
//! endian), a flags byte (1: offsets, 2: keys), then the offsets as a varint unit and
//! `count + 1` varint deltas in that unit, then the keys as length-prefixed strings, and last the
//! checksum of all of it. Flag 4 adds, before the checksum, the shard's invalid samples: a
//! varint count, then per sample its ordinal (varint), reason, key and detail (strings). The count and name hash let a reader refuse a block that belongs to
//! another shard; the checksum catches corrupt or cut-short bytes.

use super::codec::{put_checksum, put_ordinals, put_str, put_varint, Decoder};
use super::{shard_error, IndexError, InvalidSample};
use crate::error::Reason;
use crate::rng::hash_bytes;
use std::io::{Read, Write};

const MAGIC: &[u8; 4] = b"SSD2";
const HAS_OFFSETS: u8 = 1;
const HAS_KEYS: u8 = 2;
const HAS_INVALID: u8 = 4;
const HAS_SELECTION: u8 = 8;
/// Tar headers start on 512-byte boundaries, so offsets are stored in these units when they can be.
const TAR_BLOCK: u64 = 512;
/// Longest key accepted (webdataset keys are file stems: far shorter in practice).
pub const MAX_KEY_BYTES: u64 = 4096;
/// Most samples one shard may hold (a hostile count must not size an allocation).
pub const MAX_SHARD_SAMPLES: u64 = 1 << 31;

/// What a reader needs per sample of one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardDetail {
    /// `num_samples + 1` byte offsets (see [`super::ShardEntry::offsets`]).
    pub offsets: Option<Vec<u64>>,
    /// Every sample's key, in order.
    pub keys: Option<Vec<String>>,
    /// The samples validation rejected, with key, reason and detail.
    pub invalid: Vec<InvalidSample>,
    /// A subset's kept ordinals, sorted (see [`super::Selection`]).
    pub selection: Option<Vec<u64>>,
}

impl ShardDetail {
    pub fn is_empty(&self) -> bool {
        self.offsets.is_none()
            && self.keys.is_none()
            && self.invalid.is_empty()
            && self.selection.is_none()
    }
}

/// The hash a block records of the shard it belongs to: the shard's file name (last path
/// component), as the fingerprint uses, so a moved dataset keeps its blocks.
pub fn name_hash(url: &str) -> u64 {
    hash_bytes(super::shard_name(url).as_bytes())
}

/// One shard's block, gzip-compressed.
pub fn encode(url: &str, num_samples: u64, detail: &ShardDetail) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + num_samples as usize * 4);
    body.extend_from_slice(MAGIC);
    put_varint(&mut body, num_samples);
    body.extend_from_slice(&name_hash(url).to_le_bytes());
    let mut flags = 0;
    if detail.offsets.is_some() {
        flags |= HAS_OFFSETS;
    }
    if detail.keys.is_some() {
        flags |= HAS_KEYS;
    }
    if !detail.invalid.is_empty() {
        flags |= HAS_INVALID;
    }
    if detail.selection.is_some() {
        flags |= HAS_SELECTION;
    }
    body.push(flags);
    if let Some(offsets) = &detail.offsets {
        let unit = if offsets.iter().all(|o| o % TAR_BLOCK == 0) {
            TAR_BLOCK
        } else {
            1
        };
        put_varint(&mut body, unit);
        let mut prev = 0;
        for &o in offsets {
            put_varint(&mut body, (o - prev) / unit);
            prev = o;
        }
    }
    if let Some(keys) = &detail.keys {
        for key in keys {
            put_str(&mut body, key);
        }
    }
    if !detail.invalid.is_empty() {
        put_varint(&mut body, detail.invalid.len() as u64);
        for bad in &detail.invalid {
            put_varint(&mut body, bad.ordinal);
            put_str(&mut body, bad.reason.as_str());
            put_str(&mut body, &bad.key);
            put_str(&mut body, &bad.detail);
        }
    }
    if let Some(selection) = &detail.selection {
        put_ordinals(&mut body, selection);
    }
    put_checksum(&mut body);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&body).expect("writing to memory cannot fail");
    gz.finish().expect("writing to memory cannot fail")
}

/// Decodes the block of shard `url`, which the manifest says has `num_samples` samples.
pub fn decode(bytes: &[u8], url: &str, num_samples: u64) -> Result<ShardDetail, IndexError> {
    let bad = |what: String| shard_error(url, format!("index detail block: {what}"));
    if num_samples > MAX_SHARD_SAMPLES {
        return Err(bad(format!("{num_samples} samples is more than supported")));
    }
    // The most a valid block can hold once decompressed: a hostile gzip stops there.
    let limit = 64 + (num_samples + 1) * 10 + num_samples * (2 * MAX_KEY_BYTES + (64 << 10) + 100);
    let gz = flate2::read::MultiGzDecoder::new(bytes).take(limit + 1);
    let mut d = Decoder::new(std::io::BufReader::new(gz));
    let io = |e: std::io::Error| bad(e.to_string());
    if d.bytes(4).map_err(io)? != MAGIC {
        return Err(bad("not a detail block (wrong magic)".into()));
    }
    let count = d.varint().map_err(io)?;
    if count != num_samples {
        return Err(bad(format!(
            "it describes {count} samples, the manifest {num_samples}: the detail file does not belong to this manifest"
        )));
    }
    let hash = u64::from_le_bytes(d.bytes(8).map_err(io)?.try_into().expect("8 bytes"));
    if hash != name_hash(url) {
        return Err(bad(
            "it belongs to another shard: the detail file does not belong to this manifest".into(),
        ));
    }
    let flags = d.byte().map_err(io)?;
    let mut detail = ShardDetail::default();
    if flags & HAS_OFFSETS != 0 {
        let unit = d.varint().map_err(io)?;
        if unit == 0 {
            return Err(bad("offset unit 0".into()));
        }
        let mut sum: u64 = 0;
        let mut offsets = Vec::with_capacity(count as usize + 1);
        for _ in 0..=count {
            let delta = d.varint().map_err(io)?;
            sum = delta
                .checked_mul(unit)
                .and_then(|b| sum.checked_add(b))
                .ok_or_else(|| bad("offsets overflow u64".into()))?;
            offsets.push(sum);
        }
        detail.offsets = Some(offsets);
    }
    if flags & HAS_KEYS != 0 {
        let mut keys = Vec::with_capacity(count as usize);
        for _ in 0..count {
            keys.push(d.string(MAX_KEY_BYTES, "key length").map_err(io)?);
        }
        detail.keys = Some(keys);
    }
    if flags & HAS_INVALID != 0 {
        let n = d.bounded(count, "invalid count").map_err(io)?;
        for _ in 0..n {
            let ordinal = d.varint().map_err(io)?;
            let name = d.string(64, "reason length").map_err(io)?;
            let reason = Reason::ALL
                .into_iter()
                .find(|r| r.as_str() == name)
                .ok_or_else(|| bad(format!("unknown reason {name:?}")))?;
            detail.invalid.push(InvalidSample {
                ordinal,
                reason,
                key: d.string(MAX_KEY_BYTES, "key length").map_err(io)?,
                detail: d.string(64 << 10, "detail length").map_err(io)?,
            });
        }
    }
    if flags & HAS_SELECTION != 0 {
        detail.selection = Some(d.ordinals(count, count, "subset").map_err(io)?);
    }
    d.verify_checksum().map_err(io)?;
    if !d.at_end().map_err(io)? {
        return Err(bad("bytes after the checksum".into()));
    }
    Ok(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ShardDetail {
        ShardDetail {
            offsets: Some(vec![0, 1536, 4096, 9216]),
            keys: Some(vec!["a".into(), "bé".into(), "000123".into()]),
            invalid: Vec::new(),
            selection: None,
        }
    }

    #[test]
    fn blocks_round_trip_with_and_without_parts() {
        let url = "s3://b/laion/00042.tar";
        for detail in [
            sample(),
            ShardDetail {
                offsets: Some(vec![0, 700, 1400, 2101]),
                keys: None,
                invalid: vec![InvalidSample {
                    ordinal: 2,
                    key: "z".into(),
                    reason: Reason::CorruptImage,
                    detail: "JPEG: premature end".into(),
                }],
                selection: None,
            },
            ShardDetail {
                offsets: None,
                keys: Some(vec!["x".into(), "y".into(), "z".into()]),
                invalid: Vec::new(),
                selection: Some(vec![0, 2]),
            },
            ShardDetail {
                selection: Some(vec![]),
                ..ShardDetail::default()
            },
        ] {
            let block = encode(url, 3, &detail);
            assert_eq!(decode(&block, url, 3).unwrap(), detail);
            // The same shard name elsewhere (a moved dataset) still matches.
            assert_eq!(decode(&block, "/mirror/00042.tar", 3).unwrap(), detail);
        }
    }

    #[test]
    fn blocks_of_another_shard_or_damaged_bytes_are_refused_naming_the_shard() {
        let url = "https://h/d/00007.tar?X-Amz-Signature=secret";
        let block = encode(url, 3, &sample());
        let other = decode(&block, "https://h/d/00008.tar", 3)
            .unwrap_err()
            .to_string();
        assert!(
            other.contains("another shard") && other.contains("00008.tar"),
            "{other}"
        );
        let count = decode(&block, url, 4).unwrap_err().to_string();
        assert!(count.contains("3 samples, the manifest 4"), "{count}");
        assert!(!count.contains("secret"), "{count}");
        // Flip a byte inside the compressed body; cut it short; give it junk.
        let mut flipped = block.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(decode(&flipped, url, 3).is_err());
        assert!(decode(&block[..block.len() - 5], url, 3).is_err());
        assert!(decode(b"not gzip at all", url, 3).is_err());
        // A valid gzip of a body whose checksum does not match.
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        put_varint(&mut body, 0);
        body.extend_from_slice(&name_hash(url).to_le_bytes());
        body.push(0);
        body.extend_from_slice(&[0u8; 8]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&body).unwrap();
        let err = decode(&gz.finish().unwrap(), url, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum"), "{err}");
    }
}
