//! The frames a connection carries: owned forms for sending, borrowed forms
//! decoded in place for receiving, and their encoders.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::cbor::{self, Cursor, Head, MAX_DEPTH, skip_item, validate};
use crate::code::{
    CloseCode, ErrorBody, ErrorCode, MAX_APP_CODE_LEN, MAX_MESSAGE_LEN, MAX_REASON_LEN,
    truncate_str,
};
use crate::error::{DecodeError, EncodeError, name_for_error};
use crate::id::{CapId, IdError, MAX_REQ_ID_LEN, ReqId, Verb};
use crate::raw::{RawValue, decode_validated};

/// The protocol version every session starts with: the `protocol` of every
/// node's first hello.
pub const PROTOCOL_VERSION: u32 = 1;

/// The highest protocol version this crate speaks: version 2 adds the
/// [`item`](StreamItem) and [`credit`](Credit) frames of streams. A
/// session speaks it when both sides say so in their first hellos (the
/// node runtime decides; WIRE.md 4.1); its hellos after that name it.
pub const PROTOCOL_V2: u32 = 2;

/// Protocol version 3: the same frames as version 2; it adds `core.audit`
/// (WIRE.md 5.6). A session speaks it when both sides' first hellos say
/// they do (WIRE.md 4.1).
pub const PROTOCOL_V3: u32 = 3;

/// Longest `cap` or `verb` text a received control frame may carry, in bytes.
///
/// The codec accepts any text up to this length, valid identifier or not, so
/// that the chokepoint, not the codec, answers a bad name (with
/// `unknown_verb`) instead of the connection being closed.
pub const MAX_NAME_LEN: usize = 128;

const TYPE_KEY: &str = "type";

/// The kind of a frame, as named by its `type` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FrameKind {
    /// `hello`: the sender's protocol version, manifest and limits.
    Hello,
    /// `control`: a request or a notification.
    Control,
    /// `response`: the outcome of a request.
    Response,
    /// `cancel`: the caller gives up on a request.
    Cancel,
    /// `close`: the sender is closing the connection.
    Close,
    /// `keepalive`: nothing, to show the connection is alive.
    Keepalive,
    /// `item` (protocol 2): one item of a stream.
    Item,
    /// `credit` (protocol 2): more room for a stream's items.
    Credit,
}

impl FrameKind {
    /// Every frame kind.
    pub const ALL: [FrameKind; 8] = [
        FrameKind::Hello,
        FrameKind::Control,
        FrameKind::Response,
        FrameKind::Cancel,
        FrameKind::Close,
        FrameKind::Keepalive,
        FrameKind::Item,
        FrameKind::Credit,
    ];

    /// The lowest protocol version that has this frame kind.
    pub fn since(self) -> u32 {
        match self {
            FrameKind::Item | FrameKind::Credit => PROTOCOL_V2,
            _ => PROTOCOL_VERSION,
        }
    }

    /// The wire string of the `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Hello => "hello",
            FrameKind::Control => "control",
            FrameKind::Response => "response",
            FrameKind::Cancel => "cancel",
            FrameKind::Close => "close",
            FrameKind::Keepalive => "keepalive",
            FrameKind::Item => "item",
            FrameKind::Credit => "credit",
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a node tells its peer about the records it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The largest record (encoded frame) the sender accepts, in bytes.
    pub max_record: u32,
    /// How many requests from this peer the sender runs at once; more are
    /// answered `overloaded`.
    pub max_inflight: u32,
    /// The sender sends a keepalive after this many idle milliseconds; the
    /// receiver may treat a much longer silence as a dead connection.
    pub keepalive_ms: u32,
}

impl Default for Limits {
    /// 1 MiB records, 64 requests in flight, a keepalive every 15 s.
    fn default() -> Self {
        Self {
            max_record: 1 << 20,
            max_inflight: 64,
            keepalive_ms: 15_000,
        }
    }
}

/// The first frame each side sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The protocol version, [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The sender's manifest, as encoded by the manifest crate.
    pub manifest: RawValue,
    /// The sender's limits.
    pub limits: Limits,
}

impl Hello {
    /// A hello for [`PROTOCOL_VERSION`].
    pub fn new(manifest: RawValue, limits: Limits) -> Self {
        Self {
            protocol: PROTOCOL_VERSION,
            manifest,
            limits,
        }
    }
}

/// A request (non-empty `req_id`) or a notification (empty `req_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlEnvelope {
    /// The capability addressed.
    pub cap: CapId,
    /// The operation within it.
    pub verb: Verb,
    /// The correlation token; [`ReqId::EMPTY`] for fire-and-forget.
    pub req_id: ReqId,
    /// How many milliseconds the caller grants the callee, if it sets a deadline.
    pub budget_ms: Option<u64>,
    /// The arguments, interpreted by the verb's handler.
    pub args: RawValue,
}

impl ControlEnvelope {
    /// An envelope without a budget.
    pub fn new(cap: CapId, verb: Verb, req_id: ReqId, args: RawValue) -> Self {
        Self {
            cap,
            verb,
            req_id,
            budget_ms: None,
            args,
        }
    }
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseEnvelope {
    /// The request's id (never empty).
    pub req_id: ReqId,
    /// The handler's result, or why there is none.
    pub outcome: Result<RawValue, ErrorBody>,
}

impl ResponseEnvelope {
    /// A successful response.
    pub fn ok(req_id: ReqId, result: RawValue) -> Self {
        Self {
            req_id,
            outcome: Ok(result),
        }
    }

    /// A failed response.
    pub fn err(req_id: ReqId, error: ErrorBody) -> Self {
        Self {
            req_id,
            outcome: Err(error),
        }
    }
}

/// The caller no longer wants the outcome of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    /// The request's id (never empty).
    pub req_id: ReqId,
}

/// One item of a stream (protocol 2): sent by the callee of a stream
/// verb, within the credit its caller granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamItem {
    /// The stream's request id (never empty).
    pub req_id: ReqId,
    /// The item.
    pub item: RawValue,
}

/// More room for a stream's items (protocol 2): sent by the caller of a
/// stream verb. Credit adds up; the callee never sends beyond it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    /// The stream's request id (never empty).
    pub req_id: ReqId,
    /// How many more items may be sent.
    pub items: u32,
    /// How many more bytes of items (each item's encoded `item` value)
    /// may be sent.
    pub bytes: u32,
}

/// The sender is closing the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// Why.
    pub code: CloseCode,
    /// Details for people; the encoder cuts it to [`MAX_REASON_LEN`] bytes.
    pub reason: String,
}

