//! Whole-shard validation: the structural walk and (optionally) the loader's decode of every
//! sample, producing what `shardstream validate` reports and `shardstream index` records.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Reason;
use crate::group::open_shard;
use crate::index::{InvalidSample, ShardEntry};
use crate::sample::{caption, image_bytes, prepare, CaptionSource, SampleSpec, Worker};
use crate::source::{redact_url, SourceOptions, SourceStats};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardFatal {
    pub reason: Reason,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardReport {
    pub url: String,
    /// Bytes read from the source (compressed size for gzip shards).
    pub bytes: u64,
    pub samples: u64,
    /// Byte offset of each sample's first header, then the end of the last sample's data.
    pub offsets: Vec<u64>,
    pub keys: Vec<String>,
    pub invalid: Vec<InvalidSample>,
    pub fatal: Option<ShardFatal>,
    pub compressed: bool,
    /// What identifies the shard's content (an ETag, or size and mtime), when the caller knows
    /// it: the index records it so that a shard changed since can be found out.
    #[serde(default)]
    pub identity: Option<String>,
    /// With [`ScanOptions::capture`]: that member of every sample as text (None: absent or not
    /// UTF-8), in ordinal order, for a subset's metadata (uids, filter fields).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured: Vec<Option<String>>,
}

#[derive(Clone, Debug)]
pub struct ScanOptions {
    pub decode: bool,
    pub require_caption: bool,
    pub max_member_bytes: u64,
    pub spec: SampleSpec,
    pub source: SourceOptions,
    /// A member (by extension, such as `json`) to hand back as text with every sample.
    pub capture: Option<String>,
}

pub fn scan_shard(url: &str, opts: &ScanOptions) -> ShardReport {
    let stats = Arc::new(SourceStats::default());
    let mut report = ShardReport {
        url: redact_url(url),
        bytes: 0,
        samples: 0,
        offsets: Vec::new(),
        keys: Vec::new(),
        invalid: Vec::new(),
        fatal: None,
        compressed: false,
        identity: None,
        captured: Vec::new(),
    };
    let reader = match open_shard(
        url,
        0,
        0,
        opts.max_member_bytes,
        &Default::default(),
        &opts.source,
        &stats,
    ) {
        Ok(r) => r,
        Err(f) => {
            report.fatal = Some(ShardFatal {
                reason: f.reason,
                detail: f.detail,
            });
            return report;
        }
    };
    report.compressed = reader.is_compressed();
    let mut reader = reader;
    let mut worker = Worker::validating();
    let size = opts.spec.image_size as usize;
    let mut slot = vec![0u8; 3 * size * size];
    let mut first_ordinal_of_key: HashMap<String, u64> = HashMap::new();
    // With an optional caption, a sample without one is still decoded (and one with a caption
    // still has it checked).
    let no_caption = SampleSpec {
        caption: CaptionSource::None,
        ..opts.spec.clone()
    };
    for item in reader.by_ref() {
        let raw = match item {
            Ok(raw) => raw,
            Err(f) => {
                report.fatal = Some(ShardFatal {
                    reason: f.reason,
                    detail: f.detail,
                });
                break;
            }
        };
        report.samples += 1;
        report.offsets.push(raw.offset);
        report.keys.push(raw.key.clone());
        if let Some(ext) = &opts.capture {
            let text = raw
                .get(ext)
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::to_owned);
            report.captured.push(text);
        }
        let verdict = if let Some(&first) = first_ordinal_of_key.get(&raw.key) {
            Err((
                Reason::DuplicateKey,
                format!("key already used by sample #{first}"),
            ))
        } else if opts.decode {
            match prepare(&raw, &opts.spec, 0, &mut worker, &mut slot) {
                // The caption is checked before the image is decoded: decode it without one.
                Err((Reason::MissingCaption, _)) if !opts.require_caption => {
                    prepare(&raw, &no_caption, 0, &mut worker, &mut slot).map(|_| ())
                }
                other => other.map(|_| ()),
            }
        } else if let Some(defect) = &raw.defect {
            Err(defect.clone())
        } else {
            image_bytes(&raw, &opts.spec.image_keys).and_then(|_| {
                match caption(&raw, &opts.spec.caption) {
                    Err((Reason::MissingCaption, _)) if !opts.require_caption => Ok(()),
                    other => other.map(|_| ()),
                }
            })
        };
        first_ordinal_of_key
            .entry(raw.key.clone())
            .or_insert(raw.ordinal);
        if let Err((reason, detail)) = verdict {
            if reason == Reason::MissingCaption && !opts.require_caption {
                continue;
            }
            report.invalid.push(InvalidSample {
                ordinal: raw.ordinal,
                key: raw.key,
                reason,
                detail,
            });
        }
    }
    if report.fatal.is_none() && reader.trailing_garbage() {
        // tarfile and webdataset stop quietly at a header that fails its checksum; whatever
        // followed it (more samples, perhaps) was not read, so the shard is not sound.
        report.fatal = Some(ShardFatal {
            reason: Reason::CorruptTar,
            detail: format!(
                "the bytes at {} are not a tar header: the rest of the shard was not read",
                reader.data_end()
            ),
        });
    }
    if report.fatal.is_none() {
        report.offsets.push(reader.data_end());
    }
    report.bytes = stats.bytes.load(std::sync::atomic::Ordering::Relaxed);
    report
}

impl ShardReport {
    /// The index entry of this shard under `url` (the URL users give, not a presigned one).
    /// A shard that could not be read completely has no offsets: training will read it from the
    /// start and treat missing samples as run-time failures.
    pub fn to_index_entry(&self, url: &str, with_keys: bool) -> ShardEntry {
        let mut entry = ShardEntry::new(url, self.samples);
        entry.size = Some(self.bytes);
        entry.compressed = self.compressed;
        if self.fatal.is_none() && self.offsets.len() as u64 == self.samples + 1 {
            entry.offsets = Some(self.offsets.clone());
        }
        if with_keys {
            entry.keys = Some(self.keys.clone());
        }
        entry.identity = self.identity.clone();
        let mut invalid = self.invalid.clone();
        invalid.sort_by_key(|i| i.ordinal);
        invalid.dedup_by_key(|i| i.ordinal);
        entry.set_invalid(invalid);
        entry
    }
}
