//! The dataset index: per shard its URL, size, sample count, per-sample byte offsets and the
//! invalid samples that validation found. Counts make exact epochs possible (see
//! [`crate::plan`]); offsets let a reader seek to a sample (HTTP Range, file seek) instead of
//! reading a shard from its start.
//!
//! Two layouts, documented in `docs/epoch-plan.md` "Index format": version 1, one JSON document
//! holding everything (`json_v1`), and version 2, a manifest that every rank loads, O(shards)
//! (`manifest`), with the per-sample detail in blocks a reader fetches per shard (`detail`).
//! A subset of an index is an index whose shards carry their selection (`subset`).

mod codec;
pub mod detail;
mod json_v1;
pub mod manifest;
pub mod subset;
pub mod units;

use crate::error::Reason;
use crate::read::source::redact_url;
use crate::rng::{hash_bytes, mix64};
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::sync::Arc;

/// `format` of an index document.
pub const INDEX_FORMAT: &str = "shardstream-index";
/// The JSON (version 1) index version.
pub const INDEX_VERSION: u32 = 1;
/// The most bytes an index may have once decompressed (10 million samples take about 50 MB), so
/// a hostile gzip file cannot exhaust memory.
pub const MAX_INDEX_BYTES: u64 = 4 << 30;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("not a shardstream index: {0}")]
    Format(String),
    #[error(
        "index version {found} is not supported (this shardstream reads versions 1 and 2); \
         upgrade shardstream or rebuild the index"
    )]
    Version { found: u64 },
    #[error("bad index entry for shard {url}: {message}")]
    Shard { url: String, message: String },
}

pub(crate) fn shard_error(url: &str, message: impl Into<String>) -> IndexError {
    IndexError::Shard {
        url: redact_url(url),
        message: message.into(),
    }
}

/// A sample that validation rejected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidSample {
    /// Position of the sample in the shard, counting every sample from 0.
    pub ordinal: u64,
    pub key: String,
    pub reason: Reason,
    #[serde(default)]
    pub detail: String,
}

/// One shard of the index. Every rank holds one per shard (1.28 M for LAION-2B), so the entry
/// itself keeps only what most shards have; what only some sources or some ways of loading
/// need is in [`ShardExtra`], behind one pointer that is null for a plain tar index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardEntry {
    pub url: String,
    /// Bytes of the shard file as stored (compressed size for `.tar.gz`), when known.
    pub size: Option<u64>,
    /// Samples in the shard, invalid ones included.
    pub num_samples: u64,
    /// gzip-compressed tar: offsets then count in the decompressed stream, so they cannot be used
    /// to seek in the file, only to skip while reading.
    pub compressed: bool,
    /// Ordinals of the samples validation rejected, sorted: what the plan skips. Every rank
    /// holds these (8 bytes each); their keys and reasons are per-sample detail. An empty list
    /// is one shared allocation ([`crate::plan::shared_ordinals`]), not one per shard.
    pub invalid: Arc<[u64]>,
    /// What identifies the shard's content when it was indexed (an ETag, or size and mtime), so
    /// that a shard replaced since is found out instead of read with stale offsets. A boxed str:
    /// 8 bytes a shard less than a String, and an index from counts has none.
    pub identity: Option<Box<str>>,
    /// Where a version-2 index keeps this shard's offsets and keys (None: they are in memory,
    /// or there are none).
    pub detail_ref: Option<DetailRef>,
    /// What only some shards have (see [`ShardExtra`]); None when the shard has none of it.
    extra: Option<Box<ShardExtra>>,
}

/// The fields of a shard entry that only some shards have, held apart so that the common
/// entry stays small (issue 50: they had grown a rank's start-up memory past its target at
/// 1.28 M shards). A manifest loaded from a folder index of tar shards leaves every one empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardExtra {
    /// `num_samples + 1` byte offsets in the (uncompressed) tar stream: entry i < n is where the
    /// first header of sample i starts, entry n is where the data of the last sample ends (the
    /// end-of-archive blocks or trailing bytes start there). In memory after a scan or from a
    /// version-1 index; a version-2 manifest keeps them in the detail block.
    pub offsets: Option<Vec<u64>>,
    /// Every sample's key in order, when the index was written with keys (in memory as offsets).
    pub keys: Option<Vec<String>>,
    /// The invalid samples with key, reason and detail, sorted by ordinal, when held in memory
    /// (a scan, a version-1 index); a version-2 manifest keeps them in the detail block.
    pub invalid_details: Vec<InvalidSample>,
    /// A subset of the shard (keys, uids, a filter): the plan schedules only these samples.
    pub selection: Option<Selection>,
    /// A Parquet file's rows per row group, from its footer (summing to `num_samples`): the
    /// plan's units are then its row groups (`units`), not the whole file. O(row groups).
    pub row_groups: Option<Vec<u64>>,
}

