//! A column chunk's pages, decompressed here under a bound, so that no page costs more memory
//! than its column's value cap allows, whatever its header claims.
//!
//! The crate's page reader allocates what a page header declares and decompresses the page
//! whole: a 75 KB zstd file of 48 MiB values held 48 MiB a page, and a gzip page or a lying
//! header more. Here the crate reads the chunk as if it were uncompressed (pages as stored),
//! and each page is decompressed with its output bounded by `budget` (the value cap plus room
//! for levels). A page that decompresses past the budget is, when it can be, read as a stream
//! (a flat column of plain byte arrays, the shape of text and image columns when the dictionary
//! is off, under a streaming codec: zstd, gzip, lz4 frames; or a list of them, an interleaved
//! document's `texts` or `images`): its values are re-cut into pages of
//! at most [`SPLIT_BYTES`] each, and a value over the cap is skipped as it streams past, handed
//! on empty and noted in the [`PageTally`] for the reader to report as too large. A snappy page
//! is decompressed whole (its format bounds its output by its compressed bytes, see
//! `decompress`). Any other page over the budget is an error the tally marks as too large,
//! never an allocation.

use std::io::{self, Cursor, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result};

/// Room a page needs beside one value at the cap: its levels, and 4 bytes of length a value.
pub(crate) const PAGE_SLACK: u64 = 1 << 20;

/// The most value bytes a page re-cut from a page over the budget holds (one value more at most).
pub(crate) const SPLIT_BYTES: usize = 4 << 20;

/// What the pages tell the column's reader: values skipped for size, and where pages end.
#[derive(Default)]
pub(crate) struct PageTally {
    /// (level index in the column chunk, length) of each value over the cap that a streamed
    /// page handed on empty.
    pub oversized: Mutex<Vec<(u64, u64)>>,
    /// Levels in the data pages handed out so far: a reader that asks for no more than the
    /// levels left in them never makes the column reader load a second page in one call.
    pub levels: AtomicU64,
    /// Why the chunk could not be read within the budget, when that was the failure.
    pub too_large: Mutex<Option<String>>,
}

/// A page reader over the stored pages of one column chunk, decompressing each under a bound.
pub(crate) struct BoundedPages<P> {
    inner: P,
    codec: Compression,
    physical: PhysicalType,
    max_def: i16,
    max_rep: i16,
    /// Values longer than this are skipped (streamed pages) or reported (the reader checks).
    cap: u64,
    /// The most bytes one decompressed page may take.
    budget: usize,
    /// The row group's rows, from the footer: a flat column's page claiming more is corrupt.
    rows: u64,
    tally: Arc<PageTally>,
    split: Option<Split>,
}

/// A page over the budget, being read as a stream.
struct Split {
    values: Box<dyn Read + Send>,
    /// The page's repetition levels (None: a flat column).
    reps: Option<Vec<i16>>,
    /// The page's definition levels (None: a required column, every level a value).
    defs: Option<Vec<i16>>,
    count: usize,
    next: usize,
    /// The column's level index of the page's first level.
    first_level: u64,
}

