//! The MCP server itself: lists the catalog's tools and turns a tool call
//! into the `ctl call` it stands for, run by the control plane's node, so
//! that the node's chokepoint decides it as it decides any call of the
//! control plane.
//!
//! ```text
//! tools/call NAME {args}
//!   unknown NAME ─────────────► protocol error -32602 (a controller verb
//!                               left out says so; nothing is sent)
//!   args not as the tool takes them, too many calls at once
//!                      ───────► tool error, nothing sent
//!   request       ─► ctl call ─► {result} | tool error {code, message}
//!   notification  ─► ctl call --notify ─► {sent: true}
//!   stream        ─► ctl call --stream: each item a progress
//!                    notification, then {items, count, truncated}
//!   task          ─► ctl call --wait: each event a progress
//!                    notification, then {task, result}; a question the
//!                    task waits on is a tool error `input_required` that
//!                    says how to answer it
//! ```
//!
//! The list changes (`notifications/tools/list_changed`, or a
//! `subscriptions/listen` event on a 2026-07-28 connection) when the
//! catalog does.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::{Map, Value as Json, json};
use tokio::sync::{Semaphore, watch};

use super::catalog::{Catalog, Kind, ToolDef};
use crate::ctl::{AbortOnDrop, Backend, CtlCommand};
use crate::exit::{self, Failure};

/// Tool calls running at once; one more is refused `overloaded`.
pub(crate) const MAX_CALLS: usize = 64;
/// Items of a stream kept for the tool's result; the rest are counted
/// (and reported as progress) only.
pub(crate) const MAX_ITEMS: usize = 1_000;
/// Bytes of JSON of a stream's items kept for the tool's result.
pub(crate) const MAX_ITEM_BYTES: usize = 1024 * 1024;
/// The longest progress message (an item or a task's event, as JSON).
const MAX_MESSAGE: usize = 1024;
/// How long the answer of a call that reported progress waits after its
/// last progress notification.
const PROGRESS_LEAD: Duration = Duration::from_millis(3);
/// How often a client told of list changes is looked at, to let go of
/// one that is gone.
const PEER_CHECK: Duration = Duration::from_secs(5);

/// The catalog and its tools as MCP lists them, made once for each
/// change of the catalog rather than for each list or call.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) catalog: Catalog,
    /// `catalog.tools`, in the same order.
    tools: Vec<Tool>,
}

impl Listing {
    pub(crate) fn new(catalog: Catalog) -> Listing {
        let tools = catalog.tools.iter().map(tool_of).collect();
        Listing { catalog, tools }
    }

    fn tool(&self, name: &str) -> Option<&Tool> {
        self.catalog.position(name).map(|i| &self.tools[i])
    }
}

/// One MCP server, for one client (stdio) or one session (HTTP); every
/// clone shares the control plane and the catalog.
#[derive(Clone)]
pub(crate) struct Face {
    pub(crate) backend: Backend,
    pub(crate) timeout: Duration,
    pub(crate) listing: watch::Receiver<Arc<Listing>>,
    pub(crate) calls: Arc<Semaphore>,
}

