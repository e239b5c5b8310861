//! Exit codes and the failures that carry them.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | a local failure (state directory, cannot start a node, I/O) |
//! | 2 | bad usage or input (arguments, JSON, invite, unknown peer name) |
//! | 3 | denied by the peer (`unknown_verb`, `unauthorized`, `bind_failed`) |
//! | 4 | the peer answered with another error (`bad_args`, `conflict`, ...) |
//! | 5 | no answer in time (`--timeout`, or the peer's `timeout`) |
//! | 6 | the peer could not be reached or the connection was lost |
//! | 7 | the task was canceled (`call --wait`, `tasks watch`) |
//! | 8 | the task waits for an answer (`call --wait` without `--answer`) |
//!
//! A task that ended `failed` is the peer's error (4, or 5 for its
//! `timeout`).

use std::fmt;

use capwire::{CallError, NodeError};

/// The exit codes, as `capwire --help` lists them.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  local failure (state directory, node start, I/O)
  2  bad usage or input (arguments, JSON, invite, unknown peer)
  3  denied by the peer (unknown_verb, unauthorized, bind_failed)
  4  the peer answered another error (bad_args, conflict, not_found, ...)
  5  no answer in time (--timeout, or the peer's own timeout)
  6  the peer could not be reached, or the connection was lost
  7  the task was canceled (call --wait, tasks watch; one that failed is 4)
  8  the task waits for an answer (call --wait without --answer)
  9  the node's audit log was rewritten, rolled back or forked (audit)";

/// A failure of a subcommand: what to print and the exit code, and, when
/// a node's answer (or a call's end) said it, capwire's error code
/// (`unauthorized`, `bad_args`, `timeout`, ...).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) code: u8,
    pub(crate) reason: Option<String>,
}

/// The capwire error code a failure without one stands for.
pub(crate) fn reason_of(code: u8) -> &'static str {
    match code {
        USAGE => "bad_input",
        DENIED => "unauthorized",
        TIMEOUT => "timeout",
        UNREACHABLE => "unreachable",
        CANCELED => "canceled",
        ANSWER_NEEDED => "input_required",
        _ => "failed",
    }
}

pub(crate) const LOCAL: u8 = 1;
pub(crate) const USAGE: u8 = 2;
pub(crate) const DENIED: u8 = 3;
pub(crate) const REMOTE: u8 = 4;
pub(crate) const TIMEOUT: u8 = 5;
pub(crate) const UNREACHABLE: u8 = 6;
pub(crate) const CANCELED: u8 = 7;
pub(crate) const ANSWER_NEEDED: u8 = 8;
pub(crate) const REWRITTEN: u8 = 9;

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code,
            reason: None,
        }
    }

    /// With capwire's error code for it.
    pub(crate) fn because(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Bad usage or input (exit code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }

    /// A local failure (exit code 1).
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self::new(LOCAL, message)
    }

    /// A failed call, with what was being done.
    pub(crate) fn call(doing: &str, e: &CallError) -> Self {
        let code = match e {
            CallError::Denied(_) => DENIED,
            CallError::Timeout | CallError::Cancelled | CallError::Idle => TIMEOUT,
            CallError::PeerLost | CallError::Unreachable(_) | CallError::Shutdown => UNREACHABLE,
            CallError::Encode(_)
            | CallError::InvalidInvite(_)
            | CallError::ReqIdInUse
            | CallError::Unsupported(_) => USAGE,
            _ => REMOTE,
        };
        Self::new(code, format!("{doing}: {e}")).because(error_code(e))
    }

    /// A failure to reach a node.
    pub(crate) fn connect(doing: &str, e: &NodeError) -> Self {
        match e {
            NodeError::Bind(c) => Self::call(doing, c),
            NodeError::Timeout => Self::new(TIMEOUT, format!("{doing}: {e}")).because("timeout"),
            NodeError::Store(_) | NodeError::State(_) | NodeError::Config(_) => {
                Self::failed(format!("{doing}: {e}"))
            }
            _ => Self::new(UNREACHABLE, format!("{doing}: {e}")).because("unreachable"),
        }
    }
}

/// What went wrong with a call, in one word: the peer's error code when it
/// answered one, else the local reason.
pub(crate) fn error_code(e: &CallError) -> String {
    match e {
        CallError::Denied(body) | CallError::Remote(body) => body.code.to_string(),
        CallError::Timeout => "timeout".into(),
        CallError::Cancelled => "cancelled".into(),
        CallError::PeerLost => "peer_lost".into(),
        CallError::Unreachable(_) => "unreachable".into(),
        CallError::VersionUnsatisfied(_) => "version_unsatisfied".into(),
        CallError::TooLarge => "too_large".into(),
        CallError::Overloaded => "overloaded".into(),
        CallError::Encode(_) => "encode".into(),
        CallError::BadResult(_) => "bad_result".into(),
        CallError::Shutdown => "shutdown".into(),
        CallError::Idle => "idle".into(),
        CallError::Unsupported(_) => "unsupported".into(),
        _ => "failed".into(),
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
