//! The video-text CLIP kind on the pipeline: one reader's clips, in stream order, decoded at
//! their sampled frames straight into lent buffers as `uint8 [B, T, 3, S, S]`.
//!
//! ```text
//! read thread (kit::read_thread over the reader's visits): each visited unit's samples judged
//!   from their headers (clips::judge), the clips of the reader's positions sent in chunks
//!   ──▶ batcher: B clips, each decoded on the pool into its slot (clips::decode_clip)
//!   ──▶ (clips, texts, keys, urls, frame indices)
//! ```
//!
//! A position of the plan is a clip (`plan::unit_stream` with batch_size B and one position a
//! row). A unit's clips are numbered as the count pass numbered them, by the same judgement: a
//! unit that runs out of clips before the reader's positions in it (a file changed since the
//! count) fails the pass, naming it. A clip whose header passed but whose frames fail to decode
//! is dropped from its batch, counted by reason: the batch is one clip shorter, and every rank
//! still yields the same number of batches. Memory is bounded by the chunks in flight (each at
//! most `CHUNK_BYTES` of clips, or a batch of them) and the lent buffers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use super::clips::{decode_clip, judge, ClipShape, ClipSpec, DecodedClip};
use crate::batch::kit::read_thread::{self, Chunk, ChunkBounds};
use crate::batch::kit::sample::Rejection;
use crate::batch::kit::slots::{keep_decoded, tokenize_captions};
use crate::batch::kit::unit::{open_samples, unit_fault, Unit};
use crate::batch::kit::visits::{visits, Visit};
use crate::batch::pipeline::{Kind, KindStats, Lent, Need, Pipeline, Setup};
use crate::error::{Fault, Reason, SourceKind};
use crate::plan::unit_stream::{slice, StreamReader, UnitOrder};
use crate::read::group::RawSample;
use crate::read::source::{SourceOptions, SourceStats};
use crate::tokenize::ClipTokenizer;

/// Chunks of clips waiting between the read thread and the batcher.
const CHUNKS_AHEAD: usize = 2;
/// A chunk is sent at this many bytes of clips, or at a batch of them.
const CHUNK_BYTES: usize = 64 << 20;

/// What the reader is given: every unit, its clips as counted, and how a batch is made.
pub struct ClipInput {
    pub units: Arc<Vec<Unit>>,
    pub unit_clips: Arc<Vec<u64>>,
    pub spec: ClipSpec,
    pub shape: ClipShape,
    pub batch_size: u32,
    pub source: SourceOptions,
    /// Tokenizes the captions into the lent token buffer (`[B, context_length]` int64).
    pub tokenizer: Option<Arc<ClipTokenizer>>,
}

/// One finished batch: its first `clips * T * 3 * S * S` bytes hold `[clips, T, 3, S, S]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClipBatchMeta {
    pub clips: usize,
    pub texts: Vec<String>,
    pub keys: Vec<String>,
    pub urls: Vec<String>,
    /// Each clip's sampled frame numbers.
    pub indices: Vec<Vec<u32>>,
}

/// The reader's counters.
#[derive(Default)]
pub struct ClipStats {
    pub batches: AtomicU64,
    pub clips: AtomicU64,
    /// Frames sampled into batches, and frames the decoder output for them.
    pub frames: AtomicU64,
    pub frames_decoded: AtomicU64,
    pub decode_us: AtomicU64,
    pub source: Arc<SourceStats>,
    /// Clips dropped from their batch at decode, by reason.
    pub skipped: Mutex<BTreeMap<String, u64>>,
}

impl KindStats for ClipStats {
    fn snapshot(&self) -> serde_json::Value {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "batches": load(&self.batches),
            "clips": load(&self.clips),
            "frames": load(&self.frames),
            "frames_decoded": load(&self.frames_decoded),
            "decode_seconds": load(&self.decode_us) as f64 / 1e6,
            "bytes": self.source.bytes.load(Ordering::Relaxed),
            "retries": self.source.retries.load(Ordering::Relaxed),
            "skipped": *self.skipped.lock().expect("stats lock"),
        })
    }
}

/// A clip on its way to a batch, with the unit it came from.
struct Pending {
    raw: RawSample,
    display: Arc<str>,
}

