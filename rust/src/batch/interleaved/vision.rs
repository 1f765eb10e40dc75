//! The vision spec a corpus is read under, one of the model families the kind knows: Qwen2-VL
//! (`qwen_vl`) or NaFlex (SigLIP 2's native-resolution patches, below). Everything else in the
//! kind asks this enum: an image's grid and token run, a `pixel_values` row's bytes, and how
//! its pixels are resized and laid out.
//!
//! NaFlex: the grid is `transformers`' `get_image_size_for_max_num_patches` (the largest that
//! holds at most `max_num_patches` patches, aspect kept: `image::patches`), the image resized to
//! it with the antialiased BILINEAR filter, one `pixel_values` row per patch in raster order,
//! each row `(y, x, channel)` as `Siglip2ImageProcessor` lays them out; in the text, a start
//! token, one pad token per patch and an end token.

use super::qwen_vl::{Grid, QwenVlSpec, Rope};
use crate::batch::kit::patches::MAX_NUM_PATCHES;
use crate::batch::kit::sample::Rejection;
use crate::image::convolve::Kernel;
use crate::image::patches::grid_for_max_patches;

/// The NaFlex (SigLIP 2) image spec, with the ids of its three image tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct NaFlexVlSpec {
    pub patch_size: u32,
    pub max_num_patches: u32,
    pub image_start: u32,
    pub image_end: u32,
    pub image_pad: u32,
}

/// An image rule of a model family.
#[derive(Clone, Debug, PartialEq)]
pub enum VisionSpec {
    Qwen(QwenVlSpec),
    NaFlex(NaFlexVlSpec),
}

impl VisionSpec {
    /// What a pipeline cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            VisionSpec::Qwen(q) => q.validate(),
            VisionSpec::NaFlex(n) => {
                if !(1..=64).contains(&n.patch_size)
                    || !(1..=MAX_NUM_PATCHES).contains(&n.max_num_patches)
                {
                    return Err(format!(
                        "patch_size must be 1..=64 and max_num_patches 1..={MAX_NUM_PATCHES}, not {} and {}",
                        n.patch_size, n.max_num_patches
                    ));
                }
                Ok(())
            }
        }
    }

    /// Pixels a side of one patch.
    pub fn patch_size(&self) -> u32 {
        match self {
            VisionSpec::Qwen(q) => q.patch_size,
            VisionSpec::NaFlex(n) => n.patch_size,
        }
    }

    /// Patches of the largest image this spec makes (a batch's patch cap must hold one).
    pub fn largest_image(&self) -> u64 {
        match self {
            VisionSpec::Qwen(q) => q.max_pixels / (q.patch_size as u64).pow(2),
            VisionSpec::NaFlex(n) => n.max_num_patches as u64,
        }
    }

    /// The grid of an image of `height x width` pixels (Err: it has none).
    pub fn grid(&self, height: u32, width: u32) -> Result<Grid, Rejection> {
        match self {
            VisionSpec::Qwen(q) => q.grid(height, width),
            VisionSpec::NaFlex(n) => {
                let (h, w) = grid_for_max_patches(height, width, n.patch_size, n.max_num_patches);
                Ok(Grid { t: 1, h, w })
            }
        }
    }

    /// Tokens of an image's run in the text: start, pads, end.
    pub fn tokens(&self, grid: Grid) -> usize {
        match self {
            VisionSpec::Qwen(q) => q.tokens(grid),
            VisionSpec::NaFlex(_) => grid.patches() as usize + 2,
        }
    }

    /// The (start, end, pad) token ids.
    pub fn token_ids(&self) -> (u32, u32, u32) {
        match self {
            VisionSpec::Qwen(q) => (q.vision_start, q.vision_end, q.image_pad),
            VisionSpec::NaFlex(n) => (n.image_start, n.image_end, n.image_pad),
        }
    }

    /// An image's run of tokens: start, pads, end.
    pub fn run(&self, grid: Grid) -> impl Iterator<Item = u32> {
        let (start, end, pad) = self.token_ids();
        std::iter::once(start)
            .chain(std::iter::repeat_n(pad, self.tokens(grid) - 2))
            .chain(std::iter::once(end))
    }

    /// Bytes of one row of `pixel_values`.
    pub fn row_len(&self) -> usize {
        match self {
            VisionSpec::Qwen(q) => q.row_len(),
            VisionSpec::NaFlex(n) => 3 * (n.patch_size as usize).pow(2),
        }
    }

    /// How an image run is positioned: Qwen2-VL's M-RoPE over its merge blocks; NaFlex's run
    /// is 1-D, as its text (a SigLIP 2 tower gives the language model a sequence of tokens).
    pub fn rope(&self) -> Rope {
        match self {
            VisionSpec::Qwen(q) => Rope::MRope {
                merge: q.merge_size,
            },
            VisionSpec::NaFlex(_) => Rope::Flat,
        }
    }

    /// The filter images are resized with, as the family's processor resizes them.
    pub fn kernel(&self) -> Kernel {
        match self {
            VisionSpec::Qwen(_) => Kernel::Bicubic,
            VisionSpec::NaFlex(_) => Kernel::Bilinear,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naflex() -> VisionSpec {
        VisionSpec::NaFlex(NaFlexVlSpec {
            patch_size: 16,
            max_num_patches: 256,
            image_start: 7,
            image_end: 8,
            image_pad: 9,
        })
    }

    #[test]
    fn a_naflex_image_is_its_budget_grid_and_one_pad_a_patch() {
        let spec = naflex();
        // 640x427 under 256 patches of 16 px: SigLIP 2's processors give 13 x 19 (247 patches).
        let grid = spec.grid(427, 640).unwrap();
        assert_eq!((grid.h, grid.w), (13, 19));
        assert_eq!(spec.tokens(grid), 247 + 2);
        let run: Vec<u32> = spec.run(grid).collect();
        assert_eq!((run[0], run[1], run[247], run[248]), (7, 9, 9, 8));
        assert_eq!(spec.row_len(), 768);
        assert_eq!(spec.largest_image(), 256);
    }
}
