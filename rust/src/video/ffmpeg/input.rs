//! A clip's bytes opened from memory as a container (FFmpeg's libavformat over a custom I/O
//! context that reads our buffer), its best video stream chosen and checked against the caps
//! from the stream header, before any frame is decoded.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr::null_mut;

use super::library::{Ffmpeg, ReadPacket, Seek};
use super::{code, field};
use crate::video::fault::{Caps, VideoFault};

/// AVMEDIA_TYPE_VIDEO.
const MEDIA_VIDEO: c_int = 0;
/// AV_PKT_DATA_DISPLAYMATRIX.
const DISPLAY_MATRIX: c_int = 5;
/// AV_NOPTS_VALUE: "no time".
pub const NO_TIME: i64 = i64::MIN;
/// The I/O context's buffer: FFmpeg reads our bytes through it in steps of this size.
const IO_BUFFER_BYTES: usize = 64 * 1024;

/// What the stream header says of a clip (before decoding).
#[derive(Clone, Debug, PartialEq)]
pub struct StreamInfo {
    /// FFmpeg's codec name ("h264", "hevc", "vp9", "av1").
    pub codec: String,
    /// The displayed size: the coded size turned by `rotation`.
    pub width: u32,
    pub height: u32,
    /// Clockwise degrees (0, 90, 180, 270) the frames are turned by to be displayed, from the
    /// stream's display matrix, as FFmpeg's CLI and TorchCodec apply it.
    pub rotation: u32,
    /// The average frame rate (`avg_frame_rate`): the `video_fps` the samplers take.
    pub fps: f64,
    /// The frame count the container states (`nb_frames`); 0 where it states none (WebM, MKV).
    pub frames: u64,
    /// The duration in seconds (the stream's, else the container's); 0.0 where neither says.
    pub seconds: f64,
}

/// Our bytes as FFmpeg's input: a cursor the read and seek callbacks move.
struct Cursor {
    data: *const u8,
    len: usize,
    pos: usize,
}

unsafe extern "C" fn read_packet(opaque: *mut c_void, buf: *mut u8, size: c_int) -> c_int {
    // SAFETY: opaque is the Box<Cursor> an Input owns for as long as FFmpeg may call this.
    let c = unsafe { &mut *(opaque as *mut Cursor) };
    let n = (size.max(0) as usize).min(c.len - c.pos);
    if n == 0 {
        return code::EOF;
    }
    // SAFETY: both ranges are in bounds (n <= len - pos, n <= size) and do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(c.data.add(c.pos), buf, n) };
    c.pos += n;
    n as c_int
}

unsafe extern "C" fn seek(opaque: *mut c_void, offset: i64, whence: c_int) -> i64 {
    const AVSEEK_SIZE: c_int = 0x10000;
    const AVSEEK_FORCE: c_int = 0x20000;
    // SAFETY: as in read_packet.
    let c = unsafe { &mut *(opaque as *mut Cursor) };
    let whence = whence & !AVSEEK_FORCE;
    if whence == AVSEEK_SIZE {
        return c.len as i64;
    }
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => c.pos as i64,
        libc::SEEK_END => c.len as i64,
        _ => return code::EINVAL as i64,
    };
    match base.checked_add(offset) {
        Some(to) if (0..=c.len as i64).contains(&to) => {
            c.pos = to as usize;
            to
        }
        _ => code::EINVAL as i64,
    }
}

/// An opened container over borrowed bytes, with its chosen video stream.
pub struct Input<'a> {
    pub ff: &'static Ffmpeg,
    /// AVFormatContext*.
    pub format: *mut c_void,
    io: *mut c_void,
    _cursor: Box<Cursor>,
    _bytes: PhantomData<&'a [u8]>,
    /// AVStream* of the video stream, and its index.
    pub stream: *mut c_void,
    pub stream_index: c_int,
    /// The AVCodec* FFmpeg chose to decode it.
    pub codec: *mut c_void,
    pub info: StreamInfo,
}

impl Drop for Input<'_> {
    fn drop(&mut self) {
        let f = &self.ff.f;
        // SAFETY: each pointer is ours, live or null; close_input leaves a custom pb to us, and
        // FFmpeg may have swapped the I/O buffer, so the one it holds now is freed.
        unsafe {
            if !self.format.is_null() {
                (f.avformat_close_input)(&mut self.format);
            }
            if !self.io.is_null() {
                (f.av_free)(field::<*mut c_void>(self.io, self.ff.layout.io_buffer));
                (f.avio_context_free)(&mut self.io);
            }
        }
    }
}

