//! Streams (WIRE.md 4.9) under attack, both ways.
//!
//! The node as callee: the attacker calls `app.adv/gen` and then breaks
//! the credit rules (never grants, grants absurdly, grants for streams
//! that are not open), opens 10,000 streams at once, races cancels
//! against the end, repeats stream ids, and sends stream frames where a
//! version-1 session or a notification has no room for them.
//!
//! The node as caller: the test makes the node call the attacker's own
//! stream verb (`app.evil/feed`, listed in its version-2 manifest) and the
//! attacker plays the callee with raw frames: items beyond the credit,
//! items for the node's plain requests, for streams that do not exist or
//! have ended, a second end, and a flood within credit while the node's
//! application does not read.
//!
//! Each outcome is the one WIRE.md 4.9's table (and 4.3, 4.4, 4.8) gives.

use std::time::Duration;

use capwire::envelope::{CloseCode, ErrorCode, Frame};
use capwire::{CallError, ItemStream, Keypair, Outcome, StreamClosed};
use tokio::time::Instant;

use crate::kit::arena::{Arena, Expect, until};
use crate::kit::cap::{FOREVER, get};
use crate::kit::cbor::{cancel, control, credit, item, response_err, response_ok, text, uint};
use crate::kit::chokepoint::ask;
use crate::kit::wire::{Feed, Speaks, Wire, args};
use crate::kit::{PROMPT, closed_with, err_code, ok_text};

/// The most a credit frame counts (2^32-1).
const MAX: u64 = u32::MAX as u64;

/// Opens `gen` stream `id` for `n` items, without a budget (so that only
/// the idle bound can end a stream that gets no credit).
fn open(id: &str, n: u32) -> Vec<u8> {
    control("app.adv", "gen", id, uint(u64::from(n)))
}

/// The node still serves `w`: an echo round trip.
async fn still_served(w: &mut Wire, id: &str) {
    let r = ask(w, "app.adv", "echo", id, text("still")).await;
    assert_eq!(ok_text(&r), "echo: still", "the session goes on");
}

/// Every item of `id` came before its one response, and they are
/// 0, 1, 2, ... in order.
fn items_then_one_end(w: &Wire, id: &str) -> (Vec<u32>, usize) {
    let mut items = Vec::new();
    let mut ends = 0;
    for f in &w.seen {
        match f {
            Frame::Item(i) if i.req_id.as_str() == id => {
                assert_eq!(ends, 0, "{id}: an item after the stream's end");
                items.push(i.item.decode::<u32>().unwrap());
            }
            Frame::Response(r) if r.req_id.as_str() == id => ends += 1,
            _ => {}
        }
    }
    let expected: Vec<u32> = (0..u32::try_from(items.len()).unwrap()).collect();
    assert_eq!(items, expected, "{id}: items in order");
    (items, ends)
}

// ---------------------------------------------------------------------------
// The node as callee.

/// A caller that never grants credit: the handler waits, and the stream
/// ends `timeout` after `stream_idle_timeout` with no item. Credit sent
/// before a stream is opened is not counted (a stream starts with none).
/// The session goes on.
pub async fn a_caller_that_never_grants_credit(a: Arena) -> Expect {
    let mut w = a.wire().await;
    assert_eq!(w.version, 2, "the harness peer speaks protocol 2");
    w.send(&[&open("s1", FOREVER)]).await;
    let r = w.response("s1").await;
    assert_eq!(err_code(&r), ErrorCode::Timeout, "{r:?}");
    assert!(w.items_of::<u32>("s1").is_empty(), "no credit, no item");
    assert_eq!(a.tally.gen_closed(), [StreamClosed::Idle]);

    // Credit ahead of the stream is for a stream that does not exist yet.
    w.send(&[&credit("s2", MAX, MAX)]).await;
    still_served(&mut w, "e1").await;
    w.send(&[&open("s2", 5)]).await;
    let r = w.response("s2").await;
    assert_eq!(err_code(&r), ErrorCode::Timeout, "{r:?}");
    assert!(w.items_of::<u32>("s2").is_empty());
    assert_eq!(get(&a.tally.gen_items), 0);
    assert!(a.node.stats().stream_credit_stalls >= 2);
    still_served(&mut w, "e2").await;
    Expect::runs(4)
}

