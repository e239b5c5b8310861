//! The replay ledger: duplicate and odd `req_id`s, repeats, the same id
//! on another verb, a sender flooding its part, request verbs without an
//! id, and responses that try to hijack another peer's call.

use std::time::Duration;

use capwire::envelope::{CloseCode, ErrorCode, Frame, ReqId, encode_cancel, encode_response_ok};
use capwire::{Keypair, Outcome};

use crate::kit::arena::{Arena, Expect, until};
use crate::kit::cap::get;
use crate::kit::cbor::{control, text, tmap, uint};
use crate::kit::chokepoint::{ask, bind};
use crate::kit::wire::args;
use crate::kit::{closed_with, err_code, ok_text};

/// A repeat of a request that is still running, on the same verb or on
/// another, is `duplicate` and does not run; the same id from another
/// sender is that sender's own; the original finishes once.
pub async fn duplicate_in_flight_req_id(a: Arena) -> Expect {
    let mut w = a.wire().await;
    w.send(&[&control("app.adv", "hold", "d1", uint(1))]).await;
    until("the handler started", || get(&a.tally.hold) == 1).await;
    let r = ask(&mut w, "app.adv", "hold", "d1", uint(2)).await;
    assert_eq!(err_code(&r), ErrorCode::Duplicate);
    let r = ask(&mut w, "app.adv", "echo", "d1", text("hijack")).await;
    assert_eq!(err_code(&r), ErrorCode::Duplicate);
    assert_eq!(get(&a.tally.hold), 1, "the duplicate did not run");

    let mut other = a.wire().await;
    other
        .send(&[&control("app.adv", "hold", "d1", uint(9))])
        .await;
    until("the other sender's runs", || get(&a.tally.hold) == 2).await;
    // A third peer cancels "d1": its own id, nobody else's.
    let mut third = a.wire().await;
    let mut cancel = Vec::new();
    encode_cancel(&mut cancel, &ReqId::try_from("d1").unwrap()).unwrap();
    third.send(&[&cancel]).await;
    let r = ask(&mut third, "app.adv", "echo", "sync", text("x")).await;
    assert_eq!(ok_text(&r), "echo: x");
    assert!(!a.tally.token(0).is_cancelled() && !a.tally.token(1).is_cancelled());
    a.tally.release.add_permits(2);
    let mine = w.response("d1").await;
    assert_eq!(mine.outcome.unwrap().decode::<u64>().unwrap(), 1);
    let theirs = other.response("d1").await;
    assert_eq!(theirs.outcome.unwrap().decode::<u64>().unwrap(), 9);
    w.next(Duration::from_millis(100)).await;
    assert_eq!(w.responses_to("d1"), 3, "two duplicates, one answer");
    assert_eq!(
        a.node
            .metrics()
            .count("app.adv", "hold", Outcome::Duplicate),
        1
    );
    Expect::runs(3)
}

/// The longest `req_id` (64 bytes), and ids that look like numbers past
/// 64 bits, with leading zeros or signs: each runs once and its repeat
/// gets the same response frame; 65 bytes break the frame.
pub async fn huge_and_odd_req_ids(a: Arena) -> Expect {
    let ids = [
        "~".repeat(64),
        "9".repeat(64),
        "18446744073709551615".into(),
        "18446744073709551616".into(),
        "340282366920938463463374607431768211456".into(),
        "0".into(),
        "00".into(),
        "007".into(),
        "7".into(),
        "-1".into(),
        "+1".into(),
        "1e3".into(),
        "0x10".into(),
    ];
    let mut w = a.wire().await;
    let mut first = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let r = ask(&mut w, "app.adv", "echo", id, text(&i.to_string())).await;
        assert_eq!(ok_text(&r), format!("echo: {i}"), "{id}");
        first.push(r);
    }
    for (id, r) in ids.iter().zip(&first) {
        let again = ask(&mut w, "app.adv", "echo", id, text("other")).await;
        assert_eq!(&again, r, "{id}: the remembered response, not a new run");
    }
    let mut w = a.wire().await;
    w.send(&[&control("app.adv", "echo", &"~".repeat(65), text("x"))])
        .await;
    closed_with(&mut w, CloseCode::ProtocolError, "65-byte req_id").await;
    Expect::runs(ids.len() as u64)
}