/// A frame to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// See [`Hello`].
    Hello(Hello),
    /// See [`ControlEnvelope`].
    Control(ControlEnvelope),
    /// See [`ResponseEnvelope`].
    Response(ResponseEnvelope),
    /// See [`Cancel`].
    Cancel(Cancel),
    /// See [`Close`].
    Close(Close),
    /// A frame with no content.
    Keepalive,
    /// See [`StreamItem`].
    Item(StreamItem),
    /// See [`Credit`].
    Credit(Credit),
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello(_) => FrameKind::Hello,
            Frame::Control(_) => FrameKind::Control,
            Frame::Response(_) => FrameKind::Response,
            Frame::Cancel(_) => FrameKind::Cancel,
            Frame::Close(_) => FrameKind::Close,
            Frame::Keepalive => FrameKind::Keepalive,
            Frame::Item(_) => FrameKind::Item,
            Frame::Credit(_) => FrameKind::Credit,
        }
    }

    /// Encodes the frame into a new buffer.
    ///
    /// # Errors
    /// As [`encode_frame`].
    pub fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        encode_frame(self, &mut out)?;
        Ok(out)
    }
}

/// A received hello, borrowing from the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRef<'a> {
    /// The peer's protocol version (any `u32`; the runtime decides what it accepts).
    pub protocol: u32,
    /// The peer's manifest: one validated data item.
    pub manifest: &'a [u8],
    /// The peer's limits.
    pub limits: Limits,
}

impl HelloRef<'_> {
    /// Decodes the manifest into `T`.
    ///
    /// # Errors
    /// [`DecodeError::Deserialize`] when it does not fit `T`.
    pub fn decode_manifest<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        decode_validated(self.manifest)
    }

    /// An owned copy.
    pub fn to_hello(&self) -> Hello {
        Hello {
            protocol: self.protocol,
            manifest: RawValue::from_validated(self.manifest),
            limits: self.limits,
        }
    }
}

/// A received control envelope, borrowing from the record. Its `args` are
/// validated but not decoded, so authorization can run first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRef<'a> {
    /// The capability named by the peer: any text of up to
    /// [`MAX_NAME_LEN`] bytes, not necessarily a valid [`CapId`].
    pub cap: &'a str,
    /// The verb named by the peer: any text of up to [`MAX_NAME_LEN`]
    /// bytes, not necessarily a valid [`Verb`].
    pub verb: &'a str,
    /// The request id (validated).
    pub req_id: ReqId,
    /// The budget the caller grants, in milliseconds.
    pub budget_ms: Option<u64>,
    /// The args: one validated data item.
    pub args: &'a [u8],
    /// *(protocol 3)* The caller's trace context (WIRE.md 2.2): one
    /// validated data item, not judged here (the receiver's tracing drops
    /// a malformed one; a session below protocol 3 ignores it).
    pub trace: Option<&'a [u8]>,
}

impl ControlRef<'_> {
    /// A copy of the args.
    pub fn args_raw(&self) -> RawValue {
        RawValue::from_validated(self.args)
    }

    /// Decodes the args into `T`.
    ///
    /// # Errors
    /// [`DecodeError::Deserialize`] when they do not fit `T`.
    pub fn decode_args<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        decode_validated(self.args)
    }

    /// An owned copy.
    ///
    /// # Errors
    /// [`DecodeError::InvalidId`] when `cap` or `verb` is not a valid identifier.
    pub fn to_envelope(&self) -> Result<ControlEnvelope, DecodeError> {
        Ok(ControlEnvelope {
            cap: CapId::try_from(self.cap)?,
            verb: Verb::try_from(self.verb)?,
            req_id: self.req_id.clone(),
            budget_ms: self.budget_ms,
            args: self.args_raw(),
        })
    }
}

/// A received response, borrowing its result from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseRef<'a> {
    /// The request id (validated, never empty).
    pub req_id: ReqId,
    /// The result (one validated data item) or the error.
    pub outcome: Result<&'a [u8], ErrorBody>,
}

impl ResponseRef<'_> {
    /// Decodes a successful result into `T`; a failed response gives its
    /// [`ErrorBody`] in the inner `Err`.
    ///
    /// # Errors
    /// [`DecodeError::Deserialize`] when the result does not fit `T`.
    pub fn decode_result<T: DeserializeOwned>(&self) -> Result<Result<T, ErrorBody>, DecodeError> {
        match &self.outcome {
            Ok(raw) => decode_validated(raw).map(Ok),
            Err(body) => Ok(Err(body.clone())),
        }
    }

    /// An owned copy.
    pub fn to_envelope(&self) -> ResponseEnvelope {
        ResponseEnvelope {
            req_id: self.req_id.clone(),
            outcome: match &self.outcome {
                Ok(raw) => Ok(RawValue::from_validated(raw)),
                Err(body) => Err(body.clone()),
            },
        }
    }
}

/// A received stream item, borrowing the item from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// The stream's request id (validated, never empty).
    pub req_id: ReqId,
    /// The item: one validated data item.
    pub item: &'a [u8],
}

impl ItemRef<'_> {
    /// An owned copy.
    pub fn to_item(&self) -> StreamItem {
        StreamItem {
            req_id: self.req_id.clone(),
            item: RawValue::from_validated(self.item),
        }
    }
}

/// A received close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseRef<'a> {
    /// Why.
    pub code: CloseCode,
    /// Details for people (at most [`MAX_REASON_LEN`] bytes).
    pub reason: &'a str,
}

