//! A CLIP tokenizer that matches open_clip's `SimpleTokenizer` token for token.
//!
//! Built from the BPE merges file open_clip ships (`bpe_simple_vocab_16e6.txt.gz`, read at run
//! time from a path; nothing is downloaded). A Hugging Face `tokenizer.json` is run instead by
//! the `tokenizers` library itself (`from_tokenizer_json`), with the file's own normalizer,
//! pre-tokenizer, model and post-processor: none of open_clip's cleaning below applies to it.
//!
//! The steps are open_clip's: `basic_clean` (ftfy.fix_text, `html.unescape` twice, strip),
//! `whitespace_clean`, lowercasing, its regex, byte-level encoding (`bytes_to_unicode`), BPE
//! with `</w>`, start/end tokens, truncation that keeps the end token, padding with 0 (a
//! `tokenizer.json` pads with its own pad id: `json_pad_id`).
//!
//! Where the output can differ from open_clip (ftfy is Python and is not reproduced in full):
//! - `ftfy_lite` reproduces only ftfy's cheap character fixes: removal of its control
//!   characters, curly quotes to straight ones, Latin ligatures, full-width ASCII to ASCII,
//!   and NFC. It does not repair mojibake (`fix_encoding`: "cafÃ©" stays as is, ftfy gives
//!   "café"), nor C1 controls, lossy UTF-8 sequences, or terminal escapes. Captions with such
//!   text tokenize differently; tests/test_tokenize.py counts them on the real captions.
//! - `html_unescape` knows the numeric references and the common named entities (with and
//!   without `;`), not the full HTML5 table of 2231 names Python has.

use super::fxhash::FxMap;
use std::collections::HashMap;
use std::io::Read;

use regex::Regex;

pub use super::clean::clean;
use super::clean::clean_into;

pub const DEFAULT_CONTEXT_LENGTH: usize = 77;

/// Words BPE-encoded per thread and tokenizer before the cache starts over (as open_clip's own
/// word cache, but bounded).
const WORD_CACHE_ENTRIES: usize = 1 << 16;

/// Tokenizers whose word caches one thread keeps before it drops them all (a process that
/// builds tokenizer after tokenizer must not grow without bound).
const CACHED_TOKENIZERS: usize = 8;

/// Word caches a tokenizer keeps for threads to come (more than any pass runs threads).
const MAX_SPARE_CACHES: usize = 256;

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Keyed by the words of the captions, which a shard may choose: std's keyed SipHash, so that no
/// caption can make its lookups collide (FxHash is for the fixed merge table only).
type WordCache = HashMap<Box<str>, Box<[u32]>>;

/// Word caches handed back by threads that ended, for the next threads of the same tokenizer: a
/// loader's decode threads last one pass, and its next pass (the next epoch, an evaluation)
/// starts from the words the last one encoded instead of from nothing.
type SpareCaches = std::sync::Mutex<Vec<WordCache>>;

/// One thread's word cache for one tokenizer, and where it goes back when the thread ends.
struct ThreadCache {
    words: WordCache,
    home: std::sync::Weak<SpareCaches>,
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            if let Ok(mut spare) = home.lock() {
                if spare.len() < MAX_SPARE_CACHES {
                    spare.push(std::mem::take(&mut self.words));
                }
            }
        }
    }
}

/// What one thread reuses from caption to caption: the cleaned text, the word being merged, and
/// per tokenizer the ids of the words already seen. Nothing is allocated per caption once warm.
#[derive(Default)]
struct Scratch {
    cleaned: String,
    word: Vec<u32>,
    /// The merge (rank, merged id) of each adjacent pair of `word`, and the next round's.
    ranks: Vec<(u32, u32)>,
    next_ranks: Vec<(u32, u32)>,
    caches: FxMap<u64, ThreadCache>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read tokenizer file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("bad tokenizer file {path}: {detail}")]
    Format { path: String, detail: String },
}

pub struct ClipTokenizer {
    /// A Hugging Face `tokenizer.json`, run by the `tokenizers` library (truncation set to
    /// `context_length`, no padding). `None`: open_clip's CLIP BPE, the fields below.
    json: Option<Box<tokenizers::Tokenizer>>,
    /// (left id << 32 | right id) -> (rank, merged id).
    merges: FxMap<u64, (u32, u32)>,
    /// For each byte: (id of its symbol, id of its symbol + `</w>`).
    byte_ids: [(u32, u32); 256],
    byte_chars: [char; 256],
    pattern: Regex,
    sot_text: String,
    eot_text: String,
    /// Distinguishes tokenizers in the per-thread word cache.
    id: u64,
    spare: std::sync::Arc<SpareCaches>,
    pub sot: u32,
    pub eot: u32,
    /// The id rows are padded with: 0 for open_clip's BPE, a `tokenizer.json`'s own otherwise.
    pub pad: u32,
    pub context_length: usize,
}

