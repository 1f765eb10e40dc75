//! A CLIP tokenizer that matches open_clip's `SimpleTokenizer` token for token.
//!
//! Built from the BPE merges file open_clip ships (`bpe_simple_vocab_16e6.txt.gz`, read at run
//! time from a path; nothing is downloaded) or from a Hugging Face `tokenizer.json` holding a
//! CLIP-style BPE model (`model.vocab`, `model.merges`, `</w>` end-of-word suffix).
//!
//! The steps are open_clip's: `basic_clean` (ftfy.fix_text, `html.unescape` twice, strip),
//! `whitespace_clean`, lowercasing, its regex, byte-level encoding (`bytes_to_unicode`), BPE
//! with `</w>`, start/end tokens, truncation that keeps the end token, padding with 0.
//!
//! Where the output can differ from open_clip (ftfy is Python and is not reproduced in full):
//! - `ftfy_lite` reproduces only ftfy's cheap character fixes: removal of its control
//!   characters, curly quotes to straight ones, Latin ligatures, full-width ASCII to ASCII,
//!   and NFC. It does not repair mojibake (`fix_encoding`: "cafÃ©" stays as is, ftfy gives
//!   "café"), nor C1 controls, lossy UTF-8 sequences, or terminal escapes. Captions with such
//!   text tokenize differently; tests/test_tokenize.py counts them on the real captions.
//! - `html_unescape` knows the numeric references and the common named entities (with and
//!   without `;`), not the full HTML5 table of 2231 names Python has.

use std::collections::HashMap;
use std::io::Read;

use regex::Regex;
use unicode_normalization::UnicodeNormalization;

pub const DEFAULT_CONTEXT_LENGTH: usize = 77;

/// Words BPE-encoded per thread and tokenizer before the cache starts over (as open_clip's own
/// word cache, but bounded).
const WORD_CACHE_ENTRIES: usize = 1 << 16;

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

type WordCache = HashMap<u64, HashMap<String, Vec<u32>>>;

