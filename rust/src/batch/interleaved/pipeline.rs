//! The interleaved pipeline of one reader: the batches its plan gives it, in stream order.
//!
//! ```text
//! read thread (visited units, file order): documents in chunks ──▶ batcher, on the pool:
//!   measure a chunk (tokenize, image headers), pack, keep this reader's planned batches,
//!   decode their images into the lent buffer ──▶ ids, labels, positions, pixel_values
//!   (positions: each document's run as if alone, `positions`)
//! ```
//!
//! Memory is bounded by configuration: a few chunks of documents, one unit's open batch, the
//! planned batches waiting, and the buffers the caller lends. A unit read to its end must make
//! the batches it was counted with; anything else (a changed file, another tokenizer) fails the
//! pass naming it. An image whose header parsed but which fails to decode is dropped from its
//! batch and counted: its tokens become padding (masked), the rest of its document stays, and
//! every rank still yields the same batches.
//!
//! **Whole documents.** A document cut across batches is trained on only when the epoch reads
//! every batch that holds a part of it. The batches no rank reads this epoch (`unread`: the
//! plan's remainder, and past a mixture's end) are known before the pass; a document with a
//! run in any of them is *cut*: where its runs are read, they stay in their rows as context
//! (isolated, as every run is) with no label, and the document is counted once, in
//! `cut_documents`, by the reader of its first batch that is read. A document is thus learned
//! whole or not at all in an epoch. A mixture's source resumed onto another world size reads
//! every batch left (a padded phase, `plan::unit_stream::Rest::Padded`): its reader's positions past
//! the stream's end are batches of padding, counted in `padding_batches`, so that a document
//! begun before the resume is never left with a batch no rank reads.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use super::count::{measure_chunk, CHUNK};
use super::documents::{DocumentResult, UnitDocuments};
use super::measure::Item;
use super::pack::{Cursor, PackedBatch, Packer};
use super::positions::{write_run, PositionRows};
use super::qwen_vl::Grid;
use super::videos::decode_video;
use super::vision::VisionSpec;
use super::InterleavedSpec;
use crate::batch::kit::sample::{Rejection, Worker};
// The kit's `Unit` under its old name, so that this file's body is unchanged by the move.
use crate::batch::kit::read_thread::{self, ChunkBounds};
use crate::batch::kit::unit::Unit;
use crate::batch::kit::visits::{visits, Visit};
use crate::batch::pipeline::{Kind, KindStats, Lent, Need, Pipeline, Setup};
use crate::error::{Fault, Reason, SourceKind};
use crate::image::resize::CropBox;
use crate::plan::unit_stream::{ranges_len, slice, Span, StreamReader, UnitOrder};
use crate::read::source::SourceOptions;
use crate::tokenize::DocumentEncoder;

/// Chunks the read thread reads ahead.
const CHUNKS_AHEAD: usize = 4;
/// Bytes of documents after which a chunk is sent early: what is read ahead is bounded by
/// `CHUNKS_AHEAD` chunks of this (plus one document), not by documents' sizes.
const CHUNK_BYTES: usize = 32 << 20;

/// Faults kept whole in the stats (the rest only counted).
const MAX_FAULTS_KEPT: usize = 1000;

/// Labels of tokens no loss is taken on: image runs, padding, a sequence's first token.
pub const IGNORE: i64 = -100;

/// Rows of `[rows, seq_len]` int64 in a lent token region: ids, labels, then the four position
/// rows (`positions`: per-document text positions, M-RoPE t, h, w).
pub const INT_ROWS: usize = 6;

thread_local! {
    /// A decoding thread's image decoder and resizer, its planar image and its video frames.
    static WORKER: std::cell::RefCell<(Worker, Vec<u8>, Vec<u8>)> =
        std::cell::RefCell::new((Worker::default(), Vec::new(), Vec::new()));
}

