//! A fast byte-level BPE encoder for the `tokenizer.json` files most LLMs ship (GPT-2, Llama 3,
//! Qwen2 and their kin), giving the ids of the tokenizers library's
//! `encode(text, add_special_tokens=False)` exactly, without its per-token strings, offsets and
//! alignments, and without a regex engine.
//!
//! - `classes`: `\p{L}`, `\p{N}`, `\s` as Oniguruma (the library's regex engine) has them;
//! - `pretokenize`: the split patterns as hand-written scanners;
//! - `merges`: the merge loop and a per-thread word cache;
//! - this module: reading a `tokenizer.json` and deciding, once, whether it is within what the
//!   fast path does exactly ([`FastBpe::from_json`] says why not when it is not), and the
//!   per-text steps (added tokens, NFC, prefix space).
//!
//! A text holding an added token's content (special or not, raw or normalized) is left to the
//! library ([`FastBpe::encode`] returns false): the library splits there first, with rules
//! (`single_word`, `lstrip`, `rstrip`, `normalized`) that the fast path does not repeat.

pub mod classes;
mod merges;
pub mod pretokenize;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::AhoCorasick;
use serde_json::Value;
use unicode_normalization_alignments::UnicodeNormalization;

use crate::tokenize::fxhash::FxMap;
use merges::Merges;
use pretokenize::{next_piece, Pattern};

/// Distinct ids for the per-thread word caches of each encoder.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A byte-level BPE tokenizer that the fast path encodes exactly.
pub struct FastBpe {
    merges: Merges,
    pattern: Pattern,
    /// ByteLevel's `add_prefix_space`: a space before a text that does not start with one.
    prefix_space: bool,
    /// The normalizer is NFC (else none).
    nfc: bool,
    /// Added tokens' contents (and their NFC forms): a text holding one goes to the library.
    added: Option<AhoCorasick>,
}

/// GPT-2's byte-to-character map (`bytes_to_unicode`): printable Latin-1 bytes stand for
/// themselves, the others for U+0100 on in byte order.
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        out[b as usize] = if printable {
            b as char
        } else {
            shifted += 1;
            char::from_u32(0xFF + shifted).expect("U+0100..U+0143")
        };
    }
    out
}

/// A token's bytes, if every character of it is a byte-level character.
fn token_bytes(token: &str, char_byte: &FxMap<char, u8>) -> Option<Vec<u8>> {
    token.chars().map(|c| char_byte.get(&c).copied()).collect()
}

fn is_type(v: &Value, t: &str) -> bool {
    v["type"].as_str() == Some(t)
}

/// Whether the normalizer is NFC (Some(true)), none (Some(false)), or another (None).
fn normalizer(n: &Value) -> Option<bool> {
    if n.is_null() {
        return Some(false);
    }
    if is_type(n, "NFC") {
        return Some(true);
    }
    if is_type(n, "Sequence") {
        let steps = n["normalizers"].as_array()?;
        return match steps.as_slice() {
            [] => Some(false),
            [one] => normalizer(one),
            _ => None,
        };
    }
    None
}

/// The split pattern and `add_prefix_space` of a pre-tokenizer, if the fast path has it.
fn pre_tokenizer(p: &Value) -> Result<(Pattern, bool), String> {
    let flag = |v: &Value, key: &str, default: bool| v[key].as_bool().unwrap_or(default);
    if is_type(p, "ByteLevel") {
        if !flag(p, "use_regex", true) {
            return Err("a ByteLevel pre-tokenizer without its regex".into());
        }
        return Ok((Pattern::Gpt2, flag(p, "add_prefix_space", true)));
    }
    if is_type(p, "Sequence") {
        if let Some([split, byte_level]) = p["pretokenizers"].as_array().map(Vec::as_slice) {
            let source = split["pattern"]["Regex"].as_str().unwrap_or("");
            let split_ok = is_type(split, "Split")
                && split["behavior"].as_str() == Some("Isolated")
                && !flag(split, "invert", false);
            // The byte-level step only maps bytes: it neither splits nor adds a space (a
            // prefix space there would go before every piece).
            let map_ok = is_type(byte_level, "ByteLevel")
                && !flag(byte_level, "use_regex", true)
                && !flag(byte_level, "add_prefix_space", true);
            if let (true, true, Some(pattern)) = (split_ok, map_ok, Pattern::from_regex(source)) {
                return Ok((pattern, false));
            }
        }
    }
    Err(format!(
        "the pre-tokenizer {p} is not GPT-2's, Llama 3's or Qwen2's byte-level split"
    ))
}

/// Whether a post-processor adds nothing to the ids when special tokens are not asked for.
fn post_processor_is_neutral(p: &Value) -> bool {
    match p["type"].as_str() {
        None => p.is_null(),
        Some("ByteLevel" | "TemplateProcessing" | "RobertaProcessing" | "BertProcessing") => true,
        Some("Sequence") => p["processors"]
            .as_array()
            .is_some_and(|all| all.iter().all(post_processor_is_neutral)),
        Some(_) => false,
    }
}

impl std::fmt::Debug for FastBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastBpe")
            .field("pattern", &self.pattern)
            .field("prefix_space", &self.prefix_space)
            .field("nfc", &self.nfc)
            .field("merges", &self.merges.ranks.len())
            .finish()
    }
}