/// A received frame, decoded in place by [`decode_frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameRef<'a> {
    /// See [`HelloRef`].
    Hello(HelloRef<'a>),
    /// See [`ControlRef`].
    Control(ControlRef<'a>),
    /// See [`ResponseRef`].
    Response(ResponseRef<'a>),
    /// See [`Cancel`].
    Cancel(Cancel),
    /// See [`CloseRef`].
    Close(CloseRef<'a>),
    /// A keepalive.
    Keepalive,
    /// See [`ItemRef`] (protocol 2).
    Item(ItemRef<'a>),
    /// See [`Credit`] (protocol 2).
    Credit(Credit),
}

impl FrameRef<'_> {
    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            FrameRef::Hello(_) => FrameKind::Hello,
            FrameRef::Control(_) => FrameKind::Control,
            FrameRef::Response(_) => FrameKind::Response,
            FrameRef::Cancel(_) => FrameKind::Cancel,
            FrameRef::Close(_) => FrameKind::Close,
            FrameRef::Keepalive => FrameKind::Keepalive,
            FrameRef::Item(_) => FrameKind::Item,
            FrameRef::Credit(_) => FrameKind::Credit,
        }
    }

    /// An owned copy.
    ///
    /// # Errors
    /// [`DecodeError::InvalidId`] for a control frame whose `cap` or `verb`
    /// is not a valid identifier.
    pub fn to_frame(&self) -> Result<Frame, DecodeError> {
        Ok(match self {
            FrameRef::Hello(h) => Frame::Hello(h.to_hello()),
            FrameRef::Control(c) => Frame::Control(c.to_envelope()?),
            FrameRef::Response(r) => Frame::Response(r.to_envelope()),
            FrameRef::Cancel(c) => Frame::Cancel(c.clone()),
            FrameRef::Close(c) => Frame::Close(Close {
                code: c.code,
                reason: c.reason.to_owned(),
            }),
            FrameRef::Keepalive => Frame::Keepalive,
            FrameRef::Item(i) => Frame::Item(i.to_item()),
            FrameRef::Credit(c) => Frame::Credit(c.clone()),
        })
    }

    /// Encodes this frame again, appending to `out` (useful to relay a
    /// frame, or to send names that are not valid identifiers).
    ///
    /// # Errors
    /// As the `encode_*` function for the frame's kind.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            FrameRef::Hello(h) => {
                validate(h.manifest).map_err(EncodeError::Profile)?;
                write_hello(out, h.protocol, h.manifest, &h.limits);
                Ok(())
            }
            FrameRef::Control(c) => {
                check_name("cap", c.cap)?;
                check_name("verb", c.verb)?;
                validate(c.args).map_err(EncodeError::Profile)?;
                if let Some(t) = c.trace {
                    validate(t).map_err(EncodeError::Profile)?;
                }
                write_control(out, c.cap, c.verb, &c.req_id, c.budget_ms, c.args, c.trace);
                Ok(())
            }
            FrameRef::Response(r) => match &r.outcome {
                Ok(raw) => encode_response_ok(out, &r.req_id, raw),
                Err(body) => encode_response_err(out, &r.req_id, body),
            },
            FrameRef::Cancel(c) => encode_cancel(out, &c.req_id),
            FrameRef::Close(c) => {
                encode_close(out, c.code, c.reason);
                Ok(())
            }
            FrameRef::Keepalive => {
                encode_keepalive(out);
                Ok(())
            }
            FrameRef::Item(i) => encode_item(out, &i.req_id, i.item),
            FrameRef::Credit(c) => encode_credit(out, &c.req_id, c.items, c.bytes),
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding

fn write_type(out: &mut Vec<u8>, kind: FrameKind) {
    cbor::write_text(out, TYPE_KEY);
    cbor::write_text(out, kind.as_str());
}

fn require_req_id(req_id: &ReqId) -> Result<(), EncodeError> {
    if req_id.is_fire_and_forget() {
        return Err(EncodeError::InvalidId(IdError::Empty {
            kind: "request id",
        }));
    }
    Ok(())
}

fn check_name(field: &'static str, s: &str) -> Result<(), EncodeError> {
    if s.len() > MAX_NAME_LEN {
        return Err(EncodeError::StringTooLong {
            field,
            len: s.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

/// Encodes any frame, appending it to `out`.
///
/// ```
/// use capwire_envelope::{decode_frame, encode_frame, Frame, FrameRef};
/// let mut out = Vec::new();
/// encode_frame(&Frame::Keepalive, &mut out).unwrap();
/// assert_eq!(decode_frame(&out).unwrap(), FrameRef::Keepalive);
/// ```
///
/// # Errors
/// [`EncodeError::InvalidId`] for a response or cancel frame with an empty
/// request id. On error `out` is left as it was.
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match frame {
        Frame::Hello(h) => write_hello(out, h.protocol, h.manifest.as_bytes(), &h.limits),
        Frame::Control(c) => write_control(
            out,
            c.cap.as_str(),
            c.verb.as_str(),
            &c.req_id,
            c.budget_ms,
            c.args.as_bytes(),
            None,
        ),
        Frame::Response(r) => {
            require_req_id(&r.req_id)?;
            match &r.outcome {
                Ok(result) => write_response_ok(out, &r.req_id, result.as_bytes()),
                Err(body) => write_response_err(out, &r.req_id, body),
            }
        }
        Frame::Cancel(c) => encode_cancel(out, &c.req_id)?,
        Frame::Close(c) => encode_close(out, c.code, &c.reason),
        Frame::Keepalive => encode_keepalive(out),
        Frame::Item(i) => {
            require_req_id(&i.req_id)?;
            write_item(out, &i.req_id, i.item.as_bytes());
        }
        Frame::Credit(c) => encode_credit(out, &c.req_id, c.items, c.bytes)?,
    }
    Ok(())
}

/// Encodes a control frame, appending it to `out`, without allocating
/// beyond `out`'s growth.
///
/// `cap` and `verb` are sent as given (any text up to [`MAX_NAME_LEN`]
/// bytes); `args_raw` must be one data item in the strict profile (for
/// example [`RawValue::as_bytes`] or a received [`ControlRef::args`]) and is
/// checked.
///
/// ```
/// use capwire_envelope::{decode_frame, encode_control, FrameRef, RawValue, ReqId};
/// let args = RawValue::encode(&("hello",)).unwrap();
/// let mut out = Vec::new();
/// encode_control(&mut out, "app.echo", "say", &ReqId::from_u64(42), Some(500), args.as_bytes())
///     .unwrap();
/// let FrameRef::Control(c) = decode_frame(&out).unwrap() else { unreachable!() };
/// assert_eq!((c.cap, c.verb, c.req_id.as_str()), ("app.echo", "say", "42"));
/// assert_eq!(c.decode_args::<(String,)>().unwrap().0, "hello");
/// ```
///
/// # Errors
/// [`EncodeError::StringTooLong`] for a long `cap` or `verb`;
/// [`EncodeError::Profile`] when `args_raw` is not a valid item. On error
/// `out` is left as it was.
pub fn encode_control(
    out: &mut Vec<u8>,
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args_raw: &[u8],
) -> Result<(), EncodeError> {
    check_name("cap", cap)?;
    check_name("verb", verb)?;
    validate(args_raw).map_err(EncodeError::Profile)?;
    write_control(out, cap, verb, req_id, budget_ms, args_raw, None);
    Ok(())
}

/// A control frame, with a trace item (protocol 3) or without. `args` come
/// last, so a caller may append them after an empty `args`.
fn write_control(
    out: &mut Vec<u8>,
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args: &[u8],
    trace: Option<&[u8]>,
) {
    let req_id = req_id.as_bytes();
    out.reserve(
        CONTROL_OVERHEAD
            + cap.len()
            + verb.len()
            + req_id.len()
            + args.len()
            + trace.map_or(0, |t| t.len() + 6),
    );
    cbor::write_map(
        out,
        5 + usize::from(budget_ms.is_some()) + usize::from(trace.is_some()),
    );
    write_type(out, FrameKind::Control);
    cbor::write_text(out, "cap");
    cbor::write_text(out, cap);
    cbor::write_text(out, "verb");
    cbor::write_text(out, verb);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id);
    if let Some(budget) = budget_ms {
        cbor::write_text(out, "budget_ms");
        cbor::write_uint(out, budget);
    }
    if let Some(trace) = trace {
        cbor::write_text(out, "trace");
        out.extend_from_slice(trace);
    }
    cbor::write_text(out, "args");
    out.extend_from_slice(args);
}

/// Bytes a control frame needs besides its cap, verb, `req_id` and args (the
/// keys, the type and the headers), at most.
pub const CONTROL_OVERHEAD: usize = 64;

/// Encodes a control frame whose args are a [`RawValue`] (which is always
/// in the strict profile, so it is not checked again), appending it to
/// `out`. `trace`, for a session of protocol 3 only, is the `trace` item
/// (WIRE.md 2.2): one data item in the strict profile, written as given.
///
/// # Errors
/// [`EncodeError::StringTooLong`] for a long `cap` or `verb`. On error
/// `out` is left as it was.
pub fn encode_control_value(
    out: &mut Vec<u8>,
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args: &RawValue,
    trace: Option<&[u8]>,
) -> Result<(), EncodeError> {
    check_name("cap", cap)?;
    check_name("verb", verb)?;
    write_control(out, cap, verb, req_id, budget_ms, args.as_bytes(), trace);
    Ok(())
}

/// Encodes a control frame with `args` serialized straight into it (one
/// buffer, one check of the strict profile), appending it to `out`;
/// `trace` as in [`encode_control_value`].
///
/// ```
/// use capwire_envelope::{decode_frame, encode_control_serialize, FrameRef, ReqId};
/// let mut out = Vec::new();
/// encode_control_serialize(&mut out, "app.echo", "say", &ReqId::from_u64(1), None, &("hi",), None).unwrap();
/// let FrameRef::Control(c) = decode_frame(&out).unwrap() else { unreachable!() };
/// assert_eq!(c.decode_args::<(String,)>().unwrap().0, "hi");
/// ```
///
/// # Errors
/// [`EncodeError::StringTooLong`] for a long `cap` or `verb`; as
/// [`to_vec`](crate::to_vec) when `args` has no strict encoding. On error
/// `out` is left as it was.
pub fn encode_control_serialize<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args: &T,
    trace: Option<&[u8]>,
) -> Result<(), EncodeError> {
    check_name("cap", cap)?;
    check_name("verb", verb)?;
    let start = out.len();
    write_control(out, cap, verb, req_id, budget_ms, &[], trace);
    if let Err(e) = crate::raw::encode_into(args, out) {
        out.truncate(start);
        return Err(e);
    }
    Ok(())
}

/// Encodes a successful response whose result is a [`RawValue`] (not
/// checked again), appending it to `out`.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`. On error `out` is
/// left as it was.
pub fn encode_response_value(
    out: &mut Vec<u8>,
    req_id: &ReqId,
    result: &RawValue,
) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    write_response_ok(out, req_id, result.as_bytes());
    Ok(())
}

/// Encodes a successful response, appending it to `out`. `result_raw` must
/// be one data item in the strict profile and is checked.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`; [`EncodeError::Profile`]
/// when `result_raw` is not a valid item. On error `out` is left as it was.
pub fn encode_response_ok(
    out: &mut Vec<u8>,
    req_id: &ReqId,
    result_raw: &[u8],
) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    validate(result_raw).map_err(EncodeError::Profile)?;
    write_response_ok(out, req_id, result_raw);
    Ok(())
}

