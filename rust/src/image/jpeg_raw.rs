//! Raw planar JPEG decoding through libjpeg's own API (the C shim in `rust/csrc/jpeg_raw.c`):
//! the stored Y/Cb/Cr planes written straight into our buffer, and a decode that stops after
//! the last row a crop needs. The rows below a centre crop of a portrait photo, or below a
//! random training crop, are then never entropy-decoded, the bulk of a JPEG decode's cost.

use std::ffi::{c_char, c_int, c_uchar, c_ulong, CStr};

use crate::image::resize::Window;

/// The most components a raw decode handles (Y, Cb, Cr).
pub const MAX_COMPONENTS: usize = 3;

/// How the started decode lays out its planes (kept in step with `ss_raw_geometry`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    pub components: c_int,
    /// Output (luma) size at the chosen reduction.
    pub width: c_int,
    pub height: c_int,
    /// Columns and rows of each plane that hold image data.
    pub plane_width: [c_int; MAX_COMPONENTS],
    pub plane_height: [c_int; MAX_COMPONENTS],
    /// Bytes per row, and rows in all, that libjpeg may write (whole blocks, whole MCU rows).
    pub plane_stride: [c_int; MAX_COMPONENTS],
    pub plane_rows: [c_int; MAX_COMPONENTS],
    /// Output pixels per plane sample, across and down (chroma subsampling at this scale).
    pub plane_h_ratio: [c_int; MAX_COMPONENTS],
    pub plane_v_ratio: [c_int; MAX_COMPONENTS],
}

impl Geometry {
    /// The planes one after another in one buffer: where each starts and its row stride (for
    /// [`Started::read`]), and the buffer's length.
    pub fn packed_planes(&self) -> ([(usize, usize); MAX_COMPONENTS], usize) {
        let mut planes = [(0, 0); MAX_COMPONENTS];
        let mut len = 0;
        for (c, plane) in planes.iter_mut().enumerate().take(self.components as usize) {
            let stride = self.plane_stride[c] as usize;
            *plane = (len, stride);
            len += stride * self.plane_rows[c] as usize;
        }
        (planes, len)
    }
}

#[repr(C)]
struct RawHandle {
    _private: [u8; 0],
}

extern "C" {
    fn ss_raw_new() -> *mut RawHandle;
    fn ss_raw_free(handle: *mut RawHandle);
    fn ss_raw_renew(handle: *mut RawHandle) -> c_int;
    fn ss_raw_message(handle: *const RawHandle) -> *const c_char;
    fn ss_raw_start(
        handle: *mut RawHandle,
        data: *const c_uchar,
        len: c_ulong,
        denom: c_int,
        geometry: *mut Geometry,
    ) -> c_int;
    fn ss_raw_read(
        handle: *mut RawHandle,
        planes: *const *mut c_uchar,
        strides: *const c_int,
        stop_row: c_int,
        windows: *const c_int,
    ) -> c_int;
    fn ss_raw_abort(handle: *mut RawHandle);
    fn ss_raw_use_libjpeg_entropy(handle: *mut RawHandle, on: c_int);
    fn ss_raw_entropy(handle: *const RawHandle) -> c_int;
}

/// Which entropy decoder decoded an image (`SS_ENTROPY_*` in `jpeg_raw.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entropy {
    /// libjpeg's: the image is not a single-scan baseline JPEG, or it was asked for.
    Libjpeg,
    /// Ours (`rust/csrc/jpeg_huffman.c`).
    Ours,
    /// Ours gave up on the data, and libjpeg's decoded the image again from its start.
    Redone,
}

/// A libjpeg decompressor for one thread's images. Each image starts from a new one (see
/// [`RawDecoder::renew`]), so no image's tables reach the next.
pub struct RawDecoder(*mut RawHandle);

// The decompressor is plain heap state with no thread affinity; one thread uses it at a time.
unsafe impl Send for RawDecoder {}

impl Drop for RawDecoder {
    fn drop(&mut self) {
        unsafe { ss_raw_free(self.0) }
    }
}

