//! Long documents encoded in pieces, so that a reader's memory is bounded by configuration and
//! not by document size: the `tokenizers` library holds about 170 bytes per byte of text while it
//! encodes one (its normalized-string alignments and the encoding's offsets and token strings),
//! so a 50 MB document would need gigabytes.
//!
//! A piece ends at a line break where the tokenizer's own pipeline is certain to split, so the
//! pieces' ids, concatenated, are the whole document's ids:
//! - the normalizer works character by character (NFC/NFD/NFKC/NFKD, lowercasing, BERT's);
//! - the pre-tokenizer splits at that point: GPT-2's byte-level regex, Llama 3's (GPT-4's)
//!   split pattern (or Qwen2's) followed by a byte-level map, BERT's or plain whitespace splitting. After a
//!   `\n`, each of them starts a new pre-token at the next character that is not whitespace;
//!   a byte-level pre-tokenizer that adds a prefix space must see the next piece start with the
//!   space it would otherwise add, so there the cut is `\n` | ` ` + a character that is not
//!   whitespace;
//! - the whitespace before the cut is one pre-token in the piece as in the whole document. GPT-2's
//!   regex ends a whitespace run with a look-ahead (`\s+(?!\S)`): in the whole document a run
//!   `"\n\n"` (or `" \n"`, `"\r\n"`) before a letter is two pre-tokens, the last `\n` alone,
//!   while at the end of a piece nothing follows and it is one. So where GPT-2's regex is the
//!   first split and adds no prefix space, the cut is *before* a `\n` that precedes a character
//!   that is not whitespace: that `\n` is a pre-token of its own in the whole document and at
//!   the start of a piece, and the run before it, followed by whitespace in the document and by
//!   nothing in the piece, is taken whole by the look-ahead in both. With a prefix space the
//!   next piece starts with that space, so the run is followed by whitespace in both, and Llama
//!   3's pattern takes a run ending in line breaks whole (`\s*[\r\n]+`): neither needs it (nor
//!   does a GPT-2 regex in a later byte-level step: it splits the first step's pre-tokens,
//!   which a cut leaves whole);
//! - no added token spans the cut (none holds a `\n` before its last character).
//!
//! A tokenizer outside this list (a SentencePiece `Metaspace`, a `Replace` normalizer, another
//! split pattern) has its documents encoded whole: memory then grows with the document, up to
//! `max_document_bytes`. So does a stretch without a usable line break (minified code).

use serde_json::Value;

use super::bpe::pretokenize::{LLAMA3, QWEN2};

/// Pieces are cut near this many bytes (never more than `4 x` without a cut point).
pub const WINDOW: usize = 64 << 10;

/// Where a document may be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutRule {
    /// After `\n`, before a character that is not whitespace.
    AfterLineBreak,
    /// Before a `\n` that precedes a character that is not whitespace (GPT-2's regex without a
    /// prefix space: see the module's doc).
    BeforeLineBreak,
    /// After `\n`, before a space followed by a character that is not whitespace.
    AfterLineBreakBeforeSpace,
}

/// The cut rule of a `tokenizer.json` (its parsed JSON), or None: encode documents whole.
pub fn cut_rule(json: &Value) -> Option<CutRule> {
    if !normalizer_is_local(&json["normalizer"]) {
        return None;
    }
    let added_safe = json["added_tokens"].as_array().is_none_or(|tokens| {
        tokens.iter().all(|t| {
            let content = t["content"].as_str().unwrap_or("");
            !content.trim_end_matches('\n').contains('\n')
        })
    });
    if !added_safe {
        return None;
    }
    let mut steps = Steps::default();
    if !pre_tokenizer_splits_lines(&json["pre_tokenizer"], &mut steps) {
        return None;
    }
    Some(if steps.prefix_space {
        CutRule::AfterLineBreakBeforeSpace
    } else if steps.gpt2_regex {
        CutRule::BeforeLineBreak
    } else {
        CutRule::AfterLineBreak
    })
}

/// What the pre-tokenizer's steps do that moves the cut.
#[derive(Default)]
struct Steps {
    /// A byte-level step adds a prefix space.
    prefix_space: bool,
    /// The first splitting step is byte-level with GPT-2's regex (its whitespace look-ahead).
    gpt2_regex: bool,
}

fn normalizer_is_local(n: &Value) -> bool {
    match n["type"].as_str() {
        None => n.is_null(),
        Some("NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase" | "BertNormalizer") => true,
        Some("Sequence") => n["normalizers"]
            .as_array()
            .is_some_and(|all| all.iter().all(normalizer_is_local)),
        Some(_) => false,
    }
}

