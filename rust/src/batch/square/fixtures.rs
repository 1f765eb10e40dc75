//! The pipeline modules' test inputs: real shards of good and bad samples, their spans, and a
//! small-image configuration.

use std::path::Path;

use crate::batch::kit::sample::SampleSpec;
use crate::batch::square::config::PipelineConfig;
use crate::fixtures::{jpeg, tar_of};
use crate::read::source::Expected;
use crate::read::span::ShardSpan;

/// 8 x 8 output images: 192 bytes a slot.
pub(super) const SIZE: u32 = 8;
pub(super) const SLOT: usize = 3 * 8 * 8;

/// Writes a shard of these samples (key, has a good image): a good one holds a JPEG and a
/// caption, a bad one a caption only (`missing_image`).
pub(super) fn shard(dir: &Path, name: &str, samples: &[(&str, bool)]) -> String {
    let image = jpeg(16, 12);
    let names: Vec<(String, String)> = samples
        .iter()
        .map(|(k, _)| (format!("{k}.jpg"), format!("{k}.txt")))
        .collect();
    let mut members: Vec<(&str, &[u8])> = Vec::new();
    for ((key, good), (jpg, txt)) in samples.iter().zip(&names) {
        if *good {
            members.push((jpg, &image));
        }
        members.push((txt, key.as_bytes()));
    }
    let path = dir.join(name);
    std::fs::write(&path, tar_of(&members)).unwrap();
    path.display().to_string()
}

/// The span of samples `0..n` of a shard (`n` planned positions).
pub(super) fn span(url: &str, shard: u32, n: u64) -> ShardSpan {
    ShardSpan {
        url: url.into(),
        shard,
        start_offset: 0,
        first_ordinal: 0,
        skip_before: 0,
        end_ordinal: Some(n),
        stride: None,
        display: format!("shard-{shard}"),
        detail: None,
        expected: Expected::default(),
        keep: None,
        keep_bytes: None,
        selection: None,
    }
}

pub(super) fn config(batch_size: usize, planned: bool) -> PipelineConfig {
    PipelineConfig {
        spec: SampleSpec {
            image_size: SIZE,
            ..SampleSpec::default()
        },
        batch_size,
        planned,
        ..PipelineConfig::default()
    }
}