thread_local! {
    static WORD_CACHE: std::cell::RefCell<WordCache> = std::cell::RefCell::new(HashMap::new());
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
    /// (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// For each byte: (id of its symbol, id of its symbol + `</w>`).
    byte_ids: [(u32, u32); 256],
    byte_chars: [char; 256],
    pattern: Regex,
    sot_text: String,
    eot_text: String,
    /// Distinguishes tokenizers in the per-thread word cache.
    id: u64,
    pub sot: u32,
    pub eot: u32,
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

    /// From a Hugging Face `tokenizer.json` with a CLIP BPE model (e.g. openai/clip-vit-base-patch32).
    pub fn from_tokenizer_json(path: &str, context_length: usize) -> Result<Self, TokenizerError> {
        let bad = |detail: String| TokenizerError::Format {
            path: path.into(),
            detail,
        };
        let raw = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.into(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| bad(e.to_string()))?;
        let model = &json["model"];
        let vocab: HashMap<String, u32> = model["vocab"]
            .as_object()
            .ok_or_else(|| bad("no model.vocab".into()))?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as u32)))
            .collect();
        let merges: Vec<(String, String)> = model["merges"]
            .as_array()
            .ok_or_else(|| bad("no model.merges".into()))?
            .iter()
            .filter_map(|m| match m {
                serde_json::Value::String(s) => {
                    let mut it = s.split(' ');
                    Some((it.next()?.to_string(), it.next()?.to_string()))
                }
                serde_json::Value::Array(a) => {
                    Some((a.first()?.as_str()?.into(), a.get(1)?.as_str()?.into()))
                }
                _ => None,
            })
            .collect();
        let mut specials: Vec<(String, u32)> = json["added_tokens"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| Some((t["content"].as_str()?.into(), t["id"].as_u64()? as u32)))
                    .collect()
            })
            .unwrap_or_default();
        let mut vocab = vocab;
        for (s, id) in specials.drain(..) {
            vocab.insert(s, id);
        }
        let (sot, eot) = if vocab.contains_key("<|startoftext|>") {
            ("<|startoftext|>", "<|endoftext|>")
        } else {
            (SOT, EOT)
        };
        Self::build(vocab, &merges, sot, eot, context_length, path)
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
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            if let (Some(x), Some(y), Some(m)) = (id(a), id(b), id(&format!("{a}{b}"))) {
                merge_map.entry((x, y)).or_insert((rank as u32, m));
            }
        }
        let sot_id = id(sot).ok_or_else(|| bad(format!("no {sot}")))?;
        let eot_id = id(eot).ok_or_else(|| bad(format!("no {eot}")))?;
        let pattern = Regex::new(&format!(
            r"(?i){}|{}|'s|'t|'re|'ve|'m|'ll|'d|\p{{L}}+|\p{{N}}|[^\s\p{{L}}\p{{N}}]+",
            regex::escape(sot),
            regex::escape(eot)
        ))
        .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            merges: merge_map,
            byte_ids,
            byte_chars: chars,
            pattern,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            sot_text: sot.to_string(),
            eot_text: eot.to_string(),
            sot: sot_id,
            eot: eot_id,
            context_length,
        })
    }

    /// open_clip's `SimpleTokenizer.encode`: the ids of a caption, without start/end tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let cleaned = clean(text);
        let mut out = Vec::new();
        let mut word: Vec<u32> = Vec::new();
        for m in self.pattern.find_iter(&cleaned) {
            let piece = m.as_str();
            if piece.len() > 2 && piece.starts_with('<') && piece.ends_with('>') {
                if piece.eq_ignore_ascii_case(&self.sot_text) {
                    out.push(self.sot);
                    continue;
                }
                if piece.eq_ignore_ascii_case(&self.eot_text) {
                    out.push(self.eot);
                    continue;
                }
            }
            let cached = WORD_CACHE.with_borrow(|c| {
                c.get(&self.id)
                    .and_then(|m| m.get(piece))
                    .map(|ids| out.extend_from_slice(ids))
                    .is_some()
            });
            if cached {
                continue;
            }
            let bytes = piece.as_bytes();
            word.clear();
            for (i, &b) in bytes.iter().enumerate() {
                let (plain, end) = self.byte_ids[b as usize];
                word.push(if i + 1 == bytes.len() { end } else { plain });
            }
            self.bpe(&mut word);
            out.extend_from_slice(&word);
            WORD_CACHE.with_borrow_mut(|c| {
                let m = c.entry(self.id).or_default();
                if m.len() >= WORD_CACHE_ENTRIES {
                    m.clear();
                }
                m.insert(piece.to_string(), word.clone());
            });
        }
        out
    }

    fn bpe(&self, word: &mut Vec<u32>) {
        while word.len() > 1 {
            let mut best: Option<(u32, u32, u32, u32)> = None; // rank, left, right, merged
            for w in word.windows(2) {
                if let Some(&(rank, merged)) = self.merges.get(&(w[0], w[1])) {
                    if best.is_none_or(|b| rank < b.0) {
                        best = Some((rank, w[0], w[1], merged));
                    }
                }
            }
            let Some((_, left, right, merged)) = best else {
                return;
            };
            let mut i = 0;
            let mut write = 0;
            while i < word.len() {
                if i + 1 < word.len() && word[i] == left && word[i + 1] == right {
                    word[write] = merged;
                    i += 2;
                } else {
                    word[write] = word[i];
                    i += 1;
                }
                write += 1;
            }
            word.truncate(write);
        }
    }

    /// `[sot] + encode + [eot]`, truncated to `context_length` with eot last, padded with 0.
    pub fn tokenize_into(&self, text: &str, out: &mut [i64]) {
        let ids = self.encode(text);
        out.fill(0);
        let n = out.len();
        if n == 0 {
            return;
        }
        out[0] = self.sot as i64;
        let body = ids.len().min(n.saturating_sub(2));
        for (o, &id) in out[1..].iter_mut().zip(&ids[..body]) {
            *o = id as i64;
        }
        if n >= 2 {
            out[(1 + body).min(n - 1)] = self.eot as i64;
        } else {
            out[0] = self.eot as i64;
        }
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

/// Python's `str.isspace` (what `str.split()` and `str.strip()` split on).
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `whitespace_clean(basic_clean(text)).lower()`, with `ftfy_lite` for `ftfy.fix_text`.
pub fn clean(text: &str) -> String {
    let fixed = ftfy_lite(text);
    let once = html_unescape(&fixed);
    let twice = html_unescape(&once);
    let joined = twice
        .split(is_py_space)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    joined.to_lowercase()
}

/// The part of `ftfy.fix_text` (default settings) reproduced here; see the module docs.
pub fn ftfy_lite(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        let u = c as u32;
        let removed = matches!(u, 0x00..=0x08 | 0x0B | 0x0E..=0x1F | 0x7F | 0x206A..=0x206F | 0xFEFF | 0xFFF9..=0xFFFC);
        if removed {
            continue;
        }
        match c {
            '\u{02BC}' | '\u{2018}'..='\u{201B}' => s.push('\''),
            '\u{201C}'..='\u{201F}' => s.push('"'),
            '\u{FF01}'..='\u{FF5E}' => s.push(char::from_u32(u - 0xFF01 + 0x21).unwrap_or(c)),
            '\u{3000}' => s.push(' '),
            '\u{FB00}' => s.push_str("ff"),
            '\u{FB01}' => s.push_str("fi"),
            '\u{FB02}' => s.push_str("fl"),
            '\u{FB03}' => s.push_str("ffi"),
            '\u{FB04}' => s.push_str("ffl"),
            '\u{FB05}' | '\u{FB06}' => s.push_str("st"),
            '\u{0132}' => s.push_str("IJ"),
            '\u{0133}' => s.push_str("ij"),
            '\u{01C4}' => s.push_str("DŽ"),
            '\u{01C5}' => s.push_str("Dž"),
            '\u{01C6}' => s.push_str("dž"),
            '\u{01C7}' => s.push_str("LJ"),
            '\u{01C8}' => s.push_str("Lj"),
            '\u{01C9}' => s.push_str("lj"),
            '\u{01CA}' => s.push_str("NJ"),
            '\u{01CB}' => s.push_str("Nj"),
            '\u{01CC}' => s.push_str("nj"),
            '\u{01F1}' => s.push_str("DZ"),
            '\u{01F2}' => s.push_str("Dz"),
            '\u{01F3}' => s.push_str("dz"),
            '\u{0149}' => s.push_str("ʼn"),
            '\r' => s.push('\n'),
            _ => s.push(c),
        }
    }
    if s.is_ascii() {
        s
    } else {
        s.nfc().collect()
    }
}

