//! Cut documents against the tokenizers library: the pieces' ids, concatenated, are the whole
//! document's ids, for every split pattern that cuts (GPT-2's byte-level regex with and
//! without a prefix space, Llama 3's and Qwen2's split patterns, BERT's), with every kind of
//! whitespace run before the line break at each cut point and every kind of line start after
//! it. A document repeats one such line, so that every cut candidate in it is of that kind.

use serde_json::Value;

use super::{cut_rule, pieces, CutRule, WINDOW};
use crate::tokenize::bpe::pretokenize::QWEN2;
use crate::tokenize::DocumentEncoder;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers");

fn fixture(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/{name}")).unwrap()).unwrap()
}

/// `json` (a byte-level BPE) with merges that join whitespace before a line break to it, as a
/// tokenizer trained on code or prose has (`ĊĊ` for a blank line): without them a run taken as
/// one pre-token or as two gives the same ids, and a wrong cut would go unseen.
fn with_whitespace_merges(mut json: Value) -> Value {
    let added = json["added_tokens"].as_array().cloned().unwrap_or_default();
    let model = &mut json["model"];
    let ids = model["vocab"].as_object().unwrap().values();
    let mut next = ids
        .chain(added.iter().map(|t| &t["id"]))
        .filter_map(Value::as_u64)
        .max()
        .unwrap()
        + 1;
    for (a, b) in [("Ċ", "Ċ"), ("Ġ", "Ċ"), ("č", "Ċ"), ("ĉ", "Ċ")] {
        let merged = format!("{a}{b}");
        let vocab = model["vocab"].as_object_mut().unwrap();
        if !vocab.contains_key(&merged) {
            vocab.insert(merged, next.into());
            next += 1;
            model["merges"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!([a, b]));
        }
    }
    json
}

/// (name, tokenizer.json, the rule it must get, its EOS token).
fn tokenizers() -> Vec<(&'static str, Value, CutRule, &'static str)> {
    let gpt2 = with_whitespace_merges(fixture("captions-bpe.json"));
    let mut gpt2_plain = gpt2.clone();
    gpt2_plain["normalizer"] = Value::Null;
    gpt2_plain["pre_tokenizer"]["add_prefix_space"] = false.into();
    let llama3 = fixture("llama3-style-bpe.json");
    // A GPT-2 regex in a later byte-level step splits the first step's pre-tokens further:
    // Llama 3's cut stands.
    let mut llama3_then_gpt2 = llama3.clone();
    llama3_then_gpt2["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true.into();
    // GPT-2's regex first, then digits one at a time: its look-ahead moves the cut.
    let mut gpt2_then_digits = gpt2_plain.clone();
    gpt2_then_digits["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
        gpt2_plain["pre_tokenizer"].clone(),
        {"type": "Digits", "individual_digits": true},
    ]});
    let mut qwen2 = llama3.clone();
    qwen2["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2.into();
    qwen2["normalizer"] = serde_json::json!({"type": "NFC"});
    vec![
        (
            "gpt2 (no prefix space)",
            gpt2_plain,
            CutRule::BeforeLineBreak,
            "</s>",
        ),
        (
            "gpt2 then digits",
            gpt2_then_digits,
            CutRule::BeforeLineBreak,
            "</s>",
        ),
        (
            "gpt2 (NFC, prefix space)",
            gpt2,
            CutRule::AfterLineBreakBeforeSpace,
            "</s>",
        ),
        ("llama3", llama3, CutRule::AfterLineBreak, "<|end_of_text|>"),
        (
            "llama3 then a gpt2 regex",
            llama3_then_gpt2,
            CutRule::AfterLineBreak,
            "<|end_of_text|>",
        ),
        (
            "qwen2 (NFC)",
            qwen2,
            CutRule::AfterLineBreak,
            "<|end_of_text|>",
        ),
        (
            "wordpiece (BERT)",
            fixture("captions-wordpiece.json"),
            CutRule::AfterLineBreak,
            "[SEP]",
        ),
    ]
}

