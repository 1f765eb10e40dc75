//! FFmpeg's libraries found at run time (`dlopen`), never linked: the base wheel installs and
//! runs without FFmpeg, and nothing of FFmpeg ships inside it (the wheel stays Apache-2.0; the
//! system's FFmpeg keeps its own licence). Loaded once per process, on the first video call.
//!
//! Only the functions the decoder calls are looked up, each by name; the structures it reads
//! are reached through the offsets of [`super::layout`], chosen by the major version found.

use std::ffi::{c_char, c_double, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use super::layout::Layout;

/// The FFmpeg releases and their library majors (avutil, avcodec, avformat, swscale), newest
/// first: the order they are looked for in.
const RELEASES: [(&str, [u32; 4]); 3] = [
    ("7", [59, 61, 61, 8]),
    ("6", [58, 60, 60, 7]),
    ("5", [57, 59, 59, 6]),
];

/// Why no FFmpeg could be used: the environment's fault, not a sample's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FfmpegUnavailable {
    #[error(
        "no FFmpeg 5, 6 or 7 shared libraries found (looked for libavformat.so.59/.60/.61 and \
         their libavcodec, libavutil and libswscale on the loader's path, LD_LIBRARY_PATH \
         included): install them (Debian/Ubuntu: apt install ffmpeg) to decode video"
    )]
    NotFound,
    #[error(
        "FFmpeg {release} found ({library}), but this build of shardstream decodes video with \
         FFmpeg 5 only so far (libavformat.so.59): install FFmpeg 5's libraries beside it"
    )]
    UnsupportedRelease { release: String, library: String },
    #[error("FFmpeg {release}'s {library} lacks the function {symbol}")]
    MissingSymbol {
        release: String,
        library: String,
        symbol: String,
    },
}

/// An opened shared library (kept open for the process: the function pointers point into it).
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is an opaque token the loader allows on any thread.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

fn open(name: &str) -> Option<Handle> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlopen with a NUL-terminated name; a null return is checked.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    (!h.is_null()).then_some(Handle(h))
}

macro_rules! ffmpeg_functions {
    ($( $lib:ident { $( $name:ident : fn($($arg:ty),*) $(-> $ret:ty)?; )* } )*) => {
        /// The FFmpeg functions the decoder calls, looked up once.
        #[allow(non_snake_case)]
        pub struct Functions {
            $( $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )* )*
        }

        fn look_up(release: &str, handles: &Handles) -> Result<Functions, FfmpegUnavailable> {
            Ok(Functions { $( $( $name: {
                let symbol = concat!(stringify!($name), "\0");
                // SAFETY: dlsym on a live handle with a NUL-terminated name.
                let p = unsafe { libc::dlsym(handles.$lib.0, symbol.as_ptr() as *const c_char) };
                if p.is_null() {
                    return Err(FfmpegUnavailable::MissingSymbol {
                        release: release.to_string(),
                        library: stringify!($lib).to_string(),
                        symbol: stringify!($name).to_string(),
                    });
                }
                // SAFETY: the symbol is FFmpeg's function of this name, whose C signature the
                // declaration above copies from the release's headers.
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p) }
            }, )* )* })
        }
    };
}

type Ptr = *mut c_void;
pub type ReadPacket = unsafe extern "C" fn(Ptr, *mut u8, c_int) -> c_int;
pub type Seek = unsafe extern "C" fn(Ptr, i64, c_int) -> i64;

ffmpeg_functions! {
    avutil {
        av_malloc: fn(usize) -> Ptr;
        av_free: fn(Ptr);
        av_frame_alloc: fn() -> Ptr;
        av_frame_free: fn(*mut Ptr);
        av_strerror: fn(c_int, *mut c_char, usize) -> c_int;
        av_display_rotation_get: fn(*const i32) -> c_double;
        av_opt_set_int: fn(Ptr, *const c_char, i64, c_int) -> c_int;
        av_log_set_level: fn(c_int);
    }
    avcodec {
        avcodec_alloc_context3: fn(Ptr) -> Ptr;
        avcodec_parameters_to_context: fn(Ptr, Ptr) -> c_int;
        avcodec_open2: fn(Ptr, Ptr, *mut Ptr) -> c_int;
        avcodec_send_packet: fn(Ptr, Ptr) -> c_int;
        avcodec_receive_frame: fn(Ptr, Ptr) -> c_int;
        avcodec_free_context: fn(*mut Ptr);
        avcodec_flush_buffers: fn(Ptr);
        avcodec_get_name: fn(c_int) -> *const c_char;
        av_packet_alloc: fn() -> Ptr;
        av_packet_free: fn(*mut Ptr);
        av_packet_unref: fn(Ptr);
    }
    avformat {
        avformat_version: fn() -> c_uint;
        avformat_alloc_context: fn() -> Ptr;
        avformat_open_input: fn(*mut Ptr, *const c_char, Ptr, *mut Ptr) -> c_int;
        avformat_find_stream_info: fn(Ptr, *mut Ptr) -> c_int;
        av_find_best_stream: fn(Ptr, c_int, c_int, c_int, *mut Ptr, c_int) -> c_int;
        av_read_frame: fn(Ptr, Ptr) -> c_int;
        avformat_close_input: fn(*mut Ptr);
        avio_alloc_context: fn(*mut u8, c_int, c_int, Ptr, Option<ReadPacket>, Ptr, Option<Seek>) -> Ptr;
        avio_context_free: fn(*mut Ptr);
        av_stream_get_side_data: fn(Ptr, c_int, *mut usize) -> *mut u8;
    }
    swscale {
        sws_getCachedContext: fn(Ptr, c_int, c_int, c_int, c_int, c_int, c_int, c_int, Ptr, Ptr, *const c_double) -> Ptr;
        sws_scale: fn(Ptr, *const *const u8, *const c_int, c_int, c_int, *const *mut u8, *const c_int) -> c_int;
        sws_freeContext: fn(Ptr);
        sws_getCoefficients: fn(c_int) -> *const c_int;
        sws_setColorspaceDetails: fn(Ptr, *const c_int, c_int, *const c_int, c_int, c_int, c_int, c_int) -> c_int;
    }
}