/// The running CLIP clip pipeline of one reader.
pub type ClipPipeline = Pipeline<ClipBatches, ClipStats>;

/// The video CLIP kind on the pipeline.
pub struct ClipBatches {
    batches_left: u64,
    input: Arc<ClipInput>,
    stats: Arc<ClipStats>,
    chunks: Receiver<(usize, Chunk<Pending>)>,
    pending: VecDeque<Pending>,
    /// The read thread has sent its last chunk.
    ended: bool,
}

/// Starts the pipeline of `reader`, whose positions are clips (batch_size B, one a row).
pub fn start(
    input: Arc<ClipInput>,
    order: &UnitOrder,
    reader: StreamReader,
    threads: usize,
) -> ClipPipeline {
    let stats = Arc::new(ClipStats::default());
    let ranges = slice(&reader.ranges, reader.skip_rows, reader.rows);
    let planned = visits(order, &ranges);
    let batches_left = reader.batches_left(input.batch_size);
    let batch = input.batch_size as usize;
    let token_bytes = input
        .tokenizer
        .as_ref()
        .map_or(0, |t| batch * t.context_length.max(1) * 8);
    let setup = Setup {
        threads,
        stage: "decode",
        needs: vec![
            Need {
                name: "frame",
                bytes: batch * input.shape.slot_bytes(),
            },
            Need {
                name: "token",
                bytes: token_bytes,
            },
        ],
        batches_left: Some(batches_left),
    };
    let batch_stats = stats.clone();
    Pipeline::start(setup, stats, move |stop| {
        let (tx, chunks) = bounded(CHUNKS_AHEAD);
        {
            let (input, stats) = (input.clone(), batch_stats.clone());
            std::thread::Builder::new()
                .name("shardstream-video-read".into())
                .spawn(move || read_visits(&planned, &input, &stats.source, &stop, &tx))
                .expect("a read thread");
        }
        ClipBatches {
            batches_left,
            input,
            stats: batch_stats,
            chunks,
            pending: VecDeque::new(),
            ended: false,
        }
    })
}

/// Sends the clips of every visit's positions, in chunks (the kit's walk).
fn read_visits(
    visits: &[Visit],
    input: &ClipInput,
    source: &Arc<SourceStats>,
    stop: &AtomicBool,
    out: &Sender<(usize, Chunk<Pending>)>,
) {
    let open = |visit: &Visit| {
        let unit = &input.units[visit.unit as usize];
        let counted = input.unit_clips[visit.unit as usize];
        let spec = &input.spec;
        let samples = open_samples(
            unit,
            &spec.sample,
            spec.max_member_bytes,
            &input.source,
            source,
        )?;
        Ok(VisitClips {
            samples,
            spans: visit.spans.clone(),
            display: unit.display().into(),
            counted,
            next: 0,
            spec,
        })
    };
    let bounds = ChunkBounds {
        items: input.batch_size as usize,
        bytes: CHUNK_BYTES,
    };
    let size = |p: &Pending| p.raw.members.iter().map(|m| m.1.len()).sum::<usize>();
    let opened = |visit: &Visit| open(visit).map(|mut clips| move || clips.next_clip());
    read_thread::read_visits(visits, bounds, opened, size, |_| false, stop, out);
}

/// The clips of one visit: the unit's samples judged in file order, the clips numbered, the
/// ones in the visit's spans handed out.
struct VisitClips<'a> {
    samples: crate::batch::kit::unit::Samples,
    spans: Vec<(u64, u64)>,
    display: Arc<str>,
    counted: u64,
    /// The unit-local number of the next clip.
    next: u64,
    spec: &'a ClipSpec,
}

