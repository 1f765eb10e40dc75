//! Property fuzzing over mutated real inputs (issue 15, "Fuzzing").
//!
//! Coverage-guided fuzzing (cargo-fuzz / libFuzzer) needs nightly sanitizer flags, which this
//! stable-only toolchain does not have, so these are proptest property tests: each case takes a
//! real, valid input built here (a tar shard, a JPEG / PNG / WebP image, a version-2 manifest and
//! detail block, version-1 JSON), applies a few structure-blind mutations (bit flips, byte
//! inserts and deletes, truncation, splices, huge length fields) and checks that the parser
//!
//! - never panics (each call runs under `catch_unwind`);
//! - returns an error, not a crash, and does so quickly (a hostile length field must not make
//!   it allocate or read without bound: every case has a wall-clock bound);
//! - stays bounded in what it yields (never more members or samples than the input can hold).
//!
//! Cases per target: `SHARDSTREAM_FUZZ_CASES` (default 10,000, the CI budget: ~5 s in all).
//! A longer run: `SHARDSTREAM_FUZZ_CASES=200000 cargo test --release -q fuzz -- --nocapture`,
//! which also prints cases per second per target.

use std::io::{Cursor, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const BLOCK: usize = 512;

/// One mutation, applied with its positions taken modulo the input's length.
#[derive(Clone, Debug)]
enum Mutation {
    BitFlip(u32, u8),
    SetByte(u32, u8),
    Insert(u32, Vec<u8>),
    Delete(u32, u16),
    Truncate(u32),
    /// Copies `len` bytes from `from` over (or into) position `to`.
    Splice {
        from: u32,
        to: u32,
        len: u16,
        insert: bool,
    },
    /// Writes a hostile length-like field at a position: all-0xFF, a tar base-256 huge size,
    /// a huge octal number, or a huge LEB128 varint.
    Huge(u32, u8),
    /// Aims at a tar header field of a block: size (124), checksum (148), typeflag (156),
    /// name (0), magic (257).
    TarField(u32, u8, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<u32>(), 0u8..8).prop_map(|(i, b)| Mutation::BitFlip(i, b)),
        2 => (any::<u32>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        1 => (any::<u32>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        1 => (any::<u32>(), 1u16..600).prop_map(|(i, n)| Mutation::Delete(i, n)),
        2 => any::<u32>().prop_map(Mutation::Truncate),
        1 => (any::<u32>(), any::<u32>(), 1u16..1024, any::<bool>())
            .prop_map(|(from, to, len, insert)| Mutation::Splice { from, to, len, insert }),
        2 => (any::<u32>(), 0u8..4).prop_map(|(i, k)| Mutation::Huge(i, k)),
        2 => (any::<u32>(), 0u8..5, any::<u8>()).prop_map(|(i, f, b)| Mutation::TarField(i, f, b)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..6)
}

fn at(i: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        i as usize % len
    }
}

fn put(data: &mut [u8], pos: usize, bytes: &[u8]) {
    for (k, &b) in bytes.iter().enumerate() {
        if let Some(slot) = data.get_mut(pos + k) {
            *slot = b;
        }
    }
}

fn apply(base: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut d = base.to_vec();
    for m in muts {
        let n = d.len();
        match m {
            Mutation::BitFlip(i, b) if n > 0 => d[at(*i, n)] ^= 1 << b,
            Mutation::SetByte(i, b) if n > 0 => d[at(*i, n)] = *b,
            Mutation::Insert(i, v) => {
                let p = at(*i, n + 1);
                d.splice(p..p, v.iter().copied());
            }
            Mutation::Delete(i, k) if n > 0 => {
                let p = at(*i, n);
                let end = (p + *k as usize).min(n);
                d.drain(p..end);
            }
            Mutation::Truncate(i) => {
                // Every length class: inside the first block, at block edges, anywhere.
                let keep = match i % 4 {
                    0 => at(*i / 4, n + 1),
                    1 => (at(*i / 4, n / BLOCK + 1) * BLOCK).min(n),
                    2 => (at(*i / 4, n / BLOCK + 1) * BLOCK + at(*i / 4, 2)).min(n),
                    _ => n.saturating_sub(1 + at(*i / 4, 1024)),
                };
                d.truncate(keep);
            }
            Mutation::Splice {
                from,
                to,
                len,
                insert,
            } if n > 0 => {
                let f = at(*from, n);
                let chunk: Vec<u8> = d[f..(f + *len as usize).min(n)].to_vec();
                let t = at(*to, n);
                if *insert {
                    d.splice(t..t, chunk);
                } else {
                    put(&mut d, t, &chunk);
                }
            }
            Mutation::Huge(i, k) if n > 0 => {
                let p = at(*i, n);
                match k {
                    0 => put(&mut d, p, &[0xFF; 8]),
                    1 => put(
                        &mut d,
                        p,
                        &[
                            0x80, 0, 0, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                        ],
                    ),
                    2 => put(&mut d, p, b"77777777777\0"),
                    _ => put(
                        &mut d,
                        p,
                        &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
                    ),
                }
            }
            Mutation::TarField(i, f, b) if n >= BLOCK => {
                let block = at(*i, n / BLOCK) * BLOCK;
                let field = [124, 148, 156, 0, 257][*f as usize % 5];
                match f % 5 {
                    0 => put(
                        &mut d,
                        block + field,
                        &[
                            0x80, 0, 0, 0, 0x0F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                        ],
                    ),
                    2 => put(&mut d, block + field, &[*b]),
                    _ => put(&mut d, block + field + (*b as usize % 8), &[*b]),
                }
            }
            _ => {}
        }
    }
    d
}

/// Cases per target: `SHARDSTREAM_FUZZ_CASES`, or the CI budget.
fn cases() -> u32 {
    std::env::var("SHARDSTREAM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Any one case must finish within this, however hostile its length fields.
const CASE_BOUND: Duration = Duration::from_secs(2);

/// Runs `check` on `cases()` mutated inputs, drawn from `bases`, each under `catch_unwind` and
/// the wall-clock bound; reports cases per second.
fn fuzz(target: &str, bases: &[Vec<u8>], check: impl Fn(&[u8], u64) -> bool) {
    fuzz_wrapped(target, bases, |m| m, check)
}

/// As [`fuzz`], with each mutated input passed through `wrap` first: for checksummed and
/// compressed formats, so mutations reach the parser behind the checksum and the gzip layer.
fn fuzz_wrapped(
    target: &str,
    bases: &[Vec<u8>],
    wrap: impl Fn(Vec<u8>) -> Vec<u8>,
    check: impl Fn(&[u8], u64) -> bool,
) {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let n = bases.len();
    let start = Instant::now();
    let count = std::cell::Cell::new(0u64);
    let accepted = std::cell::Cell::new(0u64);
    let result = runner.run(&(0..n, mutations(), any::<u64>()), |(which, muts, knob)| {
        count.set(count.get() + 1);
        let input = wrap(apply(&bases[which], &muts));
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input, knob)));
        let took = t.elapsed();
        prop_assert!(outcome.is_ok(), "{target}: panicked on a mutated input");
        if matches!(outcome, Ok(true)) {
            accepted.set(accepted.get() + 1);
        }
        prop_assert!(took < CASE_BOUND, "{target}: one case took {took:?}");
        Ok(())
    });
    let secs = start.elapsed().as_secs_f64();
    let count = count.get();
    eprintln!(
        "fuzz {target}: {count} cases in {secs:.2} s, {:.0} cases/s, {} parsed without error",
        count as f64 / secs.max(1e-9),
        accepted.get()
    );
    if let Err(e) = result {
        panic!("{target}: {e}");
    }
}

// ---------------------------------------------------------------- real inputs

fn tar_header(name: &str, size: u64, typeflag: u8) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

fn tar_member(out: &mut Vec<u8>, name: &str, data: &[u8], typeflag: u8) {
    out.extend_from_slice(&tar_header(name, data.len() as u64, typeflag));
    out.extend_from_slice(data);
    out.resize(out.len() + (BLOCK - data.len() % BLOCK) % BLOCK, 0);
}

fn pax_record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

/// Real shards the way writers make them: plain members, a directory, PAX and GNU long names,
/// an image in a sample, end-of-archive blocks.
fn tar_bases() -> &'static Vec<Vec<u8>> {
    static BASES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut plain = Vec::new();
        tar_member(&mut plain, "shard/", b"", b'5');
        for i in 0..4 {
            tar_member(
                &mut plain,
                &format!("shard/{i:05}.jpg"),
                &images()[i % 3],
                b'0',
            );
            tar_member(
                &mut plain,
                &format!("shard/{i:05}.txt"),
                format!("caption {i}").as_bytes(),
                b'0',
            );
            tar_member(
                &mut plain,
                &format!("shard/{i:05}.json"),
                b"{\"w\":8}",
                b'0',
            );
        }
        plain.extend_from_slice(&[0u8; 2 * BLOCK]);

        let mut long = Vec::new();
        let long_name = format!("{}/00007.txt", "d".repeat(150));
        let pax = pax_record("path", &long_name);
        tar_member(&mut long, "././@PaxHeader", pax.as_bytes(), b'x');
        tar_member(&mut long, "placeholder", b"pax caption", b'0');
        let gnu = format!("{}/00008.cls\0", "g".repeat(120));
        tar_member(&mut long, "././@LongLink", gnu.as_bytes(), b'L');
        tar_member(&mut long, "placeholder", b"3", b'0');
        tar_member(&mut long, "x/00009.txt", b"after", b'0');
        tar_member(&mut long, "x/00009.cls", b"1", b'0');
        tar_member(&mut long, "x/link", b"", b'2');
        long.extend_from_slice(&[0u8; 2 * BLOCK]);
        vec![plain, long]
    })
}

