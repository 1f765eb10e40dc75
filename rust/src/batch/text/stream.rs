//! A reader's tokens: the stream positions it was planned (`plan::unit_stream`), read unit by unit.
//!
//! The ranges become *visits*: per unit touched, in order, the unit-local token ranges wanted.
//! A document thread opens each visited unit and sends its documents in chunks (I/O and Parquet
//! decoding overlap tokenization); the consumer tokenizes a chunk in parallel on the pool and
//! keeps the wanted tokens, marking where documents start. A unit read to its end must give the
//! tokens it was counted with: anything else (another tokenizer, a changed file) fails the pass.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver};
use rayon::prelude::*;

use super::documents::{Document, TextSpec, UnitDocuments};
use super::stats::PackedStats;
use crate::batch::kit::read_thread::{self, read_visits, ChunkBounds};
use crate::batch::kit::unit::Unit;
use crate::batch::kit::visits::Visit;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::source::SourceOptions;
use crate::tokenize::DocumentEncoder;

/// Documents per chunk, and the text bytes after which a chunk is sent early.
const CHUNK_DOCS: usize = 256;
const CHUNK_BYTES: usize = 1 << 20;
/// Chunks the document thread reads ahead.
const CHUNKS_AHEAD: usize = 4;

/// What the document thread sends: a unit's documents, in chunks.
type Chunk = read_thread::Chunk<Document>;

/// What the reader is given: every unit and its count, and where it reads.
pub struct StreamInput {
    pub units: Arc<Vec<Unit>>,
    pub unit_tokens: Arc<Vec<u64>>,
    pub spec: TextSpec,
    pub source: SourceOptions,
}

/// The tokens of one reader's visits, in order.
pub(super) struct TokenStream {
    visits: Vec<Visit>,
    input: Arc<StreamInput>,
    encoder: Arc<DocumentEncoder>,
    stats: Arc<PackedStats>,
    chunks: Receiver<(usize, Chunk)>,
    /// The visit the document thread may stop reading (it checks between chunks).
    done_with: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    /// The visit being consumed, its unit-local position, and the next span.
    visit: usize,
    position: u64,
    span: usize,
    /// Tokens kept but not yet taken (with whether each begins a document).
    pending: std::collections::VecDeque<(u32, bool)>,
}

impl TokenStream {
    pub(super) fn start(
        visits: Vec<Visit>,
        input: Arc<StreamInput>,
        encoder: Arc<DocumentEncoder>,
        stats: Arc<PackedStats>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let (tx, rx) = bounded(CHUNKS_AHEAD);
        let done_with = Arc::new(AtomicUsize::new(usize::MAX));
        {
            let visits = visits.clone();
            let input = input.clone();
            let stats = stats.clone();
            let done_with = done_with.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("shardstream-text-read".into())
                .spawn(move || {
                    let open = |visit: &Visit| {
                        let unit = &input.units[visit.unit as usize];
                        let mut docs =
                            UnitDocuments::open(unit, &input.spec, &input.source, &stats.source)?;
                        Ok(move || docs.next_document())
                    };
                    let bounds = ChunkBounds {
                        items: CHUNK_DOCS,
                        bytes: CHUNK_BYTES,
                    };
                    let size = |doc: &Document| doc.as_ref().map_or(0, String::len);
                    let finished = |i: usize| done_with.load(Ordering::Relaxed) == i;
                    read_visits(&visits, bounds, open, size, finished, &stop, &tx);
                })
                .expect("spawning the text reader thread");
        }
        Self {
            visits,
            input,
            encoder,
            stats,
            chunks: rx,
            done_with,
            stop,
            visit: 0,
            position: 0,
            span: 0,
            pending: Default::default(),
        }
    }

    /// Appends the next `n` tokens to `tokens`, and the offsets (from `base`) of those that
    /// begin a document to `starts`; Err when the stream fails or ends early.
    pub(super) fn take(
        &mut self,
        n: usize,
        tokens: &mut Vec<u32>,
        starts: &mut Vec<u32>,
        base: u32,
    ) -> Result<(), Fault> {
        let mut taken = 0usize;
        while taken < n {
            if let Some((id, first)) = self.pending.pop_front() {
                if first {
                    starts.push(base + taken as u32);
                }
                tokens.push(id);
                taken += 1;
                continue;
            }
            self.refill()?;
        }
        Ok(())
    }

