//! `capwire mcp`: the cluster's verbs as the tools of an MCP server (on
//! rmcp, the official Rust SDK), over stdio or streamable HTTP. It acts
//! with the identity of a `capwire ctl` state directory: its tools are
//! the `app.*` verbs of the nodes that control plane has bound, and a
//! tool call is a call of that control plane, decided by the node's
//! chokepoint as any other.
//!
//! Like `ctl watch`, it owns the state directory while it runs and serves
//! `ctl.sock`, so `capwire ctl` commands typed meanwhile go through it;
//! when the directory is owned by a `ctl watch` or `top` already, it
//! hands its calls to that one, and ends when that one does.

mod catalog;
mod http;
mod refresh;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::ctl::{self, Backend};
use crate::exit::{EXIT_CODES, Failure};

pub(crate) use self::catalog::Kind;
pub(crate) use self::refresh::{Scope, run_one, served};
use self::server::Face;
pub(crate) use self::server::clip;

const AFTER_HELP: &str = "\
Tools: one per app.* verb of each node in the control plane's book, named
NODE__CAP__VERB (app. left out; other characters than letters, digits, _ and
- become _; a name over 64 characters or taken is cut and ends with a hash),
with the verb's schemas as inputSchema and outputSchema. Args that are not a
JSON object go in as {\"value\": ARGS}; a result that is not an object comes as
{\"result\": RESULT}. A stream verb reports each item as a progress
notification and returns {items, count, truncated} (1,000 items or 1 MiB
kept); a task verb reports each event as progress and returns {task, result}
when the task completes (a question it waits on ends the call with the tool
error input_required, which says how to answer it with `capwire ctl tasks`).
A failed call is a tool error whose structured content is {code, message},
code being capwire's (unauthorized, unknown_verb, bad_args, timeout, ...).
The list changes (listChanged) when a roster changes, a node comes or goes,
or the book does.

Authority: every tool call is a call of this control plane. By default only
bootstrap verbs, which any peer may call, are tools. With --allow-controller
the controller verbs are tools too, and then every MCP client that reaches
this server runs them with the control plane's authority over its nodes:
give it only to clients you would give `capwire ctl`.

An MCP client's configuration (stdio):
  {\"mcpServers\": {\"capwire\": {\"command\": \"capwire\",
     \"args\": [\"mcp\", \"--state\", \"/path/to/ctl-state\"]}}}";

/// Arguments of `capwire mcp`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{AFTER_HELP}\n\n{EXIT_CODES}"))]
pub(crate) struct McpArgs {
    /// The control plane's state directory (as `capwire ctl --state`).
    /// Default: $CAPWIRE_CTL_STATE, else ~/.capwire/ctl.
    #[arg(long = "state", value_name = "DIR", env = "CAPWIRE_CTL_STATE")]
    state_dir: Option<PathBuf>,
    /// Serve MCP's streamable HTTP at http://ADDR/mcp (and the nodes'
    /// A2A cards under /.well-known/agent-card.json) instead of stdio.
    /// ADDR is a loopback address and port, or a port alone
    /// (127.0.0.1:PORT); 0 picks a free port, printed on stderr.
    #[arg(long, value_name = "ADDR", value_parser = loopback_addr)]
    http: Option<SocketAddr>,
    /// Only this node's verbs (a name or key from `capwire ctl peers`).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Make the nodes' controller verbs tools too. They run with the
    /// control plane's authority: any MCP client of this server then acts
    /// as the nodes' controller for those verbs.
    #[arg(long)]
    allow_controller: bool,
    /// How long a node may take to answer a call (for a stream, each next
    /// item; for a task, each step of following it).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = ctl::parse_duration)]
    timeout: Duration,
}

/// `127.0.0.1:PORT` from `PORT`, else the address as given.
fn loopback_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse::<SocketAddr>()
        .map_err(|e| format!("{text:?} is not an address and port, nor a port: {e}"))
}

/// `capwire mcp ...`.
pub(crate) async fn run(args: McpArgs) -> Result<(), Failure> {
    // Bound before anything is opened: a bad address is a usage error.
    let listener = match args.http {
        Some(addr) => Some(http::bind(addr).await?),
        None => None,
    };
    let dir = ctl::state_dir_of(args.state_dir.as_deref())?;
    let (backend, forwarding) = ctl::open(&dir, true, args.timeout).await?;
    let scope = Scope {
        node: args.node.clone(),
        controller: args.allow_controller,
    };
    let result = serve(&backend, scope, args.timeout, listener).await;
    if let Backend::Local(ctx) = backend {
        if let Some(forwarding) = forwarding {
            forwarding.close(args.timeout).await;
        }
        ctx.close().await;
    }
    result
}

async fn serve(
    backend: &Backend,
    scope: Scope,
    timeout: Duration,
    listener: Option<tokio::net::TcpListener>,
) -> Result<(), Failure> {
    let served = refresh::served(backend, &scope, timeout).await?;
    let (tools_tx, tools) = watch::channel(Arc::clone(&served.listing));
    let (nodes_tx, nodes) = watch::channel(Arc::new(served.nodes));
    let face = Face {
        backend: backend.clone(),
        timeout,
        listing: tools,
        calls: Arc::new(Semaphore::new(server::MAX_CALLS)),
    };
    let maintain = refresh::maintain(backend.clone(), scope, timeout, tools_tx, nodes_tx);
    let stop = CancellationToken::new();
    let serving = async {
        match listener {
            Some(listener) => {
                if let Ok(addr) = listener.local_addr() {
                    eprintln!("capwire mcp: MCP at http://{addr}{}", http::MCP_PATH);
                }
                http::serve(face, nodes, listener, stop.clone()).await
            }
            None => stdio(face).await,
        }
    };
    let result = tokio::select! {
        served = serving => served,
        () = maintain => Err(Failure::failed(
            "the ctl this server handed its commands to has stopped",
        )),
        () = crate::node::wait_for_signal() => Ok(()),
    };
    stop.cancel();
    result
}

/// Serves one MCP client on stdin and stdout until it goes.
async fn stdio(face: Face) -> Result<(), Failure> {
    let running = match face.serve(rmcp::transport::stdio_pipes()).await {
        Ok(running) => running,
        // A client that only looked (`server/discover`) and went.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => {
            return Err(Failure::failed(format!(
                "the MCP client did not start a session: {e}"
            )));
        }
    };
    running
        .waiting()
        .await
        .map(drop)
        .map_err(|e| Failure::failed(format!("the MCP session failed: {e}")))
}