fn write_response_ok(out: &mut Vec<u8>, req_id: &ReqId, result: &[u8]) {
    // The keys, the type and the headers take 33 bytes besides the id.
    out.reserve(40 + req_id.as_bytes().len() + result.len());
    cbor::write_map(out, 4);
    write_type(out, FrameKind::Response);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id.as_bytes());
    cbor::write_text(out, "ok");
    cbor::write_bool(out, true);
    cbor::write_text(out, "result");
    out.extend_from_slice(result);
}

/// Encodes a failed response, appending it to `out`. A message longer than
/// [`MAX_MESSAGE_LEN`] is cut at a character boundary.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`. On error `out` is left
/// as it was.
pub fn encode_response_err(
    out: &mut Vec<u8>,
    req_id: &ReqId,
    error: &ErrorBody,
) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    write_response_err(out, req_id, error);
    Ok(())
}

fn write_response_err(out: &mut Vec<u8>, req_id: &ReqId, error: &ErrorBody) {
    cbor::write_map(out, 4);
    write_type(out, FrameKind::Response);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id.as_bytes());
    cbor::write_text(out, "ok");
    cbor::write_bool(out, false);
    cbor::write_text(out, "err");
    cbor::write_map(out, 2 + usize::from(error.detail.is_some()));
    cbor::write_text(out, "code");
    cbor::write_text(out, error.code.as_str());
    cbor::write_text(out, "message");
    cbor::write_text(out, truncate_str(&error.message, MAX_MESSAGE_LEN));
    if let Some(detail) = &error.detail {
        cbor::write_text(out, "detail");
        out.extend_from_slice(detail.as_bytes());
    }
}

/// Encodes a cancel frame, appending it to `out`.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`.
pub fn encode_cancel(out: &mut Vec<u8>, req_id: &ReqId) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    cbor::write_map(out, 2);
    write_type(out, FrameKind::Cancel);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id.as_bytes());
    Ok(())
}

