//! What one pipeline runs with: the batch and sample specs, thread counts and queue depths, the
//! plan's shuffle and resume positions, the error policy and the sources of a mixture, and how
//! a fault names its shard.

use std::collections::HashMap;
use std::sync::Arc;

use crate::batch::kit::patches::NaFlexSpec;
use crate::batch::kit::sample::{CaptionSource, Rejection, SampleSpec};
use crate::defaults;
use crate::error::{Fault, SourceKind};
use crate::read::group::ShardFault;
use crate::read::source::{redact_url, SourceOptions};
use crate::read::span::ShardSpan;

/// The error policy (`on_error`), the read stage's as well: re-exported where the loader's
/// configuration has always named it.
pub use crate::error::OnError;

/// What one sample becomes in its batch slot. Reading, the plan, shuffling, refills and padding
/// are the same for every kind; only the per-sample function and the slot's layout differ.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum SampleKind {
    /// `[3, S, S]` pixels, S = `spec.image_size` (`spec.crop` squares the image).
    #[default]
    Square,
    /// `max_num_patches` flattened patches of the image at its own aspect ratio, and its patch
    /// grid (see `batch::kit::patches`).
    NaFlex(NaFlexSpec),
    /// The square kind's slot left as it is: each sample's caption and image member are taken
    /// (a sample without them is skipped as usual) but the image is not decoded. For
    /// `benches/bench_serial_path.py` only (config key `undecoded`): a run measures everything
    /// but decoding, the part of each sample that no number of decode threads makes faster.
    Undecoded,
}

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub spec: SampleSpec,
    /// The layout of a sample's slot (the spec's image keys, caption and `max_pixels` hold for
    /// every kind).
    pub kind: SampleKind,
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
    pub tokenizer: Option<Arc<crate::tokenize::ClipTokenizer>>,
}

impl PipelineConfig {
    /// What the pipeline cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("batch_size must be positive".into());
        }
        match &self.kind {
            SampleKind::Square | SampleKind::Undecoded => Ok(()),
            SampleKind::NaFlex(naflex) => naflex.validate(),
        }
    }

    /// Bytes of one sample's slot: `[3, S, S]` (square) or `[N, 3 * p * p]` (NaFlex) uint8.
    pub fn slot_len(&self) -> usize {
        match &self.kind {
            SampleKind::Square | SampleKind::Undecoded => {
                3 * (self.spec.image_size as usize).pow(2)
            }
            SampleKind::NaFlex(naflex) => naflex.slot_len(),
        }
    }

    /// Bytes of one batch's images: `batch_size` slots.
    pub fn batch_bytes(&self) -> usize {
        self.batch_size * self.slot_len()
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
    pub(super) fn source_of(&self, shard: u32) -> Option<usize> {
        match self.sources.partition_point(|&(first, _)| first <= shard) {
            0 => None,
            n => Some(n - 1),
        }
    }

    pub(super) fn spec_for(&self, shard: u32) -> &SampleSpec {
        self.source_of(shard)
            .map_or(&self.spec, |i| &self.sources[i].1)
    }

    pub(super) fn display(&self, shard: u32) -> String {
        self.display_urls
            .get(&shard)
            .cloned()
            .unwrap_or_else(|| format!("shard #{shard}"))
    }

    /// The fault of sample `key` of `shard`, rejected for `reason` (detail).
    pub(super) fn sample_fault(
        &self,
        shard: u32,
        key: String,
        (reason, detail): Rejection,
    ) -> Fault {
        Fault {
            reason,
            url: self.display(shard),
            key,
            detail,
            kind: SourceKind::Other,
        }
    }

    pub(super) fn shard_fault(&self, span: &ShardSpan, f: ShardFault) -> Fault {
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
            kind: SampleKind::Square,
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