impl<P: PageReader> BoundedPages<P> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: P,
        codec: Compression,
        physical: PhysicalType,
        max_def: i16,
        max_rep: i16,
        cap: u64,
        rows: u64,
        tally: Arc<PageTally>,
    ) -> Self {
        let budget = cap.saturating_add(PAGE_SLACK).min(usize::MAX as u64 >> 1) as usize;
        Self {
            inner,
            codec,
            physical,
            max_def,
            max_rep,
            cap,
            budget,
            rows,
            tally,
            split: None,
        }
    }

    fn too_large(&self, what: String) -> ParquetError {
        let detail = format!("{what}, over the {} bytes a page may take", self.budget);
        self.tally
            .too_large
            .lock()
            .expect("tally")
            .get_or_insert(detail.clone());
        ParquetError::General(detail)
    }

    /// `input` decompressed, or None when it is more than the budget (Err when that cannot be
    /// read as a stream either, or the data is corrupt).
    fn decompress(&self, input: &Bytes) -> Result<Decompressed> {
        let budget = self.budget;
        match self.codec {
            Compression::UNCOMPRESSED => Ok(Decompressed::Whole(input.clone())),
            Compression::SNAPPY => {
                // Snappy states its length first, and a raw snappy stream cannot be read in
                // pieces (a copy may reach back to any earlier byte). Its format bounds that
                // length at about 22 times the bytes compressed (a 3-byte copy makes at most
                // 64), which are held already: a page over the budget is decompressed whole
                // within that bound, as pyarrow's default codec writes legitimate pages of many
                // values over it, and a value over the cap is then skipped without a copy.
                let len = snap::raw::decompress_len(input).map_err(general)?;
                if len > budget && len / 32 > input.len() {
                    return Err(self.too_large(format!("a snappy page of {len} bytes")));
                }
                let mut out = vec![0; len];
                let n = snap::raw::Decoder::new()
                    .decompress(input, &mut out)
                    .map_err(general)?;
                out.truncate(n);
                Ok(Decompressed::Whole(out.into()))
            }
            Compression::LZ4_RAW => {
                let room = budget.min(input.len().saturating_mul(255).saturating_add(64));
                let mut out = vec![0; room];
                match lz4_flex::block::decompress_into(input, &mut out) {
                    Ok(n) => {
                        out.truncate(n);
                        Ok(Decompressed::Whole(out.into()))
                    }
                    Err(lz4_flex::block::DecompressError::OutputTooSmall { .. })
                        if room == budget =>
                    {
                        Err(self.too_large("an lz4 page".to_string()))
                    }
                    Err(e) => Err(general(e)),
                }
            }
            Compression::LZ4 => match hadoop_lz4(input, budget) {
                Some(Ok(out)) => Ok(Decompressed::Whole(out.into())),
                Some(Err(())) => Err(self.too_large("an lz4 (hadoop) page".to_string())),
                None => self.stream(input.clone()),
            },
            Compression::GZIP(_) | Compression::ZSTD(_) => self.stream(input.clone()),
            other => Err(ParquetError::General(format!(
                "pages compressed with {other} are not read"
            ))),
        }
    }

    /// Decompresses a streaming codec's page up to the budget: whole when it fits, else the
    /// stream from its start (the bytes read to learn that it does not fit are dropped, not
    /// held beside the stream: a page over the budget is decompressed twice up to it).
    fn stream(&self, input: Bytes) -> Result<Decompressed> {
        let mut out = Vec::new();
        self.decoder(input.clone())?
            .take(self.budget as u64 + 1)
            .read_to_end(&mut out)
            .map_err(general)?;
        if out.len() <= self.budget {
            return Ok(Decompressed::Whole(out.into()));
        }
        drop(out);
        Ok(Decompressed::Stream(self.decoder(input)?))
    }

    fn decoder(&self, input: Bytes) -> Result<Box<dyn Read + Send>> {
        Ok(match self.codec {
            Compression::GZIP(_) => Box::new(flate2::read::MultiGzDecoder::new(Cursor::new(input))),
            Compression::ZSTD(_) => Box::new(
                zstd::stream::read::Decoder::with_buffer(Cursor::new(input)).map_err(general)?,
            ),
            _ => Box::new(lz4_flex::frame::FrameDecoder::new(Cursor::new(input))),
        })
    }

    /// Whether a page over the budget can be read as a stream of plain values (a flat column's
    /// or a list's: the re-cut pages are v1 pages, which a list's rows may span).
    fn splittable(&self, encoding: Encoding) -> bool {
        self.physical == PhysicalType::BYTE_ARRAY
            && encoding == Encoding::PLAIN
            && self.max_rep < 256
            && self.max_def < 256
    }

    /// A dictionary page of byte arrays must hold the `num_values` length-prefixed values it
    /// claims: the crate's plain decoder reads each length without checking that four bytes are
    /// left, and panics (found by fuzzing).
    fn check_dictionary(&self, buf: &[u8], num_values: u32) -> Result<()> {
        if self.physical != PhysicalType::BYTE_ARRAY {
            return Ok(());
        }
        let mut at = 0usize;
        for _ in 0..num_values {
            let len = buf
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
            match len.map(|len| at + 4 + len).filter(|&end| end <= buf.len()) {
                Some(end) => at = end,
                None => {
                    return Err(ParquetError::General(format!(
                        "a dictionary page of {num_values} values overruns its {} bytes",
                        buf.len()
                    )))
                }
            }
        }
        Ok(())
    }

    /// A flat column's page claiming more levels than the row group has rows is corrupt: no
    /// level buffer is sized from it.
    fn check_levels(&self, num_values: u32) -> Result<()> {
        let seen = self.tally.levels.load(Ordering::Relaxed);
        if self.max_rep == 0 && seen + num_values as u64 > self.rows {
            return Err(ParquetError::General(format!(
                "a column holds more values than the footer's {} rows",
                self.rows
            )));
        }
        Ok(())
    }

    fn handed(&self, levels: u32) {
        self.tally
            .levels
            .fetch_add(levels as u64, Ordering::Relaxed);
    }

    /// Starts reading a page over the budget as a stream, `levels` its repetition and
    /// definition levels (RLE) when they are not in the stream (a v2 page's).
    fn start_split(
        &mut self,
        mut values: Box<dyn Read + Send>,
        num_values: u32,
        encoding: Encoding,
        levels: Option<(Bytes, Bytes)>,
    ) -> Result<Option<Page>> {
        if !self.splittable(encoding) {
            return Err(self.too_large(format!("a {encoding} page of {num_values} values")));
        }
        let count = num_values as usize;
        let (given_reps, given_defs) = match levels {
            Some((reps, defs)) => (Some(reps), Some(defs)),
            None => (None, None),
        };
        // A v1 page: the levels lead its data (repetition, then definition), after their length.
        let mut levels = |max: i16, given: Option<Bytes>| -> Result<Option<Vec<i16>>> {
            if max == 0 {
                return Ok(None);
            }
            let bytes = match given {
                Some(bytes) => bytes,
                None => {
                    let mut len = [0u8; 4];
                    values.read_exact(&mut len).map_err(general)?;
                    let len = u32::from_le_bytes(len) as usize;
                    if len > count / 4 + 64 {
                        return Err(ParquetError::General(format!(
                            "{len} bytes of levels for {count} values"
                        )));
                    }
                    let mut bytes = vec![0; len];
                    values.read_exact(&mut bytes).map_err(general)?;
                    bytes.into()
                }
            };
            Ok(Some(decode_levels(&bytes, level_width(max), count)?))
        };
        let reps = levels(self.max_rep, given_reps)?;
        let defs = levels(self.max_def, given_defs)?;
        self.split = Some(Split {
            values,
            reps,
            defs,
            count,
            next: 0,
            first_level: self.tally.levels.load(Ordering::Relaxed),
        });
        self.next_piece()
    }

    /// The next page cut from the page being streamed, None once it is read.
    fn next_piece(&mut self) -> Result<Option<Page>> {
        let Some(split) = self.split.as_mut() else {
            return Ok(None);
        };
        if split.next == split.count {
            self.split = None;
            return Ok(None);
        }
        let start = split.next;
        let mut values = Vec::new();
        while split.next < split.count && values.len() < SPLIT_BYTES {
            let present = split
                .defs
                .as_ref()
                .is_none_or(|d| d[split.next] == self.max_def);
            if present {
                let mut len = [0u8; 4];
                split.values.read_exact(&mut len).map_err(general)?;
                let len = u32::from_le_bytes(len) as u64;
                if len > self.cap {
                    let skipped = io::copy(&mut (&mut split.values).take(len), &mut io::sink())
                        .map_err(general)?;
                    if skipped < len {
                        return Err(ParquetError::EOF(format!(
                            "a value of {len} bytes ends after {skipped}"
                        )));
                    }
                    self.tally
                        .oversized
                        .lock()
                        .expect("tally")
                        .push((split.first_level + split.next as u64, len));
                    values.extend_from_slice(&0u32.to_le_bytes());
                } else {
                    values.extend_from_slice(&(len as u32).to_le_bytes());
                    let at = values.len();
                    (&mut split.values)
                        .take(len)
                        .read_to_end(&mut values)
                        .map_err(general)?;
                    if (values.len() - at) as u64 != len {
                        return Err(ParquetError::EOF(format!(
                            "a value of {len} bytes ends after {}",
                            values.len() - at
                        )));
                    }
                }
            }
            split.next += 1;
        }
        let n = split.next - start;
        let mut buf = Vec::with_capacity(values.len() + 16);
        for levels in [&split.reps, &split.defs].into_iter().flatten() {
            let rle = encode_levels(&levels[start..split.next]);
            buf.extend_from_slice(&(rle.len() as u32).to_le_bytes());
            buf.extend_from_slice(&rle);
        }
        buf.extend_from_slice(&values);
        self.handed(n as u32);
        Ok(Some(Page::DataPage {
            buf: buf.into(),
            num_values: n as u32,
            encoding: Encoding::PLAIN,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        }))
    }
}

