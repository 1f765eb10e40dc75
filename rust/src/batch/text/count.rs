//! A unit's token count: its documents read and encoded exactly as the loader will (same
//! document rules, same encoder), so that the plan's positions are the loader's tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;

use super::documents::{TextSpec, UnitDocuments};
use crate::batch::kit::unit::Unit;
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
    unit: &Unit,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::kit::sample::CaptionSource;
    use crate::error::Reason;
    use crate::fixtures::scratch_dir;
    use crate::read::parquet::tests::write_one_bad_document;

    const GPT2_STYLE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenizers/captions-bpe.json"
    );

    #[test]
    fn a_parquet_document_of_invalid_utf8_is_skipped_alone_by_the_count_and_the_reader() {
        let dir = scratch_dir("documents-bad-utf8");
        let path = dir.join("docs.parquet");
        let docs = write_one_bad_document(&path);
        let spec = TextSpec {
            source: CaptionSource::Member("text".into()),
            max_document_bytes: 64 << 20,
        };
        let opts = SourceOptions::default();
        let stats = Arc::new(SourceStats::default());
        let units = [0, 50].map(|first_row| Unit {
            url: path.to_str().unwrap().into(),
            first_row,
            rows: Some(50),
            identity: None,
        });
        let (mut good, mut skipped) = (Vec::new(), Vec::new());
        for unit in &units {
            let mut unit_docs = UnitDocuments::open(unit, &spec, &opts, &stats).unwrap();
            while let Some(doc) = unit_docs.next_document() {
                match doc.expect("no unit fails") {
                    Ok(text) => good.push(text),
                    Err(fault) => skipped.push(fault),
                }
            }
        }
        let want: Vec<String> = docs
            .iter()
            .enumerate()
            .filter(|(row, _)| *row != 37)
            .map(|(_, d)| String::from_utf8(d.clone()).unwrap())
            .collect();
        assert_eq!(good, want, "the 99 good documents, in order");
        assert_eq!(skipped.len(), 1);
        let fault = &skipped[0];
        assert_eq!(
            (fault.reason, fault.key.as_str()),
            (Reason::BadUtf8, "docs/37")
        );
        // File, row and the first invalid byte's offset; never the document.
        assert!(fault.url.contains("docs.parquet"), "{}", fault.url);
        assert!(
            fault.detail.contains("row 37") && fault.detail.contains("index 5"),
            "{}",
            fault.detail
        );
        let text = String::from_utf8_lossy(&docs[37]);
        assert!(
            !fault.detail.contains(&text[..4]) && fault.detail.len() < 120,
            "{}",
            fault.detail
        );
        // The counting pass skips the same document, so the plan's tokens are the reader's.
        let encoder = DocumentEncoder::from_file(GPT2_STYLE, None, None).unwrap();
        let counts: Vec<_> = units
            .iter()
            .map(|u| count_unit(u, &spec, &encoder, &opts, &stats).unwrap())
            .collect();
        assert_eq!((counts[0].documents, counts[1].documents), (49, 50));
        assert_eq!(counts[0].skipped, BTreeMap::from([("bad_utf8", 1)]));
        assert!(counts[1].skipped.is_empty());
        let tokens: usize = want.iter().map(|d| encoder.encode(d).unwrap().len()).sum();
        assert_eq!(counts[0].tokens + counts[1].tokens, tokens as u64);
    }
}
