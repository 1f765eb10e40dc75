//! Units: what the kinds that plan over unit weights (packed text, token-budget NaFlex) read and
//! count, one at a time: a tar shard, a JSONL file, or one row group of a Parquet file.
//!
//! Written once for every such kind: a file's units with its identity, the count pass over
//! files on a pool of threads (each kind gives only how one unit is counted), and a reader's
//! share of a plan over the units' weights.

use std::sync::Arc;

use rayon::prelude::*;

// The kit's `Unit` under its old name, so that this file's body is unchanged by the move.
use crate::batch::kit::unit::Unit;
use crate::error::{Fault, Reason, SourceKind};
use crate::plan::unit_stream::{Span, StreamPlan, StreamReader, UnitOrder};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{object_version, redact_url, Expected, SourceOptions, SourceStats};

/// The units of one file: its row groups (Parquet), or the whole file (a JSONL file, a tar
/// shard), with its identity (`etag:...` or `size:N`).
pub fn file_units(
    url: &str,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Vec<Unit>, Fault> {
    let unreadable = |detail: String, kind: SourceKind| Fault {
        reason: Reason::Unreadable,
        url: redact_url(url),
        key: String::new(),
        detail,
        kind,
    };
    let version = object_version(url, &Expected::default(), opts, stats)
        .map_err(|e| unreadable(e.to_string(), e.kind()))?;
    let identity = match (&version.etag, version.size) {
        (Some(etag), _) => Some(format!("etag:{etag}")),
        (None, Some(size)) => Some(format!("size:{size}")),
        _ => None,
    };
    if !is_parquet_name(url) {
        return Ok(vec![Unit {
            url: url.to_string(),
            first_row: 0,
            rows: None,
            identity,
        }]);
    }
    let file = ParquetFile::open(
        url,
        &Expected::from_identity(identity.as_deref()),
        opts,
        stats,
    )
    .map_err(|f| unreadable(f.detail, f.kind))?;
    let mut first = 0;
    Ok(file
        .row_counts()
        .into_iter()
        .map(|rows| {
            let unit = Unit {
                url: url.to_string(),
                first_row: first,
                rows: Some(rows),
                identity: identity.clone(),
            };
            first += rows;
            unit
        })
        .collect())
}

/// One unit's count, or why the unit (or its whole file: `unit` None) could not be counted.
pub struct Counted<C> {
    pub url: String,
    pub unit: Option<Unit>,
    pub result: Result<C, Fault>,
}

/// Counts every unit of `urls` with `count` on `threads` threads: units in file order.
pub fn count_files<C, F>(
    urls: &[String],
    threads: usize,
    opts: &SourceOptions,
    count: F,
) -> Result<Vec<Counted<C>>, String>
where
    C: Send,
    F: Fn(&Unit, &Arc<SourceStats>) -> Result<C, Fault> + Sync,
{
    let stats = Arc::new(SourceStats::default());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("shardstream-count-{i}"))
        .build()
        .map_err(|e| e.to_string())?;
    Ok(pool.install(|| {
        urls.par_iter()
            .flat_map_iter(|url| match file_units(url, opts, &stats) {
                Err(f) => vec![Counted {
                    url: url.clone(),
                    unit: None,
                    result: Err(f),
                }],
                Ok(units) => units
                    .into_iter()
                    .map(|u| Counted {
                        url: url.clone(),
                        result: count(&u, &stats),
                        unit: Some(u),
                    })
                    .collect(),
            })
            .collect()
    }))
}

/// A reader's share of a plan over unit weights: every unit, its weight (count order), the
/// units' seeded order and this reader's ranges of it.
pub struct UnitShare {
    pub units: Arc<Vec<Unit>>,
    pub weights: Arc<Vec<u64>>,
    pub order: UnitOrder,
    pub reader: StreamReader,
    /// The stream's positions no reader reads this epoch: the current phase's remainder, and
    /// what lies past the plan's end (a mixture plans a source's stream only up to where the
    /// mixture's epoch ends).
    pub unread: Vec<Span>,
}

impl UnitShare {
    /// The share of reader (`rank`, `worker`) of `plan`, made over `units` with `weights`
    /// (one each, count order) and seeded by (`seed`, `epoch`) as the plan was. The plan may
    /// end before the units' total weight (`plan.total`), never after.
    pub fn new(
        units: Vec<Unit>,
        weights: Vec<u64>,
        plan: &StreamPlan,
        (seed, epoch): (u64, u64),
        (rank, worker): (u32, u32),
    ) -> Result<Self, String> {
        if units.len() != weights.len() {
            return Err(format!(
                "{} units but {} counts: one count per unit",
                units.len(),
                weights.len()
            ));
        }
        let whole: u64 = weights.iter().sum();
        if plan.total > whole {
            return Err(format!(
                "the plan ends at {}, past the units' {whole}",
                plan.total
            ));
        }
        let reader = plan.reader(rank, worker).map_err(|e| e.to_string())?;
        let mut unread = plan.remainder();
        if plan.total < whole {
            unread.push(Span {
                start: plan.total,
                end: whole,
            });
        }
        Ok(Self {
            units: Arc::new(units),
            order: UnitOrder::new(&weights, seed, epoch),
            weights: Arc::new(weights),
            reader,
            unread,
        })
    }
}
