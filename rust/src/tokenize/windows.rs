//! Long documents encoded in pieces, so that a reader's memory is bounded by configuration and
//! not by document size: the `tokenizers` library holds about 170 bytes per byte of text while it
//! encodes one (its normalized-string alignments and the encoding's offsets and token strings),
//! so a 50 MB document would need gigabytes.
//!
//! A piece ends at a line break where the tokenizer's own pipeline is certain to split, so the
//! pieces' ids, concatenated, are the whole document's ids:
//! - the normalizer works character by character (NFC/NFD/NFKC/NFKD, lowercasing, BERT's);
//! - the pre-tokenizer splits at that point: GPT-2's byte-level regex, Llama 3's (GPT-4's)
//!   split pattern followed by a byte-level map, BERT's or plain whitespace splitting. After a
//!   `\n`, each of them starts a new pre-token at the next character that is not whitespace;
//!   a byte-level pre-tokenizer that adds a prefix space must see the next piece start with the
//!   space it would otherwise add, so there the cut is `\n` | ` ` + a character that is not
//!   whitespace;
//! - no added token spans the cut (none holds a `\n` before its last character).
//!
//! A tokenizer outside this list (a SentencePiece `Metaspace`, a `Replace` normalizer, another
//! split pattern) has its documents encoded whole: memory then grows with the document, up to
//! `max_document_bytes`. So does a stretch without a usable line break (minified code).

use serde_json::Value;

/// Pieces are cut near this many bytes (never more than `4 x` without a cut point).
pub const WINDOW: usize = 64 << 10;

/// Where a document may be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutRule {
    /// After `\n`, before a character that is not whitespace.
    AfterLineBreak,
    /// After `\n`, before a space followed by a character that is not whitespace.
    AfterLineBreakBeforeSpace,
}

/// Llama 3's pre-tokenizer pattern (the `o200k`-era GPT-4 `cl100k` pattern it took).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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
    let mut prefix_space = false;
    if !pre_tokenizer_splits_lines(&json["pre_tokenizer"], &mut prefix_space) {
        return None;
    }
    Some(if prefix_space {
        CutRule::AfterLineBreakBeforeSpace
    } else {
        CutRule::AfterLineBreak
    })
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

/// Whether the pre-tokenizer starts a pre-token after every `\n` (see the module's doc); sets
/// `prefix_space` when a byte-level step adds a prefix space.
fn pre_tokenizer_splits_lines(p: &Value, prefix_space: &mut bool) -> bool {
    match p["type"].as_str() {
        Some("ByteLevel") => {
            *prefix_space |= p["add_prefix_space"].as_bool().unwrap_or(false);
            // Without its regex it splits nothing itself: only as the last step after a split.
            p["use_regex"].as_bool().unwrap_or(true)
        }
        Some("BertPreTokenizer" | "Whitespace" | "WhitespaceSplit") => true,
        Some("Split") => {
            p["pattern"]["Regex"].as_str() == Some(LLAMA3_SPLIT)
                && p["behavior"].as_str() == Some("Isolated")
                && !p["invert"].as_bool().unwrap_or(false)
        }
        Some("Sequence") => {
            let Some(steps) = p["pretokenizers"].as_array() else {
                return false;
            };
            let Some((first, rest)) = steps.split_first() else {
                return false;
            };
            // The first step splits; later byte-level steps only map bytes (or split further).
            pre_tokenizer_splits_lines(first, prefix_space)
                && rest.iter().all(|s| match s["type"].as_str() {
                    Some("ByteLevel") => {
                        *prefix_space |= s["add_prefix_space"].as_bool().unwrap_or(false);
                        true
                    }
                    Some("Digits" | "Punctuation") => true,
                    _ => pre_tokenizer_splits_lines(s, prefix_space),
                })
        }
        _ => false,
    }
}

/// The byte ranges of `text`'s pieces: each ends at a cut point of `rule` near `WINDOW` bytes,
/// or where no cut point lies within `4 x WINDOW` (that stretch is then one piece).
pub fn pieces(text: &str, rule: CutRule) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while text.len() - start > WINDOW {
        let from = start + WINDOW / 2;
        let to = (start + 4 * WINDOW).min(text.len());
        match (from..to).find(|&i| is_cut(bytes, i, rule)) {
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
                while start < text.len() && !is_cut(bytes, start, rule) {
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

/// Whether a piece may start at byte `i` (a char boundary: the bytes around are ASCII).
fn is_cut(b: &[u8], i: usize, rule: CutRule) -> bool {
    let not_space = |c: u8| !c.is_ascii_whitespace() && c < 0x80;
    if i == 0 || i >= b.len() || b[i - 1] != b'\n' {
        return false;
    }
    match rule {
        CutRule::AfterLineBreak => not_space(b[i]),
        CutRule::AfterLineBreakBeforeSpace => {
            b[i] == b' ' && i + 1 < b.len() && not_space(b[i + 1])
        }
    }
}

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
            assert!(is_cut(text.as_bytes(), w[1].0, CutRule::AfterLineBreak));
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