/// Encodes a stream item (protocol 2), appending it to `out`. `item_raw`
/// must be one data item in the strict profile and is checked.
///
/// ```
/// use capwire_envelope::{decode_frame, encode_item, FrameRef, ReqId};
/// let item = capwire_envelope::to_vec("token").unwrap();
/// let mut out = Vec::new();
/// encode_item(&mut out, &ReqId::from_u64(7), &item).unwrap();
/// let FrameRef::Item(i) = decode_frame(&out).unwrap() else { unreachable!() };
/// assert_eq!((i.req_id.as_str(), i.item), ("7", &item[..]));
/// ```
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`;
/// [`EncodeError::Profile`] when `item_raw` is not a valid item. On error
/// `out` is left as it was.
pub fn encode_item(out: &mut Vec<u8>, req_id: &ReqId, item_raw: &[u8]) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    validate(item_raw).map_err(EncodeError::Profile)?;
    write_item(out, req_id, item_raw);
    Ok(())
}

/// Encodes a stream item with `item` serialized straight into the frame
/// (one buffer, one check of the strict profile), appending it to `out`;
/// returns the length of the encoded `item` value, which is what the item
/// costs in byte credit.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`; as
/// [`to_vec`](crate::to_vec) when `item` has no strict encoding. On error
/// `out` is left as it was.
pub fn encode_item_serialize<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    req_id: &ReqId,
    item: &T,
) -> Result<usize, EncodeError> {
    require_req_id(req_id)?;
    let start = out.len();
    write_item(out, req_id, &[]);
    let at = out.len();
    if let Err(e) = crate::raw::encode_into(item, out) {
        out.truncate(start);
        return Err(e);
    }
    Ok(out.len() - at)
}

/// Bytes an item frame needs besides its `req_id` and item, at most.
pub const ITEM_OVERHEAD: usize = 24;

fn write_item(out: &mut Vec<u8>, req_id: &ReqId, item: &[u8]) {
    let req_id = req_id.as_bytes();
    out.reserve(ITEM_OVERHEAD + req_id.len() + item.len());
    cbor::write_map(out, 3);
    write_type(out, FrameKind::Item);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id);
    cbor::write_text(out, "item");
    out.extend_from_slice(item);
}

/// Encodes a credit frame (protocol 2), appending it to `out`.
///
/// # Errors
/// [`EncodeError::InvalidId`] for an empty `req_id`.
pub fn encode_credit(
    out: &mut Vec<u8>,
    req_id: &ReqId,
    items: u32,
    bytes: u32,
) -> Result<(), EncodeError> {
    require_req_id(req_id)?;
    cbor::write_map(out, 4);
    write_type(out, FrameKind::Credit);
    cbor::write_text(out, "req_id");
    cbor::write_text_bytes(out, req_id.as_bytes());
    cbor::write_text(out, "items");
    cbor::write_uint(out, u64::from(items));
    cbor::write_text(out, "bytes");
    cbor::write_uint(out, u64::from(bytes));
    Ok(())
}

/// Encodes a close frame, appending it to `out`. A reason longer than
/// [`MAX_REASON_LEN`] is cut at a character boundary.
pub fn encode_close(out: &mut Vec<u8>, code: CloseCode, reason: &str) {
    cbor::write_map(out, 3);
    write_type(out, FrameKind::Close);
    cbor::write_text(out, "code");
    cbor::write_text(out, code.as_str());
    cbor::write_text(out, "reason");
    cbor::write_text(out, truncate_str(reason, MAX_REASON_LEN));
}

/// Encodes a keepalive frame, appending it to `out`.
pub fn encode_keepalive(out: &mut Vec<u8>) {
    cbor::write_map(out, 1);
    write_type(out, FrameKind::Keepalive);
}

fn write_hello(out: &mut Vec<u8>, protocol: u32, manifest: &[u8], limits: &Limits) {
    out.reserve(96 + manifest.len());
    cbor::write_map(out, 4);
    write_type(out, FrameKind::Hello);
    cbor::write_text(out, "protocol");
    cbor::write_uint(out, u64::from(protocol));
    cbor::write_text(out, "limits");
    cbor::write_map(out, 3);
    cbor::write_text(out, "max_record");
    cbor::write_uint(out, u64::from(limits.max_record));
    cbor::write_text(out, "max_inflight");
    cbor::write_uint(out, u64::from(limits.max_inflight));
    cbor::write_text(out, "keepalive_ms");
    cbor::write_uint(out, u64::from(limits.keepalive_ms));
    cbor::write_text(out, "manifest");
    out.extend_from_slice(manifest);
}

// ---------------------------------------------------------------------------
// Decoding

/// The keys a frame map may hold, across all kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Field {
    Type,
    Cap,
    Verb,
    ReqId,
    BudgetMs,
    Args,
    Ok,
    Result,
    Err,
    Protocol,
    Manifest,
    Limits,
    Code,
    Reason,
    Item,
    Items,
    Bytes,
    Trace,
}

impl Field {
    const ALL: [Field; 18] = [
        Field::Type,
        Field::Cap,
        Field::Verb,
        Field::ReqId,
        Field::BudgetMs,
        Field::Args,
        Field::Ok,
        Field::Result,
        Field::Err,
        Field::Protocol,
        Field::Manifest,
        Field::Limits,
        Field::Code,
        Field::Reason,
        Field::Item,
        Field::Items,
        Field::Bytes,
        Field::Trace,
    ];

    fn name(self) -> &'static str {
        match self {
            Field::Type => TYPE_KEY,
            Field::Cap => "cap",
            Field::Verb => "verb",
            Field::ReqId => "req_id",
            Field::BudgetMs => "budget_ms",
            Field::Args => "args",
            Field::Ok => "ok",
            Field::Result => "result",
            Field::Err => "err",
            Field::Protocol => "protocol",
            Field::Manifest => "manifest",
            Field::Limits => "limits",
            Field::Code => "code",
            Field::Reason => "reason",
            Field::Item => "item",
            Field::Items => "items",
            Field::Bytes => "bytes",
            Field::Trace => "trace",
        }
    }

    fn from_key(key: &[u8]) -> Option<Self> {
        Some(match key {
            b"type" => Field::Type,
            b"cap" => Field::Cap,
            b"verb" => Field::Verb,
            b"req_id" => Field::ReqId,
            b"budget_ms" => Field::BudgetMs,
            b"args" => Field::Args,
            b"ok" => Field::Ok,
            b"result" => Field::Result,
            b"err" => Field::Err,
            b"protocol" => Field::Protocol,
            b"manifest" => Field::Manifest,
            b"limits" => Field::Limits,
            b"code" => Field::Code,
            b"reason" => Field::Reason,
            b"item" => Field::Item,
            b"items" => Field::Items,
            b"bytes" => Field::Bytes,
            b"trace" => Field::Trace,
            _ => return None,
        })
    }

    const fn bit(self) -> u32 {
        1 << self as u8
    }
}

const fn mask(fields: &[Field]) -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < fields.len() {
        m |= fields[i].bit();
        i += 1;
    }
    m
}

