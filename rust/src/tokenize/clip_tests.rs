//! The tokenizer's tests: open_clip's cleaning, byte table, regex split and BPE, token for
//! token, and the word caches across threads.

use super::*;
use crate::tokenize::clean::html_unescape;

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

/// Every ASCII string up to `max_len` over `alphabet`, in order.
fn all_strings(alphabet: &[u8], max_len: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut level = vec![String::new()];
    for _ in 0..max_len {
        level = level
            .iter()
            .flat_map(|s| alphabet.iter().map(move |&c| format!("{s}{}", c as char)))
            .collect();
        out.extend(level.iter().cloned());
    }
    out
}

fn regex_pieces(re: &Regex, text: &str) -> Vec<String> {
    re.find_iter(text).map(|m| m.as_str().to_string()).collect()
}

fn ascii_pieces(text: &str) -> Vec<String> {
    let mut out = vec![];
    split_ascii(text, [SOT, EOT], |p| {
        out.push(p.to_string());
        true
    });
    out
}

/// The regex-free splitter of ASCII captions gives the regex's matches: on every string of
/// up to 6 characters over an alphabet with each kind of character the regex tells apart
/// (letters of both cases, a digit, the contraction letters, punctuation, `<`/`>` and each
/// ASCII whitespace), and on texts around the start/end tokens.
#[test]
fn split_ascii_equals_the_regex() {
    let re = clip_pattern(SOT, EOT).unwrap();
    let mut texts = all_strings(b"'sStrevlmdx7_< \t\x0b\x1c", 5);
    texts.extend(all_strings(b"'reRE lLd", 6));
    for special in [SOT, EOT] {
        for (pre, post) in [("", ""), ("a", "b"), (":", "'s"), ("'", "<"), (" ", "x")] {
            texts.push(format!("{pre}{special}{post}"));
            texts.push(format!("{pre}{}{post}", special.to_uppercase()));
            texts.push(format!("{pre}{}{post}", &special[..special.len() - 1]));
        }
    }
    texts.push("it's they're we've i'm you'll he'd it'S ''s 'x 're' 3.14 a_b <<>>".into());
    for text in &texts {
        assert_eq!(ascii_pieces(text), regex_pieces(&re, text), "{text:?}");
    }
}

/// The one-pass cleaning of ASCII captions gives `clean`'s output, on every string of up to
/// 4 characters over letters, each kind of whitespace, removed control characters and `&`.
#[test]
fn clean_into_equals_clean() {
    let mut out = String::from("left over");
    for text in all_strings(b"aZ \t\n\r\x0b\x0c\x1c\x00\x7f&", 4)
        .into_iter()
        .chain(["A &amp; B".into(), "caf\u{e9} \u{201c}x\u{201d}".into()])
    {
        clean_into(&text, &mut out);
        assert_eq!(out, clean(&text), "{text:?}");
    }
}

/// open_clip's `bpe` as written there (every pair looked up on every round).
fn bpe_reference(merges: &FxMap<u64, (u32, u32)>, word: &mut Vec<u32>) {
    while word.len() > 1 {
        let best = word
            .windows(2)
            .filter_map(|w| {
                merges
                    .get(&pair(w[0], w[1]))
                    .map(|&(r, m)| (r, w[0], w[1], m))
            })
            .min_by_key(|b| b.0);
        let Some((_, left, right, merged)) = best else {
            return;
        };
        let (mut i, mut out) = (0, vec![]);
        while i < word.len() {
            if i + 1 < word.len() && word[i] == left && word[i + 1] == right {
                out.push(merged);
                i += 2;
            } else {
                out.push(word[i]);
                i += 1;
            }
        }
        *word = out;
    }
}

/// The incremental BPE merges as open_clip's loop does, on random merge tables over a few
/// symbols (so that pairs repeat, overlap and chain) and random words up to 40 symbols.
#[test]
fn incremental_bpe_equals_open_clips_loop() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let (mut ranks, mut scratch) = (vec![], vec![]);
    for _ in 0..300 {
        let symbols = 2 + next(5) as u32;
        let mut merges = FxMap::default();
        let mut new_id = 1000;
        for rank in 0..next(40) as u32 {
            let (l, r) = (
                next(symbols as u64 + 6) as u32,
                next(symbols as u64 + 6) as u32,
            );
            let l = if l >= symbols {
                1000 + (l - symbols)
            } else {
                l
            };
            let r = if r >= symbols {
                1000 + (r - symbols)
            } else {
                r
            };
            if let std::collections::hash_map::Entry::Vacant(e) = merges.entry(pair(l, r)) {
                e.insert((rank, new_id));
                new_id += 1;
            }
        }
        for _ in 0..50 {
            let word: Vec<u32> = (0..next(40)).map(|_| next(symbols as u64) as u32).collect();
            let (mut fast, mut slow) = (word.clone(), word.clone());
            bpe(&merges, &mut fast, &mut ranks, &mut scratch);
            bpe_reference(&merges, &mut slow);
            assert_eq!(fast, slow, "{word:?}");
        }
    }
}

/// A tokenizer over a made-up vocabulary (every byte, with and without `</w>`, one merge):
/// enough to exercise the word cache without open_clip's file.
fn small_tokenizer() -> ClipTokenizer {
    let chars = bytes_to_unicode();
    let mut vocab: HashMap<String, u32> = HashMap::new();
    for c in chars {
        let n = vocab.len() as u32;
        vocab.insert(c.to_string(), n);
        vocab.insert(format!("{c}</w>"), n + 1);
    }
    let n = vocab.len() as u32;
    vocab.insert("ab</w>".into(), n);
    vocab.insert(SOT.into(), n + 1);
    vocab.insert(EOT.into(), n + 2);
    let merges = [("a".to_string(), "b</w>".to_string())];
    ClipTokenizer::build(vocab, &merges, SOT, EOT, 8, "test").unwrap()
}

/// A thread's word cache outlives the thread: the next thread (a loader's next pass) starts
/// with the words the last one encoded, and gets the same tokens from it.
#[test]
fn word_caches_pass_from_ended_threads_to_new_ones() {
    let tok = std::sync::Arc::new(small_tokenizer());
    let run = |tok: std::sync::Arc<ClipTokenizer>, text: &'static str| {
        std::thread::spawn(move || {
            let ids = tok.tokenize(text);
            let words = SCRATCH.with_borrow(|s| s.caches.get(&tok.id).map_or(0, |c| c.words.len()));
            (ids, words)
        })
        .join()
        .unwrap()
    };
    let (first, words) = run(tok.clone(), "ab x ab");
    assert_eq!(words, 2, "'ab' and 'x' are cached");
    assert_eq!(
        tok.spare.lock().unwrap().len(),
        1,
        "the ended thread handed its cache back"
    );
    let (second, words) = run(tok.clone(), "ab");
    assert_eq!(
        words, 2,
        "the next thread started with the cached words ('x' is in)"
    );
    assert_eq!(tok.spare.lock().unwrap().len(), 1);
    assert_eq!(second[..3], [first[0], first[1], tok.eot as i64]);
    assert_eq!(
        first[..5],
        [tok.sot as i64, first[1], first[2], first[1], tok.eot as i64]
    );
    drop(tok); // a cache whose tokenizer is gone is dropped with its thread, not kept
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
