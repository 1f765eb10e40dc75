//! A decoded frame to the output slot: FFmpeg's swscale from the decoder's YUV to RGB at the
//! coded size, the quarter turns of the display matrix, and the image kinds' resize into
//! `[3, height, width]`.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use crate::image::convolve::Kernel;
use crate::image::decode::{Pixels, Rgb};
use crate::image::resize::{CropBox, Transformer};

use super::fault::VideoFault;
use super::ffmpeg::{field, Ffmpeg};

/// AV_PIX_FMT_RGB24.
const RGB24: c_int = 2;
/// SWS_BICUBIC: FFmpeg's CLI scaler's (here it upsamples the chroma planes only).
const SWS_BICUBIC: c_int = 4;
/// SWS_CS_DEFAULT (BT.601), and the AVColorSpace values swscale has coefficients for.
const CS_DEFAULT: c_int = 5;
/// AVCOL_RANGE_JPEG: full-range YUV.
const RANGE_FULL: c_int = 2;
/// swscale's SIMD output of packed RGB needs rows that start on a vector and room for whole
/// vectors: into rows of exactly `w x 3` bytes it wrote past the buffer's end (a 120-pixel
/// row: the heap corrupted) and left the last pixels of a 98-pixel row unwritten. Rows are
/// written `ROW_ALIGN`-aligned with `SWS_SLACK` bytes after the last, then packed.
const ROW_ALIGN: usize = 64;
const SWS_SLACK: usize = 256;

/// How a displayed frame fills the output size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// The whole frame, resized to the output's height and width (the Qwen path).
    Whole,
    /// The centred square of the frame's shorter side, resized to the output (a CLIP clip, as
    /// the square image kind's centre crop: torchvision's `Resize(S)` then `CenterCrop(S)`).
    CentreSquare,
}

/// A decoded frame to the output: YUV (any decoder format) to RGB at its coded size by swscale
/// (in the frame's own colour matrix and range: exactly FFmpeg's conversion, which the
/// references run too), the quarter turns, then the image kinds' resize (Pillow's antialiased
/// bicubic, as torchvision's resize in qwen-vl-utils) straight into `[3, height, width]`.
pub struct Converter {
    ff: &'static Ffmpeg,
    rotation: u32,
    /// The output size, displayed orientation.
    height: u32,
    width: u32,
    fit: Fit,
    /// This thread's contexts and buffers, lent for the clip: a clip after the first of its
    /// size on a thread allocates and faults in nothing (fresh buffers of each clip's frames
    /// were a third of the time of a clip sampled at one frame).
    s: Scratch,
}

