//! The video-text CLIP kind (issue 54): clips decoded at their sampled frames only, as
//! `uint8 [B, T, 3, S, S]` with their captions. `clips` (which samples are clips, and a clip's
//! frames decoded into its slot), `count` (clips per unit) and `pipeline` (one reader's clips
//! as batches). The decoding itself is the `video` stage's, which the interleaved kind's
//! Qwen2-VL video runs share.

pub mod clips;
pub mod count;
pub mod pipeline;

pub use clips::{ClipShape, ClipSpec, ClipTimes, VIDEO_KEYS};
pub use count::{count_unit, ClipCount};
pub use pipeline::{start, ClipBatchMeta, ClipBatches, ClipInput, ClipPipeline};
