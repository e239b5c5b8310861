//! The agent side of ACP over one task verb of one node, acting as the
//! control plane whose state directory it opened:
//!
//! ```text
//! session/new     a session (an id, kept in the book)
//! session/prompt  the prompt's text as the task's args ─► submit
//!                 each task event ─► session/update:
//!                   submitted        tool_call (pending)
//!                   progress         tool_call_update (in_progress)
//!                   question         session/request_permission (a
//!                                    choice) or elicitation/create (when
//!                                    negotiated) ─► core.tasks/respond
//!                   result           tool_call_update (completed), then
//!                                    agent_message_chunk; end_turn
//!                   error            tool_call_update (failed), then
//!                                    agent_message_chunk; end_turn
//! session/cancel  core.tasks/cancel; the prompt answers cancelled
//! session/load    each prompt of the session replayed as a
//!                 user_message_chunk, then its task from its first
//!                 event; one still running is followed on
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SessionNotification, SessionUpdate, StopReason, ToolCall, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields, ToolKind,
};
use serde_json::{Map, Value as Json, json};
use tokio_util::sync::CancellationToken;

use super::book::{Book, Entry, Prompt};
use super::rpc::{Out, RpcError, code};
use super::table::{Gate, Handler};
use crate::ctl::{AbortOnDrop, Backend, CtlCommand, TasksOp};
use crate::exit::{self, Failure};
use crate::mcp::clip;

/// The longest prompt, as the text given to the task (the node's bound
/// on a task's args is 64 KiB by default).
pub(crate) const MAX_PROMPT: usize = 64 * 1024;
/// Sessions open in this face at once; one more `session/new` or
/// `session/load` is answered [`code::BUSY`].
pub(crate) const MAX_SESSIONS: usize = 64;
/// The longest text of one update (a progress body, a question).
const MAX_UPDATE_TEXT: usize = 16 * 1024;
/// How long a cancelled task's end is waited for.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// The verb this face fronts.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The node's name in the book.
    pub(crate) node: String,
    /// Its key.
    pub(crate) node_id: String,
    pub(crate) cap: String,
    pub(crate) verb: String,
}

impl Target {
    fn verb_path(&self) -> String {
        format!("{}/{}", self.cap, self.verb)
    }
}

/// How a prompt becomes the task's args.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// The args key the prompt's text goes under.
    pub(crate) text_field: String,
    /// Args given with every prompt.
    pub(crate) args: Map<String, Json>,
}

struct Session {
    tasks: Vec<String>,
    /// The prompt running (or the task a load follows on), to cancel.
    running: Option<CancellationToken>,
}

#[derive(Default)]
struct State {
    initialized: bool,
    /// What this face advertised: `loadSession`.
    load_session: bool,
    /// What the client advertised: `elicitation.form`.
    elicitation_form: bool,
    sessions: HashMap<String, Session>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The face: one per client.
pub(crate) struct Face {
    pub(crate) backend: Backend,
    pub(crate) target: Target,
    pub(crate) shape: Shape,
    pub(crate) timeout: Duration,
    pub(crate) book: Book,
    pub(crate) out: Arc<Out>,
    state: Mutex<State>,
}

fn decode<T: serde::de::DeserializeOwned>(params: Json) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::new(code::INVALID_PARAMS, e.to_string()))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Json, RpcError> {
    serde_json::to_value(value).map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))
}

/// A fresh session id.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness the id is still unique here: the clock.
    if getrandom::getrandom(&mut bytes).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = t.to_le_bytes();
    }
    format!("capwire-{}", base16ct::lower::encode_string(&bytes))
}