/// What converting frames reuses from clip to clip on a thread.
#[derive(Default)]
struct Scratch {
    /// The FFmpeg that made `sws`.
    ff: Option<&'static Ffmpeg>,
    sws: *mut c_void,
    /// The colour matrix and range the swscale context was last set to (setting them rebuilds
    /// its tables: a millisecond a frame if done for each).
    colours: Option<(*mut c_void, c_int, c_int)>,
    transformer: Transformer,
    /// The frame as swscale writes it (rows `ROW_ALIGN`-aligned), as RGB [h, w, 3] at its
    /// coded size, and turned upright (where it turns).
    strided: Vec<u8>,
    coded: Vec<u8>,
    upright: Vec<u8>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(ff) = self.ff {
            // SAFETY: ours or null (sws_freeContext accepts null), freed once.
            unsafe { (ff.f.sws_freeContext)(self.sws) };
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

impl Converter {
    pub fn new(ff: &'static Ffmpeg, rotation: u32, (height, width): (u32, u32), fit: Fit) -> Self {
        let mut s = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        s.ff = Some(ff);
        Converter {
            ff,
            rotation,
            height,
            width,
            fit,
            s,
        }
    }

    /// Gives this thread's scratch back for its next clip.
    pub fn release(&mut self) {
        let s = std::mem::take(&mut self.s);
        SCRATCH.with(|slot| *slot.borrow_mut() = s);
    }

    /// Writes `frame` as RGB [3, height, width] into `out`.
    pub fn frame(&mut self, frame: *mut c_void, out: &mut [u8]) -> Result<(), VideoFault> {
        let (w, h) = self.convert_rgb(frame)?;
        let (upright, w, h): (&[u8], u32, u32) = match self.rotation {
            0 => (&self.s.coded, w, h),
            rotation => {
                self.s.upright.resize(self.s.coded.len(), 0);
                turn(
                    &self.s.coded,
                    h as usize,
                    w as usize,
                    rotation,
                    &mut self.s.upright,
                );
                match rotation {
                    180 => (&self.s.upright, w, h),
                    _ => (&self.s.upright, h, w),
                }
            }
        };
        let region = match self.fit {
            Fit::Whole => CropBox {
                x: 0.0,
                y: 0.0,
                w: w as f64,
                h: h as f64,
            },
            // As the square kind's centre crop (`image::resize::crop_box`).
            Fit::CentreSquare => {
                let side = w.min(h) as f64;
                CropBox {
                    x: (w as f64 - side) / 2.0,
                    y: (h as f64 - side) / 2.0,
                    w: side,
                    h: side,
                }
            }
        };
        if (region.w, region.h) == (w as f64, h as f64) && (w, h) == (self.width, self.height) {
            let n = w as usize * h as usize;
            let (r, rest) = out.split_at_mut(n);
            let (g, b) = rest.split_at_mut(n);
            let planes = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut());
            for (((r, g), b), px) in planes.zip(upright.chunks_exact(3)) {
                (*r, *g, *b) = (px[0], px[1], px[2]);
            }
            return Ok(());
        }
        let rgb = Pixels::Rgb(Rgb {
            width: w,
            height: h,
            pixels: upright,
        });
        self.s
            .transformer
            .resize_into_planar(
                &rgb,
                region,
                (self.width, self.height),
                Kernel::Bicubic,
                out,
            )
            .map_err(|e| VideoFault::Corrupt(format!("resizing a {w}x{h} frame: {}", e.detail)))
    }

    /// The frame as RGB [h, w, 3] in `self.s.coded`, at its coded size: (w, h).
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
            self.s.sws = (f.sws_getCachedContext)(
                self.s.sws,
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
            if self.s.sws.is_null() {
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
            if self.s.colours != Some((self.s.sws, space, range)) {
                (f.sws_setColorspaceDetails)(
                    self.s.sws,
                    (f.sws_getCoefficients)(space),
                    (range == RANGE_FULL) as c_int,
                    (f.sws_getCoefficients)(CS_DEFAULT),
                    1,
                    0,
                    1 << 16,
                    1 << 16,
                );
                self.s.colours = Some((self.s.sws, space, range));
            }
            let row = w as usize * 3;
            let stride = row.next_multiple_of(ROW_ALIGN);
            // One vector more than the rows, so that the first row can start on one.
            self.s
                .strided
                .resize(stride * h as usize + SWS_SLACK + ROW_ALIGN, 0);
            let start = self.s.strided.as_ptr().align_offset(ROW_ALIGN);
            let planes = [
                self.s.strided.as_mut_ptr().add(start),
                null_mut(),
                null_mut(),
                null_mut(),
            ];
            let strides = [stride as c_int, 0, 0, 0];
            let data = (frame as *const u8).add(l.frame_data) as *const *const u8;
            let linesize = (frame as *const u8).add(l.frame_linesize) as *const c_int;
            let rows = (f.sws_scale)(
                self.s.sws,
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
            self.s.coded.resize(row * h as usize, 0);
            let rows = self.s.strided[start..].chunks(stride);
            for (packed, strided) in self.s.coded.chunks_exact_mut(row).zip(rows) {
                packed.copy_from_slice(&strided[..row]);
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
