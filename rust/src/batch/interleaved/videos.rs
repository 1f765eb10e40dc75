//! A document's video under Qwen2-VL's video rule: measured from its container alone (the
//! frames sampled, the size each is resized to, its grid and run of tokens; nothing decoded),
//! then, in the loader, its sampled frames decoded and written as rows of
//! `pixel_values_videos`. The count pass and the loader measure with the same rule, so both
//! pack the same batches.
//!
//! The frames are `qwen-vl-utils`' (`fetch_video`: `fps` frames a second within
//! `min_frames..=max_frames`, spread first to last; transformers' sampler as an option), the
//! size its `smart_resize` under the per-frame and total pixel budgets (`video::sizing`), each
//! frame resized whole with the image kinds' antialiased bicubic, as the reference's
//! torchvision resize. A count of frames that is not a multiple of the temporal patch repeats
//! the last, as `Qwen2VLVideoProcessor` does.

use super::qwen_vl::{Grid, QwenVideoSpec, QwenVlSpec};
use crate::batch::kit::sample::Rejection;
use crate::error::Reason;
use crate::video::{sampling, Caps, Clip, Fit, OpenClip, VideoFault};

/// A video fault as a rejection of its document (a missing FFmpeg, which the loader checks
/// before it starts, is reported as internal).
fn rejected(i: usize, fault: VideoFault) -> Rejection {
    let reason = fault.reason().unwrap_or(Reason::Internal);
    (reason, format!("video {i}: {fault}"))
}

/// The caps a document's video is opened under.
fn caps(video: &QwenVideoSpec, max_pixels: u64) -> Caps {
    Caps {
        max_pixels,
        max_seconds: video.max_seconds,
    }
}

/// A video measured: its grid, its run's tokens and the frame numbers sampled
/// (`grid.t * temporal_patch_size` of them).
pub(super) struct VideoRun {
    pub grid: Grid,
    pub tokens: usize,
    pub indices: Vec<u32>,
    /// Each temporal patch's M-RoPE temporal position (`temporal_positions`).
    pub t_positions: Vec<u32>,
}

/// The temporal positions of a video's `patches` temporal patches: `k` (Qwen2-VL), or with
/// Qwen2.5-VL's `tokens_per_second`, `trunc(k * time_interval)` where `time_interval =
/// tokens_per_second * second_per_grid_t`, each step in float32 as `get_rope_index` computes it
/// (`second_per_grid_ts` a float32 tensor, `arange(t) * interval`, then `.long()`).
pub(super) fn temporal_positions(
    patches: u32,
    tokens_per_second: Option<f64>,
    second_per_grid_t: f64,
) -> Vec<u32> {
    match tokens_per_second {
        None => (0..patches).collect(),
        Some(tps) => {
            let interval = tps as f32 * second_per_grid_t as f32;
            (0..patches)
                .map(|k| (k as f32 * interval).trunc().max(0.0) as u32)
                .collect()
        }
    }
}

/// What decides a video's run: the spec, the pixel cap of one coded frame, and the batch's
/// limits its run must fit.
pub(super) struct VideoMeasure<'a> {
    pub qwen: &'a QwenVlSpec,
    pub max_pixels: u64,
    pub seq_len: usize,
    pub max_patches: u64,
}

