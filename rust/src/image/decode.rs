//! Image decoding to RGB8, with the checks that keep hostile files harmless.
//!
//! Dimensions are read from the header and checked against `max_pixels` before any pixel
//! buffer is allocated. JPEGs are decoded by libjpeg-turbo at the smallest DCT scale
//! (1/8, 1/4, 1/2, 1) that still covers what the crop needs, as Pillow's `draft()` does:
//! a 1024 px photo headed for a 224 px crop costs a quarter of a full decode.
//! YCbCr JPEGs stored upright come out as their raw Y/Cb/Cr planes (see [`Pixels`]), so chroma
//! upsampling and colour conversion happen once per output pixel instead of once per stored one,
//! and their decode stops after the last row the crop's resize reads.
//! PNG and WebP go through the pure-Rust decoders of the `image` crate.

use std::io::Cursor;

use crate::error::Reason;
use crate::image::jpeg::{self, Colorspace, Subsampling};
use crate::image::jpeg_raw::RawDecoder;
use crate::image::resize::{self, CropBox};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
    Webp,
    Unknown,
}

impl Format {
    pub fn sniff(bytes: &[u8]) -> Format {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Format::Jpeg
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Format::Png
        } else if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Format::Webp
        } else {
            Format::Unknown
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Jpeg => "jpeg",
            Format::Png => "png",
            Format::Webp => "webp",
            Format::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub reason: Reason,
    pub detail: String,
}

impl DecodeError {
    fn corrupt(detail: impl Into<String>) -> Self {
        Self {
            reason: Reason::CorruptImage,
            detail: detail.into(),
        }
    }
}

/// What the header says, before decoding: stored size and EXIF orientation (1..=8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub format: Format,
    pub width: u32,
    pub height: u32,
    pub orientation: u8,
    /// The JPEG header, read once by the probe and reused by the decode.
    pub jpeg: Option<jpeg::Header>,
}

impl Probe {
    /// Size as displayed, after the EXIF orientation is applied.
    pub fn oriented_size(&self) -> (u32, u32) {
        if self.orientation >= 5 {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        }
    }
}

/// A decoded RGB8 image, rows packed, in the decoder's scratch memory.
pub struct Rgb<'a> {
    pub width: u32,
    pub height: u32,
    pub pixels: &'a [u8],
}

/// `count` image planes of the same size side by side: each row holds row y of plane 0, then
/// row y of plane 1, ..., each `pitch` bytes (so one resize call serves planes that share a
/// geometry). `data` may end before row `height` when the decode stopped early: it holds the
/// rows the resize reads.
#[derive(Clone, Copy)]
pub struct Planes<'a> {
    pub count: u32,
    pub width: u32,
    pub height: u32,
    pub pitch: u32,
    pub data: &'a [u8],
}

/// A JPEG's planes as stored: full-resolution luma, and for colour images Cb and Cr side by
/// side at their subsampled resolution, one chroma sample per `subsampling` luma pixels
/// (centred, as JFIF sites them); the chroma plane covers the last luma column and row even
/// when they are odd. The image is `width x height`.
#[derive(Clone, Copy)]
pub struct YCbCr<'a> {
    pub width: u32,
    pub height: u32,
    pub luma: Planes<'a>,
    pub chroma: Option<Planes<'a>>,
    pub subsampling: (u32, u32),
}

/// Decoded pixels, as displayed (EXIF orientation applied).
pub enum Pixels<'a> {
    Rgb(Rgb<'a>),
    YCbCr(YCbCr<'a>),
}

impl Pixels<'_> {
    pub fn size(&self) -> (u32, u32) {
        match self {
            Pixels::Rgb(img) => (img.width, img.height),
            Pixels::YCbCr(img) => (img.width, img.height),
        }
    }
}

/// Per-thread decoder state: the libjpeg-turbo handles (headers; raw planes) and reusable pixel
/// buffers, so the per-sample path allocates little once warmed up. No image's tables or state
/// reach the next image's decode (see `decode_jpeg_packed` and jpeg_raw.c).
pub struct Decoder {
    jpeg: Option<jpeg::Handle>,
    raw: Option<RawDecoder>,
    pixels: Vec<u8>,
    oriented: Vec<u8>,
}

/// Where the planes of a raw JPEG decode lie in `Decoder::pixels`.
#[derive(Clone, Copy)]
struct PlanesLayout {
    width: u32,
    height: u32,
    luma: PlaneSpan,
    chroma: Option<PlaneSpan>,
    subsampling: (u32, u32),
}