/// Credit of 2^32-1 items and bytes, again and again: counted up to
/// 2^32-1, no error. The handler runs as fast as the send queue lets it,
/// and the queue never holds more than its bound while the attacker does
/// not read; the items that come are 0, 1, 2, ... and a cancel ends the
/// stream. Counts beyond 2^32-1 break the frame (`protocol_error`).
pub async fn a_caller_that_grants_absurd_credit(a: Arena) -> Expect {
    let bound = a.setup.limits.max_queued_bytes_per_session;
    let mut w = a.wire().await;
    let mut records = vec![open("s1", FOREVER)];
    records.extend((0..500).map(|_| credit("s1", MAX, MAX)));
    w.send_batched(&records).await;
    // Not reading: the stream fills and then the node's queue.
    let mut most = 0;
    let full = Instant::now() + Duration::from_secs(20);
    loop {
        let q = a.node.stats().queued_bytes;
        most = most.max(q);
        if q + 1024 >= bound {
            break;
        }
        assert!(Instant::now() < full, "the queue never filled ({q} bytes)");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let produced = get(&a.tally.gen_items);
    for _ in 0..200 {
        most = most.max(a.node.stats().queued_bytes);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        most <= bound + 1024,
        "{most} bytes queued with a bound of {bound}"
    );
    assert!(
        get(&a.tally.gen_items) <= produced + 64,
        "the handler waits for room"
    );
    // Reading again: items in order, the stream still going.
    let mut seen = 0u32;
    while seen < 3000 {
        match w.next(PROMPT).await {
            Some(Frame::Item(i)) => {
                assert_eq!(i.item.decode::<u32>().unwrap(), seen);
                seen += 1;
            }
            Some(Frame::Response(r)) => panic!("the stream ended: {r:?}"),
            Some(_) => {}
            None => panic!("the node stopped sending"),
        }
    }
    w.send(&[&cancel("s1")]).await;
    let r = w.response("s1").await;
    assert_eq!(err_code(&r), ErrorCode::Cancelled, "{r:?}");
    let (_, ends) = items_then_one_end(&w, "s1");
    assert_eq!(ends, 1);
    still_served(&mut w, "e1").await;

    // One more than 2^32-1 is not a credit frame at all.
    for (items, bytes) in [(MAX + 1, 1), (1, MAX + 1), (u64::MAX, u64::MAX)] {
        let mut w = a.wire().await;
        w.send(&[&open("s", FOREVER), &credit("s", items, bytes)])
            .await;
        closed_with(&mut w, CloseCode::ProtocolError, "credit beyond 2^32-1").await;
    }
    let ran = get(&a.tally.gen_streams);
    Expect::runs(ran + 1)
}

/// Credit for a stream that does not exist, for one that ended, for a
/// plain request that is running, and for a stream of another peer: all
/// ignored (a grant may cross the stream's end); nothing is sent for
/// them and the sessions go on.
pub async fn credit_for_streams_that_are_not_open(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let mut other = a.wire().await;
    // A plain request, running.
    w.send(&[&control("app.adv", "hold", "h1", uint(1))]).await;
    until("the hold handler started", || get(&a.tally.hold) == 1).await;
    // Another peer's stream, with no credit from its caller.
    other.send(&[&open("o1", 3)]).await;
    until("the other stream started", || {
        get(&a.tally.gen_streams) == 1
    })
    .await;
    w.send(&[
        &credit("nowhere", MAX, MAX),
        &credit("h1", 10, 1000),
        &credit("o1", 10, 1000),
    ])
    .await;
    // A stream that ends, then more credit for it.
    w.send(&[&open("s1", 3), &credit("s1", 3, 64)]).await;
    let r = w.response("s1").await;
    assert!(r.outcome.is_ok(), "{r:?}");
    w.send(&[&credit("s1", MAX, MAX), &credit("s1", 1, 1)])
        .await;
    still_served(&mut w, "e1").await;
    assert_eq!(w.items_of::<u32>("s1"), [0, 1, 2]);
    assert!(w.items_of::<u32>("h1").is_empty() && w.items_of::<u32>("nowhere").is_empty());
    // The other peer's stream got nothing from our credit.
    assert!(other.items_of::<u32>("o1").is_empty());
    other.send(&[&credit("o1", 3, 64)]).await;
    let r = other.response("o1").await;
    assert!(r.outcome.is_ok(), "{r:?}");
    assert_eq!(other.items_of::<u32>("o1"), [0, 1, 2]);
    assert!(!a.tally.token(0).is_cancelled());
    a.tally.release.add_permits(1);
    let r = w.response("h1").await;
    assert_eq!(r.outcome.unwrap().decode::<u64>().unwrap(), 1);
    Expect::runs(4)
}

/// 10,000 streams opened at once, each with credit for one item: the
/// first `max_inflight` run (each sends its item and waits), the others
/// are answered `overloaded` and send nothing; the node's heap grows by a
/// bounded amount per running stream; everything is let go when the
/// attacker leaves.
pub async fn ten_thousand_streams_at_once(a: Arena) -> Expect {
    const N: usize = 10_000;
    let max = a.setup.limits.max_inflight_per_session;
    let ((w, stats), live) = live_growth_during(async {
        let mut w = a.wire().await;
        let mut records = Vec::with_capacity(2 * N);
        for i in 0..N {
            let id = i.to_string();
            records.push(open(&id, FOREVER));
            records.push(credit(&id, 1, 64));
        }
        w.send_batched(&records).await;
        let mut overloaded = 0;
        let mut items = 0;
        while overloaded < N - max || items < max {
            match w.next(Duration::from_secs(20)).await {
                Some(Frame::Response(r)) => {
                    assert_eq!(err_code(&r), ErrorCode::Overloaded, "{r:?}");
                    let n: usize = r.req_id.as_str().parse().unwrap();
                    assert!(n >= max, "stream {n} was refused");
                    overloaded += 1;
                }
                Some(Frame::Item(i)) => {
                    let n: usize = i.req_id.as_str().parse().unwrap();
                    assert!(n < max, "stream {n} was refused, yet sent an item");
                    assert_eq!(i.item.decode::<u32>().unwrap(), 0);
                    items += 1;
                }
                Some(other) => panic!("unexpected {other:?}"),
                None => panic!("{overloaded} overloaded and {items} items only"),
            }
        }
        until("every running stream waits for credit", || {
            a.node.stats().stream_credit_stalls >= max as u64
        })
        .await;
        let stats = a.node.stats();
        (w, stats)
    })
    .await;
    assert_eq!(stats.streams_served, max);
    assert_eq!(stats.inflight, max);
    assert_eq!(get(&a.tally.gen_streams), max as u64);
    assert_eq!(
        a.node
            .metrics()
            .count("app.adv", "gen", Outcome::Overloaded),
        (N - max) as u64
    );
    // Bounded: what the running streams hold, with the attacker's own
    // frames and whatever other tests allocated meanwhile (the count is
    // the process's), far below what 10,000 streams held as the running
    // ones are (about 17 KiB each) would take.
    let bound = max * 32 * 1024 + (16 << 20);
    assert!(
        live <= bound,
        "the heap grew by {live} bytes for {max} running streams (bound {bound})"
    );
    eprintln!(
        "10,000 streams at once: the heap grew by {live} bytes for {max} running; ledger {:?}",
        stats.ledger
    );
    drop(w);
    until("every stream was let go", || {
        get(&a.tally.gen_ended) == max as u64 && a.node.stats().streams_served == 0
    })
    .await;
    Expect::runs(max as u64)
}

/// Bytes still allocated after `f` that were not before (every thread:
/// a bound, not a measure).
async fn live_growth_during<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let region = stats_alloc::Region::new(crate::GLOBAL);
    let out = f.await;
    let c = region.change();
    let grew = c.bytes_allocated as isize - c.bytes_deallocated as isize + c.bytes_reallocated;
    (out, usize::try_from(grew).unwrap_or(0))
}

