//! Raw samples of a list of shards, shard after shard, with the skip-or-raise policy of
//! `shardstream.read_samples`: what the Python `SampleIter` iterates.

use crate::error::OnError;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{open_shard, RawSample, SampleReader};
use crate::read::source::{Expected, SourceOptions, SourceStats};
use std::sync::Arc;

pub struct ShardSamples {
    urls: Vec<String>,
    /// What users know each shard by (faults name it; `urls` may be presigned).
    display: Vec<String>,
    next_shard: usize,
    current: Option<SampleReader>,
    on_error: OnError,
    max_member_bytes: u64,
    source: SourceOptions,
    stats: Arc<SourceStats>,
    skipped: u64,
}

impl ShardSamples {
    pub fn new(
        urls: Vec<String>,
        display: Vec<String>,
        on_error: OnError,
        max_member_bytes: u64,
        source: SourceOptions,
    ) -> Result<Self, String> {
        if urls.len() != display.len() {
            return Err("urls and display_urls differ in length".into());
        }
        Ok(Self {
            urls,
            display,
            next_shard: 0,
            current: None,
            on_error,
            max_member_bytes,
            source,
            stats: Arc::new(SourceStats::default()),
            skipped: 0,
        })
    }

    /// Shards and samples skipped (with [`OnError::Skip`]) so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The next sample and the name of its shard; `Err` for a fault under [`OnError::Raise`]
    /// (a skipped one is counted); `None` after the last shard.
    pub fn next_sample(&mut self) -> Result<Option<(RawSample, String)>, Fault> {
        loop {
            let Some(reader) = self.current.as_mut() else {
                let Some(url) = self.urls.get(self.next_shard) else {
                    return Ok(None);
                };
                let opened = open_shard(
                    url,
                    0,
                    0,
                    self.max_member_bytes,
                    &Expected::default(),
                    &self.source,
                    &self.stats,
                );
                self.next_shard += 1;
                match opened {
                    Ok(r) => self.current = Some(r),
                    Err(f) => self.fail(f.reason, String::new(), f.detail, f.kind)?,
                }
                continue;
            };
            match reader.next() {
                None => self.current = None,
                Some(Err(f)) => {
                    self.current = None;
                    self.fail(f.reason, String::new(), f.detail, f.kind)?;
                }
                Some(Ok(raw)) => match raw.defect.clone() {
                    Some((reason, detail)) => {
                        self.fail(reason, raw.key, detail, SourceKind::Other)?
                    }
                    None => return Ok(Some((raw, self.shard_name().to_string()))),
                },
            }
        }
    }

    /// The shard being read (the one opened last).
    fn shard_name(&self) -> &str {
        &self.display[self.next_shard.saturating_sub(1)]
    }

    /// A fault of the current shard: returned under raise, counted under skip.
    fn fail(
        &mut self,
        reason: Reason,
        key: String,
        detail: String,
        kind: SourceKind,
    ) -> Result<(), Fault> {
        if self.on_error == OnError::Raise {
            return Err(Fault {
                reason,
                url: self.shard_name().to_string(),
                key,
                detail,
                kind,
            });
        }
        self.skipped += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{scratch_dir, tar_of};

    #[test]
    fn samples_come_shard_after_shard_and_a_missing_shard_is_skipped_or_raised() {
        let dir = scratch_dir("shard-samples");
        let a = dir.join("a.tar");
        std::fs::write(&a, tar_of(&[("k1.txt", b"one"), ("k2.txt", b"two")])).unwrap();
        let missing = dir.join("missing.tar");
        let urls: Vec<String> = [&missing, &a]
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let names = vec!["gone".to_string(), "shard-a".to_string()];
        let mut skip = ShardSamples::new(
            urls.clone(),
            names.clone(),
            OnError::Skip,
            1 << 20,
            SourceOptions::default(),
        )
        .unwrap();
        let mut keys = Vec::new();
        while let Some((raw, shard)) = skip.next_sample().unwrap() {
            keys.push((raw.key, shard));
        }
        assert_eq!(
            keys,
            vec![
                ("k1".into(), "shard-a".into()),
                ("k2".into(), "shard-a".into())
            ]
        );
        assert_eq!(skip.skipped(), 1);
        let mut raise = ShardSamples::new(
            urls,
            names,
            OnError::Raise,
            1 << 20,
            SourceOptions::default(),
        )
        .unwrap();
        let fault = raise.next_sample().unwrap_err();
        assert_eq!(
            (fault.reason, fault.kind, fault.url.as_str()),
            (Reason::Unreadable, SourceKind::NotFound, "gone")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
