//! What `ctl tasks` and `ctl call --wait` are given, checked before
//! anything is sent: task ids, answers, `--verb` filters, and how a
//! question is met.

use capwire::envelope::RawValue;
use serde_json::Value as Json;

use super::TasksOp;
use crate::exit::{Failure, USAGE};

/// Refuses, before anything is sent, an id that is not a task id.
pub(super) fn check_id(id: &str) -> Result<(), Failure> {
    let ok = id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "{id:?} is not a task id (32 lowercase hexadecimal digits, as `call` and `tasks \
             list` print it)"
        )))
    }
}

/// JSON text as CBOR, for an answer; bad input is a usage error.
pub(super) fn answer_of(text: &str, what: &str) -> Result<RawValue, Failure> {
    let json: Json = serde_json::from_str(text)
        .map_err(|e| Failure::usage(format!("{what} is not JSON: {e}")))?;
    capwire::json::json_to_cbor(&json).map_err(|e| Failure::usage(format!("bad {what}: {e}")))
}

/// How `follow` treats a question the task waits on.
pub(super) enum OnQuestion {
    /// Answer it with this (then treat a later one as `Stop`).
    Answer(RawValue),
    /// End the command, saying how to answer it (`call --wait`).
    Stop,
    /// Say that it waits and go on watching (`tasks watch`).
    Show,
}

/// `--verb CAP/VERB` or `--verb CAP` as the filters of `list`.
pub(super) fn verb_filter(verb: Option<&str>) -> Result<(Option<String>, Option<String>), Failure> {
    let Some(v) = verb else {
        return Ok((None, None));
    };
    match v.split_once('/') {
        Some((c, v)) if !c.is_empty() && !v.is_empty() && !v.contains('/') => {
            Ok((Some(c.to_owned()), Some(v.to_owned())))
        }
        None if !v.is_empty() => Ok((Some(v.to_owned()), None)),
        _ => Err(Failure::new(
            USAGE,
            format!("--verb {v:?}: give CAP/VERB (e.g. app.agent/work) or CAP"),
        )),
    }
}

/// Checks what `ctl tasks` was given before anything is sent.
pub(super) fn check(op: &TasksOp) -> Result<(), Failure> {
    match op {
        TasksOp::List { before, verb, .. } => {
            verb_filter(verb.as_deref())?;
            before.as_deref().map_or(Ok(()), check_id)
        }
        TasksOp::Get { id } | TasksOp::Cancel { id } | TasksOp::Watch { id, .. } => check_id(id),
        TasksOp::Respond { id, answer, .. } => {
            check_id(id)?;
            answer_of(answer, "the answer").map(drop)
        }
    }
}
