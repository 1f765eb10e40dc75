//! The spans a planned reader opens: its plan's runs of (shard, ordinals), with where each run
//! starts in its shard. An index that holds offsets in memory (version 1) gives the byte offset
//! at once; a version-2 index gives the shard's detail block, read when the shard is opened.
//! Gzip shards cannot be entered in the middle: their offsets only say how much decompressed
//! stream to skip, which the reader does from the start.

use crate::index::units::Units;
use crate::index::Index;
use crate::plan::Run;
use crate::read::seek::{keys_of_runs, DetailSource};
use crate::read::source::{redact_url, Expected, SourceOptions};
use crate::read::span::{ShardSpan, SpanSelection};
use std::sync::Arc;

/// What to open for each shard: the URL and the name users know it by. Empty: the index's own
/// URL, redacted.
#[derive(Clone, Debug, Default)]
pub struct ShardNames {
    pub urls: Vec<String>,
    pub displays: Vec<String>,
}

/// The datasets a plan's shard numbers name: one index, or a mixture's indexes numbered source
/// after source (`plan::Mixture`), each with where its detail files live and its shard names.
#[derive(Clone, Debug)]
pub struct PlannedShards {
    parts: Vec<PlannedPart>,
}

#[derive(Clone, Debug)]
pub struct PlannedPart {
    pub index: Arc<Index>,
    pub location: Option<String>,
    pub names: Arc<ShardNames>,
    /// The index's plan units (`Index::units`): the plan numbers these, not shards.
    pub units: Arc<Units>,
}

impl PlannedShards {
    pub fn new(parts: Vec<PlannedPart>) -> Self {
        Self { parts }
    }

