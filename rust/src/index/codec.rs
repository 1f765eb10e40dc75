//! Little pieces of the binary index layout (version 2): LEB128 varints and length-prefixed
//! strings, written to a `Vec` and read back from a `Read` with bounds on every length, so a
//! corrupt or hostile file ends in an error instead of a huge allocation.

use crate::rng::mix64;
use std::io::{self, Read};

/// The running form of [`crate::rng::hash_bytes`] (FNV-1a, then `mix64`): the checksum that
/// ends every manifest and detail block, computed while writing or reading.
#[derive(Clone, Copy)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn finish(self) -> u64 {
        mix64(self.0)
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends the checksum of everything in `out` so far.
/// Sorted, distinct ordinals: their count, the first, then the gap to each next one.
pub fn put_ordinals(out: &mut Vec<u8>, ordinals: &[u64]) {
    put_varint(out, ordinals.len() as u64);
    let mut prev = 0;
    for (i, &o) in ordinals.iter().enumerate() {
        put_varint(out, if i == 0 { o } else { o - prev });
        prev = o;
    }
}

pub fn put_checksum(out: &mut Vec<u8>) {
    let mut c = Checksum::default();
    c.update(out);
    out.extend_from_slice(&c.finish().to_le_bytes());
}

/// Reads varints and strings from a stream, checksumming the bytes it consumed.
pub struct Decoder<R> {
    inner: R,
    pub consumed: u64,
    pub checksum: Checksum,
}

fn corrupt(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl<R: Read> Decoder<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            consumed: 0,
            checksum: Checksum::default(),
        }
    }

    pub fn byte(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.inner.read_exact(&mut b)?;
        self.consumed += 1;
        self.checksum.update(&b);
        Ok(b[0])
    }

    pub fn bytes(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        self.inner.read_exact(&mut out)?;
        self.consumed += n as u64;
        self.checksum.update(&out);
        Ok(out)
    }

    pub fn varint(&mut self) -> io::Result<u64> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = (b & 0x7f) as u64;
            if shift == 63 && part > 1 {
                return Err(corrupt("varint overflows 64 bits"));
            }
            value |= part << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(corrupt("varint longer than 10 bytes"))
    }

    /// A varint that must not exceed `max` (a count or a length about to be allocated).
    pub fn bounded(&mut self, max: u64, what: &str) -> io::Result<u64> {
        let v = self.varint()?;
        if v > max {
            return Err(corrupt(format!("{what} {v} exceeds {max}")));
        }
        Ok(v)
    }

    pub fn string(&mut self, max_len: u64, what: &str) -> io::Result<String> {
        let n = self.bounded(max_len, what)? as usize;
        String::from_utf8(self.bytes(n)?).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }

    /// What [`put_ordinals`] wrote: at most `max_count` ordinals, increasing, each below `limit`.
    pub fn ordinals(&mut self, max_count: u64, limit: u64, what: &str) -> io::Result<Vec<u64>> {
        let n = self.bounded(max_count, what)?;
        let mut out = Vec::with_capacity(n as usize);
        let mut ordinal = 0u64;
        for i in 0..n {
            let step = self.varint()?;
            if i > 0 && step == 0 {
                return Err(corrupt(format!("{what}: ordinals not increasing")));
            }
            ordinal = ordinal
                .checked_add(step)
                .filter(|&o| o < limit)
                .ok_or_else(|| corrupt(format!("{what}: an ordinal beyond the shard's {limit}")))?;
            out.push(ordinal);
        }
        Ok(out)
    }

    /// Reads the 8-byte checksum that closes a block and compares it with the bytes read so far.
    pub fn verify_checksum(&mut self) -> io::Result<()> {
        let expected = self.checksum.finish();
        let mut b = [0u8; 8];
        self.inner.read_exact(&mut b)?;
        if u64::from_le_bytes(b) != expected {
            return Err(corrupt("checksum mismatch (corrupt or cut-short data)"));
        }
        Ok(())
    }

    /// True when the stream has no byte left.
    pub fn at_end(&mut self) -> io::Result<bool> {
        let mut b = [0u8; 1];
        Ok(self.inner.read(&mut b)? == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_strings_round_trip_and_bad_input_is_refused() {
        let mut out = Vec::new();
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            put_varint(&mut out, v);
        }
        put_str(&mut out, "ünï");
        let mut d = Decoder::new(&out[..]);
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            assert_eq!(d.varint().unwrap(), v);
        }
        assert_eq!(d.string(10, "key").unwrap(), "ünï");
        assert_eq!(d.checksum.finish(), crate::rng::hash_bytes(&out));
        assert!(d.at_end().unwrap());
        assert_eq!(d.consumed, out.len() as u64);
        // 11 continuation bytes, a length beyond its bound, a truncated string.
        assert!(Decoder::new(&[0xffu8; 11][..]).varint().is_err());
        let mut long = Vec::new();
        put_varint(&mut long, 1 << 40);
        assert!(Decoder::new(&long[..])
            .string(1 << 20, "url")
            .unwrap_err()
            .to_string()
            .contains("url"));
        let mut cut = Vec::new();
        put_str(&mut cut, "abcdef");
        cut.truncate(4);
        assert!(Decoder::new(&cut[..]).string(100, "key").is_err());
    }
}
