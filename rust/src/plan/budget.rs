//! Token-budget batches (the NaFlex kind's `max_patches_per_batch`): which samples of a unit
//! make each batch, as a pure function of the samples' patch counts in file order.
//!
//! Samples go to length buckets (ascending upper bounds of patches per image, the last one the
//! image budget). A batch of bucket k is `[capacity_k, L_k]` patches with `L_k` its bound and
//! `capacity_k = max_patches_per_batch / L_k` images, so no batch exceeds the budget and an
//! image is padded by less than its bucket's width. Samples are taken in file order; a bucket's
//! batch is complete when it holds `capacity_k` images, and at the end of the unit every
//! non-empty bucket gives one more, shorter batch (ascending bucket order).
//!
//! Because the batches of a unit depend on nothing but its samples' patch counts, the count
//! pass and every reader that visits the unit (from any batch on) find the same batches; the
//! plan (`plan::unit_stream`, over batches per unit) then gives every rank the same number of them,
//! and resumes by arithmetic. A reader holds at most the open buckets' samples: memory bounded
//! by the buckets and the budget, never by the unit.

/// Buckets and the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetShape {
    /// Patches a batch may hold (images x padded length).
    pub max_patches_per_batch: u32,
    /// Ascending upper bounds of patches per image; the last is the image budget.
    pub buckets: Vec<u32>,
    /// Images a batch may hold (0: as many as the budget allows). Short buckets would otherwise
    /// make batches of thousands of tiny images, and a reader holds up to a batch per bucket.
    pub max_images_per_batch: u32,
}

/// One batch: its bucket and the unit-local positions of its samples (file order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedBatch {
    pub bucket: u32,
    pub members: Vec<u32>,
}

impl BudgetShape {
    /// Buckets of equal width `step` up to `max_num_patches` (the last bucket may be narrower).
    pub fn even(max_patches_per_batch: u32, max_num_patches: u32, step: u32) -> Self {
        let step = step.clamp(1, max_num_patches.max(1));
        let mut buckets: Vec<u32> = (1..)
            .map(|i| i * step)
            .take_while(|&b| b < max_num_patches)
            .collect();
        buckets.push(max_num_patches);
        Self {
            max_patches_per_batch,
            buckets,
            max_images_per_batch: 0,
        }
    }

    /// A budget plan has one batch per position: a plan shape's (batch_size, seq_len,
    /// block_rows) must be all 1.
    pub fn one_batch_a_position(plan: (u32, u32, u32)) -> Result<(), String> {
        if plan != (1, 1, 1) {
            return Err(format!(
                "a budget plan has one batch per position: batch_size, seq_len and block_rows 1, not {plan:?}"
            ));
        }
        Ok(())
    }

    /// What this shape cannot batch with: no bucket, unsorted buckets, or a budget that holds
    /// not even one image of the largest bucket.
    pub fn validate(&self) -> Result<(), String> {
        let Some(&largest) = self.buckets.last() else {
            return Err("no length bucket".into());
        };
        if self.buckets[0] == 0 || self.buckets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "length buckets must be positive and ascending, not {:?}",
                self.buckets
            ));
        }
        if self.max_patches_per_batch < largest {
            return Err(format!(
                "max_patches_per_batch={} holds no image of {largest} patches (max_num_patches): it must be at least that",
                self.max_patches_per_batch
            ));
        }
        Ok(())
    }

    /// The bucket of an image of `patches` patches (at most the last bound).
    pub fn bucket_of(&self, patches: u32) -> usize {
        self.buckets
            .partition_point(|&b| b < patches)
            .min(self.buckets.len() - 1)
    }

    /// Images per full batch of bucket `k`: what the budget allows, at most
    /// `max_images_per_batch`.
    pub fn capacity(&self, k: usize) -> usize {
        let fit = (self.max_patches_per_batch / self.buckets[k]).max(1);
        match self.max_images_per_batch {
            0 => fit as usize,
            most => fit.min(most) as usize,
        }
    }

    /// The most samples a reader holds while batching one unit: a batch short of full in
    /// every bucket.
    pub fn most_held(&self) -> usize {
        (0..self.buckets.len()).map(|k| self.capacity(k) - 1).sum()
    }

    /// The padded length of bucket `k`'s batches.
    pub fn length(&self, k: usize) -> u32 {
        self.buckets[k]
    }
}

/// The online batching of one unit: push samples in file order, take batches as they complete.
pub struct Bucketer<'a> {
    shape: &'a BudgetShape,
    open: Vec<Vec<u32>>,
}

impl<'a> Bucketer<'a> {
    pub fn new(shape: &'a BudgetShape) -> Self {
        Self {
            shape,
            open: vec![Vec::new(); shape.buckets.len()],
        }
    }

