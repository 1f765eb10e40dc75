//! Sample grouping: the one place that decides which tar members form a sample.
//!
//! The rule is webdataset's, so that a shard means the same thing to both readers:
//! the key is the member path up to the first `.` of its last path component, the extension
//! (lower-cased) is the rest; consecutive members with the same key form one sample; a shard
//! boundary always ends a sample; names like `__meta__` are skipped, as are members whose last
//! component has no extension.

use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, OnceLock};

use flate2::bufread::MultiGzDecoder;
use regex::Regex;

use crate::error::{Reason, SourceKind};
use crate::read::parquet;
use crate::read::source::{self, redact_url, SourceOptions, SourceStats};
use crate::read::tar::{Entry, TarError, TarReader};

fn key_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Same pattern as webdataset's `base_plus_ext`; Rust's regex gives the same leftmost-first
    // captures, so edge cases (dots in folders, leading dots) group identically.
    RE.get_or_init(|| Regex::new(r"^((?:.*/|)[^.]+)[.]([^/]*)$").expect("valid regex"))
}

fn meta_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"^__[^/]*__($|/)").expect("valid regex"))
}

/// Splits a member path into (key, lower-cased extension), or `None` if it belongs to no sample.
pub fn split_key(name: &str) -> Option<(&str, String)> {
    if meta_pattern().is_match(name) {
        return None;
    }
    let caps = key_pattern().captures(name)?;
    Some((caps.get(1)?.as_str(), caps.get(2)?.as_str().to_lowercase()))
}

/// A grouped, undecoded sample.
#[derive(Debug, Clone)]
pub struct RawSample {
    pub key: String,
    /// (extension, bytes) in tar order.
    pub members: Vec<(String, Vec<u8>)>,
    /// Byte offset of the sample's first member header in the uncompressed tar stream.
    pub offset: u64,
    /// Position of the sample in its shard (0-based, counting every grouped sample).
    pub ordinal: u64,
    /// Set when the sample is known bad before decoding (duplicate extension, oversized member,
    /// truncated shard).
    pub defect: Option<(Reason, String)>,
}

impl RawSample {
    pub fn get(&self, ext: &str) -> Option<&[u8]> {
        self.members
            .iter()
            .find(|(e, _)| e == ext)
            .map(|(_, d)| d.as_slice())
    }

    pub fn byte_len(&self) -> usize {
        self.members.iter().map(|(_, d)| d.len()).sum()
    }
}

/// A failure that ends the reading of a shard.
#[derive(Debug, Clone)]
pub struct ShardFault {
    pub reason: Reason,
    pub detail: String,
    pub offset: u64,
    /// For an `unreadable` shard: what kind of source failure it was.
    pub kind: SourceKind,
}

/// Whether a URL names a gzip-compressed shard (by its path, case-insensitively). The one
/// definition: the index and the reader must agree on which shards cannot be entered mid-stream.
pub fn is_gzip_name(url: &str) -> bool {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .to_ascii_lowercase();
    path.ends_with(".gz") || path.ends_with(".tgz")
}

