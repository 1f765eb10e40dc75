//! Streaming tar reader: ustar, PAX extended headers, GNU long names, from any `Read`,
//! without seeking.
//!
//! It is deliberately tolerant where tar files in the wild are sloppy (missing end-of-archive
//! blocks, garbage after the end) and strict where data could be lost silently (a stream that
//! ends inside a header or a member is reported as truncated).

use std::io::{self, Read};

const BLOCK: usize = 512;

/// One regular-file member.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub data: Vec<u8>,
    /// Offset of the first header block of this entry (including PAX / GNU long-name headers)
    /// in the uncompressed stream: the place to start reading to get this member again.
    pub offset: u64,
}

/// A member that is too large is reported by name and skipped without being buffered.
#[derive(Debug)]
pub enum Entry {
    File(Member),
    Oversized {
        name: String,
        size: u64,
        offset: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum TarError {
    #[error("truncated tar: stream ended inside {what} at byte {offset}")]
    Truncated {
        offset: u64,
        what: String,
        /// The member whose header was read whole but whose data was cut: (name, header offset).
        member: Option<(String, u64)>,
    },
    #[error("corrupt tar header at byte {offset}: {message}")]
    Corrupt { offset: u64, message: String },
    #[error("read error at byte {offset}: {source}")]
    Io { offset: u64, source: io::Error },
}

impl TarError {
    pub fn offset(&self) -> u64 {
        match self {
            TarError::Truncated { offset, .. }
            | TarError::Corrupt { offset, .. }
            | TarError::Io { offset, .. } => *offset,
        }
    }

    /// The member cut short, when its header was complete: (name, offset of its header).
    pub fn cut_member(&self) -> Option<(&str, u64)> {
        match self {
            TarError::Truncated {
                member: Some((name, offset)),
                ..
            } => Some((name.as_str(), *offset)),
            _ => None,
        }
    }

    fn in_member(self, name: &str, header_offset: u64) -> Self {
        match self {
            TarError::Truncated { offset, what, .. } => TarError::Truncated {
                offset,
                what,
                member: Some((name.to_string(), header_offset)),
            },
            other => other,
        }
    }
}

pub struct TarReader<R> {
    inner: R,
    /// Bytes consumed from the stream, counted from `base_offset`.
    pos: u64,
    max_member_bytes: u64,
    finished: bool,
    members_seen: u64,
    /// Set when the archive ended on garbage instead of end blocks (tolerated, but worth a note).
    pub trailing_garbage: bool,
}

impl<R: Read> TarReader<R> {
    /// `base_offset` is the position of `inner` in the whole tar stream (non-zero when a shard is
    /// opened in the middle, at a sample offset taken from the index).
    pub fn new(inner: R, base_offset: u64, max_member_bytes: u64) -> Self {
        Self {
            inner,
            pos: base_offset,
            max_member_bytes,
            finished: false,
            members_seen: 0,
            trailing_garbage: false,
        }
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Reads as many bytes as possible into `buf`; returns how many (short only at EOF).
    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize, TarError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.inner.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(TarError::Io {
                        offset: self.pos + filled as u64,
                        source: e,
                    })
                }
            }
        }
        self.pos += filled as u64;
        Ok(filled)
    }

    fn read_exact_or_truncated(&mut self, buf: &mut [u8], what: &str) -> Result<(), TarError> {
        let start = self.pos;
        let n = self.read_full(buf)?;
        if n < buf.len() {
            return Err(TarError::Truncated {
                offset: start + n as u64,
                what: what.to_string(),
                member: None,
            });
        }
        Ok(())
    }

    fn skip(&mut self, mut n: u64, what: &str) -> Result<(), TarError> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let chunk = n.min(buf.len() as u64) as usize;
            self.read_exact_or_truncated(&mut buf[..chunk], what)?;
            n -= chunk as u64;
        }
        Ok(())
    }

    fn padding(size: u64) -> u64 {
        (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
    }

    /// Reads an entry's data (plus padding) into a fresh buffer. `read_to_end` fills the
    /// reserved capacity directly (no zero-filling first): members are most of the bytes read.
    fn read_data(&mut self, size: u64, what: &str) -> Result<Vec<u8>, TarError> {
        // Reserved up to a bound: what arrives beyond it grows the buffer as it is read, so a
        // header's claim alone never sizes an allocation.
        let mut data = Vec::with_capacity(size.min(MAX_RESERVE) as usize);
        let read = (&mut self.inner).take(size).read_to_end(&mut data);
        self.pos += data.len() as u64;
        if let Err(e) = read {
            return Err(TarError::Io {
                offset: self.pos,
                source: e,
            });
        }
        if (data.len() as u64) < size {
            return Err(TarError::Truncated {
                offset: self.pos,
                what: what.to_string(),
                member: None,
            });
        }
        self.skip(Self::padding(size), what)?;
        Ok(data)
    }

    /// The next regular-file entry, or `None` at the end of the archive.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, TarError> {
        if self.finished {
            return Ok(None);
        }
        let mut long_name: Option<String> = None;
        let mut pax_path: Option<String> = None;
        let mut pax_size: Option<u64> = None;
        let mut entry_offset: Option<u64> = None;
        let mut header = [0u8; BLOCK];
        loop {
            let header_offset = self.pos;
            let n = self.read_full(&mut header)?;
            if n == 0 && entry_offset.is_none() {
                // Clean end of stream without end-of-archive blocks: common, harmless.
                self.finished = true;
                return Ok(None);
            }
            if n < BLOCK {
                if entry_offset.is_none() && header[..n].iter().all(|&b| b == 0) {
                    self.finished = true;
                    return Ok(None);
                }
                return Err(TarError::Truncated {
                    offset: header_offset + n as u64,
                    what: "a header".into(),
                    member: None,
                });
            }
            if header.iter().all(|&b| b == 0) {
                if entry_offset.is_some() {
                    return Err(TarError::Corrupt {
                        offset: header_offset,
                        message: "end-of-archive block after an extended header".into(),
                    });
                }
                self.finished = true;
                return Ok(None);
            }
            if !checksum_ok(&header) {
                if self.members_seen > 0 && entry_offset.is_none() {
                    // Garbage after the last member (e.g. padding written by a buggy tool):
                    // treated as the end, as GNU tar and Python's tarfile do.
                    self.trailing_garbage = true;
                    self.finished = true;
                    return Ok(None);
                }
                return Err(TarError::Corrupt {
                    offset: header_offset,
                    message: "header checksum mismatch".into(),
                });
            }
            entry_offset.get_or_insert(header_offset);
            let typeflag = header[156];
            let size = match pax_size.take() {
                Some(s) => s,
                None => parse_numeric(&header[124..136]).ok_or_else(|| TarError::Corrupt {
                    offset: header_offset,
                    message: "bad size field".into(),
                })?,
            };
            match typeflag {
                b'x' => {
                    // A PAX header is a few records; a size claiming more must not size an
                    // allocation (fuzzing found one claiming 2^60 bytes, which aborted).
                    if size > MAX_META_BYTES {
                        return Err(TarError::Corrupt {
                            offset: header_offset,
                            message: format!("PAX header of {size} bytes, over 1 MiB"),
                        });
                    }
                    let data = self.read_data(size, "a PAX header")?;
                    parse_pax(&data, &mut pax_path, &mut pax_size);
                    continue;
                }
                b'g' => {
                    // Global PAX headers carry archive-wide defaults (mtime, charset); nothing we use.
                    self.skip(size + Self::padding(size), "a global PAX header")?;
                    continue;
                }
                b'L' => {
                    if size > MAX_META_BYTES {
                        return Err(TarError::Corrupt {
                            offset: header_offset,
                            message: "GNU long name over 1 MiB".into(),
                        });
                    }
                    let data = self.read_data(size, "a GNU long name")?;
                    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                    long_name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
                    continue;
                }
                b'K' => {
                    self.skip(size + Self::padding(size), "a GNU long link name")?;
                    continue;
                }
                _ => {}
            }
            let name = pax_path
                .take()
                .or(long_name.take())
                .unwrap_or_else(|| header_name(&header));
            let offset = entry_offset.unwrap_or(header_offset);
            let is_regular = matches!(typeflag, b'0' | 0 | b'7');
            // Links, directories and device nodes carry no data (Python's tarfile agrees).
            let has_data = !matches!(typeflag, b'1' | b'2' | b'3' | b'4' | b'5' | b'6');
            if !is_regular {
                if has_data {
                    self.skip(size + Self::padding(size), "an unsupported entry")?;
                }
                entry_offset = None;
                continue;
            }
            self.members_seen += 1;
            if size > self.max_member_bytes {
                self.skip(size + Self::padding(size), "an oversized member")
                    .map_err(|e| e.in_member(&name, offset))?;
                return Ok(Some(Entry::Oversized { name, size, offset }));
            }
            let data = self
                .read_data(size, &format!("member {name:?}"))
                .map_err(|e| e.in_member(&name, offset))?;
            return Ok(Some(Entry::File(Member { name, data, offset })));
        }
    }
}

