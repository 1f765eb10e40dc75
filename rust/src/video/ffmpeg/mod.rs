//! FFmpeg, as the video kind uses it: found at run time (`library`), its structures reached
//! through one table of offsets per release (`layout`), and a clip's bytes opened from memory
//! as a container with its best video stream (`input`). What is decoded, and how frames become
//! pixels, is `video::decode`'s.

pub mod input;
pub mod layout;
pub mod library;

pub use input::{Input, StreamInfo};
pub use library::{ffmpeg, Ffmpeg, FfmpegUnavailable};

/// Reads a plain field at a byte offset of an FFmpeg structure.
///
/// # Safety
/// `base` points at a live structure of the loaded release, and `offset` is that release's
/// offset (from [`layout::Layout`]) of a field of type `T`.
pub(crate) unsafe fn field<T: Copy>(base: *const std::ffi::c_void, offset: usize) -> T {
    std::ptr::read_unaligned((base as *const u8).add(offset) as *const T)
}

/// FFmpeg's error codes the decoder tells apart (FFERRTAG values and AVERROR(EAGAIN) on Linux).
pub(crate) mod code {
    pub const EOF: i32 = -541_478_725;
    pub const EAGAIN: i32 = -11;
    pub const STREAM_NOT_FOUND: i32 = -1_381_258_232;
    pub const DECODER_NOT_FOUND: i32 = -1_128_613_112;
    pub const EINVAL: i32 = -22;
}
