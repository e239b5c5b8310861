//! Tasks (WIRE.md 4.10) under attack, from hand-made frames.
//!
//! The attacker submits `app.adv`'s task verbs and calls `core.tasks` with
//! raw CBOR: it probes the ids of other senders' tasks, sends ids that are
//! not ids, floods submits past the quotas, sends bodies past
//! `max_task_body`, answers out of turn, with the wrong type and twice,
//! races cancels against the end, subscribes from absurd seqs and without
//! credit, reads a log past `max_task_events`, speaks protocol 1,
//! retries submits whose answers it lost or cancelled, and forges
//! `core.tasks/changed` pushes. Each outcome is the
//! one WIRE.md 4.10 (and 4.3, 4.4, 4.8, 4.9) gives; the harness then
//! checks, as for every attack, that the node let go of everything and
//! serves an honest peer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use capwire::Keypair;
use capwire::envelope::{ErrorBody, ErrorCode, Frame, RawValue, ReqId, ResponseEnvelope};
use capwire::manifest::{TaskEvent, TaskEventKind, TaskInfo, TaskList, TaskState, TaskSubmitted};

use crate::kit::arena::{Arena, Expect, Setup, until};
use crate::kit::cap::{BigArgs, get};
use crate::kit::cbor::{NULL, bytes, cancel, control, credit, text, tmap, uint};
use crate::kit::chokepoint::ask;
use crate::kit::wire::{Wire, args};
use crate::kit::{err_code, ok_text};

/// The node of the task attacks: small bodies (1 KiB), a short log (8
/// events), quotas no attack reaches but the one about them, and an idle
/// bound for streams (10 s) that only the attack about it waits for.
pub fn tasks_setup() -> Setup {
    Setup::tcp().limits(|l| {
        l.max_tasks = 64;
        l.max_tasks_per_sender = 32;
        l.max_task_events = 8;
        l.max_task_body = 1024;
        l.stream_idle_timeout = Duration::from_secs(10);
    })
}

