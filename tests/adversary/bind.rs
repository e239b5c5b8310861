//! The bind ceremony of `core.monitoring` (WIRE.md 3.3) abused: wrong
//! codes (other case, other length), malformed args, a notification-shaped
//! bind, an expired code, the wrong sender, no pending bind, and several
//! control planes binding at once.

use std::time::Duration;

use capwire::authz::BindFailure;
use capwire::envelope::{ErrorCode, ResponseEnvelope};
use capwire::manifest::MonitoringStatus;

use crate::kit::arena::{Arena, Expect};
use crate::kit::cbor::{NULL, control, text, tmap, uint};
use crate::kit::chokepoint::ask;
use crate::kit::err_code;
use crate::kit::wire::Wire;

/// The reason of a failed bind.
#[track_caller]
fn failure(r: &ResponseEnvelope) -> BindFailure {
    match &r.outcome {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::BindFailed, "{e:?}");
            e.detail.as_ref().expect("a reason").decode().unwrap()
        }
        Ok(v) => panic!("expected a bind failure, got {v:?}"),
    }
}

async fn bind(w: &mut Wire, id: &str, code: &str) -> ResponseEnvelope {
    ask(
        w,
        "core.monitoring",
        "bind",
        id,
        tmap(&[("code", text(code))]),
    )
    .await
}

/// A pending bind's code, and wrong ones: other case, one longer, one
/// shorter (never the code itself).
fn codes(a: &Arena) -> (String, [String; 3]) {
    let code = a.node.invite(None).unwrap().code.unwrap();
    let lower = code.to_lowercase();
    let other_case = if lower == code {
        format!(
            "{}{}",
            if code.starts_with('2') { '3' } else { '2' },
            &code[1..]
        )
    } else {
        lower
    };
    (
        code.clone(),
        [other_case, format!("{code} "), code[..9].to_owned()],
    )
}

/// Malformed bind args are `bad_args` and use no attempt (even around the
/// right code); a notification-shaped bind with the right code does
/// nothing; then three wrong codes (other case, a space more, a
/// character less) are `wrong_code` 2, 1 and `too_many_attempts`, after
/// which the right code is `no_pending`. Nobody is bound.
pub async fn bind_wrong_code_three_times(a: Arena) -> Expect {
    let mut w = a.wire().await;
    let (code, wrong) = codes(&a);
    for (i, args) in [
        tmap(&[("code", uint(1))]),
        tmap(&[]),
        tmap(&[("code", text(&code)), ("as", text("controller"))]),
        vec![0x81, 0x6a],
        vec![NULL],
        text(&code),
    ]
    .into_iter()
    .enumerate()
    {
        let args = if i == 3 {
            [args, code.as_bytes().to_vec()].concat()
        } else {
            args
        };
        let r = ask(&mut w, "core.monitoring", "bind", &format!("x{i}"), args).await;
        assert_eq!(err_code(&r), ErrorCode::BadArgs, "shape {i}");
    }
    w.send(&[&control(
        "core.monitoring",
        "bind",
        "",
        tmap(&[("code", text(&code))]),
    )])
    .await;
    assert_eq!(a.node.controller(), None, "a notification never binds");

    assert_eq!(
        failure(&bind(&mut w, "w1", &wrong[0]).await),
        BindFailure::WrongCode { attempts_left: 2 }
    );
    assert_eq!(
        failure(&bind(&mut w, "w2", &wrong[1]).await),
        BindFailure::WrongCode { attempts_left: 1 }
    );
    assert_eq!(
        failure(&bind(&mut w, "w3", &wrong[2]).await),
        BindFailure::TooManyAttempts
    );
    assert_eq!(
        failure(&bind(&mut w, "ok", &code).await),
        BindFailure::NoPending
    );
    assert_eq!(a.node.manifest().monitoring, MonitoringStatus::Off);
    Expect::nothing()
}

/// A code presented after its 300 s: `expired` once (the bind is
/// cleared), then `no_pending`. Nobody is bound.
pub async fn bind_with_an_expired_code(a: Arena) -> Expect {
    let (code, _) = codes(&a);
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert_eq!(a.node.manifest().monitoring, MonitoringStatus::Off);
    let mut w = a.wire().await;
    assert_eq!(
        failure(&bind(&mut w, "1", &code).await),
        BindFailure::Expired
    );
    assert_eq!(
        failure(&bind(&mut w, "2", &code).await),
        BindFailure::NoPending
    );
    Expect::nothing()
}