fn corrupt(ff: &Ffmpeg, what: &str, ret: c_int) -> VideoFault {
    VideoFault::Corrupt(format!("{what}: {}", ff.error_text(ret)))
}

impl<'a> Input<'a> {
    /// Opens `bytes` as a container and chooses its video stream, refusing one over `caps`
    /// from its header.
    pub fn open(ff: &'static Ffmpeg, bytes: &'a [u8], caps: &Caps) -> Result<Self, VideoFault> {
        let f = &ff.f;
        let mut input = Self::open_container(ff, bytes)?;
        // SAFETY: the container opened; streams are read within nb_streams.
        unsafe {
            // The header's size, before find_stream_info decodes anything.
            let best = (f.av_find_best_stream)(input.format, MEDIA_VIDEO, -1, -1, null_mut(), 0);
            if best >= 0 {
                input.check_pixels(input.stream_at(best), caps)?;
            }
            let ret = (f.avformat_find_stream_info)(input.format, null_mut());
            if ret < 0 {
                return Err(corrupt(ff, "the container's streams do not parse", ret));
            }
            let mut codec = null_mut();
            let index = (f.av_find_best_stream)(input.format, MEDIA_VIDEO, -1, -1, &mut codec, 0);
            if index == code::STREAM_NOT_FOUND || index == code::DECODER_NOT_FOUND {
                return Err(match input.first_video_codec() {
                    Some(name) => VideoFault::UnsupportedCodec(name),
                    None => VideoFault::NoVideoStream,
                });
            }
            if index < 0 {
                return Err(corrupt(ff, "no video stream can be chosen", index));
            }
            input.stream_index = index;
            input.stream = input.stream_at(index);
            input.codec = codec;
            input.info = input.read_info(caps)?;
            Ok(input)
        }
    }

    /// The same bytes opened again for their packets only, as `opened` chose its stream: the
    /// header read, nothing probed (`avformat_find_stream_info` decodes frames, a few
    /// milliseconds a clip). The decoder takes its parameters from `opened`, which probed them.
    /// None where the header alone does not lay out that stream as `opened` has it (a format
    /// whose streams appear while probing): open it in full.
    pub fn reopen_packets(&self, bytes: &'a [u8]) -> Result<Option<Self>, VideoFault> {
        let l = self.ff.layout;
        let mut again = Self::open_container(self.ff, bytes)?;
        // SAFETY: both containers are open; streams are read within nb_streams.
        unsafe {
            let n: u32 = field(again.format, l.format_nb_streams);
            if self.stream_index < 0 || self.stream_index as u32 >= n {
                return Ok(None);
            }
            let stream = again.stream_at(self.stream_index);
            let par = again.codecpar(stream);
            let probed = self.codecpar(self.stream);
            let same =
                |offset: usize| field::<c_int>(par, offset) == field::<c_int>(probed, offset);
            let times = |s: *mut c_void| -> (c_int, c_int) {
                (
                    field(s, l.stream_time_base),
                    field(s, l.stream_time_base + 4),
                )
            };
            if !same(l.par_codec_type)
                || !same(l.par_codec_id)
                || times(stream) != times(self.stream)
            {
                return Ok(None);
            }
            again.stream_index = self.stream_index;
            again.stream = stream;
            again.codec = self.codec;
            again.info = self.info.clone();
        }
        Ok(Some(again))
    }

    /// Opens `bytes` as a container: its header read, no stream chosen.
    fn open_container(ff: &'static Ffmpeg, bytes: &'a [u8]) -> Result<Self, VideoFault> {
        let l = ff.layout;
        let f = &ff.f;
        let mut cursor = Box::new(Cursor {
            data: bytes.as_ptr(),
            len: bytes.len(),
            pos: 0,
        });
        // SAFETY: FFmpeg allocations checked for null; the cursor outlives the contexts (it
        // is dropped after them, in Input's field order and Drop).
        unsafe {
            let buffer = (f.av_malloc)(IO_BUFFER_BYTES) as *mut u8;
            if buffer.is_null() {
                return Err(VideoFault::Corrupt(
                    "out of memory for the I/O buffer".into(),
                ));
            }
            let opaque = &mut *cursor as *mut Cursor as *mut c_void;
            let io = (f.avio_alloc_context)(
                buffer,
                IO_BUFFER_BYTES as c_int,
                0,
                opaque,
                Some(read_packet as ReadPacket),
                null_mut(),
                Some(seek as Seek),
            );
            if io.is_null() {
                (f.av_free)(buffer as *mut c_void);
                return Err(VideoFault::Corrupt(
                    "out of memory for the I/O context".into(),
                ));
            }
            let mut input = Input {
                ff,
                format: (f.avformat_alloc_context)(),
                io,
                _cursor: cursor,
                _bytes: PhantomData,
                stream: null_mut(),
                stream_index: -1,
                codec: null_mut(),
                info: StreamInfo {
                    codec: String::new(),
                    width: 0,
                    height: 0,
                    rotation: 0,
                    fps: 0.0,
                    frames: 0,
                    seconds: 0.0,
                },
            };
            if input.format.is_null() {
                return Err(VideoFault::Corrupt(
                    "out of memory for the container".into(),
                ));
            }
            ((input.format as *mut u8).add(l.format_pb) as *mut *mut c_void).write_unaligned(io);
            // On failure avformat_open_input frees the context and nulls our pointer.
            let ret = (f.avformat_open_input)(
                &mut input.format,
                std::ptr::null(),
                null_mut(),
                null_mut(),
            );
            if ret < 0 {
                return Err(corrupt(ff, "the container does not open", ret));
            }
            Ok(input)
        }
    }

