//! The split patterns of byte-level BPE tokenizers, as hand-written scanners that give the same
//! pieces as Oniguruma running the pattern (leftmost alternative first, greedy quantifiers with
//! backtracking), with no regex engine on the hot path.
//!
//! Every character is matched by some alternative of these patterns (it is a letter, a number,
//! whitespace or none of those), so the pieces tile the text: each match starts where the last
//! one ended.

use super::classes::{ascii_class, class, Class};

/// GPT-2's pattern (the ByteLevel pre-tokenizer's own, `use_regex: true`).
pub const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's (GPT-4's cl100k) pattern, in a Split pre-tokenizer.
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
pub const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which pattern splits the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// [`GPT2`].
    Gpt2,
    /// [`LLAMA3`] (`max_digits` 3) or [`QWEN2`] (1).
    Llama3 { max_digits: usize },
}

impl Pattern {
    /// The pattern a split regex's source text is, if it is one of ours.
    pub fn from_regex(source: &str) -> Option<Self> {
        match source {
            GPT2 => Some(Self::Gpt2),
            LLAMA3 => Some(Self::Llama3 { max_digits: 3 }),
            QWEN2 => Some(Self::Llama3 { max_digits: 1 }),
            _ => None,
        }
    }
}

/// The class, the character and its length in bytes at byte `i` of valid UTF-8.
#[inline(always)]
fn at(s: &[u8], i: usize) -> (Class, char, usize) {
    let b = s[i];
    if b < 0x80 {
        return (ascii_class(b), b as char, 1);
    }
    let (cp, len) = if b < 0xE0 {
        (((b as u32 & 0x1F) << 6) | (s[i + 1] as u32 & 0x3F), 2)
    } else if b < 0xF0 {
        (
            ((b as u32 & 0x0F) << 12) | ((s[i + 1] as u32 & 0x3F) << 6) | (s[i + 2] as u32 & 0x3F),
            3,
        )
    } else {
        (
            ((b as u32 & 0x07) << 18)
                | ((s[i + 1] as u32 & 0x3F) << 12)
                | ((s[i + 2] as u32 & 0x3F) << 6)
                | (s[i + 3] as u32 & 0x3F),
            4,
        )
    };
    // Valid UTF-8 (the input is a &str) decodes to a scalar value.
    let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
    (class(c), c, len)
}

/// The class at byte `i`, or None at the end.
#[inline(always)]
fn class_at(s: &[u8], i: usize) -> Option<Class> {
    (i < s.len()).then(|| at(s, i).0)
}

/// The end of the run of `want` characters starting at `i`.
#[inline(always)]
fn run(s: &[u8], mut i: usize, want: Class) -> usize {
    while i < s.len() {
        let b = s[i];
        if b < 0x80 {
            if ascii_class(b) != want {
                break;
            }
            i += 1;
        } else {
            let (c, _, len) = at(s, i);
            if c != want {
                break;
            }
            i += len;
        }
    }
    i
}

/// The length of a contraction (`s`, `t`, `re`, `ve`, `m`, `ll`, `d`) right after an
/// apostrophe at `i`, or 0. `fold`: as `(?i:…)` matches it, where the long s `ſ` folds to `s`.
fn contraction(s: &[u8], i: usize, fold: bool) -> usize {
    let lower = |j: usize| -> Option<u8> {
        let b = *s.get(j)?;
        Some(if fold { b.to_ascii_lowercase() } else { b })
    };
    match lower(i) {
        Some(b's' | b't' | b'm' | b'd') => 1,
        Some(b'r' | b'v') if lower(i + 1) == Some(b'e') => 2,
        Some(b'l') if lower(i + 1) == Some(b'l') => 2,
        // U+017F LATIN SMALL LETTER LONG S, whose case fold is `s`.
        Some(0xC5) if fold && s.get(i + 1) == Some(&0xBF) => 2,
        _ => 0,
    }
}

/// Whitespace from `i`: (end of the run, start of its last character, end of its last `\r`
/// or `\n` + 1 or 0 when none, number of characters).
#[inline(always)]
fn space_run(s: &[u8], mut i: usize) -> (usize, usize, usize, usize) {
    let (mut last, mut crlf, mut n) = (i, 0, 0);
    while i < s.len() {
        let (c, ch, len) = at(s, i);
        if c != Class::Space {
            break;
        }
        if ch == '\r' || ch == '\n' {
            crlf = i + 1;
        }
        last = i;
        n += 1;
        i += len;
    }
    (i, last, crlf, n)
}

/// `\s+(?!\S)|\s+` from `i` (whitespace there): the run but its last character when a
/// non-space follows and the run has two or more; the whole run otherwise.
#[inline(always)]
fn trailing_space(s: &[u8], end: usize, last: usize, n: usize) -> usize {
    if end == s.len() || n < 2 {
        end
    } else {
        last
    }
}