impl ShardExtra {
    fn is_empty(&self) -> bool {
        self.offsets.is_none()
            && self.keys.is_none()
            && self.invalid_details.is_empty()
            && self.selection.is_none()
            && self.row_groups.is_none()
    }
}

/// The samples a subset keeps of one shard, all valid. The manifest holds the count and a hash
/// (what the plan and the fingerprint need: O(shards)); the ordinals are in memory (a subset
/// just made) or in the shard's detail block, read when a reader opens the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub count: u64,
    pub hash: u64,
    pub ordinals: Option<Arc<[u64]>>,
}

impl Selection {
    /// The selection of these ordinals (sorted and deduplicated here).
    pub fn new(mut ordinals: Vec<u64>) -> Self {
        ordinals.sort_unstable();
        ordinals.dedup();
        Self {
            count: ordinals.len() as u64,
            hash: selection_hash(&ordinals),
            ordinals: Some(ordinals.into()),
        }
    }
}

/// What the manifest records of a selection's ordinals, so that the fingerprint changes with them.
pub fn selection_hash(ordinals: &[u64]) -> u64 {
    ordinals
        .iter()
        .fold(mix64(0x5345_4c45_4354 ^ ordinals.len() as u64), |h, &o| {
            mix64(h ^ mix64(o))
        })
}

/// Where one shard's detail block lies: bytes `offset..offset + len` of detail file `file` (a
/// name in [`Index::detail_files`], relative to the index's location).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetailRef {
    pub file: u32,
    pub offset: u64,
    /// Never 0 (a block ends in its 8-byte checksum): the spare value makes an
    /// `Option<DetailRef>` as small as a `DetailRef`, 8 bytes less in every shard entry.
    pub len: NonZeroU32,
}

impl ShardEntry {
    /// A shard known only by its URL and sample count.
    pub fn new(url: impl Into<String>, num_samples: u64) -> Self {
        let url = url.into();
        let compressed = crate::read::group::is_gzip_name(&url);
        Self {
            url,
            size: None,
            num_samples,
            compressed,
            invalid: crate::plan::shared_ordinals(Vec::new()),
            identity: None,
            detail_ref: None,
            extra: None,
        }
    }

    /// The per-sample byte offsets, when held in memory (see [`ShardExtra::offsets`]).
    pub fn offsets(&self) -> Option<&[u64]> {
        self.extra.as_ref()?.offsets.as_deref()
    }

    /// Every sample's key, when held in memory.
    pub fn keys(&self) -> Option<&[String]> {
        self.extra.as_ref()?.keys.as_deref()
    }

    /// The invalid samples with their keys and reasons, when held in memory (else empty).
    pub fn invalid_details(&self) -> &[InvalidSample] {
        self.extra
            .as_ref()
            .map_or(&[][..], |e| e.invalid_details.as_slice())
    }

    /// The samples a subset keeps of this shard; None when the index is not a subset.
    pub fn selection(&self) -> Option<&Selection> {
        self.extra.as_ref()?.selection.as_ref()
    }

    /// A Parquet file's rows per row group, when the index records them.
    pub fn row_groups(&self) -> Option<&[u64]> {
        self.extra.as_ref()?.row_groups.as_deref()
    }

    /// The fields only some shards have, to set (made here when the entry has none yet;
    /// [`Index::new`] drops them again when left empty).
    pub fn extra_mut(&mut self) -> &mut ShardExtra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Takes the fields only some shards have out of the entry.
    pub fn take_extra(&mut self) -> ShardExtra {
        self.extra.take().map(|e| *e).unwrap_or_default()
    }

    /// Puts them back (None when empty, so that the entry holds no empty box).
    pub fn set_extra(&mut self, extra: ShardExtra) {
        self.extra = (!extra.is_empty()).then(|| Box::new(extra));
    }

    /// The samples the plan schedules: the selection's, or every valid one.
    pub fn num_valid(&self) -> u64 {
        match self.selection() {
            Some(selection) => selection.count,
            None => self.num_samples - self.invalid.len() as u64,
        }
    }

