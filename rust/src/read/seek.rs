//! Where a span starts in its shard. A version-2 index keeps each shard's byte offsets in a
//! detail block (`index::detail`) instead of in memory; the reader fetches that block, one small
//! range read, only when it opens a shard in its middle, and seeks there instead of reading the
//! shard from its start.

use crate::index::detail::{self, ShardDetail};
use crate::index::Index;
use crate::plan::Run;
use crate::read::source::{self, redact_url, SourceOptions, SourceStats};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

/// Where the detail block of one shard is, and what the manifest says of that shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetailSource {
    /// The detail file (local path or URL; `s3://` is presigned when opened, like a shard).
    pub url: String,
    pub offset: u64,
    pub len: u32,
    /// The shard's URL in the index (its file name must match the block's).
    pub shard_url: String,
    pub num_samples: u64,
}

impl DetailSource {
    /// The detail block of shard `shard` of `index`, whose detail files are named relative to
    /// `location` (the index's folder or URL); None when the index keeps none for that shard.
    pub fn for_shard(index: &Index, location: Option<&str>, shard: u32) -> Option<Self> {
        let entry = index.shard(shard)?;
        let r = entry.detail_ref?;
        let name = index.detail_files().get(r.file as usize)?;
        Some(Self {
            url: join_location(location, name),
            offset: r.offset,
            len: r.len.get(),
            shard_url: entry.url.clone(),
            num_samples: entry.num_samples,
        })
    }