/// A fresh req_id (each attack's frames need their own).
fn rid(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `{"task": id}`.
fn task_ref(id: &str) -> Vec<u8> {
    tmap(&[("task", text(id))])
}

/// Encoded args of `big`.
fn big(progress: u32, result: u32, pad: usize) -> Vec<u8> {
    args(&BigArgs {
        progress,
        result,
        pad: "x".repeat(pad),
    })
    .as_bytes()
    .to_vec()
}

/// The result of a successful response, decoded (panics on an error).
#[track_caller]
fn ok_as<T: serde::de::DeserializeOwned>(r: &ResponseEnvelope) -> T {
    match &r.outcome {
        Ok(v) => v.decode().unwrap(),
        Err(e) => panic!("expected success, got {e:?}"),
    }
}

/// The error of a response, encoded as the wire has it (panics on
/// success).
#[track_caller]
fn err_bytes(r: &ResponseEnvelope) -> Vec<u8> {
    match &r.outcome {
        Err(e) => capwire::envelope::to_vec(e).unwrap(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[track_caller]
fn err_of(r: &ResponseEnvelope) -> ErrorBody {
    match &r.outcome {
        Err(e) => e.clone(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// Submits task verb `verb` of `app.adv` with `req_id`; the response.
async fn submit(w: &mut Wire, verb: &str, req_id: &str, args: Vec<u8>) -> ResponseEnvelope {
    ask(w, "app.adv", verb, req_id, args).await
}

/// Submits and expects a task; its id.
async fn submitted(w: &mut Wire, verb: &str, args: Vec<u8>) -> String {
    let r = submit(w, verb, &rid("submit"), args).await;
    let s: TaskSubmitted = ok_as(&r);
    assert_eq!(
        s.state,
        TaskState::Submitted,
        "a new task answers submitted"
    );
    assert_eq!(s.task.len(), 32);
    s.task
}

/// Calls `core.tasks/<verb>`.
async fn tasks(w: &mut Wire, verb: &str, args: Vec<u8>) -> ResponseEnvelope {
    ask(w, "core.tasks", verb, &rid(verb), args).await
}

/// `core.tasks/get`, expecting the info.
async fn info(w: &mut Wire, id: &str) -> TaskInfo {
    ok_as(&tasks(w, "get", task_ref(id)).await)
}

/// The sender's tasks (one page of 200).
async fn list(w: &mut Wire) -> Vec<TaskInfo> {
    let l: TaskList = ok_as(&tasks(w, "list", tmap(&[("limit", uint(200))])).await);
    l.tasks
}

/// Polls `get` until the task is in a state `done` accepts (10 s).
async fn until_state(w: &mut Wire, id: &str, done: impl Fn(TaskState) -> bool) -> TaskInfo {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let i = info(w, id).await;
        if done(i.state) {
            return i;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} stayed {:?}",
            i.state
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn until_final(w: &mut Wire, id: &str) -> TaskInfo {
    until_state(w, id, TaskState::is_final).await
}

/// Opens a subscription `req_id` to `id` from `from` (any CBOR) with
/// `window` items of credit.
async fn open_subscription(
    w: &mut Wire,
    req_id: &str,
    id: &str,
    from: Option<Vec<u8>>,
    window: u64,
) {
    let mut pairs = vec![("task", text(id))];
    if let Some(from) = from {
        pairs.push(("from", from));
    }
    let open = control("core.tasks", "subscribe", req_id, tmap(&pairs));
    if window == 0 {
        w.send(&[&open]).await;
    } else {
        w.send(&[&open, &credit(req_id, window, 1 << 30)]).await;
    }
}

/// A whole subscription from `from`: its events and its one response.
async fn subscription(
    w: &mut Wire,
    id: &str,
    from: Option<Vec<u8>>,
) -> (Vec<TaskEvent>, ResponseEnvelope) {
    let req_id = rid("sub");
    open_subscription(w, &req_id, id, from, 1 << 20).await;
    let r = w.response(&req_id).await;
    (w.items_of::<TaskEvent>(&req_id), r)
}

/// Events `events` are numbered `from`, `from + 1`, ... without a gap,
/// and only the last is final.
#[track_caller]
fn consecutive(events: &[TaskEvent], from: u64) {
    for (n, e) in (from..).zip(events) {
        assert_eq!(e.seq, n, "events in order, without a gap: {events:?}");
    }
    let finals = events.iter().filter(|e| e.state.is_final()).count();
    if let Some(last) = events.last()
        && last.state.is_final()
    {
        assert_eq!(finals, 1, "one final event, the last: {events:?}");
    } else {
        assert_eq!(finals, 0, "{events:?}");
    }
}

/// The args of a verb for a task id.
type ArgsOf = fn(&str) -> Vec<u8>;

/// A random id, as well-formed as any task's.
fn random_id() -> String {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------

/// Another sender probes a task's id with every verb of `core.tasks`: the
/// answers are byte for byte the ones a random id gets (`not_found`, "no
/// such task"), `list` shows it nothing (and refuses to page from the
/// task), and the task goes on untouched for its submitter.
pub async fn probing_the_task_ids_of_others(a: Arena) -> Expect {
    let owner_key = Keypair::generate().unwrap();
    let mut owner = a.wire_as(&owner_key).await;
    let theirs = submitted(&mut owner, "wait", vec![NULL]).await;
    until("the task's handler runs", || {
        get(&a.tally.task_started) == 1
    })
    .await;
    let mut prober = a.wire().await;
    let unknown = random_id();
    let probes: [(&str, ArgsOf); 5] = [
        ("get", task_ref),
        ("cancel", task_ref),
        ("respond", |id| {
            tmap(&[("task", text(id)), ("answer", uint(1))])
        }),
        ("respond", |id| {
            tmap(&[
                ("task", text(id)),
                ("answer", text(&"a".repeat(4096))),
                ("question_seq", uint(3)),
            ])
        }),
        ("list", |id| tmap(&[("before", text(id))])),
    ];
    for (verb, args) in &probes {
        let on_theirs = tasks(&mut prober, verb, args(&theirs)).await;
        let on_none = tasks(&mut prober, verb, args(&unknown)).await;
        assert_eq!(
            err_code(&on_theirs),
            ErrorCode::NotFound,
            "{verb}: {on_theirs:?}"
        );
        assert_eq!(
            err_bytes(&on_theirs),
            err_bytes(&on_none),
            "{verb}: another's task answers exactly as no task"
        );
        if *verb != "list" {
            assert_eq!(err_of(&on_theirs).message, "no such task");
        }
    }
    for from in [None, Some(uint(0)), Some(uint(1)), Some(uint(u64::MAX))] {
        let (items, on_theirs) = subscription(&mut prober, &theirs, from.clone()).await;
        assert!(items.is_empty(), "no event of another's task");
        let (_, on_none) = subscription(&mut prober, &unknown, from).await;
        assert_eq!(err_code(&on_theirs), ErrorCode::NotFound);
        assert_eq!(err_bytes(&on_theirs), err_bytes(&on_none), "subscribe");
    }
    assert!(
        list(&mut prober).await.is_empty(),
        "list shows another's task"
    );
    // The same req_id as the owner's submit, from the prober: its own
    // (sender, req_id), never the owner's task.
    let mine = submitted(&mut prober, "chores", uint(1)).await;
    assert_ne!(mine, theirs);

    // Untouched: still running, its submitter sees it whole.
    let i = info(&mut owner, &theirs).await;
    assert_eq!((i.state, i.seq), (TaskState::Working, 2), "{i:?}");
    let (mine_list, theirs_list) = (list(&mut prober).await, list(&mut owner).await);
    assert_eq!(
        mine_list.iter().map(|t| &t.task).collect::<Vec<_>>(),
        [&mine]
    );
    assert_eq!(
        theirs_list.iter().map(|t| &t.task).collect::<Vec<_>>(),
        [&theirs]
    );
    let i = ok_as::<TaskInfo>(&tasks(&mut owner, "cancel", task_ref(&theirs)).await);
    assert_eq!(i.state, TaskState::Canceled);
    until("both handlers end", || get(&a.tally.task_ended) == 2).await;
    Expect::nothing()
}

/// Ids that are not 32 lowercase hex digits, in every verb that takes
/// one: `bad_args`, never `not_found` (an id of another case or length is
/// never taken for a task's), and the session goes on.
pub async fn malformed_task_ids(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let real = submitted(&mut w, "wait", vec![NULL]).await;
    let texts = [
        String::new(),
        real[..31].to_owned(),
        format!("{real}0"),
        real.to_uppercase(),
        "g".repeat(32),
        format!("{}\0", &real[..31]),
        "é".repeat(16),
        format!(" {}", &real[..31]),
        "0x".to_owned() + &real[..30],
        "a".repeat(60_000),
    ];
    let mut ids: Vec<Vec<u8>> = texts.iter().map(|t| text(t)).collect();
    ids.extend([
        uint(5),
        bytes(&[0xab; 16]),
        vec![NULL],
        tmap(&[("task", text(&real))]),
    ]);
    for id in &ids {
        for (verb, args) in [
            ("get", tmap(&[("task", id.clone())])),
            ("cancel", tmap(&[("task", id.clone())])),
            (
                "respond",
                tmap(&[("task", id.clone()), ("answer", uint(1))]),
            ),
            ("list", tmap(&[("before", id.clone())])),
        ] {
            let r = tasks(&mut w, verb, args).await;
            if verb == "list" && id == &vec![NULL] {
                // `before: null` is no `before` at all (WIRE.md 4.10).
                assert!(r.outcome.is_ok(), "{r:?}");
                continue;
            }
            assert_eq!(
                err_code(&r),
                ErrorCode::BadArgs,
                "{verb} {:?}: {r:?}",
                &id[..id.len().min(8)]
            );
        }
        let req_id = rid("sub");
        w.send(&[
            &control(
                "core.tasks",
                "subscribe",
                &req_id,
                tmap(&[("task", id.clone())]),
            ),
            &credit(&req_id, 16, 1 << 20),
        ])
        .await;
        let r = w.response(&req_id).await;
        assert_eq!(err_code(&r), ErrorCode::BadArgs, "subscribe: {r:?}");
        assert!(w.items_of::<TaskEvent>(&req_id).is_empty());
    }
    // Nothing happened to the real task.
    let i = info(&mut w, &real).await;
    assert!(!i.state.is_final(), "{i:?}");
    let r = ask(&mut w, "app.adv", "echo", &rid("echo"), text("still")).await;
    assert_eq!(ok_text(&r), "echo: still");
    tasks(&mut w, "cancel", task_ref(&real)).await;
    until("the handler ends", || {
        get(&a.tally.task_ended) == get(&a.tally.task_started)
    })
    .await;
    Expect::runs(1)
}

/// Submits in one burst past `max_tasks_per_sender` (4), and from other
/// senders past `max_tasks` (8): the excess is answered `overloaded` and
/// makes no task; a retry of an accepted submit still finds its task;
/// ended tasks keep counting until their retention passes; the senders'
/// tasks, and other verbs, are served throughout.
pub async fn a_submit_flood_past_the_task_quotas(a: Arena) -> Expect {
    let mut first = a.wire().await;
    let ids: Vec<String> = (0..12).map(|i| format!("flood-{i}")).collect();
    let burst: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| control("app.adv", "wait", id, vec![NULL]))
        .collect();
    first.send_batched(&burst).await;
    let mut accepted = Vec::new();
    for id in &ids {
        let r = first.response(id).await;
        match &r.outcome {
            Ok(v) => accepted.push((id.clone(), v.decode::<TaskSubmitted>().unwrap().task)),
            Err(e) => assert_eq!(e.code, ErrorCode::Overloaded, "{e:?}"),
        }
    }
    assert_eq!(accepted.len(), 4, "max_tasks_per_sender");
    assert_eq!(
        list(&mut first).await.len(),
        4,
        "an overloaded submit makes no task"
    );

    // Two more senders fill the node (8), a third finds it full.
    let mut second = a.wire().await;
    let mut third = a.wire().await;
    let mut ok = 0;
    for n in 0..6 {
        let w = if n < 4 { &mut second } else { &mut third };
        let r = submit(w, "wait", &rid("fill"), vec![NULL]).await;
        match &r.outcome {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::Overloaded, "{e:?}"),
        }
    }
    assert_eq!(ok, 4, "max_tasks: 8 in all");
    let mut fourth = a.wire().await;
    let r = submit(&mut fourth, "chores", &rid("late"), uint(1)).await;
    assert_eq!(err_code(&r), ErrorCode::Overloaded, "{r:?}");
    assert!(list(&mut fourth).await.is_empty());
    // Everyone is served otherwise.
    for w in [&mut first, &mut second, &mut third, &mut fourth] {
        let r = ask(w, "app.adv", "echo", &rid("echo"), text("served")).await;
        assert_eq!(ok_text(&r), "echo: served");
    }
    // An accepted submit, retried: its task, not `overloaded`.
    let (req_id, task) = &accepted[0];
    let r = submit(&mut first, "wait", req_id, vec![NULL]).await;
    assert_eq!(&ok_as::<TaskSubmitted>(&r).task, task);
    until("8 handlers run", || get(&a.tally.task_started) == 8).await;
    // The first sender's tasks end; they count until their retention.
    for (_, task) in &accepted {
        let i = ok_as::<TaskInfo>(&tasks(&mut first, "cancel", task_ref(task)).await);
        assert_eq!(i.state, TaskState::Canceled);
    }
    let r = submit(&mut first, "wait", &rid("again"), vec![NULL]).await;
    assert_eq!(
        err_code(&r),
        ErrorCode::Overloaded,
        "ended tasks still count"
    );
    let r = submit(&mut fourth, "wait", &rid("again"), vec![NULL]).await;
    assert_eq!(err_code(&r), ErrorCode::Overloaded);
    // The others' tasks run on, and end when told.
    a.tally.release_tasks.add_permits(4);
    until("all 8 end", || get(&a.tally.task_ended) == 8).await;
    let second_tasks = list(&mut second).await;
    let third_tasks = list(&mut third).await;
    assert_eq!(second_tasks.len() + third_tasks.len(), 4);
    for t in second_tasks.iter().chain(&third_tasks) {
        assert_eq!(t.state, TaskState::Completed, "{t:?}");
    }
    Expect::runs(4)
}

/// Bodies past `max_task_body` (1 KiB): args are answered `too_large`
/// and make no task; a progress or a result too large ends the task
/// `failed` with `too_large` (never stuck), and an answer too large is
/// refused while the question goes on waiting for one that fits.
pub async fn oversized_task_args_progress_and_results(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let r = submit(&mut w, "big", &rid("args"), big(0, 0, 2000)).await;
    assert_eq!(err_code(&r), ErrorCode::TooLarge, "{r:?}");
    assert!(list(&mut w).await.is_empty(), "too large args make no task");

    for (progress, result) in [(2000, 0), (0, 2000), (1000, 0)] {
        let id = submitted(&mut w, "big", big(progress, result, 0)).await;
        let i = until_final(&mut w, &id).await;
        let (events, end) = subscription(&mut w, &id, None).await;
        assert!(end.outcome.is_ok(), "{end:?}");
        consecutive(&events, 1);
        let last = events.last().unwrap();
        assert_eq!(last.seq, i.seq);
        if progress + result >= 2000 {
            assert_eq!(i.state, TaskState::Failed, "{i:?}");
            assert_eq!(i.error.as_ref().unwrap().code, ErrorCode::TooLarge, "{i:?}");
            assert_eq!(last.kind, TaskEventKind::Error);
            assert_eq!(
                last.body.decode::<ErrorBody>().unwrap().code,
                ErrorCode::TooLarge
            );
            assert!(
                events.iter().all(|e| e.kind != TaskEventKind::Progress),
                "the progress that did not fit was not written"
            );
        } else {
            // A body of 1000 bytes of text (1003 encoded) fits.
            assert_eq!(i.state, TaskState::Completed, "{i:?}");
            assert_eq!(i.progress.decode::<String>().unwrap().len(), 1000);
        }
    }

    let quiz = submitted(&mut w, "quiz", uint(1)).await;
    let asking = until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&quiz)), ("answer", text(&"a".repeat(2000)))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::TooLarge, "{r:?}");
    let still = info(&mut w, &quiz).await;
    assert_eq!(
        (still.state, still.seq, still.question_seq),
        (TaskState::InputRequired, asking.seq, asking.question_seq),
        "the question still waits"
    );
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&quiz)), ("answer", uint(7))]),
    )
    .await;
    assert!(r.outcome.is_ok(), "{r:?}");
    let done = until_final(&mut w, &quiz).await;
    assert_eq!(done.result.decode::<u32>().unwrap(), 7);
    until("the handlers end", || get(&a.tally.task_ended) == 4).await;
    assert_eq!(get(&a.tally.task_started), 4);
    Expect::nothing()
}

