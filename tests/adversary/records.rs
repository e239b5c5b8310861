//! Transport messages after the handshake: length prefixes, records split
//! and broken, truncated messages, bit flips, replayed, reordered,
//! duplicated, dropped and reflected messages, slow and silent peers, and
//! the nonce counter at its end.

use std::time::Duration;

use capwire::envelope::CloseCode;
use capwire::transport::{CloseCode as TransportClose, TransportError};
use capwire::{Direction, HandshakeFailure, Keypair};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::kit::arena::{Arena, Expect};
use crate::kit::cap::get;
use crate::kit::wire::{
    NEXT, RECORD, args, chunk, control_record, ends_within, first_chunk, framed, records_plaintext,
};
use crate::kit::{PROMPT, allocated_during, closed_with, failures, ok_text};

/// A request for `app.adv/echo`.
fn echo(req_id: &str, text: &str) -> Vec<u8> {
    control_record("app.adv", "echo", req_id, &args(text))
}

/// A handshake length prefix of 65535 with no body: judged on the two
/// bytes alone, before the body (or any buffer for it) could arrive.
pub async fn length_prefix_over_the_handshake_limit(a: Arena) -> Expect {
    let protocol = failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol);
    let mut s = a.stream().await;
    s.write_all(&[0xff, 0xff]).await.unwrap();
    let t = Instant::now();
    let mut got = 0;
    assert!(
        ends_within(&mut s, Duration::from_secs(2), &mut got).await,
        "dropped on the prefix, before the first-message deadline (3 s)"
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(got, 0, "no message 2");
    crate::kit::arena::until("the failure is counted", || {
        failures(&a.node, Direction::Inbound, HandshakeFailure::Protocol) == protocol + 1
    })
    .await;
    Expect::nothing()
}

/// Transport length prefixes 0, 1 and 15 (shorter than a tag): the
/// session ends with `protocol_error`; a request sealed after them never
/// runs. The request before them does.
pub async fn length_prefix_shorter_than_a_tag(a: Arena) -> Expect {
    for len in [0u16, 1, 15] {
        let mut w = a.wire().await;
        w.send(&[&echo("before", "x")]).await;
        assert_eq!(ok_text(&w.response("before").await), "echo: x");
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(0u8, usize::from(len)));
        bytes.extend(w.seal_records(&[&echo("after", "y")]));
        w.write(&bytes).await;
        closed_with(&mut w, CloseCode::ProtocolError, &format!("prefix {len}")).await;
        assert_eq!(w.responses_to("after"), 0);
    }
    Expect::runs(3)
}

/// A FIRST chunk announcing more than the node's `max_record` (16 MiB),
/// up to 2^32 - 1: refused on the announcement with `too_large`, without
/// waiting for (or keeping) the rest.
pub async fn record_announced_over_max_record(a: Arena) -> Expect {
    let ((), heap) = allocated_during(async {
        for total in [(16 << 20) + 1, u32::MAX] {
            let mut w = a.wire().await;
            let msg = w.seal(&first_chunk(total, &echo("big", "x")));
            w.write(&msg).await;
            closed_with(&mut w, CloseCode::TooLarge, &format!("announced {total}")).await;
        }
    })
    .await;
    assert!(
        heap < 1 << 30,
        "{heap} bytes allocated for a 4 GiB announcement"
    );
    Expect::nothing()
}

/// A 300 KB record split by hand across messages reaches the handler
/// whole, and its 300 KB answer comes back split, never truncated.
pub async fn large_records_are_split_never_truncated(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let text = "x".repeat(300_000);
    let before = w.raw_in.len();
    assert!(w.send_split(&echo("large", &text)).await);
    let answer = ok_text(&w.response("large").await);
    assert_eq!(answer.len(), 6 + 300_000);
    assert_eq!(answer, format!("echo: {text}"));
    assert!(
        w.raw_in.len() - before >= 5,
        "the answer came in several messages"
    );
    Expect::runs(1)
}

