//! Packing measured documents into batches of `rows` rows of `seq_len` tokens, deterministically
//! and one unit at a time (the count pass and the loader run this on the same documents, so
//! both find the same batches).
//!
//! - A document that fits a row goes whole into the first row of the open batch with room for
//!   it (first fit), else into a new row. When the batch has no room left for it, the next
//!   `WINDOW` documents that fit its holes go there first (in file order), then it is closed.
//! - A longer document starts a new row and fills rows in turn, its text cut at a row's end,
//!   an image never: an image that does not fit the row's rest starts the next row.
//! - A batch holds at most `max_patches` image patches: a document (or, of a longer one, an
//!   image) that would pass it closes the batch, so the vision tower's memory is bounded.
//! - A unit's last batch is closed at its end, its rows padded.
//! - Every run knows the batches (of its unit, counted from 0) its whole document spans, so a
//!   reader can tell a document the epoch reads in part (`pipeline`'s cut rule).

use std::collections::VecDeque;
use std::sync::Arc;

use super::measure::{Item, Measured};

/// The batch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackShape {
    pub seq_len: usize,
    pub rows: usize,
    pub max_patches: u64,
}

/// A position in a document: its item, and a token offset within a text item (0 for images).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub item: usize,
    pub offset: usize,
}

/// One document's consecutive tokens in one row: [from, to).
#[derive(Clone, Debug)]
pub struct Run {
    pub doc: Arc<Measured>,
    pub from: Cursor,
    pub to: Cursor,
    /// The first and last batch of the unit (0 is its first) that hold a run of `doc`.
    pub doc_batches: (u64, u64),
}

impl Run {
    /// Each item of the run with its token range: (item, start, end).
    pub fn items(&self) -> impl Iterator<Item = (&Item, usize, usize)> + '_ {
        (self.from.item..=self.to.item.min(self.doc.items.len().saturating_sub(1))).filter_map(
            move |i| {
                let item = &self.doc.items[i];
                let start = if i == self.from.item {
                    self.from.offset
                } else {
                    0
                };
                let end = if i == self.to.item {
                    self.to.offset
                } else {
                    item.tokens()
                };
                (start < end).then_some((item, start, end))
            },
        )
    }

    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.items().map(|(_, a, b)| b - a).sum()
    }
}

/// One row: its runs and its tokens.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub runs: Vec<Run>,
    pub fill: usize,
}

/// A closed batch: up to `rows` rows (fewer: the rest is padding) and its patches.
#[derive(Clone, Debug, Default)]
pub struct PackedBatch {
    pub rows: Vec<Row>,
    pub patches: u64,
}

impl PackedBatch {
    /// Tokens of its documents (the rest of `rows x seq_len` is padding).
    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.rows.iter().map(|r| r.fill).sum()
    }
}

/// Documents held back, in file order, to fill a batch's holes before it is closed.
pub const WINDOW: usize = 32;

/// Packs one unit's documents.
pub struct Packer {
    shape: PackShape,
    open: PackedBatch,
    closed: VecDeque<PackedBatch>,
    pending: VecDeque<Arc<Measured>>,
    /// Batches of the unit closed so far: the open batch's index.
    closed_total: u64,
}

impl Packer {
    pub fn new(shape: PackShape) -> Self {
        Self {
            shape,
            open: PackedBatch::default(),
            closed: VecDeque::new(),
            pending: VecDeque::new(),
            closed_total: 0,
        }
    }

    /// The next closed batch, in order.
    pub fn pop(&mut self) -> Option<PackedBatch> {
        self.closed.pop_front()
    }

    /// Places the documents held back and closes the last batch, at the unit's end.
    pub fn finish(&mut self) {
        while !self.pending.is_empty() {
            self.place_front();
        }
        if self.open.rows.iter().any(|r| r.fill > 0) {
            self.close();
        }
    }

    fn close(&mut self) {
        self.closed.push_back(std::mem::take(&mut self.open));
        self.closed_total += 1;
    }

