//! What the kinds that plan over unit weights share at the boundary: units and plans from their
//! tuples, a reader's share, and a count pass's results as the dicts Python records.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::json_to_py;
use crate::batch::kit::unit::Unit;
use crate::batch::units::{Counted, UnitShare};
use crate::error::Fault;
use crate::plan::budget::BudgetShape;
use crate::plan::unit_stream::{Rest, StreamPhase, StreamPlan, StreamShape};

/// (world_size, workers, batch_size, seq_len, block_rows)
pub(super) type ShapeTuple = (u32, u32, u32, u32, u32);
/// (url, first_row, rows or None, identity or None)
pub(super) type UnitTuple = (String, u64, Option<u64>, Option<String>);
/// (seed, epoch, earlier phases with their batches done, current shape, rank, worker, the
/// stream's end): which reader of which epoch's plan.
pub(super) type ReaderTuple = (
    u64,
    u64,
    Vec<(ShapeTuple, u64)>,
    ShapeTuple,
    u32,
    u32,
    EndTuple,
);
/// (the stream's planned end, whether later phases are padded): the end is the units' total
/// weight, or less where a mixture's epoch ends first; a mixture's source pads its later phases
/// (`plan::unit_stream::Rest::Padded`) so that it reads everything up to that end.
pub(super) type EndTuple = (u64, bool);

fn shape(t: ShapeTuple) -> StreamShape {
    StreamShape {
        world_size: t.0,
        workers: t.1,
        batch_size: t.2,
        seq_len: t.3,
        block_rows: t.4,
    }
}

/// The epoch's plan over the weight up to `end`.
pub(super) fn plan(
    (total, padded): EndTuple,
    seed: u64,
    epoch: u64,
    phases: Vec<(ShapeTuple, u64)>,
    current: ShapeTuple,
) -> PyResult<StreamPlan> {
    let phases = phases
        .into_iter()
        .map(|(s, batches_done)| StreamPhase {
            shape: shape(s),
            batches_done,
        })
        .collect();
    let rest = if padded {
        Rest::Padded
    } else {
        Rest::Remainder
    };
    StreamPlan::with_rest(total, seed, epoch, phases, shape(current), rest)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The share of `reader` of the plan over `units` weighted by `weights` (count order).
pub(super) fn share(
    units: Vec<UnitTuple>,
    weights: Vec<u64>,
    reader: ReaderTuple,
) -> PyResult<UnitShare> {
    let (seed, epoch, phases, current, rank, worker, end) = reader;
    let p = plan(end, seed, epoch, phases, current)?;
    let units = units
        .into_iter()
        .map(|(url, first_row, rows, identity)| Unit {
            url,
            first_row,
            rows,
            identity,
        })
        .collect();
    UnitShare::new(units, weights, &p, (seed, epoch), (rank, worker)).map_err(PyValueError::new_err)
}

/// The share of `reader` for a kind whose plan positions are whole batches (NaFlex budgets,
/// interleaved rows): the current shape must have batch_size, seq_len and block_rows 1, one
/// batch a position, or the plan's positions would not be the kind's batches.
pub(super) fn batch_share(
    units: Vec<UnitTuple>,
    weights: Vec<u64>,
    reader: ReaderTuple,
) -> PyResult<UnitShare> {
    let current = reader.3;
    BudgetShape::one_batch_a_position((current.2, current.3, current.4))
        .map_err(PyValueError::new_err)?;
    share(units, weights, reader)
}

/// A count pass's results as dicts in file order: url, first_row, rows, identity, error (None
/// or the fault), skipped and examples (what `skips` gives: the skip counts by reason and the
/// first skips, every kind's count has them), and what `fields` sets from the kind's count (its
/// zero count for a unit that could not be counted).
pub(super) fn count_list<'py, C: Default>(
    py: Python<'py>,
    counted: Vec<Counted<C>>,
    skips: impl Fn(&C) -> [serde_json::Value; 2],
    fields: impl Fn(&Bound<'py, PyDict>, &C) -> PyResult<()>,
) -> PyResult<Bound<'py, PyList>> {
    let zero = C::default();
    let out = PyList::empty(py);
    for Counted { url, unit, result } in counted {
        let unit = unit.as_ref();
        let d = PyDict::new(py);
        d.set_item("url", unit.map_or(url.as_str(), |u| u.url.as_str()))?;
        d.set_item("first_row", unit.map_or(0, |u| u.first_row))?;
        d.set_item("rows", unit.and_then(|u| u.rows))?;
        d.set_item("identity", unit.and_then(|u| u.identity.clone()))?;
        let count = result.as_ref().unwrap_or(&zero);
        fields(&d, count)?;
        let [skipped, examples] = skips(count);
        d.set_item("skipped", json_to_py(py, &skipped)?)?;
        d.set_item("examples", json_to_py(py, &examples)?)?;
        let error = result.err().map(|f: Fault| serde_json::json!(f));
        d.set_item("error", error.map(|e| json_to_py(py, &e)).transpose()?)?;
        out.append(d)?;
    }
    Ok(out)
}
