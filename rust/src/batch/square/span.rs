//! How a shard span opens in the square kind's reader: a subset's ordinals looked up in the
//! shard's detail block, and the shard opened at the span's first sample (a Parquet file with
//! only the columns the source's spec reads). The span itself is the read stage's
//! (`read::span`).

use std::sync::Arc;

use crate::batch::kit::columns::resolve;
use crate::batch::square::config::PipelineConfig;
use crate::batch::square::stats::Stats;
use crate::error::{Reason, SourceKind};
use crate::read::group::{is_gzip_name, open_shard, SampleReader, ShardFault};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::span::{kept_byte_ranges, ShardSpan};

impl ShardSpan {
    /// This span with a subset's ordinals looked up in the detail block (one range read), and
    /// where the first of them starts when the block holds offsets.
    pub(super) fn resolved(
        &self,
        cfg: &PipelineConfig,
        stats: &Stats,
    ) -> Result<ShardSpan, ShardFault> {
        let (Some(selection), Some(detail)) = (&self.selection, &self.detail) else {
            return Ok(self.clone());
        };
        let unreadable = |detail: String| ShardFault {
            reason: Reason::Unreadable,
            kind: SourceKind::Other,
            detail,
            offset: 0,
        };
        let block = detail
            .fetch(&cfg.source, &stats.source)
            .map_err(unreadable)?;
        let (a, b) = selection.ranks;
        let kept: Arc<[u64]> = block
            .selection
            .as_ref()
            .and_then(|s| s.get(a as usize..b as usize))
            .ok_or_else(|| {
                unreadable(format!(
                    "the index's detail block holds no selected samples {a}..{b} for this subset"
                ))
            })?
            .into();
        let first = kept.first().copied().unwrap_or(0);
        let offsets = block
            .offsets
            .as_deref()
            .filter(|_| !is_gzip_name(&self.url));
        let offset = offsets.and_then(|o| o.get(first as usize).copied());
        Ok(ShardSpan {
            start_offset: offset.unwrap_or(0),
            first_ordinal: if offset.is_some() { first } else { 0 },
            skip_before: first,
            end_ordinal: Some(kept.last().map_or(0, |&o| o + 1)),
            detail: None,
            selection: None,
            keep_bytes: offsets.and_then(|o| kept_byte_ranges(&kept, o)),
            keep: Some(kept),
            ..self.clone()
        })
    }

    /// Opens the shard at this span's first sample (seeking there with the index's detail
    /// block when the span starts mid-shard).
    pub(super) fn open(
        &self,
        cfg: &PipelineConfig,
        stats: &Stats,
    ) -> Result<SampleReader, ShardFault> {
        if is_parquet_name(&self.url) {
            // Rows are addressed by number: the footer's row counts find the first one, no
            // detail block needed; only the columns this source's spec reads (in this file:
            // `columns::resolve`) are fetched.
            let file = ParquetFile::open(&self.url, &self.expected, &cfg.source, &stats.source)?;
            let columns =
                resolve(cfg.spec_for(self.shard), &file.schema).map_err(|(reason, detail)| {
                    ShardFault {
                        reason,
                        kind: SourceKind::Other,
                        detail,
                        offset: 0,
                    }
                })?;
            let first = self.skip_before.max(self.first_ordinal);
            let rows = file
                .samples(first, Some(&columns.wanted))
                .with_max_member_bytes(cfg.max_member_bytes)
                .with_renamed(columns.renamed);
            return Ok(SampleReader::of_parquet(rows, first));
        }
        let (start, first) = self.entry_point(cfg, stats)?;
        open_shard(
            &self.url,
            start,
            first,
            cfg.max_member_bytes,
            &self.expected,
            &cfg.source,
            &stats.source,
        )
    }

    fn entry_point(&self, cfg: &PipelineConfig, stats: &Stats) -> Result<(u64, u64), ShardFault> {
        match &self.detail {
            Some(d) if self.skip_before > self.first_ordinal && !is_gzip_name(&self.url) => {
                match d.offset_of(self.skip_before, &cfg.source, &stats.source) {
                    Ok(Some(offset)) => Ok((offset, self.skip_before)),
                    Ok(None) => Ok((self.start_offset, self.first_ordinal)),
                    Err(detail) => Err(ShardFault {
                        reason: Reason::Unreadable,
                        kind: SourceKind::Other,
                        detail,
                        offset: 0,
                    }),
                }
            }
            _ => Ok((self.start_offset, self.first_ordinal)),
        }
    }
}
