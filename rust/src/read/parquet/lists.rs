//! List columns of a Parquet file, row by row: what interleaved documents (OBELICS, OmniCorpus)
//! keep in `texts: list<string>` and `images: list<binary>` or `list<struct<bytes, path>>` (the
//! `datasets` Image feature in a list).
//!
//! A list's values come out as the bytes the file holds, one `Option` per element (a null
//! element is None) and one per row (a null list is None), as `values` gives a flat column's: a
//! consumer checks UTF-8 and alignment, so one bad document never costs its row group.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parquet::basic::Repetition;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::ByteArrayType;
use parquet::errors::{ParquetError, Result};
use parquet::schema::types::{SchemaDescriptor, Type};

use super::pages::PageTally;
use super::ParquetFile;

/// Rows decoded per call at most (bounds what one call allocates, as `values::STEP`).
const BATCH: usize = 256;

/// One row's list: None for a null list, else its elements (None: a null element).
pub type List = Option<Vec<Option<Vec<u8>>>>;

/// Where a list column's values are: its element leaf (a string or binary element, or an image
/// struct's `bytes`), and an image struct's `path` leaf (a URL when the bytes are null).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListColumn {
    pub values: usize,
    pub paths: Option<usize>,
}

impl ParquetFile {
    /// The list column `name`: Err says why it is not a list of strings, bytes or image structs
    /// (naming the file's columns when it is absent).
    pub fn list_column(&self, name: &str) -> std::result::Result<ListColumn, String> {
        let descr = self.meta.file_metadata().schema_descr();
        let Some(root) = descr
            .root_schema()
            .get_fields()
            .iter()
            .position(|f| f.name() == name)
        else {
            let names: Vec<&str> = descr
                .root_schema()
                .get_fields()
                .iter()
                .map(|f| f.name())
                .collect();
            return Err(format!(
                "no list column {name:?} (its columns: {})",
                names.join(", ")
            ));
        };
        let leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&l| descr.get_column_root_idx(l) == root)
            .collect();
        let repeated = |l: usize| descr.column(l).max_rep_level() == 1;
        let bytes = |l: usize| {
            descr.column(l).physical_type() == parquet::basic::Type::BYTE_ARRAY && repeated(l)
        };
        let last = |l: usize| {
            let path = descr.column(l).path().parts().to_vec();
            path.last().cloned().unwrap_or_default()
        };
        let not_a_list = || {
            format!(
                "the column {name:?} is not a list of strings, bytes or image structs (bytes, \
                 path)"
            )
        };
        match leaves.as_slice() {
            [one] if bytes(*one) => Ok(ListColumn {
                values: *one,
                paths: None,
            }),
            many => {
                let values = many
                    .iter()
                    .copied()
                    .find(|&l| bytes(l) && last(l) == "bytes")
                    .ok_or_else(not_a_list)?;
                let paths = many
                    .iter()
                    .copied()
                    .find(|&l| bytes(l) && last(l) == "path");
                Ok(ListColumn { values, paths })
            }
        }
    }
}

/// The definition levels of a list leaf: at or above `list` the row's list is present (maybe
/// empty), at or above `element` an element is (maybe null).
fn levels(descr: &SchemaDescriptor, leaf: usize) -> Result<(i16, i16)> {
    let parts = descr.column(leaf).path().parts().to_vec();
    let mut node: &Type = descr.root_schema();
    let mut def = 0i16;
    for part in &parts {
        node = node
            .get_fields()
            .iter()
            .find(|f| f.name() == part)
            .ok_or_else(|| ParquetError::General(format!("no schema node {part:?}")))?;
        let info = node.get_basic_info();
        match info.has_repetition().then(|| info.repetition()) {
            // The first repeated node is the list's: below it, an element exists.
            Some(Repetition::REPEATED) => return Ok((def, def + 1)),
            Some(Repetition::OPTIONAL) => def += 1,
            _ => {}
        }
    }
    Err(ParquetError::General(format!(
        "column {} is not repeated",
        descr.column(leaf).path()
    )))
}

/// Lists read by [`ListCursor::read`]: one a row, and the rows whose values passed the cap.
#[derive(Default)]
pub(crate) struct ListPiece {
    pub lists: Vec<List>,
    /// (index in `lists`, all its values' bytes) of each row whose values together are more
    /// than the cap: its values from the one that passed it on are handed on empty, so a row
    /// never costs more than the cap, and its whole size is still known.
    pub too_large: Vec<(usize, u64)>,
}

/// A list column of one row group (`list<string>`, `list<binary>`, a field of `list<struct>`),
/// read a piece of rows at a time, as `values::LeafCursor` reads a flat one: what it holds at
/// once is the page or two a call reads (bounded by `pages::BoundedPages`) and the piece's lists.
pub(crate) struct ListCursor {
    reader: ColumnReaderImpl<ByteArrayType>,
    list_def: i16,
    element_def: i16,
    max_def: i16,
    /// A row's values past this many bytes are handed on empty (see [`ListPiece::too_large`]).
    cap: u64,
    tally: Arc<PageTally>,
    /// Levels read so far.
    read: u64,
    defs: Vec<i16>,
    reps: Vec<i16>,
}

