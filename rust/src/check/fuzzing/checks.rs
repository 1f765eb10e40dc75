//! What each fuzz target does with one input, and the invariants it asserts: shared by the
//! proptest driver (`check::fuzz`) and the libFuzzer targets (`fuzz/fuzz_targets`), so the two
//! check the same things. Every check returns whether the input parsed cleanly; an invariant
//! that fails panics, which both drivers report as a finding.

use std::io::{Cursor, Read};

use super::seeds::BLOCK;

/// Reads every entry; true when the stream ended cleanly.
pub fn drain_tar(bytes: &[u8], max_member: u64) -> bool {
    let mut reader = crate::read::tar::TarReader::new(bytes, 0, max_member);
    // A tar of n bytes holds at most n / 512 headers: more entries would be a loop.
    let bound = bytes.len() / BLOCK + 2;
    for _ in 0..=bound {
        match reader.next_entry() {
            Ok(Some(crate::read::tar::Entry::File(m))) => {
                assert!(m.data.len() as u64 <= max_member);
                assert!(m.offset <= bytes.len() as u64);
            }
            Ok(Some(crate::read::tar::Entry::Oversized { .. })) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
    panic!("tar reader yielded more entries than the input has blocks");
}

/// Groups every sample; true when no fault was reported.
pub fn drain_samples(reader: Box<dyn Read + Send>, len: usize) -> bool {
    let tar = crate::read::tar::TarReader::new(reader, 0, 1 << 20);
    let samples = crate::read::group::SampleReader::new(tar, 0);
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

/// Probes and decodes with a crop and target from `knob`; true when it decoded.
pub fn decode_all(decoder: &mut crate::image::decode::Decoder, bytes: &[u8], knob: u64) -> bool {
    use crate::image::resize::CropBox;
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

/// Decodes a JPEG's raw planes with our entropy decoder and with libjpeg-turbo's, at the scale
/// (1/1 to 1/8) and stop row the knob picks: both give the same planes, or both fail with the
/// same message. True when the decode succeeded.
pub fn jpeg_entropy_agrees(bytes: &[u8], knob: u64) -> bool {
    use crate::image::jpeg_raw::RawDecoder;
    thread_local! {
        static DECODERS: std::cell::RefCell<Option<(RawDecoder, RawDecoder)>> =
            const { std::cell::RefCell::new(None) };
    }
    let denom = [1, 2, 4, 8][(knob >> 48) as usize % 4];
    let stop_row = ((knob >> 50) & 0x3F) as u32; // 0: the whole image
    let max_pixels = 1 << 22;
    DECODERS.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (ours, libjpeg) = cell.get_or_insert_with(|| {
            (
                RawDecoder::new().unwrap(),
                RawDecoder::with_libjpeg_entropy().unwrap(),
            )
        });
        let a = raw_planes(ours, bytes, denom, stop_row, max_pixels);
        let b = raw_planes(libjpeg, bytes, denom, stop_row, max_pixels);
        assert!(
            a == b,
            "our entropy decoder and libjpeg's differ: {:?} against {:?}",
            a.as_ref().map(|p| p.len()),
            b.as_ref().map(|p| p.len())
        );
        a.is_ok()
    })
}

/// The raw planes of a JPEG (all in one buffer), decoded at 1/`denom` until `stop_row` (0: to
/// the end); an error when it fails or its planes would pass `max_pixels`.
pub fn raw_planes(
    decoder: &mut crate::image::jpeg_raw::RawDecoder,
    bytes: &[u8],
    denom: u32,
    stop_row: u32,
    max_pixels: usize,
) -> Result<Vec<u8>, String> {
    let started = decoder.start(bytes, denom)?;
    let (planes, len) = started.geometry.packed_planes();
    if len > max_pixels * 3 {
        return Err(format!("{len} bytes of planes"));
    }
    let mut buf = vec![0u8; len];
    let stop = (stop_row > 0).then_some(stop_row);
    started.read(&mut buf, planes, stop, None)?;
    Ok(buf)
}

/// Groups a shard's bytes into samples, through the gzip layer when they start with gzip's magic
/// (as a `.tar.gz` shard is read); true when no fault was reported.
pub fn group(bytes: &[u8]) -> bool {
    let owned = bytes.to_vec();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        // A mutated stream may decompress to far more than it holds: the cap bounds the case.
        let limited = flate2::read::MultiGzDecoder::new(Cursor::new(owned)).take(1 << 22);
        drain_samples(Box::new(limited), 1 << 22)
    } else {
        let len = owned.len();
        drain_samples(Box::new(Cursor::new(owned)), len)
    }
}

/// Decodes a manifest (and the version-sniffing `Index::from_bytes` over the same bytes); what
/// decodes must be usable: its plan input and fingerprint compute.
pub fn manifest(bytes: &[u8]) -> bool {
    let _ = crate::index::Index::from_bytes(bytes);
    match crate::index::manifest::decode(bytes) {
        Ok(ix) => {
            let _ = ix.fingerprint();
            let _ = ix.plan_input();
            let _ = ix.num_valid();
            true
        }
        Err(_) => false,
    }
}

/// Decodes one shard's detail block against the URL and sample count the manifest gave.
pub fn detail(bytes: &[u8], url: &str, num_samples: u64) -> bool {
    crate::index::detail::decode(bytes, url, num_samples).is_ok()
}

/// Reads a version-1 JSON index (plain or gzip).
pub fn json_v1(bytes: &[u8]) -> bool {
    match crate::index::Index::from_json(bytes) {
        Ok(ix) => {
            let _ = ix.fingerprint();
            let _ = ix.plan_input();
            true
        }
        Err(_) => false,
    }
}

/// A clip's bytes through the video kind's container input and decoder: opened under caps
/// (`knob` picks generous or tight ones), its frames numbered, a few sampled frames decoded
/// and fitted to 8x8. Every outcome is frames or a typed reason: never a panic, and never a
/// header over the caps that gets as far as decoding. True when the frames decoded.
pub fn video(bytes: &[u8], knob: u64) -> bool {
    use crate::video::{sampling, Caps, Clip, Fit, OpenClip};
    let caps = [
        Caps {
            max_pixels: 1 << 20,
            max_seconds: 60.0,
        },
        Caps {
            max_pixels: 64 * 48,
            max_seconds: 0.3,
        },
    ][knob as usize % 2];
    let typed = |fault: crate::video::VideoFault| {
        assert!(
            fault.reason().is_some(),
            "a clip's fault without a reason (FFmpeg missing?): {fault}"
        );
        false
    };
    let clip = match OpenClip::open(bytes, &caps) {
        Ok(clip) => clip,
        Err(fault) => return typed(fault),
    };
    let info = clip.info().clone();
    assert!(
        info.width as u64 * info.height as u64 <= caps.max_pixels,
        "a header over max_pixels was opened: {info:?}"
    );
    assert!(
        info.seconds <= caps.max_seconds,
        "a clip over max_seconds was opened: {info:?}"
    );
    // A stream whose frame count nothing states (a raw stream) is decoded in order: its first
    // three frames.
    let indices = match clip.frame_total() {
        0 => vec![0, 1, 2],
        total => {
            let clip_frames = Clip {
                total_frames: total,
                fps: 25.0,
            };
            let Ok(sampled) = sampling::uniform(clip_frames, None, None, 3) else {
                return false;
            };
            sampled.indices
        }
    };
    let mut out = vec![0u8; 3 * 8 * 8 * 3];
    match clip.decode_into(&indices, (8, 8), Fit::CentreSquare, &mut out) {
        Ok(decoded) => {
            // Each frame decoded came from a packet of the input, and every sampled one was.
            assert!(
                decoded as usize <= bytes.len(),
                "more frames than the input has bytes"
            );
            true
        }
        Err(fault) => typed(fault),
    }
}
