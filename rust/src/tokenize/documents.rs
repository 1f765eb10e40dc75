//! Documents to token ids: a Hugging Face `tokenizer.json` run by the `tokenizers` library (the
//! crate behind the Python package, so the ids are its `encode(text, add_special_tokens=False)`),
//! with an optional BOS before and the EOS (or a named separator) after every document.
//!
//! Byte-level BPE files within what `bpe::FastBpe` encodes exactly (GPT-2-, Llama-3- and
//! Qwen2-style) take that fast path instead, decided once at load; a text holding an added
//! token still goes to the library.

use std::sync::{Arc, Mutex};

use super::bpe::FastBpe;
use super::windows::{cut_rule, pieces, CutRule};
use crate::rng::hash_bytes;

/// Encoders kept for reuse in this process: a loader asks for its tokenizer's several times
/// (its fingerprint, its fast path, each pass's pipeline), and a `tokenizer.json` of a large
/// vocabulary takes a second to parse. Bounded: the most recently used few.
const SHARED_ENCODERS: usize = 2;

/// (path, eos, bos, hash of the file's bytes) and its encoder, most recently used last.
type SharedKey = (String, Option<String>, Option<String>, u64);
static SHARED: Mutex<Vec<(SharedKey, Arc<DocumentEncoder>)>> = Mutex::new(Vec::new());

/// Tokens tried, in order, as the end-of-document token when none is named: GPT-2 / StarCoder /
/// Qwen, Llama 2 / Mistral, Llama 3, Gemma, SentencePiece T5.
const EOS_CANDIDATES: [&str; 5] = [
    "<|endoftext|>",
    "</s>",
    "<|end_of_text|>",
    "<eos>",
    "<|im_end|>",
];

/// What a tokenizer file could not be made into.
#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error("tokenizer file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("tokenizer file {path}: {detail}")]
    Format { path: String, detail: String },
}

/// Token ids and, for each, the byte span of the text it stands for.
pub type TokenSpans = (Vec<u32>, Vec<(usize, usize)>);

/// The bytes of the tokenizer file at `path`.
fn read(path: &str) -> Result<Vec<u8>, EncoderError> {
    std::fs::read(path).map_err(|source| EncoderError::Io {
        path: path.into(),
        source,
    })
}

/// Encodes documents for a packed text kind.
pub struct DocumentEncoder {
    tokenizer: tokenizers::Tokenizer,
    pub eos: u32,
    pub bos: Option<u32>,
    /// Identifies the token counts this encoder gives: the file's bytes, the EOS and the BOS.
    /// Counts made under another fingerprint are refused.
    pub fingerprint: String,
    /// Where long documents are cut into pieces (`windows`); None: encoded whole.
    cut: Option<CutRule>,
    /// The fast byte-level BPE path, or why this file does not take it.
    fast: Result<FastBpe, String>,
}

impl DocumentEncoder {
    /// The encoder of [`DocumentEncoder::from_file`], shared with the other users of the same
    /// file (by its bytes, so an edited file is read again) and settings in this process.
    pub fn shared(
        path: &str,
        eos: Option<&str>,
        bos: Option<&str>,
    ) -> Result<Arc<Self>, EncoderError> {
        let raw = read(path)?;
        let key: SharedKey = (
            path.into(),
            eos.map(Into::into),
            bos.map(Into::into),
            hash_bytes(&raw),
        );
        {
            let mut kept = SHARED.lock().expect("encoder cache lock");
            if let Some(i) = kept.iter().position(|(k, _)| *k == key) {
                let hit = kept.remove(i);
                let encoder = hit.1.clone();
                kept.push(hit);
                return Ok(encoder);
            }
        }
        // Parsed outside the lock: another file's users need not wait.
        let encoder = Arc::new(Self::from_bytes(path, &raw, eos, bos)?);
        let mut kept = SHARED.lock().expect("encoder cache lock");
        kept.retain(|(k, _)| *k != key);
        if kept.len() >= SHARED_ENCODERS {
            kept.remove(0);
        }
        kept.push((key, encoder.clone()));
        Ok(encoder)
    }

    /// From a `tokenizer.json`; `eos` names the token after each document (None: the first of
    /// the usual names the vocabulary holds), `bos` the one before it (None: none).
    pub fn from_file(
        path: &str,
        eos: Option<&str>,
        bos: Option<&str>,
    ) -> Result<Self, EncoderError> {
        Self::from_bytes(path, &read(path)?, eos, bos)
    }