/// Named entities handled (Python's html5 table has them with `;`; the ones listed in
/// `NO_SEMI` also without).
const ENTITIES: &[(&str, &str)] = &[
    ("amp", "&"),
    ("lt", "<"),
    ("gt", ">"),
    ("quot", "\""),
    ("apos", "'"),
    ("nbsp", "\u{a0}"),
    ("copy", "©"),
    ("reg", "®"),
    ("trade", "™"),
    ("hellip", "…"),
    ("mdash", "—"),
    ("ndash", "–"),
    ("lsquo", "‘"),
    ("rsquo", "’"),
    ("ldquo", "“"),
    ("rdquo", "”"),
    ("laquo", "«"),
    ("raquo", "»"),
    ("bull", "•"),
    ("middot", "·"),
    ("deg", "°"),
    ("times", "×"),
    ("divide", "÷"),
    ("euro", "€"),
    ("pound", "£"),
    ("yen", "¥"),
    ("cent", "¢"),
    ("sect", "§"),
    ("para", "¶"),
    ("eacute", "é"),
    ("egrave", "è"),
    ("aacute", "á"),
    ("agrave", "à"),
    ("iacute", "í"),
    ("oacute", "ó"),
    ("uacute", "ú"),
    ("ntilde", "ñ"),
    ("ccedil", "ç"),
    ("auml", "ä"),
    ("ouml", "ö"),
    ("uuml", "ü"),
    ("szlig", "ß"),
    ("Eacute", "É"),
    ("Auml", "Ä"),
    ("Ouml", "Ö"),
    ("Uuml", "Ü"),
];

/// Names Python's table also has without the semicolon (a subset of the legacy ones).
const NO_SEMI: &[&str] = &[
    "amp", "lt", "gt", "quot", "nbsp", "copy", "reg", "laquo", "raquo", "middot", "deg", "times",
    "divide", "pound", "yen", "cent", "sect", "para", "eacute", "egrave", "aacute", "agrave",
    "iacute", "oacute", "uacute", "ntilde", "ccedil", "auml", "ouml", "uuml", "szlig", "Eacute",
    "Auml", "Ouml", "Uuml",
];

/// Python's replacements for invalid numeric references (`html._invalid_charrefs`).
fn invalid_charref(n: u32) -> Option<char> {
    const CP1252: [u32; 32] = [
        0x20AC, 0x81, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
        0x2039, 0x0152, 0x8D, 0x017D, 0x8F, 0x90, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013,
        0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D, 0x017E, 0x0178,
    ];
    match n {
        0x00 | 0x0d => Some(if n == 0 { '\u{fffd}' } else { '\r' }),
        0x80..=0x9f => char::from_u32(CP1252[(n - 0x80) as usize]),
        _ => None,
    }
}

