//! A unit's samples for token-budget batches, and what each is worth: the patches of its grid
//! under the NaFlex rule, or why it cannot be used. The count pass and the loader call the same
//! function on the same bytes, so both find the same batches.

use std::sync::Arc;

use crate::batch::kit::patches::NaFlexSpec;
use crate::batch::kit::sample::{caption, image_bytes, probe_capped, Rejection, SampleSpec};
use crate::batch::kit::unit::{self, Samples, Unit};
use crate::error::{Fault, Reason};
use crate::image::decode::Decoder;
use crate::image::patches::grid_for_max_patches;
use crate::plan::budget::BudgetShape;
use crate::read::group::RawSample;
use crate::read::source::{SourceOptions, SourceStats};

/// What makes the batches: the samples' members, the NaFlex grid rule and the budget.
#[derive(Clone, Debug)]
pub struct BudgetSpec {
    pub sample: SampleSpec,
    pub naflex: NaFlexSpec,
    pub shape: BudgetShape,
    pub max_member_bytes: u64,
}

/// Opens `unit` for reading its samples.
pub(super) fn open_samples(
    unit: &Unit,
    spec: &BudgetSpec,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Samples, Fault> {
    unit::open_samples(unit, &spec.sample, spec.max_member_bytes, opts, stats)
}

/// The patches the sample's image gets (its grid under the budget, from its header alone), or
/// why it cannot be used: a defect, no image or caption, a header that does not parse, too many
/// pixels, or fewer patches than `min_num_patches`.
pub(super) fn patches_of(
    raw: &RawSample,
    spec: &BudgetSpec,
    decoder: &mut Decoder,
) -> Result<u32, Rejection> {
    if let Some(defect) = &raw.defect {
        return Err(defect.clone());
    }
    let bytes = image_bytes(raw, &spec.sample.image_keys)?;
    caption(raw, &spec.sample.caption)?;
    let probe = probe_capped(decoder, bytes, spec.sample.max_pixels)?;
    let (width, height) = probe.oriented_size();
    let n = &spec.naflex;
    let (rows, cols) = grid_for_max_patches(height, width, n.patch_size, n.max_num_patches);
    let patches = rows * cols;
    if patches < n.min_num_patches {
        return Err((
            Reason::TooFewPatches,
            format!(
                "{width}x{height} gives a {rows}x{cols} grid, fewer than min_num_patches={}",
                n.min_num_patches
            ),
        ));
    }
    Ok(patches)
}