/// An image or video of a batch, in the order of the runs: what to decode, its grid, its run's
/// first token and tokens.
struct Visual<'a> {
    bytes: &'a [u8],
    grid: Grid,
    first: usize,
    tokens: usize,
    /// A video's sampled frame numbers (None: an image).
    frames: Option<&'a [u32]>,
}

/// What the reader is given: every unit, its batches as counted, and how they are made.
pub struct InterleavedInput {
    pub units: Arc<Vec<Unit>>,
    pub unit_batches: Arc<Vec<u64>>,
    pub spec: InterleavedSpec,
    pub encoder: Arc<DocumentEncoder>,
    pub source: SourceOptions,
    /// The id padding is written with (its label is `IGNORE`).
    pub pad_id: u32,
}

/// One finished batch: `rows x seq_len` ids, labels and positions, its first `patches` rows of
/// pixels and one grid per image or video, in the order their runs appear (a video's rows are
/// `pixel_values_videos`' and an image's `pixel_values`', split by `grid_is_video`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterleavedMeta {
    pub patches: usize,
    pub grids: Vec<(u32, u32, u32)>,
    /// Per grid: a video's (else an image's).
    pub grid_is_video: Vec<bool>,
    /// Sequences over the flattened `[rows * seq_len]` tokens (a document's run in a row, and
    /// each row's padding), as FlashAttention's varlen kernels take them.
    pub cu_seqlens: Vec<i32>,
    pub max_seqlen: u32,
    /// Documents learned (not cut, see the module's doc) whose first token is in this batch.
    pub documents: usize,
    /// The document of each run, in order.
    pub keys: Vec<String>,
    /// Tokens of documents (the rest is padding).
    pub tokens: usize,
}

/// The reader's counters.
#[derive(Default)]
pub struct InterleavedStats {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    pub tokens: AtomicU64,
    pub padding: AtomicU64,
    pub documents: AtomicU64,
    /// Documents this reader saw first that the epoch reads in part (see the module's doc).
    pub cut_documents: AtomicU64,
    /// Batches of padding only (a padded phase's positions past the stream's end).
    pub padding_batches: AtomicU64,
    pub images: AtomicU64,
    pub videos: AtomicU64,
    pub patches: AtomicU64,
    pub decode_us: AtomicU64,
    pub measure_us: AtomicU64,
    pub source: Arc<crate::read::source::SourceStats>,
    skipped: Mutex<(BTreeMap<&'static str, u64>, Vec<Fault>)>,
}

impl InterleavedStats {
    fn record_skip(&self, fault: Fault) {
        let mut s = self.skipped.lock().expect("stats lock");
        *s.0.entry(fault.reason.as_str()).or_default() += 1;
        if s.1.len() < MAX_FAULTS_KEPT {
            s.1.push(fault);
        }
    }
}

impl KindStats for InterleavedStats {
    fn snapshot(&self) -> serde_json::Value {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = self.skipped.lock().expect("stats lock");
        serde_json::json!({
            "batches": load(&self.batches),
            "rows": load(&self.rows),
            "tokens": load(&self.tokens),
            "padding": load(&self.padding),
            "documents": load(&self.documents),
            "cut_documents": load(&self.cut_documents),
            "padding_batches": load(&self.padding_batches),
            "images": load(&self.images),
            "videos": load(&self.videos),
            "patches": load(&self.patches),
            "decode_seconds": load(&self.decode_us) as f64 / 1e6,
            "measure_seconds": load(&self.measure_us) as f64 / 1e6,
            "bytes": self.source.bytes.load(Ordering::Relaxed),
            "retries": self.source.retries.load(Ordering::Relaxed),
            "skipped": s.0,
            "skipped_total": s.0.values().sum::<u64>(),
            "faults": s.1,
        })
    }
}

/// What becomes of a run in its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Its document is read whole this epoch: its text is learned.
    Learned,
    /// Its document has a batch no rank reads this epoch: context without labels.
    Cut { counted_here: bool },
}

