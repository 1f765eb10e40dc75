//! Subsets of an index: which samples of each shard a subset keeps (chosen by keys, uids or a
//! filter, in Python: `shardstream.subset`), made into an index whose shards carry their
//! selection. The plan then schedules only the kept samples (see `Index::plan_input`) and
//! readers pass the others over, so a subset needs no resharding.
//!
//! The subset's detail blocks hold the selection and the shard's per-sample detail (offsets,
//! keys, invalid samples), which is brought into memory here from the source index's blocks.

use crate::index::{Index, IndexError, Selection};
use crate::read::seek::DetailSource;
use crate::read::source::{SourceOptions, SourceStats};
use std::sync::Arc;

/// `index` with shard i keeping the ordinals `selections[i]` (valid samples of that shard).
/// `location`: where the index's detail files are.
pub fn with_selections(
    index: &Index,
    location: Option<&str>,
    selections: Vec<Vec<u64>>,
    opts: &SourceOptions,
) -> Result<Index, String> {
    if selections.len() != index.len() {
        return Err(format!(
            "{} selections for an index of {} shards",
            selections.len(),
            index.len()
        ));
    }
    let stats = Arc::new(SourceStats::default());
    let mut shards = Vec::with_capacity(index.len());
    for (i, kept) in selections.into_iter().enumerate() {
        let mut entry = index.shards()[i].clone();
        if let Some(source) = DetailSource::for_shard(index, location, i as u32) {
            let detail = source.fetch(opts, &stats)?;
            let extra = entry.extra_mut();
            extra.offsets = extra.offsets.take().or(detail.offsets);
            extra.keys = extra.keys.take().or(detail.keys);
            if extra.invalid_details.is_empty() {
                extra.invalid_details = detail.invalid;
            }
        }
        entry.detail_ref = None;
        entry.extra_mut().selection = Some(Selection::new(kept));
        shards.push(entry);
    }
    Index::new(shards).map_err(|e: IndexError| e.to_string())
}

/// What the plan schedules of shard `shard` (its kept ordinals for a subset, else its valid
/// ones) and the shard's keys, from memory or the shard's detail block.
pub fn shard_samples(
    index: &Index,
    location: Option<&str>,
    shard: u32,
    opts: &SourceOptions,
) -> Result<(Vec<u64>, Option<Vec<String>>), String> {
    let entry = index
        .shard(shard)
        .ok_or_else(|| format!("no shard {shard} in an index of {}", index.len()))?;
    let detail = match DetailSource::for_shard(index, location, shard) {
        Some(source) => Some(source.fetch(opts, &Arc::new(SourceStats::default()))?),
        None => None,
    };
    let kept = match (entry.selection(), detail.as_ref()) {
        (Some(s), d) => match (&s.ordinals, d.and_then(|d| d.selection.as_ref())) {
            (Some(o), _) => o.to_vec(),
            (None, Some(o)) => o.clone(),
            (None, None) => return Err("the subset's detail block holds no selection".into()),
        },
        (None, _) => (0..entry.num_samples)
            .filter(|o| entry.invalid.binary_search(o).is_err())
            .collect(),
    };
    let keys = entry
        .keys()
        .map(<[String]>::to_vec)
        .or(detail.and_then(|d| d.keys));
    Ok((kept, keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ShardEntry;
    use crate::plan::{EpochPlan, PhaseConfig};

    fn index() -> Index {
        let mut a = ShardEntry::new("/d/00000.tar", 6);
        a.extra_mut().offsets = Some((0..=6).map(|i| i * 1024).collect());
        a.extra_mut().keys = Some((0..6).map(|i| format!("a{i}")).collect());
        a.invalid = Arc::from([2u64]);
        let mut b = ShardEntry::new("/d/00001.tar", 4);
        b.extra_mut().keys = Some((0..4).map(|i| format!("b{i}")).collect());
        Index::new(vec![a, b]).unwrap()
    }

    #[test]
    fn a_subset_plans_only_its_samples_and_has_its_own_fingerprint() {
        let full = index();
        let subset = with_selections(
            &full,
            None,
            vec![vec![5, 0, 3], vec![1]],
            &SourceOptions::default(),
        )
        .unwrap();
        assert_eq!(subset.num_valid(), 4);
        assert_ne!(subset.fingerprint(), full.fingerprint());
        let input = subset.plan_input();
        assert_eq!(input.num_valid(), 4);
        let config = PhaseConfig {
            world_size: 1,
            workers: 0,
            batch_size: 1,
            block_size: 1,
            drop_last: true,
        };
        let plan = EpochPlan::new(&input, 0, 0, config).unwrap();
        let reader = plan.reader(0, 0).unwrap();
        let spans =
            crate::read::spans::planned_spans(&subset, None, &Default::default(), reader.runs())
                .unwrap();
        let mut kept: Vec<(u32, u64)> = spans
            .iter()
            .flat_map(|s| s.keep.as_ref().unwrap().iter().map(move |&o| (s.shard, o)))
            .collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![(0, 0), (0, 3), (0, 5), (1, 1)]);
        // Keys of selected positions are the kept samples' keys.
        let keys = crate::read::seek::keys_of_runs(
            &subset,
            None,
            reader.runs(),
            &SourceOptions::default(),
        )
        .unwrap();
        let mut keys_sorted = keys.clone();
        keys_sorted.sort();
        assert_eq!(keys_sorted, vec!["a0", "a3", "a5", "b1"]);
        // A round trip through the folder layout keeps the selection in the detail block.
        let (manifest, detail) = subset.to_layout("detail-x.bin");
        let dir = std::env::temp_dir().join(format!("ss-subset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("detail-x.bin"), detail).unwrap();
        let loaded = Index::from_bytes(&manifest).unwrap();
        assert_eq!(loaded.fingerprint(), subset.fingerprint());
        assert_eq!(loaded.num_valid(), 4);
        let location = dir.display().to_string();
        let keys = crate::read::seek::keys_of_runs(
            &loaded,
            Some(&location),
            reader.runs(),
            &SourceOptions::default(),
        )
        .unwrap();
        let mut again = keys.clone();
        again.sort();
        assert_eq!(again, keys_sorted);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_subset_keeping_an_invalid_sample_is_refused() {
        let err = with_selections(
            &index(),
            None,
            vec![vec![2], vec![]],
            &SourceOptions::default(),
        )
        .unwrap_err();
        assert!(err.contains("which validation rejected"), "{err}");
    }
}
