//! A clip decoded at its sampled frames only: only the packets they need are decoded, and only
//! they are converted from the decoder's YUV to RGB (swscale, at the coded size), turned
//! upright and resized (the image kinds' resizer) straight into the caller's buffer.
//!
//! Frame `n` is the frame with the `n`-th smallest presentation time, counted from the stream's
//! first (the `n`-th the decoder outputs, where frames have no distinct times): sampling is by
//! frame number, as `qwen-vl-utils` and transformers sample.
//! One decoder per clip on one thread: clips decode in parallel, each on its own worker.
//!
//! Only the packets the sampled frames need are decoded (`frame_index`): from the keyframe
//! before each, skipping the non-reference frames that are not sampled. Not yet here (issue
//! 54): byte-range reads (the clip is in memory, so packets are dropped rather than seeked
//! past).

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use crate::error::Reason;
use crate::image::convolve::Kernel;
use crate::image::decode::{Pixels, Rgb};
use crate::image::resize::{CropBox, Transformer};

use super::ffmpeg::input::NO_TIME;
use super::ffmpeg::{code, ffmpeg, field, Ffmpeg, FfmpegUnavailable, Input, StreamInfo};
use super::frame_index::{Action, FrameIndex, Packet};

/// AV_PIX_FMT_RGB24.
const RGB24: c_int = 2;
/// SWS_BICUBIC: FFmpeg's CLI scaler's (here it upsamples the chroma planes only).
const SWS_BICUBIC: c_int = 4;
/// SWS_CS_DEFAULT (BT.601), and the AVColorSpace values swscale has coefficients for.
const CS_DEFAULT: c_int = 5;
/// AVDISCARD_DEFAULT and AVDISCARD_NONREF: the decoder's skip_frame settings.
const DISCARD_DEFAULT: i64 = 0;
const DISCARD_NONREF: i64 = 8;
/// AVCOL_RANGE_JPEG: full-range YUV.
const RANGE_FULL: c_int = 2;

/// Limits checked from the stream header before anything is decoded (and on every frame).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Most pixels of one coded frame (width x height).
    pub max_pixels: u64,
    /// Most seconds of a clip (0.0: no cap).
    pub max_seconds: f64,
}

