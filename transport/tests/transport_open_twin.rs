//! The property-test twin of the `transport_open` fuzz target: after a
//! real handshake, replayed, reordered, tampered, cut, joined and made-up
//! messages never panic the receiver, and no plaintext comes out that the
//! sender did not seal at that point; honest traffic always gets through.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/transport_open.rs"]
mod transport_open;

use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Message-level plans: a few plaintexts, each a length and its bytes.
fn message_plan() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6).prop_map(
        |plaintexts| {
            let mut plan = Vec::new();
            for p in plaintexts {
                plan.push(u8::try_from(p.len()).unwrap());
                plan.extend_from_slice(&p);
            }
            plan
        },
    )
}

/// Stream-level plans: small records mostly, some split ones, flushes,
/// keepalives and now and then a close.
fn stream_plan() -> impl Strategy<Value = Vec<u8>> {
    let cmd = prop_oneof![
        6 => (0u16..700).prop_map(|n| [0, (n >> 8) as u8, n as u8]),
        1 => (5_000u16..6_000).prop_map(|n| [1, (n >> 8) as u8, n as u8]),
        2 => Just([2, 0, 0]),
        1 => Just([3, 0, 0]),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(len, code)| [4, len, code]),
    ];
    proptest::collection::vec(cmd, 0..8).prop_map(|cmds| cmds.concat())
}

/// Attack scripts: mostly honest deliveries, with replays, flips, cuts,
/// raw bytes and joins mixed in.
fn script() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![
        6 => Just(vec![0]),
        1 => any::<u8>().prop_map(|a| vec![1, a]),
        2 => (any::<u8>(), any::<u8>(), 1u8..=255).prop_map(|(a, at, x)| vec![2, a, at, x]),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, cut)| vec![3, a, cut]),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(|raw| {
            [vec![4, u8::try_from(raw.len()).unwrap()], raw].concat()
        }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| vec![5, a, b]),
        1 => Just(vec![6]),
    ];
    proptest::collection::vec(op, 0..10).prop_map(|ops| ops.concat())
}

fn input(plan: impl Strategy<Value = Vec<u8>>, stream: bool) -> impl Strategy<Value = Vec<u8>> {
    (any::<u8>(), plan, script()).prop_map(move |(flags, plan, script)| {
        let flags = if stream { flags | 1 } else { flags & !1 };
        let mut data = vec![flags];
        data.extend_from_slice(&u16::try_from(plan.len()).unwrap().to_be_bytes());
        data.extend_from_slice(&plan);
        data.extend_from_slice(&script);
        data
    })
}

proptest! {
    #![proptest_config(config(100))]

    /// Message by message through the receiving half of a session.
    #[test]
    fn open_releases_only_what_was_sealed_next(data in input(message_plan(), false)) {
        transport_open::check(&data);
    }

    /// A byte stream through a record decoder.
    #[test]
    fn record_decoder_releases_only_a_prefix_of_what_was_sent(data in input(stream_plan(), true)) {
        transport_open::check(&data);
    }

    /// Raw bytes.
    #[test]
    fn receiver_survives_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        transport_open::check(&data);
    }
}

/// Honest traffic, including split records, rekeys and a close, gets
/// through whole whatever the read sizes.
#[test]
fn honest_streams_get_through() {
    let plan = [
        &[0u8, 0, 5][..],
        &[1, 0x60, 0],
        &[3, 0, 0],
        &[0, 1, 0],
        &[2, 0, 0],
        &[4, 7, 2],
    ]
    .concat();
    for flags in [1u8, 3, 5, 7, 9, 11, 0xf9] {
        let mut data = vec![flags];
        data.extend_from_slice(&u16::try_from(plan.len()).unwrap().to_be_bytes());
        data.extend_from_slice(&plan);
        data.push(6);
        transport_open::check(&data);
    }
}
