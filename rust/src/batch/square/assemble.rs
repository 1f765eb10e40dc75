//! Batch assembly: the batcher thread takes `batch_size` items of the shuffled stream at a
//! time and runs them through its phases into the caller's buffer:
//!
//! 1. decode: every item into its slot, in parallel on the decode threads (rayon);
//! 2. classify: a rejected sample is counted as a skip (a hole was counted with its shard);
//! 3. refill: empty slots from the reserve (planned) or the stream's next samples (streaming);
//! 4. pad (planned): slots the reserve could not fill repeat good samples, so every rank
//!    yields the same full batches;
//! 5. assemble: good slots moved forward, replacements and padding counted, the batch's
//!    metadata out; with a tokenizer the captions are tokenized into the token buffer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::batch::kit::sample::{caption, image_bytes, Rejection, SampleSpec, Worker};
use crate::batch::panics::{panic_fault, panic_message};
use crate::batch::pipeline::{Kind, Lent};
use crate::batch::square::config::{OnError, PipelineConfig, SampleKind};
use crate::batch::square::reader::{Item, StreamError};
use crate::batch::square::reserve::ReserveReader;
use crate::batch::square::sample::prepare;
use crate::batch::square::shuffle::{ItemSource, ShuffledItems};
use crate::batch::square::stats::Stats;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::RawSample;

thread_local! {
    static WORKER: std::cell::RefCell<Worker> = std::cell::RefCell::new(Worker::default());
}

/// What a sample batch says of itself (its pixels and tokens are in the lent buffer).
#[derive(Debug)]
pub struct BatchMeta {
    pub len: usize,
    pub keys: Vec<String>,
    pub texts: Vec<String>,
    pub shards: Vec<u32>,
    /// What users know each sample's shard by, in batch order.
    pub urls: Vec<String>,
    /// The NaFlex kind: each sample's patch grid (rows, columns), in batch order; empty for
    /// the square kind.
    pub grids: Vec<(u32, u32)>,
    /// Reserve positions this reader had consumed when the batch was complete (planned mode):
    /// what a resume state records, so that a resumed reader never refills from them again.
    pub reserve_used: u64,
}

/// A sample's caption and, for kinds that have one, its patch grid (rows, columns).
type Prepared = (String, Option<(u32, u32)>);

/// Runs the kind's per-sample function: `raw` into `slot`.
fn prepare_into(
    raw: &RawSample,
    shard: u32,
    cfg: &PipelineConfig,
    slot: &mut [u8],
) -> Result<Prepared, Rejection> {
    let spec = cfg.spec_for(shard);
    WORKER.with(|w| {
        guarded(
            || {
                let worker = &mut w.borrow_mut();
                match &cfg.kind {
                    SampleKind::Square => {
                        prepare(raw, spec, cfg.crop_seed, worker, slot).map(|text| (text, None))
                    }
                    SampleKind::NaFlex(naflex) => crate::batch::kit::patches::prepare(
                        raw,
                        spec,
                        naflex,
                        cfg.crop_seed,
                        worker,
                        slot,
                    )
                    .map(|(text, grid)| (text, Some(grid))),
                    SampleKind::Undecoded => undecoded(raw, spec).map(|text| (text, None)),
                }
            },
            // The worker's decoder may be mid-image: the next sample gets a fresh one.
            || *w.borrow_mut() = Worker::default(),
        )
    })
}

/// The caption of `raw`, its image member found but not decoded (`SampleKind::Undecoded`).
fn undecoded(raw: &RawSample, spec: &SampleSpec) -> Result<String, Rejection> {
    if let Some(defect) = &raw.defect {
        return Err(defect.clone());
    }
    image_bytes(raw, &spec.image_keys)?;
    caption(raw, &spec.caption)
}