/// What the read thread sends: a unit's documents, in chunks.
type Chunk = read_thread::Chunk<DocumentResult>;

/// The running interleaved pipeline of one reader.
pub type InterleavedPipeline = Pipeline<InterleavedBatches, InterleavedStats>;

/// Starts the pipeline of `reader` (a packed plan over batches: one position per batch), in an
/// epoch that reads every position but `unread`. A lent buffer has two regions: `pixel_values`
/// (`max_patches x row_len` bytes) and the int64 `[INT_ROWS, rows, seq_len]` ids, labels and
/// the four position rows (`positions`).
pub fn start(
    input: Arc<InterleavedInput>,
    order: &UnitOrder,
    reader: StreamReader,
    unread: &[Span],
    threads: usize,
) -> InterleavedPipeline {
    let stats = Arc::new(InterleavedStats::default());
    let ranges = slice(&reader.ranges, reader.skip_rows, reader.rows);
    let planned = visits(order, &ranges);
    let unread = visits(order, unread)
        .into_iter()
        .map(|v| (v.unit, v.spans))
        .collect();
    let batches_left = reader.rows - reader.skip_rows;
    // A padded phase's positions past the stream's end: the last of the reader's (one batch a
    // position, no shuffle block), after every real one.
    let padding_left = batches_left - ranges_len(&ranges);
    let shape = input.spec.shape;
    let setup = Setup {
        threads,
        stage: "decode",
        needs: vec![
            Need {
                name: "pixel",
                bytes: shape.max_patches as usize * input.spec.vision.row_len(),
            },
            Need {
                name: "token",
                bytes: INT_ROWS * shape.rows * shape.seq_len * 8,
            },
        ],
        batches_left: Some(batches_left),
    };
    let batch_stats = stats.clone();
    Pipeline::start(setup, stats, move |stop| {
        let (tx, chunks) = bounded(CHUNKS_AHEAD);
        let finished = Arc::new(AtomicUsize::new(0));
        {
            let (input, stats, visits, finished, stop) = (
                input.clone(),
                batch_stats.clone(),
                planned.clone(),
                finished.clone(),
                stop.clone(),
            );
            std::thread::Builder::new()
                .name("shardstream-interleaved-read".into())
                .spawn(move || read_visits(&visits, &input, &stats.source, &finished, &stop, &tx))
                .expect("a read thread");
        }
        InterleavedBatches {
            packer: Packer::new(shape),
            visits: planned,
            visit: 0,
            next: 0,
            unread,
            ready: VecDeque::new(),
            chunks,
            finished,
            stop,
            batches_left,
            padding_left,
            input,
            stats: batch_stats,
        }
    })
}

/// Sends every visited unit's documents, in chunks, until the batcher is done with it (the
/// kit's walk; a visit the batcher finished before it is opened is skipped).
fn read_visits(
    visits: &[Visit],
    input: &InterleavedInput,
    source: &Arc<crate::read::source::SourceStats>,
    finished: &AtomicUsize,
    stop: &AtomicBool,
    out: &Sender<(usize, Chunk)>,
) {
    let open = |visit: &Visit| {
        let unit = &input.units[visit.unit as usize];
        let mut docs = UnitDocuments::open(unit, &input.spec.documents, &input.source, source)?;
        Ok(move || docs.next_document())
    };
    let bounds = ChunkBounds {
        items: CHUNK,
        bytes: CHUNK_BYTES,
    };
    let size = |doc: &DocumentResult| doc.as_ref().map_or(0, |d| d.bytes());
    let finished = |i: usize| finished.load(Ordering::Relaxed) > i;
    read_thread::read_visits(visits, bounds, open, size, finished, stop, out);
}