fn checksum_ok(header: &[u8; BLOCK]) -> bool {
    let Some(stored) = parse_octal(&header[148..156]) else {
        return false;
    };
    let mut unsigned: u64 = 0;
    let mut signed: i64 = 0;
    for (i, &b) in header.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += b as u64;
        signed += (b as i8) as i64;
    }
    stored == unsigned || stored as i64 == signed
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let s: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    let mut v: u64 = 0;
    for b in s {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add((b - b'0') as u64)?;
    }
    Some(v)
}

/// Size fields are octal, or base-256 (high bit set) for members over 8 GiB.
fn parse_numeric(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        if field[0] & 0x40 != 0 {
            return None; // negative
        }
        let mut v: u64 = (field[0] & 0x3f) as u64;
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(v);
    }
    parse_octal(field)
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

fn header_name(header: &[u8; BLOCK]) -> String {
    let name = cstr(&header[0..100]);
    // POSIX ustar splits long paths into prefix + name; GNU tar uses that area for other fields.
    let is_posix_ustar = &header[257..263] == b"ustar\0";
    let prefix = if is_posix_ustar {
        cstr(&header[345..500])
    } else {
        &[]
    };
    if prefix.is_empty() {
        String::from_utf8_lossy(name).into_owned()
    } else {
        format!(
            "{}/{}",
            String::from_utf8_lossy(prefix),
            String::from_utf8_lossy(name)
        )
    }
}

