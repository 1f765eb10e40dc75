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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::rows::{segment_lengths, write_ids, write_positions, Block, IdsOut};
use super::stats::PackedStats;
use super::stream::{visits, StreamInput, TokenStream};
use crate::batch::panics::panic_fault;
use crate::batch::pipeline::finish_batcher;
use crate::error::Fault;
use crate::plan::block_order;
use crate::plan::packed::{slice, PackedReader, UnitOrder};
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

/// A caller-provided batch: `[B, L]` ids, and `[B, L]` int64 positions with boundaries. The
/// caller keeps the memory alive and untouched until the batch filled into it comes back.
pub struct RowsBuffer {
    pub ids: *mut u8,
    pub ids_bytes: usize,
    pub positions: Option<(*mut i64, usize)>,
    pub owner: Option<Box<dyn std::any::Any + Send>>,
}

// SAFETY: as `pipeline::OutBuffer`: one batch writes a buffer at a time, `owner` keeps it alive.
unsafe impl Send for RowsBuffer {}

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

pub struct PackedPipeline {
    buffers: Option<Sender<RowsBuffer>>,
    batches: Receiver<RowsResult>,
    stop: Arc<AtomicBool>,
    pub stats: Arc<PackedStats>,
    batcher: Option<JoinHandle<()>>,
    pub batches_left: u64,
}

impl PackedPipeline {
    pub fn start(
        input: Arc<StreamInput>,
        order: &UnitOrder,
        reader: PackedReader,
        encoder: Arc<DocumentEncoder>,
        cfg: PackedConfig,
    ) -> Self {
        let stats = Arc::new(PackedStats::default());
        let stop = Arc::new(AtomicBool::new(false));
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
        let (buf_tx, buf_rx) = bounded::<RowsBuffer>(64);
        let (out_tx, out_rx) = bounded::<RowsResult>(64);
        let batcher = {
            let stats = stats.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(cfg.threads.max(1))
                    .thread_name(|i| format!("shardstream-tokenize-{i}"))
                    .build()
                    .expect("tokenizer thread pool");
                let faults = out_tx.clone();
                let run = std::panic::AssertUnwindSafe(|| {
                    pool.install(|| {
                        let stream = TokenStream::start(
                            planned,
                            input,
                            encoder,
                            stats.clone(),
                            stop.clone(),
                        );
                        let mut batcher = RowBatcher {
                            stream,
                            block: Block::default(),
                            reader,
                            next_block: first_block,
                            cfg,
                            stats,
                            stop,
                        };
                        batcher.run(batches_left, buf_rx, out_tx)
                    })
                });
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let _ = faults.send(Err(panic_fault("packing", panic.as_ref())));
                }
            })
        };
        Self {
            buffers: Some(buf_tx),
            batches: out_rx,
            stop,
            stats,
            batcher: Some(batcher),
            batches_left,
        }
    }

    pub fn submit(&self, buffer: RowsBuffer) -> bool {
        self.buffers
            .as_ref()
            .is_some_and(|b| b.send(buffer).is_ok())
    }

    /// The next batch; None at the end of the reader's share.
    pub fn next_batch(&self) -> Option<RowsResult> {
        self.batches.recv().ok()
    }
}

impl Drop for PackedPipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.buffers.take();
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        finish_batcher(batcher, &self.batches);
    }
}

struct RowBatcher {
    stream: TokenStream,
    block: Block,
    reader: PackedReader,
    next_block: u64,
    cfg: PackedConfig,
    stats: Arc<PackedStats>,
    stop: Arc<AtomicBool>,
}

impl RowBatcher {
    fn run(&mut self, batches: u64, buffers: Receiver<RowsBuffer>, out: Sender<RowsResult>) {
        for _ in 0..batches {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(buffer) = buffers.recv() else { return };
            let result = self.fill(&buffer);
            let failed = result.is_err();
            if out.send(result).is_err() || failed {
                return;
            }
        }
    }

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

    fn fill(&mut self, buffer: &RowsBuffer) -> RowsResult {
        let (b, seq_len) = (self.cfg.batch_size, self.reader.seq_len as usize);
        let width = if self.cfg.int32 { 4 } else { 8 };
        assert!(
            buffer.ids_bytes >= b * seq_len * width,
            "ids buffer too small"
        );
        // SAFETY: see RowsBuffer; the caller keeps the memory alive until this batch returns.
        let mut ids = unsafe {
            if self.cfg.int32 {
                IdsOut::I32(std::slice::from_raw_parts_mut(
                    buffer.ids as *mut i32,
                    b * seq_len,
                ))
            } else {
                IdsOut::I64(std::slice::from_raw_parts_mut(
                    buffer.ids as *mut i64,
                    b * seq_len,
                ))
            }
        };
        let mut positions = buffer.positions.map(|(ptr, len)| {
            assert!(len >= b * seq_len, "positions buffer too small");
            // SAFETY: as for the ids.
            unsafe { std::slice::from_raw_parts_mut(ptr, b * seq_len) }
        });
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