/// Cancels racing the end: in the same message as the opening and its
/// credit (before or after the credit), twice, after the end, and then
/// credit after the cancel. Every stream gets exactly one response (its
/// end, or `cancelled`), after all of its items and never followed by
/// one; a cancel or credit for an ended stream changes nothing.
pub async fn cancel_and_end_races(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let mut opened = 0u64;
    let mut ids = Vec::new();
    for round in 0..200u32 {
        let id = format!("r{round}");
        let n = round % 5;
        let granted = u64::from(round % 3) + 1;
        let (o, c, x) = (open(&id, n), credit(&id, granted, 64), cancel(&id));
        let batch: Vec<&[u8]> = match round % 4 {
            0 => vec![&o, &c, &x],
            1 => vec![&o, &x, &c],
            2 => vec![&o, &c, &x, &x],
            _ => vec![&o, &x, &x, &c, &c],
        };
        let grants = batch.iter().filter(|r| **r == c.as_slice()).count() as u64;
        w.send(&batch).await;
        opened += 1;
        ids.push((id, n, granted * grants));
    }
    // A stream left waiting for credit, cancelled twice, then granted.
    w.send(&[&open("w1", FOREVER)]).await;
    until("w1 waits for credit", || {
        get(&a.tally.gen_streams) == opened + 1
    })
    .await;
    w.send(&[&cancel("w1"), &cancel("w1"), &credit("w1", MAX, MAX)])
        .await;
    let r = w.response("w1").await;
    assert_eq!(err_code(&r), ErrorCode::Cancelled, "{r:?}");
    // A stream that ended, then cancelled and granted.
    w.send(&[&open("d1", 2), &credit("d1", 2, 64)]).await;
    let r = w.response("d1").await;
    assert!(r.outcome.is_ok(), "{r:?}");
    w.send(&[&cancel("d1"), &credit("d1", 5, 64), &cancel("d1")])
        .await;
    opened += 2;
    until("every stream ended and its answer left", || {
        let s = a.node.stats();
        s.inflight == 0 && s.queued_bytes == 0 && s.streams_served == 0
    })
    .await;
    // Everything the node sent went out before this answer.
    still_served(&mut w, "sync").await;
    for (id, n, granted) in &ids {
        let (items, ends) = items_then_one_end(&w, id);
        assert_eq!(ends, 1, "{id}: one response");
        let r = w
            .seen
            .iter()
            .find_map(|f| match f {
                Frame::Response(r) if r.req_id.as_str() == id => Some(r.clone()),
                _ => None,
            })
            .unwrap();
        match &r.outcome {
            Ok(_) => assert_eq!(items.len() as u32, *n, "{id}: ended with all its items"),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::Cancelled, "{id}");
                assert!(items.len() as u64 <= *granted, "{id}: items beyond credit");
            }
        }
    }
    for id in ["w1", "d1"] {
        assert_eq!(items_then_one_end(&w, id).1, 1, "{id}: one response");
    }
    assert_eq!(w.items_of::<u32>("d1"), [0, 1]);
    Expect::runs(opened + 1)
}

