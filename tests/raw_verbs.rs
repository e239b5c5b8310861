//! Verbs declared at run time (`Capability::handle_raw`): served over real
//! sessions like typed verbs, behind the same chokepoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capwire::envelope::{ErrorCode, RawValue};
use capwire::manifest::{DeclaredClass, verb};
use capwire::{
    Addr, CallError, Capability, HandlerError, Items, Meta, Node, NodeId, RawVerb, Sender,
};
use tokio::sync::mpsc;

verb! { /** The raw `greet` verb as a typed caller sees it. */ pub struct Greet: request "app.raw" / "greet", Bootstrap, String => String; }

const SECOND: Duration = Duration::from_secs(5);

fn bad_args(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(ErrorCode::BadArgs, e.to_string())
}

async fn server(ran: Arc<AtomicUsize>, notes: mpsc::UnboundedSender<(NodeId, String)>) -> Node {
    let greet = move |args: RawValue, _: Sender, meta: Meta| async move {
        assert!(!meta.req_id.is_fire_and_forget());
        let name: String = args.decode().map_err(bad_args)?;
        Ok(RawValue::encode(&format!("hello, {name}")).unwrap())
    };
    let ran_admin = ran.clone();
    let admin = move |_: RawValue, _: Sender, _: Meta| {
        ran_admin.fetch_add(1, Ordering::SeqCst);
        async { Ok(RawValue::null()) }
    };
    let note = move |args: RawValue, Sender(from): Sender, _: Meta| {
        let notes = notes.clone();
        async move {
            notes
                .send((from, args.decode().map_err(bad_args)?))
                .unwrap();
            Ok(RawValue::null())
        }
    };
    let cap = Capability::new("app.raw", "1.0.0")
        .unwrap()
        .handle_raw(
            RawVerb::request("greet", DeclaredClass::Bootstrap)
                .args_schema(&serde_json::json!({"type": "string"}))
                .result_schema(&serde_json::json!({"type": "string"})),
            greet,
        )
        .handle_raw(RawVerb::request("admin", DeclaredClass::Controller), admin)
        .handle_raw(
            RawVerb::notification("note", DeclaredClass::Bootstrap),
            note,
        )
        .handle_raw_stream(
            RawVerb::stream("count", DeclaredClass::Bootstrap)
                .result_schema(&serde_json::json!({"type": "integer"})),
            count,
        );
    Node::builder("raw-server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(cap)
        .start()
        .await
        .unwrap()
}

/// Items 0..n, for `n` given as args.
async fn count(
    args: RawValue,
    mut items: Items<RawValue>,
    _: Sender,
    _: Meta,
) -> Result<(), HandlerError> {
    let n: u32 = args.decode().map_err(bad_args)?;
    for i in 0..n {
        items.send(RawValue::encode(&i).unwrap()).await?;
    }
    Ok(())
}

#[tokio::test]
async fn raw_verbs_are_served_checked_and_shown_like_typed_ones() {
    let ran = Arc::new(AtomicUsize::new(0));
    let (tx, mut notes) = mpsc::unbounded_channel();
    let server = server(ran.clone(), tx).await;
    let client = Node::builder("raw-client").start().await.unwrap();
    let addr: Addr = server.local_addrs()[0].clone();
    let peer = client.connect(&addr, Some(server.id())).await.unwrap();

    // A typed caller and an untyped one get the handler's answer.
    let typed = peer.request(Greet, "ada".to_owned()).await.unwrap();
    assert_eq!(typed, "hello, ada");
    let raw = peer
        .call_raw(
            "app.raw",
            "greet",
            &RawValue::encode("bob").unwrap(),
            SECOND,
        )
        .await
        .unwrap();
    assert_eq!(raw.decode::<String>().unwrap(), "hello, bob");

    // Args the handler cannot read are `bad_args`, from the handler.
    let err = peer
        .call_raw(
            "app.raw",
            "greet",
            &RawValue::encode(&7u32).unwrap(),
            SECOND,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Remote(body) if body.code == ErrorCode::BadArgs),
        "{err:?}"
    );

    // A controller verb of an unbound node is refused at the chokepoint:
    // the handler never runs.
    let err = peer
        .call_raw("app.raw", "admin", &RawValue::null(), SECOND)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Denied(body) if body.code == ErrorCode::Unauthorized),
        "{err:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);

    // A notification reaches its handler with the sender's proven id.
    peer.notify_raw("app.raw", "note", &RawValue::encode("ping").unwrap())
        .await
        .unwrap();
    let (from, text) = tokio::time::timeout(SECOND, notes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((from, text.as_str()), (client.id(), "ping"));

    // A stream's items arrive in order, then it ends well.
    let mut stream = peer
        .stream_raw("app.raw", "count", &RawValue::encode(&5u32).unwrap(), None)
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(item) = stream.next().await {
        got.push(item.unwrap().decode::<u32>().unwrap());
    }
    assert_eq!(got, [0, 1, 2, 3, 4]);

    // The manifest shows the declared kinds, classes and schemas.
    let manifest = peer.manifest().unwrap();
    let cap = manifest.capability("app.raw").unwrap();
    let greet = cap.verb("greet").unwrap();
    assert_eq!(greet.class, DeclaredClass::Bootstrap);
    let schema: serde_json::Value =
        serde_json::from_str(greet.args_schema.as_deref().unwrap()).unwrap();
    assert_eq!(schema, serde_json::json!({"type": "string"}));
    assert_eq!(cap.verb("admin").unwrap().class, DeclaredClass::Controller);
    assert!(cap.verb("note").unwrap().result_schema.is_none());
    let count = cap.verb("count").unwrap();
    assert_eq!(count.kind, capwire::manifest::VerbKind::Stream);
    assert_eq!(
        count.result_schema.as_deref(),
        Some(r#"{"type":"integer"}"#)
    );

    client.shutdown().await;
    server.shutdown().await;
}

/// Starts a node with `cap` and expects it refused, naming `verb`.
async fn assert_refused_at_build(cap: Capability, verb: &str) {
    let err = Node::builder("raw-bad")
        .capability(cap)
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(verb), "{err}");
}

