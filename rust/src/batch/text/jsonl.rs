//! JSONL text files (FineWeb, DCLM, The Stack v2, C4, Dolma): one JSON object per line, the
//! document in a named string field, plain or compressed (`.gz`, `.zst`). A file is one unit: its
//! lines in order are its documents (a compressed stream cannot be entered mid-way anyway).
//!
//! Memory is bounded by `max_document_bytes`, never by the file or a line: a line is gathered
//! only while it fits the cap; a longer one is read on to its newline without being held and
//! counted as `member_too_large`. The cap applies to the line (the whole JSON object), which
//! bounds its text: JSON escapes never decode to more bytes than they take.
//!
//! Per line (the key of a skip is `line N`, counted from 1): a line over the cap is
//! `member_too_large`; a blank line inside the file (only whitespace) is `missing_text` (counted,
//! not silently dropped; the newline that ends the last line makes no line); invalid UTF-8 is
//! `bad_utf8`; a line that is not one JSON object (malformed, or an array or scalar, or with
//! anything after the object) is `bad_json`; the field absent or null is `missing_text`; the
//! field not a string is `wrong_type`. A compressed stream that is truncated or does not decode
//! fails the unit as `corrupt_stream`, naming the file and the last whole line.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::{Fault, Reason, SourceKind};
use crate::read::source::{self, Expected, SourceError, SourceOptions, SourceStats};

/// Bytes read from the source (and from the decompressor) at a time.
const BUFFER: usize = 256 * 1024;

/// File name endings (lower case) read as JSONL, with their compression.
const JSONL_SUFFIXES: [(&str, Compression); 8] = [
    (".jsonl", Compression::None),
    (".jsonl.gz", Compression::Gzip),
    (".jsonl.zst", Compression::Zstd),
    (".ndjson", Compression::None),
    (".ndjson.gz", Compression::Gzip),
    (".ndjson.zst", Compression::Zstd),
    // C4 and Dolma name their JSONL files .json.gz; a plain .json may be one JSON document,
    // so it is not taken for JSONL.
    (".json.gz", Compression::Gzip),
    (".json.zst", Compression::Zstd),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    fn name(self) -> &'static str {
        match self {
            Compression::None => "plain",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }
}

fn url_path(url: &str) -> String {
    url.split(['?', '#'])
        .next()
        .unwrap_or(url)
        .to_ascii_lowercase()
}

/// Whether a URL names a JSONL file (by its path, case-insensitively): `.jsonl`, `.ndjson`,
/// either with `.gz` or `.zst`, and `.json.gz` / `.json.zst`.
pub fn is_jsonl_name(url: &str) -> bool {
    compression_by_name(url).is_some()
}

fn compression_by_name(url: &str) -> Option<Compression> {
    let path = url_path(url);
    JSONL_SUFFIXES
        .iter()
        .filter(|(suffix, _)| path.ends_with(suffix))
        .max_by_key(|(suffix, _)| suffix.len())
        .map(|&(_, c)| c)
}

/// One line as read: its bytes (without the newline), or only its length when over the cap.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    Text(&'a [u8]),
    TooLong(u64),
}

/// Lines of a byte stream, each held only up to `cap` bytes.
pub(crate) struct CappedLines<R> {
    reader: R,
    cap: u64,
    line: Vec<u8>,
    /// The number of the last line returned (from 1).
    number: u64,
}

impl<R: BufRead> CappedLines<R> {
    pub(crate) fn new(reader: R, cap: u64) -> Self {
        Self {
            reader,
            cap,
            line: Vec::new(),
            number: 0,
        }
    }

    /// The number of the last line returned (0 before the first).
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// The bytes the line buffer holds room for: at most about twice the cap, whatever the
    /// lines' lengths (Vec growth doubles).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.line.capacity()
    }

    /// The next line and its number; None at the end. The newline that ends the stream's last
    /// line makes no further line.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<(u64, Line<'_>)>> {
        self.line.clear();
        let mut length: u64 = 0;
        let mut any = false;
        loop {
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                if !any {
                    return Ok(None);
                }
                break;
            }
            any = true;
            let newline = buf.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(buf.len());
            if length + take as u64 <= self.cap {
                self.line.extend_from_slice(&buf[..take]);
            } else if !self.line.is_empty() {
                // Over the cap: what was gathered is dropped, and nothing more is kept.
                self.line.clear();
            }
            length += take as u64;
            self.reader.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                break;
            }
        }
        self.number += 1;
        if length > self.cap {
            return Ok(Some((self.number, Line::TooLong(length))));
        }
        Ok(Some((self.number, Line::Text(&self.line))))
    }
}

