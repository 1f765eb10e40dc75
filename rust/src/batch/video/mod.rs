//! The video kind (issue 54): clips decoded at their sampled frames only, as the Qwen2-VL video
//! path's rows and as video-text CLIP clips `uint8 [B, T, 3, S, S]`.
//!
//! So far: `sampling` (which frames of a clip are read: the `qwen-vl-utils` rule, transformers' `Qwen2VLVideoProcessor` rule as an
//! option, and `T` uniform frames for a CLIP clip) and `sizing` (the size each sampled frame is
//! resized to on the Qwen path, its patch grid and the seconds a temporal patch spans), and
//! `decode` (a clip's sampled frames decoded and converted to RGB, through the system's FFmpeg
//! found at run time by `ffmpeg`), and the video-text CLIP kind: `clips` (which samples are
//! clips, and a clip's frames decoded into its slot), `count` (clips per unit) and `pipeline`
//! (one reader's clips as `uint8 [B, T, 3, S, S]` batches). The Qwen path's rows are not built
//! yet.

pub mod clips;
pub mod convert;
pub mod count;
pub mod decode;
pub mod fault;
pub mod ffmpeg;
pub mod frame_index;
pub mod pipeline;
pub mod sampling;
pub mod sizing;

pub use clips::{ClipShape, ClipSpec, ClipTimes, VIDEO_KEYS};
pub use count::{count_unit, ClipCount};
pub use decode::{decode_frames, probe, Fit, Frames, OpenClip};
pub use fault::{Caps, VideoFault};
pub use ffmpeg::StreamInfo;
pub use pipeline::{start, ClipBatchMeta, ClipBatches, ClipInput, ClipPipeline};
pub use sampling::{Clip, Count, Rule, Sampled, Sampling, SamplingError};
pub use sizing::{Sizing, SizingError, VideoGrid};