/// The interleaved kind on the pipeline.
pub struct InterleavedBatches {
    packer: Packer,
    visits: Vec<Visit>,
    /// The visit being packed, and the index (in its unit) of the next batch it closes.
    visit: usize,
    next: u64,
    /// Each unit's batches no rank reads this epoch (unit-local, ascending).
    unread: HashMap<u32, Vec<(u64, u64)>>,
    /// Planned batches, each with what becomes of its runs (rows, then runs, in order).
    ready: VecDeque<(PackedBatch, Vec<Fate>)>,
    chunks: Receiver<(usize, Chunk)>,
    finished: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    batches_left: u64,
    /// Of `batches_left`, the batches of padding after the last planned one (a padded phase).
    padding_left: u64,
    input: Arc<InterleavedInput>,
    stats: Arc<InterleavedStats>,
}

impl Kind for InterleavedBatches {
    type Meta = InterleavedMeta;

    fn next_batch(
        &mut self,
        lend: &mut dyn FnMut() -> Option<Lent>,
    ) -> Option<Result<InterleavedMeta, Fault>> {
        if self.batches_left == 0 {
            return None;
        }
        let batch = match self.next_planned() {
            Ok(batch) => batch,
            Err(fault) => return Some(Err(fault)),
        };
        let mut lent = lend()?;
        self.batches_left -= 1;
        Some(Ok(self.fill(&mut lent, batch)))
    }
}

impl InterleavedBatches {
    fn wanted(&self, j: u64) -> bool {
        self.visits[self.visit]
            .spans
            .iter()
            .any(|&(a, b)| a <= j && j < b)
    }

    /// The next batch this reader's plan gives it.
    fn next_planned(&mut self) -> Result<(PackedBatch, Vec<Fate>), Fault> {
        loop {
            if let Some(batch) = self.ready.pop_front() {
                return Ok(batch);
            }
            if self.visit >= self.visits.len() && self.padding_left > 0 {
                self.padding_left -= 1;
                self.stats.padding_batches.fetch_add(1, Ordering::Relaxed);
                let padding = PackedBatch {
                    rows: Vec::new(),
                    patches: 0,
                };
                return Ok((padding, Vec::new()));
            }
            if self.visit >= self.visits.len() {
                return Err(internal(
                    "the reader's units ended before its planned batches",
                ));
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(internal("stopped"));
            }
            let (i, chunk) = self
                .chunks
                .recv()
                .map_err(|_| internal("the read thread ended early"))?;
            if i != self.visit {
                continue; // a visit finished early: its chunks still in flight
            }
            match chunk {
                Chunk::Failed(fault) => return Err(fault),
                Chunk::Items(docs) => {
                    let started = Instant::now();
                    let measured = measure_chunk(docs, &self.input.spec, &self.input.encoder, true);
                    self.stats
                        .measure_us
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    for doc in measured {
                        match doc {
                            Ok(doc) => self.packer.push(Arc::new(doc)),
                            Err((key, (reason, detail))) => {
                                if self.wanted(self.next) {
                                    self.stats.record_skip(Fault {
                                        reason,
                                        url: self.unit().display(),
                                        key,
                                        detail,
                                        kind: SourceKind::Other,
                                    });
                                }
                            }
                        }
                        if self.drain() {
                            break;
                        }
                    }
                }
                Chunk::End => {
                    self.packer.finish();
                    let visit = self.visit;
                    if !self.drain() {
                        let unit = self.visits[visit].unit as usize;
                        return Err(Fault {
                            reason: Reason::Unreadable,
                            url: self.input.units[unit].display(),
                            key: String::new(),
                            detail: format!(
                                "makes {} batches, but was counted with {}: the file changed \
                                 since the count, or another tokenizer or spec is used (count again)",
                                self.next, self.input.unit_batches[unit]
                            ),
                            kind: SourceKind::Other,
                        });
                    }
                }
            }
        }
    }

    fn unit(&self) -> &Unit {
        &self.input.units[self.visits[self.visit].unit as usize]
    }

