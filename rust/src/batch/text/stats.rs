//! What a packed pipeline counted: rows, tokens, documents begun, skipped documents by reason
//! (at most `MAX_FAULTS_KEPT` kept whole), tokenizing time and the source's traffic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Fault;
use crate::read::source::SourceStats;

const MAX_FAULTS_KEPT: usize = 1000;

#[derive(Default)]
pub struct PackedStats {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    /// Tokens written into rows.
    pub tokens: AtomicU64,
    /// Documents whose first token was written into a row.
    pub documents: AtomicU64,
    tokenize_ns: AtomicU64,
    pub source: Arc<SourceStats>,
    skipped: Mutex<(BTreeMap<&'static str, u64>, Vec<Fault>)>,
}

impl PackedStats {
    pub(super) fn record_skip(&self, fault: Fault) {
        let mut s = self.skipped.lock().expect("stats lock");
        *s.0.entry(fault.reason.as_str()).or_default() += 1;
        if s.1.len() < MAX_FAULTS_KEPT {
            s.1.push(fault);
        }
    }

    pub(super) fn add_tokenize(&self, elapsed: Duration) {
        self.tokenize_ns
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> serde_json::Value {
        let s = self.skipped.lock().expect("stats lock");
        serde_json::json!({
            "batches": self.batches.load(Ordering::Relaxed),
            "rows": self.rows.load(Ordering::Relaxed),
            "tokens": self.tokens.load(Ordering::Relaxed),
            "documents": self.documents.load(Ordering::Relaxed),
            "bytes": self.source.bytes.load(Ordering::Relaxed),
            "retries": self.source.retries.load(Ordering::Relaxed),
            "throttled": self.source.throttled.load(Ordering::Relaxed),
            "resumes": self.source.resumes.load(Ordering::Relaxed),
            "tokenize_seconds": self.tokenize_ns.load(Ordering::Relaxed) as f64 / 1e9,
            "skipped": s.0,
            "skipped_total": s.0.values().sum::<u64>(),
            "faults": s.1,
        })
    }
}