/// Marks whether an error came from the source (a fetch that failed) rather than from the
/// decompressor above it, which passes the source's errors through unchanged.
struct Watched<R> {
    inner: R,
    failed: Arc<AtomicBool>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.kind() != io::ErrorKind::Interrupted {
                self.failed.store(true, Ordering::Relaxed);
            }
        })
    }
}

/// The documents of one JSONL file, in line order.
pub struct JsonlDocuments {
    lines: CappedLines<Box<dyn BufRead + Send>>,
    field: String,
    compression: Compression,
    source_failed: Arc<AtomicBool>,
    display: String,
}

impl JsonlDocuments {
    /// Opens `url` (its compression by name, or by magic bytes when the name says plain) for
    /// the documents in `field`; `display` names it in faults.
    pub fn open(
        url: &str,
        field: &str,
        max_line_bytes: u64,
        expected: &Expected,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
        display: &str,
    ) -> Result<Self, Fault> {
        let unreadable = |e: SourceError| Fault {
            reason: Reason::Unreadable,
            url: display.to_string(),
            key: String::new(),
            detail: e.to_string(),
            kind: e.kind(),
        };
        let failed = Arc::new(AtomicBool::new(false));
        let stream = source::open_expecting(url, 0, expected, opts, stats).map_err(unreadable)?;
        let mut raw = BufReader::with_capacity(
            BUFFER,
            Watched {
                inner: stream,
                failed: failed.clone(),
            },
        );
        let mut compression = compression_by_name(url).unwrap_or(Compression::None);
        if compression == Compression::None {
            let head = raw.fill_buf().map_err(|e| Fault {
                reason: Reason::Unreadable,
                url: display.to_string(),
                key: String::new(),
                detail: e.to_string(),
                kind: SourceError::kind_of_io(&e),
            })?;
            if head.starts_with(&[0x1f, 0x8b]) {
                compression = Compression::Gzip;
            } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                compression = Compression::Zstd;
            }
        }
        let reader: Box<dyn BufRead + Send> = match compression {
            Compression::None => Box::new(raw),
            Compression::Gzip => {
                Box::new(BufReader::with_capacity(BUFFER, MultiGzDecoder::new(raw)))
            }
            Compression::Zstd => {
                // The decoder's default window limit (128 MiB) stays: a file must not choose how
                // much memory its reader takes. A `zstd --long=31` file fails as corrupt_stream
                // ("Frame requires too much memory"); recompress it without --long.
                let decoder = zstd::stream::read::Decoder::with_buffer(raw).map_err(|e| Fault {
                    reason: Reason::Internal,
                    url: display.to_string(),
                    key: String::new(),
                    detail: format!("cannot start a zstd decoder: {e}"),
                    kind: SourceKind::Other,
                })?;
                Box::new(BufReader::with_capacity(BUFFER, decoder))
            }
        };
        Ok(Self {
            lines: CappedLines::new(reader, max_line_bytes),
            field: field.to_string(),
            compression,
            source_failed: failed,
            display: display.to_string(),
        })
    }

    /// The next document (or why its line is skipped), or the fault that ends the file.
    pub fn next_document(&mut self) -> Option<Result<Result<String, Fault>, Fault>> {
        let cap = self.lines.cap;
        let line = match self.lines.next_line() {
            Ok(None) => return None,
            Ok(Some(line)) => line,
            Err(e) => return Some(Err(self.read_fault(e))),
        };
        let (number, line) = line;
        let skip = |reason: Reason, detail: String| Fault {
            reason,
            url: self.display.clone(),
            key: format!("line {number}"),
            detail,
            kind: SourceKind::Other,
        };
        Some(Ok(match line {
            Line::TooLong(length) => Err(skip(
                Reason::MemberTooLarge,
                format!("a line of {length} bytes, over max_document_bytes ({cap})"),
            )),
            Line::Text(bytes) => {
                let bytes = match number {
                    1 => bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes),
                    _ => bytes,
                };
                line_text(bytes, &self.field).map_err(|(reason, detail)| skip(reason, detail))
            }
        }))
    }

    /// The fault of a read that failed after `lines.number()` whole lines.
    fn read_fault(&self, e: io::Error) -> Fault {
        let after = self.lines.number();
        if self.source_failed.load(Ordering::Relaxed) || self.compression == Compression::None {
            return Fault {
                reason: Reason::Unreadable,
                url: self.display.clone(),
                key: String::new(),
                detail: format!("{e} (after line {after})"),
                kind: SourceError::kind_of_io(&e),
            };
        }
        Fault {
            reason: Reason::CorruptStream,
            url: self.display.clone(),
            key: String::new(),
            detail: format!(
                "the {} stream is truncated or corrupt after line {after}: {e}",
                self.compression.name()
            ),
            kind: SourceKind::Other,
        }
    }
}

