//! Parquet image-text files as shards: each row is a sample, each wanted column a member.
//!
//! The column's name is the member's name, so `image_keys=["image"]` and `caption_key="text"`
//! name columns here as they name extensions in a tar. An image is a binary column (img2dataset's
//! `jpg`) or the struct Hugging Face `datasets` writes for its `Image` feature (`bytes`, `path`);
//! text columns give the bytes the file holds, unchecked (`values`): whoever uses a member checks
//! its UTF-8, so one invalid value skips one sample, never its row group. The sample key is the `key` or `__key__` column, else
//! `{file stem}/{row}`. A sample's ordinal is its row number in the file, which is also what the
//! index records as its "offset": a run that starts mid-file skips whole row groups by the
//! footer's row counts and reads only the rows it needs from the one it starts in.
//!
//! Only the wanted columns' chunks are fetched (`chunks`), one row group at a time, and they are
//! decompressed here, in the reader thread.

mod chunks;
mod footers;
pub mod lists;
pub(crate) mod pages;
pub(crate) mod rows;
pub mod schema;
pub(crate) mod values;

use std::collections::VecDeque;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::column::reader::{get_column_reader, ColumnReader};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::serialized_reader::SerializedPageReader;

pub use chunks::RangedFile;
pub use schema::{ColumnKind, Feature, FileSchema};

use crate::error::{capped_detail, Reason, SourceKind};
use crate::read::group::{RawSample, ShardFault};
use crate::read::source::{redact_url, Expected, SourceOptions, SourceStats};

/// Footer bytes fetched at first: most footers fit, a larger one costs one more read.
const FOOTER_GUESS: u64 = 64 << 10;

/// Whether a URL names a Parquet file (by its path, case-insensitively).
pub fn is_parquet_name(url: &str) -> bool {
    url.split(['?', '#'])
        .next()
        .unwrap_or(url)
        .to_ascii_lowercase()
        .ends_with(".parquet")
}

/// An opened Parquet file: its footer, read.
pub struct ParquetFile {
    file: Arc<RangedFile>,
    pub meta: Arc<ParquetMetaData>,
    pub schema: FileSchema,
    display: String,
    footer_start: u64,
}

impl ParquetFile {
    /// Opens `url` and reads its footer (one range read for most files; none when one of the
    /// last few files opened, `footers`).
    pub fn open(
        url: &str,
        expected: &Expected,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Self, ShardFault> {
        let display = redact_url(url);
        let file = RangedFile::open(url, expected, opts, stats).map_err(|e| ShardFault {
            reason: Reason::Unreadable,
            kind: e.kind(),
            detail: e.to_string(),
            offset: 0,
        })?;
        let len = parquet::file::reader::Length::len(&file);
        // Keyed by the version the source answered with now, not only the index's: a file whose
        // index recorded its size alone is still a cache hit only while its ETag is the same.
        let key = footers::FooterKey::of(url, len, file.version());
        if let Some(meta) = footers::cached(&key) {
            // Nothing of the file is held: every row group's chunks are fetched when read.
            return Ok(Self::of(Arc::new(file), meta, display, len));
        }
        let footer_start = len.saturating_sub(FOOTER_GUESS);
        file.hold(footer_start, len).map_err(|e| ShardFault {
            reason: Reason::Unreadable,
            kind: e.kind(),
            detail: e.to_string(),
            offset: footer_start,
        })?;
        let file = Arc::new(file);
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&*file)
            .map_err(|e| fault(&file, &display, format!("footer: {e}")))?;
        let meta = Arc::new(meta);
        footers::keep(key, meta.clone());
        Ok(Self::of(file, meta, display, footer_start))
    }

    fn of(
        file: Arc<RangedFile>,
        meta: Arc<ParquetMetaData>,
        display: String,
        footer_start: u64,
    ) -> Self {
        let schema = FileSchema::of(&meta);
        Self {
            file,
            meta,
            schema,
            display,
            footer_start,
        }
    }

    /// Rows in each row group, from the footer.
    pub fn row_counts(&self) -> Vec<u64> {
        self.meta
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as u64)
            .collect()
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        parquet::file::reader::Length::len(&*self.file)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn num_rows(&self) -> u64 {
        self.row_counts().iter().sum()
    }