impl VideoMeasure<'_> {
    /// Video `i` of a document (part `i`): its container
    /// opened and its frames numbered by a demux pass, no frame decoded. Err: no video rule is
    /// set, the container is refused (not a video, no video stream, a codec this FFmpeg cannot
    /// decode, over `max_pixels` or `max_seconds`), it has no frames to sample or no size, or
    /// its run is longer than a row or its patches more than a batch holds.
    pub fn run(&self, i: usize, bytes: &[u8]) -> Result<VideoRun, Rejection> {
        let Some(video) = &self.qwen.video else {
            return Err((
                Reason::MisalignedDocument,
                format!("video {i}: the vision spec reads no video (set QwenVL(video=...))"),
            ));
        };
        let clip =
            OpenClip::open(bytes, &caps(video, self.max_pixels)).map_err(|f| rejected(i, f))?;
        let info = clip.info().clone();
        let corrupt = |detail: String| (Reason::CorruptVideo, format!("video {i}: {detail}"));
        let sampled = sampling::sample(
            Clip {
                total_frames: clip.frame_total(),
                fps: info.fps,
            },
            &video.sampling,
        )
        .map_err(|e| corrupt(format!("no frames to sample: {e}")))?;
        drop(clip);
        let frames = sampled.indices.len() as u32;
        let (height, width) = video
            .sizing
            .resized(info.height, info.width, frames)
            .map_err(|e| (Reason::TooFewPatches, format!("video {i}: {e}")))?;
        let grid = video.sizing.grid(frames, height, width);
        let grid = Grid {
            t: grid.t,
            h: grid.h,
            w: grid.w,
        };
        let tokens = self.qwen.tokens(grid);
        if tokens > self.seq_len || grid.patches() > self.max_patches {
            return Err((
                Reason::VideoOverRow,
                format!(
                    "video {i}: {frames} frames of {width}x{height} take {tokens} tokens and {} \
                     patches, more than seq_len={} or max_patches_per_batch={}",
                    grid.patches(),
                    self.seq_len,
                    self.max_patches
                ),
            ));
        }
        // The temporal patch's last frame repeated to fill it (the processor's padding).
        let mut indices = sampled.indices;
        let padded = (grid.t * self.qwen.temporal_patch_size) as usize;
        let last = *indices.last().expect("at least one sampled frame");
        indices.resize(padded, last);
        let second_per_grid_t = video.sizing.second_per_grid_ts(sampled.sample_fps);
        Ok(VideoRun {
            grid,
            tokens,
            indices,
            t_positions: temporal_positions(grid.t, video.tokens_per_second, second_per_grid_t),
        })
    }
}

/// Decodes a measured video's sampled frames, each resized whole to its grid's pixels, and
/// writes them as its `grid.patches()` rows of `pixel_values_videos` into `slot`; `frames` is
/// the thread's scratch for the decoded frames.
pub(super) fn decode_video(
    bytes: &[u8],
    indices: &[u32],
    grid: Grid,
    qwen: &QwenVlSpec,
    max_pixels: u64,
    frames: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<(), Rejection> {
    let video = qwen.video.as_ref().ok_or((
        Reason::Internal,
        "a video item under a spec without a video rule".to_string(),
    ))?;
    let size = (grid.h * qwen.patch_size, grid.w * qwen.patch_size);
    let n = indices.len() * 3 * size.0 as usize * size.1 as usize;
    frames.resize(n, 0);
    // The caller names the video ("a video dropped from its batch: ...").
    let fail = |f: VideoFault| (f.reason().unwrap_or(Reason::Internal), f.to_string());
    let clip = OpenClip::open(bytes, &caps(video, max_pixels)).map_err(fail)?;
    clip.decode_into(indices, size, Fit::Whole, &mut frames[..n])
        .map_err(fail)?;
    qwen.write_video_rows(&frames[..n], grid, slot);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::temporal_positions;

    #[test]
    fn temporal_positions_are_qwen2_vl_s_or_scaled_by_the_seconds_a_patch_spans() {
        assert_eq!(temporal_positions(4, None, 0.7), [0, 1, 2, 3]);
        // Qwen2.5-VL's checkpoints: 2 tokens a second; 2 frames a patch at 2 fps: a second each.
        assert_eq!(temporal_positions(4, Some(2.0), 1.0), [0, 2, 4, 6]);
        // 2 frames a patch at 4 sampled fps (0.5 s) under 25 tokens a second: 12.5, truncated.
        assert_eq!(temporal_positions(4, Some(25.0), 0.5), [0, 12, 25, 37]);
        // In float32: 2 / (23.976 * 8 / 192) = 2.0020... s a patch, times 4 = 8.008...
        let spg = 2.0 / (8.0 / 192.0 * 23.976);
        let interval = 4.0f32 * spg as f32;
        let want: Vec<u32> = (0..5).map(|k| (k as f32 * interval) as u32).collect();
        assert_eq!(temporal_positions(5, Some(4.0), spg), want);
    }
}
