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

/// The worked example of WIRE.md section 1.8: capwire's prologue, empty
/// handshake payloads, then one coalesced transport message each way. The
/// keys are those of the cacophony vector; snow, configured the same way,
/// must produce the same bytes.
mod worked_example {
    pub(crate) const INIT_STATIC: &str =
        "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1";
    pub(crate) const INIT_EPHEMERAL: &str =
        "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a";
    pub(crate) const RESP_STATIC: &str =
        "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893";
    pub(crate) const RESP_EPHEMERAL: &str =
        "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b";
    pub(crate) const INIT_ID: &str =
        "6bc3822a2aa7f4e6981d6538692b3cdf3e6df9eea6ed269eb41d93c22757b75a";
    pub(crate) const RESP_ID: &str =
        "31e0303fd6418d2f8c0e78b91f22e8caed0fbe48656dcf4767e4834f701b8f62";
    pub(crate) const M1: &str =
        "0020ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c7944";
    pub(crate) const M2: &str = "006095ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f1448088437c365eb362a1c991b0557fe8a7fb187d99346765d93ec63db6c1b01504ebeec5f9b7e02400dced2825c0aac663bcd935d907d7847a0b34d9f2caa2fbf1539e07";
    pub(crate) const M3: &str = "004046c3307de83b014258717d97781c1f50936d8b7d50c0722a1739654d10392d4182c3d79b70bd2dd6b28434a5d3ca6934628ccfa9f43269723f5f810d74cfc332";
    pub(crate) const HASH: &str =
        "23e49e9171ed4db79d788acca43a9253e4d15373f33f58a2cf42e4c8b7e9663b";
    /// Initiator to responder: records "hello" and "" in one message.
    pub(crate) const T1_PLAIN: &str = "01000568656c6c6f010000";
    pub(crate) const T1: &str = "001b9a67ad04d33158d8fd9c120c13912ed8fb44b436ac1095a74615db";
    /// Responder to initiator: a close record, code 0, reason "bye".
    pub(crate) const T2_PLAIN: &str = "04000400627965";
    pub(crate) const T2: &str = "001792894cb3e8f1dc72ab9bd614888d0fe01b53d83d1d3c1b";
}

fn framed(msg: &[u8]) -> Vec<u8> {
    let mut v = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(msg);
    v
}

#[test]
fn the_worked_example_of_wire_md_holds() {
    use capwire_transport::{CloseCode, RecordEncoder};
    use worked_example as ex;
    let init_kp = Keypair::from_secret_bytes(key(ex::INIT_STATIC));
    let resp_kp = Keypair::from_secret_bytes(key(ex::RESP_STATIC));
    assert_eq!(init_kp.public().to_string(), ex::INIT_ID);
    assert_eq!(resp_kp.public().to_string(), ex::RESP_ID);
    let (mut m1, mut m2, mut m3, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let i = Initiator::new(&init_kp, &Fixed(key(ex::INIT_EPHEMERAL)))
        .unwrap()
        .write_message(&[], &mut m1)
        .unwrap();
    let r = Responder::new(&resp_kp, &Fixed(key(ex::RESP_EPHEMERAL)))
        .unwrap()
        .read_message(&m1, &mut p)
        .unwrap()
        .write_message(&[], &mut m2)
        .unwrap();
    let i = i
        .read_message(&m2, &mut p)
        .unwrap()
        .write_message(&[], &mut m3)
        .unwrap();
    let r = r.read_message(&m3, &mut p).unwrap();
    assert_eq!(framed(&m1), unhex(ex::M1));
    assert_eq!(framed(&m2), unhex(ex::M2));
    assert_eq!(framed(&m3), unhex(ex::M3));
    assert_eq!(i.handshake_hash().to_vec(), unhex(ex::HASH));

    let (i_send, _) = i.split();
    let (r_send, _) = r.split();
    let mut enc = RecordEncoder::new(i_send, 1 << 20, None);
    enc.push_record(b"hello").unwrap();
    enc.push_record(b"").unwrap();
    enc.flush().unwrap();
    assert_eq!(enc.wire(), unhex(ex::T1));
    let mut enc = RecordEncoder::new(r_send, 1 << 20, None);
    enc.close(CloseCode::Normal, "bye").unwrap();
    assert_eq!(enc.wire(), unhex(ex::T2));

    // snow, given the same keys, prologue and plaintexts, writes the same bytes.
    let params = PROTOCOL_NAME.parse().unwrap();
    let (is, rs) = (unhex(ex::INIT_STATIC), unhex(ex::RESP_STATIC));
    let (ie, re) = (unhex(ex::INIT_EPHEMERAL), unhex(ex::RESP_EPHEMERAL));
    let mut si = snow::Builder::new(params)
        .local_private_key(&is)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&ie)
        .prologue(capwire_transport::PROLOGUE)
        .unwrap()
        .build_initiator()
        .unwrap();
    let mut sr = snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(&rs)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&re)
        .prologue(capwire_transport::PROLOGUE)
        .unwrap()
        .build_responder()
        .unwrap();
    let (mut buf, mut pl) = (vec![0u8; 256], vec![0u8; 256]);
    let n = si.write_message(&[], &mut buf).unwrap();
    assert_eq!(framed(&buf[..n]), unhex(ex::M1));
    sr.read_message(&buf[..n], &mut pl).unwrap();
    let n = sr.write_message(&[], &mut buf).unwrap();
    assert_eq!(framed(&buf[..n]), unhex(ex::M2));
    si.read_message(&buf[..n], &mut pl).unwrap();
    let n = si.write_message(&[], &mut buf).unwrap();
    assert_eq!(framed(&buf[..n]), unhex(ex::M3));
    sr.read_message(&buf[..n], &mut pl).unwrap();
    assert_eq!(si.get_handshake_hash(), unhex(ex::HASH));
    let mut si = si.into_transport_mode().unwrap();
    let mut sr = sr.into_transport_mode().unwrap();
    let n = si.write_message(&unhex(ex::T1_PLAIN), &mut buf).unwrap();
    assert_eq!(framed(&buf[..n]), unhex(ex::T1));
    let n = sr.write_message(&unhex(ex::T2_PLAIN), &mut buf).unwrap();
    assert_eq!(framed(&buf[..n]), unhex(ex::T2));
}