/// Everything a frame map may hold, filled in as keys are read.
#[derive(Default)]
struct Parts<'a> {
    seen: u32,
    kind: Option<FrameKind>,
    cap: &'a str,
    verb: &'a str,
    req_id: ReqId,
    budget_ms: Option<u64>,
    args: &'a [u8],
    ok: bool,
    result: &'a [u8],
    err: Option<ErrorBody>,
    protocol: u32,
    manifest: &'a [u8],
    limits: Option<Limits>,
    code: Option<CloseCode>,
    reason: &'a str,
    item: &'a [u8],
    items: u32,
    bytes: u32,
    trace: Option<&'a [u8]>,
}

/// Decodes one frame in place: the whole record must be exactly one frame
/// map in the strict profile.
///
/// Header fields are checked as they are read; `args`, `result` and
/// `manifest` are validated and returned as slices, never deserialized.
///
/// ```
/// use capwire_envelope::{decode_frame, DecodeError};
/// // {"type": "keepalive", "type": "keepalive"}
/// let mut dup = vec![0xa2];
/// for _ in 0..2 {
///     dup.extend_from_slice(b"\x64type\x69keepalive");
/// }
/// assert!(matches!(decode_frame(&dup), Err(DecodeError::DuplicateKey { .. })));
/// ```
///
/// # Errors
/// The first breach of the profile or of the frame's layout; see
/// [`DecodeError`].
pub fn decode_frame(bytes: &[u8]) -> Result<FrameRef<'_>, DecodeError> {
    let mut cur = Cursor::new(bytes);
    let mut parts = Parts::default();
    read_record(&mut cur, "frame", |cur, key, key_at| {
        let Some(field) = Field::from_key(key) else {
            return Err(unknown_field(key, key_at));
        };
        if parts.seen & field.bit() != 0 {
            return Err(DecodeError::DuplicateKey { at: key_at });
        }
        parts.seen |= field.bit();
        read_field(cur, field, &mut parts)
    })?;
    cur.finish()?;
    assemble(parts)
}

/// The error for a key the record does not define (or an invalid text key).
fn unknown_field(key: &[u8], key_at: usize) -> DecodeError {
    match std::str::from_utf8(key) {
        Ok(_) => DecodeError::UnknownField {
            name: name_for_error(key),
        },
        Err(_) => DecodeError::InvalidUtf8 { at: key_at },
    }
}

fn read_field<'a>(
    cur: &mut Cursor<'a>,
    field: Field,
    parts: &mut Parts<'a>,
) -> Result<(), DecodeError> {
    match field {
        Field::Type => {
            let at = cur.pos();
            let name = match cur.head()? {
                Head::Text(len) if len > MAX_NAME_LEN => {
                    return Err(DecodeError::StringTooLong {
                        field: TYPE_KEY,
                        len,
                        max: MAX_NAME_LEN,
                    });
                }
                Head::Text(len) => cur.take(len)?,
                _ => {
                    return Err(DecodeError::WrongType {
                        field: TYPE_KEY,
                        expected: "a text string",
                    });
                }
            };
            parts.kind = Some(match name {
                b"hello" => FrameKind::Hello,
                b"control" => FrameKind::Control,
                b"response" => FrameKind::Response,
                b"cancel" => FrameKind::Cancel,
                b"close" => FrameKind::Close,
                b"keepalive" => FrameKind::Keepalive,
                b"item" => FrameKind::Item,
                b"credit" => FrameKind::Credit,
                _ => {
                    std::str::from_utf8(name).map_err(|_| DecodeError::InvalidUtf8 { at })?;
                    return Err(DecodeError::UnknownName {
                        field: TYPE_KEY,
                        name: name_for_error(name),
                    });
                }
            });
        }
        Field::Cap => parts.cap = read_text(cur, "cap", MAX_NAME_LEN)?,
        Field::Verb => parts.verb = read_text(cur, "verb", MAX_NAME_LEN)?,
        Field::ReqId => parts.req_id = read_req_id(cur)?,
        Field::BudgetMs => parts.budget_ms = Some(read_uint(cur, "budget_ms")?),
        Field::Args => parts.args = read_item(cur)?,
        Field::Trace => parts.trace = Some(read_item(cur)?),
        Field::Ok => match cur.head()? {
            Head::Bool(b) => parts.ok = b,
            _ => {
                return Err(DecodeError::WrongType {
                    field: "ok",
                    expected: "a boolean",
                });
            }
        },
        Field::Result => parts.result = read_item(cur)?,
        Field::Err => parts.err = Some(read_error_body(cur)?),
        Field::Protocol => parts.protocol = read_u32(cur, "protocol")?,
        Field::Manifest => parts.manifest = read_item(cur)?,
        Field::Limits => parts.limits = Some(read_limits(cur)?),
        Field::Code => {
            let name = read_text(cur, "code", MAX_NAME_LEN)?;
            parts.code =
                Some(
                    CloseCode::from_wire(name).ok_or_else(|| DecodeError::UnknownName {
                        field: "code",
                        name: name_for_error(name.as_bytes()),
                    })?,
                );
        }
        Field::Reason => parts.reason = read_text(cur, "reason", MAX_REASON_LEN)?,
        Field::Item => parts.item = read_item(cur)?,
        Field::Items => parts.items = read_u32(cur, "items")?,
        Field::Bytes => parts.bytes = read_u32(cur, "bytes")?,
    }
    Ok(())
}

