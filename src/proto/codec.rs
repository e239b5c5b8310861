//! The only place the runtime builds frames. Each function returns one
//! encoded record, sized exactly, ready for the session's send queue.

use bytes::Bytes;
use capwire_envelope::{
    CloseCode, EncodeError, ErrorBody, ErrorCode, Frame, Hello, Limits as WireLimits, PROTOCOL_V2,
    PROTOCOL_V3, PROTOCOL_VERSION, RawValue, ReqId, encode_cancel, encode_close,
    encode_control_value, encode_credit, encode_frame, encode_item_serialize, encode_response_err,
    encode_response_value,
};
use capwire_manifest::Manifest;

/// Bytes a response frame needs besides its `req_id` and its result or
/// error.
const RESPONSE_OVERHEAD: usize = 48;

/// `out` as `Bytes` with no allocation besides its own: `Bytes::from` a
/// vector with spare capacity allocates a shared header, a boxed slice
/// (the vector shrunk in place) does not.
fn frozen(out: Vec<u8>) -> Bytes {
    Bytes::from(out.into_boxed_slice())
}

/// The hellos a node sends, one per protocol version (WIRE.md 4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hellos {
    /// Protocol 1, with the manifest as a version-1 peer is shown it (no
    /// stream verbs): every session's first hello, and every hello of a
    /// version-1 session.
    pub(crate) v1: Bytes,
    /// Protocol 2, with the manifest as a version-2 peer is shown it
    /// (nothing of protocol 3): the hellos of a version-2 session after
    /// the first.
    pub(crate) v2: Bytes,
    /// Protocol 3, with the whole manifest: the hellos of a version-3
    /// session after the first.
    pub(crate) v3: Bytes,
    /// The version-1 view is not the whole manifest (the node has stream
    /// verbs): a session of version 2 or more is sent its own hello as
    /// soon as it knows its version.
    pub(crate) differ: bool,
}

impl Hellos {
    /// The hello of a session of protocol `version`, after the first.
    pub(crate) fn of(&self, version: u32) -> &Bytes {
        match version {
            0 | 1 => &self.v1,
            2 => &self.v2,
            _ => &self.v3,
        }
    }
}

/// A `hello` frame for `protocol`, announcing `manifest` and `limits`.
fn hello(manifest: &Manifest, protocol: u32, limits: WireLimits) -> Result<Bytes, EncodeError> {
    let manifest = RawValue::encode(manifest)?;
    let mut out = Vec::with_capacity(manifest.as_bytes().len() + 96);
    let hello = Hello {
        protocol,
        manifest,
        limits,
    };
    encode_frame(&Frame::Hello(hello), &mut out)?;
    Ok(frozen(out))
}

/// The hellos announcing `manifest` and `limits`.
///
/// # Errors
/// The manifest does not encode in the strict profile.
pub(crate) fn hellos(manifest: &Manifest, limits: WireLimits) -> Result<Hellos, EncodeError> {
    let differ = manifest.has_protocol_2_verbs();
    let v1 = if differ {
        hello(&manifest.version_1_view(), PROTOCOL_VERSION, limits)?
    } else {
        hello(manifest, PROTOCOL_VERSION, limits)?
    };
    Ok(Hellos {
        v1,
        v2: hello(&manifest.version_2_view(), PROTOCOL_V2, limits)?,
        v3: hello(manifest, PROTOCOL_V3, limits)?,
        differ,
    })
}

/// A `control` frame: a request (non-empty `req_id`) or a notification;
/// `trace`, the caller's trace context item, only on a session of
/// protocol 3.
///
/// # Errors
/// `cap` or `verb` longer than the frame allows.
pub(crate) fn control(
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args: &RawValue,
    trace: Option<&[u8]>,
) -> Result<Bytes, EncodeError> {
    let mut out = Vec::with_capacity(
        capwire_envelope::CONTROL_OVERHEAD
            + cap.len()
            + verb.len()
            + req_id.as_bytes().len()
            + args.as_bytes().len()
            + trace.map_or(0, <[u8]>::len),
    );
    encode_control_value(&mut out, cap, verb, req_id, budget_ms, args, trace)?;
    Ok(frozen(out))
}

/// A `control` frame with `args` serialized straight into it.
///
/// # Errors
/// `cap` or `verb` longer than the frame allows, or `args` without an
/// encoding in the strict profile.
pub(crate) fn control_of<T: serde::Serialize + ?Sized>(
    cap: &str,
    verb: &str,
    req_id: &ReqId,
    budget_ms: Option<u64>,
    args: &T,
    trace: Option<&[u8]>,
) -> Result<Bytes, EncodeError> {
    let mut out = Vec::with_capacity(
        capwire_envelope::CONTROL_OVERHEAD
            + cap.len()
            + verb.len()
            + req_id.as_bytes().len()
            + trace.map_or(0, <[u8]>::len)
            + 64,
    );
    capwire_envelope::encode_control_serialize(
        &mut out, cap, verb, req_id, budget_ms, args, trace,
    )?;
    Ok(frozen(out))
}

