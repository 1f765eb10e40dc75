//! The plan's units: what the epoch plan shuffles, cuts and numbers. A tar shard is one unit; a
//! Parquet file whose row groups the index records is one unit per row group, so that an epoch
//! interleaves row groups of different files as it interleaves shards, and a reader reads one
//! row group per unit. The plan numbers units; [`Units::locate`] maps a unit back to its shard
//! and the row its unit-local ordinal 0 is.

use super::{Index, ShardEntry};
use crate::plan::{shared_ordinals, PlanInput, Run, ShardCounts};

/// The units of an index, in order: each shard's units in a row, shard after shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Units {
    /// Per unit, (shard, first ordinal in the shard); None when every shard is one unit (a tar
    /// dataset holds nothing per unit).
    map: Option<Vec<(u32, u64)>>,
    len: usize,
}

/// The rows of each of the shard's units when it has more than one: a Parquet file with row
/// groups and no subset (a subset's shard is planned in selected positions, whose split by row
/// group the manifest does not record, so it stays one unit).
fn split(shard: &ShardEntry) -> Option<&[u64]> {
    match (shard.row_groups(), shard.selection()) {
        (Some(groups), None) if groups.len() > 1 => Some(groups),
        _ => None,
    }
}

impl Units {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shard of unit `unit` and the ordinal in that shard of the unit's ordinal 0.
    pub fn locate(&self, unit: u32) -> (u32, u64) {
        match &self.map {
            None => (unit, 0),
            Some(map) => map[unit as usize],
        }
    }

    /// `run` (a unit's ordinals) as ordinals of its shard.
    pub fn shard_run(&self, run: &Run) -> Run {
        let (shard, base) = self.locate(run.shard);
        Run {
            shard,
            start: base + run.start,
            end: base + run.end,
        }
    }
}