/// A completed request repeated: the remembered response frame, byte for
/// byte, on the same session and on a new one with the same key; its
/// handler does not run again. Failures are remembered too.
pub async fn repeated_completed_req_id(a: Arena) -> Expect {
    let key = Keypair::generate().unwrap();
    let mut w = a.wire_as(&key).await;
    let first = ask(&mut w, "app.adv", "echo", "r1", text("once")).await;
    assert_eq!(ok_text(&first), "echo: once");
    for _ in 0..3 {
        assert_eq!(
            ask(&mut w, "app.adv", "echo", "r1", text("twice")).await,
            first
        );
    }
    let failed = ask(&mut w, "app.adv", "echo", "r2", uint(5)).await;
    assert_eq!(err_code(&failed), ErrorCode::BadArgs);
    assert_eq!(
        ask(&mut w, "app.adv", "echo", "r2", text("ok now")).await,
        failed
    );
    drop(w);
    let mut w = a.wire_as(&key).await;
    assert_eq!(
        ask(&mut w, "app.adv", "echo", "r1", text("again")).await,
        first
    );
    let m = a.node.metrics();
    assert_eq!(m.count("app.adv", "echo", Outcome::Replayed), 5);
    assert_eq!(m.count("app.adv", "echo", Outcome::Ok), 1);
    Expect::runs(1)
}

/// A `req_id` answered for one verb, sent with others: `duplicate`,
/// never the first verb's result, and nothing runs (the chokepoint and
/// the kind check still come first).
pub async fn same_req_id_on_another_verb(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let said = ask(&mut w, "app.adv", "echo", "7", text("a")).await;
    assert_eq!(ok_text(&said), "echo: a");
    for (cap, verb, args) in [
        ("app.adv", "blob", uint(3)),
        ("app.adv", "hold", uint(1)),
        ("core.monitoring", "status", tmap(&[])),
        (
            "core.monitoring",
            "bind",
            tmap(&[("code", text("2222222222"))]),
        ),
    ] {
        let r = ask(&mut w, cap, verb, "7", args).await;
        assert_eq!(err_code(&r), ErrorCode::Duplicate, "{cap}/{verb}");
        assert_ne!(r, said);
    }
    let r = ask(&mut w, "app.adv", "admin", "7", text("x")).await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized);
    let r = ask(&mut w, "app.adv", "note", "7", text("x")).await;
    assert_eq!(
        err_code(&r),
        ErrorCode::UnknownVerb,
        "request-shaped, notification verb"
    );
    Expect::runs(1)
}

/// Another sender fills its part of the ledger (a 64 KiB quota) with
/// thousands of ids that are not counters, until it is `overloaded`: the
/// victim's answer is still remembered byte for byte and its handler does
/// not run again; the ledger stays within its budgets.
pub async fn another_sender_floods_the_ledger(a: Arena) -> Expect {
    let mut victim = a.wire().await;
    let first = ask(&mut victim, "app.adv", "echo", "v-1", text("once")).await;
    let mut flooder = a.wire().await;
    let mut overloaded = 0;
    for batch in 0..20 {
        let records: Vec<Vec<u8>> = (0..200)
            .map(|i| control("app.adv", "blob", &format!("f-{batch}-{i}"), uint(1)))
            .collect();
        for r in &records {
            flooder.send(&[r]).await;
        }
        for i in 0..200 {
            let r = flooder.response(&format!("f-{batch}-{i}")).await;
            if let Err(e) = &r.outcome {
                assert_eq!(e.code, ErrorCode::Overloaded);
                overloaded += 1;
            }
        }
    }
    assert!(overloaded > 0, "the flooder went over its own quota");
    let sizes = a.node.ledger_sizes();
    assert!(sizes.bytes <= 3 * 64 * 1024, "{sizes:?}");
    let again = ask(&mut victim, "app.adv", "echo", "v-1", text("once")).await;
    assert_eq!(again, first, "the victim's entry was not evicted");
    assert_eq!(get(&a.tally.echo), 1);
    // The flooder's own released answers: their requests stay known, so a
    // repeat runs nothing (`duplicate`, or the answer if still kept).
    let blobs = get(&a.tally.blob);
    for id in ["f-0-0", "f-0-1", "f-0-199"] {
        let r = ask(&mut flooder, "app.adv", "blob", id, uint(1)).await;
        if let Err(e) = &r.outcome {
            assert!(
                e.code == ErrorCode::Duplicate || e.code == ErrorCode::Overloaded,
                "{id}: {e:?}"
            );
        }
    }
    assert_eq!(get(&a.tally.blob), blobs, "no repeat ran again");
    Expect::runs(1 + blobs)
}

