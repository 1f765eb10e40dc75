//! Our baseline Huffman decoder (`rust/csrc/jpeg_huffman.c`) against libjpeg-turbo's own, on
//! real photos encoded every way libjpeg-turbo encodes them and on damaged copies: a decode
//! gives the same planes, or the same error, with either; and ours is the one that ran.

use std::path::PathBuf;

use crate::check::fuzzing::checks::raw_planes;
use crate::check::fuzzing::seeds::{encode_jpeg, JpegSettings};
use crate::image::jpeg_raw::{Entropy, RawDecoder};
use turbojpeg_sys as tj;

const MAX_PIXELS: usize = 1 << 24;

/// The real photos in the scikit-image and scikit-learn wheels of the venv the tests run in
/// (`scripts/env.sh`), as (name, file bytes).
fn photo_files() -> Vec<(String, Vec<u8>)> {
    let venv = std::env::var("VIRTUAL_ENV").expect(
        "VIRTUAL_ENV is unset: these tests decode the real photos in the scikit-image and \
         scikit-learn wheels of the venv that scripts/env.sh makes; run them from it",
    );
    let mut files = Vec::new();
    let lib = PathBuf::from(venv).join("lib");
    for python in std::fs::read_dir(&lib)
        .expect("the venv's lib folder")
        .flatten()
    {
        let site = python.path().join("site-packages");
        for dir in ["skimage/data", "sklearn/datasets/images"] {
            let Ok(entries) = std::fs::read_dir(site.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                if ["jpg", "png"].contains(&ext) {
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    files.push((name, std::fs::read(&path).unwrap()));
                }
            }
        }
    }
    files.sort();
    assert!(
        files.len() >= 10,
        "found {} photos under {}: scikit-image and scikit-learn must be installed",
        files.len(),
        lib.display()
    );
    files
}

/// Every photo's pixels (RGB, or gray for gray photos), at most `max_side` on a side (a
/// centre crop: the pixels stay the photo's own), as (name, pixels, w, h, components).
pub(super) fn photos(max_side: u32) -> Vec<(String, Vec<u8>, u32, u32, u32)> {
    let mut out = Vec::new();
    for (name, bytes) in photo_files() {
        let Ok(image) = ::image::load_from_memory(&bytes) else {
            continue; // a PNG the image crate does not read (16-bit palettes): not a photo here
        };
        let (w, h) = (image.width().min(max_side), image.height().min(max_side));
        let (x, y) = ((image.width() - w) / 2, (image.height() - h) / 2);
        if w < 64 || h < 64 {
            continue;
        }
        let image = image.crop_imm(x, y, w, h);
        if image.color().has_color() {
            out.push((name, image.to_rgb8().into_raw(), w, h, 3));
        } else {
            out.push((name, image.to_luma8().into_raw(), w, h, 1));
        }
    }
    out
}

fn settings(quality: i32, subsampling: i32, restart_blocks: i32, optimize: bool) -> JpegSettings {
    JpegSettings {
        quality,
        subsampling,
        restart_blocks,
        optimize,
        progressive: false,
        arithmetic: false,
    }
}

/// Decodes with both decoders at every scale, whole and stopped early, and asserts equal
/// results. Returns which entropy decoder ours used for the whole image at full scale, and
/// whether that decode succeeded.
fn compare(
    name: &str,
    bytes: &[u8],
    ours: &mut RawDecoder,
    libjpeg: &mut RawDecoder,
) -> (Entropy, bool) {
    let mut whole = None;
    for denom in [1, 2, 4, 8] {
        for stop_row in [0, 17] {
            let a = raw_planes(ours, bytes, denom, stop_row, MAX_PIXELS);
            let b = raw_planes(libjpeg, bytes, denom, stop_row, MAX_PIXELS);
            match (&a, &b) {
                (Ok(a), Ok(b)) => {
                    let first = a.iter().zip(b).position(|(x, y)| x != y);
                    assert!(
                        a.len() == b.len() && first.is_none(),
                        "{name} at 1/{denom}, stop {stop_row}: planes differ at byte {first:?}"
                    );
                }
                _ => assert_eq!(a, b, "{name} at 1/{denom}, stop {stop_row}"),
            }
            assert_eq!(libjpeg.entropy(), Entropy::Libjpeg);
            if whole.is_none() {
                whole = Some((ours.entropy(), a.is_ok()));
            }
        }
    }
    whole.unwrap()
}

