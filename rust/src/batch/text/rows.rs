//! Rows out of a block: a block holds `len` rows of `seq_len` tokens in stream order and the
//! offsets where documents start; it emits them in its seeded order, each written into a batch
//! slot as ids, and, when boundaries are asked for, position ids that restart at every
//! document (and at the row's start) and the row's document lengths for `cu_seqlens`.

/// One block of a reader's rows.
#[derive(Default)]
pub(super) struct Block {
    pub tokens: Vec<u32>,
    /// Offsets in `tokens` of each document's first token, ascending.
    pub starts: Vec<u32>,
    order: Vec<u32>,
    next: usize,
}

impl Block {
    /// Refills the block's emission order (`order`), starting after `skip` emitted rows.
    pub fn reset(&mut self, order: Vec<u32>, skip: usize) {
        self.order = order;
        self.next = skip;
    }

    pub fn exhausted(&self) -> bool {
        self.next >= self.order.len()
    }

    /// The next row to emit: its tokens and its document starts (offsets within the row).
    pub fn next_row(&mut self, seq_len: usize) -> (&[u32], Vec<u32>) {
        let k = self.order[self.next] as usize;
        self.next += 1;
        let (lo, hi) = ((k * seq_len) as u32, ((k + 1) * seq_len) as u32);
        let from = self.starts.partition_point(|&s| s < lo);
        let to = self.starts.partition_point(|&s| s < hi);
        let starts = self.starts[from..to].iter().map(|s| s - lo).collect();
        (&self.tokens[k * seq_len..(k + 1) * seq_len], starts)
    }
}

/// Where one batch's rows go.
pub enum IdsOut<'a> {
    I64(&'a mut [i64]),
    I32(&'a mut [i32]),
}

/// Writes `tokens` as row `row` of `ids`.
pub(super) fn write_ids(ids: &mut IdsOut<'_>, row: usize, tokens: &[u32]) {
    let n = tokens.len();
    match ids {
        IdsOut::I64(out) => {
            for (o, &t) in out[row * n..(row + 1) * n].iter_mut().zip(tokens) {
                *o = t as i64;
            }
        }
        IdsOut::I32(out) => {
            for (o, &t) in out[row * n..(row + 1) * n].iter_mut().zip(tokens) {
                *o = t as i32;
            }
        }
    }
}

/// The lengths of the row's sequences: a new one at its start and at every document start.
pub(super) fn segment_lengths(seq_len: usize, starts: &[u32]) -> Vec<u32> {
    let mut cuts: Vec<u32> = Vec::with_capacity(starts.len() + 2);
    cuts.push(0);
    cuts.extend(starts.iter().copied().filter(|&s| s > 0));
    cuts.push(seq_len as u32);
    cuts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Position ids of a row with these sequence lengths: 0, 1, ... restarting at each sequence.
pub(super) fn write_positions(out: &mut [i64], lengths: &[u32]) {
    let mut at = 0usize;
    for &len in lengths {
        for (p, o) in out[at..at + len as usize].iter_mut().enumerate() {
            *o = p as i64;
        }
        at += len as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_emits_its_rows_in_order_with_their_document_starts() {
        let mut block = Block {
            tokens: (0..12).collect(),
            starts: vec![0, 2, 4, 9],
            ..Block::default()
        };
        block.reset(vec![2, 0, 1], 1);
        let (row, starts) = block.next_row(4);
        assert_eq!((row.to_vec(), starts), (vec![0, 1, 2, 3], vec![0, 2]));
        let (row, starts) = block.next_row(4);
        assert_eq!((row.to_vec(), starts), (vec![4, 5, 6, 7], vec![0]));
        assert!(block.exhausted());
    }

    #[test]
    fn positions_restart_at_every_document_and_at_the_row_start() {
        let lengths = segment_lengths(8, &[3, 6]);
        assert_eq!(lengths, vec![3, 3, 2]);
        let mut out = vec![-1i64; 8];
        write_positions(&mut out, &lengths);
        assert_eq!(out, vec![0, 1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(segment_lengths(4, &[0]), vec![4]);
        let mut ids = vec![0i32; 8];
        write_ids(&mut IdsOut::I32(&mut ids), 1, &[7, 8, 9, 10]);
        assert_eq!(ids, vec![0, 0, 0, 0, 7, 8, 9, 10]);
    }
}