/// The document of one line: the string in `field` of the line's JSON object.
fn line_text(bytes: &[u8], field: &str) -> Result<String, (Reason, String)> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err((Reason::MissingText, "a blank line".into()));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| (Reason::BadUtf8, format!("the line is not valid UTF-8: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let found = FindField(field)
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| (Reason::BadJson, format!("not a JSON object: {e}")))?;
    match found {
        Err(what) => Err((
            Reason::BadJson,
            format!("the line is {what}, not a JSON object"),
        )),
        Ok(Field::Text(s)) => Ok(s),
        Ok(Field::Absent) => Err((Reason::MissingText, format!("no field {field:?}"))),
        Ok(Field::Null) => Err((Reason::MissingText, format!("the field {field:?} is null"))),
        Ok(Field::Other(what)) => Err((
            Reason::WrongType,
            format!("the field {field:?} is {what}, not a string"),
        )),
    }
}

/// What the object holds under the field (the last one, when a key repeats, as Python's `json`).
enum Field {
    Text(String),
    Null,
    Absent,
    Other(&'static str),
}

/// Finds one field of a JSON object, skipping the others without building them (FineWeb lines
/// carry a dozen metadata fields beside the text). Err: the value is not an object (what it is).
struct FindField<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for FindField<'_> {
    type Value = Result<Field, &'static str>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FindField<'_> {
    type Value = Result<Field, &'static str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Field::Absent;
        while let Some(wanted) = map.next_key_seed(KeyIs(self.0))? {
            if wanted {
                found = map.next_value_seed(FieldValue)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Ok(found))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err("an array"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err("a string"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err("a number"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err("null"))
    }
}

/// Whether a key is the wanted one (compared as decoded, so escaped keys match too).
struct KeyIs<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// The wanted field's value, classified.
struct FieldValue;

impl<'de> DeserializeSeed<'de> for FieldValue {
    type Value = Field;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldValue {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
        Ok(Field::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Field, E> {
        Ok(Field::Text(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Field, E> {
        Ok(Field::Null)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Field, E> {
        Ok(Field::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Field, E> {
        Ok(Field::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Field, E> {
        Ok(Field::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Field, E> {
        Ok(Field::Other("a number"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other("an object"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(data: &[u8], cap: u64) -> Vec<(u64, Option<Vec<u8>>, u64)> {
        let mut r = CappedLines::new(BufReader::with_capacity(7, data), cap);
        let mut out = Vec::new();
        while let Some((n, line)) = r.next_line().unwrap() {
            out.push(match line {
                Line::Text(b) => (n, Some(b.to_vec()), b.len() as u64),
                Line::TooLong(len) => (n, None, len),
            });
        }
        out
    }

    #[test]
    fn lines_are_split_at_newlines_across_buffer_ends_and_long_ones_are_only_measured() {
        let data = b"{\"text\": \"a\"}\n\nshort\n0123456789abcdefghij\nlast";
        let got = lines(data, 10);
        assert_eq!(got.len(), 5);
        assert_eq!(got[0], (1, None, 13));
        assert_eq!(got[1], (2, Some(vec![]), 0));
        assert_eq!(got[2], (3, Some(b"short".to_vec()), 5));
        assert_eq!(got[3], (4, None, 20));
        assert_eq!(got[4], (5, Some(b"last".to_vec()), 4));
        // The newline that ends the last line makes no empty line after it.
        assert_eq!(lines(b"a\nb\n", 10).len(), 2);
        assert!(lines(b"", 10).is_empty());
    }

    /// A line of `len` bytes made as it is read, never whole in memory.
    struct Generated {
        left: u64,
        then: &'static [u8],
    }

    impl Read for Generated {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.left > 0 {
                let n = (buf.len() as u64).min(self.left) as usize;
                buf[..n].fill(b'x');
                self.left -= n as u64;
                return Ok(n);
            }
            let n = buf.len().min(self.then.len());
            buf[..n].copy_from_slice(&self.then[..n]);
            self.then = &self.then[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_line_far_over_the_cap_is_skipped_without_being_held() {
        let cap = 64 << 10;
        let source = Generated {
            left: 300 << 20,
            then: b"\n{\"text\": \"after\"}\n",
        };
        let mut r = CappedLines::new(BufReader::with_capacity(BUFFER, source), cap);
        let (n, line) = r.next_line().unwrap().unwrap();
        assert_eq!((n, line), (1, Line::TooLong(300 << 20)));
        let (n, line) = r.next_line().unwrap().unwrap();
        assert_eq!((n, line), (2, Line::Text(&b"{\"text\": \"after\"}"[..])));
        assert!(r.held() <= 2 * cap as usize, "held {} bytes", r.held());
    }

    #[test]
    fn each_kind_of_bad_line_has_its_reason() {
        let reason = |line: &[u8]| line_text(line, "text").unwrap_err().0;
        assert_eq!(
            line_text(br#"{"id": 1, "meta": {"text": 5}, "text": "caf\u00e9 \ud83d\ude00", "x": [1, {"a": null}]}"#, "text"),
            Ok("caf\u{e9} \u{1f600}".to_string())
        );
        assert_eq!(
            line_text(b"{\"te\\u0078t\": \"escaped key\"}\r", "text"),
            Ok("escaped key".into())
        );
        assert_eq!(reason(b"   \t"), Reason::MissingText);
        assert_eq!(reason(b"{\"text\": \"\xff\"}"), Reason::BadUtf8);
        assert_eq!(reason(b"{\"text\": \"unterminated"), Reason::BadJson);
        assert_eq!(reason(b"not json at all"), Reason::BadJson);
        assert_eq!(reason(b"[\"text\"]"), Reason::BadJson);
        assert_eq!(reason(b"\"text\""), Reason::BadJson);
        assert_eq!(
            reason(b"{\"text\": \"a\"} {\"text\": \"b\"}"),
            Reason::BadJson
        );
        assert_eq!(reason(b"{\"body\": \"a\"}"), Reason::MissingText);
        assert_eq!(reason(b"{\"text\": null}"), Reason::MissingText);
        assert_eq!(reason(b"{\"text\": 3}"), Reason::WrongType);
        assert_eq!(reason(b"{\"text\": [\"a\"]}"), Reason::WrongType);
        assert_eq!(reason(b"{\"text\": {\"a\": 1}}"), Reason::WrongType);
        // Skipped values are walked without recursion: deep nesting beside the text is no risk.
        let deep = format!(
            "{{\"x\": {}{}, \"text\": \"a\"}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(line_text(deep.as_bytes(), "text"), Ok("a".into()));
        assert_eq!(
            reason(format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).as_bytes()),
            Reason::BadJson
        );
    }

    #[test]
    fn jsonl_names_and_their_compression() {
        let c = compression_by_name;
        assert_eq!(c("s3://b/k/part-0.jsonl"), Some(Compression::None));
        assert_eq!(c("/d/part-0.JSONL.GZ"), Some(Compression::Gzip));
        assert_eq!(c("https://h/x.jsonl.zst?sig=1"), Some(Compression::Zstd));
        assert_eq!(
            c("/c4/c4-train.00000-of-01024.json.gz"),
            Some(Compression::Gzip)
        );
        assert_eq!(c("/d/x.ndjson"), Some(Compression::None));
        assert_eq!(c("/d/x.json"), None);
        assert_eq!(c("/d/x.tar.gz"), None);
        assert_eq!(c("/d/x.parquet"), None);
    }

    fn read_all(path: &std::path::Path) -> (Vec<Result<String, Reason>>, Option<Fault>) {
        let stats = Arc::new(SourceStats::default());
        let url = path.to_str().unwrap();
        let opts = SourceOptions::default();
        let mut docs = JsonlDocuments::open(
            url,
            "text",
            1 << 20,
            &Expected::default(),
            &opts,
            &stats,
            url,
        )
        .unwrap();
        let mut out = Vec::new();
        while let Some(next) = docs.next_document() {
            match next {
                Ok(doc) => out.push(doc.map_err(|f| f.reason)),
                Err(fault) => return (out, Some(fault)),
            }
        }
        (out, None)
    }

    #[test]
    fn gzip_and_zstd_files_read_as_the_plain_one_and_a_truncated_stream_fails_the_file() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("ss-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut plain = Vec::new();
        for i in 0..2000 {
            writeln!(plain, "{{\"id\": {i}, \"text\": \"document {i} \\u00e9\"}}").unwrap();
        }
        plain.extend_from_slice(b"{\"id\": 1}\n");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::stream::encode_all(&plain[..], 3).unwrap();
        let files = [
            ("a.jsonl", plain.clone()),
            ("a.jsonl.gz", gz.clone()),
            ("a.jsonl.zst", zst.clone()),
            ("gzip-named-plain.jsonl", gz.clone()),
        ];
        let want: Vec<Result<String, Reason>> = (0..2000)
            .map(|i| Ok(format!("document {i} \u{e9}")))
            .chain([Err(Reason::MissingText)])
            .collect();
        for (name, bytes) in files {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(read_all(&path), (want.clone(), None), "{name}");
        }
        for (name, bytes) in [("cut.jsonl.gz", &gz), ("cut.jsonl.zst", &zst)] {
            let path = dir.join(name);
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
            let (docs, fault) = read_all(&path);
            let fault = fault.expect("a truncated stream fails the file");
            assert_eq!(fault.reason, Reason::CorruptStream, "{name}: {fault}");
            assert!(fault.url.ends_with(name) && fault.key.is_empty(), "{fault}");
            assert!(
                docs.len() < 2000 && docs.iter().all(Result::is_ok),
                "{name}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A decompression bomb (issue 52): one line of 64 MiB of real text in a gzip or zstd file
    /// over 30 times smaller is skipped as `member_too_large` while it streams past, never held
    /// (the line buffer stays within twice the cap), and the line after it is read.
    #[test]
    fn a_compressed_bomb_of_one_long_line_is_skipped_without_being_held() {
        use std::io::Write;
        let dir = crate::fixtures::scratch_dir("jsonl-bomb");
        let text = crate::check::fuzzing::reader_seeds::real_captions(40).join(" ");
        let cap = 64 << 10;
        let long = 64 << 20;
        let write_line = |out: &mut dyn Write| {
            out.write_all(b"{\"text\": \"").unwrap();
            let mut left = long;
            while left > 0 {
                let n = left.min(text.len());
                out.write_all(&text.as_bytes()[..n]).unwrap();
                left -= n;
            }
            out.write_all(b"\"}\n{\"text\": \"after\"}\n").unwrap();
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        write_line(&mut gz);
        let mut zst = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        write_line(&mut zst);
        for (name, bytes) in [
            ("bomb.jsonl.gz", gz.finish().unwrap()),
            ("bomb.jsonl.zst", zst.finish().unwrap()),
        ] {
            assert!(bytes.len() * 30 < long, "{name}: {} bytes", bytes.len());
            let path = dir.join(name);
            std::fs::write(&path, &bytes).unwrap();
            let url = path.to_str().unwrap();
            let stats = Arc::new(SourceStats::default());
            let opts = SourceOptions::default();
            let mut docs =
                JsonlDocuments::open(url, "text", cap, &Expected::default(), &opts, &stats, url)
                    .unwrap();
            let skip = docs.next_document().unwrap().unwrap().unwrap_err();
            assert_eq!(
                (skip.reason, skip.key.as_str()),
                (Reason::MemberTooLarge, "line 1"),
                "{name}: {skip}"
            );
            assert!(
                skip.detail.contains("over max_document_bytes"),
                "{}",
                skip.detail
            );
            let after = docs.next_document().unwrap().unwrap().unwrap();
            assert_eq!(after, "after", "{name}");
            assert!(docs.next_document().is_none(), "{name}");
            assert!(
                docs.lines.held() <= 2 * cap as usize,
                "{name}: held {} bytes",
                docs.lines.held()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
