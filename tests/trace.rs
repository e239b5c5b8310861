//! One trace across the cluster, as an OpenTelemetry exporter sees it: a
//! request is a client span at the caller and a server span at the callee,
//! one the parent of the other; a handler's own calls are children of its
//! server span; a stream is one span at each end with its items as
//! events; a task's handler runs in a span of its submit's trace, also
//! when a restarted node resumes it; a call the chokepoint refuses is
//! still a server span, with its outcome and an error status; a call
//! through a grant names the grant.
//!
//! One subscriber for the whole test binary (an OpenTelemetry layer over
//! an in-memory exporter, spans exported as they end): nodes run their
//! work on the runtime's worker threads, and a global subscriber sees
//! them all. Tests run side by side, so each one looks only at the spans
//! of the traces it started.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/core.rs"]
mod core_helpers;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use capwire::envelope::{ErrorCode, NodeId};
use capwire::grants::Right;
use capwire::manifest::{GetConfig, NoArgs, verb};
use capwire::trace::{SPAN_TARGET, TraceContext};
use capwire::{
    Capability, HandlerError, Items, Keypair, Node, NodeBuilder, NodeHandle, State, Task,
};
use core_helpers::{bind_new, denied, listening};
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceContextExt, TraceId, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio::time::Instant;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

verb! {
    /// Answers `hi TEXT`.
    pub struct Hi: request "app.tr" / "hi", Bootstrap, String => String;
}
verb! {
    /// Calls `hi` on the node named in the state, and answers its answer.
    pub struct Relay: request "app.tr" / "relay", Bootstrap, String => String;
}
verb! {
    /// Sends 1..=n.
    pub struct Count: stream "app.tr" / "count", Bootstrap, u32 => u32;
}
verb! {
    /// Reports the progress 1..=n, and answers n.
    pub struct Chores: task "app.tr" / "chores", Bootstrap, u32 => u32;
}
verb! {
    /// Asks one question, and answers the number it was given.
    pub struct Quiz: task "app.tr" / "quiz", Bootstrap, () => u32;
}
verb! {
    /// Reports the progress 1..=n; resumable: goes on after the last
    /// progress it reported. Its first run waits for ever once it has
    /// reported `pause`.
    pub struct Steps: task "app.tr" / "steps", Bootstrap, StepArgs => u32;
}

/// Args of `steps`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, capwire::JsonSchema)]
#[schemars(crate = "capwire::schemars")]
pub struct StepArgs {
    n: u32,
    pause: u32,
}

/// What the handlers share with the test.
#[derive(Debug, Default)]
struct Shared {
    /// Where `relay` relays to.
    next: Mutex<Option<NodeId>>,
}

async fn hi(text: String) -> Result<String, HandlerError> {
    Ok(format!("hi {text}"))
}

async fn relay(
    text: String,
    node: NodeHandle,
    State(s): State<Arc<Shared>>,
) -> Result<String, HandlerError> {
    let next = s.next.lock().unwrap().expect("a node to relay to");
    node.peer(next)
        .request(Hi, text)
        .await
        .map_err(|e| HandlerError::new(ErrorCode::Internal, e.to_string()))
}

async fn count(n: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
    for i in 1..=n {
        items.send(i).await?;
    }
    Ok(())
}

async fn chores(n: u32, task: Task) -> Result<u32, HandlerError> {
    for i in 1..=n {
        task.progress(&i).await?;
    }
    Ok(n)
}

async fn quiz(_: (), task: Task) -> Result<u32, HandlerError> {
    let n: u32 = task.ask("how many?", Duration::from_secs(30)).await?;
    Ok(n)
}

async fn steps(args: StepArgs, task: Task) -> Result<u32, HandlerError> {
    let mut done = 0u32;
    if task.resumed() {
        for e in task.events(1).await? {
            if e.kind == capwire::manifest::TaskEventKind::Progress {
                done = e.body.decode::<u32>().unwrap();
            }
        }
    }
    while done < args.n {
        if done == args.pause && !task.resumed() {
            std::future::pending::<()>().await;
        }
        done += 1;
        task.progress(&done).await?;
    }
    Ok(done)
}

