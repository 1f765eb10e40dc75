//! `Pipeline`: the running pipeline of one reader, of any kind. Python lends buffers (`submit`)
//! and takes back finished batches (`next_batch`) in the same order; every wait releases the
//! GIL. One class for every kind: a kind's binding only starts its pipeline (`loader.rs`,
//! `budget.rs`, `packed.rs`) and says how its batch metadata converts (`MetaToPy`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::json_to_py;
use super::errors::fault_to_py;
use crate::batch::pipeline::{Kind, KindStats, Lent, Region};

/// A kind's batch metadata as the Python object its loader reads.
pub(super) trait MetaToPy {
    fn to_py(self, py: Python<'_>) -> PyResult<Py<PyAny>>;
}

/// A core pipeline of some kind, as the one Python class drives it.
trait Running: Send + Sync {
    fn submit(&self, lent: Lent) -> Result<bool, String>;
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>>;
    fn stats(&self) -> serde_json::Value;
    fn batches_left(&self) -> Option<u64>;
    fn region_bytes(&self) -> Vec<usize>;
}

impl<K: Kind, S: KindStats> Running for crate::batch::pipeline::Pipeline<K, S>
where
    K::Meta: MetaToPy,
{
    fn submit(&self, lent: Lent) -> Result<bool, String> {
        crate::batch::pipeline::Pipeline::submit(self, lent)
    }

    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match py.detach(|| crate::batch::pipeline::Pipeline::next_batch(self)) {
            None => Ok(None),
            Some(Err(fault)) => Err(fault_to_py(fault)),
            Some(Ok(meta)) => meta.to_py(py).map(Some),
        }
    }

    fn stats(&self) -> serde_json::Value {
        self.stats.snapshot()
    }

    fn batches_left(&self) -> Option<u64> {
        crate::batch::pipeline::Pipeline::batches_left(self)
    }

    fn region_bytes(&self) -> Vec<usize> {
        self.needs().iter().map(|n| n.bytes).collect()
    }
}

/// The running pipeline of one reader.
#[pyclass(module = "shardstream._core")]
pub struct Pipeline {
    running: Option<Box<dyn Running>>,
}

impl Pipeline {
    pub(super) fn new<K: Kind, S: KindStats>(p: crate::batch::pipeline::Pipeline<K, S>) -> Self
    where
        K::Meta: MetaToPy,
    {
        Self {
            running: Some(Box::new(p)),
        }
    }
}

#[pymethods]
impl Pipeline {
    /// Bytes each region of a lent buffer must hold, in `submit`'s order (0: not used).
    #[getter]
    fn region_bytes(&self) -> Vec<usize> {
        self.running
            .as_ref()
            .map_or(Vec::new(), |r| r.region_bytes())
    }

    /// Batches this reader yields from its position on, when its plan knows (else None).
    #[getter]
    fn batches_left(&self) -> Option<u64> {
        self.running.as_ref().and_then(|r| r.batches_left())
    }

    /// Lends a buffer for a later batch: `regions` are (address, bytes) pairs in
    /// `region_bytes`' order, inside `owner` (the tensors or arrays holding that memory; the
    /// pipeline keeps a reference while it may write there). The caller leaves the memory
    /// untouched until the batch filled into it is returned by `next_batch`. False once the
    /// pipeline has ended.
    fn submit(&self, owner: Py<PyAny>, regions: Vec<(usize, usize)>) -> PyResult<bool> {
        let Some(running) = &self.running else {
            return Ok(false);
        };
        let regions = regions
            .into_iter()
            .map(|(ptr, bytes)| Region {
                ptr: ptr as *mut u8,
                bytes,
            })
            .collect();
        let lent = Lent {
            regions,
            owner: Some(Box::new(owner)),
        };
        running.submit(lent).map_err(PyValueError::new_err)
    }

    /// The next batch's metadata (its kind's tuple), or None at the end of the pass.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match &self.running {
            Some(r) => r.next_batch(py),
            None => Ok(None),
        }
    }

    /// What the pipeline counted so far.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.running {
            Some(r) => json_to_py(py, &r.stats()),
            None => Ok(PyDict::new(py).into_any().unbind()),
        }
    }

    /// Stops every thread; afterwards no lent buffer is written any more.
    fn close(&mut self, py: Python<'_>) {
        if let Some(r) = self.running.take() {
            py.detach(move || drop(r));
        }
    }
}
