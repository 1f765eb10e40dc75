//! A batch whose slots were decoded in parallel, finished: the slots that failed dropped (the
//! rest moved up, each failure counted by reason) and the kept captions tokenized into the
//! lent token region. What every kind that drops a failed slot from its batch does after
//! decoding (the NaFlex token-budget batches, the video clips).

use std::collections::BTreeMap;
use std::sync::Mutex;

use rayon::prelude::*;

use super::sample::Rejection;
use crate::batch::pipeline::Lent;
use crate::tokenize::ClipTokenizer;

/// Keeps the slots of `out` (each `slot` bytes) whose result is Ok, moved up in order over the
/// failed ones; counts each failure in `skipped` by its reason. Returns the kept (index of the
/// slot in the batch as decoded, value).
pub fn keep_decoded<T>(
    out: &mut [u8],
    slot: usize,
    results: Vec<Result<T, Rejection>>,
    skipped: &Mutex<BTreeMap<String, u64>>,
) -> Vec<(usize, T)> {
    let mut kept = Vec::with_capacity(results.len());
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(value) => {
                let at = kept.len();
                if at != i {
                    out.copy_within(i * slot..(i + 1) * slot, at * slot);
                }
                kept.push((i, value));
            }
            Err((reason, _)) => {
                *skipped
                    .lock()
                    .expect("stats lock")
                    .entry(reason.as_str().to_string())
                    .or_default() += 1;
            }
        }
    }
    kept
}

/// Tokenizes `texts` into the lent buffer's `region` (int64 rows of the tokenizer's context
/// length), one row each, on the pool; nothing without a tokenizer.
pub fn tokenize_captions(
    lent: &mut Lent,
    region: usize,
    tokenizer: Option<&ClipTokenizer>,
    texts: &[String],
) {
    let Some(tok) = tokenizer else {
        return;
    };
    let ctx = tok.context_length.max(1);
    if let Some(tokens) = lent.values::<i64>(region, texts.len() * ctx) {
        tokens
            .par_chunks_mut(ctx)
            .zip(texts.par_iter())
            .for_each(|(row, text)| tok.tokenize_into(text, row));
    }
}