/// `respond` to a task that asks nothing (`conflict`), with an answer of
/// the wrong type (`bad_args`: nothing is written, the question still
/// waits), to another question than the one waited on (`conflict`), and
/// twice at once (one wins, the other is `conflict`; the task goes on
/// with the winner).
pub async fn answers_out_of_turn_of_the_wrong_type_and_twice(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let silent = submitted(&mut w, "wait", vec![NULL]).await;
    until("it runs", || get(&a.tally.task_started) == 1).await;
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&silent)), ("answer", uint(1))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::Conflict, "{r:?}");

    let quiz = submitted(&mut w, "quiz", uint(2)).await;
    let asking = until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
    let q = asking.question_seq.unwrap();
    assert_eq!(asking.question.decode::<String>().unwrap(), "question 0");
    for wrong in [
        text("seven"),
        vec![NULL],
        tmap(&[("n", uint(7))]),
        uint(1 << 40),
    ] {
        let r = tasks(
            &mut w,
            "respond",
            tmap(&[("task", text(&quiz)), ("answer", wrong)]),
        )
        .await;
        assert_eq!(err_code(&r), ErrorCode::BadArgs, "{r:?}");
    }
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[
            ("task", text(&quiz)),
            ("answer", uint(1)),
            ("question_seq", uint(q + 1)),
        ]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::Conflict, "another question: {r:?}");
    let still = info(&mut w, &quiz).await;
    assert_eq!(
        (still.state, still.seq, still.question_seq),
        (TaskState::InputRequired, asking.seq, Some(q)),
        "nothing was written"
    );
    // Two answers in one message: one wins.
    let (r1, r2) = (rid("answer"), rid("answer"));
    w.send(&[
        &control(
            "core.tasks",
            "respond",
            &r1,
            tmap(&[("task", text(&quiz)), ("answer", uint(10))]),
        ),
        &control(
            "core.tasks",
            "respond",
            &r2,
            tmap(&[("task", text(&quiz)), ("answer", uint(20))]),
        ),
    ])
    .await;
    let (r1, r2) = (w.response(&r1).await, w.response(&r2).await);
    let winner = match (&r1.outcome, &r2.outcome) {
        (Ok(_), Err(e)) => {
            assert_eq!(e.code, ErrorCode::Conflict);
            10
        }
        (Err(e), Ok(_)) => {
            assert_eq!(e.code, ErrorCode::Conflict);
            20
        }
        other => panic!("exactly one answer wins: {other:?}"),
    };
    let second = until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
    assert_eq!(second.question.decode::<String>().unwrap(), "question 1");
    // The first question's seq no longer answers anything.
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[
            ("task", text(&quiz)),
            ("answer", uint(1)),
            ("question_seq", uint(q)),
        ]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::Conflict);
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&quiz)), ("answer", uint(5))]),
    )
    .await;
    assert!(r.outcome.is_ok(), "{r:?}");
    let done = until_final(&mut w, &quiz).await;
    assert_eq!(done.result.decode::<u32>().unwrap(), winner + 5);
    let (events, _) = subscription(&mut w, &quiz, None).await;
    consecutive(&events, 1);
    let answers: Vec<u32> = events
        .iter()
        .filter(|e| e.kind == TaskEventKind::Answer)
        .map(|e| e.body.decode().unwrap())
        .collect();
    assert_eq!(answers, [winner, 5], "only the answers taken are written");
    // After the end: conflict, nothing changes.
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&quiz)), ("answer", uint(5))]),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::Conflict);
    assert_eq!(info(&mut w, &quiz).await.seq, done.seq);
    tasks(&mut w, "cancel", task_ref(&silent)).await;
    until("both end", || get(&a.tally.task_ended) == 2).await;
    Expect::nothing()
}

