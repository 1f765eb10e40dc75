//! The plan of one epoch in its current phase: fresh, resumed, or re-planned elastically.

use super::layout::Layout;
use super::mixture::{MixedStreams, Mixture};
use super::phase::PhaseSequence;
use super::reader::ReaderPlan;
use super::sequence::{global_sequence, Sequence};
use super::shuffle::BlockShuffle;
use super::state::{check_record, consumed_ranges, find_reserve_use};
use super::*;

/// What an epoch plan plans: one dataset, or a mixture of several.
#[derive(Clone, Copy)]
enum Dataset<'a> {
    Single(&'a PlanInput),
    Mixture(&'a Mixture),
}

impl Dataset<'_> {
    fn input(&self) -> &PlanInput {
        match self {
            Self::Single(input) => input,
            Self::Mixture(mixture) => &mixture.input,
        }
    }

    fn fingerprint(&self) -> u64 {
        match self {
            Self::Single(input) => input.fingerprint,
            Self::Mixture(mixture) => mixture.fingerprint,
        }
    }

    /// Samples of phase 0 (all valid samples; a mixture's epoch length).
    fn num_samples(&self) -> u64 {
        match self {
            Self::Single(input) => input.num_valid,
            Self::Mixture(mixture) => mixture.total,
        }
    }

    fn phase0(&self, seed: u64, epoch: u64) -> PhaseSequence {
        match self {
            Self::Single(input) => PhaseSequence::Plain(global_sequence(input, seed, epoch)),
            Self::Mixture(mixture) => PhaseSequence::Mixed(mixture.sequence(seed, epoch)),
        }
    }
}

/// The plan of one epoch in its current phase; cheap to build (linear in shards), and every
/// rank builds the same one. Hand [`EpochPlan::reader`] to each reader.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    pub(super) seed: u64,
    pub(super) epoch: u64,
    pub(super) fingerprint: u64,
    pub(super) num_valid: u64,
    /// Earlier phases of this epoch, as recorded in the state we resumed from.
    pub(super) history: Vec<PhaseRecord>,
    pub(super) phase: u32,
    pub(super) layout: Layout,
    /// The phase sequence; its runs hold invalid ordinals, which `input` knows.
    pub(super) sequence: PhaseSequence,
    pub(super) input: PlanInput,
    /// Batches per rank already yielded in this phase before this plan starts.
    pub(super) start: u64,
    /// Reserve samples already used in this phase before this plan starts.
    pub(super) reserve_used: Vec<ReserveUse>,
}

impl EpochPlan {
    /// The plan of a fresh epoch.
    pub fn new(
        input: &PlanInput,
        seed: u64,
        epoch: u64,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        Self::fresh(Dataset::Single(input), seed, epoch, config)
    }

    /// The plan of a fresh epoch of a mixture (its shards numbered as [`Mixture::input`]'s).
    pub fn mixture(
        mixture: &Mixture,
        seed: u64,
        epoch: u64,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        Self::fresh(Dataset::Mixture(mixture), seed, epoch, config)
    }

    /// [`EpochPlan::resume`] for a mixture.
    pub fn resume_mixture(
        mixture: &Mixture,
        state: &EpochState,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        Self::resumed(Dataset::Mixture(mixture), state, config)
    }

    fn fresh(
        dataset: Dataset<'_>,
        seed: u64,
        epoch: u64,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        config.validate()?;
        let sequence = dataset.phase0(seed, epoch);
        Ok(Self {
            seed,
            epoch,
            fingerprint: dataset.fingerprint(),
            num_valid: dataset.num_samples(),
            history: Vec::new(),
            phase: 0,
            layout: Layout::new(sequence.len(), config),
            sequence,
            input: dataset.input().clone(),
            start: 0,
            reserve_used: Vec::new(),
        })
    }

    /// The plan that continues the epoch recorded in `state`. With the configuration of the
    /// state's last phase, the phase continues exactly where it stopped; with any other, what was
    /// consumed is removed and the rest is planned as a new phase (seed and epoch come from the
    /// state).
    pub fn resume(
        input: &PlanInput,
        state: &EpochState,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        Self::resumed(Dataset::Single(input), state, config)
    }