impl Face {
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let listing = self.listing.borrow().clone();
        let catalog = &listing.catalog;
        let Some(tool) = catalog.get(&request.name) else {
            let message = match catalog.hidden(&request.name) {
                Some(what) => format!(
                    "{} is {what}, a controller verb: capwire mcp offers controller verbs only \
                     with --allow-controller",
                    request.name
                ),
                None => format!("there is no tool {:?}", request.name),
            };
            return Err(McpError::new(ErrorCode::INVALID_PARAMS, message, None));
        };
        let args = match tool.args(request.arguments) {
            Ok(args) => args,
            Err(message) => return Ok(tool_error("bad_args", &message)),
        };
        let Ok(_permit) = self.calls.try_acquire() else {
            return Ok(tool_error(
                "overloaded",
                &format!("{MAX_CALLS} tool calls are running already; try again"),
            ));
        };
        let progress = context.meta.get_progress_token().map(|token| Progress {
            token,
            context: &context,
            n: 0,
        });
        let command = CtlCommand::Call {
            target: vec![tool.node_id.clone(), tool.cap.clone(), tool.verb.clone()],
            peer: None,
            args: Some(args.to_string()),
            notify: tool.kind == Kind::Notification,
            stream: tool.kind == Kind::Stream,
            wait: tool.kind == Kind::Task,
            answer: None,
            req_id: None,
            token: None,
            // The client's trace continues into the cluster; a call
            // without one starts a new trace.
            trace: true,
            parent: traceparent_of(&context.meta),
        };
        tokio::select! {
            result = self.run(tool, command, progress) => Ok(result),
            // Dropping the run cancels what it was doing (a stream, at the
            // node; a task goes on there).
            () = context.ct.cancelled() => Ok(tool_error("cancelled", "the client cancelled the call")),
        }
    }

    /// Runs the call and makes the tool's result of its records.
    async fn run(
        &self,
        tool: &ToolDef,
        command: CtlCommand,
        mut progress: Option<Progress<'_>>,
    ) -> CallToolResult {
        let (mut records, done) = self.backend.start(command, self.timeout);
        let mut done = AbortOnDrop(done);
        let mut outcome = Outcome::default();
        while let Some(record) = records.recv().await {
            outcome.take(tool, &record, progress.as_mut()).await;
        }
        let ended = match (&mut done.0).await {
            Ok(ended) => ended,
            Err(e) => Err(Failure::failed(format!("the call failed: {e}"))),
        };
        // Some clients (the TypeScript SDK's) handle a notification a
        // step later than a response read with it, and drop the progress
        // of a call already answered: the last progress goes out first.
        if progress.as_ref().is_some_and(|p| p.n > 0) {
            tokio::time::sleep(PROGRESS_LEAD).await;
        }
        match ended {
            Ok(()) => outcome.result(tool),
            Err(failure) => {
                let code = outcome
                    .error_code
                    .clone()
                    .or_else(|| failure.reason.clone())
                    .unwrap_or_else(|| exit::reason_of(failure.code).to_owned());
                let mut result = tool_error(&code, &failure.message);
                if let (Some(task), Some(Json::Object(body))) =
                    (&outcome.task, result.structured_content.as_mut())
                {
                    body.insert("task".into(), json!(task));
                }
                result
            }
        }
    }
}

/// The W3C trace context in a request's `_meta` (`traceparent`, and
/// `tracestate` when it is text), as MCP reserves them.
fn traceparent_of(meta: &rmcp::model::RequestMetaObject) -> Option<(String, Option<String>)> {
    let parent = meta.get_traceparent()?.to_owned();
    Some((parent, meta.get_tracestate().map(str::to_owned)))
}

/// Progress notifications of one call.
struct Progress<'a> {
    token: ProgressToken,
    context: &'a RequestContext<RoleServer>,
    n: u64,
}

impl Progress<'_> {
    async fn report(&mut self, message: String) {
        self.n += 1;
        #[allow(clippy::cast_precision_loss)]
        let param =
            ProgressNotificationParam::new(self.token.clone(), self.n as f64).with_message(message);
        // A client gone is seen when the call's answer cannot be sent.
        let _ = self.context.peer.notify_progress(param).await;
    }
}

/// What the records of a call said.
#[derive(Default)]
struct Outcome {
    result: Option<Json>,
    sent: bool,
    items: Vec<Json>,
    item_bytes: usize,
    count: u64,
    truncated: bool,
    task: Option<String>,
    task_result: Option<Json>,
    error_code: Option<String>,
}