/// A page's bytes decompressed whole, or the stream of a page over the budget.
enum Decompressed {
    Whole(Bytes),
    Stream(Box<dyn Read + Send>),
}

impl<P: PageReader> PageReader for BoundedPages<P> {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        if self.split.is_some() {
            if let Some(page) = self.next_piece()? {
                return Ok(Some(page));
            }
        }
        let Some(page) = self.inner.get_next_page()? else {
            return Ok(None);
        };
        let page = match page {
            Page::DictionaryPage {
                buf,
                num_values,
                encoding,
                is_sorted,
            } => match self.decompress(&buf)? {
                Decompressed::Whole(buf) => {
                    self.check_dictionary(&buf, num_values)?;
                    Page::DictionaryPage {
                        buf,
                        num_values,
                        encoding,
                        is_sorted,
                    }
                }
                Decompressed::Stream(_) => {
                    return Err(self.too_large(format!("a dictionary page of {num_values} values")))
                }
            },
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                rep_level_encoding,
                statistics,
            } => {
                self.check_levels(num_values)?;
                match self.decompress(&buf)? {
                    Decompressed::Whole(buf) => {
                        self.handed(num_values);
                        Page::DataPage {
                            buf,
                            num_values,
                            encoding,
                            def_level_encoding,
                            rep_level_encoding,
                            statistics,
                        }
                    }
                    Decompressed::Stream(values) => {
                        let rle = |max: i16, e: Encoding| max == 0 || e == Encoding::RLE;
                        if !rle(self.max_def, def_level_encoding)
                            || !rle(self.max_rep, rep_level_encoding)
                        {
                            return Err(self.too_large(format!(
                                "a page of {num_values} values with {def_level_encoding} levels"
                            )));
                        }
                        return self.start_split(values, num_values, encoding, None);
                    }
                }
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                num_rows,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                statistics,
            } => {
                self.check_levels(num_values)?;
                let levels_len = def_levels_byte_len as usize + rep_levels_byte_len as usize;
                if levels_len > buf.len() {
                    return Err(ParquetError::General(format!(
                        "a v2 page's levels ({levels_len} bytes) overrun its {} bytes",
                        buf.len()
                    )));
                }
                let rest = buf.slice(levels_len..);
                let data = if is_compressed {
                    self.decompress(&rest)?
                } else {
                    Decompressed::Whole(rest)
                };
                match data {
                    Decompressed::Whole(values) => {
                        let mut whole = Vec::with_capacity(levels_len + values.len());
                        whole.extend_from_slice(&buf[..levels_len]);
                        whole.extend_from_slice(&values);
                        self.handed(num_values);
                        Page::DataPageV2 {
                            buf: whole.into(),
                            num_values,
                            encoding,
                            num_nulls,
                            num_rows,
                            def_levels_byte_len,
                            rep_levels_byte_len,
                            is_compressed: false,
                            statistics,
                        }
                    }
                    Decompressed::Stream(values) => {
                        let reps = buf.slice(..rep_levels_byte_len as usize);
                        let defs = buf.slice(rep_levels_byte_len as usize..levels_len);
                        return self.start_split(values, num_values, encoding, Some((reps, defs)));
                    }
                }
            }
        };
        Ok(Some(page))
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        if self.split.is_some() {
            return Err(ParquetError::General(
                "a page read as a stream cannot be peeked".to_string(),
            ));
        }
        self.inner.peek_next_page()
    }

    /// A list's reader asks, as it loads a page, whether the next one starts a row: a page
    /// cut from one being streamed does when its first repetition level is 0.
    fn at_record_boundary(&mut self) -> Result<bool> {
        match &self.split {
            Some(split) if split.next < split.count => {
                Ok(split.reps.as_ref().is_none_or(|reps| reps[split.next] == 0))
            }
            _ => self.inner.at_record_boundary(),
        }
    }

    fn skip_next_page(&mut self) -> Result<()> {
        if self.split.is_some() {
            return Err(ParquetError::General(
                "a page read as a stream cannot be skipped".to_string(),
            ));
        }
        self.inner.skip_next_page()
    }
}