    /// AVStream* number `i` (< nb_streams).
    unsafe fn stream_at(&self, i: c_int) -> *mut c_void {
        let streams: *const *mut c_void = field(self.format, self.ff.layout.format_streams);
        *streams.add(i as usize)
    }

    unsafe fn codecpar(&self, stream: *mut c_void) -> *mut c_void {
        field(stream, self.ff.layout.stream_codecpar)
    }

    /// The codec name of the first video stream, if there is one (for an undecodable one).
    unsafe fn first_video_codec(&self) -> Option<String> {
        let l = self.ff.layout;
        let n: u32 = field(self.format, l.format_nb_streams);
        (0..n as c_int).find_map(|i| {
            let par = self.codecpar(self.stream_at(i));
            (field::<c_int>(par, l.par_codec_type) == MEDIA_VIDEO)
                .then(|| self.ff.codec_name(field(par, l.par_codec_id)))
        })
    }

    unsafe fn check_pixels(&self, stream: *mut c_void, caps: &Caps) -> Result<(), VideoFault> {
        let l = self.ff.layout;
        let par = self.codecpar(stream);
        let (w, h): (c_int, c_int) = (field(par, l.par_width), field(par, l.par_height));
        caps.check_pixels(w.max(0) as u64, h.max(0) as u64)
    }

    unsafe fn read_info(&self, caps: &Caps) -> Result<StreamInfo, VideoFault> {
        let l = self.ff.layout;
        let f = &self.ff.f;
        let s = self.stream;
        let par = self.codecpar(s);
        self.check_pixels(s, caps)?;
        let (w, h): (c_int, c_int) = (field(par, l.par_width), field(par, l.par_height));
        if w <= 0 || h <= 0 {
            return Err(VideoFault::Corrupt(
                "the video stream states no frame size".into(),
            ));
        }
        let rate = |offset: usize| {
            let (num, den): (c_int, c_int) = (field(s, offset), field(s, offset + 4));
            if den > 0 && num > 0 {
                num as f64 / den as f64
            } else {
                0.0
            }
        };
        let time_base = rate(l.stream_time_base);
        let stream_duration: i64 = field(s, l.stream_duration);
        let format_duration: i64 = field(self.format, l.format_duration);
        let seconds = if stream_duration != NO_TIME && stream_duration > 0 && time_base > 0.0 {
            stream_duration as f64 * time_base
        } else if format_duration != NO_TIME && format_duration > 0 {
            format_duration as f64 / 1e6
        } else {
            0.0
        };
        caps.check_seconds(seconds)?;
        let mut size = 0usize;
        let matrix = (f.av_stream_get_side_data)(s, DISPLAY_MATRIX, &mut size);
        let rotation = if !matrix.is_null() && size >= 36 {
            // av_display_rotation_get gives counter-clockwise degrees; displaying turns the
            // other way. Rounded to a quarter turn, as FFmpeg's CLI does.
            let ccw = (f.av_display_rotation_get)(matrix as *const i32);
            let clockwise = (-ccw).rem_euclid(360.0);
            ((clockwise / 90.0).round() as u32 % 4) * 90
        } else {
            0
        };
        let (width, height) = if rotation % 180 == 90 { (h, w) } else { (w, h) };
        let frames: i64 = field(s, l.stream_nb_frames);
        Ok(StreamInfo {
            codec: self.ff.codec_name(field(par, l.par_codec_id)),
            width: width as u32,
            height: height as u32,
            rotation,
            fps: rate(l.stream_avg_frame_rate),
            frames: frames.max(0) as u64,
            seconds,
        })
    }
}