/// Opens a shard for sample grouping at `start` (a sample offset from the index, or 0).
/// Gzip shards are recognised by name or by magic bytes; they cannot be entered in the middle,
/// so they are decompressed from the start and the bytes before `start` are discarded. A
/// Parquet file starts at row `first_ordinal` and gives every column that can be a member (the
/// loader and the scan read only their spec's: `SampleReader::of_parquet`).
pub fn open_shard(
    url: &str,
    start: u64,
    first_ordinal: u64,
    max_member_bytes: u64,
    expected: &source::Expected,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<SampleReader, ShardFault> {
    if parquet::is_parquet_name(url) {
        let file = parquet::ParquetFile::open(url, expected, opts, stats)?;
        let rows = file
            .samples(first_ordinal, None)
            .with_max_member_bytes(max_member_bytes);
        return Ok(SampleReader::of_parquet(rows, first_ordinal));
    }
    let unreadable = |e: source::SourceError| ShardFault {
        reason: Reason::Unreadable,
        kind: e.kind(),
        detail: e.to_string(),
        offset: start,
    };
    let gz_by_name = is_gzip_name(url);
    let stream = source::open_expecting(
        url,
        if gz_by_name { 0 } else { start },
        expected,
        opts,
        stats,
    )
    .map_err(unreadable)?;
    let mut buffered = BufReader::with_capacity(256 * 1024, stream);
    let gz_by_magic = !gz_by_name && start == 0 && {
        let head = buffered.fill_buf().map_err(|e| ShardFault {
            reason: Reason::Unreadable,
            kind: source::SourceError::kind_of_io(&e),
            detail: format!("{}: {e}", redact_url(url)),
            offset: 0,
        })?;
        head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b
    };
    let reader: Box<dyn Read + Send> =
        if gz_by_name || gz_by_magic {
            let mut gz: Box<dyn Read + Send> = Box::new(MultiGzDecoder::new(buffered));
            if start > 0 {
                let skipped = std::io::copy(&mut (&mut gz).take(start), &mut std::io::sink())
                    .map_err(|e| ShardFault {
                        reason: Reason::TruncatedTar,
                        kind: SourceKind::Other,
                        detail: format!("gzip stream: {e}"),
                        offset: 0,
                    })?;
                if skipped < start {
                    return Err(ShardFault {
                        reason: Reason::TruncatedTar,
                        kind: SourceKind::Other,
                        detail: format!("gzip stream ended at {skipped} before offset {start}"),
                        offset: skipped,
                    });
                }
            }
            gz
        } else {
            Box::new(buffered)
        };
    let mut samples = SampleReader::new(
        TarReader::new(reader, start, max_member_bytes),
        first_ordinal,
    );
    samples.compressed = gz_by_name || gz_by_magic;
    Ok(samples)
}

/// Groups the members of one tar stream into samples.
pub struct SampleReader {
    tar: TarReader<Box<dyn Read + Send>>,
    current: Option<RawSample>,
    next_ordinal: u64,
    done: bool,
    /// Items decided but not yet returned (a finished sample, a cut sample, the fault).
    ready: std::collections::VecDeque<Result<RawSample, ShardFault>>,
    compressed: bool,
    data_end: u64,
    /// A Parquet file's rows instead of the tar (and the member size cap).
    parquet: Option<parquet::ParquetSamples>,
}

impl SampleReader {
    pub fn new(tar: TarReader<Box<dyn Read + Send>>, first_ordinal: u64) -> Self {
        Self {
            tar,
            current: None,
            next_ordinal: first_ordinal,
            done: false,
            ready: std::collections::VecDeque::new(),
            compressed: false,
            data_end: 0,
            parquet: None,
        }
    }

    /// The rows of a Parquet file from `first_ordinal` on, as samples.
    pub fn of_parquet(rows: parquet::ParquetSamples, first_ordinal: u64) -> Self {
        let mut samples = SampleReader::new(
            TarReader::new(Box::new(std::io::empty()), 0, rows.max_member_bytes()),
            first_ordinal,
        );
        samples.data_end = rows.num_rows();
        samples.parquet = Some(rows);
        samples
    }

    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    /// Offset just past the data (and padding) of the last member read: where a shard's samples
    /// end and its end-of-archive blocks begin.
    pub fn data_end(&self) -> u64 {
        self.data_end
    }

    pub fn trailing_garbage(&self) -> bool {
        self.tar.trailing_garbage
    }

    fn start_sample(&mut self, key: &str, offset: u64) -> Option<RawSample> {
        let finished = self.current.take();
        self.current = Some(RawSample {
            key: key.to_string(),
            members: Vec::with_capacity(3),
            offset,
            ordinal: self.next_ordinal,
            defect: None,
        });
        self.next_ordinal += 1;
        finished
    }

    fn fault_from(e: TarError) -> ShardFault {
        let offset = e.offset();
        let (reason, kind) = match &e {
            TarError::Truncated { .. } => (Reason::TruncatedTar, SourceKind::Other),
            TarError::Corrupt { .. } => (Reason::CorruptTar, SourceKind::Other),
            TarError::Io { source: err, .. } => {
                (Reason::Unreadable, source::SourceError::kind_of_io(err))
            }
        };
        ShardFault {
            reason,
            kind,
            detail: e.to_string(),
            offset,
        }
    }
}

impl Iterator for SampleReader {
    type Item = Result<RawSample, ShardFault>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(rows) = &mut self.parquet {
            return rows.next();
        }
        if let Some(item) = self.ready.pop_front() {
            return Some(item);
        }
        if self.done {
            return None;
        }
        loop {
            let entry = match self.tar.next_entry() {
                Ok(Some(e)) => e,
                Ok(None) => {
                    self.done = true;
                    return self.current.take().map(Ok);
                }
                Err(e) => {
                    self.done = true;
                    let cut = e.cut_member().and_then(|(name, offset)| {
                        split_key(name).map(|(key, _)| (key.to_string(), offset))
                    });
                    let fault = Self::fault_from(e);
                    let defect = Some((fault.reason, fault.detail.clone()));
                    match cut {
                        // The cut member's header names another key: the open sample ended
                        // before it and is complete; the cut member starts the broken sample.
                        Some((key, offset)) if !matches!(&self.current, Some(c) if c.key == key) => {
                            if let Some(done) = self.start_sample(&key, offset) {
                                self.ready.push_back(Ok(done));
                            }
                            let mut broken = self.current.take().expect("just started");
                            broken.defect = defect;
                            self.ready.push_back(Ok(broken));
                        }
                        // Otherwise the open sample may be missing members: not complete.
                        _ => {
                            if let Some(mut s) = self.current.take() {
                                s.defect = defect;
                                self.ready.push_back(Ok(s));
                            }
                        }
                    }
                    self.ready.push_back(Err(fault));
                    return self.ready.pop_front();
                }
            };
            self.data_end = self.tar.position();
            let (name, data, offset, oversized) = match entry {
                Entry::File(m) => (m.name, m.data, m.offset, None),
                Entry::Oversized { name, size, offset } => (name, Vec::new(), offset, Some(size)),
            };
            let Some((key, ext)) = split_key(&name) else {
                continue;
            };
            let same_sample = self.current.as_ref().is_some_and(|c| c.key == key);
            let finished = if same_sample {
                None
            } else {
                self.start_sample(key, offset)
            };
            let cur = self.current.as_mut().expect("a sample is open");
            if let Some(size) = oversized {
                if cur.defect.is_none() {
                    cur.defect = Some((
                        Reason::MemberTooLarge,
                        format!("member {name:?} has {size} bytes"),
                    ));
                }
            } else if cur.members.iter().any(|(e, _)| *e == ext) {
                if cur.defect.is_none() {
                    cur.defect = Some((
                        Reason::DuplicateMember,
                        format!("member {name:?} repeats extension {ext:?}"),
                    ));
                }
            } else {
                cur.members.push((ext, data));
            }
            if let Some(s) = finished {
                return Some(Ok(s));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_webdataset() {
        assert_eq!(split_key("a/b.c.d"), Some(("a/b", "c.d".to_string())));
        assert_eq!(split_key("x.JPG"), Some(("x", "jpg".to_string())));
        assert_eq!(split_key("a.b/c.txt"), Some(("a.b/c", "txt".to_string())));
        assert_eq!(split_key("noext"), None);
        assert_eq!(split_key("a.b/noext"), None);
        assert_eq!(split_key("__meta__"), None);
        assert_eq!(split_key("__dir__/x.txt"), None);
        // A leading dot in the last component lets the regex reach back over the slash,
        // exactly as Python's `re` does.
        assert_eq!(split_key("ab/.c"), Some(("ab/", "c".to_string())));
    }

    /// A decompression bomb in a gzip shard (issue 52): a member of 64 MiB that takes 64 KB
    /// compressed is skipped as `member_too_large` as it streams past, its bytes never held, and
    /// the next sample is read.
    #[test]
    fn a_member_of_a_gzip_shard_far_over_the_limit_is_skipped_without_being_held() {
        use crate::check::fuzzing::seeds::{gzip, tar_header, tar_member, BLOCK};
        let long = 64u64 << 20;
        let mut tar = tar_header("s/00000.txt", long, b'0').to_vec();
        tar.resize(tar.len() + long as usize, b' ');
        tar_member(&mut tar, "s/00001.txt", b"after", b'0');
        tar.extend_from_slice(&[0; 2 * BLOCK]);
        let shard = gzip(&tar);
        drop(tar);
        assert!(shard.len() < 1 << 20, "{} bytes", shard.len());
        let dir = crate::fixtures::scratch_dir("gzip-bomb");
        let path = dir.join("bomb.tar.gz");
        std::fs::write(&path, &shard).unwrap();
        let stats = Arc::new(SourceStats::default());
        let samples: Vec<RawSample> = open_shard(
            path.to_str().unwrap(),
            0,
            0,
            1 << 20,
            &source::Expected::default(),
            &SourceOptions::default(),
            &stats,
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
        assert_eq!(samples.len(), 2);
        let (reason, detail) = samples[0].defect.clone().expect("a defect");
        assert_eq!(reason, Reason::MemberTooLarge, "{detail}");
        assert!(samples[0].members.iter().all(|(_, b)| b.is_empty()));
        assert_eq!(samples[1].get("txt"), Some(&b"after"[..]));
        assert!(samples[1].defect.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