fn cap() -> Capability {
    Capability::new("app.tr", "1.0.0")
        .unwrap()
        .handle(Hi, hi)
        .handle(Relay, relay)
        .stream(Count, count)
        .task(Chores, chores)
        .task(Quiz, quiz)
        .resumable_task(Steps, steps)
}

/// A listening node with `app.tr`, and its shared state.
fn server(name: &str) -> (NodeBuilder, Arc<Shared>) {
    let shared = Arc::new(Shared::default());
    let b = listening(name).capability(cap()).state(shared.clone());
    (b, shared)
}

async fn started(name: &str) -> (Node, Arc<Shared>) {
    let (b, s) = server(name);
    (b.start().await.unwrap(), s)
}

/// A node with nothing of its own.
async fn plain(name: &str) -> Node {
    Node::builder(name).start().await.unwrap()
}

async fn connect(from: &Node, to: &Node) -> capwire::Peer {
    from.connect(&to.local_addrs()[0], Some(to.id()))
        .await
        .unwrap()
}

// ---------------------------------------------------------------------
// The exporter and what it saw.

/// The target of the test's own root spans.
const ROOT: &str = "trace_test";

/// The binary's one subscriber: its exporter (the provider is kept with
/// it, so it is never shut down).
fn exporter() -> &'static InMemorySpanExporter {
    static SEEN: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &SEEN
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
            let only = Targets::new()
                .with_target(SPAN_TARGET, tracing::Level::INFO)
                .with_target(ROOT, tracing::Level::INFO);
            let subscriber = tracing_subscriber::registry().with(only).with(layer);
            tracing::subscriber::set_global_default(subscriber).unwrap();
            (exporter, provider)
        })
        .0
}

/// A root span of the test's own, and its trace id.
fn root_span() -> (tracing::Span, TraceId) {
    exporter();
    let root = tracing::info_span!(target: ROOT, "test root");
    let id = root.context().span().span_context().trace_id();
    assert_ne!(id, TraceId::INVALID, "the root span is recorded");
    (root, id)
}

/// A fresh, sampled context to give a call, and its trace id.
fn root_context() -> (TraceContext, TraceId) {
    exporter();
    let cx = TraceContext::new_root(true);
    let id = TraceId::from_bytes(cx.trace_id());
    (cx, id)
}

fn span_id(cx: &TraceContext) -> SpanId {
    SpanId::from_bytes(cx.span_id())
}

/// The spans of `trace` that ended so far.
fn spans_of(trace: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

/// Waits until the ended spans of `trace` satisfy `done` (spans end as
/// the work ends, which may be just after its answer went out); fails
/// after 10 s.
async fn spans_until(
    trace: TraceId,
    what: &str,
    done: impl Fn(&[SpanData]) -> bool,
) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans = spans_of(trace);
        if done(&spans) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}; saw {:#?}",
            summary(&spans)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Spans as (kind, name, method, span id, parent id), for messages.
fn summary(spans: &[SpanData]) -> Vec<String> {
    spans
        .iter()
        .map(|s| {
            format!(
                "{:?} {} {:?} {} <- {}",
                s.span_kind,
                s.name,
                attr(s, "rpc.method"),
                s.span_context.span_id(),
                s.parent_span_id
            )
        })
        .collect()
}

/// The attribute `key` of `span`, as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The spans of `kind` for calls of `method`.
fn of<'a>(spans: &'a [SpanData], kind: &SpanKind, method: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|s| s.span_kind == *kind && attr(s, "rpc.method").as_deref() == Some(method))
        .collect()
}

/// Whether there are `n` spans of `kind` for `method`.
fn has(spans: &[SpanData], kind: &SpanKind, method: &str, n: usize) -> bool {
    of(spans, kind, method).len() >= n
}

/// The one span of `kind` for `method`.
#[track_caller]
fn one<'a>(spans: &'a [SpanData], kind: &SpanKind, method: &str) -> &'a SpanData {
    let found = of(spans, kind, method);
    assert_eq!(
        found.len(),
        1,
        "one {kind:?} span of {method}: {:#?}",
        summary(spans)
    );
    found[0]
}