/// Cancels sent the moment a quick task is answered, racing its end:
/// every task ends once, `completed` or `canceled`, its last event the
/// one final event and its info agreeing; a cancel after the end changes
/// nothing.
pub async fn cancel_racing_completion(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let mut ends = [0usize; 2];
    for n in 0..24u64 {
        // Tasks of 0 to 3 steps, so the cancel lands at every point.
        let id = submitted(&mut w, "chores", uint(n % 4)).await;
        let (c1, c2) = (rid("cancel"), rid("cancel"));
        w.send(&[
            &control("core.tasks", "cancel", &c1, task_ref(&id)),
            &control("core.tasks", "cancel", &c2, task_ref(&id)),
        ])
        .await;
        let first: TaskInfo = ok_as(&w.response(&c1).await);
        let second: TaskInfo = ok_as(&w.response(&c2).await);
        let end = until_final(&mut w, &id).await;
        assert_eq!(second.state, end.state, "the second cancel sees the end");
        assert_eq!(second.seq, end.seq);
        if first.state.is_final() {
            assert_eq!(first.seq, end.seq, "nothing after the end");
        }
        let (events, r) = subscription(&mut w, &id, None).await;
        assert!(r.outcome.is_ok());
        consecutive(&events, 1);
        let last = events.last().unwrap();
        assert_eq!((last.seq, last.state), (end.seq, end.state));
        match end.state {
            TaskState::Completed => {
                ends[0] += 1;
                assert_eq!(end.result.decode::<u64>().unwrap(), n % 4);
                assert!(end.error.is_none());
            }
            TaskState::Canceled => {
                ends[1] += 1;
                assert_eq!(end.error.as_ref().unwrap().code, ErrorCode::Cancelled);
                assert_eq!(last.kind, TaskEventKind::Error);
                assert!(end.result.is_null());
            }
            s => panic!("ended {s:?}"),
        }
        let again: TaskInfo = ok_as(&tasks(&mut w, "cancel", task_ref(&id)).await);
        assert_eq!((again.state, again.seq), (end.state, end.seq));
    }
    eprintln!(
        "cancel racing completion: {} completed, {} canceled",
        ends[0], ends[1]
    );
    until("every started handler ends", || {
        get(&a.tally.task_ended) == get(&a.tally.task_started)
    })
    .await;
    assert!(get(&a.tally.task_started) <= 24);
    Expect::nothing()
}