#[test]
fn ours_decodes_real_photos_to_libjpegs_planes_in_every_encoding() {
    let mut ours = RawDecoder::new().unwrap();
    let mut libjpeg = RawDecoder::with_libjpeg_entropy().unwrap();
    let encodings = [
        settings(95, tj::TJSAMP_TJSAMP_420, 0, false),
        settings(75, tj::TJSAMP_TJSAMP_422, 0, false),
        settings(90, tj::TJSAMP_TJSAMP_444, 0, true),
        // Quality 100: large coefficients, long codes and value bits past the fast table.
        settings(100, tj::TJSAMP_TJSAMP_444, 0, false),
        settings(100, tj::TJSAMP_TJSAMP_420, 0, true),
        settings(85, tj::TJSAMP_TJSAMP_440, 0, false),
        // Restart markers: every MCU, and every 7 (past RST7, the numbers wrap).
        settings(90, tj::TJSAMP_TJSAMP_420, 1, false),
        settings(95, tj::TJSAMP_TJSAMP_444, 7, true),
    ];
    let (mut by_ours, mut by_libjpeg) = (0, 0);
    for (name, pixels, w, h, components) in photos(400) {
        for (i, s) in encodings.iter().enumerate() {
            let bytes = encode_jpeg(&pixels, w, h, components, *s);
            let (used, decoded) = compare(&format!("{name} #{i}"), &bytes, &mut ours, &mut libjpeg);
            assert!(decoded, "{name} #{i} did not decode");
            assert_eq!(
                used,
                Entropy::Ours,
                "{name} #{i}: ours must take a baseline JPEG"
            );
            by_ours += 1;
        }
        // Odd sizes: partial MCUs at the right and bottom edges.
        let (cw, ch) = (w.min(333) - 2, h.min(217) - 1);
        let row = (w * components) as usize;
        let cropped: Vec<u8> = (0..ch as usize)
            .flat_map(|y| pixels[y * row..][..(cw * components) as usize].to_vec())
            .collect();
        let bytes = encode_jpeg(&cropped, cw, ch, components, encodings[0]);
        assert_eq!(
            compare(&name, &bytes, &mut ours, &mut libjpeg).0,
            Entropy::Ours
        );
        // Progressive JPEGs stay with libjpeg's decoder.
        let progressive = JpegSettings {
            progressive: true,
            ..encodings[0]
        };
        let bytes = encode_jpeg(&pixels, w, h, components, progressive);
        assert_eq!(
            compare(&name, &bytes, &mut ours, &mut libjpeg).0,
            Entropy::Libjpeg
        );
        by_libjpeg += 1;
    }
    // The photos as their wheels ship them (JPEGs from other encoders).
    for (name, bytes) in photo_files() {
        if name.ends_with(".jpg") {
            compare(&name, &bytes, &mut ours, &mut libjpeg);
        }
    }
    assert!(by_ours >= 80 && by_libjpeg >= 10, "{by_ours} {by_libjpeg}");
}

/// Where the entropy-coded data of a JPEG's (first) scan starts: after its SOS segment.
fn scan_start(bytes: &[u8]) -> usize {
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    sos + 2 + u16::from_be_bytes([bytes[sos + 2], bytes[sos + 3]]) as usize
}

#[test]
fn damaged_photos_give_libjpegs_result_whatever_the_damage() {
    let mut ours = RawDecoder::new().unwrap();
    let mut libjpeg = RawDecoder::with_libjpeg_entropy().unwrap();
    let mut outcomes = std::collections::BTreeMap::new();
    let all = photos(256);
    for (name, pixels, w, h, components) in all.iter().take(6) {
        for s in [
            settings(92, tj::TJSAMP_TJSAMP_420, 0, false),
            settings(92, tj::TJSAMP_TJSAMP_420, 3, false),
        ] {
            let good = encode_jpeg(pixels, *w, *h, *components, s);
            let (start, end) = (scan_start(&good), good.len() - 2);
            let span = end - start;
            let mut damaged: Vec<(String, Vec<u8>)> = Vec::new();
            for i in 1..8 {
                let at = start + span * i / 8;
                damaged.push((format!("cut at {at}"), good[..at].to_vec()));
                let mut flipped = good.clone();
                flipped[at] ^= 1 << (i % 8);
                damaged.push((format!("bit flip at {at}"), flipped));
                let mut marker = good.clone();
                marker[at] = 0xFF;
                marker[at + 1] = [0xD9, 0xD3, 0xC4, 0xFF, 0x00, 0xE1, 0xD0][i - 1];
                damaged.push((format!("FF {:02X} at {at}", marker[at + 1]), marker));
            }
            // Restart markers renumbered, dropped, or doubled.
            let restarts: Vec<usize> = (start..end)
                .filter(|&i| good[i] == 0xFF && (0xD0..=0xD7).contains(&good[i + 1]))
                .collect();
            for &at in restarts.iter().take(3) {
                let mut renumbered = good.clone();
                renumbered[at + 1] = 0xD0 + (renumbered[at + 1] - 0xD0 + 1) % 8;
                damaged.push((format!("RST renumbered at {at}"), renumbered));
                let mut dropped = good.clone();
                dropped.drain(at..at + 2);
                damaged.push((format!("RST dropped at {at}"), dropped));
                let mut doubled = good.clone();
                doubled.splice(at..at, good[at..at + 2].iter().copied());
                damaged.push((format!("RST doubled at {at}"), doubled));
            }
            // Stray bytes, or fill bytes, between the scan's end and EOI.
            for (what, extra) in [("stray", &b"\x12\x34"[..]), ("fill", &b"\xFF\xFF"[..])] {
                let mut stray = good.clone();
                stray.splice(end..end, extra.iter().copied());
                damaged.push((format!("{what} bytes before EOI"), stray));
            }
            for (what, bytes) in damaged {
                let label = format!("{name} (restarts {}): {what}", s.restart_blocks);
                let (used, decoded) = compare(&label, &bytes, &mut ours, &mut libjpeg);
                *outcomes.entry((format!("{used:?}"), decoded)).or_insert(0) += 1;
            }
        }
    }
    // Damage that ours decodes through itself (a flipped bit is often still valid data), and
    // damage it hands back to libjpeg, both happened; some of each failed, some decoded.
    let count = |used: &str, decoded: bool| outcomes.get(&(used.into(), decoded)).copied();
    assert!(count("Redone", false).unwrap_or(0) > 20, "{outcomes:?}");
    assert!(count("Ours", true).unwrap_or(0) > 10, "{outcomes:?}");
}