impl FastBpe {
    /// The fast encoder for a parsed `tokenizer.json`, or why it is not one the fast path
    /// encodes exactly (the caller then keeps the tokenizers library).
    pub fn from_json(json: &Value) -> Result<Self, String> {
        let model = &json["model"];
        if !is_type(model, "BPE") {
            return Err("its model is not BPE".into());
        }
        if model["dropout"].as_f64().is_some_and(|d| d != 0.0) {
            return Err("its BPE has dropout".into());
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model[key].as_str().is_some_and(|s| !s.is_empty()) {
                return Err(format!("its BPE has a {key}"));
            }
        }
        let nfc = normalizer(&json["normalizer"]).ok_or_else(|| {
            format!(
                "its normalizer {} is neither none nor NFC",
                json["normalizer"]
            )
        })?;
        let (pattern, prefix_space) = pre_tokenizer(&json["pre_tokenizer"])?;
        if !post_processor_is_neutral(&json["post_processor"]) {
            return Err("its post-processor is not a known one".into());
        }

        let chars = byte_chars();
        let char_byte: FxMap<char, u8> = (0..=255u8).map(|b| (chars[b as usize], b)).collect();
        let vocab: FxMap<&str, u32> = model["vocab"]
            .as_object()
            .ok_or("its BPE has no vocab object")?
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.as_str(),
                    v.as_u64().ok_or("a vocab id is not a number")? as u32,
                ))
            })
            .collect::<Result<_, String>>()?;
        let mut byte_ids = [None; 256];
        for b in 0..=255usize {
            byte_ids[b] = vocab
                .get(chars[b].encode_utf8(&mut [0; 4]) as &str)
                .copied();
        }
        let unk = model["unk_token"].is_string() || model["byte_fallback"].as_bool() == Some(true);
        if unk && byte_ids.iter().any(Option::is_none) {
            return Err(
                "a byte is not in its vocabulary and it has an unknown token or byte \
                        fallback"
                    .into(),
            );
        }

        let mut ranks: FxMap<u64, (u32, u32)> = FxMap::default();
        let merge_list = model["merges"]
            .as_array()
            .ok_or("its BPE has no merges list")?;
        ranks.reserve(merge_list.len());
        for (rank, m) in merge_list.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => {
                    let parts: Vec<&str> = s.split(' ').collect();
                    match parts.as_slice() {
                        [a, b] => (*a, *b),
                        _ => return Err(format!("a merge {s:?} is not two tokens")),
                    }
                }
                Value::Array(pair) => match pair.as_slice() {
                    [Value::String(a), Value::String(b)] => (a.as_str(), b.as_str()),
                    _ => return Err(format!("a merge {m} is not two tokens")),
                },
                _ => return Err(format!("a merge {m} is not two tokens")),
            };
            let id = |t: &str| {
                vocab
                    .get(t)
                    .copied()
                    .ok_or_else(|| format!("a merge's token {t:?} is not in the vocabulary"))
            };
            let (left, right, merged) = (id(a)?, id(b)?, id(&format!("{a}{b}"))?);
            // As the library builds its map: a pair listed twice keeps its last rank.
            ranks.insert(((left as u64) << 32) | right as u64, (rank as u32, merged));
        }
        let whole_words = (model["ignore_merges"].as_bool() == Some(true)).then(|| {
            vocab
                .iter()
                .filter_map(|(t, &id)| Some((token_bytes(t, &char_byte)?.into_boxed_slice(), id)))
                .collect()
        });

        let mut contents: Vec<String> = Vec::new();
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            let content = t["content"].as_str().unwrap_or("");
            if content.is_empty() {
                return Err("an added token is empty".into());
            }
            contents.push(content.to_string());
            if nfc {
                contents.push(content.nfc().map(|(c, _)| c).collect());
            }
        }
        let added = if contents.is_empty() {
            None
        } else {
            Some(AhoCorasick::new(&contents).map_err(|e| e.to_string())?)
        };
        Ok(Self {
            merges: Merges {
                byte_ids,
                ranks,
                whole_words,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            },
            pattern,
            prefix_space,
            nfc,
            added,
        })
    }

    /// Appends `text`'s ids to `out` and returns true, or returns false having appended
    /// nothing when the text holds an added token (the library must encode it).
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> bool {
        let holds_added = |s: &str| self.added.as_ref().is_some_and(|ac| ac.is_match(s));
        if holds_added(text) {
            return false;
        }
        let mut normalized: Cow<str> = if self.nfc && !text.is_ascii() {
            let composed: String = text.nfc().map(|(c, _)| c).collect();
            if composed != text && holds_added(&composed) {
                return false;
            }
            Cow::Owned(composed)
        } else {
            Cow::Borrowed(text)
        };
        if normalized.is_empty() {
            return true;
        }
        if self.prefix_space && !normalized.starts_with(' ') {
            normalized = Cow::Owned(format!(" {normalized}"));
        }
        let s = normalized.as_bytes();
        let mut i = 0;
        while i < s.len() {
            let end = next_piece(s, i, self.pattern);
            self.merges.encode_word(&s[i..end], out);
            i = end;
        }
        true
    }
}