impl RawDecoder {
    pub fn new() -> Result<RawDecoder, String> {
        let handle = unsafe { ss_raw_new() };
        if handle.is_null() {
            return Err("libjpeg could not create a decompressor".into());
        }
        Ok(RawDecoder(handle))
    }

    /// A decoder whose images are entropy-decoded by libjpeg's decoder only: the reference
    /// that ours is compared against.
    pub fn with_libjpeg_entropy() -> Result<RawDecoder, String> {
        let decoder = RawDecoder::new()?;
        unsafe { ss_raw_use_libjpeg_entropy(decoder.0, 1) };
        Ok(decoder)
    }

    /// Replaces the decompressor with a new one, as every [`start`](Self::start) does first:
    /// libjpeg would keep the last image's quantization and Huffman tables for an image
    /// without its own. Public for `benches/bench_jpeg_renew.rs`, which prices it.
    pub fn renew(&mut self) -> Result<(), String> {
        if unsafe { ss_raw_renew(self.0) } != 0 {
            return Err(self.message());
        }
        Ok(())
    }

    /// Which entropy decoder decoded the last image read.
    pub fn entropy(&self) -> Entropy {
        match unsafe { ss_raw_entropy(self.0) } {
            1 => Entropy::Ours,
            2 => Entropy::Redone,
            _ => Entropy::Libjpeg,
        }
    }

    fn message(&self) -> String {
        let message = unsafe { CStr::from_ptr(ss_raw_message(self.0)) };
        message.to_string_lossy().into_owned()
    }

    /// Reads the header and starts decoding at 1/`denom` (1, 2, 4 or 8). The returned
    /// [`Started`] borrows `bytes`, which libjpeg reads from until the decode ends.
    pub fn start<'a>(&'a mut self, bytes: &'a [u8], denom: u32) -> Result<Started<'a>, String> {
        let mut geometry = Geometry::default();
        let status = unsafe {
            ss_raw_start(
                self.0,
                bytes.as_ptr(),
                bytes.len() as c_ulong,
                denom as c_int,
                &mut geometry,
            )
        };
        if status != 0 {
            return Err(self.message());
        }
        Ok(Started {
            decoder: self,
            geometry,
            finished: false,
        })
    }
}

/// A decode between its header and its pixels: the caller sizes its planes from `geometry`.
pub struct Started<'a> {
    decoder: &'a mut RawDecoder,
    pub geometry: Geometry,
    finished: bool,
}

