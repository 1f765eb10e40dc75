//! The positions of a document's run in its row, as the model computes them for that run alone:
//! the model cannot tell a packed row from its documents fed one at a time.
//!
//! Four rows, laid out `[4, rows, seq_len]` after the ids and labels (transformers 5.x Qwen2-VL
//! takes exactly this as `position_ids` of a packed batch):
//!
//! - `text`: 0, 1, 2, ... over each run and over each row's padding. transformers finds each
//!   packed sequence where this row does not step by 1, and masks attention to it (every
//!   attention implementation: a block mask for sdpa and eager, varlen for FlashAttention).
//! - `t`, `h`, `w`: M-RoPE, `Qwen2VLModel.get_rope_index` on the run alone (transformers 5.24):
//!   a counter from 0; a text token (`<|vision_start|>` and `<|vision_end|>` included: only the
//!   pads are image tokens) takes the counter on all three rows and adds 1; an image's pads, in
//!   merge-block raster order, take `counter + (frame, block row, block column)` and the counter
//!   then adds `max(grid_h, grid_w) / merge_size`. A video's pads likewise over its temporal
//!   patches, the temporal position of patch `k` being `k` (Qwen2-VL) or, under Qwen2.5-VL's
//!   rule, `trunc(k * tokens_per_second * second_per_grid_t)` in float32 (the video's
//!   `t_positions`, fixed when it is measured).
//!
//! Under NaFlex the image runs are 1-D: every row is the `text` row. Padding is 0, 1, 2, ... on
//! every row: its own sequence, so no document attends to it (its labels are masked).

use super::measure::Item;
use super::pack::Run;
use super::qwen_vl::{Grid, Rope};

/// The four position rows of one batch (each `rows * seq_len`, row-major).
pub struct PositionRows<'a> {
    pub text: &'a mut [i64],
    pub t: &'a mut [i64],
    pub h: &'a mut [i64],
    pub w: &'a mut [i64],
}

impl PositionRows<'_> {
    /// `n` tokens at `at` numbered `from, from + 1, ...` on all four rows (padding; a run of
    /// 1-D positions).
    fn count(&mut self, at: usize, n: usize, from: i64) {
        for (k, i) in (at..at + n).enumerate() {
            let p = from + k as i64;
            self.text[i] = p;
            self.t[i] = p;
            self.h[i] = p;
            self.w[i] = p;
        }
    }

    /// Each row's padding (from `at` to the row's end) as its own sequence.
    pub fn padding(&mut self, at: usize, end: usize) {
        self.count(at, end - at, 0);
    }
}

/// Writes the positions of `run`, whose first token is at `start`; `kept(i)` tells whether its
/// `i`-th image (counting the run's images) is in the batch: a dropped image's tokens are
/// padding ids, which the model reads as text. Returns the index after the run.
pub fn write_run(
    rows: &mut PositionRows<'_>,
    run: &Run,
    start: usize,
    rope: Rope,
    mut kept: impl FnMut() -> bool,
) -> usize {
    let mut at = start;
    // The M-RoPE counter of the run (get_rope_index's `current_pos`).
    let mut next = 0i64;
    let text = |rows: &mut PositionRows<'_>, at: &mut usize, next: &mut i64, n: usize| {
        for i in *at..*at + n {
            rows.text[i] = (i - start) as i64;
            rows.t[i] = *next;
            rows.h[i] = *next;
            rows.w[i] = *next;
            *next += 1;
        }
        *at += n;
    };
    for (item, a, b) in run.items() {
        match (item, rope) {
            (Item::Image { grid, tokens, .. }, Rope::MRope { merge }) if kept() => {
                // <|vision_start|>, the pads on the grid, <|vision_end|>.
                text(rows, &mut at, &mut next, 1);
                at = image(rows, at, start, next, *grid, merge, &[0]);
                next += (grid.h.max(grid.w) / merge) as i64;
                debug_assert_eq!(
                    *tokens,
                    (grid.patches() / (merge as u64).pow(2)) as usize + 2
                );
                text(rows, &mut at, &mut next, 1);
            }
            (
                Item::Video {
                    grid, t_positions, ..
                },
                Rope::MRope { merge },
            ) if kept() => {
                // As an image's, over its temporal patches (the counter then adds the spatial
                // side alone, as `get_rope_index` does).
                text(rows, &mut at, &mut next, 1);
                at = image(rows, at, start, next, *grid, merge, t_positions);
                next += (grid.h.max(grid.w) / merge) as i64;
                text(rows, &mut at, &mut next, 1);
            }
            (Item::Image { .. } | Item::Video { .. }, Rope::MRope { .. }) => {
                text(rows, &mut at, &mut next, b - a)
            }
            (Item::Image { .. } | Item::Video { .. }, Rope::Flat) => {
                kept();
                text(rows, &mut at, &mut next, b - a);
            }
            (Item::Text(_) | Item::Context(_), _) => text(rows, &mut at, &mut next, b - a),
        }
    }
    at
}