    /// Reads and tokenizes the next chunk of the current visit into `pending`.
    fn refill(&mut self) -> Result<(), Fault> {
        let Some(visit) = self.visits.get(self.visit) else {
            return Err(internal("the reader's ranges ended before its rows"));
        };
        if self.stop.load(Ordering::Relaxed) {
            return Err(internal("stopped"));
        }
        let (i, chunk) = self
            .chunks
            .recv()
            .map_err(|_| internal("the document thread ended early"))?;
        if i != self.visit {
            // Chunks of a visit finished early, still in flight.
            return Ok(());
        }
        let unit = visit.unit as usize;
        match chunk {
            Chunk::Failed(fault) => Err(fault),
            Chunk::End => {
                if self.position != self.input.unit_tokens[unit] {
                    return Err(self.miscounted(unit, "fewer than"));
                }
                Err(internal("a unit ended inside its planned ranges"))
            }
            Chunk::Items(docs) => {
                let started = Instant::now();
                let encoder = &self.encoder;
                let encoded: Vec<Result<Vec<u32>, Fault>> = docs
                    .into_par_iter()
                    .map(|doc| {
                        let text = doc?;
                        encoder.encode(&text).map_err(|detail| Fault {
                            reason: Reason::Internal,
                            url: String::new(),
                            key: String::new(),
                            detail: format!(
                                "the tokenizer failed: {}",
                                crate::error::capped_detail(detail.to_string())
                            ),
                            kind: SourceKind::Other,
                        })
                    })
                    .collect();
                self.stats.add_tokenize(started.elapsed());
                for doc in encoded {
                    self.keep(doc, unit);
                }
                if self.position > self.input.unit_tokens[unit] {
                    return Err(self.miscounted(unit, "more than"));
                }
                self.finish_visit_if_done();
                Ok(())
            }
        }
    }

    /// Keeps the wanted part of one document (all of `pending` stays in visit order).
    fn keep(&mut self, doc: Result<Vec<u32>, Fault>, unit: usize) {
        let visit = &self.visits[self.visit];
        let ids = match doc {
            Ok(ids) => ids,
            Err(mut fault) => {
                if visit
                    .spans
                    .iter()
                    .any(|&(a, b)| a <= self.position && self.position < b)
                {
                    if fault.url.is_empty() {
                        fault.url = self.input.units[unit].display();
                    }
                    self.stats.record_skip(fault);
                }
                return;
            }
        };
        let (lo, hi) = (self.position, self.position + ids.len() as u64);
        for &(a, b) in &visit.spans[self.span..] {
            if a >= hi {
                break;
            }
            let (from, to) = (a.max(lo), b.min(hi));
            for p in from..to {
                self.pending.push_back((ids[(p - lo) as usize], p == lo));
            }
        }
        if lo == hi {
            return;
        }
        self.position = hi;
        while self.span < visit.spans.len() && visit.spans[self.span].1 <= self.position {
            self.span += 1;
        }
    }

    /// The fault of a unit whose documents do not encode to the tokens it was counted with.
    fn miscounted(&self, unit: usize, how: &str) -> Fault {
        Fault {
            reason: Reason::Unreadable,
            url: self.input.units[unit].display(),
            key: String::new(),
            detail: format!(
                "its documents encode to {how} the {} tokens the token counts say: they were \
                 made with another tokenizer or EOS/BOS, or the file changed; count again",
                self.input.unit_tokens[unit]
            ),
            kind: SourceKind::Other,
        }
    }

    /// Moves on to the next visit once every span of this one is kept.
    fn finish_visit_if_done(&mut self) {
        let visit = &self.visits[self.visit];
        if self.span < visit.spans.len() {
            return;
        }
        self.done_with.store(self.visit, Ordering::Relaxed);
        self.visit += 1;
        self.position = 0;
        self.span = 0;
    }
}

fn internal(detail: &str) -> Fault {
    Fault {
        reason: Reason::Internal,
        url: String::new(),
        key: String::new(),
        detail: detail.into(),
        kind: SourceKind::Other,
    }
}