#[derive(Clone, Copy)]
struct PlaneSpan {
    width: u32,
    height: u32,
    pitch: u32,
    start: usize,
    /// Bytes of decoded rows from `start`.
    len: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

fn check_pixels(width: u32, height: u32, max_pixels: u64) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::corrupt(format!(
            "image has size {width}x{height}"
        )));
    }
    let pixels = width as u64 * height as u64;
    if pixels > max_pixels {
        return Err(DecodeError {
            reason: Reason::TooManyPixels,
            detail: format!("{width}x{height} = {pixels} pixels exceeds max_pixels={max_pixels}"),
        });
    }
    Ok(())
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            jpeg: None,
            raw: None,
            pixels: Vec::new(),
            oriented: Vec::new(),
        }
    }

    fn jpeg(&mut self) -> Result<&mut jpeg::Handle, DecodeError> {
        handle(&mut self.jpeg)
    }

    /// Reads format, size and orientation from the header only.
    pub fn probe(&mut self, bytes: &[u8]) -> Result<Probe, DecodeError> {
        match Format::sniff(bytes) {
            Format::Jpeg => {
                let header = match self.jpeg()?.header(bytes) {
                    Ok(h) => h,
                    Err(e) => {
                        self.jpeg = None;
                        return Err(DecodeError::corrupt(format!("jpeg header: {e}")));
                    }
                };
                Ok(Probe {
                    format: Format::Jpeg,
                    width: header.width,
                    height: header.height,
                    orientation: jpeg_exif_orientation(bytes),
                    jpeg: Some(header),
                })
            }
            format @ (Format::Png | Format::Webp) => {
                let reader = ::image::ImageReader::with_format(
                    Cursor::new(bytes),
                    if format == Format::Png {
                        ::image::ImageFormat::Png
                    } else {
                        ::image::ImageFormat::WebP
                    },
                );
                let (width, height) = reader
                    .into_dimensions()
                    .map_err(|e| DecodeError::corrupt(format!("{} header: {e}", format.name())))?;
                Ok(Probe {
                    format,
                    width,
                    height,
                    orientation: 1,
                    jpeg: None,
                })
            }
            Format::Unknown => Err(DecodeError {
                reason: Reason::UnsupportedFormat,
                detail: "not a JPEG, PNG or WebP image".into(),
            }),
        }
    }

    /// Decodes for a resize of `region` (displayed coordinates, full size) to `target` pixels
    /// square: reduced by the largest power-of-two DCT factor that keeps the region at least
    /// `target` pixels on its shorter side (`target == 0` asks for full size). With `partial`,
    /// a JPEG decoded as planes stops after the last row that resize reads (the rows below are
    /// then not checked for corruption: validation decodes whole images). Applies the EXIF
    /// orientation.
    pub fn decode(
        &mut self,
        bytes: &[u8],
        probe: &Probe,
        region: CropBox,
        target: u32,
        max_pixels: u64,
        partial: bool,
    ) -> Result<Pixels<'_>, DecodeError> {
        self.decode_to(bytes, probe, region, (target, target), max_pixels, partial)
    }

    /// As [`decode`](Self::decode), for a resize to `target` = (width, height): the DCT
    /// reduction keeps the region at least that wide and that tall.
    pub fn decode_to(
        &mut self,
        bytes: &[u8],
        probe: &Probe,
        region: CropBox,
        target: (u32, u32),
        max_pixels: u64,
        partial: bool,
    ) -> Result<Pixels<'_>, DecodeError> {
        check_pixels(probe.width, probe.height, max_pixels)?;
        let (w, h) = match (probe.format, probe.jpeg) {
            (Format::Jpeg, Some(header)) => {
                let reduction = if header.lossless {
                    1
                } else {
                    dct_reduction(region, target)
                };
                let planes = probe.orientation <= 1
                    && !header.lossless
                    && matches!(header.colorspace, Colorspace::YCbCr | Colorspace::Gray)
                    && header.subsampling != Subsampling::Unknown;
                if planes {
                    let stop =
                        (partial && target.0 > 0 && target.1 > 0).then_some((region, target));
                    // As with TurboJPEG below, a failed decode leaves no state behind.
                    let layout = self
                        .decode_jpeg_planes(bytes, probe, reduction, stop)
                        .inspect_err(|_| self.raw = None)?;
                    return Ok(Pixels::YCbCr(self.planes(layout)));
                }
                self.decode_jpeg_packed(bytes, &header, reduction)?
            }
            (Format::Png | Format::Webp, _) => {
                self.decode_with_image_crate(bytes, probe, max_pixels)?
            }
            _ => unreachable!("probe rejects unknown formats and reads every JPEG header"),
        };
        if probe.orientation > 1 && probe.orientation <= 8 {
            let (ow, oh) =
                apply_orientation(&self.pixels, w, h, probe.orientation, &mut self.oriented);
            return Ok(Pixels::Rgb(Rgb {
                width: ow,
                height: oh,
                pixels: &self.oriented[..ow as usize * oh as usize * 3],
            }));
        }
        Ok(Pixels::Rgb(Rgb {
            width: w,
            height: h,
            pixels: &self.pixels[..w as usize * h as usize * 3],
        }))
    }

    /// Decodes to packed RGB in `self.pixels` (CMYK/YCCK converted); returns the size.
    fn decode_jpeg_packed(
        &mut self,
        bytes: &[u8],
        header: &jpeg::Header,
        reduction: u32,
    ) -> Result<(u32, u32), DecodeError> {
        let (w, h) = reduced(header, reduction);
        let (w, h) = (w as usize, h as usize);
        let cmyk = matches!(header.colorspace, Colorspace::Cmyk | Colorspace::Ycck);
        let channels = if cmyk { 4 } else { 3 };
        grow(&mut self.pixels, w * h * channels);
        // A new handle for every image: libjpeg-turbo keeps one image's quantization and
        // Huffman tables (and, after a failure, scan state) in a handle for the next, which
        // would then decode with them if it lacks its own (see jpeg_raw.c). The probe's handle
        // only reads headers, which those tables do not change.
        let mut handle = jpeg::Handle::new().map_err(DecodeError::corrupt)?;
        handle
            .set_reduction(reduction)
            .map_err(|e| DecodeError::corrupt(format!("jpeg scale: {e}")))?;
        handle
            .decode_packed(bytes, &mut self.pixels, (w, h), cmyk)
            .map_err(|e| DecodeError::corrupt(format!("jpeg: {e}")))?;
        if cmyk {
            // Adobe CMYK JPEGs store inverted ink values, so RGB is a product, not a difference.
            for i in 0..w * h {
                let (c, m, y, k) = (
                    self.pixels[4 * i] as u32,
                    self.pixels[4 * i + 1] as u32,
                    self.pixels[4 * i + 2] as u32,
                    self.pixels[4 * i + 3] as u32,
                );
                self.pixels[3 * i] = ((c * k + 127) / 255) as u8;
                self.pixels[3 * i + 1] = ((m * k + 127) / 255) as u8;
                self.pixels[3 * i + 2] = ((y * k + 127) / 255) as u8;
            }
        }
        Ok((w as u32, h as u32))
    }

    /// Decodes the Y plane, then Cb and Cr side by side (row by row), into `self.pixels`, raw
    /// from libjpeg. With `stop` (a region and the size it is resized to), only the rows that
    /// resize reads are decoded.
    fn decode_jpeg_planes(
        &mut self,
        bytes: &[u8],
        probe: &Probe,
        reduction: u32,
        stop: Option<(CropBox, (u32, u32))>,
    ) -> Result<PlanesLayout, DecodeError> {
        let corrupt = |e: String| DecodeError::corrupt(format!("jpeg: {e}"));
        if self.raw.is_none() {
            self.raw = Some(RawDecoder::new().map_err(DecodeError::corrupt)?);
        }
        let raw = self.raw.as_mut().expect("created above");
        let started = raw.start(bytes, reduction).map_err(corrupt)?;
        let g = started.geometry;
        let (width, height) = (g.width as u32, g.height as u32);
        let color = g.components == 3;
        let pitch = |c: usize| g.plane_stride[c] as usize;
        let rows_of = |c: usize| g.plane_rows[c] as usize;
        let luma_len = pitch(0) * rows_of(0);
        // Cb and Cr rows interleaved: one resize pass serves both (see `Planes`).
        let chroma_len = if color { 2 * pitch(1) * rows_of(1) } else { 0 };
        let subsampling = if color {
            (g.plane_h_ratio[1] as u32, g.plane_v_ratio[1] as u32)
        } else {
            (1, 1)
        };
        // What the resize will read of each plane: rows below it need no decoding at all, and
        // blocks outside it no IDCT. A file that does not end with its end marker may be
        // truncated: it is decoded whole, so that a missing tail is reported even when the crop
        // does not reach it.
        let windows = stop
            .filter(|_| bytes.ends_with(&[0xFF, 0xD9]))
            .map(|(region, size)| {
                let scaled = region.rescaled((probe.width, probe.height), (width, height));
                let plane = |c: usize| (g.plane_width[c] as u32, g.plane_height[c] as u32);
                let (luma, chroma) = resize::planes_windows(
                    scaled,
                    size,
                    plane(0),
                    color.then(|| (plane(1), subsampling)),
                );
                let chroma = chroma.unwrap_or_default();
                [luma, chroma, chroma]
            });
        let stop_row = windows.map(|[luma, chroma, _]| luma.y.1.max(chroma.y.1 * subsampling.1));
        grow(&mut self.pixels, luma_len + chroma_len);
        let planes = [
            (0, pitch(0)),
            (luma_len, 2 * pitch(1)),
            (luma_len + pitch(1), 2 * pitch(1)),
        ];
        let rows = started
            .read(&mut self.pixels, planes, stop_row, windows)
            .map_err(corrupt)? as usize;
        let span = |c: usize, start: usize, count: u32| {
            let pitch = pitch(c);
            // Whole rows of MCUs: the plane rows under the output rows decoded.
            let rows_done = rows
                .div_ceil(g.plane_v_ratio[c] as usize)
                .min(g.plane_height[c] as usize);
            PlaneSpan {
                width: g.plane_width[c] as u32,
                height: g.plane_height[c] as u32,
                pitch: pitch as u32,
                start,
                len: rows_done * pitch * count as usize,
            }
        };
        Ok(PlanesLayout {
            width,
            height,
            luma: span(0, 0, 1),
            chroma: color.then(|| span(1, luma_len, 2)),
            subsampling,
        })
    }

    /// Views the planes [`decode_jpeg_planes`](Self::decode_jpeg_planes) left in `self.pixels`.
    fn planes(&self, layout: PlanesLayout) -> YCbCr<'_> {
        let view = |span: PlaneSpan, count: u32| Planes {
            count,
            width: span.width,
            height: span.height,
            pitch: span.pitch,
            data: &self.pixels[span.start..][..span.len],
        };
        YCbCr {
            width: layout.width,
            height: layout.height,
            luma: view(layout.luma, 1),
            chroma: layout.chroma.map(|span| view(span, 2)),
            subsampling: layout.subsampling,
        }
    }

    fn decode_with_image_crate(
        &mut self,
        bytes: &[u8],
        probe: &Probe,
        max_pixels: u64,
    ) -> Result<(u32, u32), DecodeError> {
        let mut reader = ::image::ImageReader::with_format(
            Cursor::new(bytes),
            if probe.format == Format::Png {
                ::image::ImageFormat::Png
            } else {
                ::image::ImageFormat::WebP
            },
        );
        let mut limits = ::image::Limits::default();
        // 16-bit RGBA is the widest layout the decoders produce: 8 bytes a pixel.
        limits.max_alloc = Some(max_pixels.saturating_mul(8).max(1 << 20));
        reader.limits(limits);
        let img = reader.decode().map_err(|e| match e {
            ::image::ImageError::Limits(_) => DecodeError {
                reason: Reason::TooManyPixels,
                detail: e.to_string(),
            },
            ::image::ImageError::Unsupported(_) => DecodeError {
                reason: Reason::UnsupportedFormat,
                detail: e.to_string(),
            },
            _ => DecodeError::corrupt(format!("{}: {e}", probe.format.name())),
        })?;
        let rgb = img.into_rgb8();
        let (w, h) = rgb.dimensions();
        self.pixels.clear();
        self.pixels.extend_from_slice(rgb.as_raw());
        Ok((w, h))
    }
}