    /// From the bytes `raw` of the `tokenizer.json` at `path` (named in errors).
    fn from_bytes(
        path: &str,
        raw: &[u8],
        eos: Option<&str>,
        bos: Option<&str>,
    ) -> Result<Self, EncoderError> {
        let bad = |detail: String| EncoderError::Format {
            path: path.into(),
            detail,
        };
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(raw).map_err(|e| {
            bad(format!(
                "not a tokenizer.json that the tokenizers library loads: {e}"
            ))
        })?;
        // Documents are never cut or padded here: packing does both.
        tokenizer
            .with_truncation(None)
            .map_err(|e| bad(e.to_string()))?;
        tokenizer.with_padding(None);
        let id = |token: &str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| bad(format!("its vocabulary has no token {token:?}")))
        };
        let eos_id = match eos {
            Some(token) => id(token)?,
            None => EOS_CANDIDATES
                .iter()
                .find_map(|t| tokenizer.token_to_id(t))
                .ok_or_else(|| {
                    bad(format!(
                        "none of the usual end-of-document tokens {EOS_CANDIDATES:?} is in its \
                         vocabulary: name one (eos_token=)"
                    ))
                })?,
        };
        let bos_id = bos.map(id).transpose()?;
        let fingerprint = format!(
            "{:016x}",
            hash_bytes(
                &[
                    raw,
                    &eos_id.to_le_bytes(),
                    &bos_id.map_or(u64::MAX, u64::from).to_le_bytes()
                ]
                .concat()
            )
        );
        let json: serde_json::Value = serde_json::from_slice(raw).unwrap_or_default();
        Ok(Self {
            tokenizer,
            eos: eos_id,
            bos: bos_id,
            fingerprint,
            cut: cut_rule(&json),
            fast: FastBpe::from_json(&json),
        })
    }

    /// The ids of one document: BOS (if any), the text's ids, EOS. A long document is encoded
    /// in pieces where the tokenizer allows (`windows`), with the same ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        out.extend(self.bos);
        self.encode_into(text, &mut out)?;
        out.push(self.eos);
        Ok(out)
    }

    /// Appends the ids of `text` alone (no BOS or EOS) to `out`: a segment of an interleaved
    /// document, whose images' tokens split the text as added tokens split it in the library.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let parts = match self.cut {
            Some(rule) => pieces(text, rule),
            None => vec![(0, text.len())],
        };
        for (start, end) in parts {
            if let Ok(fast) = &self.fast {
                if fast.encode(&text[start..end], out) {
                    continue;
                }
            }
            let encoding = self
                .tokenizer
                .encode_fast(&text[start..end], false)
                .map_err(|e| e.to_string())?;
            out.extend_from_slice(encoding.get_ids());
        }
        Ok(())
    }

    /// The ids of `text` alone, each with the byte span of `text` it stands for (as the library
    /// reports offsets: a span may be trimmed of the spaces its token holds, or empty). Encoded
    /// whole by the library, never cut, so the spans are its own: for a text whose tokens are
    /// told apart by where they lie (a conversation's prompts and answers).
    pub fn encode_with_spans(&self, text: &str) -> Result<TokenSpans, String> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| e.to_string())?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// The id of `token` in the vocabulary (an added token included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Which encoder runs: `Ok(())` the fast byte-level BPE path (`bpe`), or `Err(reason)` the
    /// tokenizers library, with why the file is outside the fast path.
    pub fn fast_path(&self) -> Result<(), &str> {
        self.fast.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Whether long documents are encoded in pieces (see `windows`).
    pub fn cuts_long_documents(&self) -> bool {
        self.cut.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::scratch_dir;

    const GPT2_STYLE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenizers/captions-bpe.json"
    );

    #[test]
    fn a_shared_encoder_is_parsed_once_per_file_content_and_settings() {
        let dir = scratch_dir("shared-encoder");
        let path = dir.join("tokenizer.json");
        let path = path.to_str().unwrap();
        std::fs::copy(GPT2_STYLE, path).unwrap();
        let a = DocumentEncoder::shared(path, None, None).unwrap();
        let b = DocumentEncoder::shared(path, None, None).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "the same file and settings: one encoder"
        );
        let other_eos = DocumentEncoder::shared(path, Some("</s>"), Some("</s>")).unwrap();
        assert!(
            !Arc::ptr_eq(&a, &other_eos),
            "other settings: another encoder"
        );
        // The file edited in place (the same vocabulary, other bytes): read again.
        let mut raw = std::fs::read(path).unwrap();
        raw.push(b'\n');
        std::fs::write(path, raw).unwrap();
        let edited = DocumentEncoder::shared(path, None, None).unwrap();
        assert!(!Arc::ptr_eq(&a, &edited));
        assert_ne!(a.fingerprint, edited.fingerprint);
        assert_eq!(
            edited.encode("a photo of a cat").unwrap(),
            DocumentEncoder::from_file(path, None, None)
                .unwrap()
                .encode("a photo of a cat")
                .unwrap()
        );
        assert!(matches!(
            DocumentEncoder::shared(&format!("{path}.missing"), None, None),
            Err(EncoderError::Io { .. })
        ));
    }
}
