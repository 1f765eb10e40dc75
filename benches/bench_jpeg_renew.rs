//! What a clean table state costs per image: every JPEG starts from a new libjpeg decompressor
//! (raw planes, `RawDecoder::renew`) or a new TurboJPEG handle (packed RGB, EXIF-rotated
//! images), so that no image's quantization or Huffman tables reach the next (issue 39). Times,
//! one thread, the same process: the square loader's whole per-image path (`prepare_image`:
//! probe, decode at the DCT scale the crop allows, resize to 224 px, centre crop) on JPEGs cut
//! from real photos at img2dataset sizes, and the renewal alone, and prints their ratio.
//!
//! Run (from the venv scripts/env.sh makes: the photos are its scikit-image and scikit-learn
//! wheels'): `cargo bench --bench bench_jpeg_renew -- [--images 400] [--repeat 5]`.

use std::path::PathBuf;
use std::time::Instant;

use shardstream::batch::kit::sample::{SampleSpec, Worker};
use shardstream::batch::square::sample::prepare_image;
use shardstream::image::jpeg::Handle;
use shardstream::image::jpeg_raw::RawDecoder;

#[path = "common/mod.rs"]
mod common;
use common::arg;

/// The colour photos of the venv's scikit-image and scikit-learn wheels, as RGB.
fn photos() -> Vec<::image::RgbImage> {
    let venv = std::env::var("VIRTUAL_ENV").expect("run from the venv scripts/env.sh makes");
    let mut out = Vec::new();
    for python in std::fs::read_dir(PathBuf::from(venv).join("lib"))
        .unwrap()
        .flatten()
    {
        let site = python.path().join("site-packages");
        for dir in ["skimage/data", "sklearn/datasets/images"] {
            let Ok(entries) = std::fs::read_dir(site.join(dir)) else {
                continue;
            };
            let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for path in paths {
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                if !["jpg", "png"].contains(&ext) {
                    continue;
                }
                if let Ok(img) = ::image::open(&path) {
                    if img.color().has_color() && img.width().min(img.height()) >= 300 {
                        out.push(img.to_rgb8());
                    }
                }
            }
        }
    }
    assert!(out.len() >= 6, "scikit-image and scikit-learn photos");
    out
}

/// `count` JPEGs (quality 90, 4:2:0) cut from the photos at 256-512 px on the shorter side.
fn jpegs(count: usize) -> Vec<Vec<u8>> {
    let photos = photos();
    let mut compressor = turbojpeg::Compressor::new().unwrap();
    compressor.set_quality(90).unwrap();
    compressor.set_subsamp(turbojpeg::Subsamp::Sub2x2).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as u32
    };
    (0..count)
        .map(|i| {
            let photo = &photos[i % photos.len()];
            let short = photo.width().min(photo.height());
            let side = (256 + next(257)).min(short);
            let w = (side * (100 + next(34)) / 100).min(photo.width());
            let (x, y) = (next(photo.width() - w + 1), next(photo.height() - side + 1));
            let crop = ::image::imageops::crop_imm(photo, x, y, w, side).to_image();
            compressor
                .compress_to_vec(turbojpeg::Image {
                    pixels: crop.as_raw().as_slice(),
                    width: w as usize,
                    pitch: 3 * w as usize,
                    height: side as usize,
                    format: turbojpeg::PixelFormat::RGB,
                })
                .unwrap()
        })
        .collect()
}

/// The best of `repeat` timings of `pass`, in seconds.
fn best(repeat: usize, mut pass: impl FnMut()) -> f64 {
    (0..repeat)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let (count, repeat) = (arg("--images", 400), arg("--repeat", 5));
    let images = jpegs(count);
    let spec = SampleSpec::default();
    let mut worker = Worker::default();
    let mut slot = vec![0u8; 3 * 224 * 224];
    let decode = best(repeat, || {
        for (i, jpeg) in images.iter().enumerate() {
            prepare_image(jpeg, &i.to_string(), &spec, 0, &mut worker, &mut slot).unwrap();
        }
    }) / count as f64;
    let renewals = 20 * count;
    let mut raw = RawDecoder::new().unwrap();
    let renew = best(repeat, || {
        for _ in 0..renewals {
            raw.renew().unwrap();
        }
    }) / renewals as f64;
    let handle = best(repeat, || {
        for _ in 0..renewals {
            drop(std::hint::black_box(Handle::new().unwrap()));
        }
    }) / renewals as f64;
    println!(
        "{count} JPEGs cut from real photos, 224 px centre crops, one thread, best of {repeat}"
    );
    println!(
        "  per image, the whole path (prepare_image): {:8.2} us",
        decode * 1e6
    );
    println!(
        "  new libjpeg decompressor (raw planes):      {:8.3} us = {:.2} % of an image",
        renew * 1e6,
        100.0 * renew / decode
    );
    println!(
        "  new TurboJPEG handle (EXIF-rotated images): {:8.3} us = {:.2} % of an image",
        handle * 1e6,
        100.0 * handle / decode
    );
}
