//! The video kind (issue 54): clips decoded at their sampled frames only, as the Qwen2-VL video
//! path's rows and as video-text CLIP clips `uint8 [B, T, 3, S, S]`.
//!
//! So far its first slice only, pure computation with no decoding: `sampling` (which frames of
//! a clip are read: the `qwen-vl-utils` rule, transformers' `Qwen2VLVideoProcessor` rule as an
//! option, and `T` uniform frames for a CLIP clip) and `sizing` (the size each sampled frame is
//! resized to on the Qwen path, its patch grid and the seconds a temporal patch spans). The
//! decoder stands on both; it reads nothing else of the references.

pub mod sampling;
pub mod sizing;

pub use sampling::{Clip, Count, Rule, Sampled, Sampling, SamplingError};
pub use sizing::{Sizing, SizingError, VideoGrid};
