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

use crate::defaults;
use crate::error::{Fault, Reason, SourceKind};
use crate::group::{is_gzip_name, open_shard, RawSample, SampleReader, ShardFault};
use crate::plan;
use crate::sample::{prepare, CaptionSource, Rejection, SampleSpec, Worker};
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
    /// Block j is emitted in `plan::block_order(shuffle_seed, j, len)` (see plan::BlockShuffle).
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
    /// What the pipeline cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("batch_size must be positive".into());
        }
        Ok(())
    }

    /// Bytes of one batch's images: `[batch_size, 3, image_size, image_size]` uint8.
    pub fn batch_bytes(&self) -> usize {
        let side = self.spec.image_size as usize;
        self.batch_size * 3 * side * side
    }

    /// int64 elements of one batch's tokens (0 without a tokenizer).
    pub fn token_len(&self) -> usize {
        self.tokenizer
            .as_ref()
            .map_or(0, |t| self.batch_size * t.context_length)
    }

    /// A mixture's sources, (first shard, caption key or None), as `sources` specs: each the
    /// loader's `spec` with its own caption where it names one.
    pub fn source_specs(&self, sources: Vec<(u32, Option<String>)>) -> Vec<(u32, SampleSpec)> {
        sources
            .into_iter()
            .map(|(first, caption)| {
                let mut spec = self.spec.clone();
                if let Some(key) = caption {
                    spec.caption = CaptionSource::parse(&key);
                }
                (first, spec)
            })
            .collect()
    }

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

    /// The fault of sample `key` of `shard`, rejected for `reason` (detail).
    fn sample_fault(&self, shard: u32, key: String, (reason, detail): Rejection) -> Fault {
        Fault {
            reason,
            url: self.display(shard),
            key,
            detail,
            kind: SourceKind::Other,
        }
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
            read_ahead: defaults::READ_AHEAD,
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
            max_member_bytes: defaults::MAX_MEMBER_BYTES,
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

impl Item {
    fn shard(&self) -> u32 {
        match self {
            Self::Sample { shard, .. } | Self::Hole { shard, .. } => *shard,
        }
    }
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

#[derive(Debug)]
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

/// The emitted stream: blocks of `block_size` items, each emitted in the order
/// [`plan::block_order`] gives it (the plan's definition; `seed` is the reader's
/// `plan::BlockShuffle::base_seed`, `block_index` the block's number in the reader's sequence).
struct ShuffledItems {
    source: ItemSource,
    block_size: usize,
    seed: u64,
    block_index: u64,
    pending: Vec<Option<Item>>,
    order: Vec<u32>,
    pos: usize,
}

impl ShuffledItems {
    fn new(source: ItemSource, cfg: &PipelineConfig) -> Self {
        Self {
            source,
            block_size: cfg.block_size,
            seed: cfg.shuffle_seed,
            block_index: cfg.first_block,
            pending: vec![],
            order: vec![],
            pos: 0,
        }
    }

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
                plan::block_order(self.seed, self.block_index, self.pending.len())
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

/// Where the sample in a batch slot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The stream's sample at this position of the batch.
    Stream,
    /// A planned batch's replacement for a failed sample, from the reserve spans.
    Reserve,
    /// A streaming batch's replacement for a failed sample: the stream's next sample.
    Next,
    /// A repeat of a good sample (of this batch, or the last batch's) that pads a planned batch
    /// whose failures the reserve could not replace.
    Padding,
}

/// A batch slot that holds a good sample (its pixels are in the slot's part of the buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot {
    shard: u32,
    key: String,
    text: String,
    origin: Origin,
}

/// What decoding one stream item into its slot gave.
#[derive(Debug)]
enum Decoded {
    Good(Slot),
    /// The sample was rejected; not counted yet.
    Rejected(Fault),
    /// A hole: the planned sample was lost with its shard and counted when the shard failed.
    Lost(Fault),
}

impl Batcher {
    fn run(&mut self, buffers: Receiver<OutBuffer>, out: Sender<BatchResult>) {
        let Some(main) = self.main.take() else { return };
        let mut stream = ShuffledItems::new(main, &self.cfg);
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
        stream: &mut ShuffledItems,
        target: usize,
    ) -> Result<Option<BatchMeta>, Fault> {
        let first_shard = items.first().map(Item::shard);
        let decoded = self.decode(items, memory);
        let mut slots = self.classify(decoded)?;
        self.refill(&mut slots, memory, stream)?;
        if self.cfg.planned {
            self.pad(&mut slots, memory, target);
        }
        self.assemble(slots, memory, target, first_shard)
    }

    /// Decodes item i into slot i of `memory`, in parallel on the decode threads.
    fn decode(&self, items: Vec<Item>, memory: &mut [u8]) -> Vec<Decoded> {
        let cfg = &self.cfg;
        let started = Instant::now();
        let decoded = memory
            .par_chunks_mut(self.slot_len)
            .zip(items.into_par_iter())
            .map(|(slot_mem, item)| match item {
                Item::Sample { shard, raw } => match prepare_into(&raw, shard, cfg, slot_mem) {
                    Ok(text) => Decoded::Good(Slot {
                        shard,
                        key: raw.key,
                        text,
                        origin: Origin::Stream,
                    }),
                    Err(rejection) => {
                        Decoded::Rejected(cfg.sample_fault(shard, raw.key, rejection))
                    }
                },
                Item::Hole { shard, ordinal } => Decoded::Lost(cfg.sample_fault(
                    shard,
                    format!("#{ordinal}"),
                    (
                        Reason::Unreadable,
                        "sample could not be read (counted when the shard failed)".into(),
                    ),
                )),
            })
            .collect();
        self.stats
            .decode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        decoded
    }

    /// The batch's slots with each failure left empty: a rejected sample is counted as a
    /// skip (a hole was counted when its shard failed); under `on_error = raise` the first
    /// failure ends the pass instead.
    fn classify(&self, decoded: Vec<Decoded>) -> Result<Vec<Option<Slot>>, Fault> {
        let raise = self.cfg.on_error == OnError::Raise;
        decoded
            .into_iter()
            .map(|d| match d {
                Decoded::Good(slot) => Ok(Some(slot)),
                Decoded::Rejected(fault) | Decoded::Lost(fault) if raise => Err(fault),
                Decoded::Rejected(fault) => {
                    self.stats.record_skip(fault);
                    Ok(None)
                }
                Decoded::Lost(_) => Ok(None),
            })
            .collect()
    }

    /// Fills the empty slots: from the reserve when planned (positions are fixed), from the
    /// stream's next samples otherwise. A slot stays empty once they run out.
    fn refill(
        &mut self,
        slots: &mut [Option<Slot>],
        memory: &mut [u8],
        stream: &mut ShuffledItems,
    ) -> Result<(), Fault> {
        let slot_len = self.slot_len;
        for (i, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = self.replacement(&mut memory[i * slot_len..(i + 1) * slot_len], stream)?;
            }
        }
        Ok(())
    }

    /// The next replacement sample that decodes, in `slot_mem` (each failure on the way
    /// counted as a skip); `None` when the reserve (planned) or the stream has no more.
    fn replacement(
        &mut self,
        slot_mem: &mut [u8],
        stream: &mut ShuffledItems,
    ) -> Result<Option<Slot>, Fault> {
        let cfg = &self.cfg;
        loop {
            let (next, origin) = if cfg.planned {
                (self.reserve.next(cfg, &self.stats), Origin::Reserve)
            } else {
                match stream.next() {
                    Ok(Some(Item::Sample { shard, raw })) => (Some((shard, raw)), Origin::Next),
                    Ok(Some(Item::Hole { .. })) => continue,
                    _ => (None, Origin::Next),
                }
            };
            let Some((shard, raw)) = next else {
                return Ok(None);
            };
            match prepare_into(&raw, shard, cfg, slot_mem) {
                Ok(text) => {
                    return Ok(Some(Slot {
                        shard,
                        key: raw.key,
                        text,
                        origin,
                    }))
                }
                Err(rejection) => {
                    let fault = cfg.sample_fault(shard, raw.key, rejection);
                    if cfg.on_error == OnError::Raise {
                        return Err(fault);
                    }
                    self.stats.record_skip(fault);
                }
            }
        }
    }

    /// Pads a planned batch whose failures the reserve could not replace, so that every rank
    /// still yields the same full batches: with no good sample left, slot 0 repeats the last
    /// batch's; then the empty slots, up to `target`, repeat the good ones in turn.
    fn pad(&self, slots: &mut Vec<Option<Slot>>, memory: &mut [u8], target: usize) {
        let slot_len = self.slot_len;
        if !slots.is_empty() && slots.iter().all(Option::is_none) {
            if let Some((slot, pixels)) = &self.last_good {
                memory[..slot_len].copy_from_slice(pixels);
                slots[0] = Some(Slot {
                    origin: Origin::Padding,
                    ..slot.clone()
                });
            }
        }
        let donors: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_some()).collect();
        if donors.is_empty() {
            return;
        }
        if slots.len() < target {
            slots.resize(target, None);
        }
        let empty: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_none()).collect();
        for (d, i) in empty.into_iter().enumerate() {
            let src = donors[d % donors.len()];
            memory.copy_within(src * slot_len..(src + 1) * slot_len, i * slot_len);
            slots[i] = slots[src].as_ref().map(|donor| Slot {
                origin: Origin::Padding,
                ..donor.clone()
            });
        }
    }

    /// The finished batch: good slots moved to the front (gaps are left only by failures in
    /// streaming mode), replacements and padding counted. `Ok(None)` when nothing is left, or
    /// a short streaming batch that `drop_last` discards (its keys are the remainder).
    fn assemble(
        &mut self,
        slots: Vec<Option<Slot>>,
        memory: &mut [u8],
        target: usize,
        first_shard: Option<u32>,
    ) -> Result<Option<BatchMeta>, Fault> {
        let slot_len = self.slot_len;
        let mut keys = Vec::with_capacity(slots.len());
        let mut texts = Vec::with_capacity(slots.len());
        let mut shards = Vec::with_capacity(slots.len());
        let (mut replaced, mut padded) = (0u64, 0u64);
        for (read, slot) in slots.into_iter().enumerate() {
            let Some(slot) = slot else { continue };
            let write = keys.len();
            if read != write {
                memory.copy_within(read * slot_len..(read + 1) * slot_len, write * slot_len);
            }
            match slot.origin {
                Origin::Reserve => replaced += 1,
                Origin::Padding => padded += 1,
                Origin::Stream | Origin::Next => {}
            }
            keys.push(slot.key);
            texts.push(slot.text);
            shards.push(slot.shard);
        }
        self.stats.replaced.fetch_add(replaced, Ordering::Relaxed);
        self.stats.padded.fetch_add(padded, Ordering::Relaxed);
        let cfg = &self.cfg;
        let len = keys.len();
        if len < target && cfg.drop_last && !cfg.planned {
            self.stats.record_remainder(keys);
            return Ok(None);
        }
        if len == 0 && cfg.planned {
            // Ending here would leave this rank a batch short of the others (DDP would wait for
            // it forever): fail the pass, saying why.
            return Err(Fault {
                reason: Reason::Unreadable,
                url: first_shard.map(|s| cfg.display(s)).unwrap_or_default(),
                key: String::new(),
                detail: format!(
                    "all {target} samples of this rank's first batch failed and no reserve sample \
                     is left to replace them, so it cannot yield the batch every other rank \
                     yields; see the skipped samples in stats"
                ),
                kind: SourceKind::Other,
            });
        }
        if len == 0 {
            return Ok(None);
        }
        if cfg.planned {
            self.keep_last_good(&memory[..slot_len], shards[0], &keys[0], &texts[0]);
        }
        Ok(Some(BatchMeta {
            len,
            keys,
            texts,
            shards,
            reserve_used: self.reserve.used,
        }))
    }

    /// Remembers a good sample of this batch for [`Batcher::pad`]: one slot's copy, into the
    /// same buffer every time, so no allocation on the batch path after the first.
    fn keep_last_good(&mut self, pixels: &[u8], shard: u32, key: &str, text: &str) {
        let (slot, copy) = self.last_good.get_or_insert_with(|| {
            let slot = Slot {
                shard: 0,
                key: String::new(),
                text: String::new(),
                origin: Origin::Stream,
            };
            (slot, vec![0u8; pixels.len()])
        });
        copy.copy_from_slice(pixels);
        slot.shard = shard;
        key.clone_into(&mut slot.key);
        text.clone_into(&mut slot.text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::fixtures::{jpeg, raw, scratch_dir, tar_of};
    use std::path::Path;

    /// 8 x 8 output images: 192 bytes a slot.
    const SIZE: u32 = 8;
    const SLOT: usize = 3 * 8 * 8;

    /// Writes a shard of these samples (key, has a good image): a good one holds a JPEG and a
    /// caption, a bad one a caption only (`missing_image`).
    fn shard(dir: &Path, name: &str, samples: &[(&str, bool)]) -> String {
        let image = jpeg(16, 12);
        let names: Vec<(String, String)> = samples
            .iter()
            .map(|(k, _)| (format!("{k}.jpg"), format!("{k}.txt")))
            .collect();
        let mut members: Vec<(&str, &[u8])> = Vec::new();
        for ((key, good), (jpg, txt)) in samples.iter().zip(&names) {
            if *good {
                members.push((jpg, &image));
            }
            members.push((txt, key.as_bytes()));
        }
        let path = dir.join(name);
        std::fs::write(&path, tar_of(&members)).unwrap();
        path.display().to_string()
    }

    /// The span of samples `0..n` of a shard (`n` planned positions).
    fn span(url: &str, shard: u32, n: u64) -> ShardSpan {
        ShardSpan {
            url: url.into(),
            shard,
            start_offset: 0,
            first_ordinal: 0,
            skip_before: 0,
            end_ordinal: Some(n),
            stride: None,
            display: format!("shard-{shard}"),
            detail: None,
            expected: Expected::default(),
            keep: None,
            keep_bytes: None,
            selection: None,
        }
    }

    fn config(batch_size: usize, planned: bool) -> PipelineConfig {
        PipelineConfig {
            spec: SampleSpec {
                image_size: SIZE,
                ..SampleSpec::default()
            },
            batch_size,
            planned,
            ..PipelineConfig::default()
        }
    }

    /// A batch and a copy of its buffer, or the pass's fault.
    type Outcome = Result<(BatchMeta, Vec<u8>), Fault>;

    /// Runs a real pipeline to its end: every batch (or fault), with its pixels, and the stats.
    fn run(
        main: Vec<ShardSpan>,
        reserve: Vec<ShardSpan>,
        cfg: PipelineConfig,
    ) -> (Vec<Outcome>, Arc<Stats>) {
        let b = cfg.batch_size;
        let pipeline = Pipeline::start(MainSpans::Spans(main), reserve, cfg);
        let mut buffers: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; b * SLOT]).collect();
        for buffer in &mut buffers {
            assert!(pipeline.submit(OutBuffer {
                ptr: buffer.as_mut_ptr(),
                len: buffer.len(),
                owner: None,
                tokens: None,
            }));
        }
        let mut out = Vec::new();
        while let Some(batch) = pipeline.next_batch() {
            let pixels = buffers[out.len()].clone();
            out.push(batch.map(|meta| (meta, pixels)));
        }
        let stats = pipeline.stats.clone();
        drop(pipeline);
        (out, stats)
    }

    fn keys(batches: &[Outcome]) -> Vec<Vec<String>> {
        batches
            .iter()
            .map(|b| b.as_ref().expect("a batch").0.keys.clone())
            .collect()
    }

    /// A batcher on its own (no reader threads), for its phases.
    fn batcher(cfg: PipelineConfig, reserve: Vec<ShardSpan>) -> Batcher {
        Batcher {
            slot_len: 3 * (cfg.spec.image_size as usize).pow(2),
            cfg,
            stats: Arc::default(),
            stop: Arc::default(),
            main: None,
            reserve: ReserveReader::new(reserve),
            last_good: None,
        }
    }

    /// A stream with nothing in it.
    fn no_stream() -> ShuffledItems {
        let empty = MergedReader {
            queues: vec![],
            current: 0,
            span_count: 0,
            cycle: false,
            spans_done: 0,
            items_since_cycle: 0,
        };
        ShuffledItems::new(ItemSource::Merged(empty), &PipelineConfig::default())
    }

    fn good(key: &str, origin: Origin) -> Option<Slot> {
        Some(Slot {
            shard: 0,
            key: key.into(),
            text: format!("caption of {key}"),
            origin,
        })
    }

    #[test]
    fn decode_then_classify_counts_a_rejection_and_not_a_hole_counted_with_its_shard() {
        let image = jpeg(16, 12);
        let items = || {
            vec![
                Item::Sample {
                    shard: 0,
                    raw: raw("a", &[("jpg", &image), ("txt", b" a cat ")]),
                },
                Item::Sample {
                    shard: 0,
                    raw: raw("b", &[("txt", b"no image")]),
                },
                Item::Hole {
                    shard: 0,
                    ordinal: 7,
                },
            ]
        };
        let skip = batcher(config(3, true), vec![]);
        let mut memory = vec![0u8; 3 * SLOT];
        let decoded = skip.decode(items(), &mut memory);
        assert!(matches!(&decoded[0], Decoded::Good(s) if s.key == "a" && s.text == "a cat"));
        assert!(matches!(&decoded[1], Decoded::Rejected(f) if f.reason == Reason::MissingImage));
        assert!(matches!(&decoded[2], Decoded::Lost(f) if f.key == "#7"));
        assert!(
            memory[..SLOT].iter().any(|&p| p != 0),
            "a's pixels are in slot 0"
        );
        let slots = skip.classify(decoded).unwrap();
        assert_eq!(
            slots,
            vec![
                good("a", Origin::Stream).map(|s| Slot {
                    text: "a cat".into(),
                    ..s
                }),
                None,
                None
            ]
        );
        let stats = skip.stats.snapshot();
        assert_eq!(stats["skipped"], serde_json::json!({"missing_image": 1}));
        assert_eq!(stats["faults"][0]["key"], "b");

        let raise = batcher(
            PipelineConfig {
                on_error: OnError::Raise,
                ..config(3, true)
            },
            vec![],
        );
        let decoded = raise.decode(items(), &mut memory);
        let fault = raise.classify(decoded).unwrap_err();
        assert_eq!(
            (fault.reason, fault.key.as_str()),
            (Reason::MissingImage, "b")
        );
        assert_eq!(raise.stats.snapshot()["skipped_total"], 0);
    }

    #[test]
    fn refill_takes_the_reserve_s_next_good_sample_when_planned() {
        let dir = scratch_dir("pipeline-refill");
        let reserve = shard(&dir, "r.tar", &[("r0", false), ("r1", true), ("r2", true)]);
        let mut planned = batcher(config(2, true), vec![span(&reserve, 5, 3)]);
        let mut slots = vec![good("a", Origin::Stream), None];
        let mut memory = vec![0u8; 2 * SLOT];
        planned
            .refill(&mut slots, &mut memory, &mut no_stream())
            .unwrap();
        let refilled = slots[1].as_ref().expect("refilled");
        assert_eq!(
            (refilled.key.as_str(), refilled.shard, refilled.origin),
            ("r1", 5, Origin::Reserve)
        );
        assert!(
            memory[SLOT..].iter().any(|&p| p != 0),
            "r1's pixels are in slot 1"
        );
        // r0 was rejected on the way (and counted); two reserve positions are used.
        assert_eq!(planned.stats.snapshot()["skipped"]["missing_image"], 1);
        assert_eq!(planned.reserve.used, 2);
        // With the reserve used up, a failed slot stays empty.
        let mut slots = vec![None, None];
        planned
            .refill(&mut slots, &mut memory, &mut no_stream())
            .unwrap();
        assert_eq!(slots[0].as_ref().map(|s| s.key.as_str()), Some("r2"));
        assert_eq!(slots[1], None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pad_repeats_the_good_slots_then_falls_back_on_the_last_batch_s_sample() {
        let mut planned = batcher(config(4, true), vec![]);
        let mut memory = vec![0u8; 4 * SLOT];
        memory[..SLOT].fill(1);
        memory[SLOT..2 * SLOT].fill(2);
        let mut slots = vec![good("a", Origin::Stream), good("b", Origin::Reserve), None];
        planned.pad(&mut slots, &mut memory, 4);
        let got: Vec<(&str, Origin)> = slots
            .iter()
            .map(|s| s.as_ref().map(|s| (s.key.as_str(), s.origin)).unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", Origin::Stream),
                ("b", Origin::Reserve),
                ("a", Origin::Padding),
                ("b", Origin::Padding)
            ]
        );
        assert!(memory[2 * SLOT..3 * SLOT].iter().all(|&p| p == 1));
        assert!(memory[3 * SLOT..].iter().all(|&p| p == 2));
        // Nothing good and no earlier batch: nothing to pad with.
        let mut slots = vec![None, None];
        planned.pad(&mut slots, &mut memory, 2);
        assert_eq!(slots, vec![None, None]);
        // After a batch, its first sample pads a batch whose every sample failed.
        let meta = planned
            .assemble(vec![good("c", Origin::Stream)], &mut memory, 1, Some(0))
            .unwrap()
            .unwrap();
        assert_eq!(meta.keys, vec!["c"]);
        memory.fill(9);
        let mut slots = vec![None, None];
        planned.pad(&mut slots, &mut memory, 2);
        assert_eq!(
            slots,
            vec![good("c", Origin::Padding), good("c", Origin::Padding)]
        );
        assert!(
            memory[..2 * SLOT].iter().all(|&p| p == 1),
            "c's pixels (slot 0 then)"
        );
    }

    #[test]
    fn assemble_moves_good_slots_forward_counts_origins_and_ends_as_the_mode_says() {
        let mut streaming = batcher(config(2, false), vec![]);
        let mut memory = vec![0u8; 3 * SLOT];
        memory[SLOT..2 * SLOT].fill(2);
        memory[2 * SLOT..].fill(3);
        let slots = vec![None, good("b", Origin::Stream), good("c", Origin::Next)];
        let meta = streaming
            .assemble(slots, &mut memory, 2, Some(0))
            .unwrap()
            .unwrap();
        assert_eq!(
            (meta.len, meta.keys),
            (2, vec!["b".to_string(), "c".into()])
        );
        assert_eq!(meta.texts, vec!["caption of b", "caption of c"]);
        assert!(memory[..SLOT].iter().all(|&p| p == 2));
        assert!(memory[SLOT..2 * SLOT].iter().all(|&p| p == 3));
        assert!(
            streaming.last_good.is_none(),
            "only planned batches keep a sample"
        );
        // A short streaming batch under drop_last is the remainder.
        let short = streaming
            .assemble(
                vec![good("d", Origin::Stream), None],
                &mut memory,
                2,
                Some(0),
            )
            .unwrap();
        assert!(short.is_none());
        assert_eq!(
            streaming.stats.snapshot()["remainder_keys"],
            serde_json::json!(["d"])
        );

        let mut planned = batcher(config(3, true), vec![]);
        let slots = vec![
            good("a", Origin::Reserve),
            good("a", Origin::Padding),
            good("b", Origin::Padding),
        ];
        planned
            .assemble(slots, &mut memory, 3, Some(0))
            .unwrap()
            .unwrap();
        let stats = planned.stats.snapshot();
        assert_eq!(
            (stats["replaced"].as_u64(), stats["padded"].as_u64()),
            (Some(1), Some(2))
        );
        // A planned batch with nothing at all fails the pass rather than ending it short.
        let mut fresh = batcher(config(2, true), vec![]);
        fresh.cfg.display_urls = Arc::new(HashMap::from([(4, "shard-four".to_string())]));
        let fault = fresh
            .assemble(vec![None, None], &mut memory, 2, Some(4))
            .unwrap_err();
        assert_eq!(
            (fault.reason, fault.url.as_str()),
            (Reason::Unreadable, "shard-four")
        );
        assert!(fault.detail.contains("all 2 samples"), "{}", fault.detail);
    }

    #[test]
    fn a_planned_pipeline_replaces_a_rejected_sample_from_the_reserve() {
        let dir = scratch_dir("pipeline-planned");
        let main = shard(
            &dir,
            "a.tar",
            &[("k0", true), ("k1", true), ("k2", false), ("k3", true)],
        );
        let reserve = shard(&dir, "r.tar", &[("r0", true), ("r1", true)]);
        let cfg = PipelineConfig {
            num_batches: Some(2),
            ..config(2, true)
        };
        let (batches, stats) = run(vec![span(&main, 0, 4)], vec![span(&reserve, 1, 2)], cfg);
        assert_eq!(keys(&batches), vec![vec!["k0", "k1"], vec!["r0", "k3"]]);
        let (meta, pixels) = batches[1].as_ref().unwrap();
        assert_eq!((meta.shards.clone(), meta.reserve_used), (vec![1, 0], 1));
        assert!(pixels[..SLOT].iter().any(|&p| p != 0));
        let stats = stats.snapshot();
        assert_eq!(stats["skipped"], serde_json::json!({"missing_image": 1}));
        assert_eq!(
            (stats["replaced"].as_u64(), stats["samples"].as_u64()),
            (Some(1), Some(4))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_shard_s_holes_are_counted_once_and_padded_when_no_reserve_is_left() {
        let dir = scratch_dir("pipeline-holes");
        let main = shard(
            &dir,
            "a.tar",
            &[("k0", true), ("k1", true), ("k2", true), ("k3", true)],
        );
        let missing = dir.join("missing.tar").display().to_string();
        let cfg = PipelineConfig {
            num_batches: Some(2),
            ..config(3, true)
        };
        let (batches, stats) = run(vec![span(&main, 0, 4), span(&missing, 1, 2)], vec![], cfg);
        assert_eq!(
            keys(&batches),
            vec![vec!["k0", "k1", "k2"], vec!["k3", "k3", "k3"]]
        );
        let stats = stats.snapshot();
        // Each lost position is one skip, counted when the shard failed (not again per slot).
        assert_eq!(stats["skipped"], serde_json::json!({"unreadable": 2}));
        let faults: Vec<&str> = stats["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["key"].as_str().unwrap())
            .collect();
        assert_eq!(faults, vec!["#0", "#1"]);
        assert_eq!(stats["padded"], 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_streaming_pipeline_takes_the_next_sample_for_a_failure_and_drops_the_remainder() {
        let dir = scratch_dir("pipeline-streaming");
        let samples = [
            ("k0", true),
            ("k1", false),
            ("k2", true),
            ("k3", true),
            ("k4", true),
            ("k5", true),
        ];
        let main = shard(&dir, "a.tar", &samples);
        let mut streaming = span(&main, 0, 0);
        streaming.end_ordinal = None;
        let (batches, stats) = run(vec![streaming], vec![], config(2, false));
        assert_eq!(keys(&batches), vec![vec!["k0", "k2"], vec!["k3", "k4"]]);
        let stats = stats.snapshot();
        assert_eq!(stats["remainder_keys"], serde_json::json!(["k5"]));
        assert_eq!(
            (stats["replaced"].as_u64(), stats["skipped_total"].as_u64()),
            (Some(0), Some(1))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_pipeline_emits_each_block_in_the_plan_s_block_order() {
        let dir = scratch_dir("pipeline-blocks");
        let names: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let samples: Vec<(&str, bool)> = names.iter().map(|k| (k.as_str(), true)).collect();
        let main = shard(&dir, "a.tar", &samples);
        let cfg = PipelineConfig {
            block_size: 4,
            shuffle_seed: 99,
            first_block: 3,
            num_batches: Some(2),
            ..config(5, true)
        };
        let (batches, _) = run(vec![span(&main, 0, 10)], vec![], cfg);
        let got: Vec<String> = keys(&batches).concat();
        let mut want = Vec::new();
        for (j, block) in names.chunks(4).enumerate() {
            for i in plan::block_order(99, 3 + j as u64, block.len()) {
                want.push(block[i as usize].clone());
            }
        }
        assert_eq!(got, want);
        assert_ne!(got, names, "the blocks are shuffled");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