/// A bind reserved for `spare[0]`: a stranger with the right code (four
/// times) or a wrong one gets `wrong_sender` and uses no attempt; the
/// reserved control plane then binds with the right code.
pub async fn bind_from_the_wrong_sender(a: Arena) -> Expect {
    let reserved = a.setup.spare[0].public();
    let code = a.node.invite(Some(reserved)).unwrap().code.unwrap();
    let mut stranger = a.wire().await;
    for i in 0..4 {
        let r = bind(&mut stranger, &format!("s{i}"), &code).await;
        assert_eq!(failure(&r), BindFailure::WrongSender);
    }
    let r = bind(&mut stranger, "s-wrong", "2222222222").await;
    assert_eq!(failure(&r), BindFailure::WrongSender);
    assert_eq!(a.node.controller(), None);
    let mut cp = a.wire_as(&a.setup.spare[0]).await;
    assert!(bind(&mut cp, "b", &code).await.outcome.is_ok());
    Expect::nothing().bound_to(Some(reserved))
}

/// No pending bind (never opened, or cancelled): `no_pending`, whatever
/// the code.
pub async fn bind_without_a_pending_bind(a: Arena) -> Expect {
    let mut w = a.wire().await;
    assert_eq!(
        failure(&bind(&mut w, "1", "2222222222").await),
        BindFailure::NoPending
    );
    let code = a.node.invite(None).unwrap().code.unwrap();
    a.node.cancel_invite();
    assert_eq!(
        failure(&bind(&mut w, "2", &code).await),
        BindFailure::NoPending
    );
    assert_eq!(
        failure(&bind(&mut w, "3", &code).await),
        BindFailure::NoPending
    );
    Expect::nothing()
}

/// Six control planes present the right code at once: exactly one is
/// bound, the other five get `no_pending`.
pub async fn control_planes_binding_at_once(a: Arena) -> Expect {
    let mut planes = Vec::new();
    for _ in 0..6 {
        planes.push(a.wire().await);
    }
    let code = a.node.invite(None).unwrap().code.unwrap();
    let record = control(
        "core.monitoring",
        "bind",
        "b",
        tmap(&[("code", text(&code))]),
    );
    let messages: Vec<Vec<u8>> = planes
        .iter_mut()
        .map(|w| w.seal_records(&[&record]))
        .collect();
    for (w, m) in planes.iter_mut().zip(&messages) {
        w.write(m).await;
    }
    let mut winners = Vec::new();
    for w in &mut planes {
        let r = w.response("b").await;
        match &r.outcome {
            Ok(_) => winners.push(w.id),
            Err(_) => assert_eq!(failure(&r), BindFailure::NoPending),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one wins");
    assert_eq!(a.node.controller(), Some(winners[0]));
    Expect::nothing().bound_to(Some(winners[0]))
}

/// Ten wrong codes at once from ten sessions: in all they use the three
/// attempts and no more (`wrong_code` 2 and 1, then `too_many_attempts`,
/// then `no_pending` for the rest); the right code afterwards is
/// `no_pending`. A guesser gains no attempts by racing.
pub async fn wrong_codes_at_once_get_three_attempts_in_all(a: Arena) -> Expect {
    let mut guessers = Vec::new();
    for _ in 0..10 {
        guessers.push(a.wire().await);
    }
    let (code, _) = codes(&a);
    let messages: Vec<Vec<u8>> = guessers
        .iter_mut()
        .enumerate()
        .map(|(i, w)| {
            let guess = format!("{:0>10}", (2_222_222_222u64 + i as u64) % 10_000_000_000);
            let guess = if guess == code {
                "3333333333".to_owned()
            } else {
                guess
            };
            let r = control(
                "core.monitoring",
                "bind",
                "g",
                tmap(&[("code", text(&guess))]),
            );
            w.seal_records(&[&r])
        })
        .collect();
    for (w, m) in guessers.iter_mut().zip(&messages) {
        w.write(m).await;
    }
    let mut reasons = Vec::new();
    for w in &mut guessers {
        reasons.push(failure(&w.response("g").await));
    }
    let count = |f: &dyn Fn(&BindFailure) -> bool| reasons.iter().filter(|r| f(r)).count();
    assert_eq!(
        count(&|r| matches!(r, BindFailure::WrongCode { attempts_left: 2 })),
        1,
        "{reasons:?}"
    );
    assert_eq!(
        count(&|r| matches!(r, BindFailure::WrongCode { attempts_left: 1 })),
        1
    );
    assert_eq!(count(&|r| *r == BindFailure::TooManyAttempts), 1);
    assert_eq!(count(&|r| *r == BindFailure::NoPending), 7);
    let mut w = a.wire().await;
    assert_eq!(
        failure(&bind(&mut w, "late", &code).await),
        BindFailure::NoPending
    );
    Expect::nothing()
}
