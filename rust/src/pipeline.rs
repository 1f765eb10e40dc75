//! The loader pipeline: shard spans in, finished batches out.
//!
//! ```text
//! read-ahead threads (one shard span each, in turn) ──ordered merge──▶ block shuffle
//!   ──▶ batcher: B samples decoded in parallel (rayon) straight into the caller's
//!       [B,3,S,S] buffer ──▶ batch metadata queue
//! ```
//!
//! Memory is bounded by configuration: `read_ahead` spans x `span_queue` samples, one shuffle
//! block of compressed samples, and the output buffers the caller lends (`submit`). Nothing
//! grows with shard or dataset size.
//!
//! A mixture's reader reads one such merged stream per source and takes each block's share of
//! each, in source order (`MixedReader`; the plan says how many).
//!
//! Two modes share this code. *Planned* (an index is present): every span names exact
//! ordinals, a sample that cannot be produced becomes a placeholder so block and batch
//! boundaries never move, and a failed slot is refilled from the reserve spans, so every rank
//! yields exactly `num_batches`. *Streaming* (no index): failures are skipped and the next
//! sample takes their place.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use crate::error::{Fault, Reason, SourceKind};
use crate::group::{is_gzip_name, open_shard, RawSample, SampleReader, ShardFault};
use crate::rng::{derive_seed, permutation};
use crate::sample::{prepare, Rejection, SampleSpec, Worker};
use crate::seek::DetailSource;
use crate::source::{redact_url, Expected, SourceOptions, SourceStats};

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
    fn planned_len(&self) -> u64 {
        match (&self.keep, &self.selection) {
            (Some(keep), _) => keep.len() as u64,
            (None, Some(s)) => s.ranks.1 - s.ranks.0,
            (None, None) => self
                .end_ordinal
                .map_or(0, |end| end.saturating_sub(self.skip_before)),
        }
    }

    /// This span with a subset's ordinals looked up in the detail block (one range read), and
    /// where the first of them starts when the block holds offsets.
    fn resolved(&self, cfg: &PipelineConfig, stats: &Stats) -> Result<ShardSpan, ShardFault> {
        let (Some(selection), Some(detail)) = (&self.selection, &self.detail) else {
            return Ok(self.clone());
        };
        let unreadable = |detail: String| ShardFault {
            reason: Reason::Unreadable,
            kind: SourceKind::Other,
            detail,
            offset: 0,
        };
        let block = detail
            .fetch(&cfg.source, &stats.source)
            .map_err(unreadable)?;
        let (a, b) = selection.ranks;
        let kept: Arc<[u64]> = block
            .selection
            .as_ref()
            .and_then(|s| s.get(a as usize..b as usize))
            .ok_or_else(|| {
                unreadable(format!(
                    "the index's detail block holds no selected samples {a}..{b} for this subset"
                ))
            })?
            .into();
        let first = kept.first().copied().unwrap_or(0);
        let offsets = block
            .offsets
            .as_deref()
            .filter(|_| !is_gzip_name(&self.url));
        let offset = offsets.and_then(|o| o.get(first as usize).copied());
        Ok(ShardSpan {
            start_offset: offset.unwrap_or(0),
            first_ordinal: if offset.is_some() { first } else { 0 },
            skip_before: first,
            end_ordinal: Some(kept.last().map_or(0, |&o| o + 1)),
            detail: None,
            selection: None,
            keep_bytes: offsets.and_then(|o| kept_byte_ranges(&kept, o)),
            keep: Some(kept),
            ..self.clone()
        })
    }

    /// The pieces to open: the span itself, or for a subset whose byte offsets are known, one
    /// piece per run of kept samples, split where the samples left out between two kept ones
    /// take more than [`seek_gap`] bytes (seeking there beats reading past them).
    fn windows(&self) -> Vec<ShardSpan> {
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

    /// Opens the shard at this span's first sample (seeking there with the index's detail
    /// block when the span starts mid-shard).
    fn open(&self, cfg: &PipelineConfig, stats: &Stats) -> Result<SampleReader, ShardFault> {
        let (start, first) = self.entry_point(cfg, stats)?;
        open_shard(
            &self.url,
            start,
            first,
            cfg.max_member_bytes,
            &self.expected,
            &cfg.source,
            &stats.source,
        )
    }

    fn entry_point(&self, cfg: &PipelineConfig, stats: &Stats) -> Result<(u64, u64), ShardFault> {
        match &self.detail {
            Some(d) if self.skip_before > self.first_ordinal && !is_gzip_name(&self.url) => {
                match d.offset_of(self.skip_before, &cfg.source, &stats.source) {
                    Ok(Some(offset)) => Ok((offset, self.skip_before)),
                    Ok(None) => Ok((self.start_offset, self.first_ordinal)),
                    Err(detail) => Err(ShardFault {
                        reason: Reason::Unreadable,
                        kind: SourceKind::Other,
                        detail,
                        offset: 0,
                    }),
                }
            }
            _ => Ok((self.start_offset, self.first_ordinal)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    Skip,
    Raise,
}

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub spec: SampleSpec,
    pub batch_size: usize,
    pub threads: usize,
    pub read_ahead: usize,
    pub span_queue: usize,
    /// Samples per shuffle block; each block is emitted in a seeded permutation. 1 = in order.
    pub block_size: usize,
    /// Block j is permuted with `derive_seed([shuffle_seed, j])` (see plan::BlockShuffle).
    pub shuffle_seed: u64,
    /// Number of the first block read (non-zero when resuming a planned reader).
    pub first_block: u64,
    /// Random crops use `derive_seed([crop_seed, hash(key)])`.
    pub crop_seed: u64,
    /// Emitted samples to drop before the first batch (resume inside a block).
    pub skip_emitted: u64,
    /// Exactly this many batches (planned mode, or streaming with `samples_per_epoch`).
    pub num_batches: Option<u64>,
    /// Planned mode: size of the last batch (the plan's short batch with `drop_last=False`).
    pub last_batch_size: Option<usize>,
    /// Spans carry exact ordinals: keep positions with placeholders, refill from the reserve.
    pub planned: bool,
    /// Streaming with a quota: start over from the first span when the spans run out.
    pub cycle: bool,
    pub drop_last: bool,
    pub on_error: OnError,
    pub max_member_bytes: u64,
    pub source: SourceOptions,
    /// The URL users know each shard by (key: `ShardSpan::shard`), for faults and stats;
    /// spans may hold presigned URLs that must not be shown. Only the shards of this reader's
    /// spans: never a table of the whole dataset.
    pub display_urls: Arc<HashMap<u32, String>>,
    /// A mixture's sources by first shard (ascending), each with its sample spec (its own
    /// caption source); samples are counted per source. Empty: one dataset, `spec` for all.
    pub sources: Vec<(u32, SampleSpec)>,
    /// Captions are tokenized into the buffer's `tokens` (`[B, context_length]` int64) by the
    /// decode threads once a batch is complete. `None`: no tokens.
    pub tokenizer: Option<Arc<crate::text::ClipTokenizer>>,
}

impl PipelineConfig {
    /// The mixture source `shard` belongs to (`None` for one dataset).
    fn source_of(&self, shard: u32) -> Option<usize> {
        match self.sources.partition_point(|&(first, _)| first <= shard) {
            0 => None,
            n => Some(n - 1),
        }
    }

    fn spec_for(&self, shard: u32) -> &SampleSpec {
        self.source_of(shard)
            .map_or(&self.spec, |i| &self.sources[i].1)
    }

    fn display(&self, shard: u32) -> String {
        self.display_urls
            .get(&shard)
            .cloned()
            .unwrap_or_else(|| format!("shard #{shard}"))
    }

    fn shard_fault(&self, span: &ShardSpan, f: ShardFault) -> Fault {
        let url = if span.display.is_empty() {
            redact_url(&span.url)
        } else {
            span.display.clone()
        };
        Fault {
            reason: f.reason,
            url,
            key: String::new(),
            detail: f.detail,
            kind: f.kind,
        }
    }
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            spec: SampleSpec::default(),
            batch_size: 32,
            threads: 1,
            read_ahead: 2,
            span_queue: 64,
            block_size: 1,
            shuffle_seed: 0,
            first_block: 0,
            crop_seed: 0,
            skip_emitted: 0,
            num_batches: None,
            last_batch_size: None,
            planned: false,
            cycle: false,
            drop_last: true,
            on_error: OnError::Skip,
            max_member_bytes: 256 << 20,
            source: SourceOptions::default(),
            display_urls: Arc::new(HashMap::new()),
            sources: Vec::new(),
            tokenizer: None,
        }
    }
}

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
    fn record_skip(&self, fault: Fault) {
        let mut s = self.inner.lock().expect("stats lock");
        *s.skipped.entry(fault.reason.as_str()).or_default() += 1;
        if s.faults.len() < MAX_FAULTS_KEPT {
            s.faults.push(fault);
        }
    }

    fn record_shard_error(&self, fault: Fault) {
        let mut s = self.inner.lock().expect("stats lock");
        *s.shard_errors.entry(fault.reason.as_str()).or_default() += 1;
        if s.faults.len() < MAX_FAULTS_KEPT {
            s.faults.push(fault);
        }
    }

    fn record_sources(&self, cfg: &PipelineConfig, shards: &[u32]) {
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

    fn record_remainder(&self, keys: Vec<String>) {
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
            "resumes": self.source.resumes.load(Ordering::Relaxed),
            "cache_hits": self.source.cache_hits.load(Ordering::Relaxed),
            "cache_misses": self.source.cache_misses.load(Ordering::Relaxed),
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

/// A sample position in the shuffled stream: the sample, or a hole where a planned sample
/// could not be read (kept so that positions never shift).
enum Item {
    Sample { shard: u32, raw: RawSample },
    Hole { shard: u32, ordinal: u64 },
}

enum ReadMsg {
    Item(Item),
    EndOfSpan,
    /// The reader thread panicked (the message); nothing follows.
    Panicked(String),
    /// A shard failed and `on_error` is raise: the pass ends with this fault; nothing follows.
    Failed(Fault),
}

/// A caller-provided output buffer (raw pointer into memory the caller keeps alive until the
/// matching batch is returned).
pub struct OutBuffer {
    pub ptr: *mut u8,
    pub len: usize,
    /// Keeps the memory alive for as long as the pipeline may write to it (the binding puts a
    /// reference to the Python buffer object here), even if the caller stops waiting.
    pub owner: Option<Box<dyn std::any::Any + Send>>,
    /// With a tokenizer: where the batch's `[B, context_length]` int64 tokens go (pointer,
    /// length in elements), kept alive by `owner` as well.
    pub tokens: Option<(*mut i64, usize)>,
}

// SAFETY: the buffer is written by exactly one batch at a time; the caller keeps it untouched
// until that batch is handed back, and `owner` keeps it allocated.
unsafe impl Send for OutBuffer {}

pub struct BatchMeta {
    pub len: usize,
    pub keys: Vec<String>,
    pub texts: Vec<String>,
    pub shards: Vec<u32>,
    /// Reserve positions this reader had consumed when the batch was complete (planned mode):
    /// what a resume state records, so that a resumed reader never refills from them again.
    pub reserve_used: u64,
}

pub type BatchResult = Result<BatchMeta, Fault>;

/// What a reader reads: spans in order, or a mixture's spans per source.
pub enum MainSpans {
    Spans(Vec<ShardSpan>),
    /// One stream of spans per source, and per block (from the reader's first) how many
    /// samples of each source it holds: `block_counts[b * sources + i]` (see
    /// `plan::MixedStreams`).
    Mixed {
        streams: Vec<Vec<ShardSpan>>,
        block_counts: Vec<u32>,
    },
}

impl MainSpans {
    pub fn iter(&self) -> Box<dyn Iterator<Item = &ShardSpan> + '_> {
        match self {
            Self::Spans(spans) => Box::new(spans.iter()),
            Self::Mixed { streams, .. } => Box::new(streams.iter().flatten()),
        }
    }
}

pub struct Pipeline {
    buffers: Option<Sender<OutBuffer>>,
    batches: Receiver<BatchResult>,
    stop: Arc<AtomicBool>,
    pub stats: Arc<Stats>,
    batcher: Option<JoinHandle<()>>,
}

/// How long `drop` waits for the batcher before leaving it to finish on its own (it may be
/// inside a network read with its own timeouts; the buffers it holds stay alive through
/// `OutBuffer::owner`).
const DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Pipeline {
    pub fn start(main: MainSpans, reserve: Vec<ShardSpan>, mut cfg: PipelineConfig) -> Pipeline {
        cfg.display_urls = Arc::new(display_table(main.iter().chain(&reserve)));
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let slot_len = 3 * cfg.spec.image_size as usize * cfg.spec.image_size as usize;
        let main = match main {
            MainSpans::Spans(spans) => {
                ItemSource::Merged(spawn_readers(spans, &cfg, &stats, &stop))
            }
            MainSpans::Mixed {
                streams,
                block_counts,
            } => ItemSource::Mixed(MixedReader {
                sources: streams.len(),
                streams: streams
                    .into_iter()
                    .map(|spans| spawn_readers(spans, &cfg, &stats, &stop))
                    .collect(),
                block_counts,
                at: 0,
                left: 0,
            }),
        };
        let (buf_tx, buf_rx) = bounded::<OutBuffer>(64);
        let (out_tx, out_rx) = bounded::<BatchResult>(64);
        let batcher = {
            let stats = stats.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(cfg.threads.max(1))
                    .thread_name(|i| format!("shardstream-decode-{i}"))
                    .build()
                    .expect("decode thread pool");
                let mut batcher = Batcher {
                    cfg,
                    stats,
                    stop,
                    main: Some(main),
                    reserve: ReserveReader::new(reserve),
                    slot_len,
                    last_good: None,
                };
                let faults = out_tx.clone();
                let run =
                    std::panic::AssertUnwindSafe(|| pool.install(|| batcher.run(buf_rx, out_tx)));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let _ = faults.send(Err(panic_fault("batching", panic.as_ref())));
                }
            })
        };
        Pipeline {
            buffers: Some(buf_tx),
            batches: out_rx,
            stop,
            stats,
            batcher: Some(batcher),
        }
    }

    /// Lends an output buffer of `batch_size * slot_len` bytes; batches are filled in the order
    /// buffers are submitted.
    pub fn submit(&self, buffer: OutBuffer) -> bool {
        self.buffers
            .as_ref()
            .is_some_and(|b| b.send(buffer).is_ok())
    }

    /// The next finished batch; `None` at the end of the epoch.
    pub fn next_batch(&self) -> Option<BatchResult> {
        self.batches.recv().ok()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.buffers.take();
        // Reader threads end on their own once the batcher drops their queues. The batcher is
        // waited for (draining its output so it never blocks), so that normally no thread
        // touches a lent buffer after this returns.
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        let deadline = Instant::now() + DROP_WAIT;
        while !batcher.is_finished() && Instant::now() < deadline {
            while self.batches.try_recv().is_ok() {}
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if batcher.is_finished() {
            let _ = batcher.join();
        }
    }
}

