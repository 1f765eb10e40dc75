//! A thin safe wrapper over libjpeg-turbo's TurboJPEG 3 API: one handle, the header read once,
//! and the packed RGB/CMYK decode (for CMYK, lossless and rotated JPEGs). Upright YCbCr and
//! grayscale JPEGs are decoded as raw planes by [`crate::image::jpeg_raw`] instead.

use std::ffi::{c_int, CStr};

use turbojpeg::raw;

/// What the JPEG header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub width: u32,
    pub height: u32,
    pub subsampling: Subsampling,
    pub colorspace: Colorspace,
    pub lossless: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colorspace {
    Rgb,
    YCbCr,
    Gray,
    Cmyk,
    Ycck,
}

/// Chroma subsampling as TurboJPEG names it. The raw planar decode takes the layouts it names
/// (their planes are whole multiples of each other); the rest go through the packed decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsampling {
    Gray,
    /// 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 or 4:4:1.
    Standard,
    /// Sampling factors TurboJPEG cannot name.
    Unknown,
}

impl Subsampling {
    fn from_code(code: c_int) -> Subsampling {
        // The bindings' enum constants are u32 or i32 depending on the platform's C ABI.
        let standard = [
            raw::TJSAMP_TJSAMP_444,
            raw::TJSAMP_TJSAMP_422,
            raw::TJSAMP_TJSAMP_420,
            raw::TJSAMP_TJSAMP_440,
            raw::TJSAMP_TJSAMP_411,
            raw::TJSAMP_TJSAMP_441,
        ];
        if code == raw::TJSAMP_TJSAMP_GRAY as c_int {
            Subsampling::Gray
        } else if standard.iter().any(|&c| c as c_int == code) {
            Subsampling::Standard
        } else {
            Subsampling::Unknown
        }
    }
}

/// A TurboJPEG decompression handle.
pub struct Handle(raw::tjhandle);

// The handle is plain heap state with no thread affinity; each is used by one thread at a time.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        unsafe { raw::tj3Destroy(self.0) }
    }
}

impl Handle {
    pub fn new() -> Result<Handle, String> {
        let handle = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        if handle.is_null() {
            return Err("libjpeg-turbo could not create a decompressor".into());
        }
        Ok(Handle(handle))
    }

    fn error(&self) -> String {
        let message = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.0)) };
        message.to_string_lossy().into_owned()
    }

    fn check(&self, status: c_int) -> Result<(), String> {
        if status == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn get(&self, param: raw::TJPARAM) -> c_int {
        unsafe { raw::tj3Get(self.0, param as c_int) }
    }

    pub fn header(&mut self, bytes: &[u8]) -> Result<Header, String> {
        self.check(unsafe {
            raw::tj3DecompressHeader(self.0, bytes.as_ptr(), bytes.len() as raw::size_t)
        })?;
        let code = self.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        let colorspace = [
            (raw::TJCS_TJCS_RGB, Colorspace::Rgb),
            (raw::TJCS_TJCS_YCbCr, Colorspace::YCbCr),
            (raw::TJCS_TJCS_GRAY, Colorspace::Gray),
            (raw::TJCS_TJCS_CMYK, Colorspace::Cmyk),
            (raw::TJCS_TJCS_YCCK, Colorspace::Ycck),
        ]
        .iter()
        .find(|(c, _)| *c as c_int == code)
        .map(|&(_, space)| space)
        .ok_or_else(|| format!("unknown JPEG colour space {code}"))?;
        let (width, height) = (
            self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH),
            self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        if width <= 0 || height <= 0 {
            return Err(format!("JPEG header gives size {width}x{height}"));
        }
        Ok(Header {
            width: width as u32,
            height: height as u32,
            subsampling: Subsampling::from_code(self.get(raw::TJPARAM_TJPARAM_SUBSAMP)),
            colorspace,
            lossless: self.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0,
        })
    }

    /// Sets the DCT reduction (1/`denom`, a power of two up to 8) for the next decode.
    pub fn set_reduction(&mut self, denom: u32) -> Result<(), String> {
        let factor = raw::tjscalingfactor {
            num: 1,
            denom: denom as c_int,
        };
        self.check(unsafe { raw::tj3SetScalingFactor(self.0, factor) })
    }

    /// Decodes into `out`, packed RGB (3 bytes a pixel) or CMYK (4), `width` pixels a row; the
    /// size must be the header's reduced by the current DCT reduction.
    pub fn decode_packed(
        &mut self,
        bytes: &[u8],
        out: &mut [u8],
        (width, height): (usize, usize),
        cmyk: bool,
    ) -> Result<(), String> {
        let (channels, format) = if cmyk {
            (4, raw::TJPF_TJPF_CMYK)
        } else {
            (3, raw::TJPF_TJPF_RGB)
        };
        assert!(
            out.len() >= width * height * channels,
            "output buffer too small"
        );
        let pitch = (width * channels) as c_int;
        self.check(unsafe {
            raw::tj3Decompress8(
                self.0,
                bytes.as_ptr(),
                bytes.len() as raw::size_t,
                out.as_mut_ptr(),
                pitch,
                format as c_int,
            )
        })
    }
}

