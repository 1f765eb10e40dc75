//! The read-ahead threads: `read_ahead` threads read a reader's spans in turn, each into its
//! own bounded queue, and [`MergedReader`] takes their items back in span order.
//!
//! In planned mode a sample that cannot be read keeps its position as a hole, so block and
//! batch boundaries never move; under `on_error = raise` a failed shard ends the stream before
//! any sample behind it. A reader thread that panics, or whose queue closes before its spans
//! end, fails the pass instead of ending it early.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::batch::panics::panic_message;
use crate::batch::square::config::{OnError, PipelineConfig};
use crate::batch::square::stats::Stats;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{RawSample, ShardFault};
use crate::read::span::ShardSpan;

/// A sample position in the shuffled stream: the sample, or a hole where a planned sample
/// could not be read (kept so that positions never shift).
pub(super) enum Item {
    Sample { shard: u32, raw: RawSample },
    Hole { shard: u32, ordinal: u64 },
}

impl Item {
    pub(super) fn shard(&self) -> u32 {
        match self {
            Self::Sample { shard, .. } | Self::Hole { shard, .. } => *shard,
        }
    }
}

/// What a reader thread sends on its queue.
pub(super) enum ReadMsg {
    Item(Item),
    EndOfSpan,
    /// The reader thread panicked (the message); nothing follows.
    Panicked(String),
    /// A shard failed and `on_error` is raise: the pass ends with this fault; nothing follows.
    Failed(Fault),
}

/// Reads one span, sending its samples (and holes, in planned mode) then `EndOfSpan`.
/// Returns false when the receiver is gone.
fn read_span(
    span: &ShardSpan,
    cfg: &PipelineConfig,
    stats: &Stats,
    tx: &Sender<ReadMsg>,
    stop: &AtomicBool,
) -> bool {
    let send = |m: ReadMsg| tx.send(m).is_ok();
    let resolved = span.resolved(cfg, stats);
    let span = match &resolved {
        Ok(s) => s,
        Err(_) => span,
    };
    let mut next_expected = span.first_ordinal.max(span.skip_before);
    // A subset's span: how many of its kept ordinals were read (or passed as holes).
    let mut kept_done = 0usize;
    let mut fault: Option<Fault> = None;
    'windows: for window in span.windows() {
        let opened = match &resolved {
            Ok(_) => window.open(cfg, stats),
            Err(f) => Err(f.clone()),
        };
        let reader = match opened {
            Ok(reader) => reader,
            Err(f) => {
                fault = Some(cfg.shard_fault(span, f));
                break;
            }
        };
        {
            for item in reader {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                match item {
                    Ok(raw) => {
                        if window.end_ordinal.is_some_and(|end| raw.ordinal >= end) {
                            break;
                        }
                        if raw.ordinal < window.skip_before {
                            continue;
                        }
                        next_expected = raw.ordinal + 1;
                        if let Some(keep) = &span.keep {
                            // A kept ordinal the shard did not hold keeps its place as a
                            // hole, counted here (the batcher counts a hole as already counted).
                            while kept_done < keep.len() && keep[kept_done] < raw.ordinal {
                                let missing = cfg.shard_fault(
                                    span,
                                    ShardFault {
                                        reason: Reason::Unreadable,
                                        kind: SourceKind::Other,
                                        detail: format!(
                                            "the shard holds no sample {}, which the index's \
                                             subset keeps",
                                            keep[kept_done]
                                        ),
                                        offset: 0,
                                    },
                                );
                                stats.record_skip(Fault {
                                    key: format!("#{}", keep[kept_done]),
                                    ..missing
                                });
                                if !send(ReadMsg::Item(Item::Hole {
                                    shard: span.shard,
                                    ordinal: keep[kept_done],
                                })) {
                                    return false;
                                }
                                kept_done += 1;
                            }
                            if keep.get(kept_done) != Some(&raw.ordinal) {
                                continue;
                            }
                            kept_done += 1;
                        }
                        if let Some((m, r)) = span.stride {
                            if raw.ordinal % m != r {
                                continue;
                            }
                        }
                        if !send(ReadMsg::Item(Item::Sample {
                            shard: span.shard,
                            raw,
                        })) {
                            return false;
                        }
                    }
                    Err(f) => {
                        fault = Some(cfg.shard_fault(span, f));
                        break 'windows;
                    }
                }
            }
        }
    }
    if let (None, Some(keep)) = (&fault, &span.keep) {
        if let Some(&ordinal) = keep.get(kept_done) {
            fault = Some(cfg.shard_fault(
                span,
                ShardFault {
                    reason: Reason::Unreadable,
                    kind: SourceKind::Other,
                    detail: format!(
                        "the shard ended before sample {ordinal}, which the index's subset keeps"
                    ),
                    offset: 0,
                },
            ));
        }
    }
    if let Some(f) = fault {
        let missing: Vec<u64> = match (&span.keep, &span.selection, span.end_ordinal) {
            _ if !cfg.planned => Vec::new(),
            (Some(keep), _, _) => keep[kept_done..].to_vec(),
            // The subset's ordinals could not be read: its positions, as holes.
            (None, Some(s), _) => (s.ranks.0..s.ranks.1).collect(),
            (None, None, Some(end)) => (next_expected..end).collect(),
            (None, None, None) => Vec::new(),
        };
        let planned_missing = missing.len();
        if cfg.on_error == OnError::Raise {
            stats.record_shard_error(f.clone());
            let _ = tx.send(ReadMsg::Failed(f));
            return false;
        }
        if planned_missing == 0 {
            stats.record_shard_error(f);
        } else {
            for ordinal in missing {
                stats.record_skip(Fault {
                    key: format!("#{ordinal}"),
                    ..f.clone()
                });
                if !send(ReadMsg::Item(Item::Hole {
                    shard: span.shard,
                    ordinal,
                })) {
                    return false;
                }
            }
        }
    }
    send(ReadMsg::EndOfSpan)
}