/// open_clip's `bytes_to_unicode`.
fn bytes_to_unicode() -> [char; 256] {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = ['\0'; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        out[b as usize] = char::from_u32(c).expect("valid char");
    }
    out
}

const SOT: &str = "<start_of_text>";
const EOT: &str = "<end_of_text>";

impl ClipTokenizer {
    /// From open_clip's gzipped merges file (its `default_bpe()`), as `SimpleTokenizer` builds it.
    pub fn from_bpe_file(path: &str, context_length: usize) -> Result<Self, TokenizerError> {
        let io = |source| TokenizerError::Io {
            path: path.to_string(),
            source,
        };
        let raw = std::fs::read(path).map_err(io)?;
        let mut text = String::new();
        if raw.starts_with(&[0x1f, 0x8b]) {
            flate2::read::GzDecoder::new(&raw[..])
                .read_to_string(&mut text)
                .map_err(io)?;
        } else {
            text = String::from_utf8(raw).map_err(|e| TokenizerError::Format {
                path: path.into(),
                detail: e.to_string(),
            })?;
        }
        let lines: Vec<&str> = text.split('\n').collect();
        let end = (49152 - 256 - 2 + 1).min(lines.len());
        let merges: Vec<(String, String)> = lines[1.min(lines.len())..end]
            .iter()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((it.next()?.to_string(), it.next()?.to_string()))
            })
            .collect();
        // Python's dict order: the printable bytes first, then the others (`bytes_to_unicode`).
        let mut chars: Vec<char> = bytes_to_unicode().to_vec();
        chars.sort_by_key(|&c| c as u32);
        let mut vocab_list: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        vocab_list.extend(chars.iter().map(|c| format!("{c}</w>")));
        vocab_list.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        vocab_list.push(SOT.into());
        vocab_list.push(EOT.into());
        let vocab: HashMap<String, u32> = vocab_list
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s, i as u32))
            .collect();
        Self::build(vocab, &merges, SOT, EOT, context_length, path)
    }

    /// From a Hugging Face `tokenizer.json` (any model the `tokenizers` library runs: BPE,
    /// WordPiece, Unigram, with the file's normalizer, pre-tokenizer and post-processor), as the
    /// `tokenizers` package encodes with `enable_truncation(context_length)`: the special tokens
    /// of its post-processor (e.g. CLIP's start and end) are kept, the text is cut. The loader
    /// pads the row with the file's pad id (`json_pad_id`), as open_clip's `HFTokenizer` does
    /// through transformers (padding to `max_length` with `pad_token_id`).
    pub fn from_tokenizer_json(path: &str, context_length: usize) -> Result<Self, TokenizerError> {
        let bad = |detail: String| TokenizerError::Format {
            path: path.into(),
            detail,
        };
        let raw = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.into(),
            source,
        })?;
        let mut json = tokenizers::Tokenizer::from_bytes(&raw).map_err(|e| {
            bad(format!(
                "not a tokenizer.json that the tokenizers library loads: {e}"
            ))
        })?;
        json.with_truncation(Some(tokenizers::TruncationParams {
            max_length: context_length,
            ..Default::default()
        }))
        .map_err(|e| bad(format!("truncation to {context_length} tokens: {e}")))?;
        let pad = json_pad_id(&json, path)?;
        json.with_padding(None);
        // A context too short for the special tokens fails here, once, not on every caption.
        json.encode_fast("a", true).map_err(|e| {
            bad(format!(
                "cannot encode with a context length of {context_length}: {e}"
            ))
        })?;
        let mut tok = Self::from_bpe_parts(context_length);
        tok.json = Some(Box::new(json));
        tok.pad = pad;
        Ok(tok)
    }

    /// A CLIP tokenizer with no merges (the fields a `tokenizer.json` tokenizer leaves unused).
    fn from_bpe_parts(context_length: usize) -> Self {
        let chars = bytes_to_unicode();
        let mut vocab: HashMap<String, u32> = HashMap::new();
        for c in chars {
            let n = vocab.len() as u32;
            vocab.insert(c.to_string(), n);
            vocab.insert(format!("{c}</w>"), n + 1);
        }
        let n = vocab.len() as u32;
        vocab.insert(SOT.into(), n);
        vocab.insert(EOT.into(), n + 1);
        Self::build(vocab, &[], SOT, EOT, context_length, "").expect("a complete byte vocabulary")
    }

    fn build(
        vocab: HashMap<String, u32>,
        merges: &[(String, String)],
        sot: &str,
        eot: &str,
        context_length: usize,
        path: &str,
    ) -> Result<Self, TokenizerError> {
        let bad = |detail: String| TokenizerError::Format {
            path: path.into(),
            detail,
        };
        let id = |s: &str| vocab.get(s).copied();
        let chars = bytes_to_unicode();
        let mut byte_ids = [(0u32, 0u32); 256];
        for (b, c) in chars.iter().enumerate() {
            let plain = id(&c.to_string()).ok_or_else(|| bad(format!("no symbol for byte {b}")))?;
            let end = id(&format!("{c}</w>")).ok_or_else(|| bad(format!("no {c}</w>")))?;
            byte_ids[b] = (plain, end);
        }
        let mut merge_map = FxMap::default();
        merge_map.reserve(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            if let (Some(x), Some(y), Some(m)) = (id(a), id(b), id(&format!("{a}{b}"))) {
                merge_map.entry(pair(x, y)).or_insert((rank as u32, m));
            }
        }
        let sot_id = id(sot).ok_or_else(|| bad(format!("no {sot}")))?;
        let eot_id = id(eot).ok_or_else(|| bad(format!("no {eot}")))?;
        let pattern = clip_pattern(sot, eot).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            merges: merge_map,
            byte_ids,
            byte_chars: chars,
            pattern,
            json: None,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            spare: Default::default(),
            sot_text: sot.to_string(),
            eot_text: eot.to_string(),
            sot: sot_id,
            eot: eot_id,
            pad: 0,
            context_length,
        })
    }

    /// open_clip's `SimpleTokenizer.encode`: the ids of a caption, without start/end tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if let Some(json) = &self.json {
            return json
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default();
        }
        let mut out = Vec::new();
        self.for_each_id(text, |id| {
            out.push(id);
            true
        });
        out
    }

    /// Calls `emit` with the ids of `text` in order (open_clip's `encode`) until it returns
    /// false: a caller that needs only the first ids (truncation) stops the work there.
    fn for_each_id(&self, text: &str, mut emit: impl FnMut(u32) -> bool) {
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch {
                cleaned,
                word,
                ranks,
                next_ranks,
                caches,
            } = scratch;
            clean_into(text, cleaned);
            if !caches.contains_key(&self.id) && caches.len() >= CACHED_TOKENIZERS {
                caches.clear();
            }
            let cache = &mut caches
                .entry(self.id)
                .or_insert_with(|| ThreadCache {
                    words: self
                        .spare
                        .lock()
                        .ok()
                        .and_then(|mut spare| spare.pop())
                        .unwrap_or_default(),
                    home: std::sync::Arc::downgrade(&self.spare),
                })
                .words;
            let mut piece_ids = |piece: &str| -> bool {
                if piece.len() > 2 && piece.starts_with('<') && piece.ends_with('>') {
                    if piece.eq_ignore_ascii_case(&self.sot_text) {
                        return emit(self.sot);
                    }
                    if piece.eq_ignore_ascii_case(&self.eot_text) {
                        return emit(self.eot);
                    }
                }
                if let Some(ids) = cache.get(piece) {
                    return ids.iter().all(|&id| emit(id));
                }
                let bytes = piece.as_bytes();
                word.clear();
                for (i, &b) in bytes.iter().enumerate() {
                    let (plain, end) = self.byte_ids[b as usize];
                    word.push(if i + 1 == bytes.len() { end } else { plain });
                }
                bpe(&self.merges, word, ranks, next_ranks);
                if cache.len() >= WORD_CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(piece.into(), word.as_slice().into());
                word.iter().all(|&id| emit(id))
            };
            if cleaned.is_ascii() {
                split_ascii(cleaned, [&self.sot_text, &self.eot_text], piece_ids);
            } else {
                for m in self.pattern.find_iter(cleaned) {
                    if !piece_ids(m.as_str()) {
                        break;
                    }
                }
            }
        })
    }

    /// `[sot] + encode + [eot]`, truncated to `context_length` with eot last, padded with `pad`.
    /// The ids are written straight into `out`, and the words past the truncation point are
    /// never encoded.
    pub fn tokenize_into(&self, text: &str, out: &mut [i64]) {
        if let Some(json) = &self.json {
            // Checked when loaded; a caption it still cannot encode gets a row of padding.
            let ids = json.encode_fast(text, true).map(|e| e.get_ids().to_vec());
            let ids = ids.as_deref().unwrap_or(&[]);
            let body = ids.len().min(out.len());
            for (o, &id) in out.iter_mut().zip(&ids[..body]) {
                *o = id as i64;
            }
            out[body..].fill(self.pad as i64);
            return;
        }
        let n = out.len();
        if n < 2 {
            if let Some(first) = out.first_mut() {
                *first = self.eot as i64;
            }
            return;
        }
        out[0] = self.sot as i64;
        // The body fills out[1..n - 1]; the end token goes right after it.
        let mut pos = 1;
        self.for_each_id(text, |id| {
            if pos + 1 >= n {
                return false;
            }
            out[pos] = id as i64;
            pos += 1;
            pos + 1 < n
        });
        out[pos] = self.eot as i64;
        out[pos + 1..].fill(self.pad as i64);
    }

    pub fn tokenize(&self, text: &str) -> Vec<i64> {
        let mut out = vec![0; self.context_length];
        self.tokenize_into(text, &mut out);
        out
    }

    /// The byte-level symbol of byte `b` (for tests and debugging).
    pub fn byte_char(&self, b: u8) -> char {
        self.byte_chars[b as usize]
    }
}

