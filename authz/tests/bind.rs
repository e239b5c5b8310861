//! The bind ceremony of `core.monitoring`: one test per path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use capwire_authz::{
    AuthzError, BIND_CODE_ALPHABET, BIND_CODE_LEN, BIND_MAX_ATTEMPTS, BIND_TTL, BindCode,
    BindFailure, Binding, BindingState, Refused, SharedBinding,
};
use capwire_envelope::NodeId;
use capwire_manifest::MonitoringStatus;
use rand_core::{CryptoRng, RngCore};

const CODE: &str = "K7M2Q9XW4P";
const CP: NodeId = NodeId::from_bytes([0xc0; 32]);
const OTHER: NodeId = NodeId::from_bytes([0x0e; 32]);

fn pending(expected: Option<NodeId>, now: Instant) -> BindingState {
    let mut state = BindingState::new();
    state.create_pending(BindCode::parse(CODE).unwrap(), expected, now);
    state
}

#[test]
fn no_pending() {
    let mut state = BindingState::new();
    assert_eq!(
        state.try_bind(&CP, CODE, Instant::now()),
        Err(BindFailure::NoPending)
    );
    assert_eq!(state.binding(), Binding::UNBOUND);
}

#[test]
fn expired_clears_the_pending_bind() {
    let t0 = Instant::now();
    let mut state = pending(None, t0);
    assert_eq!(state.status(t0), MonitoringStatus::Pending);
    // Still valid one tick before the deadline.
    let last = t0 + BIND_TTL - Duration::from_millis(1);
    assert!(state.pending(last).is_some());
    let at = t0 + BIND_TTL;
    assert_eq!(state.status(at), MonitoringStatus::Off);
    // Expiry is checked before anything else, even with the right code.
    assert_eq!(state.try_bind(&CP, CODE, at), Err(BindFailure::Expired));
    assert_eq!(
        state.try_bind(&CP, CODE, t0),
        Err(BindFailure::NoPending),
        "cleared"
    );
    assert_eq!(state.binding(), Binding::UNBOUND);
}

#[test]
fn wrong_sender_uses_no_attempt() {
    let now = Instant::now();
    let mut state = pending(Some(CP), now);
    for _ in 0..10 {
        // Checked before the code: the right code from the wrong sender fails too.
        assert_eq!(
            state.try_bind(&OTHER, CODE, now),
            Err(BindFailure::WrongSender)
        );
        assert_eq!(
            state.try_bind(&OTHER, "WRONGCODE2", now),
            Err(BindFailure::WrongSender)
        );
    }
    assert_eq!(state.pending(now).unwrap().attempts_left, BIND_MAX_ATTEMPTS);
    assert_eq!(state.pending(now).unwrap().expected, Some(CP));
    assert_eq!(
        state.try_bind(&CP, CODE, now).unwrap().controller(),
        Some(&CP)
    );
}

#[test]
fn wrong_code_reports_attempts_left() {
    let now = Instant::now();
    let mut state = pending(None, now);
    assert_eq!(
        state.try_bind(&CP, "K7M2Q9XW4Q", now),
        Err(BindFailure::WrongCode { attempts_left: 2 })
    );
    // Any string is a candidate: other lengths, case, empty, NUL.
    assert_eq!(
        state.try_bind(&CP, &CODE.to_lowercase(), now),
        Err(BindFailure::WrongCode { attempts_left: 1 })
    );
    assert_eq!(state.pending(now).unwrap().attempts_left, 1);
    // The right code still works on the last attempt.
    let binding = state.try_bind(&CP, CODE, now).unwrap();
    assert_eq!(binding.controller(), Some(&CP));
}

#[test]
fn too_many_attempts_clears_the_pending_bind() {
    let now = Instant::now();
    let mut state = pending(None, now);
    let bad = ["", "K7M2Q9XW4P\0", "K7M2Q9XW4"];
    assert_eq!(
        state.try_bind(&CP, bad[0], now),
        Err(BindFailure::WrongCode { attempts_left: 2 })
    );
    assert_eq!(
        state.try_bind(&OTHER, bad[1], now),
        Err(BindFailure::WrongCode { attempts_left: 1 })
    );
    assert_eq!(
        state.try_bind(&CP, bad[2], now),
        Err(BindFailure::TooManyAttempts)
    );
    assert_eq!(
        state.try_bind(&CP, CODE, now),
        Err(BindFailure::NoPending),
        "cleared"
    );
    assert_eq!(state.status(now), MonitoringStatus::Off);
}

