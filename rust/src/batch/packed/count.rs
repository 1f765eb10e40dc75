//! A unit's token count: its documents read and encoded exactly as the loader will (same
//! document rules, same encoder), so that the plan's positions are the loader's tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;

use super::documents::{TextSpec, TextUnit, UnitDocuments};
use crate::error::Fault;
use crate::read::source::{SourceOptions, SourceStats};
use crate::tokenize::DocumentEncoder;

/// Documents per tokenizing batch, and the text bytes after which a batch is encoded early: a
/// batch of 256 documents near `max_document_bytes` each held 256 of them at once (48 documents
/// of 48 MiB in one row group took 2.6 GB).
const CHUNK: usize = 256;
const CHUNK_BYTES: usize = 16 << 20;

/// What one unit holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitCount {
    /// Documents encoded (skipped ones not included).
    pub documents: u64,
    pub tokens: u64,
    /// Documents skipped, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// The first few skipped documents with key and detail.
    pub examples: Vec<Fault>,
}

const EXAMPLES: usize = 20;

/// Counts `unit`'s tokens, tokenizing in parallel on the current rayon pool; Err when the unit
/// cannot be read (it then holds no tokens for the plan, and the caller reports it).
pub fn count_unit(
    unit: &TextUnit,
    spec: &TextSpec,
    encoder: &DocumentEncoder,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<UnitCount, Fault> {
    let mut docs = UnitDocuments::open(unit, spec, opts, stats)?;
    let mut count = UnitCount::default();
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut chunk_bytes = 0;
    loop {
        let next = docs.next_document().transpose()?;
        let end = next.is_none();
        if let Some(doc) = next {
            chunk_bytes += doc.as_ref().map_or(0, String::len);
            chunk.push(doc);
        }
        if chunk.len() >= CHUNK || chunk_bytes >= CHUNK_BYTES || (end && !chunk.is_empty()) {
            chunk_bytes = 0;
            let lengths: Vec<Result<usize, Fault>> = std::mem::take(&mut chunk)
                .into_par_iter()
                .map(|doc| {
                    let text = doc?;
                    encoder
                        .encode(&text)
                        .map(|ids| ids.len())
                        .map_err(|detail| Fault {
                            reason: crate::error::Reason::Internal,
                            url: unit.display(),
                            key: String::new(),
                            detail: format!(
                                "the tokenizer failed: {}",
                                crate::error::capped_detail(detail.to_string())
                            ),
                            kind: crate::error::SourceKind::Other,
                        })
                })
                .collect();
            for length in lengths {
                match length {
                    Ok(n) => {
                        count.documents += 1;
                        count.tokens += n as u64;
                    }
                    Err(fault) => {
                        *count.skipped.entry(fault.reason.as_str()).or_default() += 1;
                        if count.examples.len() < EXAMPLES {
                            count.examples.push(fault);
                        }
                    }
                }
            }
        }
        if end {
            return Ok(count);
        }
    }
}