/// The thread's libjpeg-turbo handle for headers, created on first use (and again after a
/// failed header).
fn handle(slot: &mut Option<jpeg::Handle>) -> Result<&mut jpeg::Handle, DecodeError> {
    if slot.is_none() {
        *slot = Some(jpeg::Handle::new().map_err(DecodeError::corrupt)?);
    }
    Ok(slot.as_mut().expect("initialised above"))
}

/// The largest power-of-two reduction (1/8, 1/4, 1/2) that keeps a region whose shorter side is
/// `region_side` stored pixels at least `target` pixels, as Pillow's `draft()` chooses.
/// libjpeg-turbo has SIMD IDCTs for these factors; the other M/8 factors run its plain C code
/// and measured slower than a full-size decode here.
fn dct_reduction(region: CropBox, (tw, th): (u32, u32)) -> u32 {
    let (rw, rh) = (region.w.floor() as u32, region.h.floor() as u32);
    let mut denom = 1;
    if tw > 0 && th > 0 {
        while denom < 8 && rw.div_ceil(denom * 2) >= tw && rh.div_ceil(denom * 2) >= th {
            denom *= 2;
        }
    }
    denom
}

/// The decoded size at DCT reduction 1/`denom` (libjpeg rounds up).
fn reduced(header: &jpeg::Header, denom: u32) -> (u32, u32) {
    (header.width.div_ceil(denom), header.height.div_ceil(denom))
}

