//! The packed pipeline of one reader: its token stream cut into blocks of rows, each block
//! emitted in its seeded order into the batch buffers the caller lends.
//!
//! ```text
//! document thread (units, in order) ──chunks──▶ batcher: tokenize on the pool, keep the
//!   planned positions, fill a block ──▶ rows in the block's order ──▶ [B, L] ids (+ positions)
//! ```
//!
//! Memory is bounded by configuration: one block (`block_rows x seq_len` tokens), a few chunks
//! of documents (`stream`), and the buffers the caller lends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rows::{segment_lengths, write_ids, write_positions, Block, IdsOut};
use super::stats::PackedStats;
use super::stream::{StreamInput, TokenStream};
use crate::batch::kit::visits::visits;
use crate::batch::pipeline::{Kind, KindStats, Lent, Need, Pipeline, Setup};
use crate::error::Fault;
use crate::plan::block_order;
use crate::plan::unit_stream::{slice, StreamReader, UnitOrder};
use crate::tokenize::DocumentEncoder;

/// How the batches are shaped.
#[derive(Clone, Debug)]
pub struct PackedConfig {
    pub batch_size: usize,
    pub threads: usize,
    /// Ids as int32 (else int64).
    pub int32: bool,
    /// Write position ids and return each batch's `cu_seqlens`.
    pub boundaries: bool,
}

/// One finished batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsMeta {
    pub rows: usize,
    /// With boundaries: the batch's sequences as FlashAttention's varlen kernels take them,
    /// over the flattened `[B * L]` tokens: 0, end of the first sequence, ..., B * L.
    pub cu_seqlens: Vec<i32>,
    pub max_seqlen: u32,
}

pub type RowsResult = Result<RowsMeta, Fault>;

impl KindStats for PackedStats {
    fn snapshot(&self) -> serde_json::Value {
        PackedStats::snapshot(self)
    }
}

/// The running packed pipeline of one reader.
pub type PackedPipeline = Pipeline<RowBatcher, PackedStats>;

/// Starts the pipeline of `reader`. A lent buffer has two regions: the `[B, L]` ids (int32 or
/// int64), and with boundaries the `[B, L]` int64 position ids.
pub fn start(
    input: Arc<StreamInput>,
    order: &UnitOrder,
    reader: StreamReader,
    encoder: Arc<DocumentEncoder>,
    cfg: PackedConfig,
) -> PackedPipeline {
    let stats = Arc::new(PackedStats::default());
    let seq_len = reader.seq_len as u64;
    let block = reader.block_rows as u64;
    let first_block = reader.skip_rows / block;
    let ranges = slice(
        &reader.ranges,
        first_block * block * seq_len,
        reader.rows * seq_len,
    );
    let planned = visits(order, &ranges);
    let batches_left = reader.batches_left(cfg.batch_size as u32);
    let tokens = cfg.batch_size * reader.seq_len as usize;
    let setup = Setup {
        threads: cfg.threads,
        stage: "tokenize",
        needs: vec![
            Need {
                name: "ids",
                bytes: tokens * if cfg.int32 { 4 } else { 8 },
            },
            Need {
                name: "positions",
                bytes: if cfg.boundaries { tokens * 8 } else { 0 },
            },
        ],
        batches_left: Some(batches_left),
    };
    let batch_stats = stats.clone();
    Pipeline::start(setup, stats, move |stop| {
        let stream = TokenStream::start(planned, input, encoder, batch_stats.clone(), stop);
        RowBatcher {
            stream,
            block: Block::default(),
            reader,
            next_block: first_block,
            batches_left,
            cfg,
            stats: batch_stats,
        }
    })
}

impl Kind for RowBatcher {
    type Meta = RowsMeta;

    fn next_batch(&mut self, lend: &mut dyn FnMut() -> Option<Lent>) -> Option<RowsResult> {
        if self.batches_left == 0 {
            return None;
        }
        let mut lent = lend()?;
        self.batches_left -= 1;
        Some(self.fill(&mut lent))
    }
}

/// The packed kind on the pipeline: blocks of rows cut from the reader's token stream.
pub struct RowBatcher {
    stream: TokenStream,
    block: Block,
    reader: StreamReader,
    next_block: u64,
    batches_left: u64,
    cfg: PackedConfig,
    stats: Arc<PackedStats>,
}

impl RowBatcher {
    /// Loads the next block of rows from the stream.
    fn load_block(&mut self) -> Result<(), Fault> {
        let block = self.reader.block_rows as u64;
        let seq_len = self.reader.seq_len as usize;
        let j = self.next_block;
        let rows = block.min(self.reader.rows - j * block) as usize;
        self.block.tokens.clear();
        self.block.starts.clear();
        self.stream.take(
            rows * seq_len,
            &mut self.block.tokens,
            &mut self.block.starts,
            0,
        )?;
        let skip = if j * block < self.reader.skip_rows {
            (self.reader.skip_rows - j * block) as usize
        } else {
            0
        };
        self.block
            .reset(block_order(self.reader.block_seed, j, rows), skip);
        self.next_block += 1;
        Ok(())
    }

    fn fill(&mut self, lent: &mut Lent) -> RowsResult {
        let (b, seq_len) = (self.cfg.batch_size, self.reader.seq_len as usize);
        let n = b * seq_len;
        let (mut ids, mut positions) = if self.cfg.int32 {
            let (ids, positions) = lent.pair::<i32, i64>((0, n), (1, n));
            (IdsOut::I32(ids.expect("a lent ids region")), positions)
        } else {
            let (ids, positions) = lent.pair::<i64, i64>((0, n), (1, n));
            (IdsOut::I64(ids.expect("a lent ids region")), positions)
        };
        let mut cu_seqlens = vec![0i32];
        let mut max_seqlen = 0u32;
        let mut documents = 0u64;
        for row in 0..b {
            if self.block.exhausted() {
                self.load_block()?;
            }
            let (tokens, starts) = self.block.next_row(seq_len);
            write_ids(&mut ids, row, tokens);
            documents += starts.len() as u64;
            if self.cfg.boundaries {
                let lengths = segment_lengths(seq_len, &starts);
                if let Some(out) = positions.as_deref_mut() {
                    write_positions(&mut out[row * seq_len..(row + 1) * seq_len], &lengths);
                }
                for len in lengths {
                    max_seqlen = max_seqlen.max(len);
                    cu_seqlens.push(cu_seqlens.last().copied().unwrap_or(0) + len as i32);
                }
            }
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.rows.fetch_add(b as u64, Ordering::Relaxed);
        self.stats
            .tokens
            .fetch_add((b * seq_len) as u64, Ordering::Relaxed);
        self.stats.documents.fetch_add(documents, Ordering::Relaxed);
        if !self.cfg.boundaries {
            cu_seqlens.clear();
        }
        Ok(RowsMeta {
            rows: b,
            cu_seqlens,
            max_seqlen,
        })
    }
}