#[tokio::test]
async fn a_raw_notification_with_a_result_schema_is_refused_at_build() {
    let cap = Capability::new("app.raw", "1.0.0").unwrap().handle_raw(
        RawVerb::notification("note", DeclaredClass::Bootstrap)
            .result_schema(&serde_json::json!({"type": "string"})),
        |_: RawValue, _: Sender, _: Meta| async { Ok(RawValue::null()) },
    );
    assert_refused_at_build(cap, "note").await;
}

#[tokio::test]
async fn a_stream_verb_given_a_request_handler_is_refused_at_build() {
    let cap = Capability::new("app.raw", "1.0.0").unwrap().handle_raw(
        RawVerb::stream("count", DeclaredClass::Bootstrap),
        |_: RawValue, _: Sender, _: Meta| async { Ok(RawValue::null()) },
    );
    assert_refused_at_build(cap, "count").await;
}

#[tokio::test]
async fn a_task_verb_given_a_request_handler_is_refused_at_build() {
    let cap = Capability::new("app.raw", "1.0.0").unwrap().handle_raw(
        RawVerb::task("work", DeclaredClass::Bootstrap),
        |_: RawValue, _: Sender, _: Meta| async { Ok(RawValue::null()) },
    );
    assert_refused_at_build(cap, "work").await;
}

/// Sums 1..=n, reporting each partial sum, after asking whether to go on.
async fn sum_upto(
    args: RawValue,
    task: capwire::Task,
    _: Sender,
    _: Meta,
) -> Result<RawValue, HandlerError> {
    let n: u64 = args.decode().map_err(bad_args)?;
    let go: bool = task
        .ask(&format!("sum up to {n}?"), SECOND)
        .await
        .map_err(|e| HandlerError::new(ErrorCode::Internal, e.to_string()))?;
    if !go {
        return Err(HandlerError::new(ErrorCode::Cancelled, "declined"));
    }
    let mut total = 0u64;
    for i in 1..=n {
        total += i;
        task.progress(&total).await?;
    }
    Ok(RawValue::encode(&total).unwrap())
}

