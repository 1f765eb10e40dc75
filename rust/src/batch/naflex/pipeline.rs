//! The token-budget pipeline of one reader: the batches its plan gives it, in stream order.
//!
//! ```text
//! read thread (visited units, file order): header of every sample -> its bucket; a completed
//!   batch the plan gives this reader ──▶ batcher: decode its images on the pool into the lent
//!   buffer as [images, bucket length, 3 p p] patches ──▶ (images, length, grids, captions)
//! ```
//!
//! The read thread holds only the samples of open buckets (`plan::budget`), and two planned
//! batches wait between the threads: memory is bounded by the buckets and the budget.
//! A unit read to its end must make the batches it was counted with; anything else (a file
//! changed since the count) fails the pass naming it. An image that fails to decode although
//! its header parsed is dropped from its batch, counted by reason: the batch is one image
//! shorter, and every rank still yields the same number of batches.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use super::samples::{open_samples, patches_of, BudgetSpec};
use crate::batch::kit::patches::prepare_image;
use crate::batch::kit::sample::{caption, image_bytes, Rejection, Worker};
use crate::batch::kit::slots::{keep_decoded, tokenize_captions};
use crate::batch::kit::unit::{unit_fault, Unit};
use crate::batch::kit::visits::{visits, Visit};
use crate::batch::pipeline::{Kind, KindStats, Lent, Need, Pipeline, Setup};
use crate::error::{Fault, Reason, SourceKind};
use crate::image::decode::Decoder;
use crate::plan::budget::{Bucketer, PlannedBatch};
use crate::plan::unit_stream::{slice, StreamReader, UnitOrder};
use crate::read::group::RawSample;
use crate::read::source::{SourceOptions, SourceStats};
use crate::tokenize::ClipTokenizer;

thread_local! {
    static WORKER: std::cell::RefCell<Worker> = std::cell::RefCell::new(Worker::default());
}

/// Planned batches waiting between the read thread and the batcher.
const BATCHES_AHEAD: usize = 2;

/// What the reader is given: every unit, its batches as counted, and how they are made.
pub struct BudgetInput {
    pub units: Arc<Vec<Unit>>,
    pub unit_batches: Arc<Vec<u64>>,
    pub spec: BudgetSpec,
    pub source: SourceOptions,
    /// Seeds random crops per (epoch, key), as the fixed-count kinds' `crop_seed`.
    pub crop_seed: u64,
    /// Tokenizes the captions into the lent token buffer (`[images, context_length]` int64).
    pub tokenizer: Option<Arc<ClipTokenizer>>,
}

impl BudgetInput {
    /// The most images a batch can hold: a full batch of the shortest bucket.
    pub fn max_images(&self) -> usize {
        self.spec.shape.capacity(0)
    }
}

/// One finished batch: its first `images * length * 3 p p` bytes hold `[images, length, 3 p p]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetBatchMeta {
    pub images: usize,
    pub length: u32,
    pub grids: Vec<(u32, u32)>,
    pub texts: Vec<String>,
    pub keys: Vec<String>,
    pub urls: Vec<String>,
}

pub type BudgetResult = Result<BudgetBatchMeta, Fault>;

/// A decoded image's caption and grid (rows, columns).
type Decoded = (String, (u32, u32));

/// The reader's counters.
#[derive(Default)]
pub struct BudgetStats {
    pub batches: AtomicU64,
    pub images: AtomicU64,
    pub patches: AtomicU64,
    pub slots: AtomicU64,
    pub decode_us: AtomicU64,
    pub source: Arc<SourceStats>,
    /// Images dropped from their batch at decode, by reason.
    pub skipped: Mutex<BTreeMap<String, u64>>,
}

impl BudgetStats {
    pub fn to_json(&self) -> serde_json::Value {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "batches": load(&self.batches),
            "images": load(&self.images),
            "patches": load(&self.patches),
            "slots": load(&self.slots),
            "decode_seconds": load(&self.decode_us) as f64 / 1e6,
            "bytes": self.source.bytes.load(Ordering::Relaxed),
            "retries": self.source.retries.load(Ordering::Relaxed),
            "skipped": *self.skipped.lock().expect("stats lock"),
        })
    }
}

