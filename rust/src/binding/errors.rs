//! Rust errors as Python exceptions: a fault (reason, URL, key, detail, source kind) as
//! `CoreFault`, index and plan errors as `ValueError`; and URL redaction, so that Python's
//! messages hide what the core's hide.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::error::Fault;
use crate::read::source::redact_url;

create_exception!(
    _core,
    CoreFault,
    PyException,
    "A shard or sample fault: args = (reason, url, key, detail)."
);

create_exception!(
    _core,
    UnknownSetting,
    PyValueError,
    "A config key the core does not read: args = (key, kind, message)."
);

create_exception!(
    _core,
    MissingSetting,
    PyValueError,
    "A config key the core needs that is absent or None: args = (key, kind, message)."
);

create_exception!(
    _core,
    WrongSetting,
    PyTypeError,
    "A config value the core cannot read as its setting's type (or out of its range): args = \
     (key, kind, message)."
);

create_exception!(
    _core,
    FfmpegUnavailable,
    pyo3::exceptions::PyImportError,
    "No usable FFmpeg shared libraries in this process (none found, or a release this build \
     has no layout for): video cannot be decoded. args = (message,)."
);

pub(super) fn fault_to_py(f: Fault) -> PyErr {
    CoreFault::new_err((f.reason.as_str(), f.url, f.key, f.detail, f.kind.as_str()))
}

pub(super) fn index_err(e: crate::index::IndexError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

pub(super) fn plan_err(e: crate::plan::PlanError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

#[pyfunction]
#[pyo3(name = "redact_url")]
pub(super) fn py_redact_url(url: &str) -> String {
    redact_url(url)
}