/// Whitespace runs before a line break: none, spaces, tabs, more line breaks (blank lines),
/// `\r\n`, and the Unicode spaces `\s` holds (no-break, ideographic, next line).
const BEFORE: [&str; 12] = [
    "", " ", "  ", "\t", "\n", "\n\n", "\r", " \n", "\t\n", "\u{a0}", "\u{3000}", "\u{85}",
];
/// What starts the next line: a letter, an indent of spaces or a tab, a digit, punctuation, a
/// contraction's apostrophe, a letter outside ASCII.
const AFTER: [&str; 8] = ["b", " b", "  b", "\tb", "1", "!", "'s", "é"];

/// A document over a window long (cut once where its lines allow), one line repeated: `{body}{before}\n{after} rest`.
fn document(before: &str, after: &str) -> String {
    let line = format!("a = 1{before}\n{after} = x(y, 'z') # é漢字");
    line.repeat(WINDOW * 5 / 4 / line.len() + 8)
}

#[test]
fn cut_pieces_give_the_whole_document_s_ids_for_every_whitespace_at_every_cut() {
    for (name, json, rule, _) in tokenizers() {
        assert_eq!(cut_rule(&json), Some(rule), "{name}");
        let library = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for before in BEFORE {
            for after in AFTER {
                let text = document(before, after);
                let parts = pieces(&text, rule);
                // Every line ends alike, so the document is cut iff its line start is a cut
                // point: then the comparison below covers this whitespace at a cut.
                assert_eq!(
                    parts.len() > 1,
                    admits(rule, after),
                    "{name}: {before:?} + \\n + {after:?}: {} pieces",
                    parts.len()
                );
                let whole = library.encode_fast(text.as_str(), false).unwrap();
                let mut joined = Vec::with_capacity(whole.len());
                for (start, end) in parts {
                    let piece = library.encode_fast(&text[start..end], false).unwrap();
                    joined.extend_from_slice(piece.get_ids());
                }
                if joined != whole.get_ids() {
                    let first = joined.iter().zip(whole.get_ids()).position(|(a, b)| a != b);
                    panic!(
                        "{name}: {before:?} + \\n + {after:?}: {} ids in pieces, {} whole, \
                         first difference at {first:?}",
                        joined.len(),
                        whole.len()
                    );
                }
            }
        }
    }
}

/// Whether `rule` may cut before a line that starts with `after` (written here from the rules'
/// definitions, independently of `is_cut`).
fn admits(rule: CutRule, after: &str) -> bool {
    let b = after.as_bytes();
    let plain = |c: u8| c.is_ascii() && !c.is_ascii_whitespace();
    match rule {
        CutRule::AfterLineBreak | CutRule::BeforeLineBreak => plain(b[0]),
        CutRule::AfterLineBreakBeforeSpace => b[0] == b' ' && plain(b[1]),
    }
}

/// The issue's reproduction, through the document encoder (the fast BPE path here): a GPT-2
/// byte-level tokenizer without a prefix space on `"a = 1\n\n" x 10000` (70 KB) gave 49,999
/// ids where the library gives 50,000.
#[test]
fn the_encoder_keeps_every_id_of_long_documents_with_blank_lines() {
    let dir = std::env::temp_dir().join(format!("shardstream-windows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, json, _, eos) in tokenizers() {
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let path = path.to_str().unwrap();
        let encoder = DocumentEncoder::from_file(path, Some(eos), None).unwrap();
        assert!(encoder.cuts_long_documents(), "{name}");
        let library = tokenizers::Tokenizer::from_file(path).unwrap();
        let eos_id = library.token_to_id(eos).unwrap();
        for text in [
            "a = 1\n\n".repeat(10_000),
            "a = 1\r\n".repeat(10_000),
            "a = 1 \n".repeat(10_000),
            document("\n\n", "b"),
        ] {
            let mut want = library
                .encode_fast(text.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            want.push(eos_id);
            let got = encoder.encode(&text).unwrap();
            assert_eq!(got.len(), want.len(), "{name}: {:?}", &text[..8]);
            assert_eq!(got, want, "{name}: {:?}", &text[..8]);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