#[test]
fn success_binds_bumps_the_epoch_and_clears() {
    let now = Instant::now();
    let mut state = pending(None, now);
    let before = state.binding().epoch();
    let binding = state
        .try_bind(&CP, CODE, now + Duration::from_secs(299))
        .unwrap();
    assert_eq!(binding.controller(), Some(&CP));
    assert_eq!(binding.epoch(), before + 1);
    assert_eq!(state.binding(), binding);
    assert_eq!(state.status(now), MonitoringStatus::On);
    assert!(state.pending(now).is_none());
    assert_eq!(
        state.try_bind(&OTHER, CODE, now),
        Err(BindFailure::NoPending)
    );
}

#[test]
fn unbind_clears_and_bumps_the_epoch() {
    let now = Instant::now();
    let mut state = pending(None, now);
    let bound = state.try_bind(&CP, CODE, now).unwrap();
    assert_eq!(state.unbind(), Some(CP));
    assert_eq!(state.binding(), Binding::new(None, bound.epoch() + 1));
    assert_eq!(state.status(now), MonitoringStatus::Off);
    // Nothing to unbind: nothing changes.
    assert_eq!(state.unbind(), None);
    assert_eq!(state.binding().epoch(), bound.epoch() + 1);
}

#[test]
fn a_new_pending_bind_replaces_the_old_one() {
    let now = Instant::now();
    let mut state = pending(None, now);
    state.try_bind(&CP, "XXXXXXXXXX", now).unwrap_err();
    state.create_pending(BindCode::parse("2222222222").unwrap(), None, now);
    assert_eq!(state.pending(now).unwrap().attempts_left, BIND_MAX_ATTEMPTS);
    assert_eq!(
        state.try_bind(&CP, CODE, now),
        Err(BindFailure::WrongCode { attempts_left: 2 })
    );
    assert!(state.cancel_pending());
    assert!(!state.cancel_pending());
}

#[test]
fn concurrent_binds_have_exactly_one_winner() {
    for round in 0..20 {
        let shared = Arc::new(SharedBinding::default());
        let now = Instant::now();
        shared.create_pending(BindCode::parse(CODE).unwrap(), None, now);
        let contenders = 8;
        let barrier = Arc::new(Barrier::new(contenders));
        let handles: Vec<_> = (0..contenders)
            .map(|i| {
                let shared = Arc::clone(&shared);
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    let me = NodeId::from_bytes([i as u8 + 1; 32]);
                    barrier.wait();
                    (me, shared.try_bind(&me, CODE, now))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let (winner, binding) = winners[0];
        assert_eq!(binding.as_ref().unwrap().controller(), Some(winner));
        for (_, r) in results.iter().filter(|(_, r)| r.is_err()) {
            assert_eq!(r, &Err(BindFailure::NoPending));
        }
        assert_eq!(shared.snapshot().controller(), Some(winner));
        assert_eq!(shared.snapshot().epoch(), 1);
    }
}

#[test]
fn concurrent_wrong_codes_never_exceed_the_attempt_limit() {
    let shared = Arc::new(SharedBinding::default());
    let now = Instant::now();
    shared.create_pending(BindCode::parse(CODE).unwrap(), None, now);
    let barrier = Arc::new(Barrier::new(6));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let shared = Arc::clone(&shared);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                shared.try_bind(&CP, "WRONGWRONG", now)
            })
        })
        .collect();
    let mut results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap_err())
        .collect();
    results.sort_by_key(|r| r.reason());
    assert_eq!(
        results
            .iter()
            .filter(|r| **r == BindFailure::TooManyAttempts)
            .count(),
        1
    );
    assert_eq!(
        results
            .iter()
            .filter(|r| **r == BindFailure::NoPending)
            .count(),
        3
    );
    assert_eq!(
        results
            .iter()
            .filter(|r| matches!(r, BindFailure::WrongCode { .. }))
            .count(),
        2
    );
    assert_eq!(shared.snapshot(), Binding::UNBOUND);
}

