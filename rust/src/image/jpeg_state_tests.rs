//! What an image becomes is a function of its bytes alone: decoded on a thread's decoder after
//! any other kind of JPEG, every kind of JPEG gives the pixels, or the typed skip, that it gives
//! decoded first. libjpeg keeps one image's quantization and Huffman tables in a decompressor
//! for the next (for abbreviated datastreams); a JPEG without DHT (the standard tables apply)
//! was skipped as corrupt after one with optimized tables, and a JPEG without DQT (which must
//! fail) was decoded with the last image's quantization. Both decode paths are covered: raw
//! planes (jpeg_raw.c) and packed RGB through a TurboJPEG handle (an EXIF-rotated image).

use super::jpeg_entropy_tests::photos;
use crate::batch::kit::sample::{Rejection, SampleSpec, Worker};
use crate::batch::square::sample::prepare_image;
use crate::check::fuzzing::seeds::{encode_jpeg, JpegSettings};
use turbojpeg_sys as tj;

const DHT: u8 = 0xC4;
const DQT: u8 = 0xDB;

/// `jpeg` without its segments of `marker` before the first scan.
fn without(jpeg: &[u8], marker: u8) -> Vec<u8> {
    let mut out = jpeg[..2].to_vec();
    let mut i = 2;
    while jpeg[i] == 0xFF && jpeg[i + 1] != 0xDA {
        let end = i + 2 + u16::from_be_bytes([jpeg[i + 2], jpeg[i + 3]]) as usize;
        if jpeg[i + 1] != marker {
            out.extend_from_slice(&jpeg[i..end]);
        }
        i = end;
    }
    out.extend_from_slice(&jpeg[i..]);
    assert!(out.len() < jpeg.len(), "no segment {marker:#x} to take out");
    out
}

/// `jpeg` with an EXIF segment giving orientation 6 (rotated 90 degrees clockwise): decoded as
/// packed RGB through TurboJPEG, then rotated.
fn rotated(jpeg: &[u8]) -> Vec<u8> {
    let mut tiff = b"MM\0\x2a\0\0\0\x08".to_vec();
    tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
    tiff.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0]); // orientation, SHORT, 6
    tiff.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// Every kind of JPEG, by name, of one photo.
fn kinds(pixels: &[u8], w: u32, h: u32, components: u32) -> Vec<(String, Vec<u8>)> {
    let base = JpegSettings {
        quality: 90,
        subsampling: tj::TJSAMP_TJSAMP_420,
        restart_blocks: 0,
        optimize: false,
        progressive: false,
        arithmetic: false,
    };
    let encode = |s: JpegSettings| encode_jpeg(pixels, w, h, components, s);
    let standard = encode(base);
    let mut out = vec![
        (
            "optimized".to_string(),
            encode(JpegSettings {
                optimize: true,
                ..base
            }),
        ),
        (
            "optimized, quality 100, 4:4:4".into(),
            encode(JpegSettings {
                optimize: true,
                quality: 100,
                subsampling: tj::TJSAMP_TJSAMP_444,
                ..base
            }),
        ),
        ("no DHT".into(), without(&standard, DHT)),
        ("no DQT".into(), without(&standard, DQT)),
        (
            "progressive".into(),
            encode(JpegSettings {
                progressive: true,
                ..base
            }),
        ),
        (
            "arithmetic".into(),
            encode(JpegSettings {
                arithmetic: true,
                ..base
            }),
        ),
        (
            "restart markers, quality 60".into(),
            encode(JpegSettings {
                restart_blocks: 2,
                quality: 60,
                ..base
            }),
        ),
        ("rotated".into(), rotated(&standard)),
        (
            "rotated, optimized".into(),
            rotated(&optimized_422(pixels, w, h, components)),
        ),
        ("rotated, no DHT".into(), rotated(&without(&standard, DHT))),
        ("rotated, no DQT".into(), rotated(&without(&standard, DQT))),
    ];
    out.insert(0, ("standard".into(), standard));
    out
}

fn optimized_422(pixels: &[u8], w: u32, h: u32, components: u32) -> Vec<u8> {
    let settings = JpegSettings {
        quality: 75,
        subsampling: tj::TJSAMP_TJSAMP_422,
        restart_blocks: 0,
        optimize: true,
        progressive: false,
        arithmetic: false,
    };
    encode_jpeg(pixels, w, h, components, settings)
}

fn decode(jpeg: &[u8], worker: &mut Worker) -> Result<Vec<u8>, Rejection> {
    let spec = SampleSpec {
        image_size: 96,
        ..SampleSpec::default()
    };
    let mut slot = vec![0u8; 3 * 96 * 96];
    prepare_image(jpeg, "key", &spec, 0, worker, &mut slot).map(|()| slot)
}

#[test]
fn every_kind_of_jpeg_decodes_the_same_after_every_other_kind() {
    let all = photos(320);
    // A colour photo and a gray one.
    let picked: Vec<_> = [3u32, 1]
        .iter()
        .map(|&c| all.iter().find(|p| p.4 == c).expect("a photo of each kind"))
        .collect();
    for (photo, pixels, w, h, components) in picked {
        let kinds = kinds(pixels, *w, *h, *components);
        for whole in [false, true] {
            let new_worker = || {
                if whole {
                    Worker::validating()
                } else {
                    Worker::default()
                }
            };
            let alone: Vec<_> = kinds
                .iter()
                .map(|(_, jpeg)| decode(jpeg, &mut new_worker()))
                .collect();
            let by_name = |name: &str| &alone[kinds.iter().position(|(n, _)| n == name).unwrap()];
            // What each kind must give on its own: the standard tables are libjpeg's defaults,
            // and a JPEG without quantization tables cannot be decoded.
            assert!(
                by_name("standard").is_ok(),
                "{photo}: {:?}",
                by_name("standard")
            );
            assert_eq!(by_name("no DHT"), by_name("standard"), "{photo}");
            assert_eq!(by_name("rotated, no DHT"), by_name("rotated"), "{photo}");
            for name in ["no DQT", "rotated, no DQT"] {
                let (reason, detail) = by_name(name).as_ref().unwrap_err();
                assert_eq!(reason.as_str(), "corrupt_image", "{photo} {name}: {detail}");
            }
            for name in [
                "optimized",
                "progressive",
                "arithmetic",
                "rotated, optimized",
            ] {
                assert!(by_name(name).is_ok(), "{photo} {name}: {:?}", by_name(name));
            }
            for (before, before_jpeg) in &kinds {
                for ((name, jpeg), want) in kinds.iter().zip(&alone) {
                    let mut worker = new_worker();
                    let _ = decode(before_jpeg, &mut worker);
                    let got = decode(jpeg, &mut worker);
                    assert!(
                        &got == want,
                        "{photo} (whole images: {whole}): {name} after {before} gives {} where \
                         alone it gives {}",
                        summary(&got),
                        summary(want)
                    );
                }
            }
        }
    }
}

fn summary(result: &Result<Vec<u8>, Rejection>) -> String {
    match result {
        Ok(pixels) => format!(
            "pixels (sum {})",
            pixels.iter().map(|&p| p as u64).sum::<u64>()
        ),
        Err((reason, detail)) => format!("{} ({detail})", reason.as_str()),
    }
}