/// Subscriptions from seq 0 (taken as 1), from past the last event and
/// from 2^64-1 (an ended task: the stream ends well at once, with no
/// event; a running one: no event until it ends, then the stream ends
/// well), and from values that are not seqs (`bad_args`).
pub async fn subscribe_from_a_huge_or_zero_seq(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let done = submitted(&mut w, "chores", uint(3)).await;
    let end = until_final(&mut w, &done).await;
    assert_eq!(end.seq, 6);
    let (from_zero, r) = subscription(&mut w, &done, Some(uint(0))).await;
    assert!(r.outcome.is_ok());
    consecutive(&from_zero, 1);
    assert_eq!(from_zero.len(), 6);
    let (from_one, _) = subscription(&mut w, &done, None).await;
    assert_eq!(from_one, from_zero, "0 is taken as 1");
    for from in [7, 8, 1 << 40, u64::MAX - 1, u64::MAX] {
        let (events, r) = subscription(&mut w, &done, Some(uint(from))).await;
        assert!(events.is_empty(), "from {from}");
        assert!(
            matches!(&r.outcome, Ok(v) if v.is_null()),
            "from {from}: {r:?}"
        );
    }
    for bad in [text("1"), vec![0x20], tmap(&[("seq", uint(1))])] {
        let (events, r) = subscription(&mut w, &done, Some(bad)).await;
        assert_eq!(err_code(&r), ErrorCode::BadArgs, "{r:?}");
        assert!(events.is_empty());
    }

    // A running task, from 2^64-1: quiet until the end, then ends well.
    let running = submitted(&mut w, "wait", vec![NULL]).await;
    until("it runs", || get(&a.tally.task_started) == 2).await;
    let req_id = rid("sub");
    open_subscription(&mut w, &req_id, &running, Some(uint(u64::MAX)), 16).await;
    let r = ask(&mut w, "app.adv", "echo", &rid("echo"), text("meanwhile")).await;
    assert_eq!(ok_text(&r), "echo: meanwhile");
    assert_eq!(w.responses_to(&req_id), 0, "the subscription waits");
    a.tally.release_tasks.add_permits(1);
    let r = w.response(&req_id).await;
    assert!(matches!(&r.outcome, Ok(v) if v.is_null()), "{r:?}");
    assert!(w.items_of::<TaskEvent>(&req_id).is_empty());
    until("both end", || get(&a.tally.task_ended) == 2).await;
    Expect::runs(1)
}