/// How many events named `name` `span` has.
fn events(span: &SpanData, name: &str) -> usize {
    span.events.iter().filter(|e| e.name == name).count()
}

/// The `seq` attributes of the events named `name`, in order.
fn seqs(span: &SpanData, name: &str) -> Vec<i64> {
    span.events
        .iter()
        .filter(|e| e.name == name)
        .map(|e| {
            e.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "seq")
                // An integer attribute, not its text.
                .map(|kv| match &kv.value {
                    opentelemetry::Value::I64(n) => *n,
                    other => panic!("seq is an integer: {other:?}"),
                })
                .expect("an event has its seq")
        })
        .collect()
}

fn is_error(span: &SpanData) -> bool {
    matches!(span.status, Status::Error { .. })
}

// ---------------------------------------------------------------------
// (a) A request.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_a_client_span_and_the_callees_server_span_under_it() {
    let (b, _) = started("callee").await;
    let a = plain("caller").await;
    let peer = connect(&a, &b).await;

    // Made in a span of the caller's: the client span is its child, the
    // server span the client span's.
    let (root, trace) = root_span();
    let answer = peer
        .request(Hi, "there".into())
        .instrument(root.clone())
        .await
        .unwrap();
    assert_eq!(answer, "hi there");
    let root_id = root.context().span().span_context().span_id();
    drop(root);
    let spans = spans_until(trace, "the client and the server span ended", |s| {
        has(s, &SpanKind::Client, "hi", 1) && has(s, &SpanKind::Server, "hi", 1)
    })
    .await;
    let client = one(&spans, &SpanKind::Client, "hi");
    let server = one(&spans, &SpanKind::Server, "hi");
    assert_eq!(
        client.parent_span_id, root_id,
        "the caller's span is the parent"
    );
    assert_eq!(
        server.parent_span_id,
        client.span_context.span_id(),
        "the server span's parent is the client span"
    );
    assert!(
        server.parent_span_is_remote,
        "its parent came over the wire"
    );
    assert_eq!(server.span_context.trace_id(), trace);
    assert_eq!(attr(server, "capwire.class").as_deref(), Some("bootstrap"));
    assert_eq!(attr(server, "capwire.outcome").as_deref(), Some("ok"));
    assert_eq!(attr(server, "rpc.service").as_deref(), Some("app.tr"));
    assert_eq!(attr(server, "capwire.grant"), None, "no grant was used");
    assert!(!is_error(server));
    assert_eq!(attr(client, "capwire.outcome").as_deref(), Some("ok"));
    assert_eq!(
        attr(client, "capwire.peer"),
        Some(b.id().to_string()),
        "the client span names the callee"
    );
    assert_eq!(
        attr(server, "capwire.peer"),
        Some(a.id().to_string()),
        "the server span names the caller"
    );

    // An explicit context given to the handle: the client span's parent.
    let (cx, trace) = root_context();
    let answer = peer
        .with_trace(cx.clone())
        .request(Hi, "again".into())
        .await
        .unwrap();
    assert_eq!(answer, "hi again");
    let spans = spans_until(trace, "the spans of the explicit context ended", |s| {
        has(s, &SpanKind::Client, "hi", 1) && has(s, &SpanKind::Server, "hi", 1)
    })
    .await;
    let client = one(&spans, &SpanKind::Client, "hi");
    let server = one(&spans, &SpanKind::Server, "hi");
    assert_eq!(client.parent_span_id, span_id(&cx));
    assert!(client.parent_span_is_remote, "the given context is remote");
    assert_eq!(server.parent_span_id, client.span_context.span_id());
    assert_eq!(attr(server, "capwire.outcome").as_deref(), Some("ok"));
    assert_eq!(spans.len(), 2, "{:#?}", summary(&spans));
    assert!(
        b.stats().trace_contexts_accepted >= 2,
        "the callee believed both contexts"
    );
    assert!(b.stats().trace_contexts_dropped.is_empty());
    a.shutdown().await;
    b.shutdown().await;
}