/// PAX records: "LEN key=value\n"; we use `path` and `size`.
fn parse_pax(data: &[u8], path: &mut Option<String>, size: &mut Option<u64>) {
    let mut rest = data;
    while !rest.is_empty() {
        let Some(space) = rest.iter().position(|&b| b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            break;
        };
        if len <= space || len > rest.len() {
            break;
        }
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            match key {
                b"path" => *path = Some(String::from_utf8_lossy(value).into_owned()),
                b"size" => *size = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()),
                _ => {}
            }
        }
        rest = &rest[len..];
    }
}

/// Most bytes of a PAX header or GNU long name accepted (real ones are a few hundred).
const MAX_META_BYTES: u64 = 1 << 20;
/// Most bytes reserved ahead of reading an entry's data.
const MAX_RESERVE: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (fuzzing, 3 M cases of the tar target): a PAX header whose base-256 size field
    /// claims 2^60 - 1 bytes made the reader reserve that much and abort the process.
    #[test]
    fn a_pax_header_claiming_an_absurd_size_is_corrupt_not_an_abort() {
        let mut h = header("././@PaxHeader", 0, b'x', true);
        h[124] = 0x80; // base-256 size: 2^60 - 1
        h[125..128].fill(0);
        h[128..136].copy_from_slice(&((1u64 << 60) - 1).to_be_bytes());
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        let mut bytes = h.to_vec();
        bytes.extend_from_slice(&[0u8; 1024]);
        match names(&bytes) {
            Err(TarError::Corrupt { message, .. }) => {
                assert!(message.contains("PAX header"), "{message}")
            }
            other => panic!("expected a corrupt PAX header, got {other:?}"),
        }
    }

    fn header(name: &str, size: u64, typeflag: u8, ustar: bool) -> [u8; BLOCK] {
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = typeflag;
        if ustar {
            h[257..263].copy_from_slice(b"ustar\0");
            h[263..265].copy_from_slice(b"00");
        }
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    fn entry(name: &str, data: &[u8], typeflag: u8) -> Vec<u8> {
        let mut v = header(name, data.len() as u64, typeflag, true).to_vec();
        v.extend_from_slice(data);
        v.resize(v.len() + (BLOCK - data.len() % BLOCK) % BLOCK, 0);
        v
    }

    fn names(bytes: &[u8]) -> Result<Vec<(String, u64)>, TarError> {
        let mut r = TarReader::new(bytes, 0, 1 << 20);
        let mut out = vec![];
        while let Some(e) = r.next_entry()? {
            match e {
                Entry::File(m) => out.push((m.name, m.offset)),
                Entry::Oversized { name, .. } => out.push((format!("OVERSIZED:{name}"), 0)),
            }
        }
        Ok(out)
    }

    #[test]
    fn reads_members_skips_dirs_and_links_and_tolerates_missing_end_blocks() {
        let mut t = entry("d/", b"", b'5');
        t.extend(entry("a.txt", b"hello", b'0'));
        t.extend(entry("link", b"", b'2'));
        t.extend(entry("a.jpg", &[1u8; 600], b'0'));
        let got = names(&t).unwrap();
        assert_eq!(
            got,
            vec![
                ("a.txt".to_string(), 512),
                ("a.jpg".to_string(), 1536 + 512)
            ]
        );
    }

    #[test]
    fn pax_path_and_gnu_long_name() {
        let long = "x/".repeat(80) + "sample.txt";
        let pax_record = format!("path={long}\n");
        let len = pax_record.len() + 4; // "NNN " prefix, three digits
        let pax = format!("{len} {pax_record}");
        let mut t = entry("PaxHeader", pax.as_bytes(), b'x');
        t.extend(entry("short", b"v", b'0'));
        t.extend(entry(
            "././@LongLink",
            format!("{long}.jpg\0").as_bytes(),
            b'L',
        ));
        t.extend(entry("trunc", b"w", b'0'));
        t.extend([0u8; 1024]);
        let got = names(&t).unwrap();
        assert_eq!(got[0].0, long);
        assert_eq!(got[0].1, 0, "offset points at the PAX header");
        assert_eq!(got[1].0, format!("{long}.jpg"));
    }

    #[test]
    fn truncated_member_is_an_error_and_trailing_garbage_is_tolerated() {
        let mut t = entry("a.txt", &[7u8; 1000], b'0');
        t.truncate(700);
        assert!(matches!(names(&t), Err(TarError::Truncated { .. })));

        let mut t = entry("a.txt", b"x", b'0');
        t.extend(vec![0xAB; 2000]);
        let mut r = TarReader::new(&t[..], 0, 1 << 20);
        assert!(matches!(r.next_entry().unwrap(), Some(Entry::File(_))));
        assert!(r.next_entry().unwrap().is_none());
        assert!(r.trailing_garbage);

        let garbage_first = vec![0xABu8; 2000];
        assert!(matches!(
            names(&garbage_first),
            Err(TarError::Corrupt { .. })
        ));
    }

    #[test]
    fn oversized_member_is_reported_and_skipped() {
        let mut t = entry("big.jpg", &[1u8; 5000], b'0');
        t.extend(entry("big.txt", b"ok", b'0'));
        let mut r = TarReader::new(&t[..], 0, 4096);
        assert!(matches!(
            r.next_entry().unwrap(),
            Some(Entry::Oversized { size: 5000, .. })
        ));
        assert!(matches!(r.next_entry().unwrap(), Some(Entry::File(m)) if m.name == "big.txt"));
    }

    #[test]
    fn base256_size() {
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[11] = 5;
        f[10] = 1;
        assert_eq!(parse_numeric(&f), Some(261));
    }
}
