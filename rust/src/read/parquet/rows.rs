//! A row group's columns, flat or lists, read a piece of rows at a time (a shard's samples, the
//! interleaved kind's documents and conversations): what a reader holds at once is a page or two
//! a column (`pages::BoundedPages`) and one piece's values, never the row group.

use std::sync::Arc;

use super::lists::{ListCursor, ListPiece};
use super::pages::PageTally;
use super::values::{LeafCursor, Piece};
use super::{fault, ParquetFile};
use crate::error::{capped_detail, Reason, SourceKind};
use crate::read::group::ShardFault;

/// A column to read: its name (for errors), its leaf, and whether it is a list.
#[derive(Clone, Debug)]
pub(crate) struct Wanted {
    pub name: String,
    pub leaf: usize,
    pub list: bool,
}

/// One column's values of a piece.
pub(crate) enum ColumnPiece {
    Flat(Piece),
    Lists(ListPiece),
}

enum Cursor {
    Flat(LeafCursor),
    List(ListCursor),
}

/// A row group open for reading in pieces.
pub(crate) struct GroupPieces {
    wanted: Vec<Wanted>,
    cursors: Vec<Cursor>,
    tallies: Vec<Arc<PageTally>>,
    group: usize,
    /// The group's first row in the file, its rows (the footer's) and the rows read.
    first_row: u64,
    rows: u64,
    read: u64,
}

impl ParquetFile {
    /// Opens row group `group` (its first row `first_row`) over the columns `wanted`: fetches
    /// their chunks (refused when larger than `rows` values of `cap` take, `fetch_chunks`) and
    /// makes a cursor over each, its pages bounded by `cap`.
    pub(crate) fn group_pieces(
        &self,
        group: usize,
        wanted: &[Wanted],
        cap: u64,
        first_row: u64,
    ) -> Result<GroupPieces, ShardFault> {
        let leaves: Vec<usize> = wanted.iter().map(|w| w.leaf).collect();
        self.fetch_chunks(group, &leaves, cap, first_row)?;
        let schema = self.meta.file_metadata().schema_descr();
        let mut cursors = Vec::with_capacity(wanted.len());
        let mut tallies = Vec::with_capacity(wanted.len());
        for w in wanted {
            let cursor = self
                .bounded_column(group, w.leaf, cap)
                .and_then(|(reader, tally)| {
                    tallies.push(tally.clone());
                    if w.list {
                        ListCursor::new(reader, schema, w.leaf, cap, tally).map(Cursor::List)
                    } else {
                        let descr = schema.column(w.leaf);
                        LeafCursor::new(reader, &descr, cap, tally).map(Cursor::Flat)
                    }
                })
                .map_err(|e| column_fault(self, (group, first_row), &w.name, &tallies, e))?;
            cursors.push(cursor);
        }
        Ok(GroupPieces {
            wanted: wanted.to_vec(),
            cursors,
            tallies,
            group,
            first_row,
            rows: self.meta.row_group(group).num_rows().max(0) as u64,
            read: 0,
        })
    }
}

