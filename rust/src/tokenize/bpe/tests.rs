//! Differential tests: the fast path's ids against the tokenizers library's
//! `encode(text, add_special_tokens=false)` on real text (Python standard library sources, the
//! real captions of `shared/data`), hand-made edge cases and seeded random Unicode strings, for
//! GPT-2-, Llama-3- and Qwen2-style `tokenizer.json` files (the committed fixtures and variants
//! of them).

use serde_json::Value;

use super::pretokenize::{LLAMA3, QWEN2};
use super::FastBpe;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers");
/// The real captions of the shared data, where the Python tests find them
/// (`SHARDSTREAM_TEST_DATA`, else `/work/shared/data`): not relative to the checkout, which a
/// clean clone may put anywhere.
fn captions() -> String {
    let data =
        std::env::var("SHARDSTREAM_TEST_DATA").unwrap_or_else(|_| "/work/shared/data".into());
    format!("{data}/img2dataset-test_1000.parquet")
}

/// Seeded random strings over a palette of the characters the patterns and the merges treat
/// specially, plus any scalar value (astral planes included).
pub(super) fn random_text(state: &mut u64, max_chars: usize) -> String {
    const PALETTE: &[char] = &[
        ' ',
        ' ',
        ' ',
        '\t',
        '\n',
        '\r',
        '\u{b}',
        '\u{c}',
        '\u{85}',
        '\u{a0}',
        '\u{2028}',
        '\u{3000}',
        '\'',
        '\'',
        's',
        'S',
        't',
        'r',
        'e',
        'E',
        'v',
        'm',
        'l',
        'L',
        'd',
        'ſ',
        'K',
        'a',
        'Z',
        'n',
        'i',
        'o',
        '0',
        '7',
        '9',
        '½',
        '٣',
        'Ⅻ',
        '!',
        '.',
        ',',
        '(',
        '-',
        '"',
        'é',
        'e',
        '\u{301}',
        '\u{327}',
        'c',
        '漢',
        'か',
        '🎉',
        '𝔘',
        '\u{1F3FB}',
        '\u{200D}',
        '\u{FE0F}',
        'ẞ',
        'ß',
        'İ',
        'Å',
        'Å',
        'A',
        '\u{30A}',
        '가',
        '\u{1100}',
        '\u{1161}',
    ];
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    };
    let n = (next() % max_chars as u64) as usize;
    (0..n)
        .map(|_| {
            let r = next();
            if r % 5 == 0 {
                char::from_u32((r >> 8) as u32 % 0x110000).unwrap_or('\u{FFFD}')
            } else {
                PALETTE[(r >> 8) as usize % PALETTE.len()]
            }
        })
        .collect()
}

fn fixture(name: &str) -> Value {
    let raw = std::fs::read(format!("{FIXTURES}/{name}")).unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// The tokenizer files tested, by name: the committed fixtures and variants of them that
/// cover the other settings the fast path takes.
fn tokenizers() -> Vec<(&'static str, Value)> {
    let gpt2 = fixture("captions-bpe.json");
    let llama3 = fixture("llama3-style-bpe.json");
    let mut gpt2_plain = gpt2.clone();
    gpt2_plain["normalizer"] = Value::Null;
    gpt2_plain["pre_tokenizer"]["add_prefix_space"] = false.into();
    // Merges as "a b" strings (older files) rather than pairs.
    let merges: Vec<Value> = gpt2["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()).into())
        .collect();
    gpt2_plain["model"]["merges"] = merges.into();
    let mut llama3_ignore = llama3.clone();
    llama3_ignore["model"]["ignore_merges"] = true.into();
    let mut qwen2 = llama3.clone();
    qwen2["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2.into();
    qwen2["normalizer"] = serde_json::json!({"type": "NFC"});
    assert_eq!(
        llama3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
        LLAMA3
    );
    vec![
        ("gpt2 (NFC, prefix space)", gpt2),
        ("gpt2 (plain, string merges)", gpt2_plain),
        ("llama3", llama3),
        ("llama3 (ignore_merges)", llama3_ignore),
        ("qwen2 (NFC, single digits)", qwen2),
    ]
}

/// Python standard library sources (the python3 on PATH's), sorted, and the real captions.
fn real_texts() -> Vec<String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
        ])
        .output()
        .expect("python3 on PATH (its standard library is the test text)");
    let stdlib = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut paths: Vec<_> = std::fs::read_dir(&stdlib)
        .expect("the standard library directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    paths.sort();
    let mut texts: Vec<String> = paths
        .iter()
        .step_by(4)
        .take(40)
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    assert!(texts.len() >= 30, "standard library sources under {stdlib}");
    // Astral-plane characters in code.
    if let Ok(t) = std::fs::read_to_string(format!("{stdlib}/lib2to3/tests/test_parser.py")) {
        texts.push(t);
    }
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(std::fs::File::open(captions()).unwrap()).unwrap();
    let mut captions = 0;
    for row in reader.get_row_iter(None).unwrap() {
        for (name, field) in row.unwrap().get_column_iter() {
            if let (true, parquet::record::Field::Str(s)) = (name == "TEXT", field) {
                texts.push(s.clone());
                captions += 1;
            }
        }
    }
    assert_eq!(captions, 1000);
    texts
}

/// Hand-made cases: the patterns' corners, CRLF, tabs, runs, digits, contractions in mixed
/// case, NFC-sensitive sequences, added tokens inside text.
fn edge_texts() -> Vec<String> {
    [
        "",
        " ",
        "a",
        "  ",
        "\n",
        "Hello world",
        "  two leading, two trailing  ",
        "I'm, you're, he'll, we'd, it's, they've; I'M YOU'RE He'Ll WE'D It'S 'ſ 'K o'clock",
        "tabs\tand\t\tmore \t x\r\n\r\nCRLF\r\n\n\n  \n  y\n",
        "digits 1 12 123 1234 12345 1234567 ١٢٣٤ 3.14159 ½¼ 2024-01-01",
        "emoji 🎉🎉 👍🏻 👨‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, CJK 漢字かな, اَلْعَرَبِيَّةُ, ẞ ß İ",
        "combining: e\u{301} A\u{30A} \u{212B} \u{1100}\u{1161} c\u{327}\u{301}",
        "punct!!! (x) [y] {z} --> <=> ... '' \"q\" \u{a0}nbsp\u{3000}ideo\u{2028}ls",
        "def f(x):\n    return x  # comment\n\n\n\tif x:\n\t\tpass\n",
        "a <|end_of_text|> b</s> c<s>d <|begin_of_text|>",
        "</s>",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "ab".repeat(300),
        "the".repeat(200),
        "9".repeat(100),
        " ".repeat(70) + "x",
        "\u{301}".repeat(50),
        "é".repeat(100),
    ])
    .collect()
}

