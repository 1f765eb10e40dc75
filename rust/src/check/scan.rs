//! Whole-shard validation: the structural walk and (optionally) the loader's decode of every
//! sample, producing what `shardstream validate` reports and `shardstream index` records.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::batch::kit::sample::{caption, image_bytes, CaptionSource, SampleSpec, Worker};
use crate::batch::square::sample::prepare;
use crate::check::parquet::{checked_columns, footer_scan};
use crate::error::{Reason, SourceKind};
use crate::index::{InvalidSample, ShardEntry};
use crate::read::group::{open_shard, SampleReader, ShardFault};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{redact_url, SourceOptions, SourceStats};

/// What ended the scan of a shard before its end.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardFatal {
    pub reason: Reason,
    /// For an `unreadable` shard, the kind of source failure: it picks the exception class a
    /// caller that raises on it uses (`shardstream.errors`' table), as the loader's faults do.
    /// Reports written before it existed read as `Other`.
    #[serde(default)]
    pub kind: SourceKind,
    pub detail: String,
}

impl From<ShardFault> for ShardFatal {
    fn from(f: ShardFault) -> Self {
        ShardFatal {
            reason: f.reason,
            kind: f.kind,
            detail: f.detail,
        }
    }
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
    /// A Parquet file's rows per non-empty row group, from its footer: the index records them
    /// and the plan makes each row group a unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_groups: Option<Vec<u64>>,
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
        row_groups: None,
    };
    let mut parquet = None;
    if is_parquet_name(url) {
        let file = match ParquetFile::open(url, &Default::default(), &opts.source, &stats) {
            Ok(f) => f,
            Err(f) => {
                report.fatal = Some(f.into());
                return report;
            }
        };
        // Empty row groups hold no unit's rows: left out, the row bases stay the same.
        report.row_groups = Some(file.row_counts().into_iter().filter(|&n| n > 0).collect());
        if !opts.decode && opts.capture.is_none() {
            footer_scan(file, &mut report, &stats);
            return report;
        }
        match checked_columns(url, &file.schema, opts) {
            Ok(columns) => parquet = Some((file, columns)),
            Err(fatal) => {
                report.fatal = Some(fatal);
                return report;
            }
        }
    }
    let opened = match parquet {
        // The file already open: its rows, read as the members the spec names.
        Some((file, columns)) => Ok(SampleReader::of_parquet(
            file.samples(0, Some(&columns.wanted))
                .with_max_member_bytes(opts.max_member_bytes)
                .with_renamed(columns.renamed),
            0,
        )),
        None => open_shard(
            url,
            0,
            0,
            opts.max_member_bytes,
            &Default::default(),
            &opts.source,
            &stats,
        ),
    };
    let reader = match opened {
        Ok(r) => r,
        Err(f) => {
            report.fatal = Some(f.into());
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
                report.fatal = Some(f.into());
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
            kind: SourceKind::Other,
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
        let extra = entry.extra_mut();
        if self.fatal.is_none() && self.offsets.len() as u64 == self.samples + 1 {
            extra.offsets = Some(self.offsets.clone());
        }
        if with_keys {
            extra.keys = Some(self.keys.clone());
        }
        // Row groups describe the file only when every row of it was read.
        extra.row_groups = self
            .row_groups
            .as_ref()
            .filter(|g| self.fatal.is_none() && g.iter().sum::<u64>() == self.samples)
            .cloned();
        entry.identity = self.identity.as_deref().map(Into::into);
        let mut invalid = self.invalid.clone();
        invalid.sort_by_key(|i| i.ordinal);
        invalid.dedup_by_key(|i| i.ordinal);
        entry.set_invalid(invalid);
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{jpeg, scratch_dir, tar_of};

    fn options(decode: bool, require_caption: bool) -> ScanOptions {
        ScanOptions {
            decode,
            require_caption,
            max_member_bytes: 1 << 20,
            spec: SampleSpec {
                image_size: 8,
                ..SampleSpec::default()
            },
            source: SourceOptions::default(),
            capture: None,
        }
    }

    /// Bytes a member takes in a tar: its header and its data, padded to whole blocks.
    fn footprint(data: &[u8]) -> u64 {
        512 + data.len().div_ceil(512) as u64 * 512
    }

    fn invalid(report: &ShardReport) -> Vec<(u64, &str, Reason)> {
        report
            .invalid
            .iter()
            .map(|i| (i.ordinal, i.key.as_str(), i.reason))
            .collect()
    }

    #[test]
    fn a_scan_reports_offsets_keys_and_each_invalid_sample_with_its_reason() {
        let dir = scratch_dir("scan-report");
        let image = jpeg(24, 16);
        let mut broken = image.clone();
        broken.truncate(image.len() / 3);
        let members: Vec<(&str, &[u8])> = vec![
            ("a.jpg", &image),
            ("a.txt", b"first"),
            ("b.txt", b"no image"),
            ("c.jpg", &image),
            ("a.jpg", &image),
            ("a.txt", b"the same key again"),
            ("d.jpg", &broken),
            ("d.txt", b"broken image"),
        ];
        let path = dir.join("s.tar");
        let tar = tar_of(&members);
        std::fs::write(&path, &tar).unwrap();
        let url = path.display().to_string();

        let report = scan_shard(&url, &options(true, false));
        assert!(report.fatal.is_none(), "{:?}", report.fatal);
        assert_eq!((report.samples, report.compressed), (5, false));
        assert_eq!(report.keys, vec!["a", "b", "c", "a", "d"]);
        // Each sample starts at its first member's header; the last offset ends the data.
        let sizes: Vec<u64> = members.iter().map(|(_, d)| footprint(d)).collect();
        let at = |m: usize| sizes[..m].iter().sum::<u64>();
        assert_eq!(
            report.offsets,
            vec![at(0), at(2), at(3), at(4), at(6), at(8)]
        );
        assert_eq!(report.bytes, tar.len() as u64);
        // c has no caption, which is allowed here; d's image does not decode.
        assert_eq!(
            invalid(&report),
            vec![
                (1, "b", Reason::MissingImage),
                (3, "a", Reason::DuplicateKey),
                (4, "d", Reason::CorruptImage)
            ]
        );
        assert!(report.invalid[1].detail.contains("#0"));

        // Required captions make c invalid; without decoding, d's image is not looked into.
        let strict = scan_shard(&url, &options(false, true));
        assert_eq!(
            invalid(&strict),
            vec![
                (1, "b", Reason::MissingImage),
                (2, "c", Reason::MissingCaption),
                (3, "a", Reason::DuplicateKey)
            ]
        );

        // What an index records of it.
        let entry = report.to_index_entry("shards/s.tar", true);
        assert_eq!(entry.num_samples, 5);
        assert_eq!(entry.offsets(), Some(&report.offsets[..]));
        assert_eq!(&entry.invalid[..], &[1, 3, 4]);
        assert_eq!(entry.keys(), Some(&report.keys[..]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sample_s_verdict_does_not_depend_on_the_size_it_is_decoded_to() {
        // The CLI and the index scan decode at 32 px, not at the loader's 224, on the strength
        // of this: validation decodes every image whole, and the target only picks the DCT
        // scale (here 1/8, 1/2 and 1/1 of 480 px) and the size of the resize's output.
        let dir = scratch_dir("scan-sizes");
        let colour = jpeg(640, 480);
        let gray =
            crate::image::jpeg::fixtures::solid(480, 640, [90, 90, 90], turbojpeg::Subsamp::Gray);
        let full =
            crate::image::jpeg::fixtures::solid(640, 480, [9, 99, 199], turbojpeg::Subsamp::None);
        let mut rng = crate::rng::SplitMix64::new(7);
        let mut images = Vec::new();
        for i in 0..90 {
            let mut data = [&colour, &gray, &full][i % 3].clone();
            match i % 5 {
                0 => data.truncate(2 + rng.below(data.len() as u64 - 2) as usize),
                1 | 2 => {
                    for _ in 0..1 + rng.below(8) {
                        let at = rng.below(data.len() as u64) as usize;
                        data[at] = rng.below(256) as u8;
                    }
                }
                3 => {
                    let at = rng.below(data.len().min(600) as u64) as usize;
                    data[at] = rng.below(256) as u8;
                }
                _ => {}
            }
            images.push(data);
        }
        let names: Vec<(String, String)> = (0..images.len())
            .map(|i| (format!("{i:03}.jpg"), format!("{i:03}.txt")))
            .collect();
        let mut members: Vec<(&str, &[u8])> = Vec::new();
        for ((image, caption), data) in names.iter().zip(&images) {
            members.push((image, data));
            members.push((caption, b"a caption"));
        }
        let path = dir.join("s.tar");
        std::fs::write(&path, tar_of(&members)).unwrap();
        let verdicts = |size: u32| {
            let mut opts = options(true, true);
            opts.spec.image_size = size;
            let report = scan_shard(&path.display().to_string(), &opts);
            assert!(report.fatal.is_none(), "{:?}", report.fatal);
            assert_eq!(report.samples, 90);
            invalid(&report)
                .into_iter()
                .map(|(ordinal, _, reason)| (ordinal, reason))
                .collect::<Vec<_>>()
        };
        let at_224 = verdicts(224);
        // The mutations have teeth, and spare some images.
        assert!((20..72).contains(&at_224.len()), "{at_224:?}");
        for size in [8, 32, 640] {
            assert_eq!(verdicts(size), at_224, "{size} px");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_captured_member_comes_back_as_text_per_sample() {
        let dir = scratch_dir("scan-capture");
        let path = dir.join("s.tar");
        let members: Vec<(&str, &[u8])> = vec![
            ("a.json", br#"{"uid": 1}"#),
            ("b.txt", b"no json"),
            ("c.json", b"\xff\xfe"),
        ];
        std::fs::write(&path, tar_of(&members)).unwrap();
        let opts = ScanOptions {
            capture: Some("json".into()),
            ..options(false, false)
        };
        let report = scan_shard(&path.display().to_string(), &opts);
        assert_eq!(
            report.captured,
            vec![Some(r#"{"uid": 1}"#.to_string()), None, None]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unreadable_or_unsound_shard_is_fatal_and_has_no_end_offset() {
        let dir = scratch_dir("scan-fatal");
        let missing = scan_shard(
            &dir.join("absent.tar").display().to_string(),
            &options(false, false),
        );
        let fatal = missing.fatal.expect("fatal");
        assert_eq!((fatal.reason, missing.samples), (Reason::Unreadable, 0));
        // The kind travels with it, so that a caller raises NotFoundError, as the loader does.
        assert_eq!(fatal.kind, SourceKind::NotFound);
        // A sample, then bytes that are not a tar header: the rest was not read.
        let mut tar = tar_of(&[("a.txt", b"x")]);
        tar.truncate(1024);
        tar.extend_from_slice(&[0x55; 512]);
        tar.extend_from_slice(&[0; 1024]);
        let path = dir.join("garbage.tar");
        std::fs::write(&path, &tar).unwrap();
        let report = scan_shard(&path.display().to_string(), &options(false, false));
        assert_eq!(
            report.fatal.as_ref().map(|f| (f.reason, f.kind)),
            Some((Reason::CorruptTar, SourceKind::Other))
        );
        assert_eq!((report.samples, report.offsets.clone()), (1, vec![0]));
        assert_eq!(report.to_index_entry("g.tar", false).offsets(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