    /// Sets the invalid samples from their details (ordinals and details together).
    pub fn set_invalid(&mut self, mut details: Vec<InvalidSample>) {
        details.sort_by_key(|s| s.ordinal);
        self.invalid = crate::plan::shared_ordinals(details.iter().map(|s| s.ordinal).collect());
        self.extra_mut().invalid_details = details;
    }

    /// Byte range `[from, to)` of samples `start..end` in the uncompressed tar stream (the bytes
    /// an HTTP Range request fetches for an uncompressed shard), when offsets are known.
    pub fn byte_range(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let offsets = self.offsets()?;
        if start > end || end > self.num_samples {
            return None;
        }
        Some((offsets[start as usize], offsets[end as usize]))
    }

    pub fn key(&self, ordinal: u64) -> Option<&str> {
        self.keys()?.get(ordinal as usize).map(String::as_str)
    }

    fn validate(&mut self) -> Result<(), IndexError> {
        if self.url.is_empty() {
            return Err(shard_error("<empty>", "the URL is empty"));
        }
        // Normal form: no empty box of extra fields, and one shared empty invalid list.
        if self.extra.as_ref().is_some_and(|e| e.is_empty()) {
            self.extra = None;
        }
        if self.invalid.is_empty() {
            self.invalid = crate::plan::shared_ordinals(Vec::new());
        }
        let n = self.num_samples;
        if let Some(offsets) = self.offsets() {
            if offsets.len() as u64 != n + 1 {
                return Err(shard_error(
                    &self.url,
                    format!(
                        "{} offsets for {n} samples, expected {}",
                        offsets.len(),
                        n + 1
                    ),
                ));
            }
            if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
                return Err(shard_error(
                    &self.url,
                    format!("offset of sample {} is before the previous one", i + 1),
                ));
            }
            if let (Some(size), false, Some(&last)) = (self.size, self.compressed, offsets.last()) {
                if last > size {
                    return Err(shard_error(
                        &self.url,
                        format!("offsets end at byte {last}, after the file's {size} bytes"),
                    ));
                }
            }
        }
        if let Some(keys) = self.keys() {
            if keys.len() as u64 != n {
                return Err(shard_error(
                    &self.url,
                    format!("{} keys for {n} samples", keys.len()),
                ));
            }
        }
        if let Some(extra) = self.extra.as_mut() {
            extra.invalid_details.sort_by_key(|s| s.ordinal);
        }
        if !self.invalid_details().is_empty()
            && !self
                .invalid_details()
                .iter()
                .map(|s| s.ordinal)
                .eq(self.invalid.iter().copied())
        {
            let mut sorted = self.invalid.to_vec();
            sorted.sort_unstable();
            if !self
                .invalid_details()
                .iter()
                .map(|s| s.ordinal)
                .eq(sorted.iter().copied())
            {
                return Err(shard_error(
                    &self.url,
                    "the invalid samples' details do not match their ordinals",
                ));
            }
        }
        if !self.invalid.windows(2).all(|w| w[0] <= w[1]) {
            let mut sorted = self.invalid.to_vec();
            sorted.sort_unstable();
            self.invalid = sorted.into();
        }
        if let Some(selection) = self.selection() {
            if let Some(ordinals) = &selection.ordinals {
                if ordinals.len() as u64 != selection.count
                    || !ordinals.windows(2).all(|w| w[0] < w[1])
                    || ordinals.last().is_some_and(|&o| o >= n)
                {
                    return Err(shard_error(
                        &self.url,
                        "the subset's ordinals are not sorted, distinct ordinals of the shard",
                    ));
                }
                if let Some(bad) = ordinals
                    .iter()
                    .find(|o| self.invalid.binary_search(o).is_ok())
                {
                    return Err(shard_error(
                        &self.url,
                        format!("the subset keeps sample {bad}, which validation rejected"),
                    ));
                }
            } else if selection.count > n {
                return Err(shard_error(
                    &self.url,
                    format!("the subset keeps {} of {n} samples", selection.count),
                ));
            }
        }
        if let Some(groups) = self.row_groups() {
            let rows = groups.iter().try_fold(0u64, |a, &g| a.checked_add(g));
            if rows != Some(n) {
                return Err(shard_error(
                    &self.url,
                    format!(
                        "its {} row groups hold {} rows, but it has {n} samples",
                        groups.len(),
                        rows.map_or("more than 2^64".to_string(), |r| r.to_string())
                    ),
                ));
            }
        }
        if let Some(pair) = self.invalid.windows(2).find(|p| p[0] == p[1]) {
            return Err(shard_error(
                &self.url,
                format!("sample {} is listed as invalid twice", pair[0]),
            ));
        }
        if let Some(&bad) = self.invalid.last().filter(|&&o| o >= n) {
            let key = self
                .invalid_details()
                .last()
                .map(|d| format!(" (key {:?})", d.key))
                .unwrap_or_default();
            return Err(shard_error(
                &self.url,
                format!("invalid sample {bad}{key} is beyond the {n} samples"),
            ));
        }
        Ok(())
    }
}

