//! Property fuzzing over mutated real inputs (issue 15, "Fuzzing").
//!
//! The structure-aware driver, beside the coverage-guided libFuzzer targets in `fuzz/` (both
//! use the seeds and checks of `check::fuzzing`). It runs inside `cargo test`, so every CI run
//! fuzzes without an instrumented build: each case takes a real, valid input (a tar shard, a
//! JPEG / PNG / WebP image, a version-2 manifest and detail block, version-1 JSON), applies a
//! few mutations aimed at the formats' fields (bit flips, byte inserts and deletes, truncation
//! at block edges, splices, huge length fields, tar header fields) and checks that the parser
//!
//! - never panics (each call runs under `catch_unwind`);
//! - returns an error, not a crash, and does so quickly (a hostile length field must not make
//!   it allocate or read without bound: every case has a wall-clock bound);
//! - stays bounded in what it yields (never more members or samples than the input can hold).
//!
//! Cases per target: `SHARDSTREAM_FUZZ_CASES` (default 10,000, the CI budget: ~5 s in all).
//! A longer run: `SHARDSTREAM_FUZZ_CASES=200000 cargo test --release -q fuzz -- --nocapture`,
//! which also prints cases per second per target.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::check::fuzzing::checks::{decode_all, drain_samples, drain_tar};
use crate::check::fuzzing::seeds::{
    gzip, images, index_layout, sample_index, tar_bases, tar_header, tar_member, unwrap_checked,
    wrap_checked, BLOCK,
};

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
    fuzz_runs(target, bases, cases(), wrap, check)
}

fn fuzz_runs(
    target: &str,
    bases: &[Vec<u8>],
    cases: u32,
    wrap: impl Fn(Vec<u8>) -> Vec<u8>,
    check: impl Fn(&[u8], u64) -> bool,
) {
    let config = Config {
        cases,
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

// ---------------------------------------------------------------- targets

#[test]
fn fuzz_tar_reader() {
    fuzz("tar", tar_bases(), |bytes, knob| {
        let max_member = [1 << 20, 100, 0][knob as usize % 3];
        drain_tar(bytes, max_member)
    });
}

#[test]
fn fuzz_sample_grouping() {
    // Plain shards, and a gzip shard: its mutated stream goes through the decompressor first.
    let mut bases = tar_bases().clone();
    bases.push(gzip(&tar_bases()[0]));
    fuzz("group", &bases, |bytes, _| {
        crate::check::fuzzing::checks::group(bytes)
    });
}

#[test]
fn fuzz_sample_grouping_from_file() {
    // The path a local shard takes: `open_shard` over a file, at offset 0 and mid-shard.
    let dir = std::env::temp_dir().join(format!("shardstream-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shard.tar");
    let url = path.to_str().unwrap().to_string();
    let stats = std::sync::Arc::new(crate::read::source::SourceStats::default());
    let opts = crate::read::source::SourceOptions::default();
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
            let opened = crate::read::group::open_shard(
                &url,
                start_block * BLOCK as u64,
                0,
                1 << 20,
                &crate::read::source::Expected::default(),
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

#[test]
fn fuzz_video_container_and_decoder() {
    let clips = crate::check::fuzzing::seeds::video_clips();
    fuzz("video", clips, crate::check::fuzzing::checks::video);
    // The seeds themselves decode, under the generous caps.
    for (i, clip) in clips.iter().enumerate() {
        let decoded = crate::check::fuzzing::checks::video(clip, 0);
        assert!(decoded, "seed clip {i} decodes");
    }
}

#[test]
fn fuzz_image_decode() {
    // One decoder across all cases, as a decode thread has: a failed decode must leave no state
    // behind that breaks (or crashes) the next.
    let decoder = std::cell::RefCell::new(crate::image::decode::Decoder::new());
    fuzz("decode", images(), |bytes, knob| {
        let mut d = decoder.borrow_mut();
        if d.probe(&images()[0]).is_err() {
            // A panic in an earlier case may leave it mid-borrow; start afresh.
            *d = crate::image::decode::Decoder::new();
        }
        let decoded = decode_all(&mut d, bytes, knob);
        crate::check::fuzzing::checks::jpeg_entropy_agrees(bytes, knob);
        decoded
    });
    // After all that, a valid image still decodes on the same decoder.
    let mut d = decoder.borrow_mut();
    for img in images() {
        let probe = d.probe(img).unwrap();
        let region = crate::image::resize::CropBox {
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
    use crate::check::fuzzing::checks::{detail, manifest};
    let layout = index_layout();
    assert!(!layout.details.is_empty());
    fuzz(
        "manifest",
        std::slice::from_ref(&layout.manifest),
        |bytes, _| manifest(bytes),
    );
    // Behind the checksum and the gzip layer: mutations of the records themselves.
    let magic = crate::index::manifest::MAGIC;
    let inner = unwrap_checked(&layout.manifest, magic.len());
    let rewrap = wrap_checked(magic);
    assert!(crate::index::manifest::decode(&rewrap(inner.clone())).is_ok());
    fuzz_wrapped("manifest-records", &[inner], rewrap, |bytes, _| {
        manifest(bytes)
    });
    for d in &layout.details {
        let inner = unwrap_checked(&d.block, 0);
        let rewrap = wrap_checked(b"");
        assert!(detail(&rewrap(inner.clone()), &d.url, d.num_samples));
        fuzz_wrapped("detail-records", &[inner], rewrap, |bytes, _| {
            detail(bytes, &d.url, d.num_samples)
        });
    }
    for d in &layout.details {
        fuzz("detail", std::slice::from_ref(&d.block), |bytes, knob| {
            // The true count, and a hostile one from a tampered manifest.
            let n = if knob & (1 << 40) != 0 {
                u64::MAX >> (knob % 64)
            } else {
                d.num_samples
            };
            detail(bytes, &d.url, n)
        });
    }
}

#[test]
fn fuzz_index_json_v1() {
    use crate::check::fuzzing::checks::json_v1;
    let index = sample_index();
    let bases = vec![index.to_json(), index.to_json_gz()];
    fuzz("json_v1", &bases, |bytes, _| json_v1(bytes));
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

#[test]
fn fuzz_finding_every_size_0_ac_symbol_but_zrl_ends_a_block() {
    // Found by fuzz_image_decode: a DHT whose AC symbols were overwritten with 0x80 (run 8,
    // size 0) and others. libjpeg ends the block at any size-0 symbol but ZRL; our entropy
    // decoder took only 0x00 as the end and read on, decoding the image to other planes.
    let bytes = apply(&images()[4], &[Mutation::Huge(3840440485, 1)]);
    assert_eq!(&bytes[448..452], &[0x80, 0, 0, 0x7F], "the mutated symbols");
    crate::check::fuzzing::checks::jpeg_entropy_agrees(&bytes, 0);
}
