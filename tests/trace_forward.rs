//! Trace contexts with no subscriber at all (this test binary sets none):
//! no spans are made, and a context passes through the cluster as it
//! came. A handler sees the context it was called with
//! (`capwire::trace::current`), and its own calls carry it on, same
//! trace id and same span id; so do a stream's handler and a task's. A
//! call with no context is served with none. The control plane's
//! monitoring copies name the trace of a call that had one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/core.rs"]
mod core_helpers;

use std::sync::{Arc, Mutex};

use capwire::envelope::{ErrorCode, NodeId};
use capwire::manifest::{CopyDirection, verb};
use capwire::trace::TraceContext;
use capwire::{Capability, ControlEvent, HandlerError, Items, Node, NodeHandle, State, Task};
use core_helpers::{Ping, bind_new, copies, events_until, listening, mon_node};

/// A context as a handler saw it: its `traceparent` and `tracestate`.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, capwire::JsonSchema,
)]
#[schemars(crate = "capwire::schemars")]
pub struct Seen {
    traceparent: String,
    tracestate: Option<String>,
}

/// What `relay` saw, and what the node it called saw.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub struct Relayed {
    here: Option<Seen>,
    there: Option<Seen>,
}

verb! {
    /// Answers the context its handler runs with.
    pub struct Look: request "app.fw" / "look", Bootstrap, () => Option<Seen>;
}
verb! {
    /// Answers its own context and the one `look` on the next node saw.
    pub struct Relay: request "app.fw" / "relay", Bootstrap, () => Relayed;
}
verb! {
    /// Sends the context its handler runs with, as its one item.
    pub struct LookStream: stream "app.fw" / "look_stream", Bootstrap, () => Option<Seen>;
}
verb! {
    /// Answers the context its handler runs with.
    pub struct LookTask: task "app.fw" / "look_task", Bootstrap, () => Option<Seen>;
}

/// Where `relay` relays to.
#[derive(Debug, Default)]
struct Next(Mutex<Option<NodeId>>);

fn seen() -> Option<Seen> {
    capwire::trace::current().map(|cx| Seen {
        traceparent: cx.traceparent(),
        tracestate: cx.tracestate().map(str::to_owned),
    })
}

async fn look(_: ()) -> Result<Option<Seen>, HandlerError> {
    Ok(seen())
}

async fn relay(
    _: (),
    node: NodeHandle,
    State(next): State<Arc<Next>>,
) -> Result<Relayed, HandlerError> {
    let here = seen();
    let to = next.0.lock().unwrap().expect("a node to relay to");
    let there = node
        .peer(to)
        .request(Look, ())
        .await
        .map_err(|e| HandlerError::new(ErrorCode::Internal, e.to_string()))?;
    // Still the same context after the call.
    assert_eq!(seen(), here);
    Ok(Relayed { here, there })
}

async fn look_stream(_: (), mut items: Items<Option<Seen>>) -> Result<(), HandlerError> {
    tokio::task::yield_now().await;
    items.send(seen()).await?;
    Ok(())
}

async fn look_task(_: (), task: Task) -> Result<Option<Seen>, HandlerError> {
    task.progress(&seen()).await?;
    Ok(seen())
}

fn cap() -> Capability {
    Capability::new("app.fw", "1.0.0")
        .unwrap()
        .handle(Look, look)
        .handle(Relay, relay)
        .stream(LookStream, look_stream)
        .task(LookTask, look_task)
}

async fn started(name: &str) -> (Node, Arc<Next>) {
    let next = Arc::new(Next::default());
    let node = listening(name)
        .capability(cap())
        .state(next.clone())
        .start()
        .await
        .unwrap();
    (node, next)
}

async fn connect(from: &Node, to: &Node) -> capwire::Peer {
    from.connect(&to.local_addrs()[0], Some(to.id()))
        .await
        .unwrap()
}

/// A context with a vendor's state, as the caller's own tracing would
/// make it.
fn context() -> TraceContext {
    let root = TraceContext::new_root(true);
    TraceContext::parse(&root.traceparent(), Some("vendor=opaque,other=1")).unwrap()
}