/// The last path component without query or fragment: what identifies a shard when a dataset
/// moves (local disk, HTTP mirror, S3 bucket).
pub(crate) fn shard_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// The index of a dataset (its shards in a fixed order: the plan refers to shards by position).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Index {
    shards: Vec<ShardEntry>,
    /// Version 2: the detail files that [`DetailRef::file`] numbers, relative to the index.
    detail_files: Vec<String>,
}

impl Index {
    /// An index of these shards, after checking each entry (sorts invalid samples by ordinal).
    pub fn new(mut shards: Vec<ShardEntry>) -> Result<Self, IndexError> {
        if shards.len() > u32::MAX as usize {
            return Err(IndexError::Format(format!(
                "{} shards, at most {} supported",
                shards.len(),
                u32::MAX
            )));
        }
        for shard in &mut shards {
            shard.validate()?;
        }
        Ok(Self {
            shards,
            detail_files: Vec::new(),
        })
    }

    /// An index whose entries may point into these detail files (a version-2 manifest).
    pub fn with_detail_files(
        shards: Vec<ShardEntry>,
        detail_files: Vec<String>,
    ) -> Result<Self, IndexError> {
        let mut index = Self::new(shards)?;
        index.detail_files = detail_files;
        Ok(index)
    }

    /// Parses a version-1 JSON index (plain or gzip-compressed).
    pub fn from_json(bytes: &[u8]) -> Result<Self, IndexError> {
        json_v1::parse(bytes, MAX_INDEX_BYTES)
    }

