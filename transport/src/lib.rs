//! capwire's encrypted channel: `Noise_XX_25519_ChaChaPoly_BLAKE2s` between
//! two nodes whose identity is their static X25519 key, carrying opaque
//! records.
//!
//! ```
//! use capwire_transport::{ContactPolicy, Endpoint, Keypair, TransportConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), capwire_transport::TransportError> {
//! let alice = Endpoint::new(Keypair::generate()?, TransportConfig::default(), ContactPolicy::AcceptAny);
//! let bob = Endpoint::new(Keypair::generate()?, TransportConfig::default(), ContactPolicy::AcceptAny);
//! let bob_id = bob.local_id();
//!
//! // Any ordered byte stream works: TCP, Unix sockets, or this in-memory pair.
//! let (a_stream, b_stream) = tokio::io::duplex(64 * 1024);
//! let server = tokio::spawn(async move {
//!     let mut conn = bob.accept(b_stream).await?;
//!     let record = conn.recv().await?.expect("a record");
//!     conn.send(record).await?; // echo
//!     assert_eq!(conn.recv().await?, None); // alice closed
//!     Ok::<_, capwire_transport::TransportError>(())
//! });
//!
//! let mut conn = alice.connect(a_stream, Some(bob_id)).await?;
//! assert_eq!(conn.remote(), bob_id);
//! conn.send(&b"hello"[..]).await?;
//! assert_eq!(conn.recv().await?.as_deref(), Some(&b"hello"[..]));
//! conn.close("done").await?;
//! server.await.unwrap()?;
//! # Ok(())
//! # }
//! ```
//!
//! Layers, from the stream up:
//!
//! ```text
//!  stream      len:u16be | Noise message        (handshake: 3 messages, then transport)
//!  Noise       ChaCha20-Poly1305, nonce = counter, tag = 16 bytes
//!  records     chunks inside each plaintext: many small records per message,
//!              large records split across messages, close, rekey
//!  driver      writer task (coalesce, keepalive, write deadline)
//!              + reader task (idle deadline)
//! ```
//!
//! The protocol core does no I/O: [`Initiator`] and [`Responder`] consume
//! themselves message by message into a [`TransportSession`], whose
//! [`Sealer`] and [`Opener`] feed a [`RecordEncoder`] and a
//! [`RecordDecoder`]. [`Endpoint`] drives them over tokio streams. The
//! byte-level format is in the repository's `WIRE.md`, section 1.
//!
//! A caller that wants to drive a session itself (one task owning the
//! stream, say) runs only the handshake with
//! [`Endpoint::handshake_initiator`] or [`Endpoint::handshake_responder`],
//! gets the stream back in an [`Established`], and turns its session into
//! a record encoder and decoder with [`Endpoint::record_layer`]. It can
//! write records straight into the encoder's buffer with
//! [`RecordEncoder::begin_record`], and answer connections it has no room
//! for with [`Endpoint::refuse_busy`].

mod config;
mod connection;
mod endpoint;
mod error;
mod handshake;
mod keys;
mod policy;
mod record;
mod session;
mod symmetric;

pub use config::TransportConfig;
pub use connection::{Connection, ConnectionEnd, RecordReceiver, RecordSender};
pub use endpoint::{Endpoint, Established};
pub use error::{TransportError, Violation};
pub use handshake::{
    Initiator, InitiatorAwaitingReply, InitiatorReadyToFinish, MESSAGE_1_LEN, MESSAGE_2_LEN,
    MESSAGE_3_LEN, PROLOGUE, PROTOCOL_NAME, Responder, ResponderAwaitingFinish,
    ResponderReadyToReply,
};
pub use keys::{EntropyError, EntropySource, Keypair, OsEntropy, canonical_node_id};
pub use policy::ContactPolicy;
pub use record::{
    CHUNK_HEADER_LEN, CloseCode, CloseReason, Decoded, LENGTH_PREFIX_LEN, MAX_CLOSE_REASON_LEN,
    RecordDecoder, RecordEncoder, RecordWriter,
};
pub use session::{Opener, Sealer, TransportSession};

/// Largest Noise message on the wire, tag included (the length prefix is
/// two bytes).
pub const MAX_MESSAGE_LEN: usize = symmetric::MAX_MESSAGE_LEN;
/// Poly1305 tag length: the smallest possible transport message.
pub const TAG_LEN: usize = symmetric::TAGLEN;
