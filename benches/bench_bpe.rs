//! The fast byte-level BPE path against the tokenizers library, one thread, the same text:
//! MB/s of `FastBpe::encode` and of `Tokenizer::encode_fast(text, false)` (what the packed text
//! kind called before), side by side with their ratio, for the GPT-2-style and Llama-3-style
//! fixtures. The ids are checked equal before timing.
//!
//! The text: Python standard library sources (the python3 on PATH's `*.py`, sorted) up to
//! `--mb` megabytes, one document per file. Each contender encodes all of it `--repeat` times
//! (the first pass fills its word cache; the best pass is reported, and the first apart).
//!
//! Run: `cargo bench --bench bench_bpe -- [--mb 8] [--repeat 3]`.

use shardstream::tokenize::bpe::FastBpe;
use std::time::Instant;

#[path = "common/mod.rs"]
mod common;
use common::arg;

fn corpus(mb: f64) -> Vec<String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
        ])
        .output()
        .expect("python3 on PATH");
    let stdlib = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut paths: Vec<_> = std::fs::read_dir(&stdlib)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    paths.sort();
    let (mut docs, mut bytes) = (Vec::new(), 0usize);
    for p in paths.iter().cycle().take(100_000) {
        if bytes as f64 >= mb * 1e6 {
            break;
        }
        if let Ok(t) = std::fs::read_to_string(p) {
            bytes += t.len();
            docs.push(t);
        }
    }
    docs
}

/// (first pass, best pass) seconds of `f` over all documents.
fn time(repeat: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut all = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        f();
        all.push(t.elapsed().as_secs_f64());
    }
    (all[0], all.iter().cloned().fold(f64::INFINITY, f64::min))
}

fn main() {
    let mb = arg("--mb", 8.0);
    let repeat = arg("--repeat", 3.0) as usize;
    let docs = corpus(mb);
    let bytes: usize = docs.iter().map(String::len).sum();
    let mbytes = bytes as f64 / 1e6;
    println!(
        "text: {} documents, {mbytes:.1} MB; one thread; best of {repeat} (first pass apart)",
        docs.len()
    );
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizers");
    for file in ["captions-bpe.json", "llama3-style-bpe.json"] {
        let path = format!("{root}/{file}");
        let raw = std::fs::read(&path).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        let fast = FastBpe::from_json(&json).expect("a fast-path tokenizer");
        let library = tokenizers::Tokenizer::from_bytes(&raw).unwrap();
        let mut tokens = 0usize;
        for d in &docs {
            let mut ours = Vec::new();
            assert!(fast.encode(d, &mut ours));
            let want = library.encode_fast(d.as_str(), false).unwrap();
            assert_eq!(ours, want.get_ids(), "{file}: ids differ");
            tokens += ours.len();
        }
        let (lib_first, lib_best) = time(repeat, || {
            for d in &docs {
                std::hint::black_box(library.encode_fast(d.as_str(), false).unwrap());
            }
        });
        let mut out = Vec::with_capacity(tokens);
        let (fast_first, fast_best) = time(repeat, || {
            for d in &docs {
                out.clear();
                std::hint::black_box(fast.encode(d, &mut out));
            }
        });
        println!("{file} ({tokens} tokens, ids equal):");
        println!(
            "  tokenizers encode_fast  {:7.1} MB/s  (first pass {:6.1} MB/s)",
            mbytes / lib_best,
            mbytes / lib_first
        );
        println!(
            "  shardstream FastBpe     {:7.1} MB/s  (first pass {:6.1} MB/s)",
            mbytes / fast_best,
            mbytes / fast_first
        );
        println!(
            "  ratio                   {:7.2}x        (first pass {:5.2}x)",
            lib_best / fast_best,
            lib_first / fast_first
        );
    }
}