/// The `req_id` of an open stream, and of one that ended, used again (for
/// the stream verb and for another verb): `duplicate`, never a second
/// run and never the ended stream's end alone (which would look like an
/// empty stream); from a new session with the same key as well.
pub async fn repeated_req_id_of_an_open_and_an_ended_stream(a: Arena) -> Expect {
    let key = Keypair::generate().unwrap();
    let mut w = a.wire_as(&key).await;
    w.send(&[&open("s1", 2)]).await;
    until("the stream started", || get(&a.tally.gen_streams) == 1).await;
    let r = ask(&mut w, "app.adv", "gen", "s1", uint(2)).await;
    assert_eq!(err_code(&r), ErrorCode::Duplicate, "open: {r:?}");
    let r = ask(&mut w, "app.adv", "echo", "s1", text("x")).await;
    assert_eq!(
        err_code(&r),
        ErrorCode::Duplicate,
        "open, other verb: {r:?}"
    );
    w.send(&[&credit("s1", 2, 64)]).await;
    let end = w.response("s1").await;
    assert!(end.outcome.is_ok(), "{end:?}");
    assert_eq!(w.items_of::<u32>("s1"), [0, 1]);
    for verb in ["gen", "echo"] {
        let r = ask(&mut w, "app.adv", verb, "s1", uint(2)).await;
        assert_eq!(err_code(&r), ErrorCode::Duplicate, "ended, {verb}: {r:?}");
    }
    drop(w);
    let mut w = a.wire_as(&key).await;
    let r = ask(&mut w, "app.adv", "gen", "s1", uint(2)).await;
    assert_eq!(err_code(&r), ErrorCode::Duplicate, "a new session: {r:?}");
    assert!(w.items_of::<u32>("s1").is_empty());
    assert_eq!(get(&a.tally.gen_streams), 1, "the stream ran once");
    Expect::runs(1)
}