    /// Keeps the closed batches this reader wants; true when the visit is done (then the next
    /// one begins).
    fn drain(&mut self) -> bool {
        while let Some(batch) = self.packer.pop() {
            if self.wanted(self.next) {
                let cut = self.cut_runs(&batch);
                self.ready.push_back((batch, cut));
            }
            self.next += 1;
        }
        let last = self.visits[self.visit].spans.last().map_or(0, |s| s.1);
        if self.next < last {
            return false;
        }
        self.visit += 1;
        self.finished.store(self.visit, Ordering::Relaxed);
        self.next = 0;
        self.packer = Packer::new(self.input.spec.shape);
        true
    }

    /// What becomes of each run of `batch` (the unit's batch `self.next`): learned, or cut (its
    /// document has a batch no rank reads this epoch), the document counted in the batch that
    /// is the first of its batches read.
    fn cut_runs(&self, batch: &PackedBatch) -> Vec<Fate> {
        let runs = batch.rows.iter().flat_map(|r| r.runs.iter());
        let Some(unread) = self.unread.get(&self.visits[self.visit].unit) else {
            return runs.map(|_| Fate::Learned).collect();
        };
        let is_unread = |j: u64| unread.iter().any(|&(a, b)| a <= j && j < b);
        let mut counted: Vec<&Arc<super::measure::Measured>> = Vec::new();
        runs.map(|run| {
            let (first, last) = run.doc_batches;
            if !(first..=last).any(is_unread) {
                return Fate::Learned;
            }
            let first_read = (first..=last).find(|&j| !is_unread(j));
            let here =
                first_read == Some(self.next) && !counted.iter().any(|d| Arc::ptr_eq(d, &run.doc));
            if here {
                counted.push(&run.doc);
            }
            Fate::Cut { counted_here: here }
        })
        .collect()
    }