impl Started<'_> {
    /// Decodes rows until at least `stop_row` output rows are done (`None`: the whole image)
    /// into `buf`, where plane `c` starts at byte `planes[c].0` with rows `planes[c].1` bytes
    /// apart (at least `plane_stride[c]`; planes may interleave their rows). With `windows`,
    /// only the blocks meeting plane `c`'s window become pixels: the rest of `buf` keeps what it held. Returns the output rows decoded: whole
    /// MCU rows, so possibly more than asked; all when the image ends first.
    pub fn read(
        mut self,
        buf: &mut [u8],
        planes: [(usize, usize); MAX_COMPONENTS],
        stop_row: Option<u32>,
        windows: Option<[Window; MAX_COMPONENTS]>,
    ) -> Result<u32, String> {
        let g = self.geometry;
        let mut pointers = [std::ptr::null_mut(); MAX_COMPONENTS];
        let mut strides = [0 as c_int; MAX_COMPONENTS];
        for (c, &(start, stride)) in planes.iter().enumerate().take(g.components as usize) {
            let (width, rows) = (g.plane_stride[c] as usize, g.plane_rows[c] as usize);
            assert!(
                stride >= width && stride <= c_int::MAX as usize,
                "plane {c} stride"
            );
            assert!(
                rows == 0 || start + (rows - 1) * stride + width <= buf.len(),
                "plane {c} does not fit the buffer"
            );
            // SAFETY: in bounds, as asserted.
            pointers[c] = unsafe { buf.as_mut_ptr().add(start) };
            strides[c] = stride as c_int;
        }
        let stop = stop_row.map_or(0, |r| r.clamp(1, c_int::MAX as u32) as c_int);
        // SAFETY: every row libjpeg writes (`plane_rows` rows of `plane_stride` bytes for each
        // component) lies inside `buf`, as asserted above.
        let bounds = windows.map(|w| {
            let clip = |v: u32| v.min(c_int::MAX as u32) as c_int;
            w.map(|w| [clip(w.x.0), clip(w.x.1), clip(w.y.0), clip(w.y.1)])
        });
        let bounds_ptr = bounds
            .as_ref()
            .map_or(std::ptr::null(), |b| b.as_ptr() as *const c_int);
        let rows = unsafe {
            ss_raw_read(
                self.decoder.0,
                pointers.as_ptr(),
                strides.as_ptr(),
                stop,
                bounds_ptr,
            )
        };
        self.finished = true;
        if rows < 0 {
            return Err(self.decoder.message());
        }
        Ok(rows as u32)
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        if !self.finished {
            unsafe { ss_raw_abort(self.decoder.0) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::jpeg::fixtures::solid;

    #[test]
    fn a_4_2_0_jpeg_gives_full_luma_and_half_chroma_planes() {
        let bytes = solid(40, 24, [200, 100, 50], turbojpeg::Subsamp::Sub2x2);
        let mut decoder = RawDecoder::new().unwrap();
        for (denom, (w, h)) in [(1, (40, 24)), (2, (20, 12))] {
            let started = decoder.start(&bytes, denom).unwrap();
            let g = started.geometry;
            assert_eq!((g.components, g.width, g.height), (3, w, h));
            assert_eq!(g.plane_width, [w, w / 2, w / 2]);
            assert_eq!(g.plane_height, [h, h / 2, h / 2]);
            assert_eq!((g.plane_h_ratio, g.plane_v_ratio), ([1, 2, 2], [1, 2, 2]));
            for c in 0..3 {
                assert!(g.plane_stride[c] >= g.plane_width[c]);
                assert!(g.plane_rows[c] >= g.plane_height[c]);
            }
            let (planes, len) = g.packed_planes();
            let mut buf = vec![0u8; len];
            let rows = started.read(&mut buf, planes, None, None).unwrap();
            assert!(rows >= h as u32);
            // Y, Cb, Cr of (200, 100, 50) (BT.601 full range, as JPEG stores it).
            for (c, want) in [(0, 124u8), (1, 85), (2, 181)] {
                let (start, stride) = planes[c];
                for y in 0..g.plane_height[c] as usize {
                    let row = &buf[start + y * stride..][..g.plane_width[c] as usize];
                    assert!(
                        row.iter().all(|v| v.abs_diff(want) <= 3),
                        "plane {c}: {row:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_decode_can_stop_after_the_rows_it_needs_and_the_decoder_is_reused() {
        let bytes = solid(16, 128, [10, 200, 30], turbojpeg::Subsamp::Sub2x2);
        let mut decoder = RawDecoder::new().unwrap();
        let started = decoder.start(&bytes, 1).unwrap();
        let (planes, len) = started.geometry.packed_planes();
        let mut buf = vec![0u8; len];
        let rows = started.read(&mut buf, planes, Some(1), None).unwrap();
        // Whole MCU rows (16 output rows for 4:2:0), far fewer than the 128.
        assert!((1..128).contains(&rows), "{rows}");
        // A decode dropped after its header is aborted, and the next one works.
        drop(decoder.start(&bytes, 1).unwrap());
        let gray = solid(24, 8, [77, 77, 77], turbojpeg::Subsamp::Gray);
        let started = decoder.start(&gray, 1).unwrap();
        assert_eq!(started.geometry.components, 1);
        let (planes, len) = started.geometry.packed_planes();
        let mut buf = vec![0u8; len];
        assert_eq!(started.read(&mut buf, planes, None, None).unwrap(), 8);
        assert!(buf[..24].iter().all(|v| v.abs_diff(77) <= 2));
    }

    #[test]
    fn bytes_that_are_not_a_jpeg_are_refused_at_the_start() {
        let mut decoder = RawDecoder::new().unwrap();
        let message = decoder.start(b"\x89PNG\r\n\x1a\n not a jpeg", 1).err();
        assert!(message.is_some_and(|m| !m.is_empty()));
    }
}