/// A version-1 session: the node's manifest shows it no stream verb; a
/// request-shaped frame for `gen` is `unknown_verb` (nothing runs, no
/// item), a notification-shaped one is dropped.
pub async fn stream_verb_on_a_version_1_session(a: Arena) -> Expect {
    let mut w = a.wire_v1().await;
    let view = w.node_manifest.clone().unwrap();
    assert!(view.is_partial_view() && !view.has_protocol_2_verbs());
    let adv = view.capability("app.adv").unwrap();
    assert!(
        adv.verb("gen").is_none(),
        "no stream verb in a version-1 view"
    );
    let r = ask(&mut w, "app.adv", "gen", "g1", uint(3)).await;
    assert_eq!(err_code(&r), ErrorCode::UnknownVerb, "{r:?}");
    w.send(&[&open("", 3)]).await;
    still_served(&mut w, "e1").await;
    assert_eq!(w.responses_to(""), 0);
    assert!(!w.seen.iter().any(|f| matches!(f, Frame::Item(_))));
    assert_eq!(get(&a.tally.gen_streams), 0);
    Expect::runs(1)
}

/// `item` and `credit` frames on a version-1 session, and a stream frame
/// in place of the first hello: `protocol_error`, the session ends.
pub async fn stream_frames_on_a_version_1_session(a: Arena) -> Expect {
    for (what, frame) in [
        ("credit", credit("g1", 1, 1)),
        ("item", item("g1", uint(1))),
    ] {
        let mut w = a.wire_v1().await;
        w.send(&[&control("app.adv", "hold", "g1", uint(1))]).await;
        w.send(&[&frame]).await;
        closed_with(&mut w, CloseCode::ProtocolError, what).await;
    }
    for frame in [credit("g1", 1, 1), item("g1", uint(1))] {
        let mut w = a.handshake_as(&Keypair::generate().unwrap()).await.unwrap();
        w.send(&[&frame]).await;
        closed_with(&mut w, CloseCode::ProtocolError, "before any hello").await;
    }
    // The holds started were cancelled with their sessions.
    until("the holds ended", || {
        get(&a.tally.hold_ended) == get(&a.tally.hold)
    })
    .await;
    Expect::runs(get(&a.tally.hold))
}

/// A stream verb sent notification-shaped on a version-2 session: dropped
/// (no `req_id` to answer on), nothing runs; a credit frame with an empty
/// `req_id` breaks the frame (`protocol_error`).
pub async fn a_stream_verb_sent_as_a_notification(a: Arena) -> Expect {
    let mut w = a.wire().await;
    w.send(&[&open("", 3), &open("", FOREVER)]).await;
    still_served(&mut w, "e1").await;
    assert_eq!(w.responses_to(""), 0);
    assert!(!w.seen.iter().any(|f| matches!(f, Frame::Item(_))));
    assert_eq!(get(&a.tally.gen_streams), 0);
    assert_eq!(
        a.node.metrics().count("app.adv", "gen", Outcome::WrongKind),
        2
    );
    let mut w = a.wire().await;
    w.send(&[&credit("", 1, 1)]).await;
    closed_with(&mut w, CloseCode::ProtocolError, "credit without req_id").await;
    Expect::runs(1)
}

// ---------------------------------------------------------------------------
// The node as caller.

/// A version-2 session whose peer lists `app.evil/feed`, once the node
/// has opened it (with our whole manifest, not the version-1 view).
async fn with_streams(a: &Arena) -> Wire {
    let w = a
        .wire_speaking(&Keypair::generate().unwrap(), Speaks::V2WithStreams)
        .await;
    let peer = a.node.peer(w.id);
    until("the node opened the session", || peer.manifest().is_some()).await;
    let view = peer.manifest().unwrap();
    assert_eq!(view.protocol(), 2);
    assert!(
        !view.is_partial_view()
            && view
                .capability("app.evil")
                .and_then(|c| c.verb("feed"))
                .is_some(),
        "the node took our whole manifest"
    );
    w
}

