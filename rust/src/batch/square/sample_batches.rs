//! The sample kinds' batches (square images, and NaFlex images at a fixed count per batch):
//! shard spans in, `batch_size` samples a batch, on the one pipeline.
//!
//! ```text
//! read-ahead threads (one shard span each, in turn) ──ordered merge──▶ block shuffle
//!   ──▶ batcher: B samples decoded in parallel straight into the caller's buffer
//! ```
//!
//! Memory is bounded by configuration: `read_ahead` spans x `span_queue` samples, one shuffle
//! block of compressed samples, and the output buffers the caller lends. Nothing grows with
//! shard or dataset size.
//!
//! A mixture's reader reads one such merged stream per source and takes each block's share of
//! each, in source order (`MixedReader`; the plan says how many).
//!
//! Two modes share this code. *Planned* (an index is present): every span names exact
//! ordinals, a sample that cannot be produced becomes a placeholder so block and batch
//! boundaries never move, and a failed slot is refilled from the reserve spans, so every rank
//! yields exactly `num_batches`. *Streaming* (no index): failures are skipped and the next
//! sample takes their place.
//!
//! A lent buffer has two regions: the `[B, slot]` pixels, and with a tokenizer the
//! `[B, context_length]` int64 tokens.

use std::collections::HashMap;
use std::sync::Arc;

use crate::batch::pipeline::{KindStats, Need, Pipeline, Setup};
pub use crate::batch::square::assemble::{BatchMeta, Batcher};
use crate::batch::square::config::PipelineConfig;
use crate::batch::square::mix::MixedReader;
use crate::batch::square::reader::spawn_readers;
use crate::batch::square::reserve::ReserveReader;
use crate::batch::square::shuffle::ItemSource;
use crate::batch::square::stats::Stats;
use crate::read::source::redact_url;
use crate::read::span::ShardSpan;

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

impl KindStats for Stats {
    fn snapshot(&self) -> serde_json::Value {
        Stats::snapshot(self)
    }
}

/// The running pipeline of one reader of the sample kinds.
pub type SamplePipeline = Pipeline<Batcher, Stats>;

/// Starts the pipeline of one reader: `main` spans, `reserve` spans that refill a planned
/// batch's failures, shaped by `cfg` (validated by the caller).
pub fn start(main: MainSpans, reserve: Vec<ShardSpan>, mut cfg: PipelineConfig) -> SamplePipeline {
    cfg.display_urls = Arc::new(display_table(main.iter().chain(&reserve)));
    let setup = Setup {
        threads: cfg.threads,
        stage: "decode",
        needs: vec![
            Need {
                name: "pixel",
                bytes: cfg.batch_bytes(),
            },
            Need {
                name: "token",
                bytes: cfg.token_len() * 8,
            },
        ],
        batches_left: cfg.num_batches,
    };
    let stats = Arc::new(Stats::default());
    let batch_stats = stats.clone();
    Pipeline::start(setup, stats, move |stop| {
        let main = match main {
            MainSpans::Spans(spans) => {
                ItemSource::Merged(spawn_readers(spans, &cfg, &batch_stats, &stop))
            }
            MainSpans::Mixed {
                streams,
                block_counts,
            } => ItemSource::Mixed(MixedReader::new(
                streams
                    .into_iter()
                    .map(|spans| spawn_readers(spans, &cfg, &batch_stats, &stop))
                    .collect(),
                block_counts,
            )),
        };
        Batcher::new(cfg, batch_stats, Some(main), ReserveReader::new(reserve))
    })
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
    use crate::batch::pipeline::{Lent, Region};
    use crate::batch::square::fixtures::{config, shard, span, SLOT};
    use crate::error::Fault;
    use crate::fixtures::scratch_dir;
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
        let pipeline = start(MainSpans::Spans(main), reserve, cfg);
        let mut buffers: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; b * SLOT]).collect();
        for buffer in &mut buffers {
            let region = Region {
                ptr: buffer.as_mut_ptr(),
                bytes: buffer.len(),
            };
            let lent = Lent {
                regions: vec![region, Region::NONE],
                owner: None,
            };
            assert_eq!(pipeline.submit(lent), Ok(true));
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