    /// Adds the sample at unit position `position` with `patches` patches; returns the batch it
    /// completes, if any.
    pub fn push(&mut self, position: u32, patches: u32) -> Option<PlannedBatch> {
        let k = self.shape.bucket_of(patches);
        self.open[k].push(position);
        (self.open[k].len() >= self.shape.capacity(k)).then(|| PlannedBatch {
            bucket: k as u32,
            members: std::mem::take(&mut self.open[k]),
        })
    }

    /// The unit's last batches: every non-empty bucket's samples, ascending bucket order.
    pub fn finish(self) -> Vec<PlannedBatch> {
        self.open
            .into_iter()
            .enumerate()
            .filter(|(_, m)| !m.is_empty())
            .map(|(k, members)| PlannedBatch {
                bucket: k as u32,
                members,
            })
            .collect()
    }

    /// Positions held in open buckets (what a reader keeps in memory).
    pub fn held(&self) -> usize {
        self.open.iter().map(Vec::len).sum()
    }
}

/// Every batch of a unit whose usable samples have these patch counts (`None`: skipped), in
/// emission order.
pub fn unit_batches(shape: &BudgetShape, patches: &[Option<u32>]) -> Vec<PlannedBatch> {
    let mut bucketer = Bucketer::new(shape);
    let mut out: Vec<PlannedBatch> = patches
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.and_then(|n| bucketer.push(i as u32, n)))
        .collect();
    out.extend(bucketer.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> BudgetShape {
        BudgetShape {
            max_patches_per_batch: 1000,
            buckets: vec![100, 200, 256],
            max_images_per_batch: 0,
        }
    }

    #[test]
    fn buckets_take_images_up_to_their_bound_and_batches_fit_the_budget() {
        let s = shape();
        assert_eq!(s.bucket_of(1), 0);
        assert_eq!(s.bucket_of(100), 0);
        assert_eq!(s.bucket_of(101), 1);
        assert_eq!(s.bucket_of(256), 2);
        assert_eq!(
            (s.capacity(0), s.capacity(1), s.capacity(2)),
            (10, 5, 3),
            "floor(budget / length)"
        );
        for k in 0..3 {
            assert!(s.capacity(k) as u32 * s.length(k) <= s.max_patches_per_batch);
        }
        assert_eq!(
            BudgetShape::even(4096, 256, 64).buckets,
            vec![64, 128, 192, 256]
        );
        assert_eq!(BudgetShape::even(4096, 250, 64).buckets.last(), Some(&250));
        let capped = BudgetShape {
            max_images_per_batch: 4,
            ..s.clone()
        };
        assert_eq!((capped.capacity(0), capped.capacity(2)), (4, 3));
        assert_eq!(capped.most_held(), 3 + 3 + 2);
    }

    #[test]
    fn every_usable_sample_is_in_exactly_one_batch_of_its_bucket() {
        let s = shape();
        let mut rng = crate::rng::SplitMix64::new(7);
        let patches: Vec<Option<u32>> = (0..500)
            .map(|_| {
                let n = 1 + (rng.next_u64() % 256) as u32;
                (!n.is_multiple_of(17)).then_some(n)
            })
            .collect();
        let batches = unit_batches(&s, &patches);
        let mut seen = vec![0u32; patches.len()];
        for b in &batches {
            assert!(b.members.len() <= s.capacity(b.bucket as usize));
            assert!(b.members.windows(2).all(|w| w[0] < w[1]), "file order");
            for &m in &b.members {
                seen[m as usize] += 1;
                let n = patches[m as usize].unwrap();
                assert_eq!(s.bucket_of(n), b.bucket as usize);
            }
        }
        for (i, n) in patches.iter().enumerate() {
            assert_eq!(seen[i], u32::from(n.is_some()), "sample {i}");
        }
        // At most one short batch per bucket, all at the end.
        let short: Vec<_> = batches
            .iter()
            .enumerate()
            .filter(|(_, b)| b.members.len() < s.capacity(b.bucket as usize))
            .map(|(i, _)| i)
            .collect();
        assert!(short.len() <= 3);
        assert!(short.iter().all(|&i| i >= batches.len() - 3));
        assert_eq!(unit_batches(&s, &patches), batches, "deterministic");
    }

    #[test]
    fn a_reader_holds_at_most_the_open_buckets() {
        let s = shape();
        let mut b = Bucketer::new(&s);
        let most = s.most_held();
        for i in 0..10_000u32 {
            b.push(i, 1 + (i * 37) % 256);
            assert!(b.held() <= most);
        }
    }

    #[test]
    fn shapes_that_cannot_batch_are_refused() {
        let mut s = shape();
        assert!(s.validate().is_ok());
        s.max_patches_per_batch = 255;
        assert!(s
            .validate()
            .unwrap_err()
            .contains("max_patches_per_batch=255"));
        s.max_patches_per_batch = 1000;
        s.buckets = vec![200, 100];
        assert!(s.validate().unwrap_err().contains("ascending"));
        s.buckets = vec![];
        assert!(s.validate().is_err());
    }
}