/// A session whose peer lists `app.evil/feed`, the node's stream call of
/// it, and the stream's `req_id`, once its control frame and its window
/// (the first credit) have arrived.
async fn called(a: &Arena) -> (Wire, ItemStream<String>, String) {
    let mut w = with_streams(a).await;
    let peer = a.node.peer(w.id);
    let stream = peer.stream(Feed, 1).await.unwrap();
    let id = match w.wait_for(PROMPT, |f| matches!(f, Frame::Control(_))).await {
        Some(Frame::Control(c)) => {
            assert_eq!((c.cap.as_str(), c.verb.as_str()), ("app.evil", "feed"));
            c.req_id.as_str().to_owned()
        }
        other => panic!("no stream call: {other:?}"),
    };
    assert_eq!(stream.req_id().as_str(), id);
    let limits = &a.setup.limits;
    match w.wait_for(PROMPT, |f| matches!(f, Frame::Credit(_))).await {
        Some(Frame::Credit(c)) => {
            assert_eq!(c.req_id.as_str(), id, "the window is for the stream");
            assert_eq!(
                (c.items, c.bytes),
                (limits.stream_window_items, limits.stream_window_bytes)
            );
        }
        other => panic!("no window: {other:?}"),
    }
    (w, stream, id)
}

/// The text item of `len` bytes in all (its CBOR head included), for
/// lengths of 1..=23 and 25..=255 + 2.
fn text_item(len: usize) -> Vec<u8> {
    let body = if len <= 24 { len - 1 } else { len - 2 };
    let v = text(&"f".repeat(body));
    assert_eq!(v.len(), len);
    v
}

/// Reads the node's grants for `id` until they add up to `items` and
/// `bytes`, never beyond.
async fn grants_until(w: &mut Wire, id: &str, items: usize, bytes: usize) {
    let (mut i, mut b) = (0, 0);
    while (i, b) != (items, bytes) {
        match w.wait_for(PROMPT, |f| matches!(f, Frame::Credit(_))).await {
            Some(Frame::Credit(c)) => {
                assert_eq!(c.req_id.as_str(), id);
                i += c.items as usize;
                b += c.bytes as usize;
                assert!(i <= items && b <= bytes, "granted {i} items, {b} bytes");
            }
            other => panic!("no grant ({i} items, {b} bytes so far): {other:?}"),
        }
    }
}

/// What a stream of the node yields until its end: its items, and the
/// error that ended it, if any.
async fn drain_stream(s: &mut ItemStream<String>) -> (Vec<String>, Option<CallError>) {
    let mut items = Vec::new();
    loop {
        match tokio::time::timeout(PROMPT, s.next()).await {
            Err(_) => panic!("the stream neither yields nor ends"),
            Ok(None) => return (items, None),
            Ok(Some(Ok(t))) => items.push(t),
            Ok(Some(Err(e))) => {
                assert!(s.next().await.is_none(), "an ended stream stays ended");
                return (items, Some(e));
            }
        }
    }
}