fn rgb_pattern(w: u32, h: u32) -> Vec<u8> {
    (0..w * h)
        .flat_map(|i| {
            let (x, y) = (i % w, i / w);
            [(x * 7) as u8, (y * 5) as u8, ((x ^ y) * 3) as u8]
        })
        .collect()
}

fn jpeg(w: u32, h: u32, subsamp: turbojpeg::Subsamp, quality: i32) -> Vec<u8> {
    let pixels = rgb_pattern(w, h);
    let image = turbojpeg::Image {
        pixels: pixels.as_slice(),
        width: w as usize,
        pitch: w as usize * 3,
        height: h as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(image, quality, subsamp)
        .unwrap()
        .to_vec()
}

fn encode_with_image_crate(w: u32, h: u32, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_raw(w, h, rgb_pattern(w, h)).unwrap();
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// Real images: JPEGs in each subsampling (the raw-plane path) plus gray, a progressive-free
/// image-crate JPEG, PNG and lossless WebP.
fn images() -> &'static Vec<Vec<u8>> {
    static IMAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        use turbojpeg::Subsamp;
        vec![
            jpeg(40, 24, Subsamp::Sub2x2, 85),
            encode_with_image_crate(20, 12, image::ImageFormat::Png),
            encode_with_image_crate(18, 10, image::ImageFormat::WebP),
            jpeg(33, 17, Subsamp::None, 90),
            jpeg(48, 32, Subsamp::Sub2x1, 75),
            jpeg(24, 40, Subsamp::Gray, 80),
            jpeg(17, 33, Subsamp::Sub1x2, 70),
            encode_with_image_crate(16, 16, image::ImageFormat::Jpeg),
        ]
    })
}

