//! `ctl call --wait` and `ctl tasks ...`: a node's tasks through
//! `core.tasks`, with the library's [`TaskHandle`] where it has the call
//! (get, events, respond, cancel) and the typed `core.tasks/list`.
//!
//! Records: `submitted` (a task verb's answer), `event` (one event of a
//! task: its `seq`, `at_ms`, `state`, `event` kind and `body`), `waiting`
//! (the task waits on the question just printed), `ended` (the task had
//! ended before the events asked for), `task` (one task's info) and
//! `tasks` (a page of a list).

use std::time::Duration;

use capwire::envelope::{ErrorBody, ErrorCode, RawValue};
use capwire::json::cbor_to_json;
use capwire::manifest::{
    ListTasksArgs, TaskEvent, TaskEventKind, TaskInfo, TaskState, TaskSubmitted, TasksList,
};
use capwire::{CallError, Peer, TaskHandle};
use serde_json::{Value as Json, json};

use super::TasksOp;
use super::exec::{Ctx, Out, Way, emit};
use super::task_args::{OnQuestion, answer_of, verb_filter};
use crate::exit::{ANSWER_NEEDED, CANCELED, Failure, REMOTE, TIMEOUT};

fn json_of(raw: &RawValue) -> Json {
    cbor_to_json(raw).unwrap_or(Json::Null)
}

fn error_json(e: &ErrorBody) -> Json {
    let mut error = json!({"code": e.code.as_str(), "message": e.message});
    if let Some(detail) = &e.detail {
        error["detail"] = json_of(detail);
    }
    error
}

fn kind_str(kind: TaskEventKind) -> &'static str {
    match kind {
        TaskEventKind::State => "state",
        TaskEventKind::Progress => "progress",
        TaskEventKind::Question => "question",
        TaskEventKind::Answer => "answer",
        TaskEventKind::Result => "result",
        TaskEventKind::Error => "error",
    }
}

/// A task's info as JSON (the bodies as the CLI's JSON forms).
pub(super) fn info_json(info: &TaskInfo) -> Json {
    json!({
        "task": info.task, "cap": info.cap, "verb": info.verb,
        "state": info.state.as_str(), "created_ms": info.created_ms,
        "updated_ms": info.updated_ms, "seq": info.seq, "first_seq": info.first_seq,
        "progress": json_of(&info.progress), "question": json_of(&info.question),
        "question_seq": info.question_seq, "result": json_of(&info.result),
        "error": info.error.as_ref().map(error_json),
    })
}

fn event_json(peer: &str, via: &str, task: &str, e: &TaskEvent) -> Json {
    json!({
        "kind": "event", "peer": peer, "via": via, "task": task, "seq": e.seq, "at_ms": e.at_ms,
        "state": e.state.as_str(), "event": kind_str(e.kind), "body": json_of(&e.body),
    })
}

/// What a task that ended in `state` with `error` exits with.
fn outcome(task: &str, state: TaskState, error: Option<ErrorBody>) -> Result<(), Failure> {
    let error = error.unwrap_or_else(|| ErrorBody::new(ErrorCode::Internal, "no error given"));
    match state {
        TaskState::Completed => Ok(()),
        TaskState::Canceled => Err(Failure::new(
            CANCELED,
            format!("task {task} was canceled: {}", error.message),
        )
        .because("canceled")),
        _ => {
            let code = if error.code == ErrorCode::Timeout {
                TIMEOUT
            } else {
                REMOTE
            };
            Err(Failure::new(
                code,
                format!("task {task} {state}: {}: {}", error.code, error.message),
            )
            .because(error.code.as_str()))
        }
    }
}