/// open_clip's pre-tokenizer regex, with its start and end tokens.
fn clip_pattern(sot: &str, eot: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!(
        r"(?i){}|{}|'s|'t|'re|'ve|'m|'ll|'d|\p{{L}}+|\p{{N}}|[^\s\p{{L}}\p{{N}}]+",
        regex::escape(sot),
        regex::escape(eot)
    ))
}

#[inline]
fn pair(left: u32, right: u32) -> u64 {
    (left as u64) << 32 | right as u64
}

/// No merge for this pair.
const NO_MERGE: (u32, u32) = (u32::MAX, 0);

/// open_clip's `bpe` on ids: while some adjacent pair has a merge, merge every occurrence (left to
/// right, not overlapping) of the pair of lowest rank. Each pair's rank is looked up once and
/// kept; after a merge only the pairs next to a merged symbol are looked up again, so a word of
/// n bytes costs O(n) lookups, not the O(n^2) of looking every pair up on every round.
fn bpe(
    merges: &FxMap<u64, (u32, u32)>,
    word: &mut Vec<u32>,
    ranks: &mut Vec<(u32, u32)>,
    next: &mut Vec<(u32, u32)>,
) {
    let lookup = |l: u32, r: u32| merges.get(&pair(l, r)).copied().unwrap_or(NO_MERGE);
    ranks.clear();
    ranks.extend(word.windows(2).map(|w| lookup(w[0], w[1])));
    loop {
        let mut best = 0;
        for (i, r) in ranks.iter().enumerate() {
            if r.0 < ranks[best].0 {
                best = i;
            }
        }
        let Some(&(rank, merged)) = ranks.get(best) else {
            return;
        };
        if rank == NO_MERGE.0 {
            return;
        }
        let (left, right) = (word[best], word[best + 1]);
        next.clear();
        let (n, mut i, mut write, mut previous_merged) = (word.len(), 0, 0, false);
        while i < n {
            let here = i + 1 < n && word[i] == left && word[i + 1] == right;
            let symbol = if here { merged } else { word[i] };
            if write > 0 {
                // Two unmerged neighbours were neighbours before: their rank is known.
                next.push(if here || previous_merged {
                    lookup(word[write - 1], symbol)
                } else {
                    ranks[i - 1]
                });
            }
            word[write] = symbol;
            write += 1;
            previous_merged = here;
            i += if here { 2 } else { 1 };
        }
        word.truncate(write);
        std::mem::swap(ranks, next);
    }
}