fn index_entry(url: &str, n: u64, bad: &[u64], keys: bool) -> crate::index::ShardEntry {
    use crate::index::{InvalidSample, ShardEntry};
    let mut e = ShardEntry::new(url, n);
    e.size = Some(n * 2048 + 1024);
    e.offsets = Some((0..=n).map(|i| i * 2048).collect());
    if keys {
        e.keys = Some((0..n).map(|i| format!("{i:05}")).collect());
    }
    e.identity = Some(format!("etag-{url}"));
    e.set_invalid(
        bad.iter()
            .map(|&o| InvalidSample {
                ordinal: o,
                key: format!("{o:05}"),
                reason: crate::error::Reason::CorruptImage,
                detail: "truncated JPEG".into(),
            })
            .collect(),
    );
    e
}

fn sample_index() -> crate::index::Index {
    let mut gz = index_entry("s3://bucket/data/00002.tar.gz", 4, &[], false);
    gz.compressed = true;
    crate::index::Index::new(vec![
        index_entry("/data/a/00000.tar", 5, &[3, 0], false),
        index_entry("/data/b/00001.tar", 3, &[1], true),
        gz,
        index_entry("https://host/x/00003.tar?X-Amz-Signature=s", 2, &[], true),
    ])
    .unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// A block's payload (decompressed, without its closing checksum) and the inverse: checksum
/// appended, gzip, `prefix` in front: what the manifest and detail writers produce.
fn unwrap_checked(block: &[u8], prefix: usize) -> Vec<u8> {
    let mut inner = gunzip(&block[prefix..]);
    inner.truncate(inner.len() - 8);
    inner
}

fn wrap_checked(prefix: &'static [u8]) -> impl Fn(Vec<u8>) -> Vec<u8> {
    move |mut payload| {
        // The index's block checksum (FNV-1a, then mix64), as `index::codec::put_checksum`.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in &payload {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        payload.extend_from_slice(&crate::rng::mix64(h).to_le_bytes());
        let mut out = prefix.to_vec();
        out.extend_from_slice(&gzip(&payload));
        out
    }
}

// ---------------------------------------------------------------- targets

/// Reads every entry; true when the stream ended cleanly.
fn drain_tar(bytes: &[u8], max_member: u64) -> bool {
    let mut reader = crate::tar::TarReader::new(bytes, 0, max_member);
    // A tar of n bytes holds at most n / 512 headers: more entries would be a loop.
    let bound = bytes.len() / BLOCK + 2;
    for _ in 0..=bound {
        match reader.next_entry() {
            Ok(Some(crate::tar::Entry::File(m))) => {
                assert!(m.data.len() as u64 <= max_member);
                assert!(m.offset <= bytes.len() as u64);
            }
            Ok(Some(crate::tar::Entry::Oversized { .. })) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
    panic!("tar reader yielded more entries than the input has blocks");
}

#[test]
fn fuzz_tar_reader() {
    fuzz("tar", tar_bases(), |bytes, knob| {
        let max_member = [1 << 20, 100, 0][knob as usize % 3];
        drain_tar(bytes, max_member)
    });
}

/// Groups every sample; true when no fault was reported.
fn drain_samples(reader: Box<dyn Read + Send>, len: usize) -> bool {
    let tar = crate::tar::TarReader::new(reader, 0, 1 << 20);
    let samples = crate::group::SampleReader::new(tar, 0);
    let bound = len / BLOCK + 4;
    let mut seen = 0usize;
    let mut clean = true;
    for item in samples {
        seen += 1;
        assert!(seen <= bound, "more samples than the input has blocks");
        match item {
            Ok(s) => assert!(s.byte_len() <= len),
            Err(_) => clean = false,
        }
    }
    clean
}

#[test]
fn fuzz_sample_grouping() {
    let mut bases = tar_bases().clone();
    // Gzip shards: a mutated gzip stream goes through the decompressor first.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_bases()[0]).unwrap();
    bases.push(gz.finish().unwrap());
    let gzipped = bases.len() - 1;
    let gz_base = bases[gzipped].clone();
    fuzz("group", &bases, |bytes, _| {
        let owned = bytes.to_vec();
        let len = owned.len();
        if bytes.len() >= 2 && bytes[..2] == gz_base[..2] {
            // At most the base's decompressed size plus what a mutation can add, bounded.
            let limited = flate2::read::MultiGzDecoder::new(Cursor::new(owned)).take(1 << 22);
            drain_samples(Box::new(limited), 1 << 22)
        } else {
            drain_samples(Box::new(Cursor::new(owned)), len)
        }
    });
}

#[test]
fn fuzz_sample_grouping_from_file() {
    // The path a local shard takes: `open_shard` over a file, at offset 0 and mid-shard.
    let dir = std::env::temp_dir().join(format!("shardstream-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shard.tar");
    let url = path.to_str().unwrap().to_string();
    let stats = std::sync::Arc::new(crate::source::SourceStats::default());
    let opts = crate::source::SourceOptions::default();
    let cases_here = (cases() / 4).max(16);
    let mut runner = TestRunner::new(Config {
        cases: cases_here,
        failure_persistence: None,
        ..Config::default()
    });
    let base = tar_bases()[0].clone();
    let start = Instant::now();
    let result = runner.run(&(mutations(), 0u64..8), |(muts, start_block)| {
        let input = apply(&base, &muts);
        std::fs::write(&path, &input).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let opened = crate::group::open_shard(
                &url,
                start_block * BLOCK as u64,
                0,
                1 << 20,
                &crate::source::Expected::default(),
                &opts,
                &stats,
            );
            if let Ok(samples) = opened {
                let bound = input.len() / BLOCK + 4;
                assert!(samples.take(bound + 1).count() <= bound);
            }
        }));
        prop_assert!(outcome.is_ok(), "open_shard panicked");
        Ok(())
    });
    eprintln!(
        "fuzz group-file: {cases_here} cases in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("group-file: {e}");
    }
}

/// Probes and decodes with a crop and target from `knob`; true when it decoded.
fn decode_all(decoder: &mut crate::decode::Decoder, bytes: &[u8], knob: u64) -> bool {
    use crate::resize::CropBox;
    let Ok(probe) = decoder.probe(bytes) else {
        return false;
    };
    let (w, h) = probe.oriented_size();
    let (fw, fh) = (w.max(1) as f64, h.max(1) as f64);
    // A crop from the knob: anywhere from a sliver to the whole image, sometimes outside it.
    let fx = (knob & 0xFF) as f64 / 255.0;
    let fy = ((knob >> 8) & 0xFF) as f64 / 255.0;
    let fwid = ((knob >> 16) & 0xFF) as f64 / 255.0;
    let fhei = ((knob >> 24) & 0xFF) as f64 / 255.0;
    let region = CropBox {
        x: fx * fw * 0.9,
        y: fy * fh * 0.9,
        w: (fwid * fw * 1.1).max(1.0),
        h: (fhei * fh * 1.1).max(1.0),
    };
    let target = [0, 1, 4, 8, 16, 224][((knob >> 32) % 6) as usize];
    let partial = (knob >> 40) & 1 == 1;
    // Bounded: a header claiming a huge size is refused before any pixel buffer is sized.
    let max_pixels = 1 << 22;
    match decoder.decode(bytes, &probe, region, target, max_pixels, partial) {
        Ok(pixels) => {
            let (pw, ph) = pixels.size();
            assert!(pw as u64 * ph as u64 <= max_pixels);
            true
        }
        Err(_) => false,
    }
}

#[test]
fn fuzz_image_decode() {
    // One decoder across all cases, as a decode thread has: a failed decode must leave no state
    // behind that breaks (or crashes) the next.
    let decoder = std::cell::RefCell::new(crate::decode::Decoder::new());
    fuzz("decode", images(), |bytes, knob| {
        let mut d = decoder.borrow_mut();
        if d.probe(&images()[0]).is_err() {
            // A panic in an earlier case may leave it mid-borrow; start afresh.
            *d = crate::decode::Decoder::new();
        }
        decode_all(&mut d, bytes, knob)
    });
    // After all that, a valid image still decodes on the same decoder.
    let mut d = decoder.borrow_mut();
    for img in images() {
        let probe = d.probe(img).unwrap();
        let region = crate::resize::CropBox {
            x: 0.0,
            y: 0.0,
            w: probe.width as f64,
            h: probe.height as f64,
        };
        d.decode(img, &probe, region, 0, 1 << 22, false).unwrap();
    }
}

#[test]
fn fuzz_index_manifest_and_detail() {
    let index = sample_index();
    let (manifest, detail) = index.to_layout("index.detail");
    // The detail blocks, one per shard, as a reader fetches them (by the manifest's refs).
    let blocks: Vec<(String, u64, Vec<u8>)> = index
        .shards()
        .iter()
        .zip(crate::index::manifest::decode(&manifest).unwrap().shards())
        .filter_map(|(orig, laid)| {
            let r = laid.detail_ref?;
            let block = detail[r.offset as usize..(r.offset + r.len as u64) as usize].to_vec();
            Some((orig.url.clone(), orig.num_samples, block))
        })
        .collect();
    assert!(!blocks.is_empty());
    fuzz("manifest", std::slice::from_ref(&manifest), |bytes, _| {
        let _ = crate::index::Index::from_bytes(bytes);
        match crate::index::manifest::decode(bytes) {
            Ok(ix) => {
                // Whatever decodes must be usable: its plan input and fingerprint compute.
                let _ = ix.fingerprint();
                let _ = ix.plan_input();
                let _ = ix.num_valid();
                true
            }
            Err(_) => false,
        }
    });
    // Behind the checksum and the gzip layer: mutations of the records themselves.
    let magic = crate::index::manifest::MAGIC;
    let inner = unwrap_checked(&manifest, magic.len());
    let rewrap = wrap_checked(magic);
    assert!(crate::index::manifest::decode(&rewrap(inner.clone())).is_ok());
    fuzz_wrapped("manifest-records", &[inner], rewrap, |bytes, _| {
        match crate::index::manifest::decode(bytes) {
            Ok(ix) => {
                let _ = ix.fingerprint();
                let _ = ix.plan_input();
                let _ = ix.num_valid();
                true
            }
            Err(_) => false,
        }
    });
    for (url, n, block) in &blocks {
        let inner = unwrap_checked(block, 0);
        let rewrap = wrap_checked(b"");
        assert!(crate::index::detail::decode(&rewrap(inner.clone()), url, *n).is_ok());
        fuzz_wrapped("detail-records", &[inner], rewrap, |bytes, _| {
            crate::index::detail::decode(bytes, url, *n).is_ok()
        });
    }
    for (url, n, block) in &blocks {
        fuzz("detail", std::slice::from_ref(block), |bytes, knob| {
            // The true count, and a hostile one from a tampered manifest.
            let n = if knob & (1 << 40) != 0 {
                u64::MAX >> (knob % 64)
            } else {
                *n
            };
            crate::index::detail::decode(bytes, url, n).is_ok()
        });
    }
}

#[test]
fn fuzz_index_json_v1() {
    let index = sample_index();
    let bases = vec![index.to_json(), index.to_json_gz()];
    fuzz(
        "json_v1",
        &bases,
        |bytes, _| match crate::index::Index::from_json(bytes) {
            Ok(ix) => {
                let _ = ix.fingerprint();
                let _ = ix.plan_input();
                true
            }
            Err(_) => false,
        },
    );
    // The gzip form with the mutations inside the compressed JSON.
    fuzz_wrapped(
        "json_v1-gz-inner",
        &[index.to_json()],
        |m| gzip(&m),
        |bytes, _| crate::index::Index::from_json(bytes).is_ok(),
    );
}

#[test]
fn hostile_length_fields_fail_fast() {
    // A member claiming ~1 TB (base-256 size) in a 2 KB stream, and one claiming the octal
    // maximum: a quick error or a skipped oversized member, never a 1 TB buffer.
    for size_field in [
        &[0x80u8, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0][..],
        b"77777777777\0",
    ] {
        let mut shard = Vec::new();
        tar_member(&mut shard, "a/00000.txt", b"x", b'0');
        let mut h = tar_header("a/00001.jpg", 0, b'0');
        h[124..136].copy_from_slice(size_field);
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        shard.extend_from_slice(&h);
        shard.extend_from_slice(&[7u8; 1024]);
        let t = Instant::now();
        for max_member in [u64::MAX, 1 << 20] {
            drain_tar(&shard, max_member);
            drain_samples(Box::new(Cursor::new(shard.clone())), shard.len());
        }
        assert!(t.elapsed() < CASE_BOUND);
    }
}