/// A subscriber that never grants credit, and one that grants two items
/// and then stops: each stream ends `timeout` at the node's
/// `stream_idle_timeout` (1 s here) with no more items than granted,
/// while the task runs to its end and other sessions are served.
pub async fn a_subscriber_that_never_grants_credit(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let quiz = submitted(&mut w, "quiz", uint(1)).await;
    until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
    let (none, two) = (rid("sub"), rid("sub"));
    open_subscription(&mut w, &none, &quiz, None, 0).await;
    w.send(&[
        &control("core.tasks", "subscribe", &two, task_ref(&quiz)),
        &credit(&two, 2, 1 << 20),
    ])
    .await;
    // The task goes on while both wait for credit.
    let r = tasks(
        &mut w,
        "respond",
        tmap(&[("task", text(&quiz)), ("answer", uint(3))]),
    )
    .await;
    assert!(r.outcome.is_ok(), "{r:?}");
    let end = until_final(&mut w, &quiz).await;
    assert_eq!(end.state, TaskState::Completed);
    // Others are served meanwhile.
    let mut other = a.wire().await;
    let r = ask(&mut other, "app.adv", "echo", &rid("echo"), text("served")).await;
    assert_eq!(ok_text(&r), "echo: served");
    let chores = submitted(&mut other, "chores", uint(2)).await;
    assert_eq!(
        until_final(&mut other, &chores).await.state,
        TaskState::Completed
    );

    let r = w.response(&none).await;
    assert_eq!(err_code(&r), ErrorCode::Timeout, "{r:?}");
    assert!(
        w.items_of::<TaskEvent>(&none).is_empty(),
        "no credit, no event"
    );
    let r = w.response(&two).await;
    assert_eq!(err_code(&r), ErrorCode::Timeout, "{r:?}");
    let got = w.items_of::<TaskEvent>(&two);
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2],
        "two granted, two sent"
    );
    // Opened again from its last seq plus 1 (as TaskEvents does), with
    // credit: the rest, then the end.
    let (rest, r) = subscription(&mut w, &quiz, Some(uint(3))).await;
    assert!(r.outcome.is_ok());
    consecutive(&rest, 3);
    assert_eq!(rest.last().unwrap().seq, end.seq);
    until("both end", || get(&a.tally.task_ended) == 2).await;
    Expect::runs(1)
}

/// A log past `max_task_events` (8): the oldest events are deleted, the
/// final one stays, the info keeps the last progress (even when it is
/// older than the oldest event kept) and says `first_seq`; a subscriber
/// resuming from before it starts at `first_seq` (the gap it is told of),
/// and from there sees every event once, in order, to the end.
pub async fn an_event_log_past_max_task_events(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let id = submitted(&mut w, "chores", uint(40)).await;
    let end = until_final(&mut w, &id).await;
    // submitted, working, 40 progress, result
    assert_eq!((end.seq, end.first_seq), (43, 36), "{end:?}");
    assert_eq!(end.progress.decode::<u32>().unwrap(), 40);
    assert_eq!(end.result.decode::<u32>().unwrap(), 40);
    for from in [None, Some(4), Some(35), Some(36), Some(40)] {
        let (events, r) = subscription(&mut w, &id, from.map(uint)).await;
        assert!(r.outcome.is_ok());
        let start = from.unwrap_or(1).max(end.first_seq);
        consecutive(&events, start);
        assert_eq!(
            events.last().unwrap().kind,
            TaskEventKind::Result,
            "the final event is kept"
        );
        assert_eq!(events.len() as u64, 44 - start);
    }

    // A subscriber that took the first three events and holds the
    // fourth (no credit), while questions and answers push the log past
    // its bound: the info keeps the last progress (older than the oldest
    // event kept) and the question it waits on.
    let quiz = submitted(&mut w, "quiz", uint(6)).await;
    until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
    let req_id = rid("sub");
    open_subscription(&mut w, &req_id, &quiz, None, 3).await;
    for n in 0..6u64 {
        let i = until_state(&mut w, &quiz, |s| s == TaskState::InputRequired).await;
        assert_eq!(
            i.question.decode::<String>().unwrap(),
            format!("question {n}"),
            "{i:?}"
        );
        assert_eq!(i.progress.decode::<String>().unwrap(), "started", "{i:?}");
        let q = i.question_seq.unwrap();
        let r = tasks(
            &mut w,
            "respond",
            tmap(&[
                ("task", text(&quiz)),
                ("answer", uint(n)),
                ("question_seq", uint(q)),
            ]),
        )
        .await;
        assert!(r.outcome.is_ok(), "{r:?}");
    }
    let done = until_final(&mut w, &quiz).await;
    // submitted, working, progress, 6 x (question, answer), result
    assert_eq!((done.seq, done.first_seq), (16, 9), "{done:?}");
    assert_eq!(
        done.progress.decode::<String>().unwrap(),
        "started",
        "the last progress is kept"
    );
    assert_eq!(done.result.decode::<u32>().unwrap(), 15);
    assert!(done.question.is_null() && done.question_seq.is_none());
    // Credit again: the event it held, then from where the log now
    // starts (`first_seq`: the gap it is told of), each once, to the end.
    w.send(&[&credit(&req_id, 1 << 20, 1 << 30)]).await;
    let r = w.response(&req_id).await;
    assert!(r.outcome.is_ok(), "{r:?}");
    let seen: Vec<u64> = w
        .items_of::<TaskEvent>(&req_id)
        .iter()
        .map(|e| e.seq)
        .collect();
    let mut expected = vec![1, 2, 3, 4];
    expected.extend(done.first_seq..=done.seq);
    assert_eq!(seen, expected);
    // Resumed from before the oldest kept: from it.
    let (events, _) = subscription(&mut w, &quiz, Some(uint(5))).await;
    consecutive(&events, done.first_seq);
    assert_eq!(events.last().unwrap().seq, done.seq);
    until("both end", || get(&a.tally.task_ended) == 2).await;
    Expect::nothing()
}