#[test]
fn shared_binding_mirrors_the_state() {
    let shared = SharedBinding::new(BindingState::restore(Some(CP)));
    let now = Instant::now();
    assert_eq!(shared.status(now), MonitoringStatus::On);
    assert_eq!(shared.unbind(), Some(CP));
    assert_eq!(shared.snapshot(), Binding::new(None, 1));
    shared.create_pending(BindCode::parse(CODE).unwrap(), Some(OTHER), now);
    assert_eq!(shared.pending(now).unwrap().expected, Some(OTHER));
    assert_eq!(shared.status(now), MonitoringStatus::Pending);
    assert!(shared.cancel_pending());
    assert_eq!(shared.with(|s| s.binding().epoch()), 1);
}

#[test]
fn failures_are_data_for_the_bind_failed_detail() {
    let json = |f: BindFailure| serde_json::to_value(f).unwrap();
    assert_eq!(
        json(BindFailure::WrongCode { attempts_left: 2 }),
        serde_json::json!({"reason": "wrong_code", "attempts_left": 2})
    );
    assert_eq!(
        json(BindFailure::NoPending),
        serde_json::json!({"reason": "no_pending"})
    );
    assert_eq!(
        json(BindFailure::Expired),
        serde_json::json!({"reason": "expired"})
    );
    assert_eq!(
        json(BindFailure::WrongSender),
        serde_json::json!({"reason": "wrong_sender"})
    );
    assert_eq!(
        json(BindFailure::TooManyAttempts),
        serde_json::json!({"reason": "too_many_attempts"})
    );
    for f in [
        BindFailure::NoPending,
        BindFailure::Expired,
        BindFailure::WrongSender,
        BindFailure::WrongCode { attempts_left: 1 },
        BindFailure::TooManyAttempts,
    ] {
        assert_eq!(json(f)["reason"], f.reason());
        assert_eq!(serde_json::from_value::<BindFailure>(json(f)).unwrap(), f);
    }
    assert_eq!(BindFailure::CODE, "bind_failed");
    assert_eq!(
        BindFailure::WrongCode { attempts_left: 2 }.to_string(),
        "wrong code, 2 attempt(s) left"
    );
}