// ---------------------------------------------------------------------
// (b) A handler's own call.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_call_is_a_child_of_its_server_span() {
    let (c, _) = started("c").await;
    let (b, b_state) = started("b").await;
    let a = plain("a").await;
    connect(&b, &c).await;
    *b_state.next.lock().unwrap() = Some(c.id());
    let to_b = connect(&a, &b).await;

    let (cx, trace) = root_context();
    let answer = to_b
        .with_trace(cx.clone())
        .request(Relay, "through b".into())
        .await
        .unwrap();
    assert_eq!(answer, "hi through b");
    let spans = spans_until(trace, "the four spans ended", |s| {
        has(s, &SpanKind::Client, "relay", 1)
            && has(s, &SpanKind::Server, "relay", 1)
            && has(s, &SpanKind::Client, "hi", 1)
            && has(s, &SpanKind::Server, "hi", 1)
    })
    .await;
    let a_client = one(&spans, &SpanKind::Client, "relay");
    let b_server = one(&spans, &SpanKind::Server, "relay");
    let b_client = one(&spans, &SpanKind::Client, "hi");
    let c_server = one(&spans, &SpanKind::Server, "hi");
    assert_eq!(a_client.parent_span_id, span_id(&cx));
    assert_eq!(b_server.parent_span_id, a_client.span_context.span_id());
    assert_eq!(
        b_client.parent_span_id,
        b_server.span_context.span_id(),
        "b's call is a child of the server span of the handler that made it"
    );
    assert!(!b_client.parent_span_is_remote);
    assert_eq!(
        c_server.parent_span_id,
        b_client.span_context.span_id(),
        "c's server span is a child of b's client span"
    );
    assert_eq!(attr(b_client, "capwire.peer"), Some(c.id().to_string()));
    assert_eq!(attr(c_server, "capwire.peer"), Some(b.id().to_string()));
    for s in [a_client, b_server, b_client, c_server] {
        assert_eq!(attr(s, "capwire.outcome").as_deref(), Some("ok"));
    }
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------
// (c) A stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_one_span_at_each_end_with_its_items_as_events() {
    let (b, _) = started("streamer").await;
    let a = plain("consumer").await;
    let peer = connect(&a, &b).await;

    let (cx, trace) = root_context();
    let mut items = peer.with_trace(cx.clone()).stream(Count, 5).await.unwrap();
    let mut got = Vec::new();
    while let Some(n) = items.next().await {
        got.push(n.unwrap());
    }
    assert_eq!(got, [1, 2, 3, 4, 5]);
    drop(items);
    let spans = spans_until(trace, "both ends of the stream ended", |s| {
        has(s, &SpanKind::Client, "count", 1) && has(s, &SpanKind::Server, "count", 1)
    })
    .await;
    assert_eq!(
        spans.len(),
        2,
        "one span at each end: {:#?}",
        summary(&spans)
    );
    let client = one(&spans, &SpanKind::Client, "count");
    let server = one(&spans, &SpanKind::Server, "count");
    assert_eq!(client.parent_span_id, span_id(&cx));
    assert_eq!(server.parent_span_id, client.span_context.span_id());
    assert_eq!(events(client, "item"), 5, "an event per item taken");
    assert_eq!(seqs(client, "item"), [1, 2, 3, 4, 5]);
    assert_eq!(events(server, "item"), 5, "an event per item sent");
    assert_eq!(seqs(server, "item"), [1, 2, 3, 4, 5]);
    assert_eq!(attr(client, "capwire.outcome").as_deref(), Some("ok"));
    assert_eq!(attr(server, "capwire.outcome").as_deref(), Some("ok"));
    a.shutdown().await;
    b.shutdown().await;
}

// ---------------------------------------------------------------------
// (d) Tasks.

