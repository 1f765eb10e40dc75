//! List columns of a Parquet file, row by row: what interleaved documents (OBELICS, OmniCorpus)
//! keep in `texts: list<string>` and `images: list<binary>` or `list<struct<bytes, path>>` (the
//! `datasets` Image feature in a list).
//!
//! A list's values come out as the bytes the file holds, one `Option` per element (a null
//! element is None) and one per row (a null list is None), as `values` gives a flat column's: a
//! consumer checks UTF-8 and alignment, so one bad document never costs its row group.

use parquet::basic::Repetition;
use parquet::column::reader::ColumnReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::RowGroupReader;
use parquet::schema::types::{SchemaDescriptor, Type};

use super::ParquetFile;

/// Rows decoded per call (bounds what one call allocates, as `values::BATCH`).
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

/// Row group `reader`'s lists of leaf `leaf`, one per row; `rows` is the footer's count (a
/// column with more rows is an error; fewer are returned for the caller to report).
pub fn read_lists(reader: &dyn RowGroupReader, leaf: usize, rows: usize) -> Result<Vec<List>> {
    let descr = reader.metadata().schema_descr();
    let (list_def, element_def) = levels(descr, leaf)?;
    let max_def = descr.column(leaf).max_def_level();
    let ColumnReader::ByteArrayColumnReader(mut column) = reader.get_column_reader(leaf)? else {
        return Err(ParquetError::General(format!(
            "column {} is not bytes",
            descr.column(leaf).path()
        )));
    };
    let mut out: Vec<List> = Vec::with_capacity(rows.min(BATCH));
    let (mut defs, mut reps, mut values) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        defs.clear();
        reps.clear();
        values.clear();
        let (records, _, _) =
            column.read_records(BATCH, Some(&mut defs), Some(&mut reps), &mut values)?;
        if records == 0 {
            return Ok(out);
        }
        let mut present = values.iter();
        for (&d, &r) in defs.iter().zip(&reps) {
            if r == 0 {
                out.push((d >= list_def).then(Vec::new));
            }
            if d >= element_def {
                let element = if d == max_def {
                    present.next().map(|v| v.data().to_vec())
                } else {
                    None
                };
                if let Some(Some(list)) = out.last_mut() {
                    list.push(element);
                }
            }
        }
        if out.len() > rows {
            return Err(ParquetError::General(format!(
                "a column holds more rows than the footer's {rows}"
            )));
        }
    }
}