    /// A new row of the open batch (closing it first when it has no row left).
    fn fresh_row(&mut self) -> usize {
        if self.open.rows.len() == self.shape.rows {
            self.close();
        }
        self.open.rows.push(Row::default());
        self.open.rows.len() - 1
    }

    /// Adds one document. Its images each fit a row and the patch cap (`measure` and the
    /// spec's validation make sure).
    pub fn push(&mut self, doc: Arc<Measured>) {
        self.pending.push_back(doc);
        while self.pending.len() > WINDOW {
            self.place_front();
        }
    }

    /// Whether `doc` is cut across rows: longer than a row, or over the patch cap alone.
    fn long(&self, doc: &Measured) -> bool {
        doc.tokens > self.shape.seq_len || doc.patches > self.shape.max_patches
    }

    /// The row of the open batch a (not long) document goes into whole: the first with room,
    /// or a new one (`rows.len()`); None when the batch cannot take it.
    fn fits(&self, doc: &Measured) -> Option<usize> {
        if self.open.patches + doc.patches > self.shape.max_patches {
            return None;
        }
        let len = self.shape.seq_len;
        let rows = &self.open.rows;
        match rows.iter().position(|r| len - r.fill >= doc.tokens) {
            Some(row) => Some(row),
            None => (rows.len() < self.shape.rows).then_some(rows.len()),
        }
    }

    /// Puts `doc` whole into `row` of the open batch (a new row when `row == rows.len()`).
    fn put(&mut self, doc: Arc<Measured>, row: usize) {
        if row == self.open.rows.len() {
            self.open.rows.push(Row::default());
        }
        let end = Cursor {
            item: doc.items.len(),
            offset: 0,
        };
        self.open.patches += doc.patches;
        let row = &mut self.open.rows[row];
        row.fill += doc.tokens;
        let here = self.closed_total;
        row.runs.push(Run {
            doc,
            from: Cursor { item: 0, offset: 0 },
            to: end,
            doc_batches: (here, here),
        });
    }

    /// Places the first document held back.
    fn place_front(&mut self) {
        let Some(doc) = self.pending.pop_front() else {
            return;
        };
        if self.long(&doc) {
            return self.push_long(doc);
        }
        if let Some(row) = self.fits(&doc) {
            return self.put(doc, row);
        }
        // The open batch has no room for it: documents held back fill its holes first.
        let mut i = 0;
        while i < self.pending.len() {
            let candidate = &self.pending[i];
            match (!self.long(candidate))
                .then(|| self.fits(candidate))
                .flatten()
            {
                Some(row) => {
                    let held = self.pending.remove(i).expect("a held document");
                    self.put(held, row);
                }
                None => i += 1,
            }
        }
        self.close();
        let row = self.fits(&doc).unwrap_or(0);
        self.put(doc, row);
    }

    /// A document longer than a row (or over the patch cap): rows in turn from a new one.
    fn push_long(&mut self, doc: Arc<Measured>) {
        let (len, cap) = (self.shape.seq_len, self.shape.max_patches);
        let mut row = self.fresh_row();
        let first_batch = self.closed_total;
        let mut from = Cursor { item: 0, offset: 0 };
        // Ends the run in the current row at `here` and moves to a fresh row.
        let next_row = |packer: &mut Self, row: &mut usize, from: &mut Cursor, here: Cursor| {
            if here > *from {
                packer.open.rows[*row].runs.push(Run {
                    doc: doc.clone(),
                    from: *from,
                    to: here,
                    doc_batches: (first_batch, first_batch),
                });
            }
            *from = here;
            *row = packer.fresh_row();
        };
        for (i, item) in doc.items.iter().enumerate() {
            match item {
                Item::Text(ids) | Item::Context(ids) => {
                    let mut offset = 0;
                    while offset < ids.len() {
                        let room = len - self.open.rows[row].fill;
                        if room == 0 {
                            next_row(self, &mut row, &mut from, Cursor { item: i, offset });
                            continue;
                        }
                        let take = room.min(ids.len() - offset);
                        self.open.rows[row].fill += take;
                        offset += take;
                    }
                }
                Item::Image { tokens, .. } | Item::Video { tokens, .. } => {
                    let here = Cursor { item: i, offset: 0 };
                    if self.open.patches + item.patches() > cap {
                        if here > from {
                            self.open.rows[row].runs.push(Run {
                                doc: doc.clone(),
                                from,
                                to: here,
                                doc_batches: (first_batch, first_batch),
                            });
                        }
                        from = here;
                        self.close();
                        row = self.fresh_row();
                    } else if len - self.open.rows[row].fill < *tokens {
                        next_row(self, &mut row, &mut from, here);
                    }
                    self.open.rows[row].fill += tokens;
                    self.open.patches += item.patches();
                }
            }
        }
        let end = Cursor {
            item: doc.items.len(),
            offset: 0,
        };
        if end > from {
            self.open.rows[row].runs.push(Run {
                doc: doc.clone(),
                from,
                to: end,
                doc_batches: (first_batch, first_batch),
            });
        }
        self.mark_span(&doc, first_batch);
    }

