//! A unit's samples for token-budget batches, and what each is worth: the patches of its grid
//! under the NaFlex rule, or why it cannot be used. The count pass and the loader call the same
//! function on the same bytes, so both find the same batches.

use std::sync::Arc;

use crate::batch::columns::resolve;
use crate::batch::naflex::NaFlexSpec;
use crate::batch::packed::TextUnit;
use crate::batch::sample::{caption, image_bytes, Rejection, SampleSpec};
use crate::error::{Fault, Reason, SourceKind};
use crate::image::decode::Decoder;
use crate::image::patches::grid_for_max_patches;
use crate::plan::budget::BudgetShape;
use crate::read::group::{open_shard, RawSample, ShardFault};
use crate::read::parquet::{is_parquet_name, ParquetFile};
use crate::read::source::{Expected, SourceOptions, SourceStats};

/// What makes the batches: the samples' members, the NaFlex grid rule and the budget.
#[derive(Clone, Debug)]
pub struct BudgetSpec {
    pub sample: SampleSpec,
    pub naflex: NaFlexSpec,
    pub shape: BudgetShape,
    pub max_member_bytes: u64,
}

/// A unit's samples in file order (tar samples, or a Parquet row group's rows).
pub(super) type Samples = Box<dyn Iterator<Item = Result<RawSample, ShardFault>> + Send>;

/// Opens `unit` for reading its samples.
pub(super) fn open_samples(
    unit: &TextUnit,
    spec: &BudgetSpec,
    opts: &SourceOptions,
    stats: &Arc<SourceStats>,
) -> Result<Samples, Fault> {
    let display = unit.display();
    let expected = Expected::from_identity(unit.identity.as_deref());
    let fault = |reason: Reason, detail: String, kind: SourceKind| Fault {
        reason,
        url: display.clone(),
        key: String::new(),
        detail,
        kind,
    };
    if is_parquet_name(&unit.url) {
        let file = ParquetFile::open(&unit.url, &expected, opts, stats)
            .map_err(|f| fault(f.reason, f.detail, f.kind))?;
        let columns = resolve(&spec.sample, &file.schema)
            .map_err(|(reason, detail)| fault(reason, detail, SourceKind::Other))?;
        let rows = file
            .samples(unit.first_row, Some(&columns.wanted))
            .with_max_member_bytes(spec.max_member_bytes)
            .with_renamed(columns.renamed);
        let take = unit.rows.unwrap_or(u64::MAX) as usize;
        return Ok(Box::new(rows.take(take)));
    }
    let reader = open_shard(
        &unit.url,
        0,
        0,
        spec.max_member_bytes,
        &expected,
        opts,
        stats,
    )
    .map_err(|f| fault(f.reason, f.detail, f.kind))?;
    Ok(Box::new(reader))
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
    let probe = decoder.probe(bytes).map_err(|e| (e.reason, e.detail))?;
    if probe.width as u64 * probe.height as u64 > spec.sample.max_pixels {
        return Err((
            Reason::TooManyPixels,
            format!(
                "{}x{} exceeds max_pixels={}",
                probe.width, probe.height, spec.sample.max_pixels
            ),
        ));
    }
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