    /// Fetches row group `group`'s chunks of `leaves` (one range each, coalesced)
    /// and bounded: a chunk larger than `rows` values of `max_value_bytes` take ([`chunk_limit`])
    /// is refused before it is fetched; `first_row` (the group's first row) goes into a fault's
    /// offset. Releases the previous row group's.
    fn fetch_chunks(
        &self,
        group: usize,
        leaves: &[usize],
        max_value_bytes: u64,
        first_row: u64,
    ) -> Result<(), ShardFault> {
        let meta = self.meta.row_group(group);
        self.file.release_before(self.footer_start);
        let rows = meta.num_rows().max(0) as u64;
        let limit = chunk_limit(rows, max_value_bytes);
        let mut ranges = Vec::with_capacity(leaves.len());
        for &leaf in leaves {
            // The footer's offset and size, checked: the crate's `byte_range` panics on a
            // negative one (found by fuzzing), and its page reader calls it on chunks fetched here.
            let chunk = meta.column(leaf);
            let start = chunk
                .dictionary_page_offset()
                .unwrap_or(chunk.data_page_offset());
            let (Ok(start), Ok(len)) =
                (u64::try_from(start), u64::try_from(chunk.compressed_size()))
            else {
                return Err(self.corrupt(format!(
                    "row group {group}: column chunk {leaf} at offset {start} of {} bytes",
                    chunk.compressed_size()
                )));
            };
            if len > limit {
                return Err(ShardFault {
                    reason: Reason::MemberTooLarge,
                    kind: SourceKind::Other,
                    detail: format!(
                        "{}: row group {group}: a column chunk of {len} bytes for {rows} rows is \
                         more than values of max_member_bytes ({max_value_bytes}) take",
                        self.display
                    ),
                    offset: first_row,
                });
            }
            ranges.push((start, start.saturating_add(len)));
        }
        for (start, end) in chunks::coalesce(ranges, chunks::COALESCE_GAP) {
            self.file.hold(start, end).map_err(|e| ShardFault {
                reason: Reason::Unreadable,
                kind: e.kind(),
                detail: e.to_string(),
                offset: first_row,
            })?;
        }
        Ok(())
    }

    /// Leaf `leaf`'s column reader in row group `group` (its chunk fetched already), its pages
    /// decompressed under the bound `value_cap` sets (`pages`), counted in the returned tally.
    pub(crate) fn bounded_column(
        &self,
        group: usize,
        leaf: usize,
        value_cap: u64,
    ) -> parquet::errors::Result<(ColumnReader, Arc<pages::PageTally>)> {
        let meta = self.meta.row_group(group);
        let chunk = meta.column(leaf);
        // The crate reads the pages as stored; `BoundedPages` decompresses them.
        let stored = chunk
            .clone()
            .into_builder()
            .set_compression(Compression::UNCOMPRESSED)
            .build()?;
        let rows = meta.num_rows().max(0) as u64;
        let inner = SerializedPageReader::new(self.file.clone(), &stored, rows as usize, None)?;
        let descr = chunk.column_descr_ptr();
        let tally = Arc::new(pages::PageTally::default());
        let bounded = pages::BoundedPages::new(
            inner,
            chunk.compression(),
            descr.physical_type(),
            descr.max_def_level(),
            descr.max_rep_level(),
            value_cap,
            rows,
            tally.clone(),
        );
        Ok((get_column_reader(descr, Box::new(bounded)), tally))
    }

    /// A parquet error of this file as a shard fault (see [`fault`]).
    pub fn corrupt(&self, detail: String) -> ShardFault {
        fault(&self.file, &self.display, detail)
    }

    /// The samples from row `first` on, with the members `wanted` names (None: every column
    /// that can be one) and the key column.
    pub fn samples(self, first: u64, wanted: Option<&[String]>) -> ParquetSamples {
        let columns = self.schema.members(wanted);
        let stem = file_stem(&self.display);
        let counts = self.row_counts();
        let mut group = 0;
        let mut group_first = 0;
        while group < counts.len() && group_first + counts[group] <= first {
            group_first += counts[group];
            group += 1;
        }
        ParquetSamples {
            file: self,
            columns,
            stem,
            counts,
            group,
            group_first,
            first,
            ready: VecDeque::new(),
            done: false,
            max_member_bytes: crate::defaults::MAX_MEMBER_BYTES,
            renamed: Vec::new(),
            current: None,
            piece_rows: PIECE_ROWS,
            piece_bytes: PIECE_BYTES,
        }
    }
}