impl VisitClips<'_> {
    fn next_clip(&mut self) -> Option<Result<Pending, Fault>> {
        let last = self.spans.last().map_or(0, |s| s.1);
        let fault = |reason, detail: String| {
            Err(unit_fault(&self.display, reason, detail, SourceKind::Other))
        };
        loop {
            if self.next >= last {
                return None;
            }
            let raw = match self.samples.next() {
                None => {
                    let (next, counted) = (self.next, self.counted);
                    return Some(fault(
                        Reason::Unreadable,
                        format!(
                            "holds {next} clips, but was counted with {counted}: the file changed since the count (count again)"
                        ),
                    ));
                }
                Some(Err(f)) => return Some(fault(f.reason, f.detail)),
                Some(Ok(raw)) => raw,
            };
            match judge(&raw, self.spec) {
                Err(unavailable) => return Some(fault(Reason::Internal, unavailable.to_string())),
                Ok(Err(_)) => continue, // not a clip: counted by the count pass
                Ok(Ok(_)) => {}
            }
            let number = self.next;
            self.next += 1;
            if self.spans.iter().any(|&(a, b)| a <= number && number < b) {
                return Some(Ok(Pending {
                    raw,
                    display: self.display.clone(),
                }));
            }
        }
    }
}

impl Kind for ClipBatches {
    type Meta = ClipBatchMeta;

    fn next_batch(
        &mut self,
        lend: &mut dyn FnMut() -> Option<Lent>,
    ) -> Option<Result<ClipBatchMeta, Fault>> {
        if self.batches_left == 0 {
            return None;
        }
        let mut lent = lend()?;
        self.batches_left -= 1;
        let batch = self.input.batch_size as usize;
        while self.pending.len() < batch && !self.ended {
            match self.chunks.recv() {
                Ok((_, Chunk::Items(items))) => self.pending.extend(items),
                Ok((_, Chunk::End)) => {}
                Ok((_, Chunk::Failed(fault))) => return Some(Err(fault)),
                Err(_) => self.ended = true,
            }
        }
        if self.pending.len() < batch {
            return Some(Err(Fault {
                reason: Reason::Internal,
                url: String::new(),
                key: String::new(),
                detail: "the read thread ended before the planned clips".into(),
                kind: SourceKind::Other,
            }));
        }
        let clips: Vec<Pending> = self.pending.drain(..batch).collect();
        Some(fill(&mut lent, clips, &self.input, &self.stats))
    }
}

/// Decodes `clips` into the lent buffer; a clip that fails is dropped and the rest moved up.
fn fill(
    lent: &mut Lent,
    clips: Vec<Pending>,
    input: &ClipInput,
    stats: &ClipStats,
) -> Result<ClipBatchMeta, Fault> {
    let slot = input.shape.slot_bytes();
    // The pipeline checked the lent region against a full batch.
    let out = lent
        .values::<u8>(0, slot * clips.len())
        .expect("a lent frame region");
    let started = Instant::now();
    let results: Vec<Result<Result<DecodedClip, Rejection>, _>> = out
        .par_chunks_mut(slot.max(1))
        .zip(clips.par_iter())
        .map(|(dst, clip)| decode_clip(&clip.raw, &input.spec, input.shape, dst))
        .collect();
    stats
        .decode_us
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    let mut meta = ClipBatchMeta {
        clips: 0,
        texts: Vec::new(),
        keys: Vec::new(),
        urls: Vec::new(),
        indices: Vec::new(),
    };
    // A missing FFmpeg is no clip's fault: the pass fails on it.
    let results = results
        .into_iter()
        .zip(&clips)
        .map(|(result, clip)| {
            result.map_err(|unavailable| Fault {
                reason: Reason::Internal,
                url: clip.display.to_string(),
                key: clip.raw.key.clone(),
                detail: unavailable.to_string(),
                kind: SourceKind::Other,
            })
        })
        .collect::<Result<Vec<_>, Fault>>()?;
    for (i, decoded) in keep_decoded(out, slot, results, &stats.skipped) {
        meta.clips += 1;
        stats
            .frames
            .fetch_add(decoded.indices.len() as u64, Ordering::Relaxed);
        stats
            .frames_decoded
            .fetch_add(decoded.frames_decoded, Ordering::Relaxed);
        meta.texts.push(decoded.text);
        meta.keys.push(clips[i].raw.key.clone());
        meta.urls.push(clips[i].display.to_string());
        meta.indices.push(decoded.indices);
    }
    tokenize_captions(lent, 1, input.tokenizer.as_deref(), &meta.texts);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.clips.fetch_add(meta.clips as u64, Ordering::Relaxed);
    Ok(meta)
}