impl Caps {
    pub fn check_pixels(&self, width: u64, height: u64) -> Result<(), VideoFault> {
        if width.saturating_mul(height) > self.max_pixels {
            return Err(VideoFault::TooManyPixels {
                width,
                height,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }

    pub fn check_seconds(&self, seconds: f64) -> Result<(), VideoFault> {
        if self.max_seconds > 0.0 && seconds > self.max_seconds {
            return Err(VideoFault::TooLong {
                seconds,
                max_seconds: self.max_seconds,
            });
        }
        Ok(())
    }
}

/// Why a clip yields no frames.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum VideoFault {
    /// No usable FFmpeg in this process: the environment's fault, never a sample's.
    #[error(transparent)]
    Unavailable(#[from] FfmpegUnavailable),
    /// The container does not open or parse, is truncated, or a packet does not decode.
    #[error("{0}")]
    Corrupt(String),
    #[error("the file holds no video stream")]
    NoVideoStream,
    #[error("the video stream's codec {0:?} has no decoder in this FFmpeg")]
    UnsupportedCodec(String),
    #[error("a frame of {width}x{height} is over max_pixels={max_pixels}")]
    TooManyPixels {
        width: u64,
        height: u64,
        max_pixels: u64,
    },
    #[error("the clip lasts {seconds:.3} s, over max_seconds={max_seconds}")]
    TooLong { seconds: f64, max_seconds: f64 },
    #[error("frame {index} was asked for, but the clip ends after {frames} decoded frames")]
    PastTheEnd { index: u32, frames: u64 },
}

impl VideoFault {
    /// The skip reason a loader counts this under (None: not the sample's fault).
    pub fn reason(&self) -> Option<Reason> {
        match self {
            VideoFault::Unavailable(_) => None,
            VideoFault::Corrupt(_) | VideoFault::PastTheEnd { .. } => Some(Reason::CorruptVideo),
            VideoFault::NoVideoStream => Some(Reason::NoVideoStream),
            VideoFault::UnsupportedCodec(_) => Some(Reason::UnsupportedCodec),
            VideoFault::TooManyPixels { .. } => Some(Reason::TooManyPixels),
            VideoFault::TooLong { .. } => Some(Reason::VideoTooLong),
        }
    }
}

/// Sampled frames, decoded: `pixels` is `uint8 [len(indices), 3, height, width]` (TorchCodec's
/// layout, and the CLIP clips'), frame `i` of the output being the clip's frame `indices[i]`.
#[derive(Debug)]
pub struct Frames {
    pub info: StreamInfo,
    pub height: u32,
    pub width: u32,
    pub pixels: Vec<u8>,
    /// Frames the decoder output: the sampled ones and the references they needed (skipped
    /// non-reference frames and dropped packets are not decoded): the work per frame sampled.
    pub frames_decoded: u64,
}

/// What the stream header says of `bytes` (opens the container; decodes no frame).
pub fn probe(bytes: &[u8], caps: &Caps) -> Result<StreamInfo, VideoFault> {
    Ok(Input::open(ffmpeg()?, bytes, caps)?.info.clone())
}

/// Decodes the frames `indices` (any order, repeats allowed) of the clip in `bytes`, each
/// converted to RGB and resized to `size` = (height, width) in its displayed orientation (the
/// displayed size where None), turned as its display matrix says.
///
/// A demux pass first numbers the frames by presentation time and plans which packets the
/// sampled ones need ([`FrameIndex`]); where frames have no distinct times, they are numbered
/// in the order the decoder outputs them, decoding every frame up to the last sampled one.
pub fn decode_frames(
    bytes: &[u8],
    indices: &[u32],
    size: Option<(u32, u32)>,
    caps: &Caps,
) -> Result<Frames, VideoFault> {
    let ff = ffmpeg()?;
    let index = scan(&Input::open(ff, bytes, caps)?);
    let input = Input::open(ff, bytes, caps)?;
    let info = input.info.clone();
    let (height, width) = size.unwrap_or((info.height, info.width));
    if height == 0 || width == 0 {
        return Err(VideoFault::Corrupt(format!(
            "an output size of {height}x{width} holds no pixel"
        )));
    }
    let mut out = Delivery::new(indices, height as usize * width as usize * 3);
    let mut frames = Frames {
        info,
        height,
        width,
        pixels: Vec::new(),
        frames_decoded: 0,
    };
    if indices.is_empty() {
        return Ok(frames);
    }
    let mut convert = Converter::new(ff, frames.info.rotation, (height, width));
    let mut decoder = Decoder::open(&input)?;
    let result = match &index {
        Some(index) => decode_indexed(&input, &mut decoder, index, &mut out, &mut convert, caps),
        None => decode_in_order(&input, &mut decoder, &mut out, &mut convert, caps),
    };
    convert.release();
    frames.frames_decoded = result?;
    frames.pixels = out.finish(index.as_ref().map(FrameIndex::frames))?;
    Ok(frames)
}

/// The video stream's packets, timestamps and keyframe flags only (a demux pass); None where
/// they cannot number the frames.
fn scan(input: &Input<'_>) -> Option<FrameIndex> {
    let ff = input.ff;
    let (f, l) = (&ff.f, ff.layout);
    let mut packets = Vec::new();
    // SAFETY: a packet of our own, unreferenced after each read.
    unsafe {
        let mut packet = (f.av_packet_alloc)();
        if packet.is_null() {
            return None;
        }
        while (f.av_read_frame)(input.format, packet) >= 0 {
            if field::<c_int>(packet, l.packet_stream_index) == input.stream_index {
                packets.push(Packet {
                    pts: field(packet, l.packet_pts),
                    key: field::<c_int>(packet, l.packet_flags) & 1 != 0,
                });
            }
            (f.av_packet_unref)(packet);
        }
        (f.av_packet_free)(&mut packet);
    }
    FrameIndex::new(packets, NO_TIME)
}

/// Checks a decoded frame against the pixel cap.
fn check_frame(ff: &Ffmpeg, frame: *mut c_void, caps: &Caps) -> Result<(), VideoFault> {
    // SAFETY: a frame the decoder just output, live for this call.
    let (w, h): (c_int, c_int) = unsafe {
        (
            field(frame, ff.layout.frame_width),
            field(frame, ff.layout.frame_height),
        )
    };
    caps.check_pixels(w.max(0) as u64, h.max(0) as u64)
}

/// Every frame decoded in output order, frame `n` the `n`-th: for streams without distinct
/// timestamps. Returns the frames decoded.
fn decode_in_order(
    input: &Input<'_>,
    decoder: &mut Decoder,
    out: &mut Delivery,
    convert: &mut Converter,
    caps: &Caps,
) -> Result<u64, VideoFault> {
    let mut decoded = 0u64;
    let last = out.last();
    decoder.each_frame(
        input,
        |_| Action::Decode,
        |frame| {
            check_frame(input.ff, frame, caps)?;
            out.deliver(decoded as u32, frame, convert)?;
            decoded += 1;
            Ok(decoded <= last as u64)
        },
    )?;
    Ok(decoded)
}

/// The planned packets only, frames numbered by their presentation time. Returns the frames
/// decoded.
fn decode_indexed(
    input: &Input<'_>,
    decoder: &mut Decoder,
    index: &FrameIndex,
    out: &mut Delivery,
    convert: &mut Converter,
    caps: &Caps,
) -> Result<u64, VideoFault> {
    let ff = input.ff;
    let mut wanted = out.numbers();
    wanted.retain(|&n| (n as usize) < index.frames());
    let plan = index.plan(&wanted);
    let mut decoded = 0u64;
    decoder.each_frame(
        input,
        |position| plan.get(position).copied().unwrap_or(Action::Drop),
        |frame| {
            check_frame(ff, frame, caps)?;
            decoded += 1;
            // SAFETY: a frame the decoder just output.
            let time: i64 = unsafe { field(frame, ff.layout.frame_best_effort_timestamp) };
            if let Some(n) = index.frame_at(time) {
                out.deliver(n, frame, convert)?;
            }
            Ok(out.remaining() > 0)
        },
    )?;
    Ok(decoded)
}

/// Where each sampled frame goes in the output, and which have arrived.
struct Delivery {
    /// (frame number, output slot), sorted.
    wanted: Vec<(u32, usize)>,
    arrived: Vec<bool>,
    remaining: usize,
    frame_bytes: usize,
    pixels: Vec<u8>,
}

impl Delivery {
    fn new(indices: &[u32], frame_bytes: usize) -> Self {
        let mut wanted: Vec<(u32, usize)> = indices.iter().copied().zip(0..).collect();
        wanted.sort_unstable();
        Delivery {
            arrived: vec![false; wanted.len()],
            remaining: wanted.len(),
            wanted,
            frame_bytes,
            pixels: vec![0u8; indices.len() * frame_bytes],
        }
    }

    fn last(&self) -> u32 {
        self.wanted.last().map_or(0, |w| w.0)
    }

    fn remaining(&self) -> usize {
        self.remaining
    }

    /// The distinct frame numbers asked for, ascending.
    fn numbers(&self) -> Vec<u32> {
        let mut numbers: Vec<u32> = self.wanted.iter().map(|w| w.0).collect();
        numbers.dedup();
        numbers
    }

    /// Converts `frame` (the clip's frame `n`) into each slot that asked for it, once.
    fn deliver(
        &mut self,
        n: u32,
        frame: *mut c_void,
        convert: &mut Converter,
    ) -> Result<(), VideoFault> {
        let from = self.wanted.partition_point(|w| w.0 < n);
        let bytes = self.frame_bytes;
        let mut first: Option<usize> = None;
        for i in from..self.wanted.len() {
            if self.wanted[i].0 != n || self.arrived[i] {
                break;
            }
            let at = self.wanted[i].1 * bytes;
            match first {
                None => convert.frame(frame, &mut self.pixels[at..at + bytes])?,
                Some(src) => self.pixels.copy_within(src..src + bytes, at),
            }
            first.get_or_insert(at);
            self.arrived[i] = true;
            self.remaining -= 1;
        }
        Ok(())
    }

    /// The pixels, once every frame has arrived; else why not (`frames`: the indexed count).
    fn finish(self, frames: Option<usize>) -> Result<Vec<u8>, VideoFault> {
        let missing = self.arrived.iter().position(|&a| !a);
        match (missing, frames) {
            (None, _) => Ok(self.pixels),
            (Some(i), Some(frames)) if self.wanted[i].0 as usize >= frames => {
                Err(VideoFault::PastTheEnd {
                    index: self.wanted[i].0,
                    frames: frames as u64,
                })
            }
            (Some(i), Some(_)) => Err(VideoFault::Corrupt(format!(
                "frame {} did not come out of the decoder",
                self.wanted[i].0
            ))),
            (Some(i), None) => Err(VideoFault::PastTheEnd {
                index: self.wanted[i].0,
                frames: self.wanted[..i]
                    .iter()
                    .filter(|w| w.0 < self.wanted[i].0)
                    .count() as u64,
            }),
        }
    }
}

/// One clip's decoder: its codec context, a packet and a frame.
struct Decoder {
    ff: &'static Ffmpeg,
    context: *mut c_void,
    packet: *mut c_void,
    frame: *mut c_void,
    /// The skip_frame setting now applied (AVDISCARD_DEFAULT or _NONREF).
    skipping: bool,
}

impl Drop for Decoder {
    fn drop(&mut self) {
        let f = &self.ff.f;
        // SAFETY: each is ours, live or null (the free functions accept null).
        unsafe {
            (f.av_frame_free)(&mut self.frame);
            (f.av_packet_free)(&mut self.packet);
            (f.avcodec_free_context)(&mut self.context);
        }
    }
}

impl Decoder {
    fn open(input: &Input<'_>) -> Result<Self, VideoFault> {
        let ff = input.ff;
        let f = &ff.f;
        // SAFETY: FFmpeg allocations checked for null; codecpar belongs to the live stream.
        unsafe {
            let d = Decoder {
                ff,
                context: (f.avcodec_alloc_context3)(input.codec),
                packet: (f.av_packet_alloc)(),
                frame: (f.av_frame_alloc)(),
                skipping: false,
            };
            if d.context.is_null() || d.packet.is_null() || d.frame.is_null() {
                return Err(VideoFault::Corrupt("out of memory for the decoder".into()));
            }
            let par: *mut c_void = field(input.stream, ff.layout.stream_codecpar);
            let ret = (f.avcodec_parameters_to_context)(d.context, par);
            if ret < 0 {
                return Err(VideoFault::Corrupt(format!(
                    "the stream's codec parameters do not apply: {}",
                    ff.error_text(ret)
                )));
            }
            // One thread per clip: the loader runs many clips at once, one per worker.
            (f.av_opt_set_int)(d.context, c"threads".as_ptr(), 1, 0);
            let ret = (f.avcodec_open2)(d.context, input.codec, null_mut());
            if ret < 0 {
                return Err(VideoFault::UnsupportedCodec(format!(
                    "{} ({})",
                    input.info.codec,
                    ff.error_text(ret)
                )));
            }
            Ok(d)
        }
    }

    /// Skips non-reference frames from the next packet on (or stops skipping).
    fn skip_non_reference(&mut self, skip: bool) {
        if skip != self.skipping {
            let value = if skip {
                DISCARD_NONREF
            } else {
                DISCARD_DEFAULT
            };
            // SAFETY: an option of every codec context, read by the decoder per frame.
            unsafe { (self.ff.f.av_opt_set_int)(self.context, c"skip_frame".as_ptr(), value, 0) };
            self.skipping = skip;
        }
    }

    /// Feeds the stream's packets as `action` says for each (by its position among the video
    /// stream's packets) and hands each output frame to `each` while it returns true. Before a
    /// run of dropped packets the decoder is drained (its held frames output) and reset, so that
    /// it starts again at the keyframe after them; at the end of the input it is drained.
    fn each_frame(
        &mut self,
        input: &Input<'_>,
        action: impl Fn(usize) -> Action,
        mut each: impl FnMut(*mut c_void) -> Result<bool, VideoFault>,
    ) -> Result<(), VideoFault> {
        let ff = self.ff;
        let f = &ff.f;
        let mut position = 0usize;
        let mut sent_since_reset = false;
        // SAFETY: the contexts are live for self and input; every packet is unreferenced
        // after it is sent.
        unsafe {
            loop {
                let ret = (f.av_read_frame)(input.format, self.packet);
                if ret < 0 {
                    // The end of the input (or a cut file): drain what the decoder holds.
                    break;
                }
                let index: c_int = field(self.packet, ff.layout.packet_stream_index);
                if index != input.stream_index {
                    (f.av_packet_unref)(self.packet);
                    continue;
                }
                let act = action(position);
                position += 1;
                if act == Action::Drop {
                    (f.av_packet_unref)(self.packet);
                    if sent_since_reset {
                        if !self.drain(&mut each)? {
                            return Ok(());
                        }
                        (f.avcodec_flush_buffers)(self.context);
                        sent_since_reset = false;
                    }
                    continue;
                }
                self.skip_non_reference(act == Action::Reference);
                let ret = (f.avcodec_send_packet)(self.context, self.packet);
                (f.av_packet_unref)(self.packet);
                sent_since_reset = true;
                if ret < 0 && ret != code::EAGAIN {
                    return Err(VideoFault::Corrupt(format!(
                        "video packet {} does not decode: {}",
                        position - 1,
                        ff.error_text(ret)
                    )));
                }
                if !self.receive(&mut each)? {
                    return Ok(());
                }
            }
            if sent_since_reset {
                self.drain(&mut each)?;
            }
        }
        Ok(())
    }

    /// Signals the end of the input and takes the frames the decoder held back.
    unsafe fn drain(
        &mut self,
        each: &mut impl FnMut(*mut c_void) -> Result<bool, VideoFault>,
    ) -> Result<bool, VideoFault> {
        self.skip_non_reference(false);
        (self.ff.f.avcodec_send_packet)(self.context, null_mut());
        self.receive(each)
    }

    /// Takes every frame the decoder has ready; false once `each` wants no more.
    unsafe fn receive(
        &mut self,
        each: &mut impl FnMut(*mut c_void) -> Result<bool, VideoFault>,
    ) -> Result<bool, VideoFault> {
        let f = &self.ff.f;
        loop {
            let ret = (f.avcodec_receive_frame)(self.context, self.frame);
            if ret == code::EAGAIN || ret == code::EOF {
                return Ok(true);
            }
            if ret < 0 {
                return Err(VideoFault::Corrupt(format!(
                    "a frame does not decode: {}",
                    self.ff.error_text(ret)
                )));
            }
            if !each(self.frame)? {
                return Ok(false);
            }
        }
    }
}

/// A decoded frame to the output: YUV (any decoder format) to RGB at its coded size by swscale
/// (in the frame's own colour matrix and range: exactly FFmpeg's conversion, which the
/// references run too), the quarter turns, then the image kinds' resize (Pillow's antialiased
/// bicubic, as torchvision's resize in qwen-vl-utils) straight into `[3, height, width]`.
struct Converter {
    ff: &'static Ffmpeg,
    sws: *mut c_void,
    rotation: u32,
    /// The output size, displayed orientation.
    height: u32,
    width: u32,
    transformer: Transformer,
    /// The colour matrix and range the swscale context was last set to (setting them rebuilds
    /// its tables: a millisecond a frame if done for each).
    colours: Option<(*mut c_void, c_int, c_int)>,
    /// The frame as RGB [h, w, 3] at its coded size, and turned upright.
    coded: Vec<u8>,
    upright: Vec<u8>,
}

impl Converter {
    fn new(ff: &'static Ffmpeg, rotation: u32, (height, width): (u32, u32)) -> Self {
        Converter {
            ff,
            sws: null_mut(),
            rotation,
            height,
            width,
            transformer: Transformer::new(),
            colours: None,
            coded: Vec::new(),
            upright: Vec::new(),
        }
    }

    fn release(&mut self) {
        // SAFETY: ours or null (sws_freeContext accepts null).
        unsafe { (self.ff.f.sws_freeContext)(self.sws) };
        self.sws = null_mut();
    }

    /// Writes `frame` as RGB [3, height, width] into `out`.
    fn frame(&mut self, frame: *mut c_void, out: &mut [u8]) -> Result<(), VideoFault> {
        let (w, h) = self.convert_rgb(frame)?;
        let (w, h) = if self.rotation == 0 {
            std::mem::swap(&mut self.coded, &mut self.upright);
            (w, h)
        } else {
            self.upright.resize(self.coded.len(), 0);
            turn(
                &self.coded,
                h as usize,
                w as usize,
                self.rotation,
                &mut self.upright,
            );
            if self.rotation == 180 {
                (w, h)
            } else {
                (h, w)
            }
        };
        if (w, h) == (self.width, self.height) {
            let n = w as usize * h as usize;
            let (r, rest) = out.split_at_mut(n);
            let (g, b) = rest.split_at_mut(n);
            let planes = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut());
            for (((r, g), b), px) in planes.zip(self.upright.chunks_exact(3)) {
                (*r, *g, *b) = (px[0], px[1], px[2]);
            }
            return Ok(());
        }
        let rgb = Pixels::Rgb(Rgb {
            width: w,
            height: h,
            pixels: &self.upright,
        });
        let whole = CropBox {
            x: 0.0,
            y: 0.0,
            w: w as f64,
            h: h as f64,
        };
        self.transformer
            .resize_into_planar(&rgb, whole, (self.width, self.height), Kernel::Bicubic, out)
            .map_err(|e| VideoFault::Corrupt(format!("resizing a {w}x{h} frame: {}", e.detail)))
    }

    /// The frame as RGB [h, w, 3] in `self.coded`, at its coded size: (w, h).
    fn convert_rgb(&mut self, frame: *mut c_void) -> Result<(u32, u32), VideoFault> {
        let l = self.ff.layout;
        let f = &self.ff.f;
        // SAFETY: frame is a live decoded AVFrame; the destination holds h x w x 3 bytes.
        unsafe {
            let (w, h, format): (c_int, c_int, c_int) = (
                field(frame, l.frame_width),
                field(frame, l.frame_height),
                field(frame, l.frame_format),
            );
            if w <= 0 || h <= 0 {
                return Err(VideoFault::Corrupt(format!("a decoded frame of {w}x{h}")));
            }
            self.sws = (f.sws_getCachedContext)(
                self.sws,
                w,
                h,
                format,
                w,
                h,
                RGB24,
                SWS_BICUBIC,
                null_mut(),
                null_mut(),
                std::ptr::null(),
            );
            if self.sws.is_null() {
                return Err(VideoFault::Corrupt(format!(
                    "frames of pixel format {format} at {w}x{h} cannot be converted to RGB"
                )));
            }
            // The frame's own matrix and range (BT.709 HD, full-range JPEG-style), not
            // swscale's BT.601 limited-range default.
            let space: c_int = field(frame, l.frame_colorspace);
            let range: c_int = field(frame, l.frame_color_range);
            let space = if (1..=10).contains(&space) && space != 2 {
                space
            } else {
                CS_DEFAULT
            };
            if self.colours != Some((self.sws, space, range)) {
                (f.sws_setColorspaceDetails)(
                    self.sws,
                    (f.sws_getCoefficients)(space),
                    (range == RANGE_FULL) as c_int,
                    (f.sws_getCoefficients)(CS_DEFAULT),
                    1,
                    0,
                    1 << 16,
                    1 << 16,
                );
                self.colours = Some((self.sws, space, range));
            }
            self.coded.resize(w as usize * h as usize * 3, 0);
            let planes = [self.coded.as_mut_ptr(), null_mut(), null_mut(), null_mut()];
            let strides = [w * 3, 0, 0, 0];
            let data = (frame as *const u8).add(l.frame_data) as *const *const u8;
            let linesize = (frame as *const u8).add(l.frame_linesize) as *const c_int;
            let rows = (f.sws_scale)(
                self.sws,
                data,
                linesize,
                0,
                h,
                planes.as_ptr(),
                strides.as_ptr(),
            );
            if rows != h {
                return Err(VideoFault::Corrupt(format!(
                    "converting a {w}x{h} frame gave {rows} rows"
                )));
            }
            Ok((w as u32, h as u32))
        }
    }
}

/// `src` (h x w RGB) turned clockwise by `rotation` degrees into `out`.
fn turn(src: &[u8], h: usize, w: usize, rotation: u32, out: &mut [u8]) {
    for y in 0..h {
        for x in 0..w {
            let (ty, tx, tw) = match rotation {
                90 => (x, h - 1 - y, h),
                180 => (h - 1 - y, w - 1 - x, w),
                _ => (w - 1 - x, y, h),
            };
            let s = (y * w + x) * 3;
            let d = (ty * tw + tx) * 3;
            out[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::turn;

    #[test]
    fn turns_are_clockwise_quarter_turns() {
        // 2x3 image, pixel value = its index.
        let src: Vec<u8> = (0..6u8).flat_map(|v| [v, v, v]).collect();
        let grey = |b: &[u8]| b.chunks(3).map(|p| p[0]).collect::<Vec<_>>();
        let mut out = vec![0; 18];
        turn(&src, 2, 3, 90, &mut out);
        // [[0,1,2],[3,4,5]] clockwise -> [[3,0],[4,1],[5,2]]
        assert_eq!(grey(&out), vec![3, 0, 4, 1, 5, 2]);
        turn(&src, 2, 3, 180, &mut out);
        assert_eq!(grey(&out), vec![5, 4, 3, 2, 1, 0]);
        turn(&src, 2, 3, 270, &mut out);
        // counter-clockwise -> [[2,5],[1,4],[0,3]]
        assert_eq!(grey(&out), vec![2, 5, 1, 4, 0, 3]);
    }
}
