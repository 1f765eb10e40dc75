//! One row group's values of one column, read with the parquet crate's typed column readers: a
//! string column's values come out as the bytes the file holds.
//!
//! The crate's row API (`parquet::record`) converts a UTF-8 column's values to `String` and fails
//! the whole row group at the first invalid one: every good sample or document in it was lost
//! with it, and its error carried the value's bytes as a list of numbers. Here no value is
//! converted: whoever uses a member checks its UTF-8 (`batch::kit::sample::caption`,
//! `batch::text::documents`) and skips that one sample or document as `bad_utf8`.

use parquet::basic::ConvertedType;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::{ByteArrayType, DataType, FixedLenByteArrayType, Int32Type, Int64Type};
use parquet::errors::{ParquetError, Result};
use parquet::schema::types::ColumnDescriptor;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::pages::PageTally;

/// A flat column of one row group, read a piece at a time: what it holds at once is one page
/// (bounded by `pages::BoundedPages`) and the values of the piece asked for, never the row group.
pub(crate) struct LeafCursor {
    reader: Typed,
    max_def: i16,
    /// A value longer than this is handed on empty and reported in the piece's `too_large`.
    cap: u64,
    tally: Arc<PageTally>,
    /// Levels read so far (one a row: the column is flat).
    read: u64,
    defs: Vec<i16>,
}

enum Typed {
    Bytes(ColumnReaderImpl<ByteArrayType>),
    Fixed(ColumnReaderImpl<FixedLenByteArrayType>),
    Int32(ColumnReaderImpl<Int32Type>, bool),
    Int64(ColumnReaderImpl<Int64Type>, bool),
}

/// Values read by [`LeafCursor::read`]: one per row (None: null), and the rows whose value was
/// over the cap (index in `values`, its length), handed on empty.
#[derive(Default)]
pub(crate) struct Piece {
    pub values: Vec<Option<Vec<u8>>>,
    pub too_large: Vec<(usize, u64)>,
}

/// Values asked of the column reader per call at most.
const STEP: usize = 1024;

impl LeafCursor {
    /// A cursor over `reader` (its pages counted in `tally`).
    pub(crate) fn new(
        reader: ColumnReader,
        descr: &ColumnDescriptor,
        cap: u64,
        tally: Arc<PageTally>,
    ) -> Result<Self> {
        if descr.max_rep_level() > 0 {
            return Err(ParquetError::General(format!(
                "column {} is repeated",
                descr.path()
            )));
        }
        let unsigned = matches!(
            descr.converted_type(),
            ConvertedType::UINT_8
                | ConvertedType::UINT_16
                | ConvertedType::UINT_32
                | ConvertedType::UINT_64
        );
        let reader = match reader {
            ColumnReader::ByteArrayColumnReader(r) => Typed::Bytes(r),
            ColumnReader::FixedLenByteArrayColumnReader(r) => Typed::Fixed(r),
            ColumnReader::Int32ColumnReader(r) => Typed::Int32(r, unsigned),
            ColumnReader::Int64ColumnReader(r) => Typed::Int64(r, unsigned),
            _ => {
                return Err(ParquetError::General(format!(
                    "column {} is neither bytes nor an integer",
                    descr.path()
                )))
            }
        };
        Ok(Self {
            reader,
            max_def: descr.max_def_level(),
            cap,
            tally,
            read: 0,
            defs: Vec::new(),
        })
    }

