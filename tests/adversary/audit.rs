//! Protocol 3 and the audit log (WIRE.md 4.1, 5.6) against hostile and
//! older peers: a version-2 peer is never shown `core.audit` and is told
//! it does not exist, even as the control plane; a version-3 stranger is
//! refused it, and its refusals are recorded; a hello that shows
//! `core.audit` under an older protocol ends the session.

use capwire::Keypair;
use capwire::envelope::{CloseCode, ErrorCode};

use crate::kit::arena::{Arena, Expect};
use crate::kit::cbor::{tmap, uint};
use crate::kit::chokepoint::{ask, bind};
use crate::kit::wire::{Speaks, hello_record_of, peer_manifest};
use crate::kit::{closed_with, err_code};

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
