//! `capwire acp`: an Agent Client Protocol agent on stdio, fronting one
//! task verb of one node, acting with the identity of a `capwire ctl`
//! state directory (as `capwire mcp` does). An editor's prompt turn is
//! the task: its events stream back as session updates, its questions
//! are asked as permission requests (or forms), a cancel cancels it, and
//! a session is loaded again from the task's log at the node.
//!
//! The ACP methods are rows of one table (`table.rs`); the loop here
//! routes by it and asks each row's capability gate before its params are
//! decoded. The schema types are the `agent-client-protocol` crate's.

mod book;
mod face;
mod rpc;
mod table;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json};
use tokio::sync::Semaphore;

use crate::ctl::{self, Backend};
use crate::exit::{EXIT_CODES, Failure};
use crate::mcp;

use self::face::{Face, Shape, Target};
use self::rpc::{Line, Message, RpcError, code};

const AFTER_HELP: &str = "\
The mapping (ACP v1):
  initialize            advertises loadSession; text prompts only
  session/new           a session of the verb (kept in STATE/acp-sessions.json)
  session/prompt        submits a task: the prompt's text under --text-field,
                        with --args; at most 64 KiB
  session/update        each task event: tool_call (submitted), tool_call_update
                        (progress, question, answer), then the result as a
                        tool_call_update (completed) and an agent_message_chunk
  session/request_permission
                        a question whose answer is a choice: a text question is
                        yes (true) or no (false); {\"question\", \"choices\": [...]}
                        offers its choices
  elicitation/create    any other question, when the client advertised forms;
                        otherwise the turn ends and says how to answer it
  session/cancel        cancels the task; the prompt answers `cancelled`
  session/load          replays the session's tasks from their first event and
                        follows one still running
A method that was not negotiated, and an unknown one, is answered -32601
before its params are read. Lines are at most 1 MiB; 64 requests run at once,
64 sessions are open at once. Only ACP messages go to stdout; logs go to
stderr, without colour.

Authority: every prompt is a task submitted by this control plane. A
controller verb is refused unless --allow-controller: with it, any client of
this agent acts as the node's controller for that verb.

An ACP client's configuration (Zed's settings.json):
  {\"agent_servers\": {\"capwire\": {\"command\": \"capwire\",
     \"args\": [\"acp\", \"--state\", \"/path/to/ctl-state\", \"--verb\", \"app.agent/work\"]}}}";

/// Arguments of `capwire acp`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{AFTER_HELP}\n\n{EXIT_CODES}"))]
pub(crate) struct AcpArgs {
    /// The control plane's state directory (as `capwire ctl --state`).
    /// Default: $CAPWIRE_CTL_STATE, else ~/.capwire/ctl.
    #[arg(long = "state", value_name = "DIR", env = "CAPWIRE_CTL_STATE")]
    state_dir: Option<PathBuf>,
    /// The node (a name or key from `capwire ctl peers`). Default: the
    /// one node of the book with the verb.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The task verb, CAP/VERB (e.g. app.agent/work). Default: the node's
    /// one app.* task verb.
    #[arg(long, value_name = "CAP/VERB")]
    verb: Option<String>,
    /// The args key the prompt's text goes under.
    #[arg(long, value_name = "KEY", default_value = "text")]
    text_field: String,
    /// Args sent with every prompt, a JSON object (the text is added).
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    /// Front a controller verb: every client of this agent then acts as
    /// the node's controller for it.
    #[arg(long)]
    allow_controller: bool,
    /// How long a node may take to answer a call (for a task, each step
    /// of following it).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = ctl::parse_duration)]
    timeout: Duration,
}

/// `capwire acp ...`.
pub(crate) async fn run(args: AcpArgs) -> Result<(), Failure> {
    let base = match &args.args {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Json>(text) {
            Ok(Json::Object(m)) => m,
            _ => return Err(Failure::usage("--args is a JSON object")),
        },
    };
    let dir = ctl::state_dir_of(args.state_dir.as_deref())?;
    let (backend, forwarding) = ctl::open(&dir, true, args.timeout).await?;
    let result = async {
        let target = target(&backend, &args).await?;
        tracing::info!(
            "capwire acp: {}/{} on {}",
            target.cap,
            target.verb,
            target.node
        );
        let shape = Shape {
            text_field: args.text_field.clone(),
            args: base,
        };
        serve(backend.clone(), target, shape, args.timeout, &dir).await
    }
    .await;
    if let Backend::Local(ctx) = backend {
        if let Some(forwarding) = forwarding {
            forwarding.close(args.timeout).await;
        }
        ctx.close().await;
    }
    result
}

/// The verb to front: as the flags say, or the one task verb there is.
async fn target(backend: &Backend, args: &AcpArgs) -> Result<Target, Failure> {
    let scope = mcp::Scope {
        node: args.node.clone(),
        controller: true,
    };
    let served = mcp::served(backend, &scope, args.timeout).await?;
    let wanted = args.verb.as_deref().map(|v| v.split_once('/'));
    if let Some(None) = wanted {
        return Err(Failure::usage("--verb is CAP/VERB, e.g. app.agent/work"));
    }
    let found: Vec<_> = served
        .listing
        .catalog
        .tools
        .iter()
        .filter(|t| t.kind == mcp::Kind::Task)
        .filter(|t| {
            wanted
                .flatten()
                .is_none_or(|(c, v)| t.cap == c && t.verb == v)
        })
        .collect();
    let tool = match found.as_slice() {
        [one] => *one,
        [] => {
            return Err(Failure::usage(match &args.verb {
                Some(v) => format!("no node in the book has the task verb {v}"),
                None => "no node in the book has an app.* task verb".to_owned(),
            }));
        }
        many => {
            let names: Vec<String> = many
                .iter()
                .map(|t| format!("{}/{} on {}", t.cap, t.verb, t.node))
                .collect();
            return Err(Failure::usage(format!(
                "say which with --node and --verb: {}",
                names.join(", ")
            )));
        }
    };
    if tool.controller && !args.allow_controller {
        return Err(Failure::usage(format!(
            "{}/{} is a controller verb: capwire acp fronts it only with --allow-controller \
             (every client of this agent then acts as {}'s controller for it)",
            tool.cap, tool.verb, tool.node
        )));
    }
    Ok(Target {
        node: tool.node.clone(),
        node_id: tool.node_id.clone(),
        cap: tool.cap.clone(),
        verb: tool.verb.clone(),
    })
}

/// Serves one ACP client on stdin and stdout until stdin ends.
async fn serve(
    backend: Backend,
    target: Target,
    shape: Shape,
    timeout: Duration,
    dir: &std::path::Path,
) -> Result<(), Failure> {
    let (out, writer) = rpc::Out::new(tokio::io::stdout());
    let face = Arc::new(Face::new(
        backend,
        target,
        shape,
        timeout,
        book::Book::in_dir(dir),
        Arc::clone(&out),
    ));
    let mut input = tokio::io::BufReader::new(tokio::io::stdin());
    let calls = Arc::new(Semaphore::new(rpc::MAX_CALLS));
    let mut running = tokio::task::JoinSet::new();
    loop {
        let line = tokio::select! {
            line = rpc::next_line(&mut input, rpc::MAX_LINE) => line,
            () = crate::node::wait_for_signal() => break,
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => return Err(Failure::failed(format!("reading stdin failed: {e}"))),
        };
        let text = match line {
            Line::Text(t) if t.iter().all(u8::is_ascii_whitespace) => continue,
            Line::Text(t) => t,
            Line::TooLong => {
                let e = RpcError::new(
                    code::INVALID_REQUEST,
                    format!("a line is at most {} bytes", rpc::MAX_LINE),
                );
                out.respond(Json::Null, Err(e)).await;
                continue;
            }
        };
        match rpc::parse(&text) {
            Err((id, e)) => out.respond(id, Err(e)).await,
            Ok(Message::Response { id, result }) => out.resolve(&id, result),
            Ok(Message::Notification { method, params }) => match table::inbound(&method) {
                Some(row) if face.negotiated(row.gate) => {
                    if let Some(h) = row.handler {
                        face.notification(h, params);
                    }
                }
                _ => tracing::debug!("notification {method:?}: not handled, dropped"),
            },
            Ok(Message::Request { id, method, params }) => {
                // The gate before the params: -32601 wins over -32602.
                let Some((row, handler)) = table::inbound(&method)
                    .filter(|r| face.negotiated(r.gate))
                    .and_then(|r| Some((r, r.handler?)))
                else {
                    let e = RpcError::new(
                        code::METHOD_NOT_FOUND,
                        format!("{method:?} is not a method of this agent"),
                    );
                    out.respond(id, Err(e)).await;
                    continue;
                };
                if row.kind == table::Kind::Notification {
                    let e = RpcError::new(
                        code::INVALID_REQUEST,
                        format!("{method} is a notification: it has no id"),
                    );
                    out.respond(id, Err(e)).await;
                    continue;
                }
                let Ok(permit) = Arc::clone(&calls).try_acquire_owned() else {
                    let e = RpcError::new(
                        code::BUSY,
                        format!("{} requests are running already; try again", rpc::MAX_CALLS),
                    );
                    out.respond(id, Err(e)).await;
                    continue;
                };
                let (face, out) = (Arc::clone(&face), Arc::clone(&out));
                running.spawn(async move {
                    let answer = face.request(handler, params).await;
                    out.respond(id, answer).await;
                    drop(permit);
                });
            }
        }
        // Reap what ended.
        while running.try_join_next().is_some() {}
    }
    running.abort_all();
    drop(face);
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    Ok(())
}
