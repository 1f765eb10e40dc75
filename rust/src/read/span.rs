//! Shard spans: the contiguous piece of one shard a reader reads.
//!
//! A span names its shard, where in the shard it starts (a byte offset, or the detail block to
//! find it in) and which ordinals it keeps. A subset's span whose ordinals are still in the
//! shard's detail block is resolved when it opens (one range read); one whose byte offsets are
//! known opens as several windows, seeking over long runs of samples the subset leaves out.
//! How a span opens under a loader's configuration is the square kind's
//! (`batch::square::span`); what a span is, and its windows, are the read stage's.

use std::sync::Arc;

use crate::read::seek::DetailSource;
use crate::read::source::Expected;

/// A contiguous piece of one shard to read.
#[derive(Clone, Debug)]
pub struct ShardSpan {
    pub url: String,
    /// Position of the shard in the dataset's shard list (reported with each sample).
    pub shard: u32,
    /// Byte offset of the first sample to read (from the index; 0 without one).
    pub start_offset: u64,
    pub first_ordinal: u64,
    /// Samples with a smaller ordinal are read past (a shard without offsets read from 0).
    pub skip_before: u64,
    /// Exclusive end ordinal; `None` reads to the end of the shard.
    pub end_ordinal: Option<u64>,
    /// Keep only ordinals with `ordinal % modulus == remainder` (readers sharing a shard).
    pub stride: Option<(u64, u64)>,
    /// What users know the shard by (faults and stats); `url` may be presigned.
    pub display: String,
    /// A version-2 index's detail block for this shard: where to find the offset of
    /// `skip_before` when the span starts mid-shard and `start_offset` is not known.
    pub detail: Option<DetailSource>,
    /// The shard's content as the index recorded it (size, ETag): another version is refused.
    pub expected: Expected,
    /// A subset's span: only these ordinals (sorted, within `skip_before..end_ordinal`) are
    /// read out; the others are passed over.
    pub keep: Option<Arc<[u64]>>,
    /// Where each kept sample's bytes start and end (an uncompressed shard whose offsets the
    /// index holds): lets the reader seek over long runs of samples the subset leaves out.
    pub keep_bytes: Option<Arc<[(u64, u64)]>>,
    /// A subset's span whose ordinals are still in the shard's detail block: [`ShardSpan::resolved`]
    /// reads them when the span opens.
    pub selection: Option<SpanSelection>,
}

/// Selected samples `ranks.0..ranks.1` of a subset's shard (positions among its kept samples).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanSelection {
    pub ranks: (u64, u64),
}

impl ShardSpan {
    /// Planned positions in this span: the kept samples, or the ordinals it covers.
    pub(crate) fn planned_len(&self) -> u64 {
        match (&self.keep, &self.selection) {
            (Some(keep), _) => keep.len() as u64,
            (None, Some(s)) => s.ranks.1 - s.ranks.0,
            (None, None) => self
                .end_ordinal
                .map_or(0, |end| end.saturating_sub(self.skip_before)),
        }
    }

    /// The pieces to open: the span itself, or for a subset whose byte offsets are known, one
    /// piece per run of kept samples, split where the samples left out between two kept ones
    /// take more than [`seek_gap`] bytes (seeking there beats reading past them).
    pub(crate) fn windows(&self) -> Vec<ShardSpan> {
        let (Some(keep), Some(bytes)) = (&self.keep, &self.keep_bytes) else {
            return vec![self.clone()];
        };
        let gap = seek_gap(&self.url);
        let mut out = Vec::new();
        let mut first = 0;
        for i in 0..keep.len() {
            let last_of_window = i + 1 == keep.len() || bytes[i + 1].0 - bytes[i].1 > gap;
            if last_of_window {
                out.push(ShardSpan {
                    start_offset: bytes[first].0,
                    first_ordinal: keep[first],
                    skip_before: keep[first],
                    end_ordinal: Some(keep[i] + 1),
                    detail: None,
                    ..self.clone()
                });
                first = i + 1;
            }
        }
        out
    }
}

/// Bytes of left-out samples worth a seek rather than a read: more than a reopened shard's
/// read buffer (256 KiB) for a file, a round trip's worth of transfer for a new HTTP range
/// request.
fn seek_gap(url: &str) -> u64 {
    if url.contains("://") && !url.starts_with("file://") {
        4 << 20
    } else {
        512 << 10
    }
}

/// (start, end) bytes of each kept ordinal, from a shard's `num_samples + 1` offsets.
pub fn kept_byte_ranges(kept: &[u64], offsets: &[u64]) -> Option<Arc<[(u64, u64)]>> {
    kept.iter()
        .map(|&o| Some((*offsets.get(o as usize)?, *offsets.get(o as usize + 1)?)))
        .collect::<Option<Vec<_>>>()
        .map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subset_span_seeks_over_long_runs_of_left_out_samples_only() {
        // 12 samples of 100 kB; the subset keeps 0, 1, 2, 9 and 11.
        let offsets: Vec<u64> = (0..=12).map(|i| i * 100_000).collect();
        let keep: Arc<[u64]> = Arc::from([0u64, 1, 2, 9, 11]);
        let span = ShardSpan {
            url: "/d/00000.tar".into(),
            shard: 3,
            start_offset: 0,
            first_ordinal: 0,
            skip_before: 0,
            end_ordinal: Some(12),
            stride: None,
            display: String::new(),
            detail: None,
            expected: Expected::default(),
            keep_bytes: kept_byte_ranges(&keep, &offsets),
            keep: Some(keep),
            selection: None,
        };
        let pieces: Vec<(u64, u64, Option<u64>)> = span
            .windows()
            .iter()
            .map(|w| (w.start_offset, w.first_ordinal, w.end_ordinal))
            .collect();
        // 3..9 (600 kB) is worth a seek on disk; the one sample 10 (100 kB) is read past.
        assert_eq!(pieces, vec![(0, 0, Some(3)), (900_000, 9, Some(12))]);
        // Over HTTP a seek costs a request: 600 kB is read past too.
        let remote = ShardSpan {
            url: "https://h/00000.tar".into(),
            ..span.clone()
        };
        assert_eq!(remote.windows().len(), 1);
        // Without offsets there is nothing to seek by: one piece.
        let unknown = ShardSpan {
            keep_bytes: None,
            ..span
        };
        assert_eq!(unknown.windows().len(), 1);
    }
}
