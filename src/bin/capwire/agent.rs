//! `app.agent`: the small application capability every `capwire node`
//! runs, so that nodes started from the command line (and the children of
//! a process host) have something to call: `echo` (bootstrap) answers
//! with the node's name, `ask` (controller) makes the node call another
//! node's `echo`.

use capwire::manifest::verb;
use capwire::{Capability, HandlerError, NodeHandle, NodeId, State};
use serde::{Deserialize, Serialize};

verb! {
    /// `app.agent/echo`: answers `NAME: TEXT`.
    pub(crate) struct Echo: request "app.agent" / "echo", Bootstrap, String => String;
}

/// Args of `app.agent/ask`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AskArgs {
    /// The node to ask: its key, 64 hex digits.
    pub(crate) peer: String,
    /// What to send its `echo`.
    pub(crate) text: String,
}

verb! {
    /// `app.agent/ask` (controller): calls `peer`'s `app.agent/echo` with
    /// `text` and answers what it said.
    pub(crate) struct Ask: request "app.agent" / "ask", Controller, AskArgs => String;
}

/// The node's name, for `echo`.
#[derive(Debug, Clone)]
pub(crate) struct AgentName(pub(crate) String);

async fn echo(text: String, State(name): State<AgentName>) -> Result<String, HandlerError> {
    Ok(format!("{}: {text}", name.0))
}

async fn ask(args: AskArgs, node: NodeHandle) -> Result<String, HandlerError> {
    let peer = NodeId::try_from(args.peer.as_str()).map_err(|e| {
        HandlerError::new(capwire::envelope::ErrorCode::BadArgs, format!("peer: {e}"))
    })?;
    node.peer(peer)
        .request(Echo, args.text)
        .await
        .map_err(|e| HandlerError::new(capwire::envelope::ErrorCode::Unavailable, e.to_string()))
}

/// The capability (the node also needs [`AgentName`] as state).
pub(crate) fn capability() -> Capability {
    match Capability::new("app.agent", "1.0.0") {
        Ok(cap) => cap.handle(Echo, echo).handle(Ask, ask),
        // "1.0.0" is a valid version.
        Err(_) => unreachable!("app.agent's version is valid"),
    }
}