/// A callee that sends more than it was granted, in items or in bytes,
/// or one item larger than the whole window: `protocol_error`, the
/// session ends, and the node's stream ends with a lost peer after at
/// most the items within credit: at the close, not when the stream is
/// dropped (the node's idle bound for the stream, 800 ms here, is shorter
/// than its close timeout, and the attacker does not hang up).
pub async fn items_beyond_the_credit(a: Arena) -> Expect {
    let window = a.setup.limits.stream_window_items as usize;
    let bytes = a.setup.limits.stream_window_bytes as usize;
    // Items: one more than the window.
    let (mut w, mut s, id) = called(&a).await;
    let records: Vec<Vec<u8>> = (0..=window)
        .map(|i| item(&id, text(&format!("{i}"))))
        .collect();
    w.send_batched(&records).await;
    closed_with(&mut w, CloseCode::ProtocolError, "items beyond credit").await;
    let (got, end) = drain_stream(&mut s).await;
    assert!(got.len() <= window, "{got:?}");
    for (i, t) in got.iter().enumerate() {
        assert_eq!(t, &i.to_string());
    }
    assert!(matches!(end, Some(CallError::PeerLost)), "{end:?}");

    // Bytes: the window exactly, in two items, then one more byte's worth.
    let (mut w, mut s, id) = called(&a).await;
    w.send(&[
        &item(&id, text_item(bytes / 2)),
        &item(&id, text_item(bytes / 2)),
    ])
    .await;
    for _ in 0..2 {
        let t = s.next().await.unwrap().unwrap();
        assert_eq!(t.len(), bytes / 2 - 2);
    }
    // Taking them granted them again (in one grant or two); then the
    // window's bytes and one more.
    grants_until(&mut w, &id, 2, bytes).await;
    w.send(&[&item(&id, text_item(bytes)), &item(&id, text_item(1))])
        .await;
    closed_with(&mut w, CloseCode::ProtocolError, "bytes beyond credit").await;
    let (got, end) = drain_stream(&mut s).await;
    assert!(got.len() <= 1, "{got:?}");
    assert!(matches!(end, Some(CallError::PeerLost)), "{end:?}");

    // One item larger than the whole window.
    let (mut w, mut s, id) = called(&a).await;
    w.send(&[&item(&id, text_item(bytes + 1))]).await;
    closed_with(&mut w, CloseCode::ProtocolError, "an item over the window").await;
    let (got, end) = drain_stream(&mut s).await;
    assert!(got.is_empty());
    assert!(matches!(end, Some(CallError::PeerLost)), "{end:?}");
    Expect::nothing()
}

/// An item for a `req_id` that is one of the node's plain requests (not a
/// stream): `protocol_error`; the request fails with a lost peer.
pub async fn an_item_for_one_of_the_nodes_requests(a: Arena) -> Expect {
    let mut w = with_streams(&a).await;
    let peer = a.node.peer(w.id);
    let call = tokio::spawn(async move {
        peer.call_raw("app.evil", "ask", &args(&()), Duration::from_secs(30))
            .await
    });
    let id = match w.wait_for(PROMPT, |f| matches!(f, Frame::Control(_))).await {
        Some(Frame::Control(c)) => c.req_id.as_str().to_owned(),
        other => panic!("no call: {other:?}"),
    };
    w.send(&[&item(&id, text("not a stream"))]).await;
    closed_with(&mut w, CloseCode::ProtocolError, "an item for a request").await;
    let r = call.await.unwrap();
    assert!(matches!(r, Err(CallError::PeerLost)), "{r:?}");
    Expect::nothing()
}

/// Items for `req_id`s the node has no stream for (never had, or
/// cancelled: its items may cross the cancel): ignored; the session and
/// the node's other stream go on.
pub async fn items_for_streams_that_do_not_exist(a: Arena) -> Expect {
    let (mut w, mut s, id) = called(&a).await;
    w.send(&[
        &item("nowhere", text("x")),
        &item("0", text("x")),
        &item(&format!("{id}0"), text("x")),
    ])
    .await;
    still_served(&mut w, "e1").await;
    // A second stream, given up by the node's application: its cancel
    // comes, and the items that follow it are ignored.
    let peer = a.node.peer(w.id);
    let dropped = peer.stream(Feed, 2).await.unwrap();
    let gone = dropped.req_id().as_str().to_owned();
    // Dropped once sent (a stream given up before it was sent is never
    // sent at all).
    w.wait_for(
        PROMPT,
        |f| matches!(f, Frame::Credit(c) if c.req_id.as_str() == gone),
    )
    .await
    .expect("the second stream's window");
    drop(dropped);
    match w.wait_for(PROMPT, |f| matches!(f, Frame::Cancel(_))).await {
        Some(Frame::Cancel(c)) => assert_eq!(c.req_id.as_str(), gone),
        other => panic!("no cancel: {other:?}"),
    }
    let records: Vec<Vec<u8>> = (0..50).map(|_| item(&gone, text("late"))).collect();
    w.send_batched(&records).await;
    w.send(&[&response_err(&gone, "cancelled")]).await;
    // The first stream is untouched.
    w.send(&[&item(&id, text("one")), &response_ok(&id, vec![0xf6])])
        .await;
    let (got, end) = drain_stream(&mut s).await;
    assert_eq!(got, ["one"]);
    assert!(end.is_none(), "{end:?}");
    still_served(&mut w, "e2").await;
    until("no stream left", || a.node.stats().streams_called == 0).await;
    Expect::runs(2)
}

