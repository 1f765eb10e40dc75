//! Every default of the loader's configuration, in one place. The core's `Default` impls
//! (`SampleSpec`, `SourceOptions`, `PipelineConfig`) are built from these; the binding hands the
//! same values to Python as `_core.DEFAULTS`, where `shardstream.config` (the loader's typed
//! configuration), the CLI and `read_samples` take theirs. Change a default here and nowhere else.

use std::time::Duration;

/// Side of the square each image is resized and cropped to.
pub const IMAGE_SIZE: u32 = 224;
/// Side of the square a scan (`shardstream validate`, `index`, `build_index`) decodes each image
/// to: not the loader's 224, for speed. A scan decodes every image whole (no stop after the
/// crop's last row, every block entropy-decoded), and the target only picks the DCT scale and
/// the resize's output size, neither of which can fail on its own: the verdict is the same at
/// any size (scan.rs tests it on corrupted JPEGs). 32 px takes the 1/8 scale, skipping most of
/// the inverse DCT and resize: 1.5x the samples/s of 224 px on 256-512 px photos.
pub const SCAN_IMAGE_SIZE: u32 = 32;
/// The member holding the caption (`json:FIELD` reads FIELD of the json member).
pub const CAPTION_KEY: &str = "txt";
/// Image member extensions, tried in order.
pub const IMAGE_KEYS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];
/// Video member extensions tried in order, as WebVid, Panda-70M, InternVid and LLaVA-Video's
/// tars hold them.
pub const VIDEO_KEYS: [&str; 4] = ["mp4", "webm", "mkv", "mov"];
/// Images with more pixels (read from the header) are rejected before decoding: no image can
/// exhaust memory.
pub const MAX_PIXELS: u64 = 64_000_000;
/// Members larger than this are rejected unread.
pub const MAX_MEMBER_BYTES: u64 = 256 << 20;
/// `crop="random"`: the range of the crop's area as a fraction of the image's.
pub const RANDOM_CROP_SCALE: (f64, f64) = (0.9, 1.0);
/// `crop="random"`: the range of the crop's aspect ratio (torchvision's RandomResizedCrop).
pub const RANDOM_CROP_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);
/// `"center"` or `"random"`.
pub const CROP: &str = "center";
/// What the loader does with a broken sample or shard: skip it (counted) or raise.
pub const LOADER_ON_ERROR: &str = "skip";
/// What `read_samples` does with one: raw reading reports everything unless told otherwise.
pub const READ_SAMPLES_ON_ERROR: &str = "raise";

/// Samples per shuffle block of each reader (the loader's `shuffle_buffer`).
pub const SHUFFLE_BUFFER: usize = 1000;
/// Shards each reader opens ahead of the one it reads.
pub const READ_AHEAD: usize = 2;
/// Batch buffers the loader lends the pipeline ahead of the batch it hands out.
pub const PREFETCH: usize = 2;

/// Limit for TCP connect (and TLS handshake) of each attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Limit for each single socket read.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Consecutive failed attempts (without a byte of progress) before a stream gives up.
pub const MAX_RETRIES: u32 = 8;
/// First backoff delay; doubles per consecutive failure up to `BACKOFF_MAX`.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The longest `Retry-After` (429/503) a stream waits for, plus jitter; a longer one fails the
/// read with `Throttled` rather than sleeping for hours. Hub and S3 rate limits ask for seconds
/// to a few minutes.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);
/// Size the on-disk shard cache may grow to when a `cache_dir` is given.
pub const CACHE_MAX_BYTES: u64 = 64 << 30;

/// `IMAGE_KEYS` as the owned list a `SampleSpec` holds.
pub fn image_keys() -> Vec<String> {
    IMAGE_KEYS.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::kit::sample::{CaptionSource, SampleSpec};
    use crate::batch::square::config::PipelineConfig;
    use crate::read::source::SourceOptions;

    #[test]
    fn the_core_defaults_are_these() {
        let spec = SampleSpec::default();
        assert_eq!(spec.image_size, IMAGE_SIZE);
        assert_eq!(spec.max_pixels, MAX_PIXELS);
        assert_eq!(spec.image_keys, image_keys());
        assert!(matches!(spec.caption, CaptionSource::Member(ref m) if m == CAPTION_KEY));
        let source = SourceOptions::default();
        assert_eq!(source.connect_timeout, CONNECT_TIMEOUT);
        assert_eq!(source.read_timeout, READ_TIMEOUT);
        assert_eq!(source.max_retries, MAX_RETRIES);
        assert_eq!(source.backoff_initial, BACKOFF_INITIAL);
        assert_eq!(source.backoff_max, BACKOFF_MAX);
        let pipeline = PipelineConfig::default();
        assert_eq!(pipeline.read_ahead, READ_AHEAD);
        assert_eq!(pipeline.max_member_bytes, MAX_MEMBER_BYTES);
    }
}
