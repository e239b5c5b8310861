//! The published test vectors for Noise_XX_25519_ChaChaPoly_BLAKE2s.
//!
//! `tests/data/noise_xx_25519_chachapoly_blake2s.json` holds the entries for
//! this protocol copied verbatim from the `snow` 0.10.0 crate's
//! `tests/vectors/cacophony.txt` (the cacophony project's vectors, which
//! include the handshake hash) and `tests/vectors/snow.txt`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capwire_transport::{
    EntropyError, EntropySource, Initiator, Keypair, PROTOCOL_NAME, Responder, TransportSession,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    protocol_name: String,
    origin: String,
    init_prologue: String,
    init_static: String,
    init_ephemeral: String,
    resp_prologue: String,
    resp_static: String,
    resp_ephemeral: String,
    handshake_hash: Option<String>,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    payload: String,
    ciphertext: String,
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn key(s: &str) -> [u8; 32] {
    unhex(s).try_into().unwrap()
}

/// Hands out one fixed ephemeral key.
struct Fixed([u8; 32]);

impl EntropySource for Fixed {
    fn try_fill(&self, dest: &mut [u8]) -> Result<(), EntropyError> {
        dest.copy_from_slice(&self.0);
        Ok(())
    }
}

fn load() -> Vec<Vector> {
    let text = include_str!("data/noise_xx_25519_chachapoly_blake2s.json");
    let file: File = serde_json::from_str(text).unwrap();
    assert!(file.vectors.len() >= 2);
    file.vectors
}

/// Runs one vector; returns whether the handshake hash was checked.
fn run(v: &Vector) -> bool {
    assert_eq!(v.protocol_name, PROTOCOL_NAME);
    let init_kp = Keypair::from_secret_bytes(key(&v.init_static));
    let resp_kp = Keypair::from_secret_bytes(key(&v.resp_static));
    let init_prologue = unhex(&v.init_prologue);
    let resp_prologue = unhex(&v.resp_prologue);
    let m = &v.messages;
    assert!(m.len() >= 3);

    let initiator =
        Initiator::with_prologue(&init_kp, &init_prologue, &Fixed(key(&v.init_ephemeral))).unwrap();
    let responder =
        Responder::with_prologue(&resp_kp, &resp_prologue, &Fixed(key(&v.resp_ephemeral))).unwrap();

    let mut wire = Vec::new();
    let mut payload = Vec::new();
    let initiator = initiator
        .write_message(&unhex(&m[0].payload), &mut wire)
        .unwrap();
    assert_eq!(wire, unhex(&m[0].ciphertext), "{}: message 1", v.origin);
    let responder = responder.read_message(&wire, &mut payload).unwrap();
    assert_eq!(payload, unhex(&m[0].payload));

    wire.clear();
    payload.clear();
    let responder = responder
        .write_message(&unhex(&m[1].payload), &mut wire)
        .unwrap();
    assert_eq!(wire, unhex(&m[1].ciphertext), "{}: message 2", v.origin);
    let initiator = initiator.read_message(&wire, &mut payload).unwrap();
    assert_eq!(payload, unhex(&m[1].payload));
    assert_eq!(initiator.remote(), resp_kp.public());

    wire.clear();
    payload.clear();
    let mut init: TransportSession = initiator
        .write_message(&unhex(&m[2].payload), &mut wire)
        .unwrap();
    assert_eq!(wire, unhex(&m[2].ciphertext), "{}: message 3", v.origin);
    let mut resp = responder.read_message(&wire, &mut payload).unwrap();
    assert_eq!(payload, unhex(&m[2].payload));
    assert_eq!(resp.remote(), init_kp.public());
    assert_eq!(init.handshake_hash(), resp.handshake_hash());

    let checked_hash = match &v.handshake_hash {
        Some(h) => {
            assert_eq!(
                init.handshake_hash().to_vec(),
                unhex(h),
                "{}: handshake hash",
                v.origin
            );
            true
        }
        None => false,
    };

    // Transport messages alternate, starting with the responder (message 4).
    for (i, msg) in m.iter().enumerate().skip(3) {
        let (sender, receiver) = if i % 2 == 0 {
            (&mut init, &mut resp)
        } else {
            (&mut resp, &mut init)
        };
        wire.clear();
        payload.clear();
        sender.seal(&unhex(&msg.payload), &mut wire).unwrap();
        assert_eq!(
            wire,
            unhex(&msg.ciphertext),
            "{}: message {}",
            v.origin,
            i + 1
        );
        receiver.open(&wire, &mut payload).unwrap();
        assert_eq!(payload, unhex(&msg.payload));
    }
    checked_hash
}

#[test]
fn cacophony_vectors_pass_including_the_handshake_hash() {
    let vectors = load();
    let cacophony: Vec<_> = vectors.iter().filter(|v| v.origin == "cacophony").collect();
    assert!(!cacophony.is_empty());
    for v in cacophony {
        assert!(run(v), "the cacophony vector carries a handshake hash");
    }
}

#[test]
fn snow_vectors_pass() {
    let vectors = load();
    let snow: Vec<_> = vectors.iter().filter(|v| v.origin == "snow").collect();
    assert!(!snow.is_empty());
    for v in snow {
        run(v);
    }
}

#[test]
fn a_changed_prologue_breaks_the_vector() {
    let vectors = load();
    let v = &vectors[0];
    let initiator = Initiator::with_prologue(
        &Keypair::from_secret_bytes(key(&v.init_static)),
        b"another prologue",
        &Fixed(key(&v.init_ephemeral)),
    )
    .unwrap();
    let mut wire = Vec::new();
    let waiting = initiator
        .write_message(&unhex(&v.messages[0].payload), &mut wire)
        .unwrap();
    // Message 1 is sent in clear, so it still matches; message 2 from the
    // real responder no longer authenticates.
    assert_eq!(wire, unhex(&v.messages[0].ciphertext));
    let mut payload = Vec::new();
    assert!(
        waiting
            .read_message(&unhex(&v.messages[1].ciphertext), &mut payload)
            .is_err()
    );
    assert!(payload.is_empty());
}