/// The tokenizer's regex (`specials|'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+`,
/// case-insensitive, leftmost-first) on an ASCII text, without the regex engine: `piece` gets
/// each match in order until it returns false. Most captions are ASCII once cleaned; the others
/// go through the regex itself. `split_ascii_equals_the_regex` checks the two agree.
fn split_ascii<'a>(text: &'a str, specials: [&str; 2], mut piece: impl FnMut(&'a str) -> bool) {
    let b = text.as_bytes();
    let letter = |c: u8| c.is_ascii_alphabetic();
    let digit = |c: u8| c.is_ascii_digit();
    // Unicode White_Space in ASCII: \t \n \x0b \x0c \r and space.
    let space = |c: u8| matches!(c, b'\t'..=b'\r' | b' ');
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let rest = &b[i..];
        let len = if let Some(s) = specials
            .iter()
            .find(|s| rest.len() >= s.len() && rest[..s.len()].eq_ignore_ascii_case(s.as_bytes()))
        {
            s.len()
        } else if c == b'\''
            && rest.len() >= 2
            && matches!(rest[1] | 0x20, b's' | b't' | b'm' | b'd')
        {
            2
        } else if c == b'\''
            && rest.len() >= 3
            && matches!(
                [rest[1] | 0x20, rest[2] | 0x20],
                [b'r', b'e'] | [b'v', b'e'] | [b'l', b'l']
            )
        {
            3
        } else if letter(c) {
            rest.iter().take_while(|&&c| letter(c)).count()
        } else if digit(c) {
            1
        } else if space(c) {
            i += 1;
            continue;
        } else {
            rest.iter()
                .take_while(|&&c| !(letter(c) || digit(c) || space(c)))
                .count()
        };
        if !piece(&text[i..i + len]) {
            return;
        }
        i += len;
    }
}