/// A request verb sent notification-shaped (empty `req_id`): nothing runs
/// and nothing is answered (there is no id to answer on); the session
/// goes on.
pub async fn request_verb_with_an_empty_req_id(a: Arena) -> Expect {
    let mut w = a.wire().await;
    for (cap, verb, args) in [
        ("app.adv", "echo", text("x")),
        ("app.adv", "hold", uint(1)),
        ("app.adv", "admin", text("x")),
        (
            "core.monitoring",
            "bind",
            tmap(&[("code", text("2222222222"))]),
        ),
    ] {
        w.send(&[&control(cap, verb, "", args)]).await;
    }
    let r = ask(&mut w, "app.adv", "echo", "after", text("y")).await;
    assert_eq!(ok_text(&r), "echo: y");
    w.next(Duration::from_millis(200)).await;
    let answers = w
        .seen
        .iter()
        .filter(|f| matches!(f, Frame::Response(_)))
        .count();
    assert_eq!(answers, 1, "one answer only: {:?}", w.seen);
    assert_eq!(
        a.node
            .metrics()
            .count("app.adv", "echo", Outcome::WrongKind),
        1
    );
    Expect::runs(1)
}

/// The node calls a victim; an attacker who guesses the call's `req_id`
/// answers it first on its own session (and also sends a request with
/// that id): the node's call gets the victim's answer; the attacker's
/// response is ignored and its request is its own.
pub async fn response_hijack_of_another_peers_call(a: Arena) -> Expect {
    let mut victim = a.wire().await;
    let mut attacker = a.wire().await;
    let peer = a.node.peer(victim.id);
    let call = tokio::spawn(async move {
        peer.call_raw("app.victim", "ask", &args("q"), Duration::from_secs(10))
            .await
    });
    let req_id = loop {
        match victim.next(Duration::from_secs(5)).await {
            Some(Frame::Control(c)) => break c.req_id,
            Some(_) => {}
            None => panic!("the node's call never came"),
        }
    };
    let mut spoof = Vec::new();
    encode_response_ok(&mut spoof, &req_id, args("hijacked").as_bytes()).unwrap();
    attacker.send(&[&spoof]).await;
    let r = ask(
        &mut attacker,
        "app.adv",
        "echo",
        req_id.as_str(),
        text("mine"),
    )
    .await;
    assert_eq!(ok_text(&r), "echo: mine");

    let mut genuine = Vec::new();
    encode_response_ok(&mut genuine, &req_id, args("genuine").as_bytes()).unwrap();
    victim.send(&[&genuine]).await;
    let answer = call.await.unwrap().unwrap();
    assert_eq!(answer.decode::<String>().unwrap(), "genuine");
    Expect::runs(1)
}

/// `set_config` answers are remembered per sender, durably: the same
/// `req_id` from the next control plane is its own request (applied),
/// never the first one's answer; the first control plane, bound again,
/// gets its own remembered answer and nothing is applied twice; a
/// stranger reusing the id is `unauthorized`.
pub async fn durable_answers_are_per_sender(a: Arena) -> Expect {
    let set = |v: u64| {
        tmap(&[
            ("value", uint(v)),
            ("if_version", vec![crate::kit::cbor::NULL]),
        ])
    };
    let version = |r: &capwire::envelope::ResponseEnvelope| -> u64 {
        let reply: capwire::manifest::SetConfigReply =
            r.outcome.as_ref().unwrap().decode().unwrap();
        reply.version
    };
    let mut first = a.wire().await;
    bind(&a, &mut first, "b1").await;
    let answer = ask(&mut first, "core.configuration", "set_config", "s1", set(1)).await;
    assert_eq!(version(&answer), 1);
    assert_eq!(
        ask(&mut first, "core.configuration", "set_config", "s1", set(1)).await,
        answer
    );
    let r = ask(&mut first, "core.monitoring", "disable", "d1", tmap(&[])).await;
    assert!(r.outcome.is_ok());

    let mut second = a.wire().await;
    bind(&a, &mut second, "b2").await;
    let theirs = ask(
        &mut second,
        "core.configuration",
        "set_config",
        "s1",
        set(2),
    )
    .await;
    assert_eq!(version(&theirs), 2, "another sender's s1 is a new request");
    let r = ask(&mut second, "core.monitoring", "disable", "d2", tmap(&[])).await;
    assert!(r.outcome.is_ok());

    let mut stranger = a.wire().await;
    let r = ask(
        &mut stranger,
        "core.configuration",
        "set_config",
        "s1",
        set(3),
    )
    .await;
    assert_eq!(err_code(&r), ErrorCode::Unauthorized);

    bind(&a, &mut first, "b3").await;
    let again = ask(
        &mut first,
        "core.configuration",
        "set_config",
        "s1",
        set(99),
    )
    .await;
    assert_eq!(
        version(&again),
        1,
        "its own remembered answer, not applied again"
    );
    assert_eq!(a.node.config().version, 2);
    assert_eq!(a.node.config().value.decode::<u64>().unwrap(), 2);
    let r = ask(&mut first, "core.monitoring", "disable", "d3", tmap(&[])).await;
    assert!(r.outcome.is_ok());
    Expect {
        config_version: Some(2),
        ..Expect::nothing()
    }
}