/// Makes `buf` at least `len` long. Scratch buffers only grow: resizing them to each image's
/// exact size would zero-fill (a measurable memset per sample) every time a larger one comes.
pub(crate) fn grow(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

/// Rewrites `src` (w x h RGB) into `dst` as displayed under EXIF orientation `o`.
fn apply_orientation(src: &[u8], w: u32, h: u32, o: u8, dst: &mut Vec<u8>) -> (u32, u32) {
    let (w, h) = (w as usize, h as usize);
    let (ow, oh) = if o >= 5 { (h, w) } else { (w, h) };
    grow(dst, ow * oh * 3);
    for y2 in 0..oh {
        for x2 in 0..ow {
            let (x, y) = match o {
                2 => (w - 1 - x2, y2),
                3 => (w - 1 - x2, h - 1 - y2),
                4 => (x2, h - 1 - y2),
                5 => (y2, x2),
                6 => (y2, h - 1 - x2),
                7 => (w - 1 - y2, h - 1 - x2),
                8 => (w - 1 - y2, x2),
                _ => (x2, y2),
            };
            let s = (y * w + x) * 3;
            let d = (y2 * ow + x2) * 3;
            dst[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
    (ow as u32, oh as u32)
}

/// EXIF orientation from a JPEG's APP1 segment; 1 when absent or unreadable.
pub fn jpeg_exif_orientation(bytes: &[u8]) -> u8 {
    let mut i = 2;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            return 1;
        }
        let marker = bytes[i + 1];
        if marker == 0xFF {
            i += 1;
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            return 1; // start of scan: no more metadata segments
        }
        let len = u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]) as usize;
        let seg_end = (i + 2 + len).min(bytes.len());
        if marker == 0xE1 && len >= 8 && bytes[i + 4..].starts_with(b"Exif\0\0") {
            return tiff_orientation(&bytes[i + 10..seg_end]).unwrap_or(1);
        }
        i = i + 2 + len;
    }
    1
}