/// [`Batcher::count_verdict`], on the fields it needs (callable while the config is borrowed).
fn verdict_counted(
    rejected_run: &mut u64,
    cfg: &PipelineConfig,
    stats: &Stats,
    good: bool,
    stream: &ShuffledItems,
) -> Result<(), Fault> {
    if good {
        *rejected_run = 0;
        return Ok(());
    }
    *rejected_run += 1;
    match stream.cycle_window() {
        Some(window) if cfg.cycle && *rejected_run >= window => {
            let (reason, count, all) = stats.top_skip().unwrap_or((Reason::Unreadable, 0, 0));
            Err(Fault {
                reason,
                url: String::new(),
                key: String::new(),
                detail: format!(
                    "every sample of a full pass over this reader's shards was skipped \
                     ({count} of {all} for {reason}), so its batch quota (samples_per_epoch) \
                     can never be met"
                ),
                kind: SourceKind::Other,
            })
        }
        _ => Ok(()),
    }
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

/// The batcher thread's state: the stream it takes items from, the reserve, and the copy of
/// the last batch's good sample.
pub struct Batcher {
    cfg: PipelineConfig,
    stats: Arc<Stats>,
    /// Taken when the stream is built, on the first batch.
    main: Option<ItemSource>,
    stream: Option<ShuffledItems>,
    /// Batches made so far.
    produced: u64,
    reserve: ReserveReader,
    slot_len: usize,
    /// A copy of one good sample of the last batch (its slot and pixels): what pads a planned
    /// batch whose every sample failed once the reserve is used up, so the rank still yields
    /// the batch every other rank yields.
    last_good: Option<(Slot, Vec<u8>)>,
    /// Samples rejected one after another since the last good one: a streaming pass with a
    /// quota cycles over its shards, and one where every sample fails would cycle forever.
    rejected_run: u64,
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
    /// The NaFlex kind's patch grid (rows, columns) of the slot's image.
    grid: Option<(u32, u32)>,
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
    /// A batcher over `main` (`None`: no stream, for the phases on their own) and `reserve`.
    pub(super) fn new(
        cfg: PipelineConfig,
        stats: Arc<Stats>,
        main: Option<ItemSource>,
        reserve: ReserveReader,
    ) -> Self {
        Self {
            slot_len: cfg.slot_len(),
            cfg,
            stats,
            main,
            stream: None,
            produced: 0,
            reserve,
            last_good: None,
            rejected_run: 0,
        }
    }

    /// The stream, built on first use: shuffled, and past the batches a resumed pass emitted.
    fn stream(&mut self) -> Option<&mut ShuffledItems> {
        if self.stream.is_none() {
            let mut stream = ShuffledItems::new(self.main.take()?, &self.cfg);
            for _ in 0..self.cfg.skip_emitted {
                match stream.next() {
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            self.stream = Some(stream);
        }
        self.stream.as_mut()
    }

    /// The next batch's items (fewer at the end of the stream), or the fault that ends the pass.
    fn gather(&mut self, target: usize) -> Result<Vec<Item>, Fault> {
        let stats = self.stats.clone();
        let Some(stream) = self.stream() else {
            return Ok(Vec::new());
        };
        let mut items: Vec<Item> = Vec::with_capacity(target);
        while items.len() < target {
            match stream.next() {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(StreamError::ReaderLost(message)) => {
                    let message = message.unwrap_or_else(|| "it sent no message".into());
                    return Err(panic_fault("shard reading", &message));
                }
                Err(StreamError::Failed(fault)) => return Err(fault),
                Err(StreamError::Starved) => {
                    return Err(Fault {
                        reason: stats.top_skip().map_or(Reason::Unreadable, |t| t.0),
                        url: String::new(),
                        key: String::new(),
                        detail: "a full pass over this reader's shards produced no sample, so its batch quota \
                                 (samples_per_epoch) cannot be met: too few samples for the ranks x workers \
                                 sharing these shards, or every sample failed; build an index \
                                 (`shardstream index`) or use fewer workers"
                            .into(),
                        kind: SourceKind::Other,
                    })
                }
            }
        }
        Ok(items)
    }

    /// Tokenizes the batch's captions into the lent token region, with a tokenizer.
    fn tokenize(&self, lent: &mut Lent, texts: &[String]) {
        let Some(tok) = &self.cfg.tokenizer else {
            return;
        };
        let ctx = tok.context_length.max(1);
        if let Some(tokens) = lent.values::<i64>(1, self.cfg.batch_size * ctx) {
            tokens
                .par_chunks_mut(ctx)
                .zip(texts.par_iter())
                .for_each(|(row, text)| tok.tokenize_into(text, row));
        }
    }

    /// Decodes `items` into `memory`, replacing failures; `Ok(None)` when the stream ended
    /// before a full batch and `drop_last` discards it.
    fn fill(
        &mut self,
        items: Vec<Item>,
        memory: &mut [u8],
        target: usize,
    ) -> Result<Option<BatchMeta>, Fault> {
        let first_shard = items.first().map(Item::shard);
        let decoded = self.decode(items, memory);
        let mut slots = self.classify(decoded)?;
        let mut stream = self
            .stream
            .take()
            .expect("a batch is filled from the stream");
        let refilled = slots
            .iter()
            .try_for_each(|slot| self.count_verdict(slot.is_some(), &stream))
            .and_then(|()| self.refill(&mut slots, memory, &mut stream));
        self.stream = Some(stream);
        refilled?;
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
                    Ok((text, grid)) => Decoded::Good(Slot {
                        shard,
                        key: raw.key,
                        text,
                        origin: Origin::Stream,
                        grid,
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
                Ok((text, grid)) => {
                    self.rejected_run = 0;
                    return Ok(Some(Slot {
                        shard,
                        key: raw.key,
                        text,
                        origin,
                        grid,
                    }));
                }
                Err(rejection) => {
                    let fault = cfg.sample_fault(shard, raw.key, rejection);
                    if cfg.on_error == OnError::Raise {
                        return Err(fault);
                    }
                    self.stats.record_skip(fault);
                    if !cfg.planned {
                        verdict_counted(&mut self.rejected_run, cfg, &self.stats, false, stream)?;
                    }
                }
            }
        }
    }

    /// Counts a streaming sample's verdict; fails the pass once a whole cycle's worth of samples
    /// in a row was rejected: every sample of its shards fails, so a quota can never be met.
    fn count_verdict(&mut self, good: bool, stream: &ShuffledItems) -> Result<(), Fault> {
        verdict_counted(&mut self.rejected_run, &self.cfg, &self.stats, good, stream)
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
        let mut grids = Vec::new();
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
            grids.extend(slot.grid);
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
            // it forever): fail the pass, saying why: by the reason its samples were skipped for
            // (none had yet succeeded: no good sample is kept to pad with).
            let (reason, skipped) = match self.stats.top_skip() {
                Some((reason, count, all)) => (
                    reason,
                    format!(", {count} of the {all} skipped so far for {reason}"),
                ),
                None => (Reason::Unreadable, String::new()),
            };
            return Err(Fault {
                reason,
                url: first_shard.map(|s| cfg.display(s)).unwrap_or_default(),
                key: String::new(),
                detail: format!(
                    "all {target} samples of this rank's first batch failed{skipped}, and no \
                     reserve sample is left to replace them, so it cannot yield the batch every \
                     other rank yields; see the skipped samples in stats"
                ),
                kind: SourceKind::Other,
            });
        }
        if len == 0 {
            return Ok(None);
        }
        if self.cfg.planned {
            let grid = grids.first().copied();
            self.keep_last_good(&memory[..slot_len], shards[0], &keys[0], &texts[0], grid);
        }
        let urls = shards.iter().map(|&s| self.cfg.display(s)).collect();
        Ok(Some(BatchMeta {
            len,
            urls,
            keys,
            texts,
            shards,
            grids,
            reserve_used: self.reserve.used,
        }))
    }

    /// Remembers a good sample of this batch for [`Batcher::pad`]: one slot's copy, into the
    /// same buffer every time, so no allocation on the batch path after the first.
    fn keep_last_good(
        &mut self,
        pixels: &[u8],
        shard: u32,
        key: &str,
        text: &str,
        grid: Option<(u32, u32)>,
    ) {
        let (slot, copy) = self.last_good.get_or_insert_with(|| {
            let slot = Slot {
                shard: 0,
                key: String::new(),
                text: String::new(),
                origin: Origin::Stream,
                grid: None,
            };
            (slot, vec![0u8; pixels.len()])
        });
        copy.copy_from_slice(pixels);
        slot.shard = shard;
        slot.grid = grid;
        key.clone_into(&mut slot.key);
        text.clone_into(&mut slot.text);
    }
}

impl Kind for Batcher {
    type Meta = BatchMeta;

    /// Gathers the batch's items first, so a short final batch is known before a buffer is
    /// taken; then decodes, refills, pads and assembles them into it.
    fn next_batch(
        &mut self,
        lend: &mut dyn FnMut() -> Option<Lent>,
    ) -> Option<Result<BatchMeta, Fault>> {
        let (b, produced) = (self.cfg.batch_size, self.produced);
        if self.cfg.num_batches.is_some_and(|n| produced >= n) {
            return None;
        }
        let target = match (self.cfg.num_batches, self.cfg.last_batch_size) {
            (Some(n), Some(last)) if self.cfg.planned && produced + 1 == n => last.min(b),
            _ => b,
        };
        let items = match self.gather(target) {
            Ok(items) if items.is_empty() => return None,
            Ok(items) => items,
            Err(fault) => return Some(Err(fault)),
        };
        let mut lent = lend()?;
        let memory = lent.values::<u8>(0, b * self.slot_len)?;
        let meta = match self.fill(items, memory, target) {
            Ok(Some(meta)) => meta,
            Ok(None) => return None,
            Err(fault) => return Some(Err(fault)),
        };
        self.tokenize(&mut lent, &meta.texts);
        self.produced += 1;
        self.stats.record_sources(&self.cfg, &meta.shards);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .samples
            .fetch_add(meta.len as u64, Ordering::Relaxed);
        Some(Ok(meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::square::fixtures::{config, shard, span, SLOT};
    use crate::batch::square::reader::MergedReader;
    use crate::fixtures::{jpeg, raw, scratch_dir};
    use crate::read::span::ShardSpan;
    use std::collections::HashMap;

    /// A batcher on its own (no reader threads), for its phases.
    fn batcher(cfg: PipelineConfig, reserve: Vec<ShardSpan>) -> Batcher {
        let reserve = ReserveReader::new(reserve);
        Batcher::new(cfg, Arc::default(), None, reserve)
    }

    /// A stream with nothing in it.
    fn no_stream() -> ShuffledItems {
        let empty = MergedReader::new(vec![], 0, false);
        ShuffledItems::new(ItemSource::Merged(empty), &PipelineConfig::default())
    }

    fn good(key: &str, origin: Origin) -> Option<Slot> {
        Some(Slot {
            shard: 0,
            key: key.into(),
            text: format!("caption of {key}"),
            origin,
            grid: None,
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
}