impl ListCursor {
    /// A cursor over leaf `leaf`'s `reader` (its pages counted in `tally`).
    pub(crate) fn new(
        reader: ColumnReader,
        schema: &SchemaDescriptor,
        leaf: usize,
        cap: u64,
        tally: Arc<PageTally>,
    ) -> Result<Self> {
        let (list_def, element_def) = levels(schema, leaf)?;
        let ColumnReader::ByteArrayColumnReader(reader) = reader else {
            return Err(ParquetError::General(format!(
                "column {} is not bytes",
                schema.column(leaf).path()
            )));
        };
        Ok(Self {
            reader,
            list_def,
            element_def,
            max_def: schema.column(leaf).max_def_level(),
            cap,
            tally,
            read: 0,
            defs: Vec::new(),
            reps: Vec::new(),
        })
    }

    /// Appends up to `rows` more lists to `piece`, stopping early once `max_bytes` of values
    /// are in it (after one row at least); returns the rows read (0: the column has ended).
    /// Each call asks for no more rows than levels are left in the pages handed out (a row has
    /// one level at least), so a call reads its current page and at most the rest of a row.
    pub(crate) fn read(
        &mut self,
        rows: usize,
        max_bytes: usize,
        piece: &mut ListPiece,
    ) -> Result<usize> {
        let (mut got, mut bytes) = (0, 0usize);
        let mut values = Vec::new();
        while got < rows && (got == 0 || bytes < max_bytes) {
            let pending = self
                .tally
                .levels
                .load(Ordering::Relaxed)
                .saturating_sub(self.read);
            let step = (pending as usize).clamp(1, BATCH).min(rows - got);
            self.defs.clear();
            self.reps.clear();
            values.clear();
            let (records, _, levels) = self.reader.read_records(
                step,
                Some(&mut self.defs),
                Some(&mut self.reps),
                &mut values,
            )?;
            if records == 0 {
                break;
            }
            // Values a streamed page skipped for size, by their level in the chunk.
            let end = self.read + levels as u64;
            let mut skipped: Vec<(u64, u64)> = Vec::new();
            self.tally.oversized.lock().expect("tally").retain(|&v| {
                let here = v.0 < end;
                if here && v.0 >= self.read {
                    skipped.push(v);
                }
                !here
            });
            let mut skipped = skipped.into_iter().peekable();
            let mut present = values.iter();
            let mut row_bytes = 0u64;
            for (i, (&d, &r)) in self.defs.iter().zip(&self.reps).enumerate() {
                if r == 0 {
                    self.close_row(row_bytes, piece);
                    piece.lists.push((d >= self.list_def).then(Vec::new));
                    row_bytes = 0;
                }
                if d < self.element_def {
                    continue;
                }
                let element = if d == self.max_def {
                    let value = present.next().map_or(&[][..], |v| v.data());
                    let level = self.read + i as u64;
                    let len = match skipped.next_if(|&(at, _)| at == level) {
                        Some((_, len)) => len,
                        None => value.len() as u64,
                    };
                    row_bytes += len;
                    if row_bytes > self.cap || len as usize != value.len() {
                        Some(Vec::new())
                    } else {
                        bytes += value.len();
                        Some(value.to_vec())
                    }
                } else {
                    None
                };
                if let Some(Some(list)) = piece.lists.last_mut() {
                    list.push(element);
                }
            }
            self.close_row(row_bytes, piece);
            self.read = end;
            got += records;
        }
        Ok(got)
    }

    /// Notes the last row of `piece` as too large when its `row_bytes` are over the cap.
    fn close_row(&self, row_bytes: u64, piece: &mut ListPiece) {
        let row = piece.lists.len().wrapping_sub(1);
        if row_bytes > self.cap && piece.too_large.last().is_none_or(|&(r, _)| r != row) {
            piece.too_large.push((row, row_bytes));
        }
    }
}

impl ParquetFile {
    /// The leaves of fields `fields` of the `list<struct<...>>` column `name` (a conversation's
    /// turns), in that order: Err says which is missing, or that `name` is not such a list.
    pub fn list_fields(
        &self,
        name: &str,
        fields: &[&str],
    ) -> std::result::Result<Vec<usize>, String> {
        let descr = self.meta.file_metadata().schema_descr();
        let root = descr
            .root_schema()
            .get_fields()
            .iter()
            .position(|f| f.name() == name)
            .ok_or_else(|| format!("no column {name:?}"))?;
        fields
            .iter()
            .map(|field| {
                (0..descr.num_columns())
                    .find(|&l| {
                        let c = descr.column(l);
                        descr.get_column_root_idx(l) == root
                            && c.max_rep_level() == 1
                            && c.physical_type() == parquet::basic::Type::BYTE_ARRAY
                            && c.path().parts().last().map(String::as_str) == Some(*field)
                    })
                    .ok_or_else(|| {
                        format!(
                            "the column {name:?} is not a list of structs with a string {field:?}"
                        )
                    })
            })
            .collect()
    }
}
