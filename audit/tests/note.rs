//! Signed checkpoints: text shape, key derivation, strict parsing.

#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use blake2::Blake2sMac256;
use blake2::digest::{KeyInit, Mac};
use capwire_audit::*;
use ed25519_dalek::{Signature, SigningKey, Verifier as _};
use sha2::{Digest, Sha256};

const NAME: &str = "capwire.example/audit";

fn checkpoint() -> Checkpoint {
    Checkpoint {
        origin: NAME.into(),
        size: 1234,
        root: leaf_hash(b"root"),
        extensions: vec!["ext one".into(), "\u{e9}xt 2".into()],
    }
}

fn key() -> AuditKey {
    AuditKey::from_secret(&[9; 32], NAME).unwrap()
}

/// The Ed25519 seed BLAKE2s-MAC-256(secret, label), as authz does it.
fn derived(secret: &[u8; 32], label: &[u8]) -> [u8; 32] {
    let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(secret).unwrap();
    mac.update(label);
    let seed: [u8; 32] = mac.finalize().into_bytes().into();
    SigningKey::from_bytes(&seed).verifying_key().to_bytes()
}

#[test]
fn round_trip_and_exact_shape() {
    let (key, c) = (key(), checkpoint());
    let note = key.sign(&c);
    assert_eq!(key.verifier().verify(&note), Ok(c.clone()));
    assert_eq!(
        NoteVerifier::parse(&key.verifier_key())
            .unwrap()
            .verify(&note),
        Ok(c.clone())
    );

    let body = format!(
        "{NAME}\n1234\n{}\next one\n\u{e9}xt 2\n",
        B64.encode(c.root)
    );
    assert_eq!(c.body(), body);
    assert_eq!(Checkpoint::parse_body(&body), Ok(c.clone()));
    let line = note
        .strip_prefix(&format!("{body}\n\u{2014} {NAME} "))
        .unwrap();
    let blob = B64.decode(line.strip_suffix('\n').unwrap()).unwrap();
    assert_eq!(blob.len(), 68);

    let public = key.public();
    let digest = Sha256::digest([NAME.as_bytes(), b"\n\x01", &public[..]].concat());
    assert_eq!(key.key_id(), digest[..4]);
    assert_eq!(blob[..4], digest[..4]);
    let sig = Signature::from_slice(&blob[4..]).unwrap();
    ed25519_dalek::VerifyingKey::from_bytes(&public)
        .unwrap()
        .verify(body.as_bytes(), &sig)
        .unwrap();

    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let vkey = format!(
        "{NAME}+{hex}+{}",
        B64.encode([&[1u8][..], &public[..]].concat())
    );
    assert_eq!(key.verifier_key(), vkey);
    assert_eq!(NoteVerifier::parse(&vkey), Ok(key.verifier()));
    assert_eq!(NoteVerifier::new(NAME, &public), Ok(key.verifier()));
}

#[test]
fn key_derivation_is_stable_and_domain_separated() {
    let secret = [5; 32];
    let a = AuditKey::from_secret(&secret, "a").unwrap();
    assert_eq!(
        a.public(),
        AuditKey::from_secret(&secret, "b").unwrap().public()
    );
    assert_eq!(a.public(), derived(&secret, b"capwire audit key v1"));
    assert_ne!(a.public(), derived(&secret, b"capwire grant key v1"));
    assert_ne!(
        a.public(),
        AuditKey::from_secret(&[6; 32], "a").unwrap().public()
    );
    assert_eq!(a.name(), "a");
    for bad in ["", "a b", "a+b", "a\tb", "a\u{2003}b"] {
        assert_eq!(
            AuditKey::from_secret(&secret, bad).err(),
            Some(NoteError::BadKeyName),
            "{bad:?}"
        );
    }
}

#[test]
fn any_flipped_byte_fails() {
    let (key, note) = (key(), key().sign(&checkpoint()));
    let v = key.verifier();
    for i in 0..note.len() {
        let mut bytes = note.clone().into_bytes();
        bytes[i] ^= 1;
        if let Ok(text) = String::from_utf8(bytes) {
            assert!(v.verify(&text).is_err(), "byte {i}");
        }
    }
}

#[test]
fn other_keys_and_extra_signatures() {
    let (key, c) = (key(), checkpoint());
    let note = key.sign(&c);
    let other = AuditKey::from_secret(&[1; 32], "witness.example").unwrap();
    let same_name = AuditKey::from_secret(&[1; 32], NAME).unwrap();
    assert_eq!(other.verifier().verify(&note), Err(NoteError::NoSignature));
    assert_eq!(
        key.verifier().verify(&same_name.sign(&c)),
        Err(NoteError::NoSignature)
    );

    // A witness's cosignature line (76 bytes: id, timestamp, signature) and
    // another log key's line are skipped, before or after ours.
    let witness = format!("\u{2014} witness.example {}\n", B64.encode([7u8; 76]));
    let theirs = same_name.sign(&c);
    let theirs = theirs.rsplit_once("\n\n").unwrap().1;
    let two = format!("{note}{witness}{theirs}");
    assert_eq!(key.verifier().verify(&two), Ok(c.clone()));
    assert_eq!(same_name.verifier().verify(&two), Ok(c.clone()));
    let (body, ours) = note.rsplit_once("\n\n").unwrap();
    let before = format!("{body}\n\n{witness}{ours}");
    assert_eq!(key.verifier().verify(&before), Ok(c.clone()));
    assert_eq!(
        key.verifier().verify(&format!("{body}\n\n{witness}")),
        Err(NoteError::NoSignature)
    );

    // Our id and name with a bad signature.
    let forged = format!(
        "{body}\n\n\u{2014} {NAME} {}\n",
        B64.encode([&key.key_id()[..], &[0; 64]].concat())
    );
    assert_eq!(key.verifier().verify(&forged), Err(NoteError::BadSignature));
}