impl Outcome {
    async fn take(&mut self, tool: &ToolDef, record: &Json, progress: Option<&mut Progress<'_>>) {
        match record["kind"].as_str() {
            Some("result") => self.result = Some(record["value"].clone()),
            Some("sent") => self.sent = true,
            Some("item") => {
                self.count += 1;
                let item = &record["item"];
                let text = item.to_string();
                if self.items.len() < MAX_ITEMS && self.item_bytes + text.len() <= MAX_ITEM_BYTES {
                    self.item_bytes += text.len();
                    self.items.push(item.clone());
                } else {
                    self.truncated = true;
                }
                if let Some(progress) = progress {
                    progress.report(clip(text, MAX_MESSAGE)).await;
                }
            }
            Some("error") => {
                self.error_code = record["error"].as_str().map(str::to_owned);
            }
            Some("submitted") => {
                self.task = record["task"].as_str().map(str::to_owned);
                if let Some(progress) = progress {
                    progress
                        .report(format!(
                            "task {} submitted to {}",
                            record["task"].as_str().unwrap_or_default(),
                            tool.node
                        ))
                        .await;
                }
            }
            Some("event") => {
                let body = &record["body"];
                match record["event"].as_str() {
                    Some("result") => self.task_result = Some(body.clone()),
                    Some("error") => {
                        self.error_code = body["code"].as_str().map(str::to_owned);
                    }
                    _ => {}
                }
                if let Some(progress) = progress {
                    let state = record["state"].as_str().unwrap_or_default();
                    let event = record["event"].as_str().unwrap_or_default();
                    let text = if body.is_null() {
                        format!("{state}: {event}")
                    } else {
                        format!("{state}: {event} {body}")
                    };
                    progress.report(clip(text, MAX_MESSAGE)).await;
                }
            }
            _ => {}
        }
    }

    fn result(self, tool: &ToolDef) -> CallToolResult {
        let value = match tool.kind {
            Kind::Request => tool.output(self.result.unwrap_or(Json::Null)),
            Kind::Notification => json!({ "sent": self.sent }),
            Kind::Stream => {
                json!({ "items": self.items, "count": self.count, "truncated": self.truncated })
            }
            Kind::Task => json!({
                "task": self.task.unwrap_or_default(),
                "result": self.task_result.unwrap_or(Json::Null),
            }),
        };
        CallToolResult::structured(value)
    }
}

/// `text` cut to `max` bytes on a character boundary, an ellipsis after
/// it when it was cut.
pub(crate) fn clip(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// A tool error with the capwire code in its structured content.
pub(crate) fn tool_error(code: &str, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "capwire error {code}: {message}"
    ))]);
    result.structured_content = Some(json!({ "code": code, "message": message }));
    result
}

fn tool_of(def: &ToolDef) -> Tool {
    let mut tool = Tool::new(
        def.name.clone(),
        def.description.clone(),
        Arc::new(def.input_schema.clone()),
    )
    .with_title(def.title.clone());
    if let Some(schema) = &def.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(schema.clone()));
    }
    let mut meta = Map::new();
    meta.insert(
        "capwire".into(),
        json!({
            "node": def.node, "node_id": def.node_id, "cap": def.cap, "verb": def.verb,
            "kind": def.kind.as_str(),
            "class": if def.controller { "controller" } else { "bootstrap" },
        }),
    );
    tool.meta = Some(rmcp::model::MetaObject(meta));
    tool
}

impl ServerHandler for Face {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("capwire", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Each tool is a verb of a node of a capwire cluster, called by its control plane \
             through the node's own authorization chokepoint. Tool names are NODE__CAP__VERB.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = ListToolsResult::with_all_items(self.listing.borrow().tools.clone());
        // The list changes with the cluster: not to be kept.
        result.ttl_ms = Some(0);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, context)
            .await
            .map(CallToolResponse::from)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.listing.borrow().tool(name).cloned()
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // A client that negotiated a version with `initialize` is told of a
        // change with `notifications/tools/list_changed`, until it is gone.
        let mut listing = self.listing.clone();
        let peer = context.peer;
        tokio::spawn(async move {
            listing.mark_unchanged();
            loop {
                tokio::select! {
                    changed = listing.changed() => {
                        if changed.is_err() || peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    // A session that ended with no change since is let go
                    // too.
                    () = tokio::time::sleep(PEER_CHECK) => {
                        if peer.is_transport_closed() {
                            return;
                        }
                    }
                }
            }
        });
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        if context.accepted().tools_list_changed != Some(true) {
            context.cancelled().await;
            return Ok(());
        }
        let mut listing = self.listing.clone();
        listing.mark_unchanged();
        loop {
            tokio::select! {
                changed = listing.changed() => {
                    if changed.is_err() || context.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
                () = context.cancelled() => return Ok(()),
            }
        }
    }
}