/// A version-1 session: task verbs and every verb of `core.tasks` are
/// `unknown_verb`, nothing is submitted. On a version-2 session, a task
/// verb sent as a notification is dropped: no answer, no task.
pub async fn task_verbs_on_a_version_1_session(a: Arena) -> Expect {
    let mut v1 = a.wire_v1().await;
    for (cap, verb, args) in [
        ("app.adv", "chores", uint(1)),
        ("app.adv", "wait", vec![NULL]),
        ("core.tasks", "get", task_ref(&random_id())),
        ("core.tasks", "list", tmap(&[])),
        ("core.tasks", "cancel", task_ref(&random_id())),
        (
            "core.tasks",
            "respond",
            tmap(&[("task", text(&random_id())), ("answer", uint(1))]),
        ),
        ("core.tasks", "subscribe", task_ref(&random_id())),
    ] {
        let r = ask(&mut v1, cap, verb, &rid("v1"), args).await;
        assert_eq!(err_code(&r), ErrorCode::UnknownVerb, "{cap}/{verb}: {r:?}");
    }
    let r = ask(&mut v1, "app.adv", "echo", &rid("echo"), text("v1")).await;
    assert_eq!(ok_text(&r), "echo: v1", "the session goes on");
    drop(v1);

    let mut w = a.wire().await;
    w.send(&[
        &control("app.adv", "chores", "", uint(1)),
        &control("app.adv", "wait", "", vec![NULL]),
    ])
    .await;
    let r = ask(&mut w, "app.adv", "echo", &rid("echo"), text("v2")).await;
    assert_eq!(ok_text(&r), "echo: v2");
    assert!(
        list(&mut w).await.is_empty(),
        "a notification submits nothing"
    );
    assert!(
        w.seen
            .iter()
            .all(|f| !matches!(f, Frame::Response(r) if r.req_id.as_str().is_empty())),
        "nothing answers a notification"
    );
    assert_eq!(get(&a.tally.task_started), 0);
    Expect::runs(2)
}