fn as_seen(cx: &TraceContext) -> Seen {
    Seen {
        traceparent: cx.traceparent(),
        tracestate: cx.tracestate().map(str::to_owned),
    }
}

/// Three nodes, a → b → c, b relaying to c.
async fn chain() -> (Node, Node, Node, capwire::Peer) {
    let (c, _) = started("c").await;
    let (b, next) = started("b").await;
    connect(&b, &c).await;
    *next.0.lock().unwrap() = Some(c.id());
    let a = Node::builder("a").start().await.unwrap();
    let to_b = connect(&a, &b).await;
    (a, b, c, to_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_passes_through_a_handler_as_it_came() {
    assert!(capwire::trace::current().is_none(), "none outside a call");
    let (a, b, c, to_b) = chain().await;
    let cx = context();
    let got = to_b
        .with_trace(cx.clone())
        .request(Relay, ())
        .await
        .unwrap();
    assert_eq!(
        got.here,
        Some(as_seen(&cx)),
        "b's handler sees the caller's context"
    );
    assert_eq!(
        got.there,
        Some(as_seen(&cx)),
        "c sees the same trace and the same span: nothing in between made a span"
    );
    for n in [&b, &c] {
        let stats = n.stats();
        assert_eq!(stats.trace_contexts_accepted, 1);
        assert!(stats.trace_contexts_dropped.is_empty());
    }
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_no_context_is_served_with_none() {
    let (a, b, c, to_b) = chain().await;
    let got = to_b.request(Relay, ()).await.unwrap();
    assert_eq!(got.here, None);
    assert_eq!(got.there, None, "b's call carried nothing on");
    for n in [&b, &c] {
        let stats = n.stats();
        assert_eq!(stats.trace_contexts_accepted, 0);
        assert!(stats.trace_contexts_dropped.is_empty());
    }
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_task_handlers_see_their_callers_context() {
    let (b, _) = started("b").await;
    let a = Node::builder("a").start().await.unwrap();
    let peer = connect(&a, &b).await;
    let cx = context();

    let mut items = peer
        .with_trace(cx.clone())
        .stream(LookStream, ())
        .await
        .unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), Some(as_seen(&cx)));
    assert!(items.next().await.is_none());
    let mut items = peer.stream(LookStream, ()).await.unwrap();
    assert_eq!(items.next().await.unwrap().unwrap(), None);

    let task = peer
        .with_trace(cx.clone())
        .submit(LookTask, ())
        .await
        .unwrap();
    assert_eq!(
        task.result().await.unwrap(),
        Some(as_seen(&cx)),
        "a task's handler runs in its submit's context"
    );
    let task = peer.submit(LookTask, ()).await.unwrap();
    assert_eq!(task.result().await.unwrap(), None);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_copies_name_the_trace_of_a_call() {
    let (builder, _log) = mon_node("agent");
    let bound = bind_new(builder).await;
    let mut events = bound.cp.control_events();
    let caller = Node::builder("caller").start().await.unwrap();
    let peer = connect(&caller, &bound.node).await;
    let cx = context();
    peer.with_trace(cx.clone())
        .request(Ping, "traced".into())
        .await
        .unwrap();
    peer.request(Ping, "plain".into()).await.unwrap();
    // Copies come in order: the plain ping's is the last one waited for.
    let seen = events_until(&mut events, "the copies of both pings", |e| {
        matches!(e, ControlEvent::Copy { record, .. } if record.verb == "ping" && record.trace.is_none())
    })
    .await;
    let pings: Vec<_> = copies(&seen)
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| c.verb == "ping" && c.dir == CopyDirection::In && c.peer == caller.id())
        .collect();
    assert_eq!(pings.len(), 2, "{pings:#?}");
    assert_eq!(pings[0].trace, Some(cx.trace_id_hex()), "the traced ping");
    assert_eq!(pings[1].trace, None, "the plain ping");
    caller.shutdown().await;
    bound.cp.shutdown().await;
    bound.node.shutdown().await;
}