    fn resumed(
        dataset: Dataset<'_>,
        state: &EpochState,
        config: PhaseConfig,
    ) -> Result<Self, PlanError> {
        let (input, fingerprint, num_valid) = (
            dataset.input(),
            dataset.fingerprint(),
            dataset.num_samples(),
        );
        if state.index_fingerprint != fingerprint {
            return Err(PlanError::OtherDataset {
                state: state.index_fingerprint,
                index: fingerprint,
            });
        }
        if state.num_samples != num_valid {
            return Err(PlanError::State(format!(
                "the state counts {} samples an epoch, this dataset {num_valid}",
                state.num_samples
            )));
        }
        config.validate()?;
        let (seed, epoch) = (state.seed, state.epoch);
        let mut sequence = dataset.phase0(seed, epoch);
        for (p, record) in state.phases.iter().enumerate() {
            let phase = u32::try_from(p).map_err(|_| PlanError::State("too many phases".into()))?;
            record.config.validate()?;
            let layout = Layout::new(sequence.len(), record.config);
            check_record(&layout, record)?;
            if p + 1 == state.phases.len() && record.config == config {
                return Ok(Self {
                    seed,
                    epoch,
                    fingerprint,
                    num_valid,
                    history: state.phases[..p].to_vec(),
                    phase,
                    layout,
                    sequence,
                    input: input.clone(),
                    start: record.batches_done,
                    reserve_used: record.reserve_used.clone(),
                });
            }
            let consumed = consumed_ranges(&layout, &sequence, seed, epoch, phase, record);
            sequence = sequence.without(input, &consumed);
        }
        let phase = u32::try_from(state.phases.len())
            .map_err(|_| PlanError::State("too many phases".into()))?;
        Ok(Self {
            seed,
            epoch,
            fingerprint,
            num_valid,
            history: state.phases.clone(),
            phase,
            layout: Layout::new(sequence.len(), config),
            sequence,
            input: input.clone(),
            start: 0,
            reserve_used: Vec::new(),
        })
    }