/// The most bytes a column chunk of `rows` values can need when no value is over
/// `max_member_bytes`: each value at that size, compressed at snappy's worst expansion (n/6 + 32),
/// plus room for page headers and levels (64 KiB, and 64 bytes a value). A footer claiming more describes a chunk of members
/// over the limit, or is hostile; either way it is not fetched into memory.
fn chunk_limit(rows: u64, max_member_bytes: u64) -> u64 {
    let per_value = max_member_bytes
        .saturating_add(max_member_bytes / 6)
        .saturating_add(64);
    rows.max(1)
        .saturating_mul(per_value)
        .saturating_add(64 << 10)
}

/// The samples of a Parquet file, in row order.
pub struct ParquetSamples {
    file: ParquetFile,
    columns: schema::Members,
    stem: String,
    counts: Vec<u64>,
    /// The next row group to read, and the row number of its first row.
    group: usize,
    group_first: u64,
    /// Rows before this one are not handed out.
    first: u64,
    ready: VecDeque<RawSample>,
    done: bool,
    /// Bounds each member (a larger one is a `member_too_large` defect) and each column chunk
    /// fetched ([`chunk_limit`]), as the tar reader bounds a member from its header.
    max_member_bytes: u64,
    /// (column, member name): columns handed out under another name than their own.
    renamed: Vec<(String, String)>,
    /// The row group being read, a piece at a time.
    current: Option<rows::GroupPieces>,
    /// A piece's most rows, and the value bytes after which it stops early.
    piece_rows: usize,
    piece_bytes: usize,
}

/// Rows decoded into samples at a time: what a row group costs is a piece of it, never all.
pub(crate) const PIECE_ROWS: usize = 1024;
/// Value bytes after which a piece stops early (a piece holds at least one row).
pub(crate) const PIECE_BYTES: usize = 16 << 20;

impl ParquetSamples {
    /// The member size limit the chunks are bounded by (default: the core's `MAX_MEMBER_BYTES`).
    pub fn with_max_member_bytes(mut self, max_member_bytes: u64) -> Self {
        self.max_member_bytes = max_member_bytes;
        self
    }

    pub fn max_member_bytes(&self) -> u64 {
        self.max_member_bytes
    }