/// Chunk sequences that break the rules of WIRE.md 1.5, each wrapping a
/// valid request: the session ends with `protocol_error` and no part of
/// the message (or of a split record) reaches a handler.
pub async fn record_rules_broken(a: Arena) -> Expect {
    let req = echo("r", "never");
    let (head, tail) = req.split_at(10);
    let total = u32::try_from(req.len()).unwrap();
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("NEXT without FIRST", vec![chunk(NEXT, &req)]),
        (
            "a RECORD while a split record is incomplete",
            vec![[first_chunk(total, head), chunk(RECORD, &req)].concat()],
        ),
        (
            "a RECORD in the message after an incomplete FIRST",
            vec![first_chunk(total, head), chunk(RECORD, &req)],
        ),
        (
            "a split record overrunning its length",
            vec![
                first_chunk(total, head),
                chunk(NEXT, &[tail, b"!"].concat()),
            ],
        ),
        (
            "a FIRST holding the whole record",
            vec![first_chunk(total, &req)],
        ),
        ("a FIRST with an empty part", vec![first_chunk(total, &[])]),
        (
            "a NEXT with an empty part",
            vec![first_chunk(total, head), chunk(NEXT, &[])],
        ),
        (
            "two FIRSTs",
            vec![first_chunk(total, head), first_chunk(total, head)],
        ),
        ("an unknown chunk type", vec![chunk(0x09, &req)]),
        (
            "a chunk running past the plaintext",
            vec![{
                let mut c = chunk(RECORD, &req);
                c[2] = c[2].wrapping_add(1);
                c
            }],
        ),
        (
            "a CLOSE that is not the last chunk",
            vec![[chunk(0x04, &[0]), chunk(RECORD, &req)].concat()],
        ),
        (
            "a REKEY that is not the last chunk",
            vec![[chunk(0x05, &[]), chunk(RECORD, &req)].concat()],
        ),
        ("a REKEY with a body", vec![chunk(0x05, &[0])]),
    ];
    for (what, plaintexts) in cases {
        let mut w = a.wire().await;
        for p in plaintexts {
            let msg = w.seal(&p);
            w.write(&msg).await;
        }
        closed_with(&mut w, CloseCode::ProtocolError, what).await;
        assert_eq!(w.responses_to("r"), 0, "{what}");
    }
    // A split record still incomplete when the stream ends is discarded.
    let mut w = a.wire().await;
    let msg = w.seal(&first_chunk(total, head));
    w.write(&msg).await;
    w.shutdown_write().await;
    assert!(w.until_end(PROMPT).await);
    Expect::nothing()
}

/// REKEY (WIRE.md 1.7) abused: announced but the old key kept, or a key
/// changed without announcing it: the next message fails, the session
/// ends with `protocol_error` and its request never runs. Announced and
/// done, it works.
pub async fn rekey_abuse(a: Arena) -> Expect {
    let rekey = chunk(0x05, &[]);
    let mut w = a.wire().await;
    let msg = w.seal(&[chunk(RECORD, &echo("k0", "old key")), rekey.clone()].concat());
    w.write(&msg).await;
    w.rekey();
    w.send(&[&echo("k1", "new key")]).await;
    assert_eq!(ok_text(&w.response("k0").await), "echo: old key");
    assert_eq!(ok_text(&w.response("k1").await), "echo: new key");

    let mut w = a.wire().await;
    let msg = w.seal(&rekey);
    w.write(&msg).await;
    w.send(&[&echo("r", "kept the old key")]).await;
    closed_with(&mut w, CloseCode::ProtocolError, "announced, not done").await;
    assert_eq!(w.responses_to("r"), 0);

    let mut w = a.wire().await;
    w.rekey();
    w.send(&[&echo("r", "changed silently")]).await;
    closed_with(&mut w, CloseCode::ProtocolError, "done, not announced").await;
    assert_eq!(w.responses_to("r"), 0);
    Expect::runs(2)
}

/// A message holding a request, cut in the middle, then the end of the
/// stream: a lost peer; nothing partial is delivered.
pub async fn truncated_message_then_end_of_stream(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let msg = w.seal_records(&[&echo("cut", "x")]);
    w.write(&msg[..msg.len() / 2]).await;
    w.shutdown_write().await;
    assert!(w.until_end(PROMPT).await, "the node drops the stream");
    assert_eq!(w.responses_to("cut"), 0);
    Expect::nothing()
}

/// One bit flipped in the ciphertext (first, middle, last byte) or in the
/// tag (first, last byte) of a message holding a request: no plaintext is
/// released (the request never runs), the session ends with
/// `protocol_error`, and the genuine message sent right after is not
/// accepted either (the failure is final, the nonce did not move on).
pub async fn bit_flips_in_ciphertext_and_tag(a: Arena) -> Expect {
    let mut ran = 0;
    for (i, at) in ["ct first", "ct middle", "ct last", "tag first", "tag last"]
        .iter()
        .enumerate()
    {
        let mut w = a.wire().await;
        w.send(&[&echo("ok", "before")]).await;
        w.response("ok").await;
        ran += 1;
        let msg = w.seal_records(&[&echo("flip", "x")]);
        let end = msg.len();
        let pos = [2, end / 2, end - 17, end - 16, end - 1][i];
        let mut flipped = msg.clone();
        flipped[pos] ^= 0x01;
        w.write(&flipped).await;
        w.write(&msg).await;
        closed_with(&mut w, CloseCode::ProtocolError, at).await;
        assert_eq!(w.responses_to("flip"), 0, "{at}");
    }
    Expect::runs(ran)
}