struct Counter(u8);
impl RngCore for Counter {
    fn next_u32(&mut self) -> u32 {
        0
    }
    fn next_u64(&mut self) -> u64 {
        0
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for b in dest {
            self.0 = self.0.wrapping_add(1);
            *b = self.0;
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}
impl CryptoRng for Counter {}

struct Broken;
impl RngCore for Broken {
    fn next_u32(&mut self) -> u32 {
        panic!("must use try_fill_bytes")
    }
    fn next_u64(&mut self) -> u64 {
        panic!("must use try_fill_bytes")
    }
    fn fill_bytes(&mut self, _: &mut [u8]) {
        panic!("must use try_fill_bytes")
    }
    fn try_fill_bytes(&mut self, _: &mut [u8]) -> Result<(), rand_core::Error> {
        Err(rand_core::Error::from(
            std::num::NonZeroU32::new(rand_core::Error::CUSTOM_START).unwrap(),
        ))
    }
}
impl CryptoRng for Broken {}

#[test]
fn codes_come_from_the_rng_and_rng_failure_is_an_error() {
    let code = BindCode::generate(&mut Counter(0)).unwrap();
    // Bytes 1..=10 map to alphabet[1..=10].
    assert_eq!(code.expose(), &BIND_CODE_ALPHABET[1..=BIND_CODE_LEN]);
    assert_eq!(
        BindCode::generate(&mut Broken).unwrap_err(),
        AuthzError::RngFailed
    );

    let a = BindCode::random().unwrap();
    let b = BindCode::random().unwrap();
    for c in [&a, &b] {
        assert_eq!(c.expose().len(), BIND_CODE_LEN);
        assert!(
            c.expose()
                .bytes()
                .all(|x| BIND_CODE_ALPHABET.as_bytes().contains(&x))
        );
        assert_eq!(BindCode::parse(c.expose()).unwrap().expose(), c.expose());
    }
    assert_ne!(a.expose(), b.expose(), "50 random bits");
    assert_eq!(format!("{a:?}"), "BindCode(<redacted>)");
    assert!(!format!("{a:?}").contains(a.expose()));
}

#[test]
fn the_code_format_is_checked() {
    for bad in [
        "",
        "K7M2Q9XW4",
        "K7M2Q9XW4PP",
        "k7m2q9xw4p",
        "K7M2Q9XW4O",
        "K7M2Q9XW41",
        "K7M2Q9XW4 ",
    ] {
        assert_eq!(
            BindCode::parse(bad).unwrap_err(),
            AuthzError::MalformedCode,
            "{bad:?}"
        );
    }
    for c in ['0', '1', 'I', 'O'] {
        assert!(!BIND_CODE_ALPHABET.contains(c));
    }
    assert_eq!(BIND_CODE_ALPHABET.len(), 32);
}

#[test]
fn bind_failed_carries_its_reason_as_cbor_detail() {
    let failure = BindFailure::WrongCode { attempts_left: 2 };
    let body = failure.error_body();
    assert_eq!(body.code, capwire_envelope::ErrorCode::BindFailed);
    assert_eq!(body.code.as_str(), "bind_failed");
    assert_eq!(body.message, "wrong code, 2 attempt(s) left");
    let detail = body.detail.clone().unwrap();
    assert_eq!(detail.decode::<BindFailure>().unwrap(), failure);
    let map: std::collections::BTreeMap<String, ciborium::Value> = detail.decode().unwrap();
    assert_eq!(map["reason"], ciborium::Value::Text("wrong_code".into()));
    assert_eq!(map["attempts_left"], ciborium::Value::Integer(2.into()));
    assert_eq!(map.len(), 2);

    let expired = BindFailure::Expired.error_body().detail.unwrap();
    let map: std::collections::BTreeMap<String, String> = expired.decode().unwrap();
    assert_eq!(map, [("reason".to_owned(), "expired".to_owned())].into());

    // The whole error body survives the strict profile.
    let bytes = capwire_envelope::to_vec(&body).unwrap();
    assert_eq!(
        capwire_envelope::from_slice::<capwire_envelope::ErrorBody>(&bytes).unwrap(),
        body
    );
}

#[test]
fn a_check_that_refuses_a_right_code_changes_nothing() {
    let now = Instant::now();
    let mut state = pending(None, now);
    // A wrong code never reaches the check.
    let wrong = state.try_bind_checked(&CP, "ZZZZZZZZZZ", now, |_| -> Result<(), ()> {
        panic!("the check runs only for a right code")
    });
    assert_eq!(
        wrong.unwrap_err(),
        Refused::Failed(BindFailure::WrongCode { attempts_left: 2 })
    );
    let refused = state.try_bind_checked(&CP, CODE, now, |next| {
        assert_eq!(next.controller(), Some(&CP));
        Err("no room")
    });
    assert_eq!(refused.unwrap_err(), Refused::Check("no room"));
    assert_eq!(state.binding(), Binding::UNBOUND);
    assert_eq!(
        state.pending(now).unwrap().attempts_left,
        2,
        "no attempt used"
    );
    assert!(state.try_bind(&CP, CODE, now).is_ok());
}

#[test]
fn an_undone_bind_puts_back_the_binding_and_the_pending_bind() {
    let now = Instant::now();
    let mut state = pending(Some(CP), now);
    let (bound, undo) = state
        .try_bind_checked(&CP, CODE, now, |_| Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(undo.epoch(), bound.epoch());
    assert!(state.undo_bind(undo));
    assert_eq!(state.binding().controller(), None);
    assert!(state.binding().epoch() > bound.epoch());
    // The code works again, with the attempts it had.
    assert_eq!(
        state.try_bind(&OTHER, CODE, now),
        Err(BindFailure::WrongSender)
    );
    assert_eq!(
        state.try_bind(&CP, CODE, now).unwrap().controller(),
        Some(&CP)
    );
}

#[test]
fn an_undo_after_a_newer_change_does_nothing() {
    let now = Instant::now();
    let mut state = pending(None, now);
    let (_, undo) = state
        .try_bind_checked(&CP, CODE, now, |_| Ok::<(), ()>(()))
        .unwrap();
    state.unbind();
    let after = state.binding();
    assert!(
        !state.undo_bind(undo),
        "the bind is not the binding any more"
    );
    assert_eq!(state.binding(), after);
}

#[test]
fn an_undone_unbind_binds_the_same_control_plane_again() {
    let now = Instant::now();
    let mut state = pending(None, now);
    state.try_bind(&CP, CODE, now).unwrap();
    let before = state.binding();
    let (previous, undo) = state.unbind_undoable().unwrap();
    assert_eq!(previous, CP);
    assert_eq!(state.binding().controller(), None);
    assert!(state.undo_bind(undo));
    assert_eq!(state.binding().controller(), Some(&CP));
    assert!(state.binding().epoch() > before.epoch() + 1);
    assert!(state.pending(now).is_none());
    assert!(BindingState::new().unbind_undoable().is_none());
}
