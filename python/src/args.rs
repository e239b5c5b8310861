//! What Python hands the native module, as Rust takes it: node ids,
//! seconds, and the `ValueError` a value that does not fit raises.

use std::time::Duration;

use capwire::NodeId;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

pub(crate) fn node_id(text: &str) -> PyResult<NodeId> {
    text.parse()
        .map_err(|e| value_error(format!("not a node id: {e}")))
}

/// A deadline in seconds, or the node's default when none is given.
pub(crate) fn seconds(s: Option<f64>) -> PyResult<Duration> {
    match s {
        None => Ok(capwire::Limits::default().default_deadline),
        Some(s) => Duration::try_from_secs_f64(s).map_err(value_error),
    }
}