    /// Parses an index in either layout: a version-2 manifest, or version-1 JSON (plain or
    /// gzip-compressed).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IndexError> {
        if manifest::is_manifest(bytes) {
            manifest::decode(bytes)
        } else {
            json_v1::parse(bytes, MAX_INDEX_BYTES)
        }
    }

    /// The index [`Index::to_layout`] wrote, with every detail block read back into memory from
    /// `detail` (the bytes of its one detail file): how an in-memory index, a subset's included,
    /// travels whole to another process.
    pub fn from_layout(manifest_bytes: &[u8], detail_bytes: &[u8]) -> Result<Self, IndexError> {
        let mut index = manifest::decode(manifest_bytes)?;
        for shard in &mut index.shards {
            let Some(r) = shard.detail_ref.take() else {
                continue;
            };
            let block = usize::try_from(r.offset)
                .ok()
                .and_then(|start| detail_bytes.get(start..start + r.len.get() as usize))
                .ok_or_else(|| {
                    shard_error(&shard.url, "its detail block lies past the detail bytes")
                })?;
            let detail = detail::decode(block, &shard.url, shard.num_samples)?;
            let mut extra = shard.take_extra();
            extra.offsets = detail.offsets;
            extra.keys = detail.keys;
            extra.invalid_details = detail.invalid;
            if let Some(selection) = extra.selection.as_mut() {
                selection.ordinals = detail.selection.map(Into::into);
            }
            shard.set_extra(extra);
        }
        index.detail_files.clear();
        Ok(index)
    }

    /// The version-1 JSON document: a header, then one shard per line (a subset's selection
    /// has no place in it: write a subset with [`Index::to_layout`]).
    pub fn to_json(&self) -> Vec<u8> {
        json_v1::write(self)
    }

    /// [`Index::to_json`], gzip-compressed.
    pub fn to_json_gz(&self) -> Vec<u8> {
        json_v1::write_gz(self)
    }

    /// The version-2 layout of this index: (manifest, detail file). The offsets and keys held in
    /// memory go to one detail file, named `detail_file` in the manifest; shards that already
    /// point into detail files keep pointing there.
    pub fn to_layout(&self, detail_file: &str) -> (Vec<u8>, Vec<u8>) {
        let mut files = self.detail_files.clone();
        let file = files.len() as u32;
        let mut blob = Vec::new();
        let mut shards = self.shards.clone();
        let mut used = false;
        for shard in &mut shards {
            // The per-sample detail goes to the block; a selection's count and hash and the
            // row groups stay in the entry (the manifest records them).
            let mut extra = shard.take_extra();
            let detail = detail::ShardDetail {
                offsets: extra.offsets.take(),
                keys: extra.keys.take(),
                invalid: std::mem::take(&mut extra.invalid_details),
                selection: extra
                    .selection
                    .as_mut()
                    .and_then(|s| s.ordinals.take())
                    .map(|o| o.to_vec()),
            };
            shard.set_extra(extra);
            if detail.is_empty() {
                continue;
            }
            let block = detail::encode(&shard.url, shard.num_samples, &detail);
            shard.detail_ref = Some(DetailRef {
                file,
                offset: blob.len() as u64,
                len: NonZeroU32::new(block.len() as u32)
                    .expect("a detail block ends in its checksum"),
            });
            blob.extend_from_slice(&block);
            used = true;
        }
        if used {
            files.push(detail_file.to_string());
        }
        let layout = Index {
            shards,
            detail_files: files,
        };
        (manifest::encode(&layout), blob)
    }

    /// An index whose shard i is shard `parts[i].1` of index `parts[i].0`, as it is there
    /// (counts, invalid samples, identity, offsets and keys in memory or in a detail file). How an
    /// index is updated: unchanged shards are taken from the old index, new ones from a scan.
    /// Detail files of different indexes are found by name beside the new index, so every part
    /// whose shards point into detail files must live in the same folder.
    pub fn assemble(parts: &[(&Index, u32)]) -> Result<Self, IndexError> {
        let mut files: Vec<String> = Vec::new();
        let mut shards = Vec::with_capacity(parts.len());
        for &(index, i) in parts {
            let mut entry = index
                .shard(i)
                .ok_or_else(|| {
                    IndexError::Format(format!("no shard {i} in an index of {}", index.len()))
                })?
                .clone();
            if let Some(r) = entry.detail_ref.as_mut() {
                let name = &index.detail_files[r.file as usize];
                r.file = match files.iter().position(|f| f == name) {
                    Some(p) => p as u32,
                    None => {
                        files.push(name.clone());
                        (files.len() - 1) as u32
                    }
                };
            }
            shards.push(entry);
        }
        Self::with_detail_files(shards, files)
    }

    pub fn detail_files(&self) -> &[String] {
        &self.detail_files
    }

    /// An index from img2dataset's per-shard `NNNNN_stats.json` files, given as (shard URL, stats
    /// bytes). Their `successes` is the shard's sample count; there are no offsets, so the plan
    /// is exact but readers read each shard from its start.
    pub fn from_img2dataset_stats<'a>(
        shards: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Self, IndexError> {
        #[derive(Deserialize)]
        struct Stats {
            successes: u64,
        }
        let entries = shards
            .into_iter()
            .map(|(url, bytes)| {
                let stats: Stats = serde_json::from_slice(bytes).map_err(|e| {
                    shard_error(
                        url,
                        format!("img2dataset stats without a \"successes\" count: {e}"),
                    )
                })?;
                Ok(ShardEntry::new(url, stats.successes))
            })
            .collect::<Result<Vec<_>, IndexError>>()?;
        Self::new(entries)
    }

    pub fn shards(&self) -> &[ShardEntry] {
        &self.shards
    }

    pub fn shard(&self, shard: u32) -> Option<&ShardEntry> {
        self.shards.get(shard as usize)
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Samples in all shards, invalid ones included.
    pub fn num_samples(&self) -> u64 {
        self.shards.iter().map(|s| s.num_samples).sum()
    }

    pub fn num_valid(&self) -> u64 {
        self.shards.iter().map(ShardEntry::num_valid).sum()
    }

    /// True when every shard has offsets (readers can seek).
    pub fn has_offsets(&self) -> bool {
        self.shards.iter().all(|s| s.offsets().is_some())
    }

    /// A stable 64-bit hash of what the epoch plan depends on: the shard order, each shard's file
    /// name (last path component, without query, so a dataset can move between disk, HTTP and
    /// S3), its sample count, its invalid ordinals and a Parquet file's row groups. A resume
    /// state saved for one index is refused on an index with another fingerprint.
    pub fn fingerprint(&self) -> u64 {
        let mut h = mix64(0x5353_4944_5846_5031 ^ self.shards.len() as u64);
        let mut feed = |x: u64| h = mix64(h ^ mix64(x));
        for shard in &self.shards {
            feed(hash_bytes(shard_name(&shard.url).as_bytes()));
            feed(shard.num_samples);
            feed(shard.invalid.len() as u64);
            for &bad in shard.invalid.iter() {
                feed(bad);
            }
            // Only subsets feed more, so the fingerprints of whole datasets stay as they were.
            if let Some(selection) = shard.selection() {
                feed(selection.count);
                feed(selection.hash);
            }
            // The row groups are the plan's units: another layout of the same rows is
            // another plan.
            if let Some(groups) = shard.row_groups() {
                feed(0x524f_5747_5250 ^ groups.len() as u64);
                for &g in groups.iter() {
                    feed(g);
                }
            }
        }
        h
    }
}

