//! The count pass of one unit: how many of its samples are clips (its weight in the plan), read
//! once, each judged from its container's header alone (`clips::judge`), as the loader judges it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::clips::{judge, ClipSpec};
use crate::batch::kit::unit::{open_samples, unit_fault, Unit};
use crate::error::{Fault, Reason, SourceKind};
use crate::read::source::{SourceOptions, SourceStats};

/// What a unit holds as CLIP clips.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClipCount {
    /// Samples read (clips or not).
    pub samples: u64,
    /// Samples that are clips: the unit's weight.
    pub clips: u64,
    /// Seconds of those clips, from their headers.
    pub seconds: f64,
    /// Samples that are not clips, by reason (`Reason` names).
    pub skipped: BTreeMap<String, u64>,
    /// Up to a few (key, reason, detail) of them.
    pub examples: Vec<(String, String, String)>,
}

const EXAMPLES: usize = 5;

/// Reads `unit` and counts its clips (headers only: no frame is decoded).
pub fn count_unit(
    unit: &Unit,
    spec: &ClipSpec,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<ClipCount, Fault> {
    let display = unit.display();
    let samples = open_samples(unit, &spec.sample, spec.max_member_bytes, opts, stats)?;
    let mut out = ClipCount::default();
    for item in samples {
        let raw = item.map_err(|f| unit_fault(&display, f.reason, f.detail, f.kind))?;
        out.samples += 1;
        let judged = judge(&raw, spec).map_err(|e| {
            unit_fault(&display, Reason::Internal, e.to_string(), SourceKind::Other)
        })?;
        match judged {
            Ok(info) => {
                out.clips += 1;
                out.seconds += info.seconds;
            }
            Err((reason, detail)) => {
                *out.skipped.entry(reason.as_str().to_string()).or_default() += 1;
                if out.examples.len() < EXAMPLES {
                    out.examples
                        .push((raw.key.clone(), reason.as_str().to_string(), detail));
                }
            }
        }
    }
    Ok(out)
}