    /// Gives every run of `doc` (placed from batch `first` to the open one) the document's span.
    /// Its batches are all still here: the caller pops closed batches only between documents.
    fn mark_span(&mut self, doc: &Arc<Measured>, first: u64) {
        let (total, held) = (self.closed_total, self.closed.len() as u64);
        let span = (first, total);
        let closed = self
            .closed
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| total - held + *i as u64 >= first)
            .map(|(_, b)| b);
        for batch in closed.chain(std::iter::once(&mut self.open)) {
            let runs = batch.rows.iter_mut().flat_map(|r| r.runs.iter_mut());
            for run in runs.filter(|r| Arc::ptr_eq(&r.doc, doc)) {
                run.doc_batches = span;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::qwen_vl::Grid;
    use super::*;

    fn doc(key: &str, items: &[(bool, usize)]) -> Arc<Measured> {
        // (image?, tokens): an image of `tokens` tokens has (tokens - 2) * 4 patches.
        let items: Vec<Item> = items
            .iter()
            .map(|&(image, n)| {
                if image {
                    Item::Image {
                        bytes: Vec::new(),
                        grid: Grid {
                            t: 1,
                            h: 2,
                            w: 2 * (n as u32 - 2),
                        },
                        tokens: n,
                    }
                } else {
                    Item::Text((0..n as u32).collect())
                }
            })
            .collect();
        Arc::new(Measured {
            key: key.into(),
            tokens: items.iter().map(Item::tokens).sum(),
            patches: items.iter().map(Item::patches).sum(),
            items,
        })
    }

    fn layout(batch: &PackedBatch) -> Vec<Vec<(String, usize)>> {
        batch
            .rows
            .iter()
            .map(|r| {
                r.runs
                    .iter()
                    .map(|run| (run.doc.key.clone(), run.tokens()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn documents_go_whole_into_the_first_row_with_room() {
        let shape = PackShape {
            seq_len: 10,
            rows: 2,
            max_patches: 1000,
        };
        let mut p = Packer::new(shape);
        for (k, n) in [("a", 6), ("b", 6), ("c", 4), ("d", 3), ("e", 9)] {
            p.push(doc(k, &[(false, n)]));
        }
        p.finish();
        let first = p.pop().unwrap();
        assert_eq!(
            layout(&first),
            vec![
                vec![("a".into(), 6), ("c".into(), 4)],
                vec![("b".into(), 6), ("d".into(), 3)]
            ]
        );
        assert_eq!(layout(&p.pop().unwrap()), vec![vec![("e".into(), 9)]]);
        assert!(p.pop().is_none());
    }

    #[test]
    fn documents_held_back_fill_a_batch_before_it_closes() {
        let shape = PackShape {
            seq_len: 10,
            rows: 1,
            max_patches: 1000,
        };
        let mut p = Packer::new(shape);
        for (k, n) in [("a", 6), ("b", 6), ("c", 4), ("d", 5)] {
            p.push(doc(k, &[(false, n)]));
        }
        p.finish();
        let batches: Vec<_> = std::iter::from_fn(|| p.pop()).map(|b| layout(&b)).collect();
        assert_eq!(
            batches,
            vec![
                vec![vec![("a".into(), 6), ("c".into(), 4)]],
                vec![vec![("b".into(), 6)]],
                vec![vec![("d".into(), 5)]],
            ]
        );
    }

    #[test]
    fn a_long_document_is_cut_between_tokens_never_inside_an_image() {
        let shape = PackShape {
            seq_len: 10,
            rows: 4,
            max_patches: 1000,
        };
        let mut p = Packer::new(shape);
        // 7 text, a 5-token image (does not fit the 3 left: next row), 12 text.
        let long = doc("long", &[(false, 7), (true, 5), (false, 12)]);
        p.push(long.clone());
        p.finish();
        let batch = p.pop().unwrap();
        assert_eq!(
            layout(&batch),
            vec![
                vec![("long".into(), 7)],
                vec![("long".into(), 10)],
                vec![("long".into(), 7)]
            ]
        );
        let runs: Vec<_> = batch
            .rows
            .iter()
            .map(|r| (r.runs[0].from, r.runs[0].to))
            .collect();
        let c = |item, offset| Cursor { item, offset };
        assert_eq!(
            runs,
            vec![(c(0, 0), c(1, 0)), (c(1, 0), c(2, 5)), (c(2, 5), c(3, 0))]
        );
        assert_eq!(batch.tokens(), long.tokens);
    }

    #[test]
    fn every_run_knows_the_batches_its_whole_document_spans() {
        let shape = PackShape {
            seq_len: 10,
            rows: 2,
            max_patches: 1000,
        };
        let mut p = Packer::new(shape);
        // "a" in batch 0; "long" (35 tokens) from batch 0's second row to batch 2; "b" in batch 2.
        for d in [
            doc("a", &[(false, 6)]),
            doc("long", &[(false, 35)]),
            doc("b", &[(false, 3)]),
        ] {
            p.push(d);
        }
        p.finish();
        let spans: Vec<Vec<(String, (u64, u64))>> = std::iter::from_fn(|| p.pop())
            .map(|b| {
                b.rows
                    .iter()
                    .flat_map(|r| r.runs.iter())
                    .map(|r| (r.doc.key.clone(), r.doc_batches))
                    .collect()
            })
            .collect();
        let s = |k: &str, a, b| (k.to_string(), (a, b));
        assert_eq!(
            spans,
            vec![
                vec![s("a", 0, 0), s("long", 0, 2)],
                vec![s("long", 0, 2), s("long", 0, 2)],
                vec![s("long", 0, 2), s("b", 2, 2)],
            ]
        );
    }

    #[test]
    fn the_patch_cap_closes_a_batch() {
        let shape = PackShape {
            seq_len: 100,
            rows: 4,
            max_patches: 39,
        };
        let mut p = Packer::new(shape);
        // 4-token images: 8 patches each.
        p.push(doc("a", &[(true, 4), (true, 4), (true, 4), (false, 2)]));
        p.push(doc("b", &[(true, 4), (true, 4), (false, 2)]));
        p.finish();
        let first = p.pop().unwrap();
        assert_eq!(
            (first.patches, layout(&first)),
            (24, vec![vec![("a".into(), 14)]])
        );
        assert_eq!(p.pop().unwrap().patches, 16);
        // A document over the cap alone is cut at an image into the next batch.
        let mut p = Packer::new(PackShape {
            max_patches: 16,
            ..shape
        });
        p.push(doc(
            "big",
            &[(false, 1), (true, 4), (true, 4), (true, 4), (false, 1)],
        ));
        p.finish();
        let (a, b) = (p.pop().unwrap(), p.pop().unwrap());
        assert_eq!((a.patches, b.patches), (16, 8));
        assert_eq!(a.tokens() + b.tokens(), 14);
        assert_eq!(layout(&b), vec![vec![("big".into(), 5)]]);
    }
}
