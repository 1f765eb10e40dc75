//! What a pipeline counted (samples, batches, decode time, skips by reason, shard errors,
//! replacements, padding, the remainder), shared by its threads and readable at any time.
//! At most `MAX_FAULTS_KEPT` faults are kept, so the stats stay bounded on a long epoch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::batch::square::config::PipelineConfig;
use crate::error::{Fault, Reason};
use crate::read::source::SourceStats;

/// What the pipeline counted; readable at any time.
#[derive(Default)]
pub struct Stats {
    pub samples: AtomicU64,
    pub batches: AtomicU64,
    pub decode_ns: AtomicU64,
    pub replaced: AtomicU64,
    pub padded: AtomicU64,
    pub source: Arc<SourceStats>,
    inner: Mutex<StatsInner>,
}

#[derive(Default)]
struct StatsInner {
    /// A mixture's samples per source (by position).
    by_source: BTreeMap<usize, u64>,
    skipped: BTreeMap<&'static str, u64>,
    shard_errors: BTreeMap<&'static str, u64>,
    faults: Vec<Fault>,
    remainder_keys: Vec<String>,
}

const MAX_FAULTS_KEPT: usize = 1000;

impl Stats {
    pub(super) fn record_skip(&self, fault: Fault) {
        let mut s = self.inner.lock().expect("stats lock");
        *s.skipped.entry(fault.reason.as_str()).or_default() += 1;
        if s.faults.len() < MAX_FAULTS_KEPT {
            s.faults.push(fault);
        }
    }

    pub(super) fn record_shard_error(&self, fault: Fault) {
        let mut s = self.inner.lock().expect("stats lock");
        *s.shard_errors.entry(fault.reason.as_str()).or_default() += 1;
        if s.faults.len() < MAX_FAULTS_KEPT {
            s.faults.push(fault);
        }
    }

    pub(super) fn record_sources(&self, cfg: &PipelineConfig, shards: &[u32]) {
        if cfg.sources.is_empty() {
            return;
        }
        let mut s = self.inner.lock().expect("stats lock");
        for &shard in shards {
            if let Some(i) = cfg.source_of(shard) {
                *s.by_source.entry(i).or_default() += 1;
            }
        }
    }

    /// The most frequent reason samples were skipped for so far (else shards failed for), with
    /// its count and the count of all: what an all-skipped pass names.
    pub(super) fn top_skip(&self) -> Option<(Reason, u64, u64)> {
        let s = self.inner.lock().expect("stats lock");
        let counts = if s.skipped.is_empty() {
            &s.shard_errors
        } else {
            &s.skipped
        };
        let (name, count) = counts
            .iter()
            .max_by_key(|&(name, count)| (*count, std::cmp::Reverse(*name)))?;
        let reason = Reason::ALL.into_iter().find(|r| r.as_str() == *name)?;
        Some((reason, *count, counts.values().sum()))
    }

    pub(super) fn record_remainder(&self, keys: Vec<String>) {
        self.inner
            .lock()
            .expect("stats lock")
            .remainder_keys
            .extend(keys);
    }

    pub fn snapshot(&self) -> serde_json::Value {
        let s = self.inner.lock().expect("stats lock");
        serde_json::json!({
            "samples": self.samples.load(Ordering::Relaxed),
            "batches": self.batches.load(Ordering::Relaxed),
            "bytes": self.source.bytes.load(Ordering::Relaxed),
            "retries": self.source.retries.load(Ordering::Relaxed),
            "throttled": self.source.throttled.load(Ordering::Relaxed),
            "resumes": self.source.resumes.load(Ordering::Relaxed),
            "cache_hits": self.source.cache_hits.load(Ordering::Relaxed),
            "cache_misses": self.source.cache_misses.load(Ordering::Relaxed),
            "cache_errors": self.source.cache_errors.load(Ordering::Relaxed),
            "decode_seconds": self.decode_ns.load(Ordering::Relaxed) as f64 / 1e9,
            "samples_by_source": s.by_source,
            "skipped": s.skipped,
            "skipped_total": s.skipped.values().sum::<u64>(),
            "shard_errors": s.shard_errors,
            "replaced": self.replaced.load(Ordering::Relaxed),
            "padded": self.padded.load(Ordering::Relaxed),
            "remainder": s.remainder_keys.len(),
            "remainder_keys": s.remainder_keys,
            "faults": s.faults,
        })
    }
}
