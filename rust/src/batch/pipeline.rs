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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::batch::assemble::Batcher;
use crate::batch::config::PipelineConfig;
use crate::batch::mix::MixedReader;
use crate::batch::panics::panic_fault;
use crate::batch::reader::spawn_readers;
use crate::batch::reserve::ReserveReader;
use crate::batch::shuffle::ItemSource;
use crate::batch::span::ShardSpan;
use crate::batch::stats::Stats;
use crate::error::Fault;
use crate::read::source::redact_url;

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
    /// The NaFlex kind: each sample's patch grid (rows, columns), in batch order; empty for
    /// the square kind.
    pub grids: Vec<(u32, u32)>,
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
        let main = match main {
            MainSpans::Spans(spans) => {
                ItemSource::Merged(spawn_readers(spans, &cfg, &stats, &stop))
            }
            MainSpans::Mixed {
                streams,
                block_counts,
            } => ItemSource::Mixed(MixedReader::new(
                streams
                    .into_iter()
                    .map(|spans| spawn_readers(spans, &cfg, &stats, &stop))
                    .collect(),
                block_counts,
            )),
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
                let reserve = ReserveReader::new(reserve);
                let mut batcher = Batcher::new(cfg, stats, stop, Some(main), reserve);
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
        finish_batcher(batcher, &self.batches);
    }
}

/// Waits for a stopped pipeline's batcher thread, draining its output so it never blocks, for at
/// most `DROP_WAIT`; after that it is left to finish on its own (it may be inside a network read
/// with its own timeouts; the buffers it holds stay alive through their owners).
pub(super) fn finish_batcher<T>(batcher: JoinHandle<()>, output: &Receiver<T>) {
    let deadline = Instant::now() + DROP_WAIT;
    while !batcher.is_finished() && Instant::now() < deadline {
        while output.try_recv().is_ok() {}
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if batcher.is_finished() {
        let _ = batcher.join();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::fixtures::{config, shard, span, SLOT};
    use crate::batch::sample::fixtures::scratch_dir;
    use crate::plan;

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
}