fn assemble(parts: Parts<'_>) -> Result<FrameRef<'_>, DecodeError> {
    use Field as F;
    let Some(kind) = parts.kind else {
        return Err(DecodeError::MissingField { field: TYPE_KEY });
    };
    if kind == FrameKind::Response && parts.seen & F::Ok.bit() == 0 {
        return Err(DecodeError::MissingField { field: "ok" });
    }
    let (allowed, required) = match kind {
        FrameKind::Hello => {
            let m = mask(&[F::Type, F::Protocol, F::Manifest, F::Limits]);
            (m, m)
        }
        FrameKind::Control => (
            mask(&[
                F::Type,
                F::Cap,
                F::Verb,
                F::ReqId,
                F::BudgetMs,
                F::Args,
                F::Trace,
            ]),
            mask(&[F::Type, F::Cap, F::Verb, F::ReqId, F::Args]),
        ),
        FrameKind::Response => {
            let base = mask(&[F::Type, F::ReqId, F::Ok]);
            let outcome = if parts.ok { F::Result } else { F::Err };
            (base | outcome.bit(), base | outcome.bit())
        }
        FrameKind::Cancel => {
            let m = mask(&[F::Type, F::ReqId]);
            (m, m)
        }
        FrameKind::Close => {
            let m = mask(&[F::Type, F::Code, F::Reason]);
            (m, m)
        }
        FrameKind::Keepalive => (F::Type.bit(), F::Type.bit()),
        FrameKind::Item => {
            let m = mask(&[F::Type, F::ReqId, F::Item]);
            (m, m)
        }
        FrameKind::Credit => {
            let m = mask(&[F::Type, F::ReqId, F::Items, F::Bytes]);
            (m, m)
        }
    };
    if let Some(extra) = F::ALL
        .into_iter()
        .find(|f| parts.seen & !allowed & f.bit() != 0)
    {
        return Err(DecodeError::UnknownField {
            name: extra.name().into(),
        });
    }
    if let Some(missing) = F::ALL
        .into_iter()
        .find(|f| required & !parts.seen & f.bit() != 0)
    {
        return Err(DecodeError::MissingField {
            field: missing.name(),
        });
    }
    let needs_id = matches!(
        kind,
        FrameKind::Response | FrameKind::Cancel | FrameKind::Item | FrameKind::Credit
    );
    if needs_id && parts.req_id.is_fire_and_forget() {
        return Err(DecodeError::InvalidId(IdError::Empty {
            kind: "request id",
        }));
    }
    // Every required field is present, so the options below are set.
    Ok(match kind {
        FrameKind::Hello => FrameRef::Hello(HelloRef {
            protocol: parts.protocol,
            manifest: parts.manifest,
            limits: parts.limits.unwrap_or_default(),
        }),
        FrameKind::Control => FrameRef::Control(ControlRef {
            cap: parts.cap,
            verb: parts.verb,
            req_id: parts.req_id,
            budget_ms: parts.budget_ms,
            args: parts.args,
            trace: parts.trace,
        }),
        FrameKind::Response => FrameRef::Response(ResponseRef {
            req_id: parts.req_id,
            outcome: match parts.err {
                Some(body) if !parts.ok => Err(body),
                _ => Ok(parts.result),
            },
        }),
        FrameKind::Cancel => FrameRef::Cancel(Cancel {
            req_id: parts.req_id,
        }),
        FrameKind::Close => FrameRef::Close(CloseRef {
            code: parts.code.unwrap_or(CloseCode::ProtocolError),
            reason: parts.reason,
        }),
        FrameKind::Keepalive => FrameRef::Keepalive,
        FrameKind::Item => FrameRef::Item(ItemRef {
            req_id: parts.req_id,
            item: parts.item,
        }),
        FrameKind::Credit => FrameRef::Credit(Credit {
            req_id: parts.req_id,
            items: parts.items,
            bytes: parts.bytes,
        }),
    })
}

/// Reads a map with text keys, calling `entry` with the cursor on each
/// value. `entry` must consume the value.
fn read_record<'a>(
    cur: &mut Cursor<'a>,
    field: &'static str,
    mut entry: impl FnMut(&mut Cursor<'a>, &'a [u8], usize) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let wrong = || DecodeError::WrongType {
        field,
        expected: "a map with text keys",
    };
    let Head::Map(n) = cur.head()? else {
        return Err(wrong());
    };
    for _ in 0..n {
        let key_at = cur.pos();
        let Head::Text(len) = cur.head()? else {
            return Err(wrong());
        };
        // Known keys are ASCII and compared as bytes; `unknown_field`
        // checks the UTF-8 of any other key.
        let key = cur.take(len)?;
        entry(cur, key, key_at)?;
    }
    Ok(())
}

fn read_text<'a>(
    cur: &mut Cursor<'a>,
    field: &'static str,
    max: usize,
) -> Result<&'a str, DecodeError> {
    let at = cur.pos();
    match cur.head()? {
        Head::Text(len) if len > max => Err(DecodeError::StringTooLong { field, len, max }),
        Head::Text(len) => cur.text(at, len),
        _ => Err(DecodeError::WrongType {
            field,
            expected: "a text string",
        }),
    }
}

fn read_req_id(cur: &mut Cursor<'_>) -> Result<ReqId, DecodeError> {
    let at = cur.pos();
    match cur.head()? {
        Head::Text(len) if len > MAX_REQ_ID_LEN => Err(DecodeError::InvalidId(IdError::TooLong {
            kind: "request id",
            len,
            max: MAX_REQ_ID_LEN,
        })),
        Head::Text(len) => Ok(ReqId::try_from(cur.text(at, len)?)?),
        _ => Err(DecodeError::WrongType {
            field: "req_id",
            expected: "a text string",
        }),
    }
}

fn read_uint(cur: &mut Cursor<'_>, field: &'static str) -> Result<u64, DecodeError> {
    match cur.head()? {
        Head::Uint(n) => Ok(n),
        _ => Err(DecodeError::WrongType {
            field,
            expected: "an unsigned integer",
        }),
    }
}

fn read_u32(cur: &mut Cursor<'_>, field: &'static str) -> Result<u32, DecodeError> {
    u32::try_from(read_uint(cur, field)?).map_err(|_| DecodeError::IntegerOutOfRange { field })
}

/// Validates one nested data item and returns its bytes.
fn read_item<'a>(cur: &mut Cursor<'a>) -> Result<&'a [u8], DecodeError> {
    let start = cur.pos();
    skip_item(cur, MAX_DEPTH)?;
    Ok(cur.since(start))
}

fn read_limits(cur: &mut Cursor<'_>) -> Result<Limits, DecodeError> {
    const NAMES: [&str; 3] = ["max_record", "max_inflight", "keepalive_ms"];
    let mut values: [Option<u32>; 3] = [None; 3];
    read_record(cur, "limits", |cur, key, key_at| {
        let Some(i) = NAMES.iter().position(|n| n.as_bytes() == key) else {
            return Err(unknown_field(key, key_at));
        };
        if values[i].is_some() {
            return Err(DecodeError::DuplicateKey { at: key_at });
        }
        values[i] = Some(read_u32(cur, NAMES[i])?);
        Ok(())
    })?;
    let get = |i: usize| values[i].ok_or_else(|| DecodeError::MissingField { field: NAMES[i] });
    Ok(Limits {
        max_record: get(0)?,
        max_inflight: get(1)?,
        keepalive_ms: get(2)?,
    })
}