impl Index {
    /// The plan's units of this index (see the module's doc).
    pub fn units(&self) -> Units {
        if !self.shards.iter().any(|s| split(s).is_some()) {
            return Units {
                map: None,
                len: self.shards.len(),
            };
        }
        let mut map = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            match split(shard) {
                None => map.push((i as u32, 0)),
                Some(groups) => {
                    let mut base = 0;
                    for &g in groups {
                        map.push((i as u32, base));
                        base += g;
                    }
                }
            }
        }
        Units {
            len: map.len(),
            map: Some(map),
        }
    }

    /// What the epoch plan needs: counts and invalid ordinals per unit (a row group's invalid
    /// ordinals rebased to it), and the fingerprint.
    pub fn plan_input(&self) -> PlanInput {
        let mut units = Vec::with_capacity(self.shards.len());
        // Row groups are read whole; empty when no shard is split (a tar dataset).
        let mut whole = Vec::new();
        for s in &self.shards {
            if let Some(groups) = split(s) {
                let mut base = 0;
                for &g in groups {
                    let inv = &s.invalid;
                    let (a, b) = (
                        inv.partition_point(|&o| o < base),
                        inv.partition_point(|&o| o < base + g),
                    );
                    whole.resize(units.len(), false);
                    whole.push(true);
                    units.push(ShardCounts {
                        num_samples: g,
                        invalid: shared_ordinals(inv[a..b].iter().map(|&o| o - base).collect()),
                    });
                    base += g;
                }
                continue;
            }
            // A subset's shard is planned in *selected* positions: the plan's ordinal k is the
            // shard's k-th selected sample, which the reader looks up when it opens the shard.
            units.push(match s.selection() {
                Some(selection) => ShardCounts {
                    num_samples: selection.count,
                    invalid: shared_ordinals(Vec::new()),
                },
                None => ShardCounts {
                    num_samples: s.num_samples,
                    invalid: s.invalid.clone(),
                },
            });
        }
        PlanInput::with_whole(units, &whole, self.fingerprint())
            .expect("a validated index always gives valid counts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{EpochPlan, PhaseConfig};

    /// A tar of 4 samples, a Parquet file of row groups 3, 2, 4 with invalid rows 1 and 5, and a
    /// Parquet file of one row group.
    fn index() -> Index {
        let mut p = ShardEntry::new("/d/a.parquet", 9);
        p.extra_mut().row_groups = Some(vec![3, 2, 4]);
        p.invalid = vec![1, 5].into();
        let mut one = ShardEntry::new("/d/b.parquet", 2);
        one.extra_mut().row_groups = Some(vec![2]);
        Index::new(vec![ShardEntry::new("/d/0.tar", 4), p, one]).unwrap()
    }

    #[test]
    fn row_groups_are_units_with_their_invalid_ordinals_rebased() {
        let index = index();
        let units = index.units();
        assert_eq!(units.len(), 5);
        let located: Vec<_> = (0..5).map(|u| units.locate(u)).collect();
        assert_eq!(located, [(0, 0), (1, 0), (1, 3), (1, 5), (2, 0)]);
        let input = index.plan_input();
        let counts: Vec<(u64, Vec<u64>)> = input
            .shards()
            .iter()
            .map(|c| (c.num_samples, c.invalid.to_vec()))
            .collect();
        assert_eq!(
            counts,
            [
                (4, vec![]),
                (3, vec![1]),
                (2, vec![]),
                (4, vec![0]),
                (2, vec![])
            ]
        );
        assert_eq!(input.num_valid(), index.num_valid());
        let run = Run {
            shard: 3,
            start: 1,
            end: 4,
        };
        assert_eq!(
            units.shard_run(&run),
            Run {
                shard: 1,
                start: 6,
                end: 9
            }
        );
        // A tar dataset holds nothing per unit.
        let tars = Index::new(vec![ShardEntry::new("/d/0.tar", 4)]).unwrap();
        assert_eq!(tars.units(), Units { map: None, len: 1 });
    }

    #[test]
    fn both_layouts_keep_the_row_groups() {
        let index = index();
        let (manifest, _) = index.to_layout("detail.bin");
        let back = Index::from_bytes(&manifest).unwrap();
        assert_eq!(back.shards()[1].row_groups(), Some(&[3, 2, 4][..]));
        assert_eq!(back.units(), index.units());
        assert_eq!(back.fingerprint(), index.fingerprint());
        let json = Index::from_json(&index.to_json()).unwrap();
        assert_eq!(json.shards()[2].row_groups(), Some(&[2][..]));
        assert_eq!(json.fingerprint(), index.fingerprint());
    }

    #[test]
    fn the_row_group_layout_is_part_of_the_fingerprint() {
        let a = index();
        let mut relaid = a.shards().to_vec();
        relaid[1].extra_mut().row_groups = Some(vec![5, 4]);
        let b = Index::new(relaid).unwrap();
        assert_ne!(a.fingerprint(), b.fingerprint());
        // A state saved on one layout is refused on the other.
        let config = PhaseConfig::new(1, 0, 2, 4, true);
        let plan = EpochPlan::new(&a.plan_input(), 0, 0, config).unwrap();
        let state = plan.state(1, &[]).unwrap();
        assert!(EpochPlan::resume(&b.plan_input(), &state, config).is_err());
        let mut wrong = a.shards().to_vec();
        wrong[1].extra_mut().row_groups = Some(vec![5, 5]);
        assert!(Index::new(wrong)
            .unwrap_err()
            .to_string()
            .contains("10 rows"));
    }

    #[test]
    fn units_of_many_row_groups_interleave_files_in_an_epoch() {
        // 4 files of 5 row groups of 10 rows: 20 units; an epoch's reading order leaves a file
        // and comes back to it.
        let files = (0..4)
            .map(|i| {
                let mut e = ShardEntry::new(format!("/d/{i}.parquet"), 50);
                e.extra_mut().row_groups = Some(vec![10; 5]);
                e
            })
            .collect();
        let index = Index::new(files).unwrap();
        let units = index.units();
        assert_eq!(units.len(), 20);
        let config = PhaseConfig::new(1, 0, 10, 10, true);
        let plan = EpochPlan::new(&index.plan_input(), 7, 0, config).unwrap();
        let reader = plan.reader(0, 0).unwrap();
        let files_read: Vec<u32> = reader
            .runs()
            .iter()
            .map(|r| units.shard_run(r).shard)
            .collect();
        let switches = files_read.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(switches > 3, "file-contiguous order: {files_read:?}");
        let rows: u64 = reader.runs().iter().map(Run::len).sum();
        assert_eq!(rows, 200);
        // Row groups are not rotated: each is one run from its first row, read once.
        assert_eq!(reader.runs().len(), 20);
        assert!(reader.runs().iter().all(|r| r.start == 0 && r.end == 10));
    }
}
