//! Video decoding, below the kinds as `image` is: which frames of a clip are read and at what
//! size (`sampling`, `sizing`), and those frames decoded and converted to RGB (`decode`,
//! `convert`, `frame_index`) through the system's FFmpeg found at run time (`ffmpeg`), with
//! every failure a typed `fault`. Two kinds stand on it: the video-text CLIP clips
//! (`batch::video`) and the interleaved kind's videos in Qwen2-VL rows (`batch::interleaved`).
//!
//! `sampling`: the `qwen-vl-utils` rule, transformers' `Qwen2VLVideoProcessor` rule as an
//! option, and `T` uniform frames for a CLIP clip. `sizing`: the size each sampled frame is
//! resized to on the Qwen path, its patch grid and the seconds a temporal patch spans.

pub mod convert;
pub mod decode;
pub mod fault;
pub mod ffmpeg;
pub mod frame_index;
pub mod sampling;
pub mod sizing;

pub use decode::{decode_frames, probe, Fit, Frames, OpenClip};
pub use fault::{Caps, VideoFault};
pub use ffmpeg::StreamInfo;
pub use sampling::{Clip, Count, Rule, Sampled, Sampling, SamplingError};
pub use sizing::{Sizing, SizingError, VideoGrid};
