//! The image stage: an image's bytes to pixels in a batch slot.
//!
//! `decode` reads the header, checks the limits and decodes (JPEG through libjpeg-turbo:
//! `jpeg` for packed RGB/CMYK, `jpeg_raw` for raw Y/Cb/Cr planes that stop at the crop; PNG
//! and WebP through the `image` crate); `resize` computes the crop and writes `[3, S, S]` into
//! the slot, resampling JPEG planes with `convolve`; `patches` is the NaFlex kind's geometry
//! (the patch grid under a budget, its crop, the patch layout). Nothing here knows about shards
//! or batches.

pub mod convolve;
pub mod decode;
pub mod jpeg;
#[cfg(test)]
mod jpeg_entropy_tests;
pub mod jpeg_raw;
#[cfg(test)]
mod jpeg_state_tests;
pub mod patches;
pub mod resize;
