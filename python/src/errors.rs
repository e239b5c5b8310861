//! Errors as the Python exceptions of `capwire._errors`, one class per
//! error code (and per local failure). Made as [`Fail`] wherever they
//! happen (a runtime thread has no GIL) and turned into the exception on
//! the loop's thread.

use capwire::envelope::{ErrorBody, ErrorCode};
use capwire::{CallError, NodeError, StreamClosed, TaskError};
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;

/// An exception to raise, made without the GIL.
#[derive(Debug)]
pub(crate) enum Fail {
    /// An instance of the class of `capwire._errors` named `class`.
    Class {
        class: &'static str,
        message: String,
        code: Option<String>,
    },
    /// The end of an async iteration.
    Stop,
    /// Any other exception.
    Py(PyErr),
}

impl Fail {
    pub(crate) fn class(
        class: &'static str,
        message: impl Into<String>,
        code: Option<&str>,
    ) -> Self {
        Self::Class {
            class,
            message: message.into(),
            code: code.map(str::to_owned),
        }
    }

    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self {
            Fail::Class {
                class,
                message,
                code,
            } => {
                let made = py
                    .import("capwire._errors")
                    .and_then(|m| m.getattr(class))
                    .and_then(|cls| cls.call1((message, code)));
                match made {
                    Ok(exc) => PyErr::from_value(exc),
                    Err(e) => e,
                }
            }
            Fail::Stop => PyStopAsyncIteration::new_err(()),
            Fail::Py(e) => e,
        }
    }
}

impl From<PyErr> for Fail {
    fn from(e: PyErr) -> Self {
        Fail::Py(e)
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> Self {
        Python::attach(|py| f.into_pyerr(py))
    }
}

/// The class of an error code.
fn class_of(code: &ErrorCode) -> &'static str {
    match code {
        ErrorCode::UnknownVerb => "UnknownVerb",
        ErrorCode::Unauthorized => "Unauthorized",
        ErrorCode::BadArgs => "BadArgs",
        ErrorCode::NotFound => "NotFound",
        ErrorCode::Duplicate => "Duplicate",
        ErrorCode::NotBound => "NotBound",
        ErrorCode::Conflict => "Conflict",
        ErrorCode::BindFailed => "BindFailed",
        ErrorCode::Timeout => "Timeout",
        ErrorCode::Cancelled => "Cancelled",
        ErrorCode::TooLarge => "TooLarge",
        ErrorCode::Overloaded => "Overloaded",
        ErrorCode::Unavailable => "Unavailable",
        ErrorCode::Internal => "Internal",
        _ => "RemoteError",
    }
}

/// An error answer from a peer.
pub(crate) fn remote(body: &ErrorBody) -> Fail {
    Fail::Class {
        class: class_of(&body.code),
        message: body.message.clone(),
        code: Some(body.code.to_string()),
    }
}

/// A call that did not produce a result.
pub(crate) fn call(e: CallError) -> Fail {
    let message = e.to_string();
    let (class, code) = match &e {
        CallError::Denied(body) | CallError::Remote(body) => return remote(body),
        CallError::Timeout => ("Timeout", Some("timeout")),
        CallError::Cancelled => ("Cancelled", Some("cancelled")),
        CallError::TooLarge => ("TooLarge", Some("too_large")),
        CallError::Overloaded => ("Overloaded", Some("overloaded")),
        CallError::Idle => ("Idle", Some("timeout")),
        CallError::PeerLost => ("PeerLost", None),
        CallError::Unreachable(_) => ("Unreachable", None),
        CallError::VersionUnsatisfied(_) => ("VersionUnsatisfied", None),
        CallError::Encode(_) => ("EncodeError", None),
        CallError::BadResult(_) => ("BadResult", None),
        CallError::Shutdown => ("Shutdown", None),
        CallError::ReqIdInUse => ("ReqIdInUse", None),
        CallError::InvalidInvite(_) => ("InvalidInvite", None),
        CallError::Unsupported(_) => ("Unsupported", None),
        _ => ("CapwireError", None),
    };
    Fail::class(class, message, code)
}

/// A node that could not be built, started or connected.
pub(crate) fn node(e: NodeError) -> Fail {
    match e {
        NodeError::Bind(inner) => call(inner),
        NodeError::Timeout => Fail::class("Timeout", e.to_string(), Some("timeout")),
        NodeError::Shutdown => Fail::class("Shutdown", e.to_string(), None),
        other => Fail::class("NodeError", other.to_string(), None),
    }
}

/// A stream a handler can no longer write to.
pub(crate) fn stream_closed(e: StreamClosed) -> Fail {
    Fail::class("StreamClosed", e.to_string(), None)
}

/// A task operation that failed.
pub(crate) fn task(e: TaskError) -> Fail {
    let class = match e {
        TaskError::NoAnswer => "NoAnswer",
        _ => "TaskError",
    };
    Fail::class(class, e.to_string(), None)
}
