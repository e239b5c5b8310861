//! The ACP methods this face handles or sends, as data: one row each,
//! with its direction, its kind, its handler and its capability gate. The
//! loop in `rpc.rs` routes by this table alone, and the gate is asked
//! before a row's params are decoded, so a method that was not
//! negotiated is refused -32601 whatever its params.
//!
//! The table's invariants (checked by a test below):
//! - {direction, method} is unique;
//! - a notification has no result, a request has one;
//! - each handler appears once per side, and only on rows that side
//!   receives; every row this face receives has a handler, and no row it
//!   sends has one.

/// Which side sends the method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    ClientToAgent,
    AgentToClient,
}

/// JSON-RPC's shape: a request gets a response, a notification none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Request,
    Notification,
}

/// What handles an inbound method here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handler {
    Initialize,
    Authenticate,
    NewSession,
    LoadSession,
    Prompt,
    Cancel,
}

/// What a row needs negotiated: nothing, a capability this agent
/// advertised in its `initialize` answer (for what it receives), or one
/// the client advertised in its `initialize` request (for what it sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Always available.
    Baseline,
    /// `agentCapabilities.loadSession`.
    AgentLoadSession,
    /// `clientCapabilities.elicitation.form`.
    ClientElicitationForm,
}

/// One method.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) method: &'static str,
    pub(crate) direction: Direction,
    pub(crate) kind: Kind,
    /// Whether a response carries a result (a request's does).
    pub(crate) has_result: bool,
    /// For a method this face receives: what handles it.
    pub(crate) handler: Option<Handler>,
    pub(crate) gate: Gate,
}

const fn request(method: &'static str, direction: Direction, handler: Option<Handler>) -> Row {
    Row {
        method,
        direction,
        kind: Kind::Request,
        has_result: true,
        handler,
        gate: Gate::Baseline,
    }
}

const fn notification(method: &'static str, direction: Direction, handler: Option<Handler>) -> Row {
    Row {
        method,
        direction,
        kind: Kind::Notification,
        has_result: false,
        handler,
        gate: Gate::Baseline,
    }
}

const fn gated(row: Row, gate: Gate) -> Row {
    Row { gate, ..row }
}

use Direction::{AgentToClient, ClientToAgent};

/// Every ACP method this face handles or sends.
pub(crate) const TABLE: &[Row] = &[
    request("initialize", ClientToAgent, Some(Handler::Initialize)),
    request("authenticate", ClientToAgent, Some(Handler::Authenticate)),
    request("session/new", ClientToAgent, Some(Handler::NewSession)),
    gated(
        request("session/load", ClientToAgent, Some(Handler::LoadSession)),
        Gate::AgentLoadSession,
    ),
    request("session/prompt", ClientToAgent, Some(Handler::Prompt)),
    notification("session/cancel", ClientToAgent, Some(Handler::Cancel)),
    notification("session/update", AgentToClient, None),
    request("session/request_permission", AgentToClient, None),
    gated(
        request("elicitation/create", AgentToClient, None),
        Gate::ClientElicitationForm,
    ),
];

/// The row of a method this face receives.
pub(crate) fn inbound(method: &str) -> Option<&'static Row> {
    TABLE
        .iter()
        .find(|r| r.direction == ClientToAgent && r.method == method)
}

/// The row of a method this face sends.
pub(crate) fn outbound(method: &str) -> Option<&'static Row> {
    TABLE
        .iter()
        .find(|r| r.direction == AgentToClient && r.method == method)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direction_and_method_are_unique() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                assert!(
                    !(a.direction == b.direction && a.method == b.method),
                    "{} {:?} twice",
                    a.method,
                    a.direction
                );
            }
        }
    }

    #[test]
    fn a_notification_has_no_result_and_a_request_has_one() {
        for r in TABLE {
            assert_eq!(r.has_result, r.kind == Kind::Request, "{}", r.method);
        }
    }

    #[test]
    fn one_handler_per_method_on_the_side_that_receives_it() {
        let mut seen = Vec::new();
        for r in TABLE {
            match (r.direction, r.handler) {
                (ClientToAgent, Some(h)) => {
                    assert!(!seen.contains(&h), "{h:?} handles two methods");
                    seen.push(h);
                }
                (ClientToAgent, None) => panic!("{} is received and has no handler", r.method),
                (AgentToClient, Some(_)) => panic!("{} is sent and has a handler", r.method),
                (AgentToClient, None) => {}
            }
        }
    }

    #[test]
    fn a_gate_belongs_to_the_side_it_names() {
        for r in TABLE {
            match r.gate {
                Gate::Baseline => {}
                Gate::AgentLoadSession => assert_eq!(r.direction, ClientToAgent, "{}", r.method),
                Gate::ClientElicitationForm => {
                    assert_eq!(r.direction, AgentToClient, "{}", r.method);
                }
            }
        }
    }

    #[test]
    fn lookups_see_only_their_side() {
        assert!(inbound("session/prompt").is_some());
        assert!(inbound("session/update").is_none());
        assert!(outbound("session/update").is_some());
        assert!(outbound("session/prompt").is_none());
        assert!(inbound("no/such").is_none());
    }
}