/// Checks every text, returns how many the fast path took (the others hold an added token).
fn check(name: &str, json: &Value, texts: &[String]) -> usize {
    let library = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(json).unwrap()).unwrap();
    let fast = FastBpe::from_json(json).unwrap_or_else(|e| panic!("{name}: {e}"));
    let contents: Vec<&str> = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["content"].as_str().unwrap())
        .collect();
    let mut taken = 0;
    for text in texts {
        let want = library.encode_fast(text.as_str(), false).unwrap();
        // Twice: the second pass reads the word cache.
        for pass in 0..2 {
            let mut ours = Vec::new();
            if fast.encode(text, &mut ours) {
                assert_eq!(ours, want.get_ids(), "{name}: {text:?}");
                taken += usize::from(pass == 0);
            } else {
                assert!(ours.is_empty());
                assert!(
                    contents.iter().any(|c| text.contains(c)),
                    "{name}: fell back on {text:?}"
                );
            }
        }
    }
    taken
}

#[test]
fn fast_ids_equal_the_library_s_on_real_and_edge_text() {
    let mut texts = real_texts();
    texts.extend(edge_texts());
    for (name, json) in tokenizers() {
        let taken = check(name, &json, &texts);
        // Only the few edge cases with an added token go to the library.
        assert!(
            taken + 3 >= texts.len(),
            "{name}: {taken} of {}",
            texts.len()
        );
    }
}

#[test]
fn fast_ids_equal_the_library_s_on_random_unicode() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let texts: Vec<String> = (0..4000)
        .map(|i| random_text(&mut state, if i % 10 == 0 { 400 } else { 40 }))
        .collect();
    for (name, json) in tokenizers() {
        assert_eq!(check(name, &json, &texts), texts.len(), "{name}");
    }
}

#[test]
fn unsupported_tokenizers_are_refused_with_a_reason() {
    let wordpiece = fixture("captions-wordpiece.json");
    assert!(FastBpe::from_json(&wordpiece)
        .unwrap_err()
        .contains("not BPE"));
    let mut other_split = fixture("llama3-style-bpe.json");
    other_split["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+".into();
    assert!(FastBpe::from_json(&other_split)
        .unwrap_err()
        .contains("pre-tokenizer"));
    let mut nfkc = fixture("captions-bpe.json");
    nfkc["normalizer"] = serde_json::json!({"type": "NFKC"});
    assert!(FastBpe::from_json(&nfkc)
        .unwrap_err()
        .contains("normalizer"));
    let mut dropout = fixture("captions-bpe.json");
    dropout["model"]["dropout"] = 0.1.into();
    assert!(FastBpe::from_json(&dropout)
        .unwrap_err()
        .contains("dropout"));
}

#[test]
fn document_encoder_takes_the_fast_path_and_long_documents_keep_their_ids() {
    use crate::tokenize::DocumentEncoder;
    // Standard library sources joined: over 512 KB, cut into windows by the encoder.
    let long: String = real_texts()[..30].concat();
    assert!(long.len() > 512 << 10);
    for (file, eos) in [
        ("captions-bpe.json", "</s>"),
        ("llama3-style-bpe.json", "<|end_of_text|>"),
    ] {
        let path = format!("{FIXTURES}/{file}");
        let encoder = DocumentEncoder::from_file(&path, Some(eos), None).unwrap();
        assert_eq!(encoder.fast_path(), Ok(()), "{file}");
        assert!(encoder.cuts_long_documents());
        let library = tokenizers::Tokenizer::from_file(&path).unwrap();
        let mut want = library
            .encode_fast(long.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        want.push(library.token_to_id(eos).unwrap());
        assert_eq!(encoder.encode(&long).unwrap(), want, "{file}");
        // A document holding an added token: the library encodes it, with the same ids.
        let with_added = format!("before {eos} after");
        let mut want = library
            .encode_fast(with_added.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        want.push(library.token_to_id(eos).unwrap());
        assert_eq!(encoder.encode(&with_added).unwrap(), want, "{file}");
    }
    let wordpiece = format!("{FIXTURES}/captions-wordpiece.json");
    let encoder = DocumentEncoder::from_file(&wordpiece, Some("[SEP]"), None).unwrap();
    assert!(encoder.fast_path().unwrap_err().contains("not BPE"));
}