/// The task spans of task `id` among `spans`.
fn task_spans<'a>(spans: &'a [SpanData], id: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|s| attr(s, "capwire.task").as_deref() == Some(id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_handler_runs_in_a_span_under_its_submit() {
    let (b, _) = started("worker").await;
    let a = plain("client").await;
    let peer = connect(&a, &b).await;

    let (cx, trace) = root_context();
    let task = peer.with_trace(cx.clone()).submit(Chores, 3).await.unwrap();
    assert_eq!(task.result().await.unwrap(), 3);
    let id = task.id().to_owned();
    let spans = spans_until(trace, "the task's span ended", |s| {
        task_spans(s, &id).len() == 1 && has(s, &SpanKind::Server, "chores", 1)
    })
    .await;
    let submit_client = one(&spans, &SpanKind::Client, "chores");
    let submit_server = one(&spans, &SpanKind::Server, "chores");
    assert_eq!(submit_client.parent_span_id, span_id(&cx));
    assert_eq!(
        submit_server.parent_span_id,
        submit_client.span_context.span_id()
    );
    let run = task_spans(&spans, &id)[0];
    assert_eq!(run.span_kind, SpanKind::Internal);
    assert_eq!(
        run.parent_span_id,
        submit_server.span_context.span_id(),
        "the task's span is a child of its submit's server span"
    );
    assert_eq!(attr(run, "rpc.method").as_deref(), Some("chores"));
    assert_eq!(attr(run, "capwire.outcome").as_deref(), Some("ok"));
    assert!(!is_error(run));
    assert_eq!(events(run, "state"), 1, "working: {:?}", run.events.events);
    assert_eq!(events(run, "progress"), 3);
    assert_eq!(events(run, "result"), 1);
    assert_eq!(events(run, "error"), 0);
    // Events carry the task's event numbers: submitted is 1, working 2.
    assert_eq!(seqs(run, "state"), [2]);
    assert_eq!(seqs(run, "progress"), [3, 4, 5]);
    assert_eq!(seqs(run, "result"), [6]);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_question_and_its_answer_are_events_of_its_trace() {
    let (b, _) = started("worker").await;
    let a = plain("client").await;
    let peer = connect(&a, &b).await;

    let (cx, trace) = root_context();
    let task = peer.with_trace(cx.clone()).submit(Quiz, ()).await.unwrap();
    let mut events_of = task.events(1).await.unwrap();
    while let Some(e) = events_of.next().await {
        if e.unwrap().state == capwire::manifest::TaskState::InputRequired {
            task.respond(&7u32).await.unwrap();
        }
    }
    assert_eq!(task.result().await.unwrap(), 7);
    let id = task.id().to_owned();
    let spans = spans_until(trace, "the quiz's span ended", |s| {
        task_spans(s, &id).len() == 1
    })
    .await;
    let run = task_spans(&spans, &id)[0];
    // submitted 1, working 2, the question 3, its answer 4, the result 5.
    assert_eq!(seqs(run, "question"), [3], "{:?}", run.events.events);
    assert_eq!(seqs(run, "result"), [5]);
    // The answer is written by `core.tasks/respond`, not by the handler:
    // an event of the task's span or of the respond's server span, but
    // one of this trace.
    let answers: Vec<i64> = spans.iter().flat_map(|s| seqs(s, "answer")).collect();
    assert_eq!(
        answers,
        [4],
        "the answer is an event of the trace: {:#?}",
        spans
            .iter()
            .map(|s| (
                s.name.clone(),
                s.events.iter().map(|e| e.name.clone()).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_task_stays_in_its_trace_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let key = Keypair::generate().unwrap();
    let (builder, _) = server("worker");
    let w = builder
        .state_dir(dir.path().join("node"))
        .keypair(key.clone())
        .start()
        .await
        .unwrap();
    let client = plain("client").await;
    let peer = connect(&client, &w).await;

    let (cx, trace) = root_context();
    let task = peer
        .with_trace(cx.clone())
        .submit(Steps, StepArgs { n: 4, pause: 1 })
        .await
        .unwrap();
    let id = task.id().to_owned();
    core_helpers::eventually("the first step is written", || async {
        task.get()
            .await
            .is_ok_and(|i| i.progress.decode::<u32>().ok() == Some(1))
    })
    .await;
    w.shutdown().await;
    drop(w);
    // The first run's span ends with the node.
    let spans = spans_until(trace, "the first run's span ended", |s| {
        task_spans(s, &id).len() == 1
    })
    .await;
    let submit_server = one(&spans, &SpanKind::Server, "steps");
    let first = task_spans(&spans, &id)[0].clone();
    assert_eq!(first.parent_span_id, submit_server.span_context.span_id());
    assert_eq!(events(&first, "progress"), 1);
    let submit_server_id = submit_server.span_context.span_id();

    let (builder, _) = server("worker");
    let w = builder
        .state_dir(dir.path().join("node"))
        .keypair(key)
        .start()
        .await
        .unwrap();
    let peer = connect(&client, &w).await;
    assert_eq!(peer.task::<u32>(&id).result().await.unwrap(), 4);
    let spans = spans_until(trace, "the resumed run's span ended", |s| {
        task_spans(s, &id).len() == 2
    })
    .await;
    let resumed = task_spans(&spans, &id)
        .into_iter()
        .find(|s| s.span_context.span_id() != first.span_context.span_id())
        .unwrap();
    assert_eq!(
        resumed.span_context.trace_id(),
        trace,
        "the resumed handler is in its submit's trace"
    );
    assert_eq!(
        resumed.parent_span_id, submit_server_id,
        "and under its submit's server span"
    );
    assert_eq!(attr(resumed, "capwire.outcome").as_deref(), Some("ok"));
    assert_eq!(
        seqs(resumed, "progress").len(),
        3,
        "the steps after the restart: {:?}",
        resumed.events.events
    );
    assert_eq!(events(resumed, "result"), 1);
    client.shutdown().await;
    w.shutdown().await;
}

// ---------------------------------------------------------------------
// (e) The chokepoint's own answers, and grants.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_is_a_server_span_and_a_granted_one_names_its_grant() {
    exporter();
    let bound = bind_new(listening("agent")).await;
    let worker = plain("worker").await;
    let from_worker = connect(&worker, &bound.node).await;

    // Not the control plane: refused, and still a server span.
    let (cx, trace) = root_context();
    let body = denied(
        from_worker
            .with_trace(cx.clone())
            .request(GetConfig, NoArgs {})
            .await,
    );
    assert_eq!(body.code, ErrorCode::Unauthorized);
    let spans = spans_until(trace, "the refusal's spans ended", |s| {
        has(s, &SpanKind::Client, "get_config", 1) && has(s, &SpanKind::Server, "get_config", 1)
    })
    .await;
    let client = one(&spans, &SpanKind::Client, "get_config");
    let server = one(&spans, &SpanKind::Server, "get_config");
    assert_eq!(server.parent_span_id, client.span_context.span_id());
    assert_eq!(
        attr(server, "capwire.outcome").as_deref(),
        Some("unauthorized")
    );
    assert_eq!(attr(server, "capwire.class").as_deref(), Some("controller"));
    assert!(
        is_error(server),
        "a refusal is an error: {:?}",
        server.status
    );
    assert_eq!(
        attr(client, "capwire.outcome").as_deref(),
        Some("unauthorized")
    );
    assert!(is_error(client));

    // Through a grant: the server span names it.
    let token = bound
        .cp
        .grant(
            &bound.peer,
            worker.id(),
            worker.grant_key(),
            vec![Right::verb("core.configuration", "get_config")],
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let grant = from_worker.present(&token).await.unwrap().grant;
    let (cx, trace) = root_context();
    from_worker
        .with_trace(cx)
        .request(GetConfig, NoArgs {})
        .await
        .unwrap();
    let spans = spans_until(trace, "the granted call's server span ended", |s| {
        has(s, &SpanKind::Server, "get_config", 1)
    })
    .await;
    let server = one(&spans, &SpanKind::Server, "get_config");
    assert_eq!(attr(server, "capwire.grant"), Some(grant));
    assert_eq!(attr(server, "capwire.outcome").as_deref(), Some("ok"));
    assert!(!is_error(server));
    worker.shutdown().await;
    bound.cp.shutdown().await;
    bound.node.shutdown().await;
}
