//! The count pass of one unit: its documents read, measured and packed exactly as the loader
//! will (same rules, same encoder, same spec), recording the batches they make; no image is
//! decoded, only headers read.

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;

use super::documents::{DocumentResult, UnitDocuments};
use super::measure::{Item, Measured};
use super::pack::Packer;
use super::InterleavedSpec;
use crate::batch::kit::unit::Unit;
use crate::batch::units::{self, Counted};
use crate::error::Fault;
use crate::image::decode::Decoder;
use crate::read::source::{SourceOptions, SourceStats};
use crate::tokenize::DocumentEncoder;

/// Documents measured at a time.
pub(super) const CHUNK: usize = 64;

/// What one unit holds under a spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterleavedCount {
    /// Documents packed (skipped ones not included).
    pub documents: u64,
    pub batches: u64,
    pub text_tokens: u64,
    pub image_tokens: u64,
    pub images: u64,
    /// Tokens of the video runs, and the videos.
    pub video_tokens: u64,
    pub videos: u64,
    pub patches: u64,
    /// Token slots of its batches (`batches x rows x seq_len`): the rest is padding.
    pub slots: u64,
    /// Slots had the documents been batched `rows` at a time in file order, each batch padded
    /// to its longest document (no packing): what packing saves.
    pub padded_slots: u64,
    /// Documents skipped, by reason, and a few (key, reason, detail).
    pub skipped: BTreeMap<String, u64>,
    pub examples: Vec<(String, String, String)>,
}

const EXAMPLES: usize = 5;

thread_local! {
    static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::default());
}

/// Measures `docs` in parallel on the current pool, in order.
pub(super) fn measure_chunk(
    docs: Vec<DocumentResult>,
    spec: &InterleavedSpec,
    encoder: &DocumentEncoder,
    keep_bytes: bool,
) -> Vec<Result<Measured, (String, crate::batch::kit::sample::Rejection)>> {
    let measure = spec.measure(encoder, keep_bytes);
    docs.into_par_iter()
        .map(|doc| {
            let doc = doc?;
            let key = doc.key.clone();
            DECODER.with(|d| {
                measure
                    .measure(doc, &mut d.borrow_mut())
                    .map_err(|r| (key, r))
            })
        })
        .collect()
}

/// Counts `unit`'s batches.
pub fn count_unit(
    unit: &Unit,
    spec: &InterleavedSpec,
    encoder: &DocumentEncoder,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<InterleavedCount, Fault> {
    let mut docs = UnitDocuments::open(unit, &spec.documents, opts, stats)?;
    let mut packer = Packer::new(spec.shape);
    let mut out = InterleavedCount::default();
    let mut chunk = Vec::with_capacity(CHUNK);
    // The lengths of the documents of the unpacked baseline's open batch.
    let mut longest: Vec<u64> = Vec::with_capacity(spec.shape.rows);
    let padded = |lengths: &mut Vec<u64>| {
        let slots = lengths.len() as u64 * lengths.iter().copied().max().unwrap_or(0);
        lengths.clear();
        slots
    };
    let tally = |out: &mut InterleavedCount, packer: &mut Packer| {
        while packer.pop().is_some() {
            out.batches += 1;
            out.slots += (spec.shape.rows * spec.shape.seq_len) as u64;
        }
    };
    loop {
        let next = docs.next_document().transpose()?;
        let end = next.is_none();
        chunk.extend(next);
        if chunk.len() >= CHUNK || end {
            for measured in measure_chunk(std::mem::take(&mut chunk), spec, encoder, false) {
                match measured {
                    Ok(doc) => {
                        out.documents += 1;
                        for item in &doc.items {
                            match item {
                                Item::Text(ids) | Item::Context(ids) => {
                                    out.text_tokens += ids.len() as u64
                                }
                                Item::Image { tokens, .. } => {
                                    out.image_tokens += *tokens as u64;
                                    out.images += 1;
                                }
                                Item::Video { tokens, .. } => {
                                    out.video_tokens += *tokens as u64;
                                    out.videos += 1;
                                }
                            }
                        }
                        out.patches += doc.patches;
                        longest.push(doc.tokens as u64);
                        if longest.len() == spec.shape.rows {
                            out.padded_slots += padded(&mut longest);
                        }
                        packer.push(Arc::new(doc));
                    }
                    Err((key, (reason, detail))) => {
                        *out.skipped.entry(reason.as_str().to_string()).or_default() += 1;
                        if out.examples.len() < EXAMPLES {
                            out.examples
                                .push((key, reason.as_str().to_string(), detail));
                        }
                    }
                }
                tally(&mut out, &mut packer);
            }
        }
        if end {
            out.padded_slots += padded(&mut longest);
            packer.finish();
            tally(&mut out, &mut packer);
            return Ok(out);
        }
    }
}

/// Counts every unit of `urls` on `threads` threads, units in file order. This kind's unit is a
/// whole file (see `documents`): a Parquet file is counted whole at its first row group, and its
/// later row groups are left out.
pub fn count_files(
    urls: &[String],
    threads: usize,
    opts: &SourceOptions,
    spec: &InterleavedSpec,
    encoder: &DocumentEncoder,
) -> Result<Vec<Counted<InterleavedCount>>, String> {
    let whole = |u: &Unit| Unit {
        rows: None,
        ..u.clone()
    };
    let counted = units::count_files(urls, threads, opts, |u, s| {
        (u.first_row == 0)
            .then(|| count_unit(&whole(u), spec, encoder, opts, s))
            .transpose()
    })?;
    // One unit a file (a first row group of no rows would put a second one at row 0).
    let mut seen = std::collections::HashSet::new();
    Ok(counted
        .into_iter()
        .filter(|c| c.unit.is_none() || c.result.as_ref().map_or(true, Option::is_some))
        .filter(|c| seen.insert(c.url.clone()))
        .filter_map(|c| {
            Some(Counted {
                unit: c.unit.as_ref().map(whole),
                result: c.result.transpose()?,
                url: c.url,
            })
        })
        .collect())
}