impl<P: PageReader> Iterator for BoundedPages<P> {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

fn general(e: impl std::fmt::Display) -> ParquetError {
    ParquetError::General(e.to_string())
}

/// An LZ4 page in Hadoop's framing (big-endian decompressed and compressed sizes before each
/// block), decompressed under `budget`: None when the bytes are not in that framing (then
/// they are an LZ4 frame), Err(()) when they decompress past the budget.
fn hadoop_lz4(input: &[u8], budget: usize) -> Option<std::result::Result<Vec<u8>, ()>> {
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let head = rest.get(..8)?;
        let size = u32::from_be_bytes(head[..4].try_into().ok()?) as usize;
        let compressed = u32::from_be_bytes(head[4..].try_into().ok()?) as usize;
        let block = rest.get(8..8usize.checked_add(compressed)?)?;
        if out.len().saturating_add(size) > budget {
            return Some(Err(()));
        }
        let at = out.len();
        out.resize(at + size, 0);
        match lz4_flex::block::decompress_into(block, &mut out[at..]) {
            Ok(n) if n == size => {}
            _ => return None,
        }
        rest = &rest[8 + compressed..];
    }
    Some(Ok(out))
}

/// `count` levels of bit width `width` from an RLE / bit-packed hybrid run.
pub(crate) fn decode_levels(bytes: &[u8], width: u8, count: usize) -> Result<Vec<i16>> {
    let short = || ParquetError::EOF("the levels end early".to_string());
    let mut out = Vec::with_capacity(count);
    let mut at = 0;
    let value_bytes = (width as usize).div_ceil(8);
    while out.len() < count {
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let b = *bytes.get(at).ok_or_else(short)?;
            at += 1;
            if shift > 56 {
                return Err(ParquetError::General(
                    "a level run's header overflows".into(),
                ));
            }
            header |= ((b & 0x7f) as u64) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        if header & 1 == 1 {
            let groups = (header >> 1) as usize;
            let len = groups.checked_mul(width as usize).ok_or_else(short)?;
            let packed = bytes
                .get(at..at.checked_add(len).ok_or_else(short)?)
                .ok_or_else(short)?;
            at += len;
            for i in 0..groups * 8 {
                if out.len() == count {
                    break;
                }
                let mut v = 0i16;
                for b in 0..width as usize {
                    let bit = i * width as usize + b;
                    if packed[bit / 8] >> (bit % 8) & 1 == 1 {
                        v |= 1 << b;
                    }
                }
                out.push(v);
            }
        } else {
            let run = (header >> 1) as usize;
            let raw = bytes.get(at..at + value_bytes).ok_or_else(short)?;
            at += value_bytes;
            let mut v = 0i16;
            for (i, b) in raw.iter().enumerate().take(2) {
                v |= (*b as i16) << (8 * i);
            }
            let take = run.min(count - out.len());
            out.extend(std::iter::repeat_n(v, take));
        }
    }
    Ok(out)
}