/// Starts `read_ahead` threads; thread t reads spans t, t+R, t+2R, ... so the merge can take
/// them back in order from the per-thread queues.
pub(super) fn spawn_readers(
    spans: Vec<ShardSpan>,
    cfg: &PipelineConfig,
    stats: &Arc<Stats>,
    stop: &Arc<AtomicBool>,
) -> MergedReader {
    let spans = Arc::new(spans);
    let readers = cfg.read_ahead.max(1).min(spans.len().max(1));
    let mut queues = Vec::new();
    for t in 0..readers {
        let (tx, rx) = bounded::<ReadMsg>(cfg.span_queue.max(1));
        queues.push(rx);
        let (spans, cfg, stats, stop) = (spans.clone(), cfg.clone(), stats.clone(), stop.clone());
        std::thread::spawn(move || {
            if spans.is_empty() {
                return;
            }
            let read_all = std::panic::AssertUnwindSafe(|| {
                let mut i = t;
                loop {
                    if i >= spans.len() && !cfg.cycle {
                        return;
                    }
                    if stop.load(Ordering::Relaxed)
                        || !read_span(&spans[i % spans.len()], &cfg, &stats, &tx, &stop)
                    {
                        return;
                    }
                    i += readers;
                }
            });
            if let Err(panic) = std::panic::catch_unwind(read_all) {
                let _ = tx.send(ReadMsg::Panicked(panic_message(panic.as_ref())));
            }
        });
    }
    MergedReader::new(queues, spans.len(), cfg.cycle)
}

/// The read-ahead queues' items merged back in span order.
pub(super) struct MergedReader {
    queues: Vec<Receiver<ReadMsg>>,
    current: usize,
    span_count: usize,
    cycle: bool,
    spans_done: usize,
    items_since_cycle: u64,
    /// Items the first full cycle over the spans gave (once it is complete).
    first_cycle_items: Option<u64>,
}

/// Why the sample stream cannot go on.
#[derive(Debug)]
pub(super) enum StreamError {
    /// A whole cycle over the spans produced nothing: a quota could never be met (better an
    /// error than a hang).
    Starved,
    /// A reader thread ended before its spans did: it panicked (with this message, when it
    /// could send one).
    ReaderLost(Option<String>),
    /// A shard failed under `on_error = raise`. It ends the stream at once, before any sample
    /// behind it is buffered: the reader that sent it has stopped.
    Failed(Fault),
}

impl MergedReader {
    /// The merge of `queues`, thread t's holding spans t, t+R, t+2R, ... of `span_count`.
    pub(super) fn new(queues: Vec<Receiver<ReadMsg>>, span_count: usize, cycle: bool) -> Self {
        Self {
            queues,
            current: 0,
            span_count,
            cycle,
            spans_done: 0,
            items_since_cycle: 0,
            first_cycle_items: None,
        }
    }

    /// With `cycle`: the items of one full cycle over the spans, once one is complete.
    pub(super) fn cycle_items(&self) -> Option<u64> {
        self.first_cycle_items
    }

    /// Next item in span order.
    pub(super) fn next(&mut self) -> Result<Option<Item>, StreamError> {
        loop {
            if self.queues.is_empty() || (!self.cycle && self.spans_done >= self.span_count) {
                return Ok(None);
            }
            let q = &self.queues[self.current % self.queues.len()];
            match q.recv() {
                Ok(ReadMsg::Item(item)) => {
                    self.items_since_cycle += 1;
                    return Ok(Some(item));
                }
                Ok(ReadMsg::EndOfSpan) => {
                    self.current += 1;
                    self.spans_done += 1;
                    if self.cycle && self.spans_done.is_multiple_of(self.span_count) {
                        if self.items_since_cycle == 0 {
                            return Err(StreamError::Starved);
                        }
                        self.first_cycle_items.get_or_insert(self.items_since_cycle);
                        self.items_since_cycle = 0;
                    }
                }
                Ok(ReadMsg::Panicked(message)) => {
                    return Err(StreamError::ReaderLost(Some(message)))
                }
                Ok(ReadMsg::Failed(fault)) => return Err(StreamError::Failed(fault)),
                // Readers send every span's end before they finish: a queue that closes
                // earlier lost its reader.
                Err(_) => return Err(StreamError::ReaderLost(None)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a reader thread that died mid-pass closed its queue, which read as the end of
    /// the data: the pass ended early with no error (and in DDP, one rank stopping early hangs
    /// the others in their next collective).
    #[test]
    fn a_reader_thread_lost_mid_pass_fails_the_pass_instead_of_ending_it() {
        let (tx, rx) = bounded::<ReadMsg>(4);
        let reader = std::thread::spawn(move || {
            tx.send(ReadMsg::EndOfSpan).unwrap();
            panic!("reader bug");
        });
        assert!(reader.join().is_err());
        let merged = |queue, span_count| MergedReader::new(vec![queue], span_count, false);
        let mut lost = merged(rx, 2);
        assert!(matches!(lost.next(), Err(StreamError::ReaderLost(None))));

        let (tx, rx) = bounded::<ReadMsg>(4);
        tx.send(ReadMsg::Panicked("tar bug".into())).unwrap();
        match merged(rx, 1).next() {
            Err(StreamError::ReaderLost(Some(message))) => assert_eq!(message, "tar bug"),
            Err(other) => panic!("expected the reader's panic, got {other:?}"),
            Ok(_) => panic!("expected the reader's panic, got an item or the end"),
        }
    }
}