/// The `response` frame to a request, at most `max_len` bytes: a result
/// that does not encode is answered `internal`, one whose frame would be
/// larger than `max_len` is answered `too_large`.
pub(crate) fn response(
    req_id: &ReqId,
    result: &Result<RawValue, ErrorBody>,
    max_len: usize,
) -> Bytes {
    let mut out = Vec::with_capacity(
        RESPONSE_OVERHEAD
            + req_id.as_bytes().len()
            + match result {
                Ok(v) => v.as_bytes().len(),
                Err(e) => e.message.len() + e.detail.as_ref().map_or(0, |d| d.as_bytes().len()),
            },
    );
    let encoded = match result {
        Ok(value) => encode_response_value(&mut out, req_id, value),
        Err(body) => encode_response_err(&mut out, req_id, body),
    };
    if encoded.is_err() {
        return error(
            req_id,
            ErrorCode::Internal,
            "the response could not be encoded",
        );
    }
    if out.len() > max_len {
        return error(
            req_id,
            ErrorCode::TooLarge,
            "the result is larger than the caller accepts",
        );
    }
    frozen(out)
}

/// A failed `response` frame with `code` and `message`.
pub(crate) fn error(req_id: &ReqId, code: ErrorCode, message: &str) -> Bytes {
    error_body(req_id, &ErrorBody::new(code, message))
}

/// A failed `response` frame carrying `body`.
pub(crate) fn error_body(req_id: &ReqId, body: &ErrorBody) -> Bytes {
    let mut out =
        Vec::with_capacity(RESPONSE_OVERHEAD + req_id.as_bytes().len() + body.message.len());
    // Only an empty req_id fails, and requests never have one.
    let _ = encode_response_err(&mut out, req_id, body);
    frozen(out)
}

/// A `cancel` frame for one of our requests.
pub(crate) fn cancel(req_id: &ReqId) -> Bytes {
    let mut out = Vec::with_capacity(16 + req_id.as_str().len());
    let _ = encode_cancel(&mut out, req_id);
    frozen(out)
}

/// An `item` frame of a stream with `item` serialized into it, and the
/// length of the encoded item (what it costs in byte credit).
///
/// # Errors
/// `item` has no encoding in the strict profile.
pub(crate) fn item_of<T: serde::Serialize + ?Sized>(
    req_id: &ReqId,
    item: &T,
) -> Result<(Bytes, usize), EncodeError> {
    let mut out =
        Vec::with_capacity(capwire_envelope::ITEM_OVERHEAD + req_id.as_bytes().len() + 64);
    let len = encode_item_serialize(&mut out, req_id, item)?;
    Ok((frozen(out), len))
}

/// A `credit` frame for one of our streams.
pub(crate) fn credit(req_id: &ReqId, items: u32, bytes: u32) -> Bytes {
    let mut out = Vec::with_capacity(40 + req_id.as_str().len());
    // Only an empty req_id fails, and streams never have one.
    let _ = encode_credit(&mut out, req_id, items, bytes);
    frozen(out)
}

/// A `close` frame.
pub(crate) fn close(code: CloseCode, reason: &str) -> Bytes {
    let mut out = Vec::with_capacity(40 + reason.len().min(256));
    encode_close(&mut out, code, reason);
    frozen(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capwire_envelope::{FrameRef, decode_frame};

    #[test]
    fn oversize_results_become_too_large_and_the_frame_fits() {
        let id = ReqId::from_u64(7);
        let big = RawValue::encode(&"x".repeat(5000)).unwrap();
        let frame = response(&id, &Ok(big), 1000);
        assert!(frame.len() <= 1000);
        let FrameRef::Response(r) = decode_frame(&frame).unwrap() else {
            panic!("a response")
        };
        assert_eq!(r.outcome.unwrap_err().code, ErrorCode::TooLarge);
    }

    #[test]
    fn every_frame_decodes() {
        let id = ReqId::from_u64(1);
        for frame in [
            cancel(&id),
            close(CloseCode::Shutdown, "bye"),
            error(&id, ErrorCode::Overloaded, "busy"),
            control("app.x", "y", &id, Some(5), &RawValue::null(), None).unwrap(),
        ] {
            decode_frame(&frame).unwrap();
        }
    }
}