/// Where img2dataset writes the stats of a shard: `.../00012.tar` -> `.../00012_stats.json`
/// (query and fragment dropped). None when the name does not end in `.tar`, `.tar.gz` or `.tgz`.
pub fn img2dataset_stats_url(shard_url: &str) -> Option<String> {
    let path = shard_url.split(['?', '#']).next().unwrap_or(shard_url);
    [".tar.gz", ".tgz", ".tar"]
        .iter()
        .find_map(|ext| path.strip_suffix(ext))
        .map(|stem| format!("{stem}_stats.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str, n: u64, bad: &[u64]) -> ShardEntry {
        let mut e = ShardEntry::new(url, n);
        e.size = Some(n * 2048 + 1024);
        e.extra_mut().offsets = Some((0..=n).map(|i| i * 2048).collect());
        e.set_invalid(
            bad.iter()
                .map(|&o| InvalidSample {
                    ordinal: o,
                    key: format!("{o:05}"),
                    reason: Reason::CorruptImage,
                    detail: String::new(),
                })
                .collect(),
        );
        e
    }

    fn sample_index() -> Index {
        let mut odd = entry("https://host/data/odd.tar?X-Amz-Signature=secret", 3, &[]);
        odd.extra_mut().offsets = Some(vec![0, 700, 1400, 2100]); // not on 512-byte boundaries
        odd.size = Some(3000);
        let mut keyed = entry("/data/b/00001.tar", 2, &[1]);
        keyed.extra_mut().keys = Some(vec!["a".into(), "b".into()]);
        keyed.extra_mut().invalid_details[0].detail = "truncated JPEG".into();
        Index::new(vec![
            entry("/data/a/00000.tar", 5, &[3, 0]),
            keyed,
            odd,
            entry("s3://b/p/00002.tar.gz", 0, &[]),
        ])
        .unwrap()
    }

    #[test]
    fn json_round_trips_plain_and_gzip() {
        let index = sample_index();
        let json = index.to_json();
        assert_eq!(Index::from_json(&json).unwrap(), index);
        assert_eq!(Index::from_json(&index.to_json_gz()).unwrap(), index);
        let text = String::from_utf8(json).unwrap();
        assert!(text.starts_with("{\"format\":\"shardstream-index\",\"version\":1,"));
        assert!(
            text.contains(
                "\"offsets\":{\"encoding\":\"delta\",\"unit\":512,\"values\":[0,4,4,4,4,4]}"
            ),
            "{text}"
        );
        assert!(text.contains("\"unit\":1,\"values\":[0,700,700,700]"));
        assert!(text.contains("\"reason\":\"corrupt_image\""));
        assert_eq!(text.lines().count(), 6);
        assert!(index.shards()[3].compressed);
        assert_eq!(*index.shards()[0].invalid, [0, 3]);
        assert_eq!(index.shards()[0].invalid_details()[1].key, "00003");
    }

    #[test]
    fn plain_offset_lists_and_defaults_are_accepted() {
        let json = br#"{"format": "shardstream-index", "version": 1, "future_field": 1,
            "shards": [{"url": "x/0.tar", "num_samples": 2, "offsets": [0, 1536, 4096]}]}"#;
        let index = Index::from_json(json).unwrap();
        let shard = index.shard(0).unwrap();
        assert_eq!(shard.offsets(), Some(&[0, 1536, 4096][..]));
        assert_eq!(shard.byte_range(1, 2), Some((1536, 4096)));
        assert_eq!(shard.byte_range(0, 3), None);
        assert!(!shard.compressed && shard.invalid.is_empty() && shard.size.is_none());
    }

    #[test]
    fn compact_offsets_are_much_smaller_than_plain_ones() {
        // 10 000 samples of about 60 kB: absolute offsets take 7-9 digits, deltas in tar blocks 3.
        let offsets: Vec<u64> = (0..=10_000u64)
            .map(|i| i * 60_416 + (i % 7) * 512)
            .collect();
        let mut shard = ShardEntry::new("s.tar", 10_000);
        shard.extra_mut().offsets = Some(offsets.clone());
        let compact = Index::new(vec![shard]).unwrap().to_json().len();
        let plain = serde_json::to_vec(&offsets).unwrap().len();
        assert!(compact * 2 < plain, "{compact} vs {plain}");
    }

    #[test]
    fn wrong_documents_are_refused_with_clear_errors() {
        let newer = br#"{"format": "shardstream-index", "version": 2, "shards": "whatever"}"#;
        assert!(matches!(
            Index::from_json(newer),
            Err(IndexError::Version { found: 2 })
        ));
        let other = br#"{"format": "something-else", "version": 1, "shards": []}"#;
        assert!(Index::from_json(other)
            .unwrap_err()
            .to_string()
            .contains("something-else"));
        assert!(matches!(
            Index::from_json(b"{not json"),
            Err(IndexError::Format(_))
        ));
        assert!(matches!(
            Index::from_json(&[0x1f, 0x8b, 1, 2, 3]),
            Err(IndexError::Format(_))
        ));
        let bad_reason =
            br#"{"format": "shardstream-index", "version": 1, "shards": [{"url": "a.tar",
            "num_samples": 1, "invalid": [{"ordinal": 0, "key": "k", "reason": "gremlins"}]}]}"#;
        assert!(Index::from_json(bad_reason)
            .unwrap_err()
            .to_string()
            .contains("gremlins"));
    }

    #[test]
    fn inconsistent_entries_name_the_shard_without_secrets() {
        let url = "https://host/d/00007.tar?X-Amz-Signature=secret";
        let cases: Vec<(ShardEntry, &str)> = vec![
            (
                {
                    let mut e = entry(url, 3, &[]);
                    e.extra_mut().offsets.as_mut().unwrap().pop();
                    e
                },
                "3 offsets for 3 samples",
            ),
            (
                {
                    let mut e = entry(url, 3, &[]);
                    e.extra_mut().offsets = Some(vec![0, 10, 5, 20]);
                    e
                },
                "before the previous",
            ),
            (
                {
                    let mut e = entry(url, 3, &[]);
                    e.size = Some(100);
                    e
                },
                "after the file's 100 bytes",
            ),
            (entry(url, 3, &[3]), "beyond the 3 samples"),
            (entry(url, 3, &[1, 1]), "invalid twice"),
            (
                {
                    let mut e = entry(url, 3, &[]);
                    e.extra_mut().keys = Some(vec!["a".into()]);
                    e
                },
                "1 keys for 3 samples",
            ),
        ];
        for (bad, expected) in cases {
            let message = Index::new(vec![bad]).unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
            assert!(
                message.contains("00007.tar") && !message.contains("secret"),
                "{message}"
            );
        }
        let mut gz = entry("s3://b/x.tar.gz", 3, &[]);
        gz.size = Some(10); // compressed: offsets count in the decompressed stream
        assert!(Index::new(vec![gz]).is_ok());
    }

    #[test]
    fn gzip_bombs_are_cut_off() {
        let index = sample_index();
        let gz = index.to_json_gz();
        assert!(json_v1::parse(&gz, 100)
            .unwrap_err()
            .to_string()
            .contains("more than 100 bytes"));
        assert!(json_v1::parse(&gz, 1 << 20).is_ok());
    }

    #[test]
    fn fingerprint_is_stable_under_moves_and_changes_with_the_data() {
        let index = sample_index();
        let fp = index.fingerprint();
        // Pinned: a change here breaks every saved loader state.
        assert_eq!(fp, 0x732d_6f05_cd35_77e8, "fingerprint changed: {fp:#018x}");
        let mut moved = index.shards().to_vec();
        moved[0].url = "s3://bucket/elsewhere/00000.tar".into();
        moved[2].url = "/local/odd.tar".into();
        moved[1].extra_mut().offsets = None;
        assert_eq!(Index::new(moved).unwrap().fingerprint(), fp);
        let mut changed = index.shards().to_vec();
        changed[0].num_samples += 1;
        changed[0].extra_mut().offsets = None;
        assert_ne!(Index::new(changed).unwrap().fingerprint(), fp);
        let mut revalidated = index.shards().to_vec();
        revalidated[0].invalid = revalidated[0].invalid[..1].into();
        revalidated[0].extra_mut().invalid_details.pop();
        assert_ne!(Index::new(revalidated).unwrap().fingerprint(), fp);
        let mut reordered = index.shards().to_vec();
        reordered.swap(0, 1);
        assert_ne!(Index::new(reordered).unwrap().fingerprint(), fp);
    }

    #[test]
    fn plan_input_carries_counts_and_fingerprint() {
        let index = sample_index();
        let input = index.plan_input();
        assert_eq!(input.num_valid(), index.num_valid());
        assert_eq!(index.num_valid(), 3 + 1 + 3);
        assert_eq!(index.num_samples(), 10);
        assert_eq!(input.fingerprint(), index.fingerprint());
        assert_eq!(*input.shards()[0].invalid, [0, 3]);
        assert_eq!(index.shard(1).unwrap().key(0), Some("a"));
        assert_eq!(index.shard(0).unwrap().key(0), None);
    }

    #[test]
    fn img2dataset_stats_give_counts_without_offsets() {
        // The fields img2dataset's write_stats writes.
        let stats = |ok: u64| {
            format!(
                r#"{{"count": 10000, "successes": {ok}, "failed_to_download": {}, "failed_to_resize": 3,
                "duration": 12.5, "status_dict": {{"success": {ok}}}}}"#,
                9997 - ok
            )
        };
        let (a, b) = (stats(9120), stats(8805));
        let index = Index::from_img2dataset_stats([
            ("s3://b/00000.tar", a.as_bytes()),
            ("s3://b/00001.tar", b.as_bytes()),
        ])
        .unwrap();
        assert_eq!(index.num_valid(), 9120 + 8805);
        assert!(!index.has_offsets());
        let back = Index::from_json(&index.to_json()).unwrap();
        assert_eq!(back, index);
        let err = Index::from_img2dataset_stats([("s3://b/00002.tar?sig=x", &b"{}"[..])])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("00002.tar") && err.contains("successes") && !err.contains("sig=x"),
            "{err}"
        );
        assert_eq!(
            img2dataset_stats_url("s3://b/p/00012.tar").as_deref(),
            Some("s3://b/p/00012_stats.json")
        );
        assert_eq!(
            img2dataset_stats_url("/d/00012.tar.gz?x=1").as_deref(),
            Some("/d/00012_stats.json")
        );
        assert_eq!(img2dataset_stats_url("/d/00012.zip"), None);
    }
}