#[tokio::test]
async fn a_raw_task_is_submitted_asks_reports_and_ends_with_its_result() {
    use capwire::manifest::{TaskEventKind, TaskState};
    let cap = Capability::new("app.raw", "1.0.0")
        .unwrap()
        .handle_raw_task(
            RawVerb::task("sum", DeclaredClass::Bootstrap)
                .args_schema(&serde_json::json!({"type": "integer"})),
            false,
            sum_upto,
        );
    let server = Node::builder("raw-tasks")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(cap)
        .start()
        .await
        .unwrap();
    let client = Node::builder("raw-client").start().await.unwrap();
    let peer = client
        .connect(&server.local_addrs()[0], Some(server.id()))
        .await
        .unwrap();
    assert_eq!(
        peer.manifest()
            .unwrap()
            .capability("app.raw")
            .unwrap()
            .verb("sum")
            .unwrap()
            .kind,
        capwire::manifest::VerbKind::Task
    );

    let task = peer
        .submit_raw(
            "app.raw",
            "sum",
            &RawValue::encode(&4u64).unwrap(),
            None,
            SECOND,
        )
        .await
        .unwrap();
    let mut events = task.events(1).await.unwrap();
    let mut progress = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.unwrap();
        match event.kind {
            TaskEventKind::Question => {
                let asked: String = event.body.decode().unwrap();
                assert_eq!(asked, "sum up to 4?");
                task.respond(&true).await.unwrap();
            }
            TaskEventKind::Progress => progress.push(event.body.decode::<u64>().unwrap()),
            _ => {}
        }
        if event.state.is_final() {
            assert_eq!(event.state, TaskState::Completed);
        }
    }
    assert_eq!(progress, [1, 3, 6, 10]);
    assert_eq!(task.result().await.unwrap().decode::<u64>().unwrap(), 10);

    // A verb the peer does not have is refused at its chokepoint.
    let err = peer
        .submit_raw("app.raw", "nope", &RawValue::null(), None, SECOND)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Denied(body) if body.code == ErrorCode::UnknownVerb),
        "{err:?}"
    );
    client.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_checked_raw_task_refuses_bad_args_before_the_task_exists() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let check = |args: RawValue, _: Sender, _: Meta| async move {
        args.decode::<u64>().map(drop).map_err(bad_args)
    };
    let cap = Capability::new("app.raw", "1.0.0")
        .unwrap()
        .handle_raw_task_checked(
            RawVerb::task("sum", DeclaredClass::Bootstrap),
            false,
            check,
            move |args: RawValue, _: capwire::Task, _: Sender, _: Meta| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok(args) }
            },
        );
    let server = Node::builder("raw-checked")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(cap)
        .start()
        .await
        .unwrap();
    let client = Node::builder("raw-client").start().await.unwrap();
    let peer = client
        .connect(&server.local_addrs()[0], Some(server.id()))
        .await
        .unwrap();
    let err = peer
        .submit_raw(
            "app.raw",
            "sum",
            &RawValue::encode("ten").unwrap(),
            None,
            SECOND,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Remote(body) if body.code == ErrorCode::BadArgs),
        "{err:?}"
    );
    let kept: usize = server.stats().tasks.iter().map(|(_, n)| n).sum();
    assert_eq!(kept, 0, "no task was written");
    let task = peer
        .submit_raw(
            "app.raw",
            "sum",
            &RawValue::encode(&10u64).unwrap(),
            None,
            SECOND,
        )
        .await
        .unwrap();
    assert_eq!(task.result().await.unwrap().decode::<u64>().unwrap(), 10);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    client.shutdown().await;
    server.shutdown().await;
}
