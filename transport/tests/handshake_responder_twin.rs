//! The property-test twin of the `handshake_responder` fuzz target: a
//! responder fed random, low-order, replayed and tampered handshake
//! messages never panics, fails only with peer faults, and finishes only
//! on the real initiator's message 3.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/handshake_responder.rs"]
mod handshake_responder;

use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Low-order points (and their bit-255 twins) as a message 1.
fn low_order() -> impl Strategy<Value = Vec<u8>> {
    let mut one = [0u8; 32];
    one[0] = 1;
    let mut order8 = [0u8; 32];
    order8.copy_from_slice(&[
        0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4,
        0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49,
        0xb8, 0x00,
    ]);
    let mut p = [0xffu8; 32];
    p[0] = 0xed;
    p[31] = 0x7f;
    (
        proptest::sample::select(vec![[0u8; 32], one, order8, p]),
        any::<bool>(),
    )
        .prop_map(|(mut point, high)| {
            if high {
                point[31] |= 0x80;
            }
            point.to_vec()
        })
}

fn tamper_spec() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(op, rest)| [vec![op], rest].concat()),
        1 => (0u8..1, 0usize..80, 1u8..=255).prop_map(|(op, at, x)| {
            // One flipped byte somewhere in the message.
            let mut spec = vec![op; at + 2];
            spec[1..].fill(0);
            spec[at + 1] = x;
            spec
        }),
    ]
}

fn encode(flags: u8, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut data = vec![flags];
    for p in parts {
        data.extend_from_slice(&u16::try_from(p.len()).unwrap().to_be_bytes());
        data.extend_from_slice(p);
    }
    data
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    let payload = || proptest::collection::vec(any::<u8>(), 0..40);
    let message = prop_oneof![
        payload(),
        low_order(),
        proptest::collection::vec(any::<u8>(), 30..100),
    ];
    (
        any::<u8>(),
        message,
        proptest::collection::vec(any::<u8>(), 0..100),
        payload(),
        tamper_spec(),
        tamper_spec(),
    )
        .prop_map(|(flags, p0, p1, p2, t1, t3)| encode(flags, &[p0, p1, p2, t1, t3]))
}

proptest! {
    #![proptest_config(config(150))]

    /// Structured handshakes: raw, low-order, real and tampered messages.
    #[test]
    fn responder_refuses_everything_but_the_real_initiator(data in input()) {
        handshake_responder::check(&data);
    }

    /// The same on raw bytes.
    #[test]
    fn responder_survives_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        handshake_responder::check(&data);
    }
}

/// Untampered real handshakes in every variant, including the prologue
/// mismatch and the non-canonical static key, always end as expected.
#[test]
fn real_handshakes_in_every_variant() {
    for flags in 0..16u8 {
        handshake_responder::check(&encode(
            flags | 2,
            &[b"one".to_vec(), b"three".to_vec(), b"two".to_vec()],
        ));
        handshake_responder::check(&encode(flags | 1, &[b"one".to_vec(), vec![0; 64]]));
        handshake_responder::check(&encode(flags & !3, &[vec![9; 32], vec![0; 64]]));
    }
}