/// The node calls a peer that answers with broken responses (an `ok`
/// without a result, both a result and an error, an error code that
/// breaks the grammar, a result 33 levels deep): each breaks the frame,
/// the session ends with `protocol_error` and the node's call fails
/// `PeerLost` once the closing session is gone (within `close_timeout`).
/// An application error code comes through as one.
pub async fn malformed_answers_to_the_nodes_calls(a: Arena) -> Expect {
    use crate::kit::cbor::{NULL, nested_arrays};
    fn s(v: &str) -> Vec<u8> {
        text(v)
    }
    fn err(code: &str) -> Vec<u8> {
        tmap(&[("code", s(code)), ("message", s("no"))])
    }
    type Answer = Box<dyn Fn(&str) -> Vec<u8>>;
    let broken: Vec<(&str, Answer)> = vec![
        (
            "ok without a result",
            Box::new(move |id| {
                tmap(&[
                    ("type", s("response")),
                    ("req_id", s(id)),
                    ("ok", vec![0xf5]),
                ])
            }),
        ),
        (
            "a result and an error",
            Box::new(move |id| {
                tmap(&[
                    ("type", s("response")),
                    ("req_id", s(id)),
                    ("ok", vec![0xf4]),
                    ("result", vec![NULL]),
                    ("err", err("internal")),
                ])
            }),
        ),
        (
            "an error code breaking the grammar",
            Box::new(move |id| {
                tmap(&[
                    ("type", s("response")),
                    ("req_id", s(id)),
                    ("ok", vec![0xf4]),
                    ("err", err("Not Valid")),
                ])
            }),
        ),
        (
            "a result 33 levels deep",
            Box::new(move |id| {
                tmap(&[
                    ("type", s("response")),
                    ("req_id", s(id)),
                    ("ok", vec![0xf5]),
                    ("result", nested_arrays(32)),
                ])
            }),
        ),
    ];
    for (what, answer) in broken {
        let mut w = a.wire().await;
        let peer = a.node.peer(w.id);
        let call = tokio::spawn(async move {
            peer.call_raw("app.peer", "ask", &args(&()), Duration::from_secs(30))
                .await
        });
        let req_id = loop {
            match w.next(Duration::from_secs(5)).await {
                Some(Frame::Control(c)) => break c.req_id,
                Some(_) => {}
                None => panic!("{what}: the node's call never came"),
            }
        };
        w.send(&[&answer(req_id.as_str())]).await;
        let t = tokio::time::Instant::now();
        closed_with(&mut w, CloseCode::ProtocolError, what).await;
        let r = call.await.unwrap();
        let bound = a.setup.limits.close_timeout + Duration::from_millis(500);
        assert!(
            t.elapsed() <= bound,
            "{what}: the call failed after {:?}",
            t.elapsed()
        );
        assert!(
            matches!(r, Err(capwire::CallError::PeerLost)),
            "{what}: {r:?}"
        );
    }
    let mut w = a.wire().await;
    let peer = a.node.peer(w.id);
    let call = tokio::spawn(async move {
        peer.call_raw("app.peer", "ask", &args(&()), Duration::from_secs(30))
            .await
    });
    let req_id = loop {
        if let Some(Frame::Control(c)) = w.next(Duration::from_secs(5)).await {
            break c.req_id;
        }
    };
    let answer = tmap(&[
        ("type", s("response")),
        ("req_id", s(req_id.as_str())),
        ("ok", vec![0xf4]),
        ("err", err("refused")),
    ]);
    w.send(&[&answer]).await;
    match call.await.unwrap() {
        Err(capwire::CallError::Remote(e)) => assert_eq!(e.code.as_str(), "refused"),
        other => panic!("an application code: {other:?}"),
    }
    Expect::nothing()
}
