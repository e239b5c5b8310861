//! Calling a peer: typed requests with deadlines and cancellation, and
//! fire-and-forget notifications.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capwire_envelope::{NodeId, RawValue, ReqId, encode_cancel, encode_control};
use capwire_manifest::{CapRequirement, CapabilityManifest, Manifest, VerbDef, VerbKind};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::CallError;
use crate::node::{Node, lock};
use crate::session::{Reply, SessionHandle, wait_session};

/// A handle to call one peer. Cheap to clone.
///
/// Calls go over the node's session with the peer; when the peer is a
/// contact that is being (re)dialled, a call waits for the session within
/// its deadline.
#[derive(Debug, Clone)]
pub struct Peer {
    node: Node,
    id: NodeId,
}

/// Removes the pending entry and tells the peer to stop, unless the call
/// got its answer. Runs on timeout and when the call's future is dropped.
struct PendingCall {
    session: Arc<SessionHandle>,
    req_id: ReqId,
    answered: bool,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let removed = lock(&self.session.pending).remove(&self.req_id).is_some();
        if removed && !self.session.is_ended() {
            let mut out = Vec::with_capacity(32);
            if encode_cancel(&mut out, &self.req_id).is_ok() {
                let _ = self.session.try_send(Bytes::from(out));
            }
        }
    }
}

impl Peer {
    pub(crate) fn new(node: Node, id: NodeId) -> Self {
        Self { node, id }
    }

    /// The peer's identity.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The peer's manifest as last received, if a session is up.
    pub fn manifest(&self) -> Option<Arc<Manifest>> {
        self.node.inner.session(&self.id).map(|s| s.manifest())
    }

    /// Checks that the peer offers a capability version that satisfies
    /// `requirement` (e.g. `app.echo@^1.2`), before anything is sent.
    ///
    /// # Errors
    /// [`CallError::VersionUnsatisfied`] when it does not;
    /// [`CallError::Unreachable`] when no session is up to tell.
    pub fn require(&self, requirement: &CapRequirement) -> Result<CapabilityManifest, CallError> {
        let Some(manifest) = self.manifest() else {
            return Err(CallError::Unreachable(self.id));
        };
        manifest
            .require(requirement)
            .cloned()
            .map_err(|e| CallError::VersionUnsatisfied(e.to_string()))
    }

    /// Sends request `V` and waits for its one answer, within the node's
    /// default deadline.
    ///
    /// # Errors
    /// Exactly one [`CallError`] when there is no result.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the call: a cancel frame is sent and the
    /// peer cancels its handler.
    pub async fn request<V: VerbDef>(
        &self,
        verb: V,
        args: V::Args,
    ) -> Result<V::Output, CallError> {
        let deadline = self.node.inner.limits.default_deadline;
        self.request_within(verb, args, deadline).await
    }

    /// Like [`Peer::request`], with its own deadline. The deadline travels to
    /// the peer as a relative budget, so its handler can stop in time.
    ///
    /// # Errors
    /// As [`Peer::request`].
    pub async fn request_within<V: VerbDef>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
    ) -> Result<V::Output, CallError> {
        if V::KIND != VerbKind::Request {
            return Err(CallError::Encode(format!(
                "{}/{} is a notification: use notify",
                V::CAP,
                V::VERB
            )));
        }
        let args = RawValue::encode(&args).map_err(|e| CallError::Encode(e.to_string()))?;
        let result = self.call_raw(V::CAP, V::VERB, &args, deadline).await?;
        result
            .decode::<V::Output>()
            .map_err(|e| CallError::BadResult(e.to_string()))
    }

    /// Sends notification `V`: fire-and-forget, no answer is ever sent or
    /// awaited. Returns once the envelope is queued on the session.
    ///
    /// # Errors
    /// No session could be had, or the args do not encode.
    pub async fn notify<V: VerbDef>(&self, _verb: V, args: V::Args) -> Result<(), CallError> {
        let args = RawValue::encode(&args).map_err(|e| CallError::Encode(e.to_string()))?;
        self.notify_raw(V::CAP, V::VERB, &args).await
    }

    async fn session(&self, deadline: Instant) -> Result<Arc<SessionHandle>, CallError> {
        let inner = &self.node.inner;
        if inner.stop_accepting.is_cancelled() {
            return Err(CallError::Shutdown);
        }
        wait_session(inner, &self.id, deadline)
            .await
            .ok_or(CallError::Unreachable(self.id))
    }

    /// An untyped request: any `cap` and `verb` text, args as raw CBOR.
    /// Used by tools (and tests) that speak to verbs they have no Rust type
    /// for.
    ///
    /// # Errors
    /// As [`Peer::request`].
    pub async fn call_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        deadline: Duration,
    ) -> Result<RawValue, CallError> {
        let inner = &self.node.inner;
        let deadline_at = Instant::now() + deadline;
        let session = self.session(deadline_at).await?;
        let req_id = inner.next_req_id();
        let mut frame = Vec::with_capacity(48 + cap.len() + verb.len() + args.as_bytes().len());
        // The budget is what is left of the deadline after waiting for the
        // session.
        let left = deadline_at.saturating_duration_since(Instant::now());
        let budget_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        encode_control(
            &mut frame,
            cap,
            verb,
            &req_id,
            Some(budget_ms),
            args.as_bytes(),
        )
        .map_err(|e| CallError::Encode(e.to_string()))?;
        if frame.len() > session.max_frame() {
            return Err(CallError::TooLarge);
        }

        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&session.pending);
            if pending.len() >= inner.limits.max_pending_calls_per_session {
                return Err(CallError::Overloaded);
            }
            pending.insert(req_id.clone(), tx);
        }
        let mut call = PendingCall {
            session: session.clone(),
            req_id,
            answered: false,
        };
        if session.send(Bytes::from(frame)).await.is_err() {
            return Err(self.lost());
        }
        match tokio::time::timeout_at(deadline_at, rx).await {
            Ok(Ok(reply)) => {
                call.answered = true;
                match reply {
                    Reply::Ok(raw) => {
                        RawValue::from_bytes(raw).map_err(|e| CallError::BadResult(e.to_string()))
                    }
                    Reply::Err(body) => Err(CallError::from_remote(body)),
                }
            }
            Ok(Err(_)) => {
                call.answered = true;
                Err(self.lost())
            }
            // `call` is dropped here: the pending entry goes and a cancel
            // frame is sent.
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// An untyped notification: any `cap` and `verb` text.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    pub async fn notify_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
    ) -> Result<(), CallError> {
        let inner = &self.node.inner;
        let session = self
            .session(Instant::now() + inner.limits.default_deadline)
            .await?;
        let mut frame = Vec::with_capacity(48 + cap.len() + verb.len() + args.as_bytes().len());
        encode_control(&mut frame, cap, verb, &ReqId::EMPTY, None, args.as_bytes())
            .map_err(|e| CallError::Encode(e.to_string()))?;
        if frame.len() > session.max_frame() {
            return Err(CallError::TooLarge);
        }
        session
            .send(Bytes::from(frame))
            .await
            .map_err(|_| self.lost())
    }

    fn lost(&self) -> CallError {
        if self.node.inner.stop_accepting.is_cancelled() {
            CallError::Shutdown
        } else {
            CallError::PeerLost
        }
    }
}