fn read_error_body(cur: &mut Cursor<'_>) -> Result<ErrorBody, DecodeError> {
    let mut code: Option<ErrorCode> = None;
    let mut message: Option<&str> = None;
    let mut detail: Option<&[u8]> = None;
    read_record(cur, "err", |cur, key, key_at| {
        let duplicate = || DecodeError::DuplicateKey { at: key_at };
        match key {
            b"code" if code.is_some() => Err(duplicate()),
            b"code" => {
                let at = cur.pos();
                code = Some(match cur.head()? {
                    Head::Text(len) if len > MAX_APP_CODE_LEN => {
                        return Err(DecodeError::InvalidId(IdError::TooLong {
                            kind: "app error code",
                            len,
                            max: MAX_APP_CODE_LEN,
                        }));
                    }
                    Head::Text(len) => cur.text(at, len)?.parse()?,
                    _ => {
                        return Err(DecodeError::WrongType {
                            field: "code",
                            expected: "a text string",
                        });
                    }
                });
                Ok(())
            }
            b"message" if message.is_some() => Err(duplicate()),
            b"message" => {
                message = Some(read_text(cur, "message", MAX_MESSAGE_LEN)?);
                Ok(())
            }
            b"detail" if detail.is_some() => Err(duplicate()),
            b"detail" => {
                detail = Some(read_item(cur)?);
                Ok(())
            }
            other => Err(unknown_field(other, key_at)),
        }
    })?;
    Ok(ErrorBody {
        code: code.ok_or(DecodeError::MissingField { field: "code" })?,
        message: message
            .ok_or(DecodeError::MissingField { field: "message" })?
            .to_owned(),
        detail: detail.map(RawValue::from_validated),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> ControlEnvelope {
        ControlEnvelope {
            cap: CapId::try_from("app.echo").unwrap(),
            verb: Verb::try_from("say").unwrap(),
            req_id: ReqId::from_u64(42),
            budget_ms: Some(1500),
            args: RawValue::encode(
                &[("text", "hello")]
                    .into_iter()
                    .collect::<std::collections::BTreeMap<_, _>>(),
            )
            .unwrap(),
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The examples of WIRE.md, section 2.6 and the keepalive of 2.2.
    #[test]
    fn documented_examples_are_exact() {
        let request = "a6647479706567636f6e74726f6c63636170686170702e6563686f6476657262637361796672\
                       65715f6964623432696275646765745f6d731905dc6461726773a164746578746568656c6c6f";
        assert_eq!(Frame::Control(control()).to_vec().unwrap(), hex(request));
        let response = "a4647479706568726573706f6e7365667265715f6964623432626f6bf463657272a264636f\
                        64656c756e6b6e6f776e5f76657262676d6573736167656c6e6f20737563682076657262";
        let err = ErrorBody::new(ErrorCode::UnknownVerb, "no such verb");
        let frame = Frame::Response(ResponseEnvelope::err(ReqId::from_u64(42), err));
        assert_eq!(frame.to_vec().unwrap(), hex(response));
        let keepalive = "a16474797065696b656570616c697665";
        assert_eq!(Frame::Keepalive.to_vec().unwrap(), hex(keepalive));
    }

    #[test]
    fn every_kind_round_trips() {
        let frames = [
            Frame::Hello(Hello::new(
                RawValue::encode("m").unwrap(),
                Limits::default(),
            )),
            Frame::Control(control()),
            Frame::Control(ControlEnvelope {
                budget_ms: None,
                req_id: ReqId::EMPTY,
                ..control()
            }),
            Frame::Response(ResponseEnvelope::ok(ReqId::from_u64(1), RawValue::null())),
            Frame::Response(ResponseEnvelope::err(
                ReqId::from_u64(2),
                ErrorBody::new(ErrorCode::BindFailed, "wrong code")
                    .with_detail(RawValue::encode(&("wrong_code", 2)).unwrap()),
            )),
            Frame::Cancel(Cancel {
                req_id: ReqId::from_u64(3),
            }),
            Frame::Close(Close {
                code: CloseCode::Shutdown,
                reason: "bye".into(),
            }),
            Frame::Keepalive,
        ];
        for frame in frames {
            let bytes = frame.to_vec().unwrap();
            let decoded = decode_frame(&bytes).unwrap();
            assert_eq!(decoded.kind(), frame.kind());
            assert_eq!(decoded.to_frame().unwrap(), frame);
            let mut again = Vec::new();
            decoded.encode(&mut again).unwrap();
            assert_eq!(again, bytes);
        }
    }

    #[test]
    fn empty_req_id_is_refused_where_a_response_is_due() {
        let mut out = vec![1];
        assert!(matches!(
            encode_response_ok(&mut out, &ReqId::EMPTY, &[0xf6]),
            Err(EncodeError::InvalidId(IdError::Empty { .. }))
        ));
        assert!(encode_cancel(&mut out, &ReqId::EMPTY).is_err());
        assert!(
            encode_frame(
                &Frame::Response(ResponseEnvelope::err(
                    ReqId::EMPTY,
                    ErrorBody::new(ErrorCode::Internal, "")
                )),
                &mut out
            )
            .is_err()
        );
        assert_eq!(out, [1]);
    }

    #[test]
    fn fast_encoders_check_their_raw_input() {
        let mut out = Vec::new();
        let id = ReqId::from_u64(1);
        assert!(matches!(
            encode_control(&mut out, "app.x", "y", &id, None, &[0x19, 0x01]),
            Err(EncodeError::Profile(DecodeError::Truncated { .. }))
        ));
        assert!(matches!(
            encode_control(&mut out, "app.x", "y", &id, None, &[0xf6, 0xf6]),
            Err(EncodeError::Profile(DecodeError::TrailingBytes { .. }))
        ));
        assert!(matches!(
            encode_response_ok(&mut out, &id, &[0xc1, 0x00]),
            Err(EncodeError::Profile(DecodeError::Tag { .. }))
        ));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            encode_control(&mut out, &long, "y", &id, None, &[0xf6]),
            Err(EncodeError::StringTooLong { field: "cap", .. })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn long_texts_are_cut_by_the_encoder() {
        let mut out = Vec::new();
        encode_close(&mut out, CloseCode::Normal, &"é".repeat(MAX_REASON_LEN));
        let FrameRef::Close(close) = decode_frame(&out).unwrap() else {
            panic!("not a close frame")
        };
        assert_eq!(close.reason.len(), MAX_REASON_LEN);
        let mut body = ErrorBody::new(ErrorCode::Internal, "");
        body.message = "m".repeat(MAX_MESSAGE_LEN * 2);
        out.clear();
        encode_response_err(&mut out, &ReqId::from_u64(1), &body).unwrap();
        let FrameRef::Response(r) = decode_frame(&out).unwrap() else {
            panic!("not a response")
        };
        assert_eq!(r.outcome.unwrap_err().message.len(), MAX_MESSAGE_LEN);
    }
}