/// A JSON value as text: a string as it is, anything else as JSON.
fn text_of(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The prompt's text: its text blocks, joined by blank lines.
fn prompt_text(blocks: &[ContentBlock]) -> Result<String, RpcError> {
    let mut parts = Vec::new();
    for b in blocks {
        match b {
            ContentBlock::Text(t) => parts.push(t.text.as_str()),
            _ => {
                return Err(RpcError::new(
                    code::INVALID_PARAMS,
                    "this agent takes text only (its promptCapabilities advertise no other kind)",
                ));
            }
        }
    }
    let text = parts.join("\n\n");
    if text.len() > MAX_PROMPT {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!(
                "the prompt is {} bytes; at most {MAX_PROMPT} go to a task",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// A failure of a ctl command as an error answer, with capwire's code.
fn failed(what: &str, f: &Failure) -> RpcError {
    let reason = f
        .reason
        .clone()
        .unwrap_or_else(|| exit::reason_of(f.code).to_owned());
    RpcError::new(code::BUSY, format!("{what}: {}", f.message)).with_data(json!({ "code": reason }))
}

/// How following a task ended.
enum Followed {
    Stop(StopReason),
    /// A question this client cannot be asked: the turn ends, the task
    /// waits.
    Unasked,
}

impl Face {
    pub(crate) fn new(
        backend: Backend,
        target: Target,
        shape: Shape,
        timeout: Duration,
        book: Book,
        out: Arc<Out>,
    ) -> Face {
        Face {
            backend,
            target,
            shape,
            timeout,
            book,
            out,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether `gate` was negotiated: fail-closed, nothing is before
    /// `initialize`.
    pub(crate) fn negotiated(&self, gate: Gate) -> bool {
        let s = lock(&self.state);
        match gate {
            Gate::Baseline => true,
            Gate::AgentLoadSession => s.initialized && s.load_session,
            Gate::ClientElicitationForm => s.initialized && s.elicitation_form,
        }
    }

    /// Handles a request.
    pub(crate) async fn request(
        self: &Arc<Self>,
        handler: Handler,
        params: Json,
    ) -> Result<Json, RpcError> {
        if handler != Handler::Initialize && !lock(&self.state).initialized {
            return Err(RpcError::new(
                code::INVALID_REQUEST,
                "initialize the connection first",
            ));
        }
        match handler {
            Handler::Initialize => self.initialize(decode(params)?),
            // No authentication is advertised: nothing to do.
            Handler::Authenticate => Ok(json!({})),
            Handler::NewSession => self.new_session(decode(params)?),
            Handler::LoadSession => self.load_session(decode(params)?).await,
            Handler::Prompt => self.prompt(decode(params)?).await,
            Handler::Cancel => Err(RpcError::new(
                code::INVALID_REQUEST,
                "session/cancel is a notification",
            )),
        }
    }

    /// Handles a notification (a bad one is dropped: there is no one to
    /// tell).
    pub(crate) fn notification(&self, handler: Handler, params: Json) {
        if handler != Handler::Cancel {
            tracing::debug!(?handler, "a request sent as a notification: dropped");
            return;
        }
        let Ok(cancel) = decode::<CancelNotification>(params) else {
            tracing::debug!("session/cancel with bad params: dropped");
            return;
        };
        let s = lock(&self.state);
        if let Some(running) = s
            .sessions
            .get(cancel.session_id.0.as_ref())
            .and_then(|s| s.running.as_ref())
        {
            running.cancel();
        }
    }

    fn initialize(&self, req: InitializeRequest) -> Result<Json, RpcError> {
        let elicitation_form = req
            .client_capabilities
            .elicitation
            .as_ref()
            .is_some_and(|e| e.form.is_some());
        {
            let mut s = lock(&self.state);
            s.initialized = true;
            // A task's events are kept at the node with the task: every
            // session of a task verb can be loaded again.
            s.load_session = true;
            s.elicitation_form = elicitation_form;
        }
        let answer = InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(AgentCapabilities::new().load_session(true))
            .agent_info(Implementation::new("capwire", env!("CARGO_PKG_VERSION")));
        encode(&answer)
    }

    fn open(&self, id: &str, tasks: Vec<String>) -> Result<(), RpcError> {
        let mut s = lock(&self.state);
        if !s.sessions.contains_key(id) && s.sessions.len() >= MAX_SESSIONS {
            return Err(RpcError::new(
                code::BUSY,
                format!("{MAX_SESSIONS} sessions are open in this agent already"),
            ));
        }
        s.sessions.entry(id.to_owned()).or_insert(Session {
            tasks,
            running: None,
        });
        Ok(())
    }

    fn keep(&self, id: &str) {
        let tasks = match lock(&self.state).sessions.get(id) {
            Some(s) => s.tasks.clone(),
            None => return,
        };
        let entry = Entry {
            node: self.target.node_id.clone(),
            verb: self.target.verb_path(),
            tasks,
            used_ms: 0,
        };
        if let Err(e) = self.book.put(id, entry) {
            tracing::warn!("the session {id} is not kept for session/load: {e}");
        }
    }

    fn new_session(&self, _req: NewSessionRequest) -> Result<Json, RpcError> {
        let id = session_id();
        self.open(&id, Vec::new())?;
        self.keep(&id);
        encode(&NewSessionResponse::new(id))
    }

    /// Marks session `id` as running `token`; refused when it runs
    /// something already.
    fn start(&self, id: &str, token: &CancellationToken) -> Result<(), RpcError> {
        let mut s = lock(&self.state);
        let Some(session) = s.sessions.get_mut(id) else {
            return Err(RpcError::new(
                code::NOT_FOUND,
                format!("there is no session {id:?} in this agent"),
            ));
        };
        if session.running.is_some() {
            return Err(RpcError::new(
                code::BUSY,
                "a prompt is running in this session; cancel it first",
            ));
        }
        session.running = Some(token.clone());
        Ok(())
    }

    fn stop(&self, id: &str) {
        if let Some(s) = lock(&self.state).sessions.get_mut(id) {
            s.running = None;
        }
    }

    async fn prompt(self: &Arc<Self>, req: PromptRequest) -> Result<Json, RpcError> {
        let id = req.session_id.0.to_string();
        let text = prompt_text(&req.prompt)?;
        let token = CancellationToken::new();
        self.start(&id, &token)?;
        let answer = self.run_prompt(&id, text, &token).await;
        self.stop(&id);
        let stop = answer?;
        encode(&PromptResponse::new(stop))
    }

    async fn run_prompt(
        self: &Arc<Self>,
        id: &str,
        text: String,
        token: &CancellationToken,
    ) -> Result<StopReason, RpcError> {
        let mut args = self.shape.args.clone();
        args.insert(self.shape.text_field.clone(), Json::String(text));
        let args = Json::Object(args);
        let task = tokio::select! {
            task = self.submit(&args) => task?,
            () = token.cancelled() => return Ok(StopReason::Cancelled),
        };
        if let Some(s) = lock(&self.state).sessions.get_mut(id) {
            s.tasks.push(task.clone());
        }
        self.keep(id);
        let asked = Prompt {
            task: task.clone(),
            text_field: self.shape.text_field.clone(),
            args: args.clone(),
        };
        if let Err(e) = self.book.put_prompt(id, asked) {
            tracing::warn!("the prompt of task {task} is not kept for session/load: {e}");
        }
        self.announce(id, &task, Some(args)).await;
        Ok(match self.follow(id, &task, token, None).await {
            Followed::Stop(stop) => stop,
            Followed::Unasked => StopReason::EndTurn,
        })
    }

    /// Submits the task; its id.
    async fn submit(&self, args: &Json) -> Result<String, RpcError> {
        let command = CtlCommand::Call {
            target: vec![
                self.target.node_id.clone(),
                self.target.cap.clone(),
                self.target.verb.clone(),
            ],
            peer: None,
            args: Some(args.to_string()),
            notify: false,
            stream: false,
            wait: false,
            answer: None,
            req_id: None,
            token: None,
            trace: false,
            parent: None,
        };
        let what = format!("{} on {}", self.target.verb_path(), self.target.node);
        let records = crate::mcp::run_one(&self.backend, command, self.timeout)
            .await
            .map_err(|f| failed(&what, &f))?;
        records
            .iter()
            .find(|r| r["kind"] == "submitted")
            .and_then(|r| r["task"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| RpcError::new(code::INTERNAL, format!("{what}: no task was made")))
    }

    /// The task as a tool call of the session, pending (its args, when
    /// known).
    async fn announce(&self, id: &str, task: &str, args: Option<Json>) {
        let call = ToolCall::new(
            task.to_owned(),
            format!("{} on {}", self.target.verb_path(), self.target.node),
        )
        .kind(ToolKind::Other)
        .status(ToolCallStatus::Pending)
        .raw_input(args);
        self.update(id, SessionUpdate::ToolCall(call)).await;
    }

    async fn update(&self, id: &str, update: SessionUpdate) {
        let note = SessionNotification::new(id.to_owned(), update);
        match serde_json::to_value(&note) {
            Ok(params) => self.out.notify("session/update", params).await,
            Err(e) => tracing::warn!("an update was not made: {e}"),
        }
    }

    async fn tool_update(&self, id: &str, task: &str, fields: ToolCallUpdateFields) {
        self.update(
            id,
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(task.to_owned(), fields)),
        )
        .await;
    }

    async fn say(&self, id: &str, text: String) {
        let chunk = ContentChunk::new(ContentBlock::from(text));
        self.update(id, SessionUpdate::AgentMessageChunk(chunk))
            .await;
    }

    /// Replays what the user asked for `task` (when it was kept), then
    /// the task as a tool call with its args.
    async fn replay_prompt(&self, id: &str, task: &str, prompts: &[Prompt]) {
        let asked = prompts.iter().find(|p| p.task == task);
        if let Some(text) = asked.and_then(Prompt::text) {
            let chunk = ContentChunk::new(ContentBlock::from(text.to_owned()));
            self.update(id, SessionUpdate::UserMessageChunk(chunk))
                .await;
        }
        self.announce(id, task, asked.map(|p| p.args.clone())).await;
    }

    /// Follows `task` from its first event until it ends, the turn is
    /// cancelled (`token`: the task is cancelled at the node), or a
    /// question cannot be asked. `caught_up`: told once the events up to
    /// the given seq were sent.
    async fn follow(
        &self,
        id: &str,
        task: &str,
        token: &CancellationToken,
        mut caught_up: Option<(u64, tokio::sync::oneshot::Sender<()>)>,
    ) -> Followed {
        let command = CtlCommand::Tasks {
            node: Some(self.target.node_id.clone()),
            peer: None,
            op: TasksOp::Watch {
                id: task.to_owned(),
                from: Some(1),
            },
        };
        let (mut records, done) = self.backend.start(command, self.timeout);
        let mut done = AbortOnDrop(done);
        let mut cancelled = false;
        loop {
            let record = tokio::select! {
                r = records.recv() => r,
                () = token.cancelled(), if !cancelled => {
                    cancelled = true;
                    self.cancel_task(task).await;
                    continue;
                }
            };
            let Some(record) = record else { break };
            let seq = record["seq"].as_u64().unwrap_or(0);
            match record["kind"].as_str() {
                Some("event") => self.event(id, task, &record).await,
                Some("waiting") if !cancelled => {
                    let question = record["question"].clone();
                    let question_seq = record["question_seq"].as_u64();
                    let answer = tokio::select! {
                        a = self.ask(id, task, &question) => a,
                        () = token.cancelled() => Asked::Cancelled,
                    };
                    match answer {
                        Asked::Answer(answer) => {
                            self.respond(id, task, question_seq, &answer).await;
                        }
                        Asked::Cancelled => {
                            if !cancelled {
                                cancelled = true;
                                self.cancel_task(task).await;
                            }
                        }
                        Asked::Cannot => {
                            self.say(
                                id,
                                format!(
                                    "The task waits for an answer to: {}\nThis client cannot be \
                                     asked it here; answer with `capwire ctl tasks {} respond {task} \
                                     JSON`, then load this session again.",
                                    clip(text_of(&question), MAX_UPDATE_TEXT),
                                    self.target.node
                                ),
                            )
                            .await;
                            return Followed::Unasked;
                        }
                    }
                }
                _ => {}
            }
            if let Some((until, _)) = &caught_up
                && seq >= *until
                && let Some((_, tx)) = caught_up.take()
            {
                let _ = tx.send(());
            }
        }
        let ended = if cancelled {
            match tokio::time::timeout(CANCEL_WAIT, &mut done.0).await {
                Ok(Ok(r)) => r,
                _ => return Followed::Stop(StopReason::Cancelled),
            }
        } else {
            match (&mut done.0).await {
                Ok(r) => r,
                Err(e) => Err(Failure::failed(format!("following the task failed: {e}"))),
            }
        };
        match ended {
            Ok(()) => Followed::Stop(StopReason::EndTurn),
            Err(f) if f.code == exit::CANCELED || cancelled => {
                Followed::Stop(StopReason::Cancelled)
            }
            // The task failed: its error was sent as an update.
            Err(f) if f.code == exit::REMOTE => Followed::Stop(StopReason::EndTurn),
            Err(f) => {
                self.say(id, format!("Following task {task} stopped: {}", f.message))
                    .await;
                Followed::Stop(StopReason::EndTurn)
            }
        }
    }

    /// One task event as updates.
    async fn event(&self, id: &str, task: &str, record: &Json) {
        let body = &record["body"];
        let content = |label: &str| {
            let text = if body.is_null() {
                label.to_owned()
            } else if label.is_empty() {
                clip(text_of(body), MAX_UPDATE_TEXT)
            } else {
                format!("{label}: {}", clip(text_of(body), MAX_UPDATE_TEXT))
            };
            vec![ContentBlock::from(text).into()]
        };
        match record["event"].as_str() {
            Some("progress") => {
                let fields = ToolCallUpdateFields::new()
                    .status(ToolCallStatus::InProgress)
                    .content(content(""));
                self.tool_update(id, task, fields).await;
            }
            Some("question") => {
                let fields = ToolCallUpdateFields::new().content(content("question"));
                self.tool_update(id, task, fields).await;
            }
            Some("answer") => {
                let fields = ToolCallUpdateFields::new()
                    .status(ToolCallStatus::InProgress)
                    .content(content("answer"));
                self.tool_update(id, task, fields).await;
            }
            Some("result") => {
                let fields = ToolCallUpdateFields::new()
                    .status(ToolCallStatus::Completed)
                    .raw_output(body.clone());
                self.tool_update(id, task, fields).await;
                self.say(id, text_of(body)).await;
            }
            Some("error") => {
                let fields = ToolCallUpdateFields::new()
                    .status(ToolCallStatus::Failed)
                    .raw_output(body.clone());
                self.tool_update(id, task, fields).await;
                let state = record["state"].as_str().unwrap_or("failed");
                self.say(
                    id,
                    format!(
                        "The task {state}: {}: {}",
                        body["code"].as_str().unwrap_or("error"),
                        body["message"].as_str().unwrap_or_default()
                    ),
                )
                .await;
            }
            _ => {}
        }
    }

    /// Asks the client the task's question: a choice through
    /// `session/request_permission`, anything else through
    /// `elicitation/create` when the client advertised forms.
    async fn ask(&self, id: &str, task: &str, question: &Json) -> Asked {
        if let Some((prompt, choices)) = choices_of(question) {
            let options: Vec<PermissionOption> = choices
                .iter()
                .enumerate()
                .map(|(i, (name, _, kind))| {
                    PermissionOption::new(i.to_string(), name.clone(), *kind)
                })
                .collect();
            let fields = ToolCallUpdateFields::new()
                .title(clip(prompt, MAX_UPDATE_TEXT))
                .status(ToolCallStatus::Pending);
            let request = RequestPermissionRequest::new(
                id.to_owned(),
                ToolCallUpdate::new(task.to_owned(), fields),
                options,
            );
            let Ok(params) = serde_json::to_value(&request) else {
                return Asked::Cannot;
            };
            return match self.out.request("session/request_permission", params).await {
                Ok(answer) => match serde_json::from_value::<RequestPermissionResponse>(answer) {
                    Ok(r) => match r.outcome {
                        RequestPermissionOutcome::Selected(s) => s
                            .option_id
                            .0
                            .parse::<usize>()
                            .ok()
                            .and_then(|i| choices.get(i))
                            .map_or(Asked::Cancelled, |(_, v, _)| Asked::Answer(v.clone())),
                        _ => Asked::Cancelled,
                    },
                    Err(_) => Asked::Cancelled,
                },
                Err(e) => {
                    tracing::warn!("session/request_permission failed: {}", e.message);
                    Asked::Cancelled
                }
            };
        }
        if !self.negotiated(Gate::ClientElicitationForm) {
            return Asked::Cannot;
        }
        let params = json!({
            "sessionId": id,
            "toolCallId": task,
            "mode": "form",
            "message": clip(text_of(question), MAX_UPDATE_TEXT),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "title": "Answer",
                        "description": "the answer, as JSON (text that is not JSON is sent as a string)",
                    },
                },
                "required": ["answer"],
            },
        });
        match self.out.request("elicitation/create", params).await {
            Ok(answer) if answer["action"] == "accept" => {
                let text = answer["content"]["answer"].as_str().unwrap_or_default();
                let value =
                    serde_json::from_str(text).unwrap_or_else(|_| Json::String(text.to_owned()));
                Asked::Answer(value)
            }
            Ok(_) => Asked::Cancelled,
            Err(e) => {
                tracing::warn!("elicitation/create failed: {}", e.message);
                Asked::Cannot
            }
        }
    }

    async fn respond(&self, id: &str, task: &str, question_seq: Option<u64>, answer: &Json) {
        let command = CtlCommand::Tasks {
            node: Some(self.target.node_id.clone()),
            peer: None,
            op: TasksOp::Respond {
                id: task.to_owned(),
                answer: answer.to_string(),
                question_seq,
            },
        };
        if let Err(f) = crate::mcp::run_one(&self.backend, command, self.timeout).await {
            self.say(id, format!("The answer was not taken: {}", f.message))
                .await;
        }
    }

    async fn cancel_task(&self, task: &str) {
        let command = CtlCommand::Tasks {
            node: Some(self.target.node_id.clone()),
            peer: None,
            op: TasksOp::Cancel {
                id: task.to_owned(),
            },
        };
        if let Err(f) = crate::mcp::run_one(&self.backend, command, self.timeout).await {
            tracing::warn!("cancelling task {task} failed: {}", f.message);
        }
    }

    async fn load_session(self: &Arc<Self>, req: LoadSessionRequest) -> Result<Json, RpcError> {
        let id = req.session_id.0.to_string();
        let known = lock(&self.state).sessions.get(&id).map(|s| s.tasks.clone());
        let tasks = match known {
            Some(tasks) => tasks,
            None => {
                let Some(entry) = self.book.get(&id) else {
                    return Err(RpcError::new(
                        code::NOT_FOUND,
                        format!("there is no session {id:?} to load"),
                    ));
                };
                if entry.node != self.target.node_id || entry.verb != self.target.verb_path() {
                    return Err(RpcError::new(
                        code::NOT_FOUND,
                        format!(
                            "session {id:?} is of {} on another node, not of this agent's verb",
                            entry.verb
                        ),
                    ));
                }
                entry.tasks
            }
        };
        self.open(&id, tasks.clone())?;
        let token = CancellationToken::new();
        self.start(&id, &token)?;
        let Some((last, before)) = tasks.split_last() else {
            self.stop(&id);
            return encode(&LoadSessionResponse::new());
        };
        let prompts = self.book.prompts(&id);
        // Ended tasks: replayed whole.
        for task in before {
            let done = CancellationToken::new();
            self.replay_prompt(&id, task, &prompts).await;
            let _ = self.follow(&id, task, &done, None).await;
        }
        self.replay_prompt(&id, last, &prompts).await;
        // The last: replayed up to where it is now, then followed on
        // while the load is answered.
        let seq = match self.info(last).await {
            Some(info) if !info.1 => info.0,
            _ => {
                let _ = self.follow(&id, last, &token, None).await;
                self.stop(&id);
                return encode(&LoadSessionResponse::new());
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let face = Arc::clone(self);
        let (sid, task) = (id.clone(), last.clone());
        tokio::spawn(async move {
            let _ = face.follow(&sid, &task, &token, Some((seq, tx))).await;
            face.stop(&sid);
        });
        let _ = rx.await;
        encode(&LoadSessionResponse::new())
    }

    /// The task's last seq and whether it ended.
    async fn info(&self, task: &str) -> Option<(u64, bool)> {
        let command = CtlCommand::Tasks {
            node: Some(self.target.node_id.clone()),
            peer: None,
            op: TasksOp::Get {
                id: task.to_owned(),
            },
        };
        let records = crate::mcp::run_one(&self.backend, command, self.timeout)
            .await
            .ok()?;
        let info = records.into_iter().find(|r| r["kind"] == "task")?["value"].take();
        let state = info["state"].as_str().unwrap_or_default();
        let ended = matches!(state, "completed" | "failed" | "canceled" | "rejected");
        Some((info["seq"].as_u64()?, ended))
    }
}

/// What asking the client gave.
enum Asked {
    Answer(Json),
    /// The client cancelled (or answered nothing that counts).
    Cancelled,
    /// The question is not one this client can be asked.
    Cannot,
}

/// A question whose answer is a choice: its prompt and choices (name,
/// answer, kind). A text question is yes or no (answered `true` or
/// `false`, as `app.agent/work` asks); an object with `choices` (text,
/// numbers or booleans) offers those.
/// A choice offered: its name, the answer it sends, its kind.
type Choice = (String, Json, PermissionOptionKind);

fn choices_of(question: &Json) -> Option<(String, Vec<Choice>)> {
    match question {
        Json::String(text) => Some((
            text.clone(),
            vec![
                (
                    "Yes".into(),
                    Json::Bool(true),
                    PermissionOptionKind::AllowOnce,
                ),
                (
                    "No".into(),
                    Json::Bool(false),
                    PermissionOptionKind::RejectOnce,
                ),
            ],
        )),
        Json::Object(m) => {
            let choices = m.get("choices")?.as_array()?;
            if choices.is_empty() || choices.len() > 32 {
                return None;
            }
            let mut out = Vec::new();
            for c in choices {
                let name = match c {
                    Json::String(s) => s.clone(),
                    Json::Number(_) | Json::Bool(_) => c.to_string(),
                    _ => return None,
                };
                out.push((name, c.clone(), PermissionOptionKind::AllowOnce));
            }
            let prompt = m
                .get("question")
                .or_else(|| m.get("text"))
                .map_or_else(|| "Choose one".to_owned(), text_of);
            Some((prompt, out))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_choice_questions_are_choices_and_others_are_not() {
        let (_, yes_no) = choices_of(&json!("go on?")).unwrap();
        assert_eq!(yes_no.len(), 2);
        assert_eq!(yes_no[0].1, json!(true));
        let (prompt, picks) =
            choices_of(&json!({"question": "which?", "choices": ["a", 2, true]})).unwrap();
        assert_eq!(prompt, "which?");
        assert_eq!(
            picks.iter().map(|c| c.1.clone()).collect::<Vec<_>>(),
            vec![json!("a"), json!(2), json!(true)]
        );
        assert!(choices_of(&json!({"free": "text"})).is_none());
        assert!(choices_of(&json!({"choices": []})).is_none());
        assert!(choices_of(&json!({"choices": [{}]})).is_none());
        assert!(choices_of(&json!(7)).is_none());
    }

    #[test]
    fn prompts_are_text_and_bounded() {
        let ok = prompt_text(&[ContentBlock::from("a"), ContentBlock::from("b")]).unwrap();
        assert_eq!(ok, "a\n\nb");
        let big = "x".repeat(MAX_PROMPT + 1);
        let e = prompt_text(&[ContentBlock::from(big)]).unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
    }
}