/// An image's or a video's pads from `at`: `get_vision_position_ids(next, grid, 1, merge,
/// time_interval)`, temporal patch `k` at `next + t_positions[k]`.
fn image(
    rows: &mut PositionRows<'_>,
    mut at: usize,
    start: usize,
    next: i64,
    grid: Grid,
    merge: u32,
    t_positions: &[u32],
) -> usize {
    let (gh, gw) = (grid.h / merge, grid.w / merge);
    debug_assert_eq!(t_positions.len(), grid.t as usize);
    for &t in t_positions {
        for y in 0..gh as i64 {
            for x in 0..gw as i64 {
                rows.text[at] = (at - start) as i64;
                rows.t[at] = next + t as i64;
                rows.h[at] = next + y;
                rows.w[at] = next + x;
                at += 1;
            }
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::measure::Measured;
    use super::super::pack::Cursor;
    use super::*;

    fn rows(n: usize) -> [Vec<i64>; 4] {
        [vec![-1; n], vec![-1; n], vec![-1; n], vec![-1; n]]
    }

    fn doc(items: Vec<Item>) -> Arc<Measured> {
        Arc::new(Measured {
            key: "d".into(),
            tokens: items.iter().map(Item::tokens).sum(),
            patches: items.iter().map(Item::patches).sum(),
            items,
        })
    }

    fn write(run: &Run, start: usize, n: usize, rope: Rope, kept: bool) -> [Vec<i64>; 4] {
        let [mut a, mut b, mut c, mut d] = rows(n);
        let mut r = PositionRows {
            text: &mut a,
            t: &mut b,
            h: &mut c,
            w: &mut d,
        };
        let end = write_run(&mut r, run, start, rope, || kept);
        assert_eq!(end, n);
        [a, b, c, d]
    }

    #[test]
    fn an_image_takes_its_grid_from_the_documents_counter() {
        // 2 text tokens, an image of 4 x 6 patches (2 x 3 merge blocks: 6 pads), 1 text token.
        let grid = Grid { t: 1, h: 4, w: 6 };
        let d = doc(vec![
            Item::Text(vec![5, 6]),
            Item::Image {
                bytes: Vec::new(),
                grid,
                tokens: 8,
            },
            Item::Text(vec![7]),
        ]);
        let run = Run {
            doc: d,
            from: Cursor { item: 0, offset: 0 },
            to: Cursor { item: 3, offset: 0 },
            doc_batches: (0, 0),
        };
        let [text, t, h, w] = write(&run, 0, 11, Rope::MRope { merge: 2 }, true);
        assert_eq!(text, (0..11).collect::<Vec<i64>>());
        // text 0 1, start 2, pads at 3 + (0, y, x), counter 3 + max(2, 3) = 6: end 6, text 7.
        assert_eq!(t, vec![0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7]);
        assert_eq!(h, vec![0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7]);
        assert_eq!(w, vec![0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]);
        // A dropped image reads as text; under NaFlex every row is 1-D.
        let [_, t, ..] = write(&run, 0, 11, Rope::MRope { merge: 2 }, false);
        assert_eq!(t, (0..11).collect::<Vec<i64>>());
        let [_, _, h, _] = write(&run, 0, 11, Rope::Flat, true);
        assert_eq!(h, (0..11).collect::<Vec<i64>>());
    }

    #[test]
    fn a_run_continued_from_the_previous_row_starts_afresh() {
        let d = doc(vec![Item::Text((0..10).collect())]);
        let run = Run {
            doc: d,
            from: Cursor { item: 0, offset: 7 },
            to: Cursor { item: 1, offset: 0 },
            doc_batches: (0, 0),
        };
        let [text, t, ..] = write(&run, 2, 5, Rope::MRope { merge: 2 }, true);
        assert_eq!(&text[2..], &[0, 1, 2]);
        assert_eq!(&t[2..], &[0, 1, 2]);
    }

    /// The cost of the positions per token slot, on a batch of 8 rows of 4,096 tokens of
    /// documents with two images each (a timing, not a check: `cargo test --release --lib
    /// positions::tests::cost -- --ignored --nocapture`). 1.6 to 2.2 ns on the shared machine.
    #[test]
    #[ignore]
    fn cost() {
        let grid = Grid { t: 1, h: 32, w: 32 };
        let d = doc(vec![
            Item::Text((0..200).collect()),
            Item::Image {
                bytes: Vec::new(),
                grid,
                tokens: 258,
            },
            Item::Text((0..300).collect()),
            Item::Image {
                bytes: Vec::new(),
                grid: Grid { t: 1, h: 20, w: 28 },
                tokens: 142,
            },
            Item::Text((0..100).collect()),
        ]);
        let run = Run {
            doc: d.clone(),
            from: Cursor { item: 0, offset: 0 },
            to: Cursor { item: 5, offset: 0 },
            doc_batches: (0, 0),
        };
        let (rows, len) = (8usize, 4096usize);
        let n = rows * len;
        let [mut a, mut b, mut c, mut e] = super::tests::rows(n);
        let rounds = 200;
        let started = std::time::Instant::now();
        let mut tokens = 0usize;
        for _ in 0..rounds {
            let mut r = PositionRows {
                text: &mut a,
                t: &mut b,
                h: &mut c,
                w: &mut e,
            };
            for row in 0..rows {
                let mut at = row * len;
                while at + d.tokens <= (row + 1) * len {
                    at = write_run(&mut r, &run, at, Rope::MRope { merge: 2 }, || true);
                }
                tokens += at - row * len;
                r.padding(at, (row + 1) * len);
            }
        }
        let ns = started.elapsed().as_nanos() as f64 / (rounds * n) as f64;
        println!("positions: {ns:.2} ns per token slot ({tokens} document tokens)");
        std::hint::black_box((&a, &b, &c, &e));
    }
}