    /// Writes `batch` into `lent`: a cut run (`fates`, one a run) without labels.
    fn fill(
        &mut self,
        lent: &mut Lent,
        (batch, fates): (PackedBatch, Vec<Fate>),
    ) -> InterleavedMeta {
        let spec = &self.input.spec;
        let (rows, len) = (spec.shape.rows, spec.shape.seq_len);
        let cells = rows * len;
        let vision = &spec.vision;
        let row_len = vision.row_len();
        let (ints, pixels) = lent.pair::<i64, u8>(
            (1, INT_ROWS * cells),
            (0, spec.shape.max_patches as usize * row_len),
        );
        let ints = ints.expect("a lent token region");
        let pixels = pixels.expect("a lent pixel region");
        let (ids, rest) = ints.split_at_mut(cells);
        let (labels, rest) = rest.split_at_mut(cells);
        ids.fill(self.input.pad_id as i64);
        labels.fill(IGNORE);
        let mut meta = InterleavedMeta {
            patches: 0,
            grids: Vec::new(),
            grid_is_video: Vec::new(),
            cu_seqlens: vec![0],
            max_seqlen: 0,
            documents: 0,
            keys: Vec::new(),
            tokens: 0,
        };
        // Each image and video, in order.
        let mut images: Vec<Visual<'_>> = Vec::new();
        let sequence = |meta: &mut InterleavedMeta, n: usize| {
            meta.max_seqlen = meta.max_seqlen.max(n as u32);
            let last = *meta.cu_seqlens.last().expect("a start");
            meta.cu_seqlens.push(last + n as i32);
        };
        let start_of_doc = Cursor { item: 0, offset: 0 };
        let runs_of = |r: usize| batch.rows.get(r).map_or(&[][..], |row| &row.runs[..]);
        let mut fates = fates.into_iter();
        let mut cut_documents = 0u64;
        for r in 0..rows {
            let row_start = r * len;
            let mut at = row_start;
            for run in runs_of(r) {
                let fate = fates.next().expect("one fate a run");
                let learned = fate == Fate::Learned;
                cut_documents += u64::from(fate == Fate::Cut { counted_here: true });
                meta.documents += (learned && run.from == start_of_doc) as usize;
                meta.keys.push(run.doc.key.clone());
                let start = at;
                for (item, a, b) in run.items() {
                    match item {
                        Item::Text(tokens) => {
                            for &t in &tokens[a..b] {
                                ids[at] = t as i64;
                                if learned && at != start {
                                    labels[at] = t as i64;
                                }
                                at += 1;
                            }
                        }
                        Item::Context(tokens) => {
                            for &t in &tokens[a..b] {
                                ids[at] = t as i64;
                                at += 1;
                            }
                        }
                        Item::Image {
                            bytes,
                            grid,
                            tokens,
                        } => {
                            for t in vision.run(*grid) {
                                ids[at] = t as i64;
                                at += 1;
                            }
                            images.push(Visual {
                                bytes,
                                grid: *grid,
                                first: at - tokens,
                                tokens: *tokens,
                                frames: None,
                            });
                        }
                        Item::Video {
                            bytes,
                            grid,
                            tokens,
                            indices,
                            ..
                        } => {
                            let VisionSpec::Qwen(qwen) = vision else {
                                unreachable!("a video is measured under Qwen2-VL's rule only")
                            };
                            let pad = qwen.video.as_ref().map_or(qwen.image_pad, |v| v.video_pad);
                            for t in qwen.video_run(*grid, pad) {
                                ids[at] = t as i64;
                                at += 1;
                            }
                            images.push(Visual {
                                bytes,
                                grid: *grid,
                                first: at - tokens,
                                tokens: *tokens,
                                frames: Some(indices),
                            });
                        }
                    }
                }
                sequence(&mut meta, at - start);
            }
            meta.tokens += at - row_start;
            let pad = row_start + len - at;
            if pad > 0 {
                sequence(&mut meta, pad);
            }
        }
        let results = self.decode(pixels, &images);
        // Dropped images: their tokens become padding; the rows of the rest move up.
        let mut from = 0usize;
        let mut kept = Vec::with_capacity(images.len());
        for (visual, result) in images.iter().zip(results) {
            let (grid, first, tokens) = (&visual.grid, visual.first, visual.tokens);
            let what = if visual.frames.is_some() {
                "a video"
            } else {
                "an image"
            };
            let n = grid.patches() as usize;
            kept.push(result.is_ok());
            match result {
                Ok(()) => {
                    if from != meta.patches {
                        pixels.copy_within(
                            from * row_len..(from + n) * row_len,
                            meta.patches * row_len,
                        );
                    }
                    meta.patches += n;
                    meta.grids.push((grid.t, grid.h, grid.w));
                    meta.grid_is_video.push(visual.frames.is_some());
                }
                Err((reason, detail)) => {
                    ids[first..first + tokens].fill(self.input.pad_id as i64);
                    meta.tokens -= tokens;
                    self.stats.record_skip(Fault {
                        reason,
                        url: String::new(),
                        key: String::new(),
                        detail: format!("{what} dropped from its batch: {detail}"),
                        kind: SourceKind::Other,
                    });
                }
            }
            from += n;
        }
        // Positions last: a dropped image's tokens are text to the model.
        let (text, rest) = rest.split_at_mut(cells);
        let (t, rest) = rest.split_at_mut(cells);
        let (h, w) = rest.split_at_mut(cells);
        let mut positions = PositionRows { text, t, h, w };
        let rope = vision.rope();
        let mut kept = kept.into_iter();
        for r in 0..rows {
            let mut at = r * len;
            for run in runs_of(r) {
                at = write_run(&mut positions, run, at, rope, || {
                    kept.next().expect("one flag an image")
                });
            }
            positions.padding(at, (r + 1) * len);
        }
        let s = &self.stats;
        s.batches.fetch_add(1, Ordering::Relaxed);
        s.rows.fetch_add(rows as u64, Ordering::Relaxed);
        s.tokens.fetch_add(meta.tokens as u64, Ordering::Relaxed);
        s.padding
            .fetch_add((rows * len - meta.tokens) as u64, Ordering::Relaxed);
        s.documents
            .fetch_add(meta.documents as u64, Ordering::Relaxed);
        s.cut_documents.fetch_add(cut_documents, Ordering::Relaxed);
        let videos = meta.grid_is_video.iter().filter(|v| **v).count();
        s.images
            .fetch_add((meta.grids.len() - videos) as u64, Ordering::Relaxed);
        s.videos.fetch_add(videos as u64, Ordering::Relaxed);
        s.patches.fetch_add(meta.patches as u64, Ordering::Relaxed);
        meta
    }