    /// The byte offset of sample `ordinal`, read from the shard's detail block; None when the
    /// block holds no offsets. Errors say which shard and which detail file.
    pub fn offset_of(
        &self,
        ordinal: u64,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Option<u64>, String> {
        Ok(self
            .fetch(opts, stats)?
            .offsets
            .and_then(|offsets| offsets.get(ordinal as usize).copied()))
    }

    /// The shard's detail block, fetched with one range read and checked.
    pub fn fetch(
        &self,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<ShardDetail, String> {
        let context = |what: String| {
            format!(
                "index detail of {} (in {}): {what}",
                redact_url(&self.shard_url),
                redact_url(&self.url)
            )
        };
        let end = self.offset + self.len as u64;
        let mut bytes = Vec::with_capacity(self.len as usize);
        source::open_range(&self.url, self.offset, Some(end), opts, stats)
            .map_err(|e| context(e.to_string()))?
            .take(self.len as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| context(e.to_string()))?;
        if bytes.len() != self.len as usize {
            return Err(context(format!(
                "the file ends {} bytes into the block of {}",
                bytes.len(),
                self.len
            )));
        }
        detail::decode(&bytes, &self.shard_url, self.num_samples)
            .map_err(|e| context(e.to_string()))
    }
}

/// The keys of the samples in `runs`: from memory when the index holds them, else from the
/// detail blocks of just the shards these runs touch (each fetched once). Shards without keys
/// contribute none.
pub fn keys_of_runs(
    index: &Index,
    location: Option<&str>,
    runs: &[Run],
    opts: &SourceOptions,
) -> Result<Vec<String>, String> {
    let stats = Arc::new(SourceStats::default());
    type Fetched = (Option<Vec<String>>, Option<Vec<u64>>);
    let mut fetched: HashMap<u32, Fetched> = HashMap::new();
    let mut keys = Vec::new();
    for run in runs {
        let Some(entry) = index.shard(run.shard) else {
            continue;
        };
        let in_memory_selection = entry.selection().and_then(|s| s.ordinals.clone());
        let needs_detail = entry.keys().is_none()
            || (entry.selection().is_some() && in_memory_selection.is_none());
        if needs_detail {
            if let Entry::Vacant(slot) = fetched.entry(run.shard) {
                let detail = match DetailSource::for_shard(index, location, run.shard) {
                    Some(src) => {
                        let d = src.fetch(opts, &stats)?;
                        (d.keys, d.selection)
                    }
                    None => (None, None),
                };
                slot.insert(detail);
            }
        }
        let (detail_keys, detail_selection) = match fetched.get(&run.shard) {
            Some((k, s)) => (k.as_ref(), s.as_deref()),
            None => (None, None),
        };
        let Some(shard_keys) = entry.keys().or(detail_keys.map(Vec::as_slice)) else {
            continue;
        };
        // A subset's runs count selected samples: look their ordinals up.
        let selection = in_memory_selection.as_deref().or(detail_selection);
        match (entry.selection(), selection) {
            (None, _) => keys.extend(
                shard_keys[run.start as usize..run.end as usize]
                    .iter()
                    .cloned(),
            ),
            (Some(_), Some(kept)) => keys.extend(
                kept[run.start as usize..run.end as usize]
                    .iter()
                    .map(|&o| shard_keys[o as usize].clone()),
            ),
            (Some(_), None) => {
                return Err(format!(
                    "the subset of {} has no samples in its detail block",
                    redact_url(&entry.url)
                ))
            }
        }
    }
    Ok(keys)
}

/// `name` (a detail file) relative to the index's `location`: a folder path or URL. A name that
/// is itself a URL or an absolute path stands as it is.
pub fn join_location(location: Option<&str>, name: &str) -> String {
    match location {
        _ if name.contains("://") || name.starts_with('/') => name.to_string(),
        Some(base) if !base.is_empty() => {
            // A query (a presigned folder URL makes no sense, but an HTTP mirror may have one)
            // stays at the end.
            let (path, query) = match base.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (base, None),
            };
            let joined = format!("{}/{name}", path.trim_end_matches('/'));
            match query {
                Some(q) => format!("{joined}?{q}"),
                None => joined,
            }
        }
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::detail::encode;

    #[test]
    fn detail_files_are_found_beside_the_manifest() {
        assert_eq!(
            join_location(Some("/data/idx/"), "d-0.bin"),
            "/data/idx/d-0.bin"
        );
        assert_eq!(
            join_location(Some("s3://b/idx"), "d-0.bin"),
            "s3://b/idx/d-0.bin"
        );
        assert_eq!(
            join_location(Some("https://h/idx?v=1"), "d.bin"),
            "https://h/idx/d.bin?v=1"
        );
        assert_eq!(
            join_location(Some("s3://b/idx"), "/abs/d.bin"),
            "/abs/d.bin"
        );
        assert_eq!(join_location(None, "d.bin"), "d.bin");
    }

    #[test]
    fn offsets_come_from_the_block_of_the_shard_in_a_detail_file() {
        let dir = std::env::temp_dir().join(format!("ss-seek-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shard_url = "s3://bucket/d/00003.tar";
        let other = encode("s3://bucket/d/00002.tar", 1, &ShardDetail::default());
        let block = encode(
            shard_url,
            3,
            &ShardDetail {
                offsets: Some(vec![0, 1024, 3072, 4096]),
                ..ShardDetail::default()
            },
        );
        let file = dir.join("detail-00000.bin");
        std::fs::write(&file, [other.clone(), block.clone()].concat()).unwrap();
        let src = DetailSource {
            url: file.display().to_string(),
            offset: other.len() as u64,
            len: block.len() as u32,
            shard_url: shard_url.into(),
            num_samples: 3,
        };
        let (opts, stats) = (SourceOptions::default(), Arc::new(SourceStats::default()));
        assert_eq!(src.offset_of(2, &opts, &stats).unwrap(), Some(3072));
        // The block of the neighbouring shard, a block cut by a short file, a missing file.
        let wrong = DetailSource {
            offset: 0,
            len: other.len() as u32,
            ..src.clone()
        };
        assert!(wrong
            .offset_of(1, &opts, &stats)
            .unwrap_err()
            .contains("00003.tar"));
        let short = DetailSource {
            len: block.len() as u32 + 10,
            ..src.clone()
        };
        assert!(short
            .offset_of(1, &opts, &stats)
            .unwrap_err()
            .contains("ends"));
        let missing = DetailSource {
            url: dir.join("gone.bin").display().to_string(),
            ..src
        };
        let err = missing.offset_of(1, &opts, &stats).unwrap_err();
        assert!(
            err.contains("gone.bin") && err.contains("00003.tar"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
