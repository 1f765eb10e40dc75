//! The reserve: the spans a planned reader refills failed slots from, read lazily, and the
//! count of reserve positions used so far (what a resume state records, so that a resumed
//! reader never refills from them again).

use crate::batch::square::config::PipelineConfig;
use crate::batch::square::stats::Stats;
use crate::read::group::{RawSample, SampleReader};
use crate::read::span::ShardSpan;

/// Reads the reserve spans lazily, only when a planned slot needs a replacement, and counts
/// the reserve positions it has consumed (read, or lost with an unreadable span).
pub(super) struct ReserveReader {
    spans: Vec<ShardSpan>,
    next_span: usize,
    current: Option<SampleReader>,
    /// Positions of the spans before the current one.
    before_current: u64,
    pub(super) used: u64,
}

impl ReserveReader {
    pub(super) fn new(spans: Vec<ShardSpan>) -> Self {
        Self {
            spans,
            next_span: 0,
            current: None,
            before_current: 0,
            used: 0,
        }
    }

    pub(super) fn next(&mut self, cfg: &PipelineConfig, stats: &Stats) -> Option<(u32, RawSample)> {
        loop {
            if let Some(reader) = self.current.as_mut() {
                let span = &self.spans[self.next_span - 1];
                match reader.next() {
                    Some(Ok(raw)) if raw.ordinal < span.skip_before => continue,
                    Some(Ok(raw)) if span.end_ordinal.is_none_or(|e| raw.ordinal < e) => {
                        // Reserve positions count planned samples: a subset's kept ones only.
                        let position = match &span.keep {
                            Some(keep) => match keep.binary_search(&raw.ordinal) {
                                Ok(i) => i as u64 + 1,
                                Err(_) => continue,
                            },
                            None => raw.ordinal - span.skip_before + 1,
                        };
                        self.used = self.before_current + position;
                        return Some((span.shard, raw));
                    }
                    Some(Err(f)) => stats.record_shard_error(cfg.shard_fault(span, f)),
                    _ => {}
                }
                self.current = None;
                self.before_current += span.planned_len();
                self.used = self.before_current;
            }
            let span = self.spans.get(self.next_span)?;
            let opened = span.resolved(cfg, stats).and_then(|resolved| {
                let reader = resolved.open(cfg, stats);
                reader.map(|r| (resolved, r))
            });
            match opened {
                Ok((resolved, r)) => {
                    self.spans[self.next_span] = resolved;
                    self.current = Some(r);
                }
                Err(f) => {
                    let span = &self.spans[self.next_span];
                    stats.record_shard_error(cfg.shard_fault(span, f));
                    self.before_current += span.planned_len();
                    self.used = self.before_current;
                }
            }
            self.next_span += 1;
        }
    }
}