/// Python's `html.unescape` for numeric references and the entities in `ENTITIES`.
pub fn html_unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('&') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match unescape_one(after) {
            Some((rep, used)) => {
                out.push_str(&rep);
                rest = &after[used..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One reference after '&': (replacement, bytes consumed after the '&').
fn unescape_one(s: &str) -> Option<(String, usize)> {
    let b = s.as_bytes();
    if b.first() == Some(&b'#') {
        let (hex, start) = match b.get(1) {
            Some(b'x') | Some(b'X') => (true, 2),
            _ => (false, 1),
        };
        let digits = s[start..]
            .bytes()
            .take_while(|c| {
                if hex {
                    c.is_ascii_hexdigit()
                } else {
                    c.is_ascii_digit()
                }
            })
            .count();
        if digits == 0 {
            return None;
        }
        let mut used = start + digits;
        if b.get(used) == Some(&b';') {
            used += 1;
        }
        let num = u64::from_str_radix(&s[start..start + digits], if hex { 16 } else { 10 })
            .unwrap_or(u64::MAX);
        let rep = if num <= 0x9f && invalid_charref(num as u32).is_some() {
            invalid_charref(num as u32).unwrap().to_string()
        } else if (0xD800..=0xDFFF).contains(&num) || num > 0x10FFFF {
            "\u{fffd}".to_string()
        } else if matches!(num, 0x1..=0x8 | 0xe..=0x1f | 0x7f..=0x9f | 0xfdd0..=0xfdef | 0xb)
            || (num & 0xfffe) == 0xfffe
        {
            String::new()
        } else {
            char::from_u32(num as u32)?.to_string()
        };
        return Some((rep, used));
    }
    let name_len = s
        .bytes()
        .take(32)
        .take_while(|c| !b"\t\n\x0c <&#;".contains(c))
        .count();
    let name = &s[..name_len];
    if b.get(name_len) == Some(&b';') {
        if let Some((_, v)) = ENTITIES.iter().find(|(k, _)| *k == name) {
            return Some((v.to_string(), name_len + 1));
        }
    }
    // Without ';' (or an unknown name): the longest known prefix, as Python does.
    for end in (1..=name_len).rev() {
        if !name.is_char_boundary(end) {
            continue;
        }
        let prefix = &name[..end];
        if NO_SEMI.contains(&prefix) {
            let v = ENTITIES.iter().find(|(k, _)| *k == prefix)?.1;
            return Some((v.to_string(), end));
        }
    }
    None
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
mod tests {
    use super::*;

    fn vocab_path() -> Option<String> {
        std::env::var("SHARDSTREAM_CLIP_BPE").ok()
    }

    #[test]
    fn html_unescape_matches_python_on_common_references() {
        assert_eq!(
            html_unescape("a &amp; b &lt;c&gt; &quot;d&quot; &#39;e&#39;"),
            "a & b <c> \"d\" 'e'"
        );
        assert_eq!(html_unescape("&#x41;&#66;&#128;&#0;"), "AB€\u{fffd}");
        assert_eq!(
            html_unescape("&ampx &amp;amp; &unknown; & &#;"),
            "&x &amp; &unknown; & &#;"
        );
        assert_eq!(html_unescape(&html_unescape("&amp;amp;")), "&");
    }

    #[test]
    fn cleaning_follows_open_clip() {
        assert_eq!(clean("  Hello\t\nWORLD \u{1c} x "), "hello world x");
        assert_eq!(
            clean("\u{201c}Quote\u{201d} \u{ff21}\u{fb01}"),
            "\"quote\" afi"
        );
        assert_eq!(clean("e\u{301}"), "\u{e9}");
        assert_eq!(clean("a\0b"), "ab");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn byte_table_is_clips() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], '\u{120}');
        assert_eq!(t[0], '\u{100}');
    }

    /// With the vocabulary (SHARDSTREAM_CLIP_BPE=path of open_clip's file), known token ids.
    #[test]
    fn tokens_of_a_known_caption() {
        let Some(path) = vocab_path() else {
            return;
        };
        let t = ClipTokenizer::from_bpe_file(&path, 77).unwrap();
        let ids = t.tokenize("a photo of a cat");
        assert_eq!(&ids[..7], &[49406, 320, 1125, 539, 320, 2368, 49407]);
        assert!(ids[7..].iter().all(|&x| x == 0));
        let long = t.tokenize(&"cat ".repeat(200));
        assert_eq!(long[76], 49407);
        assert_eq!(long.len(), 77);
    }
}
