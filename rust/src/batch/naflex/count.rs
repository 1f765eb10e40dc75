//! The count pass of one unit: its batches under a budget, read once.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::samples::{open_samples, patches_of, BudgetSpec};
use crate::batch::kit::unit::{unit_fault, Unit};
use crate::error::Fault;
use crate::image::decode::Decoder;
use crate::plan::budget::Bucketer;
use crate::read::source::{SourceOptions, SourceStats};

/// What a unit holds under a budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetCount {
    /// Samples read (usable or not).
    pub samples: u64,
    /// Batches the unit's usable samples make.
    pub batches: u64,
    /// Patches of the usable samples' grids, and the patch slots their batches hold: the
    /// difference is padding.
    pub patches: u64,
    pub slots: u64,
    /// The same samples in fixed-count batches padded to `max_num_patches`: its slots.
    pub fixed_slots: u64,
    /// Samples that cannot be used, by reason (`Reason` names).
    pub skipped: BTreeMap<String, u64>,
    /// Up to a few (key, reason, detail) of them.
    pub examples: Vec<(String, String, String)>,
}

const EXAMPLES: usize = 5;

/// Reads `unit` and counts its batches (only headers are decoded).
pub fn count_unit(
    unit: &Unit,
    spec: &BudgetSpec,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<BudgetCount, Fault> {
    let display = unit.display();
    let samples = open_samples(unit, spec, opts, stats)?;
    let mut decoder = Decoder::default();
    let mut bucketer = Bucketer::new(&spec.shape);
    let mut out = BudgetCount::default();
    let add_batch = |out: &mut BudgetCount, bucket: u32, images: usize| {
        out.batches += 1;
        out.slots += images as u64 * spec.shape.length(bucket as usize) as u64;
    };
    for (position, item) in samples.enumerate() {
        let raw = item.map_err(|f| unit_fault(&display, f.reason, f.detail, f.kind))?;
        out.samples += 1;
        match patches_of(&raw, spec, &mut decoder) {
            Ok(n) => {
                out.patches += n as u64;
                out.fixed_slots += spec.naflex.max_num_patches as u64;
                if let Some(b) = bucketer.push(position as u32, n) {
                    add_batch(&mut out, b.bucket, b.members.len());
                }
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
    for b in bucketer.finish() {
        add_batch(&mut out, b.bucket, b.members.len());
    }
    Ok(out)
}