/// Whether the pre-tokenizer starts a pre-token after every `\n` (see the module's doc); notes
/// in `steps` what its byte-level steps do.
fn pre_tokenizer_splits_lines(p: &Value, steps: &mut Steps) -> bool {
    match p["type"].as_str() {
        Some("ByteLevel") => {
            steps.prefix_space |= p["add_prefix_space"].as_bool().unwrap_or(false);
            // Without its regex it splits nothing itself: only as the last step after a split.
            let regex = p["use_regex"].as_bool().unwrap_or(true);
            steps.gpt2_regex = regex;
            regex
        }
        Some("BertPreTokenizer" | "Whitespace" | "WhitespaceSplit") => true,
        Some("Split") => {
            // Llama 3's (GPT-4's) pattern, or Qwen2's, which differs only in taking digits one
            // at a time: both take a whitespace run that ends in line breaks whole.
            matches!(p["pattern"]["Regex"].as_str(), Some(LLAMA3 | QWEN2))
                && p["behavior"].as_str() == Some("Isolated")
                && !p["invert"].as_bool().unwrap_or(false)
        }
        Some("Sequence") => {
            let Some(list) = p["pretokenizers"].as_array() else {
                return false;
            };
            let Some((first, rest)) = list.split_first() else {
                return false;
            };
            // The first step splits; later byte-level steps only map bytes (or split further).
            if !pre_tokenizer_splits_lines(first, steps) {
                return false;
            }
            let first_is_gpt2 = steps.gpt2_regex;
            let rest_keep_cuts = rest.iter().all(|s| match s["type"].as_str() {
                Some("ByteLevel") => {
                    steps.prefix_space |= s["add_prefix_space"].as_bool().unwrap_or(false);
                    // Its regex, if on, splits the first step's pre-tokens further: those
                    // are the same in a piece as in the whole document, and so are its
                    // splits of them.
                    true
                }
                Some("Digits" | "Punctuation") => true,
                _ => pre_tokenizer_splits_lines(s, steps),
            });
            // Only the first step's look-ahead moves the cut: later steps split its pre-tokens.
            steps.gpt2_regex = first_is_gpt2;
            rest_keep_cuts
        }
        _ => false,
    }
}

/// The byte ranges of `text`'s pieces: each ends at a cut point of `rule` near `WINDOW` bytes,
/// or where no cut point lies within `4 x WINDOW` (that stretch is then one piece).
pub fn pieces(text: &str, rule: CutRule) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    while text.len() - start > WINDOW {
        let from = start + WINDOW / 2;
        let to = (start + 4 * WINDOW).min(text.len());
        match (from..to).find(|&i| is_cut(text, i, rule)) {
            Some(cut) => {
                out.push((start, cut));
                start = cut;
            }
            None => {
                out.push((start, to));
                if to == text.len() {
                    return out;
                }
                start = to;
                // A stretch without a cut point: the next piece must still start at one.
                while start < text.len() && !is_cut(text, start, rule) {
                    start += 1;
                }
                let last = out.last_mut().expect("a piece");
                last.1 = start;
            }
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// Whether a piece may start at byte `i` of `text` (a char boundary: the bytes around are
/// ASCII).
fn is_cut(text: &str, i: usize, rule: CutRule) -> bool {
    let b = text.as_bytes();
    let not_space = |c: u8| !c.is_ascii_whitespace() && c < 0x80;
    if i == 0 || i >= b.len() {
        return false;
    }
    match rule {
        CutRule::AfterLineBreak => b[i - 1] == b'\n' && not_space(b[i]),
        CutRule::BeforeLineBreak => b[i] == b'\n' && b.get(i + 1).copied().is_some_and(not_space),
        CutRule::AfterLineBreakBeforeSpace => {
            b[i - 1] == b'\n' && b[i] == b' ' && b.get(i + 1).copied().is_some_and(not_space)
        }
    }
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod differential_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_and_start_at_cut_points() {
        let line = "def f(x):\n    return x\n";
        let text = line.repeat(20_000);
        let parts = pieces(&text, CutRule::AfterLineBreak);
        assert!(parts.len() > 4);
        assert_eq!(parts.first().unwrap().0, 0);
        assert_eq!(parts.last().unwrap().1, text.len());
        for w in parts.windows(2) {
            assert_eq!(w[0].1, w[1].0);
            assert!(is_cut(&text, w[1].0, CutRule::AfterLineBreak));
            assert!(w[0].1 - w[0].0 <= 4 * WINDOW);
        }
        // A stretch with no line break is one piece.
        let flat = "x".repeat(10 * WINDOW);
        assert_eq!(
            pieces(&flat, CutRule::AfterLineBreak),
            vec![(0, flat.len())]
        );
    }

    #[test]
    fn only_tokenizers_whose_pipeline_splits_at_line_breaks_are_cut() {
        let gpt2: Value = serde_json::json!({"normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}});
        assert_eq!(cut_rule(&gpt2), Some(CutRule::AfterLineBreakBeforeSpace));
        let sp: Value = serde_json::json!({"normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}});
        assert_eq!(cut_rule(&sp), None);
        let newline_token: Value = serde_json::json!({"normalizer": null,
            "added_tokens": [{"content": "\n\t"}],
            "pre_tokenizer": {"type": "WhitespaceSplit"}});
        assert_eq!(cut_rule(&newline_token), None);
    }
}
