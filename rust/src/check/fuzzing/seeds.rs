//! Real, valid inputs for the fuzz targets: the tar shards, images, index layouts and
//! checksummed blocks that writers produce. Both fuzz drivers start from these: the proptest
//! driver (`crate::check::fuzz`, in `cargo test`) mutates them, and the libFuzzer targets (`fuzz/`)
//! take them as their seed corpus.

use std::io::{Cursor, Read, Write};
use std::sync::OnceLock;

/// A tar block.
pub const BLOCK: usize = 512;

pub fn tar_header(name: &str, size: u64, typeflag: u8) -> [u8; BLOCK] {
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

pub fn tar_member(out: &mut Vec<u8>, name: &str, data: &[u8], typeflag: u8) {
    out.extend_from_slice(&tar_header(name, data.len() as u64, typeflag));
    out.extend_from_slice(data);
    out.resize(out.len() + (BLOCK - data.len() % BLOCK) % BLOCK, 0);
}

pub fn pax_record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

/// Real shards the way writers make them: plain members, a directory, PAX and GNU long names,
/// an image in a sample, end-of-archive blocks.
pub fn tar_bases() -> &'static Vec<Vec<u8>> {
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

/// How [`encode_jpeg`] encodes: libjpeg-turbo's settings that change the entropy-coded data.
#[derive(Clone, Copy, Debug)]
pub struct JpegSettings {
    pub quality: i32,
    /// `TJSAMP_*` (ignored for one-component pixels, which are always gray).
    pub subsampling: i32,
    /// A restart marker every this many MCUs (0: none).
    pub restart_blocks: i32,
    /// Huffman tables fitted to the image instead of the standard ones.
    pub optimize: bool,
    pub progressive: bool,
    /// Arithmetic entropy coding instead of Huffman.
    pub arithmetic: bool,
}

/// `pixels` (`components` = 3 for RGB, 1 for gray, rows packed) as a JPEG, by libjpeg-turbo:
/// TurboJPEG's 3.x API, as the `turbojpeg` crate has no restart markers.
pub fn encode_jpeg(pixels: &[u8], w: u32, h: u32, components: u32, s: JpegSettings) -> Vec<u8> {
    use std::ffi::c_int;
    use turbojpeg_sys as tj;
    assert_eq!(pixels.len(), (w * h * components) as usize);
    // SAFETY: the handle is checked and destroyed here; TurboJPEG allocates the output, which
    // is copied and freed before returning.
    unsafe {
        let handle = tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as c_int);
        assert!(!handle.is_null());
        let gray = components == 1;
        let subsampling = if gray {
            tj::TJSAMP_TJSAMP_GRAY
        } else {
            s.subsampling
        };
        for (param, value) in [
            (tj::TJPARAM_TJPARAM_QUALITY, s.quality),
            (tj::TJPARAM_TJPARAM_SUBSAMP, subsampling),
            (tj::TJPARAM_TJPARAM_RESTARTBLOCKS, s.restart_blocks),
            (tj::TJPARAM_TJPARAM_OPTIMIZE, s.optimize as c_int),
            (tj::TJPARAM_TJPARAM_PROGRESSIVE, s.progressive as c_int),
            (tj::TJPARAM_TJPARAM_ARITHMETIC, s.arithmetic as c_int),
        ] {
            assert_eq!(
                tj::tj3Set(handle, param as c_int, value),
                0,
                "{param} = {value}"
            );
        }
        let format = if gray {
            tj::TJPF_TJPF_GRAY
        } else {
            tj::TJPF_TJPF_RGB
        };
        let (mut out, mut size) = (std::ptr::null_mut(), 0);
        let status = tj::tj3Compress8(
            handle,
            pixels.as_ptr(),
            w as c_int,
            0,
            h as c_int,
            format,
            &mut out,
            &mut size,
        );
        assert_eq!(status, 0, "tj3Compress8");
        let bytes = std::slice::from_raw_parts(out, size as usize).to_vec();
        tj::tj3Free(out as *mut std::ffi::c_void);
        tj::tj3Destroy(handle);
        bytes
    }
}

fn encode_with_image_crate(w: u32, h: u32, format: ::image::ImageFormat) -> Vec<u8> {
    let img = ::image::RgbImage::from_raw(w, h, rgb_pattern(w, h)).unwrap();
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// Real images: JPEGs in each subsampling (the raw-plane path) plus gray, one with restart
/// markers, a progressive-free image-crate JPEG, PNG and lossless WebP.
pub fn images() -> &'static Vec<Vec<u8>> {
    static IMAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        use turbojpeg::Subsamp;
        vec![
            jpeg(40, 24, Subsamp::Sub2x2, 85),
            encode_with_image_crate(20, 12, ::image::ImageFormat::Png),
            encode_with_image_crate(18, 10, ::image::ImageFormat::WebP),
            jpeg(33, 17, Subsamp::None, 90),
            jpeg(48, 32, Subsamp::Sub2x1, 75),
            jpeg(24, 40, Subsamp::Gray, 80),
            jpeg(17, 33, Subsamp::Sub1x2, 70),
            encode_with_image_crate(16, 16, ::image::ImageFormat::Jpeg),
            encode_jpeg(
                &rgb_pattern(40, 24),
                40,
                24,
                3,
                JpegSettings {
                    quality: 90,
                    subsampling: turbojpeg_sys::TJSAMP_TJSAMP_420,
                    restart_blocks: 2,
                    optimize: false,
                    progressive: false,
                    arithmetic: false,
                },
            ),
        ]
    })
}