    pub fn config(&self) -> PhaseConfig {
        self.layout.config
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Index of the current phase (0 for a fresh epoch).
    pub fn phase(&self) -> u32 {
        self.phase
    }

    /// Samples in the current phase's sequence (all valid samples in phase 0).
    pub fn num_samples(&self) -> u64 {
        self.layout.len
    }

    /// Batches every rank yields from here on (what `len()` of a loader reports).
    pub fn num_batches(&self) -> u64 {
        self.layout.batches_per_rank() - self.start
    }

    /// Batches per rank already yielded in this phase when this plan starts.
    pub fn batches_done(&self) -> u64 {
        self.start
    }

    /// The samples dropped by `drop_last` (fewer than one global batch), in sequence order.
    /// They are also the reserve: those a reader used as replacements were yielded after all.
    pub fn remainder(&self) -> Vec<Run> {
        let mut out = Sequence::default();
        self.sequence.copy_range(
            &self.input,
            self.layout.tail_start(),
            self.layout.tail_start() + self.layout.tail_len(),
            &mut out,
        );
        out.runs
    }

    pub fn remainder_len(&self) -> u64 {
        self.layout.tail_len()
    }

    /// Repeated samples that pad the short last batches when `drop_last` is false.
    pub fn padding(&self) -> u64 {
        self.layout.padding()
    }

    /// The plan of DataLoader worker `worker` (0 when `workers` is 0) of rank `rank`.
    ///
    /// After a resume inside a phase, the DataLoader starts its round-robin at worker 0 again,
    /// so worker d plays the phase reader `(d + batches_done) mod K`: that keeps the batches in
    /// exactly the order an uninterrupted run would have yielded them.
    pub fn reader(&self, rank: u32, worker: u32) -> Result<ReaderPlan, PlanError> {
        let config = self.layout.config;
        if rank >= config.world_size {
            return Err(PlanError::Config(format!(
                "rank {rank} is outside world_size {}",
                config.world_size
            )));
        }
        let k = config.readers_per_rank();
        if worker >= k {
            return Err(PlanError::Config(format!(
                "worker {worker} is outside {} readers per rank",
                k
            )));
        }
        let reader = ((worker as u64 + self.start) % k as u64) as u32;
        let (r, w) = (rank as u64, reader as u64);
        let segments = self.layout.reader_segments(r, w);
        let len = segments.len();
        let total = self.layout.reader_batches(w);
        let done = reader_batches_done(self.start, k, reader);
        let emitted = (done * config.batch_size).min(len);
        let block_size = config.block_size;
        let first_block = emitted / block_size;
        let shuffle = BlockShuffle::new(
            self.seed, self.epoch, self.phase, rank, reader, block_size, len,
        );
        let (sequence, streams) = match &self.sequence {
            PhaseSequence::Plain(_) => {
                let mut sequence = Sequence::default();
                segments.for_each(first_block * block_size, len, |a, b| {
                    self.sequence.copy_range(&self.input, a, b, &mut sequence)
                });
                (sequence, None)
            }
            PhaseSequence::Mixed(mixed) => {
                let sources = mixed.num_sources();
                let mut sequence = Sequence::default();
                let mut streams = vec![Sequence::default(); sources];
                let mut block_counts = Vec::new();
                for block in first_block..shuffle.num_blocks() {
                    let from = block * block_size;
                    let mut ranges = Vec::new();
                    segments.for_each(from, from + shuffle.block_len(block), |a, b| {
                        ranges.push((a, b))
                    });
                    let mut pieces = vec![Sequence::default(); sources];
                    mixed.pieces(&self.input, &ranges, &mut pieces);
                    for (piece, stream) in pieces.iter().zip(streams.iter_mut()) {
                        block_counts.push(piece.len() as u32);
                        for &run in &piece.runs {
                            sequence.push(run, None);
                            stream.push(run, None);
                        }
                    }
                }
                let runs = streams.into_iter().map(|s| s.runs).collect();
                (sequence, Some(MixedStreams { runs, block_counts }))
            }
        };
        // The reserve in block order; the first `used` of it were used before this plan.
        let used = find_reserve_use(&self.reserve_used, rank, reader);
        let (ra, rb) = self.layout.reserve_range(r, w);
        let mut whole_reserve = Sequence::default();
        self.sequence
            .copy_range(&self.input, ra, rb, &mut whole_reserve);
        let mut reserve = Sequence::default();
        let reserve_len = whole_reserve.len();
        whole_reserve.copy_range(None, used.min(reserve_len), reserve_len, &mut reserve, true);
        let num_batches = total - done;
        let last_batch_size = match num_batches {
            0 => 0,
            _ if self.layout.owns_partial(w) => self.layout.partial,
            _ => config.batch_size,
        };
        Ok(ReaderPlan {
            rank,
            worker,
            reader,
            phase: self.phase,
            shuffle,
            first_block,
            skip_emitted: emitted % block_size,
            num_batches,
            batch_size: config.batch_size,
            last_batch_size,
            sequence,
            reserve: reserve.runs,
            streams,
        })
    }

    /// The state after every rank yielded `batches_yielded` more batches of this plan, and readers
    /// used `reserve_used` more reserve samples (gathered from all ranks; may be empty).
    pub fn state(
        &self,
        batches_yielded: u64,
        reserve_used: &[ReserveUse],
    ) -> Result<EpochState, PlanError> {
        let batches_done = self.start + batches_yielded;
        let mut merged = self.reserve_used.clone();
        for u in reserve_used {
            match merged
                .iter_mut()
                .find(|m| m.rank == u.rank && m.reader == u.reader)
            {
                Some(m) => m.used += u.used,
                None => merged.push(*u),
            }
        }
        merged.retain(|u| u.used > 0);
        merged.sort_by_key(|u| (u.rank, u.reader));
        let record = PhaseRecord {
            config: self.layout.config,
            batches_done,
            reserve_used: merged,
        };
        check_record(&self.layout, &record)?;
        let mut phases = self.history.clone();
        phases.push(record);
        Ok(EpochState {
            format: STATE_FORMAT.to_string(),
            version: STATE_VERSION,
            seed: self.seed,
            epoch: self.epoch,
            index_fingerprint: self.fingerprint,
            num_samples: self.num_valid,
            phases,
        })
    }
}
