//! Protocol 3 and the audit log (WIRE.md 4.1, 5.6) against hostile and
//! older peers: a version-2 peer is never shown `core.audit` and is told
//! it does not exist, even as the control plane; a version-3 stranger is
//! refused it, and its refusals are recorded; a hello that shows
//! `core.audit` under an older protocol ends the session; and a trace
//! context (protocol 3's other addition) never costs a call.

use capwire::Keypair;
use capwire::envelope::{CloseCode, ErrorCode};

use crate::kit::arena::{Arena, Expect};
use crate::kit::cbor::{text, tmap, uint};
use crate::kit::chokepoint::{ask, bind};
use crate::kit::wire::{Speaks, hello_record_of, peer_manifest};
use crate::kit::{closed_with, err_code, ok_text};

/// A version-2 peer, bound as the control plane: the node's hellos name
/// protocol 2 and list no `core.audit`; its verbs are `unknown_verb`.
pub async fn a_version_2_control_plane_never_sees_core_audit(a: Arena) -> Expect {
    let me = Keypair::generate().unwrap();
    let mut w = a.wire_speaking(&me, Speaks::V2).await;
    assert_eq!(
        w.version, 2,
        "a version-3 node and a version-2 peer speak 2"
    );
    let seen = w.node_manifest.clone().unwrap();
    assert_eq!(
        seen.protocol(),
        3,
        "core.protocol still says the node speaks 3"
    );
    assert!(
        seen.capability("core.audit").is_none(),
        "a version-2 view leaves core.audit out"
    );
    assert!(
        seen.capability("core.tasks").is_some(),
        "and keeps what protocol 2 has"
    );
    bind(&a, &mut w, "b1").await;
    for (i, verb) in ["checkpoint", "prove"].iter().enumerate() {
        let r = ask(&mut w, "core.audit", verb, &format!("v2-{i}"), tmap(&[])).await;
        assert_eq!(err_code(&r), ErrorCode::UnknownVerb, "{verb}: {r:?}");
    }
    Expect::nothing().bound_to(Some(me.public()))
}

/// A version-3 stranger: the node's second hello names 3 and lists
/// `core.audit` with its verifier key; every audit verb is
/// `unauthorized`, and each refusal is an entry of the log.
pub async fn a_version_3_stranger_is_refused_the_audit_log(a: Arena) -> Expect {
    let mut w = a
        .wire_speaking(&Keypair::generate().unwrap(), Speaks::V3)
        .await;
    assert_eq!(w.version, 3);
    let seen = w.node_manifest.clone().unwrap();
    let audit = seen
        .capability("core.audit")
        .expect("a version-3 peer sees core.audit");
    let vkey = audit.params.clone().unwrap_or_default();
    assert!(
        vkey.starts_with(&format!("capwire.audit/{}+", a.node.id())),
        "its params are the log's verifier key: {vkey:?}"
    );
    let before = a.node.audit_stats().entries;
    let asks = [
        ("checkpoint", tmap(&[])),
        ("prove", tmap(&[("size", uint(1)), ("index", uint(0))])),
        ("entries", tmap(&[("from", uint(0)), ("to", uint(1))])),
    ];
    for (i, (verb, args)) in asks.into_iter().enumerate() {
        let r = ask(&mut w, "core.audit", verb, &format!("v3-{i}"), args).await;
        assert_eq!(err_code(&r), ErrorCode::Unauthorized, "{verb}: {r:?}");
    }
    assert!(
        a.node.audit_stats().entries >= before + 3,
        "each refusal is recorded"
    );
    Expect::nothing()
}

/// A peer that speaks 3 but sends a later hello naming protocol 2 with
/// `core.audit` in it: `protocol_error`, the session ends.
pub async fn a_hello_showing_core_audit_under_protocol_2(a: Arena) -> Expect {
    let me = Keypair::generate().unwrap();
    let mut w = a.wire_speaking(&me, Speaks::V3).await;
    let mut m = peer_manifest(me.public(), Speaks::V3);
    let mut audit = m.capability("core.protocol").unwrap().clone();
    audit.id = "core.audit".parse().unwrap();
    m.capabilities.insert(0, audit);
    m.capabilities
        .sort_by(|x, y| x.id.as_str().cmp(y.id.as_str()));
    m.epoch += 1;
    w.send(&[&hello_record_of(&m, 2)]).await;
    closed_with(
        &mut w,
        CloseCode::ProtocolError,
        "core.audit under protocol 2",
    )
    .await;
    Expect::nothing()
}

/// A control frame for `app.adv/echo` carrying `trace` as its trace item.
fn echo_traced(req_id: &str, trace: Vec<u8>) -> Vec<u8> {
    tmap(&[
        ("type", text("control")),
        ("cap", text("app.adv")),
        ("verb", text("echo")),
        ("req_id", text(req_id)),
        ("args", text("hi")),
        ("trace", trace),
    ])
}

/// The `trace` key (protocol 3, WIRE.md 2.2) on sessions of every
/// version, well formed or not: the call is served as if it had none, and
/// the session goes on.
pub async fn a_trace_context_never_costs_a_call(a: Arena) -> Expect {
    let good = tmap(&[(
        "traceparent",
        text("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )]);
    let contexts = [
        good.clone(),
        tmap(&[(
            "traceparent",
            text("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        )]),
        tmap(&[("traceparent", text("nonsense"))]),
        tmap(&[
            (
                "traceparent",
                text("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
            ("tracestate", text(&"k=v,".repeat(20))),
        ]),
        uint(7),
    ];
    let mut runs = 0;
    for speaks in [Speaks::V1, Speaks::V2, Speaks::V3] {
        let mut w = a.wire_speaking(&Keypair::generate().unwrap(), speaks).await;
        for (i, t) in contexts.iter().enumerate() {
            let id = format!("t{}-{i}", speaks.max());
            w.send(&[&echo_traced(&id, t.clone())]).await;
            let r = w.response(&id).await;
            assert_eq!(ok_text(&r), "echo: hi", "{speaks:?} context {i}: {r:?}");
            runs += 1;
        }
    }
    Expect::runs(runs)
}