fn index_entry(url: &str, n: u64, bad: &[u64], keys: bool) -> crate::index::ShardEntry {
    use crate::index::{InvalidSample, ShardEntry};
    let mut e = ShardEntry::new(url, n);
    e.size = Some(n * 2048 + 1024);
    e.extra_mut().offsets = Some((0..=n).map(|i| i * 2048).collect());
    if keys {
        e.extra_mut().keys = Some((0..n).map(|i| format!("{i:05}")).collect());
    }
    e.identity = Some(format!("etag-{url}").into());
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

pub fn sample_index() -> crate::index::Index {
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

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// A block's payload (decompressed, without its closing checksum) and the inverse: checksum
/// appended, gzip, `prefix` in front: what the manifest and detail writers produce.
pub fn unwrap_checked(block: &[u8], prefix: usize) -> Vec<u8> {
    let mut inner = gunzip(&block[prefix..]);
    inner.truncate(inner.len() - 8);
    inner
}

pub fn wrap_checked(prefix: &'static [u8]) -> impl Fn(Vec<u8>) -> Vec<u8> {
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

/// One shard's detail block as a reader fetches it (by the manifest's reference), with the URL
/// and sample count it is decoded against.
pub struct DetailBlock {
    pub url: String,
    pub num_samples: u64,
    pub block: Vec<u8>,
}

/// The sample index as written: its manifest and its detail blocks.
pub struct IndexLayout {
    pub manifest: Vec<u8>,
    pub details: Vec<DetailBlock>,
}

pub fn index_layout() -> &'static IndexLayout {
    static LAYOUT: OnceLock<IndexLayout> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        let index = sample_index();
        let (manifest, detail) = index.to_layout("index.detail");
        let details = index
            .shards()
            .iter()
            .zip(crate::index::manifest::decode(&manifest).unwrap().shards())
            .filter_map(|(orig, laid)| {
                let r = laid.detail_ref?;
                let block =
                    detail[r.offset as usize..(r.offset + r.len.get() as u64) as usize].to_vec();
                Some(DetailBlock {
                    url: orig.url.clone(),
                    num_samples: orig.num_samples,
                    block,
                })
            })
            .collect();
        IndexLayout { manifest, details }
    })
}

/// Tiny real clips (64x48, half a second of FFmpeg's moving test pattern), each in a container
/// and codec the video kind reads: H.264 in MP4 (B-frames, moov first) and MPEG-TS, a raw
/// `.h264` stream (no timestamps), VP9 in WebM, HEVC in MKV, MPEG-4 Part 2 in AVI, and an MP4
/// turned 90 degrees with an AAC track. Made by FFmpeg's CLI (scripts/env.sh installs it): a
/// missing CLI fails here rather than fuzz nothing.
pub fn video_clips() -> &'static Vec<Vec<u8>> {
    static CLIPS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    CLIPS.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("shardstream-fuzz-clips-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder for the fuzz clips");
        let pattern = "testsrc2=size=64x48:rate=20:d=0.5";
        let h264 = [
            "-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-g", "6",
        ];
        let clips: [(&str, Vec<&str>); 7] = [
            (
                "h264.mp4",
                [&h264[..], &["-movflags", "+faststart"]].concat(),
            ),
            ("h264.ts", h264.to_vec()),
            ("raw.h264", [&h264[..], &["-f", "h264"]].concat()),
            (
                "vp9.webm",
                vec![
                    "-c:v",
                    "libvpx-vp9",
                    "-deadline",
                    "realtime",
                    "-cpu-used",
                    "8",
                ],
            ),
            (
                "hevc.mkv",
                vec![
                    "-c:v",
                    "libx265",
                    "-x265-params",
                    "log-level=error",
                    "-g",
                    "6",
                ],
            ),
            ("mpeg4.avi", vec!["-c:v", "mpeg4", "-g", "6"]),
            (
                "turned.mp4",
                [&h264[..], &["-metadata:s:v:0", "rotate=90", "-c:a", "aac"]].concat(),
            ),
        ];
        let out = clips
            .iter()
            .map(|(name, args)| {
                let path = dir.join(name);
                let mut cmd = std::process::Command::new("ffmpeg");
                cmd.args([
                    "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", pattern,
                ]);
                if *name == "turned.mp4" {
                    cmd.args(["-f", "lavfi", "-i", "sine=frequency=440:duration=0.5"]);
                }
                let status = cmd
                    .args(["-pix_fmt", "yuv420p"])
                    .args(args)
                    .arg(&path)
                    .status()
                    .unwrap_or_else(|e| panic!("the ffmpeg CLI makes the video seeds: {e}"));
                assert!(status.success(), "ffmpeg could not make the seed {name}");
                std::fs::read(&path).expect("a seed clip")
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        out
    })
}