/// Counters are implicit: a replayed, reordered, duplicated or dropped
/// message, or one of the node's own sent back to it, fails and ends the
/// session; only messages in their place were delivered.
pub async fn replayed_reordered_duplicated_dropped_reflected(a: Arena) -> Expect {
    // Replayed: a, b, then a again.
    let mut w = a.wire().await;
    let (ma, mb) = (
        w.seal_records(&[&echo("a", "1")]),
        w.seal_records(&[&echo("b", "2")]),
    );
    w.write(&[ma.clone(), mb].concat()).await;
    w.response("a").await;
    w.response("b").await;
    w.write(&ma).await;
    closed_with(&mut w, CloseCode::ProtocolError, "replayed").await;
    assert_eq!(w.responses_to("a"), 1);

    // Reordered: b before a.
    let mut w = a.wire().await;
    let (ma, mb) = (
        w.seal_records(&[&echo("a", "1")]),
        w.seal_records(&[&echo("b", "2")]),
    );
    w.write(&[mb, ma].concat()).await;
    closed_with(&mut w, CloseCode::ProtocolError, "reordered").await;
    assert_eq!(w.responses_to("a") + w.responses_to("b"), 0);

    // Duplicated: a twice in a row. The first copy is genuine and may
    // run; its answer may be lost with the session, which ends first.
    let mut w = a.wire().await;
    let ma = w.seal_records(&[&echo("a", "1")]);
    let before = get(&a.tally.echo);
    w.write(&[ma.clone(), ma].concat()).await;
    closed_with(&mut w, CloseCode::ProtocolError, "duplicated").await;
    let duplicated = get(&a.tally.echo) - before;
    assert!(duplicated <= 1 && w.responses_to("a") as u64 <= duplicated);

    // Dropped: a never arrives, b does.
    let mut w = a.wire().await;
    let _ma = w.seal_records(&[&echo("a", "1")]);
    let mb = w.seal_records(&[&echo("b", "2")]);
    w.write(&mb).await;
    closed_with(&mut w, CloseCode::ProtocolError, "dropped").await;
    assert_eq!(w.responses_to("b"), 0);

    // Reflected: the node's own hello message, sent back to it.
    let mut w = a.wire().await;
    let hello = w.raw_in[0].clone();
    w.write(&hello).await;
    closed_with(&mut w, CloseCode::ProtocolError, "reflected").await;
    Expect::runs(2 + duplicated)
}

/// Both counters start 6 short of 2^64 - 1 (test hook): five requests
/// are answered, our sixth message is refused by our own sealer with the
/// typed exhaustion error (its counter stays at the end, it does not
/// wrap), and when the node has nothing left to seal with, its session
/// ends without a close and its own call fails typed; nothing it sent
/// ever failed to open (no counter wrapped).
pub async fn nonce_exhaustion(a: Arena) -> Expect {
    // A version-1 session: each side sends one hello (on a version-2
    // session the node sends a second, its whole manifest, after a
    // partial first one), so both counters are at MAX-5 after them.
    let mut w = a.wire_v1().await;
    let mut answered = 0;
    for i in 0..10 {
        let id = format!("n{i}");
        match w.try_seal(&records_plaintext(&[&echo(&id, "x")])) {
            Ok(msg) => {
                w.write(&msg).await;
                ok_text(&w.response(&id).await);
                answered += 1;
            }
            Err(e) => {
                assert!(matches!(e, TransportError::NonceExhausted), "{e:?}");
                break;
            }
        }
    }
    assert_eq!(answered, 5, "counters MAX-5 ..= MAX-1 after the hello");
    assert_eq!(w.nonce(), u64::MAX, "our counter stays at the end");
    assert!(matches!(
        w.try_seal(&[]),
        Err(TransportError::NonceExhausted)
    ));

    // The node's counter is at the end too: its next message cannot be
    // sealed. A call from it ends the session, typed and at once.
    let peer = a.node.peer(w.id);
    let t = Instant::now();
    let call = peer
        .call_raw("app.none", "x", &args(&()), Duration::from_secs(20))
        .await;
    assert!(
        matches!(call, Err(capwire::CallError::PeerLost)),
        "{call:?}"
    );
    assert!(t.elapsed() < PROMPT);
    assert!(w.until_end(PROMPT).await);
    assert!(w.broken.is_none(), "every message the node sent opened");
    assert!(w.transport_close.is_none(), "no close could be sealed");
    Expect::runs(answered)
}