impl Ctx {
    /// `--timeout` around one `core.tasks` call, told to the watches.
    async fn task_call<T>(
        &self,
        peer: &Peer,
        name: &str,
        verb: &str,
        timeout: Duration,
        call: impl std::future::Future<Output = Result<T, CallError>>,
    ) -> Result<T, Failure> {
        let reply = tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(CallError::Timeout));
        self.note(
            peer,
            name,
            "core.tasks",
            verb,
            Way::Request,
            reply.as_ref().err(),
        );
        reply.map_err(|e| Failure::call(&format!("{name} core.tasks/{verb}"), &e))
    }

    /// Reports a task verb's answer; its id.
    pub(super) async fn submitted(
        &self,
        name: &str,
        via: &str,
        cap: &str,
        verb: &str,
        reply: &RawValue,
        out: &Out,
    ) -> Result<String, Failure> {
        let submitted: TaskSubmitted = reply.decode().map_err(|e| {
            Failure::failed(format!("{name} {cap}/{verb}: not a task's answer: {e}"))
        })?;
        emit(
            out,
            json!({
                "kind": "submitted", "peer": name, "via": via, "cap": cap, "verb": verb,
                "task": submitted.task, "state": submitted.state.as_str(),
            }),
        )
        .await?;
        Ok(submitted.task)
    }

    /// Prints task `id`'s events from `from` on as they happen, until it
    /// ends; the exit code says how it ended.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn follow(
        &self,
        peer: &Peer,
        name: &str,
        via: &str,
        id: &str,
        from: u64,
        mut on_question: OnQuestion,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let task: TaskHandle<RawValue> = peer.task(id);
        let mut events = self
            .task_call(peer, name, "subscribe", timeout, task.events(from))
            .await?;
        let doing = format!("{name} core.tasks/subscribe");
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| Failure::call(&doing, &e))?;
            emit(out, event_json(name, via, id, &event)).await?;
            if event.state.is_final() {
                let error = match event.kind {
                    TaskEventKind::Error => event.body.decode::<ErrorBody>().ok(),
                    _ => None,
                };
                return outcome(id, event.state, error);
            }
            if event.kind != TaskEventKind::Question {
                continue;
            }
            // An old question (events read from the start) may have been
            // answered already: only the one it waits on now counts.
            let info = self
                .task_call(peer, name, "get", timeout, task.get())
                .await?;
            if info.question_seq != Some(event.seq) {
                continue;
            }
            match std::mem::replace(&mut on_question, OnQuestion::Stop) {
                OnQuestion::Answer(answer) => {
                    self.task_call(
                        peer,
                        name,
                        "respond",
                        timeout,
                        task.respond_to(Some(event.seq), &answer),
                    )
                    .await?;
                }
                OnQuestion::Stop => {
                    return Err(Failure::new(
                        ANSWER_NEEDED,
                        format!(
                            "task {id} waits for an answer to its question (event {}): answer \
                             it with `capwire ctl tasks {via} respond {id} JSON`, then follow \
                             it with `capwire ctl tasks {via} watch {id} --from {}`",
                            event.seq,
                            event.seq + 1
                        ),
                    )
                    .because("input_required"));
                }
                OnQuestion::Show => {
                    on_question = OnQuestion::Show;
                    emit(
                        out,
                        json!({
                            "kind": "waiting", "peer": name, "via": via, "task": id,
                            "question_seq": event.seq, "question": json_of(&event.body),
                        }),
                    )
                    .await?;
                }
            }
        }
        // Ended with no final event: the task had ended before `from`.
        let info = self
            .task_call(peer, name, "get", timeout, task.get())
            .await?;
        if !info.state.is_final() {
            return Err(Failure::new(
                crate::exit::UNREACHABLE,
                format!("{doing}: the events ended before the task did"),
            ));
        }
        emit(
            out,
            json!({
                "kind": "ended", "peer": name, "via": via, "task": id, "state": info.state.as_str(),
                "seq": info.seq, "from": from,
            }),
        )
        .await?;
        outcome(id, info.state, info.error)
    }

    /// `ctl tasks PEER ...`.
    pub(super) async fn tasks(
        &self,
        peer: &Peer,
        name: &str,
        via: &str,
        op: TasksOp,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let handle = |id: &str| -> TaskHandle<RawValue> { peer.task(id) };
        let info = |value: TaskInfo| json!({"kind": "task", "peer": name, "via": via, "value": info_json(&value)});
        match op {
            TasksOp::List {
                state,
                verb,
                limit,
                before,
            } => {
                let (cap, verb) = verb_filter(verb.as_deref())?;
                let args = ListTasksArgs {
                    state,
                    cap,
                    verb,
                    before,
                    limit,
                };
                let page = self
                    .task_call(
                        peer,
                        name,
                        "list",
                        timeout,
                        peer.request_within(TasksList, args, timeout),
                    )
                    .await?;
                let tasks: Vec<Json> = page.tasks.iter().map(info_json).collect();
                emit(
                    out,
                    json!({"kind": "tasks", "peer": name, "via": via, "tasks": tasks, "next": page.next}),
                )
                .await
            }
            TasksOp::Get { id } => {
                let value = self
                    .task_call(peer, name, "get", timeout, handle(&id).get())
                    .await?;
                emit(out, info(value)).await
            }
            TasksOp::Cancel { id } => {
                let value = self
                    .task_call(peer, name, "cancel", timeout, handle(&id).cancel())
                    .await?;
                emit(out, info(value)).await
            }
            TasksOp::Respond {
                id,
                answer,
                question_seq,
            } => {
                let answer = answer_of(&answer, "the answer")?;
                let value = self
                    .task_call(
                        peer,
                        name,
                        "respond",
                        timeout,
                        handle(&id).respond_to(question_seq, &answer),
                    )
                    .await?;
                emit(out, info(value)).await
            }
            TasksOp::Watch { id, from } => {
                self.follow(
                    peer,
                    name,
                    via,
                    &id,
                    from.unwrap_or(1),
                    OnQuestion::Show,
                    timeout,
                    out,
                )
                .await
            }
        }
    }
}