/// A submit whose session is cut: retried by the same sender with the
/// same req_id on a new session, it gets the same answer byte for byte
/// within the replay window, and the same task (in its state now) after
/// it; a submit cut before its answer was read is found by its retry;
/// nothing is started twice.
pub async fn a_submit_retried_after_the_session_is_cut(a: Arena) -> Expect {
    let key = Keypair::generate().unwrap();
    let mut w = a.wire_as(&key).await;
    let r = submit(&mut w, "wait", "order-1", vec![NULL]).await;
    let first = r.outcome.clone().unwrap();
    let task: TaskSubmitted = first.decode().unwrap();
    until("it runs", || get(&a.tally.task_started) == 1).await;
    drop(w); // cut, no close

    let mut w = a.wire_as(&key).await;
    let r = submit(&mut w, "wait", "order-1", vec![NULL]).await;
    assert_eq!(
        r.outcome.clone().unwrap().as_bytes(),
        first.as_bytes(),
        "within the replay window: the first answer, byte for byte"
    );
    // Sent, and the session cut before the answer is read.
    w.send(&[&control("app.adv", "wait", "order-2", vec![NULL])])
        .await;
    drop(w);
    let mut w = a.wire_as(&key).await;
    let second: TaskSubmitted = loop {
        let r = submit(&mut w, "wait", "order-2", vec![NULL]).await;
        match &r.outcome {
            Ok(v) => break v.decode().unwrap(),
            // Still running in the ledger (the old session's job).
            Err(e) if e.code == ErrorCode::Duplicate => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_ne!(second.task, task.task);
    until("both run", || get(&a.tally.task_started) == 2).await;

    // Past the replay window (1 s here): the task table answers, with the
    // task's state now.
    tokio::time::sleep(a.setup.limits.replay_window + Duration::from_millis(500)).await;
    let r = submit(&mut w, "wait", "order-1", vec![NULL]).await;
    let again: TaskSubmitted = ok_as(&r);
    assert_eq!(again.task, task.task, "the same task");
    assert_eq!(again.state, TaskState::Working, "in its state now");
    assert_ne!(r.outcome.unwrap().as_bytes(), first.as_bytes());
    let mine = list(&mut w).await;
    assert_eq!(mine.len(), 2, "nothing submitted twice: {mine:?}");
    assert_eq!(get(&a.tally.task_started), 2, "nothing started twice");
    a.tally.release_tasks.add_permits(2);
    until("both end", || get(&a.tally.task_ended) == 2).await;
    Expect::nothing()
}

/// Submits cancelled in the same message that sends them, and a submit
/// with a budget of 0: a cancelled submit may or may not have made its
/// task, and its `cancelled` answer is not kept (WIRE.md 4.10): the retry
/// with the same req_id finds the task, or makes it, once. A budget of 0
/// is `timeout`, makes no task, and is not remembered either.
pub async fn a_cancelled_submit_retried(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let mut made_first = 0;
    for n in 0..12 {
        let req_id = format!("c-{n}");
        w.send(&[
            &control("app.adv", "chores", &req_id, uint(1)),
            &cancel(&req_id),
        ])
        .await;
        let r = w.response(&req_id).await;
        let first = match &r.outcome {
            Ok(v) => {
                made_first += 1;
                Some(v.decode::<TaskSubmitted>().unwrap().task)
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::Cancelled, "{e:?}");
                None
            }
        };
        let retry: TaskSubmitted = ok_as(&submit(&mut w, "chores", &req_id, uint(1)).await);
        if let Some(first) = first {
            assert_eq!(retry.task, first);
        }
        let again: TaskSubmitted = ok_as(&submit(&mut w, "chores", &req_id, uint(1)).await);
        assert_eq!(again.task, retry.task, "one task per req_id");
    }
    eprintln!("cancelled submits answered ok first: {made_first} of 12");
    let mine = list(&mut w).await;
    assert_eq!(mine.len(), 12, "one task per req_id, none twice");
    for t in &mine {
        assert_eq!(
            until_final(&mut w, &t.task).await.state,
            TaskState::Completed
        );
    }

    // A budget of 0.
    let mut zero = Vec::new();
    capwire::envelope::encode_control(
        &mut zero,
        "app.adv",
        "chores",
        &ReqId::try_from("z-1").unwrap(),
        Some(0),
        RawValue::encode(&1u32).unwrap().as_bytes(),
    )
    .unwrap();
    w.send(&[&zero]).await;
    let r = w.response("z-1").await;
    assert_eq!(err_code(&r), ErrorCode::Timeout, "{r:?}");
    assert_eq!(list(&mut w).await.len(), 12, "a budget of 0 makes no task");
    let made: TaskSubmitted = ok_as(&submit(&mut w, "chores", "z-1", uint(1)).await);
    assert_eq!(
        made.state,
        TaskState::Submitted,
        "not remembered: it runs now"
    );
    until_final(&mut w, &made.task).await;
    until("every handler ends", || get(&a.tally.task_ended) == 13).await;
    assert_eq!(get(&a.tally.task_started), 13);
    Expect::nothing()
}

/// A stranger sends `core.tasks/changed` pushes by the thousand, naming
/// one of the node's own tasks and another sender as its submitter: the
/// node hands each to its application with the stranger's key as their
/// sender (never its own, never the named submitter's), a slow reader is
/// told how many it missed, and the node's task is not touched.
pub async fn forged_task_changes_from_a_stranger(a: Arena) -> Expect {
    let owner_key = Keypair::generate().unwrap();
    let mut owner = a.wire_as(&owner_key).await;
    let real = submitted(&mut owner, "wait", vec![NULL]).await;
    until("it runs", || get(&a.tally.task_started) == 1).await;
    let mut events = a.node.control_events();
    let mut stranger = a.wire().await;
    let forged = |n: u64| {
        tmap(&[
            ("task", text(&real)),
            ("cap", text("app.adv")),
            ("verb", text("wait")),
            ("submitter", bytes(owner_key.public().as_bytes())),
            ("state", text("completed")),
            ("seq", uint(n)),
            ("at_ms", uint(1)),
            ("dropped", uint(0)),
        ])
    };
    const PUSHES: u64 = 3000;
    let pushes: Vec<Vec<u8>> = (1..=PUSHES)
        .map(|n| control("core.tasks", "changed", "", forged(n)))
        .collect();
    stranger.send_batched(&pushes).await;
    let (mut got, mut missed) = (0u64, 0u64);
    while got + missed < PUSHES {
        match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
            Ok(Ok(capwire::ControlEvent::Task { from, change })) => {
                assert_eq!(
                    from, stranger.id,
                    "the sender is the key the handshake proved"
                );
                assert_eq!(
                    change.submitter,
                    owner_key.public(),
                    "as sent: the application judges it"
                );
                got += 1;
            }
            Ok(Ok(_)) => {}
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(n))) => missed += n,
            Ok(Err(e)) => panic!("{e:?}"),
            Err(_) => panic!("{got} pushes handed over and {missed} missed of {PUSHES}"),
        }
    }
    assert!(got > 0);
    eprintln!("forged pushes: {got} handed to the application, {missed} missed by a slow reader");
    // Nothing happened to the task.
    let i = info(&mut owner, &real).await;
    assert_eq!((i.state, i.seq), (TaskState::Working, 2), "{i:?}");
    let r = ask(
        &mut stranger,
        "app.adv",
        "echo",
        &rid("echo"),
        text("after"),
    )
    .await;
    assert_eq!(ok_text(&r), "echo: after");
    tasks(&mut owner, "cancel", task_ref(&real)).await;
    until("it ends", || get(&a.tally.task_ended) == 1).await;
    Expect::runs(1)
}