    /// Rows in the file (from its footer).
    pub fn num_rows(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Hands out each (column, member name) pair's column as a member of that name: a file's
    /// columns read under the names a sample spec looks for (`columns::resolve` in the batch
    /// stage: `datasets`' `image` column as the default image key).
    pub fn with_renamed(mut self, renamed: Vec<(String, String)>) -> Self {
        self.renamed = renamed;
        self
    }

    /// Reads rows at most this many, and value bytes about this many, at a time (tests read a
    /// file in pieces of one row to check that the pieces never change what it yields).
    #[cfg(test)]
    pub(crate) fn with_piece(mut self, rows: usize, bytes: usize) -> Self {
        self.piece_rows = rows.max(1);
        self.piece_bytes = bytes;
        self
    }

    /// Reads the next piece of the current row group into `ready` (`rows::GroupPieces`: up to
    /// `piece_rows` rows, fewer once `piece_bytes` of values are in it), opening the row group
    /// first: its wanted column chunks fetched, one range each.
    fn read_piece(&mut self) -> Result<(), ShardFault> {
        if self.current.is_none() {
            let wanted: Vec<rows::Wanted> = self
                .columns
                .columns
                .iter()
                .map(|c| rows::Wanted {
                    name: c.name.clone(),
                    leaf: c.leaf,
                    list: false,
                })
                .collect();
            let group = self.file.group_pieces(
                self.group,
                &wanted,
                self.max_member_bytes,
                self.group_first,
            )?;
            self.current = Some(group);
        }
        let group = self.current.as_mut().expect("a row group open");
        let Some((first_ordinal, n, pieces)) =
            group.next_piece(&self.file, self.piece_rows, self.piece_bytes)?
        else {
            self.current = None;
            self.group_first += self.counts[self.group];
            self.group += 1;
            return Ok(());
        };
        let mut columns: Vec<_> = pieces
            .into_iter()
            .map(|p| match p {
                rows::ColumnPiece::Flat(p) => {
                    (p.values.into_iter(), p.too_large.into_iter().peekable())
                }
                rows::ColumnPiece::Lists(_) => unreachable!("member columns are flat"),
            })
            .collect();
        for (row, ordinal) in (0..n).zip(first_ordinal..) {
            let mut large = None;
            let values: Vec<Option<Vec<u8>>> = columns
                .iter_mut()
                .enumerate()
                .map(|(i, (values, too_large))| {
                    if let Some((_, len)) = too_large.next_if(|(at, _)| *at == row) {
                        large.get_or_insert((i, len));
                    }
                    values.next().expect("one value a row")
                })
                .collect();
            if ordinal >= self.first {
                let large = large.map(|(i, len)| (self.columns.columns[i].name.clone(), len));
                self.ready.push_back(self.sample(values, ordinal, large));
            }
        }
        Ok(())
    }

    /// The sample of row `ordinal` from its `values`, one per column of `self.columns`.
    /// `large` names a column whose value was over the cap (and its length): it was not read.
    fn sample(
        &self,
        values: Vec<Option<Vec<u8>>>,
        ordinal: u64,
        large: Option<(String, u64)>,
    ) -> RawSample {
        let mut key = None;
        let mut members = Vec::with_capacity(3);
        let mut defect = None;
        for (column, value) in self.columns.columns.iter().zip(values) {
            let name = &column.name;
            if self.columns.key.as_deref() == Some(name.as_str()) {
                // A key that is not UTF-8 falls back to `{stem}/{row}`, as a null one does.
                key = value.and_then(|b| String::from_utf8(b).ok());
                continue;
            }
            match value {
                Some(bytes) => members.push((name.clone(), bytes)),
                None if self.columns.images.contains(name) && defect.is_none() => {
                    defect = Some((
                        Reason::NullImage,
                        format!("the image column {name:?} is null in row {ordinal}"),
                    ));
                }
                None => {}
            }
        }
        // A null image is only a defect when no other image column holds one.
        if members.iter().any(|(n, _)| self.columns.images.contains(n)) {
            defect = None;
        }
        let max = self.max_member_bytes;
        if let Some((name, len)) = large {
            defect = Some((
                Reason::MemberTooLarge,
                format!("{name}: {len} bytes > {max}"),
            ));
        }
        for (name, _) in &mut members {
            if let Some((_, member)) = self.renamed.iter().find(|(column, _)| column == name) {
                name.clone_from(member);
            }
        }
        RawSample {
            key: key.unwrap_or_else(|| format!("{}/{ordinal}", self.stem)),
            members,
            offset: ordinal,
            ordinal,
            defect,
        }
    }
}

impl Iterator for ParquetSamples {
    type Item = Result<RawSample, ShardFault>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(sample) = self.ready.pop_front() {
                return Some(Ok(sample));
            }
            if self.done || self.group >= self.counts.len() {
                return None;
            }
            if let Err(f) = self.read_piece() {
                self.done = true;
                return Some(Err(f));
            }
        }
    }
}

/// A parquet error as a shard fault: the source failure behind it when there was one, else a
/// corrupt file.
fn fault(file: &RangedFile, display: &str, detail: String) -> ShardFault {
    match file.failure.lock().expect("failure slot").take() {
        Some(e) => ShardFault {
            reason: Reason::Unreadable,
            kind: e.kind(),
            detail: e.to_string(),
            offset: 0,
        },
        // The crate's error text is capped: it is not ours to know that it never quotes values.
        None => ShardFault {
            reason: Reason::CorruptParquet,
            kind: SourceKind::Other,
            detail: format!("{display}: {}", capped_detail(detail)),
            offset: 0,
        },
    }
}

/// The file name without its folder and `.parquet`.
fn file_stem(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet")
        .or_else(|| name.strip_suffix(".PARQUET"))
        .unwrap_or(name)
        .to_string()
}

#[cfg(test)]
pub(crate) mod tests;