fn tiff_orientation(tiff: &[u8]) -> Option<u8> {
    let le = match tiff.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let u16_at = |o: usize| -> Option<u16> {
        let b = tiff.get(o..o + 2)?;
        Some(if le {
            u16::from_le_bytes([b[0], b[1]])
        } else {
            u16::from_be_bytes([b[0], b[1]])
        })
    };
    let u32_at = |o: usize| -> Option<u32> {
        let b = tiff.get(o..o + 4)?;
        let a = [b[0], b[1], b[2], b[3]];
        Some(if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        })
    };
    let ifd = u32_at(4)? as usize;
    let count = u16_at(ifd)? as usize;
    for e in 0..count.min(512) {
        let entry = ifd + 2 + e * 12;
        if u16_at(entry)? == 0x0112 {
            let v = u16_at(entry + 8)?;
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orientation_6_rotates_clockwise() {
        // 2x1 image: red, green -> displayed as 1x2: red on top, green below after 90° CW.
        let src = [255, 0, 0, 0, 255, 0];
        let mut dst = Vec::new();
        assert_eq!(apply_orientation(&src, 2, 1, 6, &mut dst), (1, 2));
        assert_eq!(dst, vec![255, 0, 0, 0, 255, 0]);
        assert_eq!(apply_orientation(&src, 2, 1, 8, &mut dst), (1, 2));
        assert_eq!(dst, vec![0, 255, 0, 255, 0, 0]);
        assert_eq!(apply_orientation(&src, 2, 1, 2, &mut dst), (2, 1));
        assert_eq!(dst, vec![0, 255, 0, 255, 0, 0]);
    }

    #[test]
    fn pixel_limit_is_checked_before_decoding() {
        let err = check_pixels(100_000, 100_000, 1 << 26).unwrap_err();
        assert_eq!(err.reason, Reason::TooManyPixels);
        assert!(check_pixels(0, 5, 10).is_err());
    }

    #[test]
    fn unknown_bytes_are_unsupported() {
        let mut d = Decoder::new();
        assert_eq!(
            d.probe(b"GIF89a....").unwrap_err().reason,
            Reason::UnsupportedFormat
        );
        assert_eq!(
            d.probe(b"\xFF\xD8\xFF garbage").unwrap_err().reason,
            Reason::CorruptImage
        );
    }
}