/// A callee that ends a stream twice, then sends items after the end
/// (more than the window): the second end and the items are ignored, the
/// node's stream ended once, after its items, and the session goes on
/// (a new stream on it works).
pub async fn a_stream_ended_twice_then_fed(a: Arena) -> Expect {
    let window = a.setup.limits.stream_window_items as usize;
    let (mut w, mut s, id) = called(&a).await;
    w.send(&[
        &item(&id, text("a")),
        &item(&id, text("b")),
        &response_ok(&id, vec![0xf6]),
        &response_err(&id, "again"),
        &response_ok(&id, vec![0xf6]),
    ])
    .await;
    let records: Vec<Vec<u8>> = (0..window * 2)
        .map(|_| item(&id, text("after the end")))
        .collect();
    w.send_batched(&records).await;
    still_served(&mut w, "e1").await;
    let (got, end) = drain_stream(&mut s).await;
    assert_eq!(got, ["a", "b"]);
    assert!(end.is_none(), "{end:?}");
    assert!(s.next().await.is_none());
    // The session is fine: another stream of the node on it.
    let mut next = a.node.peer(w.id).stream(Feed, 1).await.unwrap();
    let id2 = next.req_id().as_str().to_owned();
    w.wait_for(
        PROMPT,
        |f| matches!(f, Frame::Credit(c) if c.req_id.as_str() == id2),
    )
    .await
    .expect("the new stream's window");
    w.send(&[&item(&id2, text("c")), &response_err(&id2, "done_here")])
        .await;
    let (got, end) = drain_stream(&mut next).await;
    assert_eq!(got, ["c"]);
    match end {
        Some(CallError::Remote(body)) => assert_eq!(body.code.as_str(), "done_here"),
        other => panic!("the callee's error ends the stream: {other:?}"),
    }
    Expect::runs(1)
}

/// A callee that sends all its credit at once while the node's
/// application does not read: the node buffers at most the window and
/// grants nothing more until items are taken; then it grants what was
/// taken, never more, and the items come in order.
pub async fn a_flood_within_credit_while_the_caller_does_not_read(a: Arena) -> Expect {
    let window = a.setup.limits.stream_window_items as usize;
    let (mut w, mut s, id) = called(&a).await;
    let mut sent = 0usize;
    let mut granted = window;
    let mut taken = 0usize;
    for round in 0..6 {
        let records: Vec<Vec<u8>> = (sent..granted)
            .map(|i| item(&id, text(&i.to_string())))
            .collect();
        w.send_batched(&records).await;
        sent = granted;
        until("the window is delivered", || s.buffered() == sent - taken).await;
        assert!(
            s.buffered() <= window,
            "round {round}: {} buffered",
            s.buffered()
        );
        // Not read: no grant comes.
        w.drain(Duration::from_millis(100)).await;
        assert!(
            w.wait_for(Duration::ZERO, |f| matches!(f, Frame::Credit(_)))
                .await
                .is_none(),
            "round {round}: credit granted for items nobody took"
        );
        // Half a window taken: what was taken is granted again.
        for _ in 0..window / 2 {
            let t = s.next().await.unwrap().unwrap();
            assert_eq!(t, taken.to_string());
            taken += 1;
        }
        match w.wait_for(PROMPT, |f| matches!(f, Frame::Credit(_))).await {
            Some(Frame::Credit(c)) => {
                assert_eq!(c.req_id.as_str(), id);
                assert_eq!(c.items as usize, window / 2, "round {round}");
                granted += c.items as usize;
            }
            other => panic!("round {round}: no grant after half the window: {other:?}"),
        }
        assert_eq!(granted - taken, window, "never more than one window out");
    }
    w.send(&[&response_ok(&id, vec![0xf6])]).await;
    let (rest, end) = drain_stream(&mut s).await;
    assert!(end.is_none(), "{end:?}");
    let all: Vec<String> = (taken..sent).map(|i| i.to_string()).collect();
    assert_eq!(rest, all);
    assert_eq!(a.node.stats().stream_items_received, sent as u64);
    Expect::nothing()
}
