//! The plan of one epoch in its current phase: fresh, resumed, or re-planned elastically.

use super::layout::Layout;
use super::reader::ReaderPlan;
use super::sequence::{global_sequence, Sequence};
use super::shuffle::BlockShuffle;
use super::state::{check_record, consumed_ranges, find_reserve_use};
use super::*;

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
    pub(super) sequence: Sequence,
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
        config.validate()?;
        let sequence = global_sequence(input, seed, epoch);
        Ok(Self {
            seed,
            epoch,
            fingerprint: input.fingerprint,
            num_valid: input.num_valid,
            history: Vec::new(),
            phase: 0,
            layout: Layout::new(sequence.len(), config),
            sequence,
            input: input.clone(),
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
        if state.index_fingerprint != input.fingerprint {
            return Err(PlanError::OtherDataset {
                state: state.index_fingerprint,
                index: input.fingerprint,
            });
        }
        if state.num_samples != input.num_valid {
            return Err(PlanError::State(format!(
                "the state counts {} valid samples, this index {}",
                state.num_samples, input.num_valid
            )));
        }
        config.validate()?;
        let (seed, epoch) = (state.seed, state.epoch);
        let mut sequence = global_sequence(input, seed, epoch);
        for (p, record) in state.phases.iter().enumerate() {
            let phase = u32::try_from(p).map_err(|_| PlanError::State("too many phases".into()))?;
            record.config.validate()?;
            let layout = Layout::new(sequence.len(), record.config);
            check_record(&layout, record)?;
            if p + 1 == state.phases.len() && record.config == config {
                return Ok(Self {
                    seed,
                    epoch,
                    fingerprint: input.fingerprint,
                    num_valid: input.num_valid,
                    history: state.phases[..p].to_vec(),
                    phase,
                    layout,
                    sequence,
                    input: input.clone(),
                    start: record.batches_done,
                    reserve_used: record.reserve_used.clone(),
                });
            }
            let consumed = consumed_ranges(&layout, seed, epoch, phase, record);
            sequence = sequence.without(input, &consumed);
        }
        let phase = u32::try_from(state.phases.len())
            .map_err(|_| PlanError::State("too many phases".into()))?;
        Ok(Self {
            seed,
            epoch,
            fingerprint: input.fingerprint,
            num_valid: input.num_valid,
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

    /// Batches every rank yields in the whole current phase.
    pub fn phase_batches(&self) -> u64 {
        self.layout.batches_per_rank()
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
            Some(&self.input),
            self.layout.tail_start(),
            self.layout.tail_start() + self.layout.tail_len(),
            &mut out,
            true,
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
        let mut sequence = Sequence::default();
        segments.for_each(first_block * block_size, len, |a, b| {
            self.sequence
                .copy_range(Some(&self.input), a, b, &mut sequence, true)
        });
        let used = find_reserve_use(&self.reserve_used, rank, reader);
        let (ra, rb) = self.layout.reserve_range(r, w);
        let mut reserve = Sequence::default();
        self.sequence.copy_range(
            Some(&self.input),
            (ra + used).min(rb),
            rb,
            &mut reserve,
            true,
        );
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
            shuffle: BlockShuffle::new(
                self.seed, self.epoch, self.phase, rank, reader, block_size, len,
            ),
            first_block,
            skip_emitted: emitted % block_size,
            num_batches,
            batch_size: config.batch_size,
            last_batch_size,
            sequence,
            reserve: reserve.runs,
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