/// Slow and silent peers in paused time: a socket that sends nothing, one
/// that sends message 1 a byte at a time, one that trickles message 3,
/// one that never sends its hello, one that goes silent after it and one
/// that trickles a message after it. Each is dropped at its deadline
/// (first message 3 s, handshake 10 s, hello 10 s, idle 60 s), and the
/// trickled request never runs.
pub async fn slow_loris_and_silent_peers(a: Arena) -> Expect {
    let timeouts = failures(&a.node, Direction::Inbound, HandshakeFailure::Timeout);
    let within = |t: Instant, lo: u64, hi: u64, what: &str| {
        let e = t.elapsed();
        assert!(
            e >= Duration::from_secs(lo) && e <= Duration::from_secs(hi),
            "{what}: {e:?}"
        );
    };

    // Silent: never sends message 1.
    let mut s = a.stream().await;
    let t = Instant::now();
    let mut got = 0;
    assert!(ends_within(&mut s, Duration::from_secs(10), &mut got).await);
    within(t, 3, 4, "silent socket");

    // Message 1, a byte every 500 ms.
    let s = a.stream().await;
    let (mut rd, mut wr) = tokio::io::split(s);
    let t = Instant::now();
    let trickle = tokio::spawn(async move {
        for b in framed(&[9u8; 32]) {
            if wr.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let mut buf = [0u8; 64];
    let end = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut rd, &mut buf),
    )
    .await;
    assert!(matches!(end, Ok(Ok(0) | Err(_))), "{end:?}");
    within(t, 3, 4, "slow message 1");
    trickle.abort();

    // Message 1 whole, message 3 a byte a second.
    let mut s = a.stream().await;
    let t = Instant::now();
    let kp = Keypair::generate().unwrap();
    let mut m1 = Vec::new();
    let waiting = capwire::transport::Initiator::new(&kp, &capwire::transport::OsEntropy)
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    s.write_all(&framed(&m1)).await.unwrap();
    let m2 = crate::kit::wire::read_message(&mut s, PROMPT)
        .await
        .unwrap();
    let mut m3 = Vec::new();
    waiting
        .read_message(&m2, &mut Vec::new())
        .unwrap()
        .write_message(&[], &mut m3)
        .unwrap();
    let mut ended = false;
    for b in framed(&m3) {
        if s.write_all(&[b]).await.is_err() {
            ended = true;
            break;
        }
        let mut got = 0;
        if ends_within(&mut s, Duration::from_secs(1), &mut got).await {
            ended = true;
            break;
        }
    }
    assert!(
        ended,
        "a trickled message 3 is cut at the handshake deadline"
    );
    within(t, 9, 11, "slow message 3");

    // The handshake, then no hello: closed protocol_error at 10 s.
    let mut w = a.handshake_as(&Keypair::generate().unwrap()).await.unwrap();
    let t = Instant::now();
    assert_eq!(
        w.close_code(Duration::from_secs(30)).await,
        Some(CloseCode::ProtocolError)
    );
    within(t, 10, 12, "no hello");
    assert!(w.until_end(PROMPT).await);

    // Hello, then silence: closed idle_timeout at 60 s.
    let mut w = a.wire().await;
    let t = Instant::now();
    assert_eq!(
        w.close_code(Duration::from_secs(120)).await,
        Some(CloseCode::IdleTimeout)
    );
    within(t, 60, 62, "silent after hello");
    assert_eq!(
        w.transport_close.as_ref().map(|c| c.code),
        Some(TransportClose::Normal)
    );
    drop(w);

    // Hello, then a request a byte every 5 s: unfinished messages do not
    // count as traffic; closed idle_timeout at 60 s, the request never ran.
    let mut w = a.wire().await;
    let t = Instant::now();
    let msg = w.seal_records(&[&echo("slow", "x")]);
    let mut code = None;
    for b in msg {
        w.write(&[b]).await;
        if let Some(capwire::envelope::Frame::Close(c)) = w.next(Duration::from_secs(5)).await {
            code = Some(c.code);
            break;
        }
    }
    assert_eq!(code, Some(CloseCode::IdleTimeout));
    within(t, 60, 66, "trickle after hello");
    assert_eq!(w.responses_to("slow"), 0);

    assert_eq!(
        failures(&a.node, Direction::Inbound, HandshakeFailure::Timeout),
        timeouts + 3
    );
    assert_eq!(get(&a.tally.echo), 0);
    Expect::nothing()
}
