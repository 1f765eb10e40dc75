//! One row group's values of one column, read with the parquet crate's typed column readers: a
//! string column's values come out as the bytes the file holds.
//!
//! The crate's row API (`parquet::record`) converts a UTF-8 column's values to `String` and fails
//! the whole row group at the first invalid one: every good sample or document in it was lost
//! with it, and its error carried the value's bytes as a list of numbers. Here no value is
//! converted: whoever uses a member checks its UTF-8 (`batch::sample::caption`,
//! `batch::packed::documents`) and skips that one sample or document as `bad_utf8`.

use parquet::basic::ConvertedType;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::RowGroupReader;

/// Values decoded per call: what one call allocates is bounded by this, not by a page header's
/// claims (the row API's batch of 1024 did the same).
const BATCH: usize = 1024;

/// The values of leaf column `leaf` in this row group, one per row (None: null), as bytes: a
/// byte array as it is, a number as its decimal text (a key column). `rows` is the footer's row
/// count: a column with more values is an error, one with fewer is returned short for the
/// caller to report.
pub(crate) fn read_leaf(
    reader: &dyn RowGroupReader,
    leaf: usize,
    rows: usize,
) -> Result<Vec<Option<Vec<u8>>>> {
    let descr = reader.metadata().column(leaf).column_descr_ptr();
    if descr.max_rep_level() > 0 {
        // `schema::kind_of` makes a repeated column `Other`, which is never read.
        return Err(ParquetError::General(format!(
            "column {} is repeated",
            descr.path()
        )));
    }
    let max_def = descr.max_def_level();
    let unsigned = matches!(
        descr.converted_type(),
        ConvertedType::UINT_8
            | ConvertedType::UINT_16
            | ConvertedType::UINT_32
            | ConvertedType::UINT_64
    );
    let mut out = Vec::with_capacity(rows.min(BATCH));
    match reader.get_column_reader(leaf)? {
        ColumnReader::ByteArrayColumnReader(r) => {
            read_values(r, max_def, rows, &mut out, |v| v.data().to_vec())?
        }
        ColumnReader::FixedLenByteArrayColumnReader(r) => {
            read_values(r, max_def, rows, &mut out, |v| v.data().to_vec())?
        }
        ColumnReader::Int32ColumnReader(r) => read_values(r, max_def, rows, &mut out, |v| {
            if unsigned {
                (*v as u32).to_string()
            } else {
                v.to_string()
            }
            .into_bytes()
        })?,
        ColumnReader::Int64ColumnReader(r) => read_values(r, max_def, rows, &mut out, |v| {
            if unsigned {
                (*v as u64).to_string()
            } else {
                v.to_string()
            }
            .into_bytes()
        })?,
        _ => {
            return Err(ParquetError::General(format!(
                "column {} is neither bytes nor an integer",
                descr.path()
            )))
        }
    }
    Ok(out)
}

/// Appends the column's values to `out`, a null (a definition level under `max_def`) as None.
fn read_values<T: DataType>(
    mut reader: ColumnReaderImpl<T>,
    max_def: i16,
    rows: usize,
    out: &mut Vec<Option<Vec<u8>>>,
    bytes: impl Fn(&T::T) -> Vec<u8>,
) -> Result<()> {
    let mut defs = Vec::new();
    let mut values = Vec::new();
    loop {
        defs.clear();
        values.clear();
        let (records, _, _) = reader.read_records(BATCH, Some(&mut defs), None, &mut values)?;
        if records == 0 {
            return Ok(());
        }
        if max_def == 0 {
            out.extend(values.iter().map(|v| Some(bytes(v))));
        } else {
            let mut present = values.iter();
            for &d in &defs {
                out.push(if d == max_def {
                    present.next().map(&bytes)
                } else {
                    None
                });
            }
        }
        // Checked per batch: a few bytes of dictionary indices can claim billions of values.
        if out.len() > rows {
            return Err(ParquetError::General(format!(
                "a column holds more values than the footer's {rows} rows"
            )));
        }
    }
}