/// What users know each shard of these spans by.
pub fn display_table<'a>(spans: impl Iterator<Item = &'a ShardSpan>) -> HashMap<u32, String> {
    spans
        .map(|s| {
            let display = if s.display.is_empty() {
                redact_url(&s.url)
            } else {
                s.display.clone()
            };
            (s.shard, display)
        })
        .collect()
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
                            // A kept ordinal the shard did not hold keeps its place as a hole.
                            while kept_done < keep.len() && keep[kept_done] < raw.ordinal {
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
fn spawn_readers(
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
    MergedReader {
        queues,
        current: 0,
        span_count: spans.len(),
        cycle: cfg.cycle,
        spans_done: 0,
        items_since_cycle: 0,
    }
}

struct MergedReader {
    queues: Vec<Receiver<ReadMsg>>,
    current: usize,
    span_count: usize,
    cycle: bool,
    spans_done: usize,
    items_since_cycle: u64,
}

/// Why the sample stream cannot go on.
#[derive(Debug)]
enum StreamError {
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
    /// Next item in span order.
    fn next(&mut self) -> Result<Option<Item>, StreamError> {
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

/// A mixture reader's items: block after block, each source's share of the block in source
/// order, each source read as its own sequential stream.
struct MixedReader {
    streams: Vec<MergedReader>,
    sources: usize,
    block_counts: Vec<u32>,
    /// Position in `block_counts`, and items still to take there.
    at: usize,
    left: u32,
}

impl MixedReader {
    fn next(&mut self) -> Result<Option<Item>, StreamError> {
        while self.left == 0 {
            let Some(&count) = self.block_counts.get(self.at) else {
                return Ok(None);
            };
            self.left = count;
            self.at += 1;
        }
        self.left -= 1;
        let source = (self.at - 1) % self.sources;
        match self.streams[source].next()? {
            Some(item) => Ok(Some(item)),
            // A planned stream holds exactly its blocks' counts (holes included): running out
            // early means its reader was lost.
            None => Err(StreamError::ReaderLost(Some(format!(
                "source {source}'s stream ended before its planned samples"
            )))),
        }
    }
}

/// Where the block shuffle takes its items from.
enum ItemSource {
    Merged(MergedReader),
    Mixed(MixedReader),
}

impl ItemSource {
    fn next(&mut self) -> Result<Option<Item>, StreamError> {
        match self {
            Self::Merged(reader) => reader.next(),
            Self::Mixed(reader) => reader.next(),
        }
    }
}

/// Pulls blocks of `block_size` items and emits each in its seeded permutation.
struct BlockShuffle {
    source: ItemSource,
    block_size: usize,
    seed: u64,
    block_index: u64,
    pending: Vec<Option<Item>>,
    order: Vec<u32>,
    pos: usize,
}

impl BlockShuffle {
    fn next(&mut self) -> Result<Option<Item>, StreamError> {
        loop {
            if self.pos < self.order.len() {
                let i = self.order[self.pos] as usize;
                self.pos += 1;
                return Ok(self.pending[i].take());
            }
            self.pending.clear();
            while self.pending.len() < self.block_size.max(1) {
                match self.source.next()? {
                    Some(item) => self.pending.push(Some(item)),
                    None => break,
                }
            }
            if self.pending.is_empty() {
                return Ok(None);
            }
            self.order = if self.block_size > 1 {
                permutation(
                    self.pending.len(),
                    derive_seed(&[self.seed, self.block_index]),
                )
            } else {
                vec![0]
            };
            self.block_index += 1;
            self.pos = 0;
        }
    }
}

/// Reads the reserve spans lazily, only when a planned slot needs a replacement, and counts
/// the reserve positions it has consumed (read, or lost with an unreadable span).
struct ReserveReader {
    spans: Vec<ShardSpan>,
    next_span: usize,
    current: Option<SampleReader>,
    /// Positions of the spans before the current one.
    before_current: u64,
    used: u64,
}

impl ReserveReader {
    fn new(spans: Vec<ShardSpan>) -> Self {
        Self {
            spans,
            next_span: 0,
            current: None,
            before_current: 0,
            used: 0,
        }
    }

    fn next(&mut self, cfg: &PipelineConfig, stats: &Stats) -> Option<(u32, RawSample)> {
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

thread_local! {
    static WORKER: std::cell::RefCell<Worker> = std::cell::RefCell::new(Worker::default());
}

fn prepare_into(
    raw: &RawSample,
    shard: u32,
    cfg: &PipelineConfig,
    slot: &mut [u8],
) -> Result<String, Rejection> {
    let spec = cfg.spec_for(shard);
    WORKER.with(|w| {
        guarded(
            || prepare(raw, spec, cfg.crop_seed, &mut w.borrow_mut(), slot),
            // The worker's decoder may be mid-image: the next sample gets a fresh one.
            || *w.borrow_mut() = Worker::default(),
        )
    })
}

/// Runs `work` for one sample; a panic in it (a bug in a decoder, met on some input) becomes
/// that sample's `internal_error` rejection, counted like any other, after `reset`.
fn guarded<T>(
    work: impl FnOnce() -> Result<T, Rejection>,
    reset: impl FnOnce(),
) -> Result<T, Rejection> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        reset();
        Err((
            Reason::Internal,
            format!("decoding panicked: {}", panic_message(panic.as_ref())),
        ))
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// A fault for a pipeline thread that panicked: the pass fails with it instead of ending early.
fn panic_fault(thread: &str, panic: &(dyn std::any::Any + Send)) -> Fault {
    Fault {
        reason: Reason::Internal,
        url: String::new(),
        key: String::new(),
        detail: format!(
            "the {thread} thread panicked ({}): this pass cannot finish; please report it",
            panic_message(panic)
        ),
        kind: SourceKind::Other,
    }
}

struct Batcher {
    cfg: PipelineConfig,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    /// Taken by `run`.
    main: Option<ItemSource>,
    reserve: ReserveReader,
    slot_len: usize,
    /// A copy of one good sample of the last batch (its slot and pixels): what pads a planned
    /// batch whose every sample failed once the reserve is used up, so the rank still yields
    /// the batch every other rank yields.
    last_good: Option<(Slot, Vec<u8>)>,
}

#[derive(Clone)]
struct Slot {
    shard: u32,
    key: String,
    text: Option<String>,
}

impl Batcher {
    fn run(&mut self, buffers: Receiver<OutBuffer>, out: Sender<BatchResult>) {
        let Some(main) = self.main.take() else { return };
        let mut stream = BlockShuffle {
            source: main,
            block_size: self.cfg.block_size,
            seed: self.cfg.shuffle_seed,
            block_index: self.cfg.first_block,
            pending: vec![],
            order: vec![],
            pos: 0,
        };
        for _ in 0..self.cfg.skip_emitted {
            match stream.next() {
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        let b = self.cfg.batch_size;
        let mut produced = 0u64;
        loop {
            if self.stop.load(Ordering::Relaxed)
                || self.cfg.num_batches.is_some_and(|n| produced >= n)
            {
                return;
            }
            // Gather the batch's items first, so a short final batch is known before a buffer
            // is taken.
            let target = match (self.cfg.num_batches, self.cfg.last_batch_size) {
                (Some(n), Some(last)) if self.cfg.planned && produced + 1 == n => last.min(b),
                _ => b,
            };
            let mut items: Vec<Item> = Vec::with_capacity(target);
            while items.len() < target {
                match stream.next() {
                    Ok(Some(item)) => items.push(item),
                    Ok(None) => break,
                    Err(StreamError::ReaderLost(message)) => {
                        let message = message.unwrap_or_else(|| "it sent no message".into());
                        let _ = out.send(Err(panic_fault("shard reading", &message)));
                        return;
                    }
                    Err(StreamError::Failed(fault)) => {
                        let _ = out.send(Err(fault));
                        return;
                    }
                    Err(StreamError::Starved) => {
                        let _ = out.send(Err(Fault {
                            reason: Reason::Unreadable,
                            url: String::new(),
                            key: String::new(),
                            detail: "a full pass over this reader's shards produced no sample, so its batch quota \
                                     (samples_per_epoch) cannot be met: too few samples for the ranks x workers \
                                     sharing these shards, or every sample failed; build an index \
                                     (`shardstream index`) or use fewer workers"
                                .into(),
                            kind: SourceKind::Other,
                        }));
                        return;
                    }
                }
            }
            if items.is_empty() {
                return;
            }
            let Ok(buffer) = buffers.recv() else { return };
            assert!(buffer.len >= b * self.slot_len, "output buffer too small");
            // SAFETY: see OutBuffer; the caller keeps the memory alive until this batch returns.
            let memory = unsafe { std::slice::from_raw_parts_mut(buffer.ptr, b * self.slot_len) };
            match self.fill(items, memory, &mut stream, target) {
                Ok(Some(meta)) => {
                    if let (Some(tok), Some((ptr, len))) = (&self.cfg.tokenizer, buffer.tokens) {
                        let ctx = tok.context_length.max(1);
                        assert!(len >= b * ctx, "token buffer too small");
                        // SAFETY: as for the pixels (see OutBuffer).
                        let tokens = unsafe { std::slice::from_raw_parts_mut(ptr, b * ctx) };
                        tokens
                            .par_chunks_mut(ctx)
                            .zip(meta.texts.par_iter())
                            .for_each(|(row, text)| tok.tokenize_into(text, row));
                    }
                    produced += 1;
                    self.stats.record_sources(&self.cfg, &meta.shards);
                    self.stats.batches.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .samples
                        .fetch_add(meta.len as u64, Ordering::Relaxed);
                    if out.send(Ok(meta)).is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(fault) => {
                    let _ = out.send(Err(fault));
                    return;
                }
            }
        }
    }

    /// Decodes `items` into `memory`, replacing failures; `Ok(None)` when the stream ended
    /// before a full batch and `drop_last` discards it.
    fn fill(
        &mut self,
        items: Vec<Item>,
        memory: &mut [u8],
        stream: &mut BlockShuffle,
        target: usize,
    ) -> Result<Option<BatchMeta>, Fault> {
        let b = target;
        let cfg = &self.cfg;
        let started = Instant::now();
        let mut slots: Vec<(Slot, Result<String, Rejection>)> = memory
            .par_chunks_mut(self.slot_len)
            .zip(items.into_par_iter())
            .map(|(slot_mem, item)| match item {
                Item::Sample { shard, raw } => {
                    let r = prepare_into(&raw, shard, cfg, slot_mem);
                    (
                        Slot {
                            shard,
                            key: raw.key,
                            text: None,
                        },
                        r,
                    )
                }
                Item::Hole { shard, ordinal } => (
                    Slot {
                        shard,
                        key: format!("#{ordinal}"),
                        text: None,
                    },
                    Err((
                        Reason::Unreadable,
                        "sample could not be read (counted when the shard failed)".into(),
                    )),
                ),
            })
            .collect();
        self.stats
            .decode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut filled = 0usize;
        let mut good: Vec<bool> = Vec::with_capacity(b);
        for (slot, result) in slots.iter_mut() {
            match std::mem::replace(result, Ok(String::new())) {
                Ok(text) => {
                    slot.text = Some(text);
                    good.push(true);
                    filled += 1;
                }
                Err((reason, detail)) => {
                    let already_counted = reason == Reason::Unreadable && slot.key.starts_with('#');
                    let fault = Fault {
                        reason,
                        url: cfg.display(slot.shard),
                        key: slot.key.clone(),
                        detail,
                        kind: SourceKind::Other,
                    };
                    if cfg.on_error == OnError::Raise {
                        return Err(fault);
                    }
                    if !already_counted {
                        self.stats.record_skip(fault);
                    }
                    good.push(false);
                }
            }
        }
        // Refill failed slots: from the reserve when planned (positions are fixed), from the
        // stream otherwise.
        let slot_len = self.slot_len;
        for i in 0..slots.len() {
            if good[i] {
                continue;
            }
            let slot_mem = &mut memory[i * slot_len..(i + 1) * slot_len];
            loop {
                let next = if cfg.planned {
                    self.reserve.next(cfg, &self.stats)
                } else {
                    match stream.next() {
                        Ok(Some(Item::Sample { shard, raw })) => Some((shard, raw)),
                        Ok(Some(Item::Hole { .. })) => continue,
                        _ => None,
                    }
                };
                let Some((shard, raw)) = next else { break };
                match prepare_into(&raw, shard, cfg, slot_mem) {
                    Ok(text) => {
                        slots[i].0 = Slot {
                            shard,
                            key: raw.key,
                            text: Some(text),
                        };
                        good[i] = true;
                        filled += 1;
                        if cfg.planned {
                            self.stats.replaced.fetch_add(1, Ordering::Relaxed);
                        }
                        break;
                    }
                    Err((reason, detail)) => {
                        let fault = Fault {
                            reason,
                            url: cfg.display(shard),
                            key: raw.key.clone(),
                            detail,
                            kind: SourceKind::Other,
                        };
                        if cfg.on_error == OnError::Raise {
                            return Err(fault);
                        }
                        self.stats.record_skip(fault);
                    }
                }
            }
        }
        if filled == 0 && cfg.planned && !slots.is_empty() {
            if let Some((slot, pixels)) = &self.last_good {
                // Nothing of this batch is left to repeat: repeat the previous batch's sample.
                memory[..slot_len].copy_from_slice(pixels);
                slots[0].0 = slot.clone();
                good[0] = true;
                filled = 1;
                self.stats.padded.fetch_add(1, Ordering::Relaxed);
            }
        }
        if filled < b && cfg.planned && filled > 0 {
            // Reserve exhausted: repeat good samples of this batch so every rank still gets
            // the same number of full batches; each repeat is counted as padding.
            let donors: Vec<usize> = (0..slots.len()).filter(|&i| good[i]).collect();
            let mut d = 0;
            for i in 0..b {
                if i < slots.len() && good[i] {
                    continue;
                }
                let src = donors[d % donors.len()];
                d += 1;
                memory.copy_within(src * slot_len..(src + 1) * slot_len, i * slot_len);
                let donor = &slots[src].0;
                let copy = Slot {
                    shard: donor.shard,
                    key: donor.key.clone(),
                    text: donor.text.clone(),
                };
                if i < slots.len() {
                    slots[i].0 = copy;
                    good[i] = true;
                } else {
                    slots.push((copy, Ok(String::new())));
                    good.push(true);
                }
                self.stats.padded.fetch_add(1, Ordering::Relaxed);
                filled += 1;
            }
        }
        let first_shard = slots.first().map(|(s, _)| s.shard);
        // Compact the good slots to the front (only after failures in streaming mode).
        let mut keys = Vec::with_capacity(filled);
        let mut texts = Vec::with_capacity(filled);
        let mut shards = Vec::with_capacity(filled);
        let mut write = 0usize;
        for (read, (slot, _)) in slots.into_iter().enumerate() {
            if !good[read] {
                continue;
            }
            if read != write {
                memory.copy_within(read * slot_len..(read + 1) * slot_len, write * slot_len);
            }
            keys.push(slot.key);
            texts.push(slot.text.unwrap_or_default());
            shards.push(slot.shard);
            write += 1;
        }
        if write < b && cfg.drop_last && !cfg.planned {
            self.stats.record_remainder(keys);
            return Ok(None);
        }
        if write > 0 && cfg.planned {
            // One slot's copy per batch, into the same buffer every time: no allocation on the
            // batch path after the first.
            let (slot, pixels) = self.last_good.get_or_insert_with(|| {
                let slot = Slot {
                    shard: 0,
                    key: String::new(),
                    text: None,
                };
                (slot, vec![0u8; slot_len])
            });
            pixels.copy_from_slice(&memory[..slot_len]);
            slot.shard = shards[0];
            slot.key.clone_from(&keys[0]);
            match &mut slot.text {
                Some(text) => text.clone_from(&texts[0]),
                None => slot.text = Some(texts[0].clone()),
            }
        }
        if write == 0 && cfg.planned {
            // Ending here would leave this rank a batch short of the others (DDP would wait for
            // it forever): fail the pass, saying why.
            return Err(Fault {
                reason: Reason::Unreadable,
                url: first_shard.map(|s| cfg.display(s)).unwrap_or_default(),
                key: String::new(),
                detail: format!(
                    "all {b} samples of this rank's first batch failed and no reserve sample is \
                     left to replace them, so it cannot yield the batch every other rank yields; \
                     see the skipped samples in stats"
                ),
                kind: SourceKind::Other,
            });
        }
        if write == 0 {
            return Ok(None);
        }
        Ok(Some(BatchMeta {
            len: write,
            keys,
            texts,
            shards,
            reserve_used: self.reserve.used,
        }))
    }
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

    #[test]
    fn a_panic_while_preparing_a_sample_is_that_samples_internal_error() {
        let mut reset = false;
        let result: Result<(), Rejection> = guarded(|| panic!("bad table"), || reset = true);
        let (reason, detail) = result.unwrap_err();
        assert_eq!(reason, Reason::Internal);
        assert!(detail.contains("bad table"), "{detail}");
        assert!(reset, "the worker is replaced after a panic");
        let ok: Result<u8, Rejection> = guarded(|| Ok(7), || panic!("not reset when all is well"));
        assert_eq!(ok.unwrap(), 7);
    }

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
        let merged = |queue, span_count| MergedReader {
            queues: vec![queue],
            current: 0,
            span_count,
            cycle: false,
            spans_done: 0,
            items_since_cycle: 0,
        };
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