/// The id a `tokenizer.json` pads with, as transformers (and so open_clip's `HFTokenizer`, which
/// pads to `max_length` with `pad_token_id`) pads it: the pad token its folder names
/// (`pad_token` in `tokenizer_config.json`, else in `special_tokens_map.json`, beside the file;
/// SigLIP's is `</s>` = 1); else the file's own `padding` section's `pad_id`, as the `tokenizers`
/// package pads; else 0, as open_clip pads its CLIP BPE.
fn json_pad_id(json: &tokenizers::Tokenizer, path: &str) -> Result<u32, TokenizerError> {
    let bad = |file: &std::path::Path, detail: String| TokenizerError::Format {
        path: file.display().to_string(),
        detail,
    };
    let dir = std::path::Path::new(path)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    for name in ["tokenizer_config.json", "special_tokens_map.json"] {
        let file = dir.join(name);
        let raw = match std::fs::read(&file) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(TokenizerError::Io {
                    path: file.display().to_string(),
                    source,
                })
            }
        };
        let config: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| bad(&file, format!("not JSON: {e}")))?;
        // A string, or an AddedToken object with its `content`; null: none named here.
        let token = match config.get("pad_token") {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(other) => other
                .get("content")
                .and_then(|c| c.as_str())
                .ok_or_else(|| bad(&file, format!("pad_token {other} is not a token")))?,
        };
        return json
            .token_to_id(token)
            .ok_or_else(|| bad(&file, format!("pad_token {token:?} is not in {path}")));
    }
    Ok(json.get_padding().map_or(0, |p| p.pad_id))
}

/// The tokenizer of (kind, path, context_length), built once per process: a loader makes a
/// new pipeline every epoch, and parsing the vocabulary takes tens of milliseconds.
/// `kind`: "bpe" (open_clip's merges file) or "json" (a Hugging Face `tokenizer.json`).
pub fn shared(
    kind: &str,
    path: &str,
    context_length: usize,
) -> Result<std::sync::Arc<ClipTokenizer>, TokenizerError> {
    type Cache = std::sync::Mutex<HashMap<(String, String, usize), std::sync::Arc<ClipTokenizer>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let key = (kind.to_string(), path.to_string(), context_length);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().expect("tokenizer cache").get(&key) {
        return Ok(t.clone());
    }
    let tok = std::sync::Arc::new(match kind {
        "json" => ClipTokenizer::from_tokenizer_json(path, context_length)?,
        "bpe" => ClipTokenizer::from_bpe_file(path, context_length)?,
        other => {
            return Err(TokenizerError::Format {
                path: path.into(),
                detail: format!("tokenizer kind {other:?}: expected 'bpe' or 'json'"),
            })
        }
    });
    cache
        .lock()
        .expect("tokenizer cache")
        .insert(key, tok.clone());
    Ok(tok)
}

impl std::fmt::Debug for ClipTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipTokenizer")
            .field("merges", &self.merges.len())
            .field("context_length", &self.context_length)
            .finish()
    }
}

#[cfg(test)]
#[path = "clip_tests.rs"]
mod tests;
