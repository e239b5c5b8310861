//! Errors as the Python exceptions of `capwire._errors`, one class per
//! error code (and per local failure).

use capwire::envelope::{ErrorBody, ErrorCode};
use capwire::{CallError, NodeError, StreamClosed, TaskError};
use pyo3::prelude::*;

/// The exception class named `class` of `capwire._errors`, made with
/// `message` and `code`.
pub(crate) fn raise(class: &str, message: String, code: Option<String>) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("capwire._errors")
            .and_then(|m| m.getattr(class))
            .and_then(|cls| cls.call1((message, code)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
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
pub(crate) fn remote(body: &ErrorBody) -> PyErr {
    raise(class_of(&body.code), body.message.clone(), Some(body.code.to_string()))
}

/// A call that did not produce a result.
pub(crate) fn call(e: CallError) -> PyErr {
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
    raise(class, message, code.map(str::to_owned))
}

/// A node that could not be built, started or connected.
pub(crate) fn node(e: NodeError) -> PyErr {
    match e {
        NodeError::Bind(inner) => call(inner),
        NodeError::Timeout => raise("Timeout", e.to_string(), Some("timeout".into())),
        NodeError::Shutdown => raise("Shutdown", e.to_string(), None),
        other => raise("NodeError", other.to_string(), None),
    }
}

/// A stream a handler can no longer write to.
pub(crate) fn stream_closed(e: StreamClosed) -> PyErr {
    raise("StreamClosed", e.to_string(), None)
}

/// A task operation that failed.
pub(crate) fn task(e: TaskError) -> PyErr {
    let class = match e {
        TaskError::NoAnswer => "NoAnswer",
        _ => "TaskError",
    };
    raise(class, e.to_string(), None)
}
