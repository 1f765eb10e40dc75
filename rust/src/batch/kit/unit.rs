//! The unit every planned kind reads: one file, or one row group of a Parquet file, with the
//! content identity it was counted with. The count pass counts units (`batch::units`), the plan
//! (`plan::unit_stream`) lays their weights out as a stream, and a kind's read thread opens the units
//! its visits (`kit::visits`) touch.

use std::sync::Arc;

use super::columns::resolve;
use super::sample::SampleSpec;
use crate::error::{Fault, Reason, SourceKind};
use crate::read::group::{open_shard, RawSample, SampleReader, ShardFault};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{redact_url, Expected, SourceOptions, SourceStats};

/// One planned unit: a tar shard, a JSONL file, or one row group of a Parquet file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub url: String,
    /// The first row of a Parquet row group (0 for a tar or a JSONL file).
    pub first_row: u64,
    /// The rows of a Parquet row group; None: the whole shard.
    pub rows: Option<u64>,
    /// The file's content identity when counted (`etag:...` or `size:N`): a file replaced since
    /// is refused as `changed` instead of read with stale counts.
    pub identity: Option<String>,
}

impl Unit {
    /// What users know the unit by, in faults and stats: its URL redacted, and its first row
    /// when it is a Parquet row group.
    pub fn display(&self) -> String {
        match self.rows {
            Some(_) => format!("{} (rows from {})", redact_url(&self.url), self.first_row),
            None => redact_url(&self.url),
        }
    }
}

impl Unit {
    /// The content identity the unit was counted with: opening another version of its file is
    /// refused (`changed`) instead of read with stale counts.
    pub fn expected(&self) -> Expected {
        Expected::from_identity(self.identity.as_deref())
    }

    /// Opens the unit's file, pinned to the identity it was counted with: a Parquet file by its
    /// footer (the kind reads its row group), anything else as a tar shard from its first byte,
    /// members over `max_member_bytes` refused. A fault is the whole unit's, named `display`.
    /// Every planned kind opens its units here (the text kind after its JSONL files).
    pub fn open(
        &self,
        display: &str,
        max_member_bytes: u64,
        opts: &SourceOptions,
        stats: &Arc<SourceStats>,
    ) -> Result<Opened, Fault> {
        let expected = self.expected();
        let fault = |f: ShardFault| unit_fault(display, f.reason, f.detail, f.kind);
        if is_parquet_name(&self.url) {
            let file = ParquetFile::open(&self.url, &expected, opts, stats).map_err(fault)?;
            return Ok(Opened::Parquet(Box::new(file)));
        }
        let reader =
            open_shard(&self.url, 0, 0, max_member_bytes, &expected, opts, stats).map_err(fault)?;
        Ok(Opened::Tar(Box::new(reader)))
    }
}

/// A unit's file, opened (`Unit::open`).
pub enum Opened {
    /// A Parquet file, its footer read: the unit is its row group (`first_row`, `rows`).
    Parquet(Box<ParquetFile>),
    /// A tar shard's samples, from its first.
    Tar(Box<SampleReader>),
}

/// A fault of a whole unit (no sample key), named by what users know the unit by
/// (`Unit::display`): how every kind reports a unit that cannot be opened or read on.
pub fn unit_fault(display: &str, reason: Reason, detail: String, kind: SourceKind) -> Fault {
    Fault {
        reason,
        url: display.to_string(),
        key: String::new(),
        detail,
        kind,
    }
}

/// A unit's samples in file order (tar samples, or a Parquet row group's rows).
pub type Samples = Box<dyn Iterator<Item = Result<RawSample, ShardFault>> + Send>;

/// Opens `unit` for reading its samples as `sample` takes them: a tar shard's samples, or the
/// rows of a Parquet row group with the columns `sample` reads under its member names; members
/// over `max_member_bytes` are refused. What every kind reading image-text (or video-text)
/// samples by unit weight opens a unit with.
pub fn open_samples(
    unit: &Unit,
    sample: &SampleSpec,
    max_member_bytes: u64,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Samples, Fault> {
    let display = unit.display();
    let file = match unit.open(&display, max_member_bytes, opts, stats)? {
        Opened::Parquet(file) => *file,
        Opened::Tar(reader) => return Ok(reader),
    };
    let columns = resolve(sample, &file.schema)
        .map_err(|(reason, detail)| unit_fault(&display, reason, detail, SourceKind::Other))?;
    let rows = file
        .samples(unit.first_row, Some(&columns.wanted))
        .with_max_member_bytes(max_member_bytes)
        .with_renamed(columns.renamed);
    let take = unit.rows.unwrap_or(u64::MAX) as usize;
    Ok(Box::new(rows.take(take)))
}
