//! Plans seen from Python: `MixturePlan` (several indexes as one epoch), `PlanRequest`, the
//! plan of one epoch (`EpochPlanView`), the spans one planned reader opens (`PlannedSpans`),
//! the shard assignment without an index, and the seed derivation.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::source_options;
use super::errors::plan_err;
use super::index::DatasetIndex;
use crate::batch::square::sample_batches::MainSpans;
use crate::plan::{self, EpochPlan, EpochState, PhaseConfig};
use crate::read::span::ShardSpan;
use crate::read::spans::PlannedShards;
use crate::rng;

/// Several indexes planned as one epoch, each source taking its share (`plan::Mixture`).
#[pyclass(module = "shardstream._core", frozen)]
pub struct MixturePlan {
    mixture: plan::Mixture,
    shards: Arc<PlannedShards>,
}

#[pymethods]
impl MixturePlan {
    /// `shares[i]`: ("weight", w) or ("samples", n) for `sources[i]`.
    #[new]
    #[pyo3(signature = (sources, shares, epoch_samples = None))]
    fn new(
        py: Python<'_>,
        sources: Vec<PyRef<'_, DatasetIndex>>,
        shares: Vec<(String, f64)>,
        epoch_samples: Option<u64>,
    ) -> PyResult<Self> {
        let shares = shares
            .into_iter()
            .map(|(kind, value)| match kind.as_str() {
                "weight" => Ok(plan::Share::Weight(value)),
                "samples" if value >= 0.0 && value.fract() == 0.0 => {
                    Ok(plan::Share::Samples(value as u64))
                }
                _ => Err(PyValueError::new_err(format!(
                    "a share is (\"weight\", w) or (\"samples\", n), got ({kind:?}, {value})"
                ))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        // Made here and dropped once the mixture holds its own copy: a source's index is not
        // planned on its own, so it keeps no plan input of its own.
        let inputs: Vec<plan::PlanInput> = sources.iter().map(|s| s.index.plan_input()).collect();
        let parts = sources.iter().map(|s| s.part()).collect();
        let mixture = py
            .detach(|| plan::Mixture::new(&inputs, &shares, epoch_samples))
            .map_err(plan_err)?;
        Ok(Self {
            mixture,
            shards: Arc::new(PlannedShards::new(parts)),
        })
    }

    /// Samples per epoch of each source.
    #[getter]
    fn quotas(&self) -> Vec<u64> {
        self.mixture.quotas()
    }

    /// Each source's first shard in the mixture's numbering (`Batch` shard numbers).
    #[getter]
    fn first_shards(&self) -> Vec<u32> {
        self.mixture.first_shards()
    }

    #[getter]
    fn num_samples(&self) -> u64 {
        self.mixture.total()
    }

    #[getter]
    fn fingerprint(&self) -> u64 {
        self.mixture.fingerprint()
    }

    /// As `DatasetIndex.plan`, over the mixture.
    fn plan(&self, py: Python<'_>, request: &PlanRequest) -> PyResult<EpochPlanView> {
        let mixture = &self.mixture;
        request.plan_view(py, self.shards.clone(), |state| match state {
            None => EpochPlan::mixture(mixture, request.seed, request.epoch, request.config),
            Some(st) => EpochPlan::resume_mixture(mixture, &st, request.config),
        })
    }
}

/// What `DatasetIndex.plan` and `MixturePlan.plan` are asked for, declared once: the phase's
/// configuration, and where the epoch starts (fresh at (seed, epoch), or from `state`).
#[pyclass(module = "shardstream._core", frozen)]
pub struct PlanRequest {
    pub(super) seed: u64,
    pub(super) epoch: u64,
    pub(super) config: PhaseConfig,
    /// A `state_dict` JSON: the rest of the epoch it describes, re-planned onto `config` if
    /// that differs from the state's.
    state: Option<String>,
}

#[pymethods]
impl PlanRequest {
    #[new]
    #[pyo3(signature = (*, seed, epoch, world_size, workers, batch_size, block_size, drop_last, state = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        epoch: u64,
        world_size: u32,
        workers: u32,
        batch_size: u64,
        block_size: u64,
        drop_last: bool,
        state: Option<String>,
    ) -> Self {
        let config = PhaseConfig::new(world_size, workers, batch_size, block_size, drop_last);
        Self {
            seed,
            epoch,
            config,
            state,
        }
    }
}

impl PlanRequest {
    /// The plan `make` gives for the parsed `state` (None: a fresh epoch), without the GIL.
    pub(super) fn plan_view(
        &self,
        py: Python<'_>,
        shards: Arc<PlannedShards>,
        make: impl FnOnce(Option<EpochState>) -> Result<EpochPlan, plan::PlanError> + Send,
    ) -> PyResult<EpochPlanView> {
        let plan = py
            .detach(|| {
                let state = self
                    .state
                    .as_deref()
                    .map(|json| EpochState::from_json(json.as_bytes()))
                    .transpose()?;
                make(state)
            })
            .map_err(plan_err)?;
        Ok(EpochPlanView { plan, shards })
    }
}

/// The spans one planned reader opens (built in Rust, handed to `Loader` as they are).
#[pyclass(module = "shardstream._core", frozen)]
pub struct PlannedSpans {
    spans: Vec<ShardSpan>,
    pub(super) reserve: Vec<ShardSpan>,
    /// A mixture's reader: its spans per source and each block's count of each.
    mixed: Option<(Vec<Vec<ShardSpan>>, Vec<u32>)>,
}

impl PlannedSpans {
    pub(super) fn main(&self) -> MainSpans {
        match &self.mixed {
            None => MainSpans::Spans(self.spans.clone()),
            Some((streams, counts)) => MainSpans::Mixed {
                streams: streams.clone(),
                block_counts: counts.clone(),
            },
        }
    }
}

/// One epoch's plan over an index: what each reader reads, and the resumable state.
#[pyclass(module = "shardstream._core", frozen)]
pub struct EpochPlanView {
    plan: EpochPlan,
    shards: Arc<PlannedShards>,
}

impl EpochPlanView {
    fn spans(&self, runs: &[plan::Run]) -> PyResult<Vec<ShardSpan>> {
        self.shards.spans(runs).map_err(PyValueError::new_err)
    }
}

#[pymethods]
impl EpochPlanView {
    /// Batches per rank from here on (the same on every rank).
    #[getter]
    fn num_batches(&self) -> u64 {
        self.plan.num_batches()
    }

    #[getter]
    fn remainder_len(&self) -> u64 {
        self.plan.remainder_len()
    }

    /// Keys of the samples left out of this epoch (the tail < one global batch), when the index
    /// holds keys: in memory, or in the detail blocks of the few shards that hold the tail,
    /// fetched with the reader options in `config`.
    #[pyo3(signature = (config = None))]
    fn remainder_keys(
        &self,
        py: Python<'_>,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<String>> {
        let opts = source_options(config)?;
        let runs = self.plan.remainder();
        py.detach(|| self.shards.keys(&runs, &opts))
            .map_err(|e: String| PyValueError::new_err(e))
    }

    /// What reader (rank, worker) reads: its spans and reserve spans (`PlannedSpans`, for
    /// `Loader`) and the block shuffle.
    fn reader(&self, py: Python<'_>, rank: u32, worker: u32) -> PyResult<Py<PyAny>> {
        let r = self.plan.reader(rank, worker).map_err(plan_err)?;
        let d = PyDict::new(py);
        let mixed = match &r.streams {
            None => None,
            Some(m) => Some((
                m.runs
                    .iter()
                    .map(|runs| self.spans(runs))
                    .collect::<PyResult<_>>()?,
                m.block_counts.clone(),
            )),
        };
        let spans = PlannedSpans {
            spans: if mixed.is_some() {
                Vec::new()
            } else {
                self.spans(r.runs())?
            },
            reserve: self.spans(r.reserve())?,
            mixed,
        };
        d.set_item("spans", Py::new(py, spans)?)?;
        d.set_item("num_batches", r.num_batches)?;
        d.set_item("last_batch_size", r.last_batch_size)?;
        d.set_item("block_size", r.shuffle.block_size())?;
        d.set_item("shuffle_seed", r.shuffle.base_seed())?;
        d.set_item("first_block", r.first_block)?;
        d.set_item("skip_emitted", r.skip_emitted)?;
        d.set_item("reader", r.reader)?;
        Ok(d.into_any().unbind())
    }

    /// The resumable state after `batches` batches of this plan were consumed on every rank and
    /// readers used `reserve_used` = [(rank, phase reader, reserve positions)] since it started.
    #[pyo3(signature = (batches, reserve_used = Vec::new()))]
    fn state(&self, batches: u64, reserve_used: Vec<(u32, u32, u64)>) -> PyResult<String> {
        let uses: Vec<plan::ReserveUse> = reserve_used
            .into_iter()
            .map(|(rank, reader, used)| plan::ReserveUse { rank, reader, used })
            .collect();
        Ok(self.plan.state(batches, &uses).map_err(plan_err)?.to_json())
    }
}

/// (shard ids in reading order, (stride, offset), batches, shuffle base seed).
type ShardAssignmentTuple = (Vec<u32>, (u64, u64), u64, u64);

/// The seed derivation used everywhere in the crate (`rng::derive_seed`).
#[pyfunction]
pub(super) fn derive_seed(parts: Vec<u64>) -> u64 {
    rng::derive_seed(&parts)
}

/// One reader's shards without an index: see `plan::assign_shards`.
/// Returns (shard ids in reading order, (stride, offset), batches, shuffle base seed).
#[pyfunction]
#[pyo3(signature = (num_shards, *, seed, epoch, world_size, workers, batch_size, block_size, samples_per_epoch, rank, worker))]
#[allow(clippy::too_many_arguments)]
pub(super) fn assign_shards(
    num_shards: usize,
    seed: u64,
    epoch: u64,
    world_size: u32,
    workers: u32,
    batch_size: u64,
    block_size: u64,
    samples_per_epoch: u64,
    rank: u32,
    worker: u32,
) -> PyResult<ShardAssignmentTuple> {
    let config = PhaseConfig::new(world_size, workers, batch_size, block_size, true);
    let a = plan::assign_shards(
        num_shards,
        seed,
        epoch,
        config,
        samples_per_epoch,
        rank,
        worker,
    )
    .map_err(plan_err)?;
    Ok((
        a.shards,
        (a.stride, a.offset),
        a.num_batches,
        a.shuffle.base_seed(),
    ))
}