/// JPEGs for the unit tests of this module and of [`crate::image::jpeg_raw`], encoded by the
/// libjpeg-turbo that decodes them.
#[cfg(test)]
pub(crate) mod fixtures {
    /// A `w` x `h` JPEG of one colour, encoded by libjpeg-turbo with this subsampling.
    pub fn solid(w: usize, h: usize, rgb: [u8; 3], subsamp: turbojpeg::Subsamp) -> Vec<u8> {
        let pixels: Vec<u8> = rgb.iter().copied().cycle().take(w * h * 3).collect();
        let image = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        turbojpeg::compress(image, 95, subsamp).unwrap().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::solid;
    use super::*;

    #[test]
    fn the_header_gives_size_subsampling_and_colour_space() {
        let mut handle = Handle::new().unwrap();
        let colour = solid(40, 24, [200, 100, 50], turbojpeg::Subsamp::Sub2x2);
        assert_eq!(
            handle.header(&colour).unwrap(),
            Header {
                width: 40,
                height: 24,
                subsampling: Subsampling::Standard,
                colorspace: Colorspace::YCbCr,
                lossless: false,
            }
        );
        let gray = solid(17, 33, [90, 90, 90], turbojpeg::Subsamp::Gray);
        let header = handle.header(&gray).unwrap();
        assert_eq!(
            (
                header.width,
                header.height,
                header.subsampling,
                header.colorspace
            ),
            (17, 33, Subsampling::Gray, Colorspace::Gray)
        );
        // The image crate's encoder writes what we read too.
        let other = crate::fixtures::jpeg(21, 13);
        let header = handle.header(&other).unwrap();
        assert_eq!((header.width, header.height), (21, 13));
    }

    #[test]
    fn bytes_that_are_not_a_jpeg_give_libjpeg_turbo_s_message() {
        let mut handle = Handle::new().unwrap();
        let message = handle.header(b"GIF89a not a jpeg").unwrap_err();
        assert!(!message.is_empty());
        // The handle still works afterwards.
        let good = solid(8, 8, [1, 2, 3], turbojpeg::Subsamp::None);
        assert_eq!(handle.header(&good).unwrap().width, 8);
    }

    #[test]
    fn the_packed_decode_gives_the_colour_at_full_and_reduced_size() {
        let mut handle = Handle::new().unwrap();
        let bytes = solid(40, 24, [200, 100, 50], turbojpeg::Subsamp::Sub2x2);
        handle.header(&bytes).unwrap();
        for (denom, size) in [(1, (40, 24)), (2, (20, 12)), (8, (5, 3))] {
            handle.set_reduction(denom).unwrap();
            let mut out = vec![0u8; size.0 * size.1 * 3];
            handle.decode_packed(&bytes, &mut out, size, false).unwrap();
            for px in out.chunks(3) {
                for (got, want) in px.iter().zip([200u8, 100, 50]) {
                    assert!(got.abs_diff(want) <= 3, "1/{denom}: {px:?}");
                }
            }
        }
        // A reduction TurboJPEG does not offer is refused.
        assert!(handle.set_reduction(3).is_err());
    }
}
