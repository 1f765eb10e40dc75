//! open_clip's caption cleaning, reproduced: `clean` is its `whitespace_clean(basic_clean(text))`
//! lowercased, with `ftfy_lite` for `ftfy.fix_text` and `html_unescape` for `html.unescape`
//! (what each reproduces and what it does not: `clip`'s module doc).

use unicode_normalization::UnicodeNormalization;

/// `clean(text)` into `out`, reusing its memory. An ASCII caption with no `&` (most of them)
/// is cleaned in one pass: ftfy_lite only drops its control characters there, `html.unescape`
/// has nothing to do, and whitespace runs become one space, lowercased.
pub(super) fn clean_into(text: &str, out: &mut String) {
    out.clear();
    if !text.is_ascii() || text.contains('&') {
        out.push_str(&clean(text));
        return;
    }
    let mut pending_space = false;
    for &c in text.as_bytes() {
        match c {
            // ftfy_lite's removed control characters (before whitespace: \x0b and \x1c-\x1f go).
            0x00..=0x08 | 0x0B | 0x0E..=0x1F | 0x7F => {}
            b'\t' | b'\n' | 0x0C | b'\r' | b' ' => pending_space = !out.is_empty(),
            _ => {
                if pending_space {
                    out.push(' ');
                    pending_space = false;
                }
                out.push(c.to_ascii_lowercase() as char);
            }
        }
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