/// The end of the piece that starts at byte `i` (< len) of `s`.
#[inline]
pub fn next_piece(s: &[u8], i: usize, pattern: Pattern) -> usize {
    match pattern {
        Pattern::Gpt2 => gpt2(s, i),
        Pattern::Llama3 { max_digits } => llama3(s, i, max_digits),
    }
}

fn gpt2(s: &[u8], i: usize) -> usize {
    let (c0, ch0, l0) = at(s, i);
    if ch0 == '\'' {
        let n = contraction(s, i + 1, false);
        if n > 0 {
            return i + 1 + n;
        }
    }
    if ch0 == ' ' {
        match class_at(s, i + 1) {
            Some(Class::Space) | None => {}
            Some(c1) => return run(s, i + 1, c1),
        }
    }
    match c0 {
        Class::Space => {
            let (end, last, _, n) = space_run(s, i);
            trailing_space(s, end, last, n)
        }
        c => run(s, i + l0, c),
    }
}

fn llama3(s: &[u8], i: usize, max_digits: usize) -> usize {
    let (c0, ch0, l0) = at(s, i);
    if ch0 == '\'' {
        let n = contraction(s, i + 1, true);
        if n > 0 {
            return i + 1 + n;
        }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if c0 == Class::Letter {
        return run(s, i + l0, Class::Letter);
    }
    if ch0 != '\r'
        && ch0 != '\n'
        && c0 != Class::Number
        && class_at(s, i + l0) == Some(Class::Letter)
    {
        return run(s, i + l0, Class::Letter);
    }
    // \p{N}{1,max}
    if c0 == Class::Number {
        let mut j = i + l0;
        for _ in 1..max_digits {
            match (j < s.len()).then(|| at(s, j)) {
                Some((Class::Number, _, len)) => j += len,
                _ => break,
            }
        }
        return j;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let other_from = if c0 == Class::Other {
        Some(i + l0)
    } else if ch0 == ' ' && class_at(s, i + 1) == Some(Class::Other) {
        Some(i + 1)
    } else {
        None
    };
    if let Some(from) = other_from {
        let mut j = run(s, from, Class::Other);
        while j < s.len() && (s[j] == b'\r' || s[j] == b'\n') {
            j += 1;
        }
        return j;
    }
    // Whitespace: `\s*[\r\n]+` (up to the run's last line break), else `\s+(?!\S)|\s+`.
    let (end, last, crlf, n) = space_run(s, i);
    if crlf > 0 {
        return crlf;
    }
    trailing_space(s, end, last, n)
}

/// The pieces of `text` under `pattern`, as byte ranges.
pub fn pieces(text: &str, pattern: Pattern) -> impl Iterator<Item = (usize, usize)> + '_ {
    let s = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= s.len() {
            return None;
        }
        let end = next_piece(s, i, pattern);
        debug_assert!(end > i && text.is_char_boundary(end));
        let piece = (i, end);
        i = end;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces Oniguruma gives for `pattern` (the tokenizers library's engine).
    fn oniguruma(text: &str, source: &str) -> Vec<(usize, usize)> {
        let re = onig::Regex::new(source).unwrap();
        re.find_iter(text).collect()
    }

    fn check(text: &str) {
        for (source, pattern) in [
            (GPT2, Pattern::Gpt2),
            (LLAMA3, Pattern::Llama3 { max_digits: 3 }),
            (QWEN2, Pattern::Llama3 { max_digits: 1 }),
        ] {
            let ours: Vec<_> = pieces(text, pattern).collect();
            assert_eq!(ours, oniguruma(text, source), "{pattern:?} on {text:?}");
        }
    }

    #[test]
    fn scanners_split_as_oniguruma_does() {
        for text in [
            "",
            "Hello world",
            "  leading and trailing  ",
            "I'm, you're, he'll, we'd, it's, they've, I'M, YOU'RE, He'Ll, 'ſ, 'ſx, 'K",
            "tabs\tand\t\tmore \t x\r\n\r\nCRLF\n\n\n  \n  y",
            "digits 1 12 123 1234 12345 ١٢٣٤ 3.14159 ½¼",
            "emoji 🎉🎉 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, CJK 漢字かな, اَلْعَرَبِيَّةُ, ẞ ſ K",
            "punct!!! (x) [y] {z} --> <=> ... '' \"q\" \u{a0}nbsp\u{3000}ideo\u{2028}ls",
            "(word x?y !z 'abc ''s  's\u{85}next\u{b}vt\u{c}ff",
            "a\r\n",
            " \n",
            "\n \n ",
            "x  \u{2003}\u{2003}y",
        ] {
            check(text);
        }
    }

    #[test]
    fn scanners_split_random_text_as_oniguruma_does() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..5000 {
            check(&super::super::tests::random_text(&mut state, 40));
        }
    }
}