    /// Decodes `images` (and videos) on the pool into consecutive rows of the pixel region.
    fn decode(&self, pixels: &mut [u8], images: &[Visual<'_>]) -> Vec<Result<(), Rejection>> {
        let vision = &self.input.spec.vision;
        let row_len = vision.row_len();
        let mut slots = Vec::with_capacity(images.len());
        let mut rest = pixels;
        for visual in images {
            let (slot, tail) = rest.split_at_mut(visual.grid.patches() as usize * row_len);
            slots.push(slot);
            rest = tail;
        }
        let started = Instant::now();
        let max_pixels = self.input.spec.max_pixels;
        let results = slots
            .into_par_iter()
            .zip(images.par_iter())
            .map(|(slot, visual)| {
                WORKER.with(|w| {
                    let (worker, planar, frames) = &mut *w.borrow_mut();
                    match (visual.frames, vision) {
                        (Some(indices), VisionSpec::Qwen(qwen)) => decode_video(
                            visual.bytes,
                            indices,
                            visual.grid,
                            qwen,
                            max_pixels,
                            frames,
                            slot,
                        ),
                        _ => decode_image(
                            visual.bytes,
                            visual.grid,
                            vision,
                            max_pixels,
                            worker,
                            planar,
                            slot,
                        ),
                    }
                })
            })
            .collect();
        self.stats
            .decode_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        results
    }
}

/// Decodes one image, resizes it to its grid's pixels (with the family's filter: Pillow's
/// BICUBIC for Qwen2-VL, antialiased BILINEAR for NaFlex) and writes its rows of
/// `pixel_values` into `slot` in the family's layout.
fn decode_image(
    bytes: &[u8],
    grid: Grid,
    vision: &VisionSpec,
    max_pixels: u64,
    worker: &mut Worker,
    planar: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<(), Rejection> {
    let Worker {
        decoder,
        transformer,
        ..
    } = worker;
    let probe = decoder.probe(bytes).map_err(|e| (e.reason, e.detail))?;
    let (width, height) = probe.oriented_size();
    let region = CropBox {
        x: 0.0,
        y: 0.0,
        w: width as f64,
        h: height as f64,
    };
    let p = vision.patch_size();
    let target = (grid.w * p, grid.h * p);
    let img = decoder
        .decode_to(bytes, &probe, region, target, max_pixels, true)
        .map_err(|e| (e.reason, e.detail))?;
    let scaled = region.rescaled((width, height), img.size());
    let failed = |e: crate::image::decode::DecodeError| (e.reason, e.detail);
    match vision {
        VisionSpec::Qwen(qwen) => {
            let n = 3 * target.0 as usize * target.1 as usize;
            planar.resize(n, 0);
            transformer
                .resize_into_planar(&img, scaled, target, vision.kernel(), &mut planar[..n])
                .map_err(failed)?;
            qwen.write_rows(&planar[..n], grid, slot);
        }
        VisionSpec::NaFlex(_) => transformer
            .resize_into_patches(&img, scaled, (grid.h, grid.w), p, vision.kernel(), slot)
            .map_err(failed)?,
    }
    Ok(())
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