    /// Appends up to `rows` more values to `piece`, stopping early once `max_bytes` of values
    /// are in it (after one value at least); returns the rows read (0: the column has ended).
    /// Each call to the column reader asks for no more levels than its current page holds, so
    /// it never holds two pages' values at once.
    pub(crate) fn read(
        &mut self,
        rows: usize,
        max_bytes: usize,
        piece: &mut Piece,
    ) -> Result<usize> {
        let mut got = 0;
        let mut bytes = 0usize;
        while got < rows && (got == 0 || bytes < max_bytes) {
            let pending = self
                .tally
                .levels
                .load(Ordering::Relaxed)
                .saturating_sub(self.read);
            let step = (pending as usize).clamp(1, STEP).min(rows - got);
            let at = piece.values.len();
            let n = match &mut self.reader {
                Typed::Bytes(r) => step_values(
                    r,
                    self.max_def,
                    step,
                    &mut self.defs,
                    piece,
                    self.cap,
                    |v| v.data(),
                )?,
                Typed::Fixed(r) => step_values(
                    r,
                    self.max_def,
                    step,
                    &mut self.defs,
                    piece,
                    self.cap,
                    |v| v.data(),
                )?,
                Typed::Int32(r, unsigned) => {
                    let unsigned = *unsigned;
                    step_numbers(r, self.max_def, step, &mut self.defs, piece, |v| {
                        if unsigned {
                            (*v as u32).to_string()
                        } else {
                            v.to_string()
                        }
                    })?
                }
                Typed::Int64(r, unsigned) => {
                    let unsigned = *unsigned;
                    step_numbers(r, self.max_def, step, &mut self.defs, piece, |v| {
                        if unsigned {
                            (*v as u64).to_string()
                        } else {
                            v.to_string()
                        }
                    })?
                }
            };
            if n == 0 {
                break;
            }
            // Values a streamed page skipped for size, by their level in the chunk.
            let end = self.read + n as u64;
            let mut skipped = self.tally.oversized.lock().expect("tally");
            skipped.retain(|&(level, len)| {
                if level < end {
                    if level >= self.read {
                        piece
                            .too_large
                            .push((at + (level - self.read) as usize, len));
                    }
                    false
                } else {
                    true
                }
            });
            drop(skipped);
            bytes += piece.values[at..]
                .iter()
                .map(|v| v.as_ref().map_or(0, Vec::len))
                .sum::<usize>();
            self.read = end;
            got += n;
        }
        Ok(got)
    }
}

/// One call's values of a byte column into `piece`: a value over `cap` is not copied.
fn step_values<T: DataType>(
    reader: &mut ColumnReaderImpl<T>,
    max_def: i16,
    step: usize,
    defs: &mut Vec<i16>,
    piece: &mut Piece,
    cap: u64,
    data: impl Fn(&T::T) -> &[u8],
) -> Result<usize> {
    step_column(reader, max_def, step, defs, piece, |v, piece| {
        let bytes = data(v);
        if bytes.len() as u64 > cap {
            piece
                .too_large
                .push((piece.values.len(), bytes.len() as u64));
            piece.values.push(Some(Vec::new()));
        } else {
            piece.values.push(Some(bytes.to_vec()));
        }
    })
}

/// One call's values of a number column into `piece`, as decimal text.
fn step_numbers<T: DataType>(
    reader: &mut ColumnReaderImpl<T>,
    max_def: i16,
    step: usize,
    defs: &mut Vec<i16>,
    piece: &mut Piece,
    text: impl Fn(&T::T) -> String,
) -> Result<usize> {
    step_column(reader, max_def, step, defs, piece, |v, piece| {
        piece.values.push(Some(text(v).into_bytes()))
    })
}

/// One call of up to `step` records of a flat column: `push` adds each present value to
/// `piece`, a null (a definition level below `max_def`) is added as None.
fn step_column<T: DataType>(
    reader: &mut ColumnReaderImpl<T>,
    max_def: i16,
    step: usize,
    defs: &mut Vec<i16>,
    piece: &mut Piece,
    push: impl Fn(&T::T, &mut Piece),
) -> Result<usize> {
    let mut values = Vec::new();
    defs.clear();
    let (records, _, _) = reader.read_records(step, Some(defs), None, &mut values)?;
    if max_def == 0 {
        for v in &values {
            push(v, piece);
        }
    } else {
        let mut present = values.iter();
        for &d in defs.iter() {
            match (d == max_def).then(|| present.next()).flatten() {
                Some(v) => push(v, piece),
                None => piece.values.push(None),
            }
        }
    }
    Ok(records)
}