#[test]
fn malformed_checkpoints() {
    let root = B64.encode([3; 32]);
    let cases: &[(String, NoteError)] = &[
        (
            format!("o\n12\n{root}"),
            NoteError::Malformed("checkpoint does not end in a newline"),
        ),
        (
            "o\n12\n".into(),
            NoteError::Malformed("missing root hash line"),
        ),
        ("o\n".into(), NoteError::Malformed("missing tree size line")),
        (
            format!("\n12\n{root}\n"),
            NoteError::Malformed("bad origin line"),
        ),
        (
            format!("o\r\n12\n{root}\n"),
            NoteError::Malformed("bad origin line"),
        ),
        (format!("o\n012\n{root}\n"), NoteError::BadTreeSize),
        (format!("o\n+12\n{root}\n"), NoteError::BadTreeSize),
        (format!("o\n\n{root}\n"), NoteError::BadTreeSize),
        (
            format!("o\n18446744073709551616\n{root}\n"),
            NoteError::BadTreeSize,
        ),
        ("o\n12\n!!!!\n".into(), NoteError::BadRootHash),
        (
            format!("o\n12\n{}\n", B64.encode([3; 31])),
            NoteError::BadRootHash,
        ),
        (
            format!("o\n12\n{}\n", root.trim_end_matches('=')),
            NoteError::BadRootHash,
        ),
        (
            format!("o\n12\n{root}\n\nx\n"),
            NoteError::Malformed("bad extension line"),
        ),
    ];
    for (text, err) in cases {
        assert_eq!(Checkpoint::parse_body(text).as_ref(), Err(err), "{text:?}");
    }
    let c = Checkpoint::parse_body(&format!("o\n0\n{root}\n")).unwrap();
    assert_eq!((c.size, c.validate()), (0, Ok(())));
    let bad = Checkpoint {
        origin: "a\nb".into(),
        ..c
    };
    assert!(bad.validate().is_err());
}

#[test]
fn malformed_notes() {
    let (key, c) = (key(), checkpoint());
    let v = key.verifier();
    let note = key.sign(&c);
    let (body, sig) = note.rsplit_once("\n\n").unwrap();
    let huge = format!("{}\n{note}", "x".repeat(MAX_NOTE_LEN));
    assert_eq!(
        v.verify(&huge),
        Err(NoteError::TooLarge { len: huge.len() })
    );
    let many = format!("{note}{}", sig.repeat(MAX_SIGNATURES));
    assert_eq!(v.verify(&many), Err(NoteError::TooManySignatures));
    assert_eq!(
        v.verify(&format!("{note}{}", sig.repeat(MAX_SIGNATURES - 1))),
        Ok(c)
    );
    let m = NoteError::Malformed;
    let cases = [
        (body.to_owned(), m("no blank line before the signatures")),
        (
            format!("{body}\n\n"),
            m("no signature line, or no final newline"),
        ),
        (
            note.trim_end().to_owned(),
            m("no signature line, or no final newline"),
        ),
        (note.replace('\u{2014}', "-"), m("bad signature line")),
        (
            note.replace("\u{2014} ", "\u{2014}  "),
            m("bad signature key name"),
        ),
        (format!("{note}\u{2014} x\n"), m("bad signature line")),
        (format!("{note}\u{2014} x AAAA\n"), m("signature too short")),
        (
            format!("{note}\u{2014} x AAAAAAA\n"),
            m("signature is not base64"),
        ),
        (note.replace(NAME, "o\u{7}"), m("control character")),
        (
            format!("{body}\n\n{sig}\n"),
            m("no signature line, or no final newline"),
        ),
        (
            note.replace("\n1234\n", "\n01234\n"),
            NoteError::BadTreeSize,
        ),
    ];
    for (text, err) in cases {
        assert_eq!(v.verify(&text), Err(err), "{text:?}");
    }
}

#[test]
fn bad_verifier_keys() {
    let vkey = key().verifier_key();
    let (name, rest) = vkey.split_once('+').unwrap();
    let (id, k) = rest.split_once('+').unwrap();
    let bad = NoteError::BadVerifierKey;
    let cases = [
        (format!("{name}+{id}"), bad("not name+id+key")),
        (
            format!("{name}+{}+{k}", &id[1..]),
            bad("key id is not 8 hex digits"),
        ),
        (
            format!(
                "{name}+{:08x}+{k}",
                u32::from_str_radix(id, 16).unwrap() ^ 1
            ),
            bad("key id does not match the key"),
        ),
        (format!("{name}+{id}+{}", &k[1..]), bad("key is not base64")),
        (
            format!("{name}+{id}+{}", B64.encode([2; 33])),
            bad("not an Ed25519 key"),
        ),
        (
            format!("{name}+{id}+{}", B64.encode([1; 32])),
            bad("Ed25519 key is not 32 bytes"),
        ),
        (format!("x y+{id}+{k}"), NoteError::BadKeyName),
    ];
    for (text, err) in cases {
        assert_eq!(NoteVerifier::parse(&text), Err(err), "{text:?}");
    }
    assert_eq!(
        NoteVerifier::parse(&vkey.replace(id, &id.to_uppercase()))
            .unwrap()
            .key_id(),
        key().key_id()
    );
}
