//! Wire records of capwire and the strict CBOR profile they travel in.
//!
//! ```
//! use capwire_envelope::{
//!     decode_frame, encode_frame, CapId, ControlEnvelope, Frame, FrameRef, RawValue, ReqId, Verb,
//! };
//!
//! // Sending: an owned envelope, encoded by appending to a buffer.
//! let envelope = ControlEnvelope::new(
//!     CapId::try_from("app.echo").unwrap(),
//!     Verb::try_from("say").unwrap(),
//!     ReqId::from_u64(42),
//!     RawValue::encode(&("hello",)).unwrap(),
//! );
//! let mut record = Vec::new();
//! encode_frame(&Frame::Control(envelope), &mut record).unwrap();
//!
//! // Receiving: the header is decoded in place; args stay raw, validated
//! // CBOR until the handler's own type asks for them.
//! let FrameRef::Control(control) = decode_frame(&record).unwrap() else { unreachable!() };
//! assert_eq!((control.cap, control.verb), ("app.echo", "say"));
//! let (text,): (String,) = control.decode_args().unwrap();
//! assert_eq!(text, "hello");
//! ```
//!
//! ```text
//!  record bytes ──decode_frame──▶ FrameRef { header fields, args: &[u8] }
//!                                   │            │
//!                     chokepoint reads cap/verb  └─decode_args::<T>()─▶ T
//!  Frame / encode_control ──encode_*──▶ record bytes (appended to a Vec)
//! ```
//!
//! # The strict profile
//! Every decoder here accepts exactly one CBOR data item that uses definite
//! lengths only, no tags, shortest-form integers, lengths and floats, only
//! `false`, `true` and `null` as simple values, valid UTF-8 text, map keys
//! that are integers or strings and unique within their map, at most
//! [`MAX_DEPTH`] nested arrays and maps, and no trailing bytes. Every length
//! is compared with the remaining input before it is used, so a hostile
//! header can neither allocate memory nor overflow the stack. Everything the
//! encoders produce passes the same checks.

mod cbor;
mod code;
mod error;
mod frame;
mod id;
mod raw;
mod transcode;

pub use cbor::{MAX_DEPTH, validate, validate_nested};
pub use code::{
    AppCode, CloseCode, ErrorBody, ErrorCode, MAX_APP_CODE_LEN, MAX_MESSAGE_LEN, MAX_REASON_LEN,
};
pub use error::{DecodeError, EncodeError};
pub use frame::{
    CONTROL_OVERHEAD, Cancel, Close, CloseRef, ControlEnvelope, ControlRef, Credit, Frame,
    FrameKind, FrameRef, Hello, HelloRef, ITEM_OVERHEAD, ItemRef, Limits, MAX_NAME_LEN,
    PROTOCOL_V2, PROTOCOL_V3, PROTOCOL_VERSION, ResponseEnvelope, ResponseRef, StreamItem,
    decode_frame, encode_cancel, encode_close, encode_control, encode_control_serialize,
    encode_control_value, encode_credit, encode_frame, encode_item, encode_item_serialize,
    encode_keepalive, encode_response_err, encode_response_ok, encode_response_value,
};
pub use id::{
    CapId, IdError, MAX_CAP_ID_LEN, MAX_REQ_ID_LEN, MAX_VERB_LEN, Namespace, NodeId, ReqId, Verb,
};
pub use raw::{RawValue, encode_into, from_slice, to_vec};
