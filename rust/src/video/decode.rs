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

use super::convert::Converter;
pub use super::convert::Fit;
use super::fault::{Caps, VideoFault};
use super::ffmpeg::input::NO_TIME;
use super::ffmpeg::{code, ffmpeg, field, Ffmpeg, Input, StreamInfo};
use super::frame_index::{Action, FrameIndex, Packet};

/// AVDISCARD_DEFAULT and AVDISCARD_NONREF: the decoder's skip_frame settings.
const DISCARD_DEFAULT: i64 = 0;
const DISCARD_NONREF: i64 = 8;

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
/// displayed size where None), turned as its display matrix says: [`OpenClip`] into a buffer of
/// its own.
pub fn decode_frames(
    bytes: &[u8],
    indices: &[u32],
    size: Option<(u32, u32)>,
    caps: &Caps,
) -> Result<Frames, VideoFault> {
    let clip = OpenClip::open(bytes, caps)?;
    let info = clip.info().clone();
    let (height, width) = size.unwrap_or((info.height, info.width));
    let mut pixels = vec![0u8; indices.len() * height as usize * width as usize * 3];
    let frames_decoded = clip.decode_into(indices, (height, width), Fit::Whole, &mut pixels)?;
    Ok(Frames {
        info,
        height,
        width,
        pixels,
        frames_decoded,
    })
}

/// A clip opened for decoding: its container read twice, once for the demux pass that numbers
/// its frames ([`FrameIndex`]) and once to decode. Which frames to sample can then be chosen
/// from the frame count before anything is decoded.
pub struct OpenClip<'a> {
    /// The container opened in full and its packets scanned: the decoder's parameters.
    probed: Input<'a>,
    /// The container opened again for the packets to decode.
    input: Input<'a>,
    index: Option<FrameIndex>,
    caps: Caps,
}

impl<'a> OpenClip<'a> {
    /// Opens `bytes` (its header checked against `caps`) and numbers its frames.
    pub fn open(bytes: &'a [u8], caps: &Caps) -> Result<Self, VideoFault> {
        let ff = ffmpeg()?;
        let probed = Input::open(ff, bytes, caps)?;
        let index = scan(&probed);
        let input = match probed.reopen_packets(bytes)? {
            Some(input) => input,
            None => Input::open(ff, bytes, caps)?,
        };
        Ok(OpenClip {
            probed,
            input,
            index,
            caps: *caps,
        })
    }

    /// What the stream header says.
    pub fn info(&self) -> &StreamInfo {
        &self.probed.info
    }

    /// The frames the demux pass numbered; None where frames have no distinct times (a raw
    /// stream), whose count only decoding tells.
    pub fn indexed_frames(&self) -> Option<u64> {
        self.index.as_ref().map(|i| i.frames() as u64)
    }

    /// The clip's frames as far as is known before decoding: the demux pass's count, else the
    /// header's (a raw stream), else its duration times its average rate; 0: unknown.
    pub fn frame_total(&self) -> u64 {
        let info = self.info();
        self.indexed_frames().unwrap_or(match info.frames {
            0 if info.fps.is_finite() && info.seconds.is_finite() => {
                (info.seconds * info.fps).floor().max(0.0) as u64
            }
            n => n,
        })
    }

    /// Decodes the frames `indices` (any order, repeats allowed) into `out`, frame `i` at
    /// `[i, 3, height, width]`, each fitted to `size` = (height, width) by `fit` in its
    /// displayed orientation. `out` must hold `indices.len()` such frames. Returns the frames
    /// the decoder output (the sampled ones and the references they needed).
    ///
    /// Where frames have no distinct times, they are numbered in the order the decoder outputs
    /// them, decoding every frame up to the last sampled one.
    pub fn decode_into(
        self,
        indices: &[u32],
        (height, width): (u32, u32),
        fit: Fit,
        out: &mut [u8],
    ) -> Result<u64, VideoFault> {
        if height == 0 || width == 0 {
            return Err(VideoFault::Corrupt(format!(
                "an output size of {height}x{width} holds no pixel"
            )));
        }
        let frame_bytes = height as usize * width as usize * 3;
        assert_eq!(
            out.len(),
            indices.len() * frame_bytes,
            "an output of the sampled frames"
        );
        if indices.is_empty() {
            return Ok(0);
        }
        let (input, caps) = (&self.input, &self.caps);
        let mut delivery = Delivery::new(indices, frame_bytes, out);
        let mut convert = Converter::new(input.ff, input.info.rotation, (height, width), fit);
        let mut decoder = Decoder::open(&self.probed)?;
        let result = match &self.index {
            Some(index) => decode_indexed(
                input,
                &mut decoder,
                index,
                &mut delivery,
                &mut convert,
                caps,
            ),
            None => decode_in_order(input, &mut decoder, &mut delivery, &mut convert, caps),
        };
        convert.release();
        let decoded = result?;
        delivery.finish(self.index.as_ref().map(FrameIndex::frames))?;
        Ok(decoded)
    }
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
    out: &mut Delivery<'_>,
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
    out: &mut Delivery<'_>,
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
struct Delivery<'o> {
    /// (frame number, output slot), sorted.
    wanted: Vec<(u32, usize)>,
    arrived: Vec<bool>,
    remaining: usize,
    frame_bytes: usize,
    pixels: &'o mut [u8],
}

impl<'o> Delivery<'o> {
    fn new(indices: &[u32], frame_bytes: usize, pixels: &'o mut [u8]) -> Self {
        let mut wanted: Vec<(u32, usize)> = indices.iter().copied().zip(0..).collect();
        wanted.sort_unstable();
        Delivery {
            arrived: vec![false; wanted.len()],
            remaining: wanted.len(),
            wanted,
            frame_bytes,
            pixels,
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

    /// Whether every frame has arrived; else why not (`frames`: the indexed count).
    fn finish(self, frames: Option<usize>) -> Result<(), VideoFault> {
        let missing = self.arrived.iter().position(|&a| !a);
        match (missing, frames) {
            (None, _) => Ok(()),
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
    /// A decoder of `input`'s stream, with the parameters its probe found.
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