impl GroupPieces {
    /// The next piece: the file row of its first row, its rows, and one [`ColumnPiece`] a wanted column
    /// of up to `rows` rows, fewer once `max_bytes` of values (all columns together) are in it
    /// (one row at least); None once the footer's rows are read (a column holding more is
    /// corrupt). The rows are read a step at a time, each step sized by the bytes a row has
    /// taken so far, so that a piece of large rows stops near `max_bytes`.
    pub(crate) fn next_piece(
        &mut self,
        file: &ParquetFile,
        rows: usize,
        max_bytes: usize,
    ) -> Result<Option<(u64, usize, Vec<ColumnPiece>)>, ShardFault> {
        if self.read >= self.rows {
            for i in 0..self.cursors.len() {
                let mut extra = self.empty(i);
                if self.read_column(file, i, 1, &mut extra)? > 0 {
                    return Err(file.corrupt(format!(
                        "row group {}: column {:?}: a column holds more values than the \
                         footer's {} rows",
                        self.group, self.wanted[i].name, self.rows
                    )));
                }
            }
            return Ok(None);
        }
        let want = (self.rows - self.read).min(rows.max(1) as u64) as usize;
        let mut pieces: Vec<ColumnPiece> = (0..self.cursors.len()).map(|i| self.empty(i)).collect();
        let (mut n, mut bytes) = (0usize, 0usize);
        while n < want && (n == 0 || bytes < max_bytes) {
            let step = match n {
                0 => 1,
                _ => ((max_bytes - bytes) / (bytes / n).max(1)).clamp(1, want - n),
            };
            for (i, piece) in pieces.iter_mut().enumerate() {
                let before = piece.bytes();
                let got = self.read_column(file, i, step, piece)?;
                if got != step {
                    return Err(file.corrupt(format!(
                        "row group {} holds {} rows in column {:?}, its footer says {}",
                        self.group,
                        self.read + (n + got) as u64,
                        self.wanted[i].name,
                        self.rows
                    )));
                }
                bytes += piece.bytes() - before;
            }
            n += step;
        }
        let first = self.first_row + self.read;
        self.read += n as u64;
        Ok(Some((first, n, pieces)))
    }

    fn empty(&self, i: usize) -> ColumnPiece {
        match self.cursors[i] {
            Cursor::Flat(_) => ColumnPiece::Flat(Piece::default()),
            Cursor::List(_) => ColumnPiece::Lists(ListPiece::default()),
        }
    }

    /// Appends up to `rows` rows of column `i` to `piece`; the rows read.
    fn read_column(
        &mut self,
        file: &ParquetFile,
        i: usize,
        rows: usize,
        piece: &mut ColumnPiece,
    ) -> Result<usize, ShardFault> {
        // The parquet crate's decoders panic on some malformed pages (a DELTA_LENGTH_BYTE_ARRAY
        // page with a negative length slices past its buffer, found by fuzzing): a hostile file
        // is a corrupt one, never a crash. Nothing the closure touches is used after a panic
        // but the error, and the cursor is not read again (the row group ends with it).
        let decode = std::panic::AssertUnwindSafe(|| match (&mut self.cursors[i], piece) {
            (Cursor::Flat(c), ColumnPiece::Flat(p)) => c.read(rows, usize::MAX, p),
            (Cursor::List(c), ColumnPiece::Lists(p)) => c.read(rows, usize::MAX, p),
            _ => unreachable!("a piece of the cursor's kind"),
        });
        let read = std::panic::catch_unwind(decode).unwrap_or_else(|panic| {
            Err(parquet::errors::ParquetError::General(format!(
                "its pages cannot be decoded ({})",
                crate::error::panic_message(panic.as_ref())
            )))
        });
        read.map_err(|e| {
            column_fault(
                file,
                (self.group, self.first_row),
                &self.wanted[i].name,
                &self.tallies,
                e,
            )
        })
    }
}

impl ColumnPiece {
    /// The bytes of its values (those over the cap are held empty).
    fn bytes(&self) -> usize {
        match self {
            ColumnPiece::Flat(p) => p.values.iter().flatten().map(Vec::len).sum(),
            ColumnPiece::Lists(p) => p
                .lists
                .iter()
                .flatten()
                .flatten()
                .flatten()
                .map(Vec::len)
                .sum(),
        }
    }
}

/// A column's read error in row group `group` (its first row `first_row`) as a fault: too
/// large when its pages could not be read within their bound, else corrupt.
pub(super) fn column_fault(
    file: &ParquetFile,
    (group, first_row): (usize, u64),
    name: &str,
    tallies: &[Arc<PageTally>],
    e: parquet::errors::ParquetError,
) -> ShardFault {
    let large = tallies
        .iter()
        .find_map(|t| t.too_large.lock().expect("tally").clone());
    let detail = format!("row group {group}: column {name:?}: {e}");
    match large {
        Some(_) => ShardFault {
            reason: Reason::MemberTooLarge,
            kind: SourceKind::Other,
            detail: format!("{}: {}", file.display, capped_detail(detail)),
            offset: first_row,
        },
        None => fault(&file.file, &file.display, detail),
    }
}
