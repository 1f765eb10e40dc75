//! A Parquet file as the `parquet` crate's [`ChunkReader`] over the source layer's range reads.
//!
//! The reader asks for many small pieces (a page header, then its data); one HTTP request per
//! piece would cost a round trip each. So the footer and then each row group's needed column
//! chunks are fetched whole, one range request each ([`RangedFile::hold`]), and the crate's reads
//! are served from those; a read outside them (a footer larger than the first guess) is fetched
//! on its own. A local file is opened once and read at positions through that handle: an open
//! and a stat per row group cost more than reading its key column, and a file renamed over the
//! path meanwhile cannot be mixed in.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

use crate::read::source::{self, Expected, SourceError, SourceOptions, SourceStats};

pub struct RangedFile {
    url: String,
    len: u64,
    opts: SourceOptions,
    stats: Arc<SourceStats>,
    /// The version opened (size, ETag): every later range read refuses another, so a file
    /// replaced between the footer and a row group is an error, never a splice of two files.
    version: Expected,
    /// Fetched ranges, (start, bytes): the footer and the current row group's chunks.
    held: Mutex<Vec<(u64, Bytes)>>,
    /// A local file's handle, opened once at the version seen.
    local: Option<Mutex<File>>,
    /// The first source failure behind a parquet error: it keeps its kind (not found,
    /// credentials) instead of reading as a corrupt file.
    pub(super) failure: Mutex<Option<SourceError>>,
}

impl RangedFile {
    /// Opens `url`, learning its size (the index's, checked, or the source's).
    pub fn open(
        url: &str,
        expected: &Expected,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, SourceError> {
        let (version, local) = match source::local_path(url) {
            Some(path) => {
                let (file, version) = source::open_local_version(url, path, expected)?;
                (version, Some(Mutex::new(file)))
            }
            None => (source::object_version(url, expected, opts, stats)?, None),
        };
        Ok(Self {
            url: url.to_string(),
            len: version.size.unwrap_or(0),
            version,
            opts: opts.clone(),
            stats: stats.clone(),
            held: Mutex::new(Vec::new()),
            local,
            failure: Mutex::new(None),
        })
    }

    /// The version opened: the index's, completed by what the source answered (size, ETag).
    pub fn version(&self) -> &Expected {
        &self.version
    }

    /// Fetches `start..end` with one range request and keeps it for later reads.
    pub fn hold(&self, start: u64, end: u64) -> Result<(), SourceError> {
        let bytes = self.fetch(start, end)?;
        self.held.lock().expect("held ranges").push((start, bytes));
        Ok(())
    }

    /// Forgets every held range but the one at `keep_from` and after (the footer).
    pub fn release_before(&self, keep_from: u64) {
        self.held
            .lock()
            .expect("held ranges")
            .retain(|(start, _)| *start >= keep_from);
    }

    fn fetch(&self, start: u64, end: u64) -> Result<Bytes, SourceError> {
        let end = end.min(self.len);
        // A footer can place a column chunk past the file's end (found by fuzzing: the length
        // below underflowed); such a file is as short as one that ends mid-read.
        if start > end {
            return Err(SourceError::Open {
                url: source::redact_url(&self.url),
                message: format!(
                    "the file ended {} bytes before a read at byte {start}",
                    start - end
                ),
            });
        }
        let mut out = Vec::with_capacity(end.saturating_sub(start) as usize);
        let read = match &self.local {
            Some(file) => self.read_local(file, start, end, &mut out),
            None => self.open_range(start, Some(end)).and_then(|r| {
                r.take(end - start)
                    .read_to_end(&mut out)
                    .map_err(|e| from_io(&self.url, e))
            }),
        };
        match read {
            Ok(_) if out.len() as u64 == end - start => Ok(out.into()),
            Ok(_) => Err(SourceError::Open {
                url: source::redact_url(&self.url),
                message: format!(
                    "the file ended {} bytes into a read of {} at byte {start}",
                    out.len(),
                    end - start
                ),
            }),
            Err(e) => Err(e),
        }
    }

    fn read_local(
        &self,
        file: &Mutex<File>,
        start: u64,
        end: u64,
        out: &mut Vec<u8>,
    ) -> Result<usize, SourceError> {
        let mut file = file.lock().expect("local file");
        let n = file
            .seek(SeekFrom::Start(start))
            .and_then(|_| (&mut *file).take(end - start).read_to_end(out))
            .map_err(|e| from_io(&self.url, e))?;
        self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn open_range(
        &self,
        start: u64,
        end: Option<u64>,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        source::open_range_expecting(
            &self.url,
            start,
            end,
            &self.version,
            &self.opts,
            &self.stats,
        )
    }

    fn held_slice(&self, start: u64, len: usize) -> Option<Bytes> {
        let held = self.held.lock().expect("held ranges");
        held.iter().find_map(|(at, bytes)| {
            let from = start.checked_sub(*at)? as usize;
            (from + len <= bytes.len()).then(|| bytes.slice(from..from + len))
        })
    }

    fn remember(&self, e: SourceError) -> ParquetError {
        let text = e.to_string();
        self.failure.lock().expect("failure slot").get_or_insert(e);
        ParquetError::General(text)
    }
}

impl Length for RangedFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for RangedFile {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        {
            let held = self.held.lock().expect("held ranges");
            if let Some((at, bytes)) = held
                .iter()
                .find(|(at, b)| start >= *at && start < at + b.len() as u64)
            {
                return Ok(Box::new(Cursor::new(bytes.slice((start - at) as usize..))));
            }
        }
        self.open_range(start, None).map_err(|e| self.remember(e))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if let Some(bytes) = self.held_slice(start, length) {
            return Ok(bytes);
        }
        self.fetch(start, start + length as u64)
            .map_err(|e| self.remember(e))
    }
}

/// Chunks at most this far apart are fetched in one range request, the bytes between them
/// included: a round trip to S3 costs more than reading a few unneeded bytes (the chunk of an
/// image's `path`, a `width` column).
pub const COALESCE_GAP: u64 = 256 << 10;

/// `ranges` (start, end) sorted and merged where they overlap or lie at most `max_gap` apart.
pub fn coalesce(mut ranges: Vec<(u64, u64)>, max_gap: u64) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(max_gap) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The source error inside a read's `io::Error`, or one naming `url`.
fn from_io(url: &str, e: std::io::Error) -> SourceError {
    let message = e.to_string();
    match e.into_inner().map(|inner| inner.downcast::<SourceError>()) {
        Some(Ok(source)) => *source,
        _ => SourceError::Open {
            url: source::redact_url(url),
            message,
        },
    }
}