struct Handles {
    avutil: Handle,
    avcodec: Handle,
    avformat: Handle,
    swscale: Handle,
}

/// FFmpeg, loaded: its release, the structure offsets of that release and its functions.
pub struct Ffmpeg {
    /// "5", "6" or "7".
    pub release: &'static str,
    pub layout: &'static Layout,
    pub f: Functions,
    _handles: Handles,
}

/// The newest release this build has a layout for whose libavformat `present` finds; else
/// why none: a release found that has no layout (named, so the user knows what to install
/// beside it), or none found. A newer release without a layout never hides an older one with.
fn pick_release(
    present: impl Fn(u32) -> bool,
) -> Result<(&'static str, [u32; 4], &'static Layout), FfmpegUnavailable> {
    let mut unsupported = None;
    for (release, majors) in RELEASES {
        if !present(majors[2]) {
            continue;
        }
        match Layout::for_avformat_major(majors[2]) {
            Some(layout) => return Ok((release, majors, layout)),
            None => {
                unsupported.get_or_insert(FfmpegUnavailable::UnsupportedRelease {
                    release: release.to_string(),
                    library: format!("libavformat.so.{}", majors[2]),
                });
            }
        }
    }
    Err(unsupported.unwrap_or(FfmpegUnavailable::NotFound))
}

fn load() -> Result<Ffmpeg, FfmpegUnavailable> {
    let (release, [util, codec, format, scale], layout) = pick_release(|major| {
        // Looked for, then closed: only the release picked stays loaded.
        open(&format!("libavformat.so.{major}"))
            // SAFETY: a handle dlopen just returned, closed once.
            .map(|h| unsafe { libc::dlclose(h.0) })
            .is_some()
    })?;
    let library = format!("libavformat.so.{format}");
    let missing = |lib: String| FfmpegUnavailable::MissingSymbol {
        release: release.to_string(),
        library: lib,
        symbol: "(the library itself)".to_string(),
    };
    let handles = Handles {
        avutil: open(&format!("libavutil.so.{util}"))
            .ok_or_else(|| missing(format!("libavutil.so.{util}")))?,
        avcodec: open(&format!("libavcodec.so.{codec}"))
            .ok_or_else(|| missing(format!("libavcodec.so.{codec}")))?,
        avformat: open(&library).ok_or_else(|| missing(library.clone()))?,
        swscale: open(&format!("libswscale.so.{scale}"))
            .ok_or_else(|| missing(format!("libswscale.so.{scale}")))?,
    };
    let f = look_up(release, &handles)?;
    // SAFETY: a plain getter; the major it reports must be the one the file name promised
    // (a renamed library would otherwise be read with another release's offsets).
    let major = unsafe { (f.avformat_version)() } >> 16;
    if major != format {
        return Err(FfmpegUnavailable::UnsupportedRelease {
            release: format!("with libavformat major {major}"),
            library,
        });
    }
    // Quiet: FFmpeg's own log lines would go to the training job's stderr, one per bad
    // packet; every failure is reported through our errors instead (AV_LOG_QUIET = -8).
    // SAFETY: a plain setter.
    unsafe { (f.av_log_set_level)(-8) };
    Ok(Ffmpeg {
        release,
        layout,
        f,
        _handles: handles,
    })
}

/// The process's FFmpeg, loaded on first use (and the reason, each time, if there is none).
pub fn ffmpeg() -> Result<&'static Ffmpeg, FfmpegUnavailable> {
    static LOADED: OnceLock<Result<Ffmpeg, FfmpegUnavailable>> = OnceLock::new();
    LOADED.get_or_init(load).as_ref().map_err(Clone::clone)
}

impl Ffmpeg {
    /// FFmpeg's message for an error code.
    pub fn error_text(&self, code: c_int) -> String {
        let mut buf = [0 as c_char; 128];
        // SAFETY: av_strerror writes at most buf.len() bytes, NUL-terminated.
        unsafe { (self.f.av_strerror)(code, buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated by av_strerror (it writes a fallback message on failure).
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// FFmpeg's name of a codec id ("h264", "vp9").
    pub fn codec_name(&self, codec_id: c_int) -> String {
        // SAFETY: avcodec_get_name returns a static string for any id ("unknown_codec").
        unsafe { CStr::from_ptr((self.f.avcodec_get_name)(codec_id)) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picked(found: &[u32]) -> Result<&'static str, FfmpegUnavailable> {
        pick_release(|major| found.contains(&major)).map(|(release, _, _)| release)
    }

    #[test]
    fn the_release_with_a_layout_is_picked_beside_newer_ones() {
        assert_eq!(picked(&[59]), Ok("5"));
        // FFmpeg 6 and 7 installed beside 5 (no layout yet for them): 5 is used, not refused.
        assert_eq!(picked(&[61, 60, 59]), Ok("5"));
    }

    #[test]
    fn a_release_without_a_layout_alone_is_refused_by_name() {
        assert_eq!(
            picked(&[61, 60]),
            Err(FfmpegUnavailable::UnsupportedRelease {
                release: "7".into(),
                library: "libavformat.so.61".into()
            })
        );
        assert_eq!(picked(&[]), Err(FfmpegUnavailable::NotFound));
    }
}
