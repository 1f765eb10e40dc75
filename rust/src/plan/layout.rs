//! Cutting a phase sequence into ranks, readers, batches, the short batch and the reserve.

use super::config::PhaseConfig;

/// `total * i / parts` without overflow: the start of part `i` when `total` is split evenly.
pub(super) fn share(total: u64, parts: u64, i: u64) -> u64 {
    (total as u128 * i as u128 / parts as u128) as u64
}

/// One rank's reader sequence as ranges of the phase sequence: its contiguous full batches,
/// and for `drop_last = false` maybe the rank's short batch (whose positions wrap past the end).
#[derive(Clone, Copy, Debug)]
pub(super) struct Segments {
    pub(super) parts: [(u64, u64); 2],
    pub(super) seq_len: u64,
}

impl Segments {
    pub(super) fn len(&self) -> u64 {
        self.parts.iter().map(|(a, b)| b - a).sum()
    }

    /// Calls `f` with the phase-sequence ranges (each inside 0..seq_len) of reader positions
    /// `from..to`.
    pub(super) fn for_each(&self, from: u64, to: u64, mut f: impl FnMut(u64, u64)) {
        let mut base = 0;
        for &(a, b) in &self.parts {
            let (lo, hi) = (from.max(base), to.min(base + (b - a)));
            let (mut p, end) = (a + lo.saturating_sub(base), a + hi.saturating_sub(base));
            while lo < hi && p < end {
                let q = p % self.seq_len;
                let take = (end - p).min(self.seq_len - q);
                f(q, q + take);
                p += take;
            }
            base += b - a;
        }
    }
}

/// Where every reader's batches and reserve lie in a phase sequence of `len` samples.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) config: PhaseConfig,
    pub(super) len: u64,
    /// Full batches per rank.
    pub(super) full: u64,
    /// Size of every rank's short last batch (`drop_last = false`), 0 when there is none.
    pub(super) partial: u64,
}

impl Layout {
    pub(super) fn new(len: u64, config: PhaseConfig) -> Self {
        let g = config.global_batch();
        let rest = len % g;
        let partial = if config.drop_last || rest == 0 {
            0
        } else {
            rest.div_ceil(config.world_size as u64)
        };
        Self {
            config,
            len,
            full: len / g,
            partial,
        }
    }

    pub(super) fn readers(&self) -> u64 {
        self.config.readers_per_rank() as u64
    }

    pub(super) fn batches_per_rank(&self) -> u64 {
        self.full + u64::from(self.partial > 0)
    }

    pub(super) fn tail_start(&self) -> u64 {
        self.full * self.config.global_batch()
    }

    /// Samples no rank yields (`drop_last = true`): the remainder, used as the reserve.
    pub(super) fn tail_len(&self) -> u64 {
        if self.config.drop_last {
            self.len - self.tail_start()
        } else {
            0
        }
    }

    /// Repeated samples that fill the short batches (`drop_last = false`).
    pub(super) fn padding(&self) -> u64 {
        if self.partial > 0 {
            self.partial * self.config.world_size as u64 - (self.len - self.tail_start())
        } else {
            0
        }
    }

    /// (first, count) of reader `w`'s full batches within its rank's slice.
    pub(super) fn reader_full(&self, w: u64) -> (u64, u64) {
        let (base, extra) = (self.full / self.readers(), self.full % self.readers());
        (w * base + w.min(extra), base + u64::from(w < extra))
    }

    /// The reader whose last batch is the rank's short one: the one the round-robin reaches at
    /// the rank's last position.
    pub(super) fn owns_partial(&self, w: u64) -> bool {
        self.partial > 0 && self.full % self.readers() == w
    }

    pub(super) fn reader_batches(&self, w: u64) -> u64 {
        self.reader_full(w).1 + u64::from(self.owns_partial(w))
    }

    pub(super) fn reader_segments(&self, rank: u64, w: u64) -> Segments {
        let b = self.config.batch_size;
        let (first, count) = self.reader_full(w);
        let rank_base = rank * self.full * b;
        let full = (rank_base + first * b, rank_base + (first + count) * b);
        let short = if self.owns_partial(w) {
            let a = self.tail_start() + rank * self.partial;
            (a, a + self.partial)
        } else {
            (0, 0)
        };
        Segments {
            parts: [full, short],
            seq_len: self.len,
        }
    }

    /// Phase-sequence range of reader `w`'s reserve: its even share of its rank's share of the tail.
    pub(super) fn reserve_range(&self, rank: u64, w: u64) -> (u64, u64) {
        let (tail, world) = (self.tail_len(), self.config.world_size as u64);
        let ra = self.tail_start() + share(tail, world, rank);
        let rlen = share(tail, world, rank + 1) - share(tail, world, rank);
        (
            ra + share(rlen, self.readers(), w),
            ra + share(rlen, self.readers(), w + 1),
        )
    }
}
