//! The resume state, and what a phase consumed (to re-plan the rest of an epoch).

use super::layout::Layout;
use super::phase::PhaseSequence;
use super::shuffle::BlockShuffle;
use super::{config::reader_batches_done, PhaseConfig, PlanError, STATE_FORMAT, STATE_VERSION};
use serde::{Deserialize, Serialize};

/// Reserve samples a reader used as replacements for samples that failed at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReserveUse {
    pub rank: u32,
    /// The phase reader ([`ReaderPlan::reader`]), not the DataLoader worker id.
    pub reader: u32,
    pub used: u64,
}

/// One phase of a resume state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseRecord {
    #[serde(flatten)]
    pub config: PhaseConfig,
    /// Batches every rank yielded in this phase (the same on all ranks).
    pub batches_done: u64,
    /// Reserve samples used, per reader; readers that used none are left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserve_used: Vec<ReserveUse>,
}

/// Everything needed to resume an epoch: small, identical on every rank, serialized as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochState {
    pub format: String,
    pub version: u32,
    pub seed: u64,
    pub epoch: u64,
    /// The dataset's fingerprint, written as 16 hex digits.
    #[serde(with = "hex_u64")]
    pub index_fingerprint: u64,
    /// Valid samples in the dataset, a second check that the state fits the index.
    pub num_samples: u64,
    pub phases: Vec<PhaseRecord>,
}

impl EpochState {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an epoch state always serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, PlanError> {
        let state: Self = serde_json::from_slice(bytes)
            .map_err(|e| PlanError::State(format!("malformed state JSON: {e}")))?;
        if state.format != STATE_FORMAT {
            return Err(PlanError::State(format!(
                "format is {:?}, expected {STATE_FORMAT:?}",
                state.format
            )));
        }
        if state.version != STATE_VERSION {
            return Err(PlanError::State(format!(
                "state version {} is not supported (this shardstream reads version {STATE_VERSION})",
                state.version
            )));
        }
        Ok(state)
    }
}

pub(super) mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{value:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

pub(super) fn find_reserve_use(uses: &[ReserveUse], rank: u32, reader: u32) -> u64 {
    uses.iter()
        .filter(|u| u.rank == rank && u.reader == reader)
        .map(|u| u.used)
        .sum()
}

/// Checks that a phase record can have happened under its layout.
pub(super) fn check_record(layout: &Layout, record: &PhaseRecord) -> Result<(), PlanError> {
    let total = layout.batches_per_rank();
    if record.batches_done > total {
        return Err(PlanError::State(format!(
            "{} batches done, but this phase has only {total} batches per rank",
            record.batches_done
        )));
    }
    for u in &record.reserve_used {
        if u.rank >= layout.config.world_size || u.reader >= layout.config.readers_per_rank() {
            return Err(PlanError::State(format!(
                "reserve use for unknown reader {} of rank {}",
                u.reader, u.rank
            )));
        }
        let (a, b) = layout.reserve_range(u.rank as u64, u.reader as u64);
        if find_reserve_use(&record.reserve_used, u.rank, u.reader) > b - a {
            return Err(PlanError::State(format!(
                "reader {} of rank {} used more than its {} reserve samples",
                u.reader,
                u.rank,
                b - a
            )));
        }
    }
    Ok(())
}

/// Phase-sequence positions consumed in a phase: every reader's first emitted samples of its
/// done batches, plus the reserve samples it used. Sorted, disjoint ranges.
pub(super) fn consumed_ranges(
    layout: &Layout,
    sequence: &PhaseSequence,
    seed: u64,
    epoch: u64,
    phase: u32,
    record: &PhaseRecord,
) -> Vec<(u64, u64)> {
    let config = layout.config;
    let (k, block_size) = (config.readers_per_rank(), config.block_size);
    let mut ranges = Vec::new();
    for rank in 0..config.world_size {
        for reader in 0..k {
            let (r, w) = (rank as u64, reader as u64);
            let segments = layout.reader_segments(r, w);
            let len = segments.len();
            let emitted =
                (reader_batches_done(record.batches_done, k, reader) * config.batch_size).min(len);
            let whole = emitted / block_size * block_size;
            segments.for_each(0, whole, |a, b| ranges.push((a, b)));
            if emitted > whole {
                let shuffle = BlockShuffle::new(seed, epoch, phase, rank, reader, block_size, len);
                let block = emitted / block_size;
                let mut block_ranges = Vec::new();
                segments.for_each(whole, whole + shuffle.block_len(block), |a, b| {
                    block_ranges.push((a, b))
                });
                let order = sequence.grouped_positions(&block_ranges);
                let mut picked: Vec<u64> = shuffle.block_permutation(block)
                    [..(emitted - whole) as usize]
                    .iter()
                    .map(|&j| order[j as usize])
                    .collect();
                push_positions(&mut ranges, &mut picked);
            }
            let used = find_reserve_use(&record.reserve_used, rank, reader);
            if used > 0 {
                let (a, b) = layout.reserve_range(r, w);
                let mut picked = sequence.grouped_positions(&[(a, b)]);
                picked.truncate(used as usize);
                push_positions(&mut ranges, &mut picked);
            }
        }
    }
    // Padding repeats may overlap.
    merge_ranges(&mut ranges);
    ranges
}

/// Sorts `ranges` and merges overlapping and touching ones, in place.
pub(super) fn merge_ranges(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable();
    ranges.dedup_by(|next, kept| {
        if next.0 <= kept.1 {
            kept.1 = kept.1.max(next.1);
            true
        } else {
            false
        }
    });
}

/// Appends `positions` (any order) to `ranges` as ranges of consecutive positions.
fn push_positions(ranges: &mut Vec<(u64, u64)>, positions: &mut [u64]) {
    positions.sort_unstable();
    let mut i = 0;
    while i < positions.len() {
        let first = positions[i];
        let mut end = first + 1;
        i += 1;
        while i < positions.len() && positions[i] == end {
            end += 1;
            i += 1;
        }
        ranges.push((first, end));
    }
}