#[cfg(test)]
mod entry_size {
    use super::*;

    /// Every rank holds one entry per shard (1.28 M for LAION-2B): a field added to it costs
    /// that many times its size, and start-up memory at that scale has a target (issue 50: it
    /// had crept from 466 to 504 MB, 8 bytes at a time). This pins the size so that growth is a
    /// decision: a field only some shards need goes in `ShardExtra`, behind the one pointer.
    /// 112 bytes: URL 24, size 16, count 8, invalid ordinals 16, identity 16, detail block 16,
    /// the extra fields' pointer 8, the gzip flag (padded to 8); it was 208.
    #[test]
    fn a_shard_entry_stays_small() {
        let size = std::mem::size_of::<ShardEntry>();
        assert!(size <= 112, "ShardEntry is {size} bytes");
        assert_eq!(
            std::mem::size_of::<Option<DetailRef>>(),
            std::mem::size_of::<DetailRef>()
        );
    }

    /// What a plain tar shard's entry holds on the heap beyond its URL: nothing. No box of extra
    /// fields, and the empty invalid list is one allocation shared by every shard (an
    /// `Arc<[u64]>` of no element still allocates its counts: 32 bytes a shard).
    #[test]
    fn a_loaded_tar_entry_holds_nothing_but_its_url() {
        let mut a = ShardEntry::new("s3://b/d/00000.tar", 10);
        a.identity = Some("etag:1".into());
        let b = ShardEntry::new("s3://b/d/00001.tar", 10);
        let index = Index::new(vec![a, b]).unwrap();
        let (manifest, _) = index.to_layout("detail.bin");
        for loaded in [index, Index::from_bytes(&manifest).unwrap()] {
            let (a, b) = (&loaded.shards()[0], &loaded.shards()[1]);
            assert!(a.extra.is_none() && b.extra.is_none());
            assert!(Arc::ptr_eq(&a.invalid, &b.invalid));
            assert!(Arc::ptr_eq(
                &a.invalid,
                &loaded.plan_input().shards()[1].invalid
            ));
        }
        // Fields set and cleared leave no empty box behind once indexed.
        let mut c = ShardEntry::new("/d/c.tar", 2);
        c.extra_mut().offsets = Some(vec![0, 512, 1024]);
        c.extra_mut().offsets = None;
        assert!(Index::new(vec![c]).unwrap().shards()[0].extra.is_none());
    }
}