/// A planned batch of this reader, its samples read.
struct ReadBatch {
    bucket: u32,
    samples: Vec<RawSample>,
    display: Arc<str>,
}

impl KindStats for BudgetStats {
    fn snapshot(&self) -> serde_json::Value {
        self.to_json()
    }
}

/// The running token-budget pipeline of one reader.
pub type BudgetPipeline = Pipeline<BudgetBatches, BudgetStats>;

/// The token-budget kind on the pipeline: the planned batches its read thread sends, decoded
/// into lent buffers of two regions, the `[images, length, 3 p p]` patches and, with a
/// tokenizer, the `[images, context_length]` int64 caption tokens.
pub struct BudgetBatches {
    batches_left: u64,
    input: Arc<BudgetInput>,
    stats: Arc<BudgetStats>,
    read: Receiver<Result<ReadBatch, Fault>>,
}

/// Starts the pipeline of `reader` (a packed plan over batches: one position per batch).
pub fn start(
    input: Arc<BudgetInput>,
    order: &UnitOrder,
    reader: StreamReader,
    threads: usize,
) -> BudgetPipeline {
    let stats = Arc::new(BudgetStats::default());
    let ranges = slice(&reader.ranges, reader.skip_rows, reader.rows);
    let planned = visits(order, &ranges);
    let batches_left = reader.rows - reader.skip_rows;
    let token_bytes = input
        .tokenizer
        .as_ref()
        .map_or(0, |t| input.max_images() * t.context_length.max(1) * 8);
    let setup = Setup {
        threads,
        stage: "decode",
        needs: vec![
            Need {
                name: "patch",
                bytes: input.spec.shape.max_patches_per_batch as usize
                    * input.spec.naflex.patch_len(),
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
        let (read_tx, read) = bounded::<Result<ReadBatch, Fault>>(BATCHES_AHEAD);
        {
            let (input, stats) = (input.clone(), batch_stats.clone());
            std::thread::Builder::new()
                .name("shardstream-budget-read".into())
                .spawn(move || read_visits(&planned, &input, &stats, &stop, &read_tx))
                .expect("a read thread");
        }
        BudgetBatches {
            batches_left,
            input,
            stats: batch_stats,
            read,
        }
    })
}

impl Kind for BudgetBatches {
    type Meta = BudgetBatchMeta;

    fn next_batch(
        &mut self,
        lend: &mut dyn FnMut() -> Option<Lent>,
    ) -> Option<Result<BudgetBatchMeta, Fault>> {
        if self.batches_left == 0 {
            return None;
        }
        let mut lent = lend()?;
        self.batches_left -= 1;
        Some(match self.read.recv() {
            Ok(Ok(batch)) => fill(&mut lent, batch, &self.input, &self.stats),
            Ok(Err(fault)) => Err(fault),
            Err(_) => Err(Fault {
                reason: Reason::Internal,
                url: String::new(),
                key: String::new(),
                detail: "the read thread ended before the planned batches".into(),
                kind: SourceKind::Other,
            }),
        })
    }
}

/// Reads every visit's unit in file order and sends the planned batches of this reader.
fn read_visits(
    visits: &[Visit],
    input: &BudgetInput,
    stats: &BudgetStats,
    stop: &AtomicBool,
    out: &Sender<Result<ReadBatch, Fault>>,
) {
    for visit in visits {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let unit = &input.units[visit.unit as usize];
        let counted = input.unit_batches[visit.unit as usize];
        if let Err(fault) = read_visit(visit, unit, counted, input, stats, stop, out) {
            let _ = out.send(Err(fault));
            return;
        }
    }
}

/// Sends the planned batches of one visit; Err ends the pass.
fn read_visit(
    visit: &Visit,
    unit: &Unit,
    counted: u64,
    input: &BudgetInput,
    stats: &BudgetStats,
    stop: &AtomicBool,
    out: &Sender<Result<ReadBatch, Fault>>,
) -> Result<(), Fault> {
    let display: Arc<str> = unit.display().into();
    let fault = |reason, detail, kind| unit_fault(&display, reason, detail, kind);
    let last = visit.spans.last().map_or(0, |s| s.1);
    let wanted = |j: u64| visit.spans.iter().any(|&(a, b)| a <= j && j < b);
    let samples = open_samples(unit, &input.spec, &input.source, &stats.source)?;
    let mut decoder = Decoder::default();
    let mut bucketer = Bucketer::new(&input.spec.shape);
    let mut held: HashMap<u32, RawSample> = HashMap::new();
    let mut next = 0u64;
    // Sends (or drops) batch `next`; false when the receiver is gone.
    let emit = |batch: PlannedBatch, held: &mut HashMap<u32, RawSample>, next: &mut u64| {
        let members: Vec<RawSample> = batch
            .members
            .iter()
            .filter_map(|m| held.remove(m))
            .collect();
        let keep = wanted(*next);
        *next += 1;
        !keep
            || out
                .send(Ok(ReadBatch {
                    bucket: batch.bucket,
                    samples: members,
                    display: display.clone(),
                }))
                .is_ok()
    };
    for (position, item) in samples.enumerate() {
        if next >= last || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let raw = item.map_err(|f| fault(f.reason, f.detail, f.kind))?;
        let Ok(n) = patches_of(&raw, &input.spec, &mut decoder) else {
            continue; // counted by the count pass, as it was there
        };
        held.insert(position as u32, raw);
        if let Some(batch) = bucketer.push(position as u32, n) {
            if !emit(batch, &mut held, &mut next) {
                return Ok(());
            }
        }
    }
    for batch in bucketer.finish() {
        if next >= last {
            return Ok(());
        }
        if !emit(batch, &mut held, &mut next) {
            return Ok(());
        }
    }
    if next != counted || next < last {
        return Err(fault(
            Reason::Unreadable,
            format!(
                "makes {next} batches under this budget, but was counted with {counted}: the file changed since the count (count again)"
            ),
            SourceKind::Other,
        ));
    }
    Ok(())
}

/// Decodes `batch` into `buffer`; an image that fails is dropped and the rest moved up.
fn fill(
    lent: &mut Lent,
    batch: ReadBatch,
    input: &BudgetInput,
    stats: &BudgetStats,
) -> BudgetResult {
    let spec = &input.spec;
    let length = spec.shape.length(batch.bucket as usize);
    let slot = length as usize * spec.naflex.patch_len();
    // The budget bounds a batch's patches, and the pipeline checked the lent region against it.
    let out = lent
        .values::<u8>(0, slot * batch.samples.len())
        .expect("a lent patch region");
    let started = Instant::now();
    let results: Vec<Result<Decoded, Rejection>> = out
        .par_chunks_mut(slot.max(1))
        .zip(batch.samples.par_iter())
        .map(|(dst, raw)| {
            WORKER.with(|w| {
                let worker = &mut w.borrow_mut();
                let text = caption(raw, &spec.sample.caption)?;
                let bytes = image_bytes(raw, &spec.sample.image_keys)?;
                let grid = prepare_image(
                    bytes,
                    &raw.key,
                    &spec.sample,
                    &spec.naflex,
                    input.crop_seed,
                    true,
                    worker,
                    dst,
                )?;
                Ok((text, grid))
            })
        })
        .collect();
    stats
        .decode_us
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    let mut meta = BudgetBatchMeta {
        images: 0,
        length,
        grids: Vec::new(),
        texts: Vec::new(),
        keys: Vec::new(),
        urls: Vec::new(),
    };
    for (i, (text, grid)) in keep_decoded(out, slot, results, &stats.skipped) {
        meta.images += 1;
        stats
            .patches
            .fetch_add((grid.0 * grid.1) as u64, Ordering::Relaxed);
        meta.grids.push(grid);
        meta.texts.push(text);
        meta.keys.push(batch.samples[i].key.clone());
        meta.urls.push(batch.display.to_string());
    }
    tokenize_captions(lent, 1, input.tokenizer.as_deref(), &meta.texts);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats
        .images
        .fetch_add(meta.images as u64, Ordering::Relaxed);
    stats
        .slots
        .fetch_add(meta.images as u64 * length as u64, Ordering::Relaxed);
    Ok(meta)
}