/// The bit width of levels up to `max`.
fn level_width(max: i16) -> u8 {
    (16 - (max as u16).leading_zeros()) as u8
}

/// Levels under 256 as RLE runs (one byte a run's value).
fn encode_levels(levels: &[i16]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < levels.len() {
        let v = levels[i];
        let mut j = i;
        while j < levels.len() && levels[j] == v {
            j += 1;
        }
        let mut header = ((j - i) as u64) << 1;
        loop {
            let b = (header & 0x7f) as u8;
            header >>= 7;
            if header == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.push(v as u8);
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_round_trip_through_rle() {
        let levels: Vec<i16> = (0..1000).map(|i| ((i / 7) % 2) as i16).collect();
        assert_eq!(
            decode_levels(&encode_levels(&levels), 1, 1000).unwrap(),
            levels
        );
    }

    #[test]
    fn bit_packed_levels_decode() {
        // One group of 8 one-bit levels: 1,0,1,1,0,0,0,1 (least significant bit first).
        let bytes = [0b11, 0b1000_1101];
        assert_eq!(
            decode_levels(&bytes, 1, 8).unwrap(),
            vec![1, 0, 1, 1, 0, 0, 0, 1]
        );
        assert!(decode_levels(&bytes, 1, 9).is_err());
    }
}