    /// `f(part, runs as ordinals of that part's shards, the plan's unit number of each run)`
    /// for each stretch of consecutive runs in one part, in order.
    fn for_each_part<E>(
        &self,
        runs: &[Run],
        mut f: impl FnMut(&PlannedPart, &[Run], &[u32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let firsts = self.first_units();
        let mut i = 0;
        while i < runs.len() {
            let part = firsts.partition_point(|&first| first <= runs[i].shard) - 1;
            let first = firsts[part];
            let end = firsts.get(part + 1).copied().unwrap_or(u32::MAX);
            let units = &self.parts[part].units;
            let mut local = Vec::new();
            let mut numbers = Vec::new();
            while i < runs.len() && (first..end).contains(&runs[i].shard) {
                let unit = runs[i].shard - first;
                local.push(if (unit as usize) < units.len() {
                    units.shard_run(&Run {
                        shard: unit,
                        ..runs[i]
                    })
                } else {
                    // Past the last unit: left for `planned_spans` to refuse by its number.
                    Run {
                        shard: u32::MAX,
                        ..runs[i]
                    }
                });
                numbers.push(runs[i].shard);
                i += 1;
            }
            f(&self.parts[part], &local, &numbers)?;
        }
        Ok(())
    }

    /// Each part's first unit in the plan's numbering.
    fn first_units(&self) -> Vec<u32> {
        let mut first = 0;
        self.parts
            .iter()
            .map(|p| {
                let this = first;
                first += p.units.len() as u32;
                this
            })
            .collect()
    }

    /// The spans of `runs`, shards numbered as the plan numbers them.
    pub fn spans(&self, runs: &[Run]) -> Result<Vec<ShardSpan>, String> {
        let mut out = Vec::with_capacity(runs.len());
        self.for_each_part(runs, |part, local, numbers| {
            let spans = planned_spans(&part.index, part.location.as_deref(), &part.names, local)?;
            // A span carries the plan's unit number (what the pipeline's per-shard tables and a
            // mixture's sources are keyed by); its URL, display and ordinals are the shard's.
            out.extend(spans.into_iter().zip(numbers).map(|(mut span, &unit)| {
                span.shard = unit;
                span
            }));
            Ok::<(), String>(())
        })?;
        Ok(out)
    }

    /// The keys of `runs`' samples (from memory or the shards' detail blocks).
    pub fn keys(&self, runs: &[Run], opts: &SourceOptions) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        self.for_each_part(runs, |part, local, _| {
            out.extend(keys_of_runs(
                &part.index,
                part.location.as_deref(),
                local,
                opts,
            )?);
            Ok::<(), String>(())
        })?;
        Ok(out)
    }
}

/// The spans of `runs` (ordinals of `index`'s shards) over `index`, whose detail files live at
/// `location`.
pub fn planned_spans(
    index: &Index,
    location: Option<&str>,
    names: &ShardNames,
    runs: &[Run],
) -> Result<Vec<ShardSpan>, String> {
    runs.iter()
        .map(|run| {
            let entry = index.shard(run.shard).ok_or_else(|| {
                format!(
                    "the plan names shard {} of an index of {}",
                    run.shard,
                    index.len()
                )
            })?;
            let url = names
                .urls
                .get(run.shard as usize)
                .cloned()
                .unwrap_or_else(|| entry.url.clone());
            let display = names
                .displays
                .get(run.shard as usize)
                .cloned()
                .unwrap_or_else(|| redact_url(&entry.url));
            // A subset's run counts selected samples: with the selection in memory its ordinals
            // are known now, else the reader reads them from the detail block when it opens.
            let (keep, selection) = match entry.selection() {
                None => (None, None),
                Some(s) => match &s.ordinals {
                    Some(ordinals) => {
                        let kept = ordinals
                            .get(run.start as usize..run.end as usize)
                            .ok_or_else(|| {
                                format!(
                                    "the plan names selected samples {}..{} of {}, which keeps {}",
                                    run.start,
                                    run.end,
                                    redact_url(&entry.url),
                                    s.count
                                )
                            })?;
                        (Some(Arc::<[u64]>::from(kept)), None)
                    }
                    None => (
                        None,
                        Some(SpanSelection {
                            ranks: (run.start, run.end),
                        }),
                    ),
                },
            };
            let (first, end) = match (&keep, &selection) {
                (Some(k), _) => (
                    k.first().copied().unwrap_or(0),
                    k.last().map_or(0, |&o| o + 1),
                ),
                (None, Some(_)) => (0, 0),
                (None, None) => (run.start, run.end),
            };
            let (start_offset, first_ordinal) = match entry.offsets() {
                Some(offsets) if selection.is_none() => (offsets[first as usize], first),
                _ => (0, 0),
            };
            let detail = match entry.offsets() {
                None if first > 0 || selection.is_some() => {
                    DetailSource::for_shard(index, location, run.shard)
                }
                _ => None,
            };
            Ok(ShardSpan {
                url,
                shard: run.shard,
                start_offset,
                first_ordinal,
                skip_before: first,
                end_ordinal: Some(end),
                stride: None,
                display,
                detail,
                expected: Expected::from_identity(entry.identity.as_deref()),
                keep_bytes: match (&keep, entry.offsets()) {
                    (Some(k), Some(offsets)) if !entry.compressed => {
                        crate::read::span::kept_byte_ranges(k, offsets)
                    }
                    _ => None,
                },
                keep,
                selection,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ShardEntry;

    #[test]
    fn runs_start_at_their_offset_or_at_the_detail_block() {
        let mut with_offsets = ShardEntry::new("/d/00000.tar", 3);
        with_offsets.extra_mut().offsets = Some(vec![0, 1024, 2048, 3072]);
        let mut gz = ShardEntry::new("/d/00001.tar.gz", 3);
        gz.extra_mut().offsets = Some(vec![0, 1024, 2048, 3072]);
        let counts_only = ShardEntry::new("https://h/d/00002.tar?sig=secret", 3);
        let index = Index::new(vec![with_offsets, gz, counts_only]).unwrap();
        let run = |shard, start| Run {
            shard,
            start,
            end: 3,
        };
        let names = ShardNames::default();
        let spans = planned_spans(
            &index,
            None,
            &names,
            &[run(0, 2), run(1, 1), run(2, 1), run(2, 0)],
        )
        .unwrap();
        assert_eq!((spans[0].start_offset, spans[0].first_ordinal), (2048, 2));
        // Gzip: the offset counts decompressed bytes, which the reader skips from the start.
        assert_eq!(
            (
                spans[1].start_offset,
                spans[1].first_ordinal,
                spans[1].skip_before
            ),
            (1024, 1, 1)
        );
        assert_eq!(
            (
                spans[2].start_offset,
                spans[2].first_ordinal,
                spans[2].skip_before
            ),
            (0, 0, 1)
        );
        assert!(
            spans.iter().all(|s| s.detail.is_none()),
            "no detail files in this index"
        );
        assert_eq!(spans[2].display, "https://h/d/00002.tar?<redacted>");
        let renamed = ShardNames {
            urls: vec!["/m/0.tar".into(), "/m/1.tar.gz".into(), "/m/2.tar".into()],
            displays: vec!["zero".into(), "one".into(), "two".into()],
        };
        let spans = planned_spans(&index, None, &renamed, &[run(2, 0)]).unwrap();
        assert_eq!(
            (spans[0].url.as_str(), spans[0].display.as_str()),
            ("/m/2.tar", "two")
        );
        assert!(planned_spans(&index, None, &names, &[run(7, 0)]).is_err());
    }

    #[test]
    fn a_version_2_index_points_mid_shard_runs_at_their_detail_block() {
        let mut a = ShardEntry::new("s3://b/d/00000.tar", 4);
        a.extra_mut().offsets = Some(vec![0, 512, 1024, 1536, 2048]);
        let (manifest, _) = Index::new(vec![a]).unwrap().to_layout("detail-00000.bin");
        let index = Index::from_bytes(&manifest).unwrap();
        let runs = [
            Run {
                shard: 0,
                start: 3,
                end: 4,
            },
            Run {
                shard: 0,
                start: 0,
                end: 3,
            },
        ];
        let spans =
            planned_spans(&index, Some("s3://b/idx"), &ShardNames::default(), &runs).unwrap();
        let detail = spans[0]
            .detail
            .as_ref()
            .expect("mid-shard: the detail block");
        assert_eq!(detail.url, "s3://b/idx/detail-00000.bin");
        assert_eq!(
            (
                detail.num_samples,
                spans[0].skip_before,
                spans[0].start_offset
            ),
            (4, 3, 0)
        );
        assert!(
            spans[1].detail.is_none(),
            "a run from ordinal 0 starts at byte 0"
        );
    }
}
