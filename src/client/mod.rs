//! Calling a peer: typed requests with deadlines and cancellation,
//! fire-and-forget notifications, and streams.

pub(crate) mod stream;
pub(crate) mod task;

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{CloseCode, NodeId, RawValue, ReqId};
use capwire_manifest::{
    BindArgs, BindReply, CapRequirement, CapabilityManifest, Manifest, MonitoringBind,
    NotificationVerb, RequestVerb,
};
use tokio::time::Instant;

use crate::error::CallError;
use crate::invite::Invite;
use crate::net::peers::Peers;
use crate::net::session::Session;
use crate::proto::codec;
use crate::proto::session::{End, Reply};
use crate::tap::Way;
use crate::time::deadline_after;
use crate::trace::TraceContext;

/// A handle to call one peer. Cheap to clone.
///
/// Calls go over the node's session with the peer; when the peer is a
/// contact that is being (re)dialled, a call waits for the session within
/// its deadline.
///
/// Which verbs a call may name is checked at compile time: [`request`](Self::request)
/// takes only request verbs and [`notify`](Self::notify) only notifications.
///
/// ```compile_fail
/// # use capwire::manifest::verb;
/// verb! { pub struct Note: notification "app.echo" / "note", Bootstrap, String; }
/// async fn wrong(peer: capwire::Peer) {
///     let _ = peer.request(Note, "a notification has no answer".into()).await;
/// }
/// ```
///
/// ```compile_fail
/// # use capwire::manifest::verb;
/// verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
/// async fn wrong(peer: capwire::Peer) {
///     let _ = peer.notify(Say, "a request wants its answer".into()).await;
/// }
/// ```
#[derive(Clone)]
pub struct Peer {
    peers: Arc<Peers>,
    id: NodeId,
    default_deadline: Duration,
    /// The trace context this handle's calls carry, when given.
    trace: Option<TraceContext>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("id", &self.id).finish()
    }
}

/// Gives up on the call (a cancel frame goes to the peer) unless it was
/// answered. Runs on timeout and when the call's future is dropped.
struct PendingCall<'a> {
    session: &'a Session,
    req_id: ReqId,
    answered: bool,
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.session.abandon(&self.req_id);
        }
    }
}

/// How often one call is sent again after its session was replaced.
const MAX_REPLACED_RETRIES: u32 = 3;

/// Whether `session` ended because another session with the same peer
/// replaced it (closed so by either side).
fn was_replaced(session: &Session) -> bool {
    matches!(
        session.lock().end_reason(),
        Some(End::Local(CloseCode::Replaced, _) | End::Peer(CloseCode::Replaced, _))
    )
}

impl Peer {
    pub(crate) fn new(peers: Arc<Peers>, id: NodeId, default_deadline: Duration) -> Self {
        Self {
            peers,
            id,
            default_deadline,
            trace: None,
        }
    }

    /// This handle with `cx` as the trace context of its calls: each call
    /// (request, notification, stream, task submit) belongs to that trace,
    /// with `cx` as its parent, whatever span or handler it is made from.
    /// Sent only to a peer whose session speaks protocol 3 (WIRE.md 2.2).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use capwire::Node;
    /// use capwire::trace::TraceContext;
    ///
    /// let node = Node::builder("caller").start().await?;
    /// let cx = TraceContext::new_root(true);
    /// let peer = node.peer(node.id()).with_trace(cx.clone());
    /// assert_eq!(peer.trace(), Some(&cx));
    /// # node.shutdown().await;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_trace(&self, cx: TraceContext) -> Self {
        Self {
            trace: Some(cx),
            ..self.clone()
        }
    }

    /// The trace context given to [`Peer::with_trace`], if any.
    pub fn trace(&self) -> Option<&TraceContext> {
        self.trace.as_ref()
    }

    /// The `trace` item a call on `session` carries: its context, on a
    /// session of protocol 3 (WIRE.md 2.2).
    pub(crate) fn trace_item(session: &Session, cx: Option<&TraceContext>) -> Option<Vec<u8>> {
        let cx = cx?;
        (session.lock().version() >= capwire_envelope::PROTOCOL_V3).then(|| cx.to_item())
    }

    /// The client span of a call to `cap`/`verb` on this peer, and the
    /// context the call carries (see `trace::outgoing`). A span whose
    /// trace is not sampled is let go at once: the context goes on, the
    /// span costs nothing more. The span is not entered: the call's own
    /// work makes no spans, and its context travels on the wire.
    pub(crate) fn span(&self, cap: &str, verb: &str) -> (tracing::Span, Option<TraceContext>) {
        let (span, root) = crate::trace::client_span(cap, verb, &self.id, self.trace.as_ref());
        let cx = crate::trace::outgoing(self.trace.as_ref(), &span);
        if span.is_disabled() {
            return (span, cx);
        }
        if !cx.as_ref().is_some_and(TraceContext::sampled) {
            return (tracing::Span::none(), cx);
        }
        if root {
            crate::trace::describe_root(&span, cap, verb, &self.id);
        }
        (span, cx)
    }

    /// The peer's identity.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Whether the session with the peer, if one is up, speaks protocol 2.
    pub(crate) fn speaks_v2(&self) -> bool {
        self.peers
            .session(&self.id)
            .is_some_and(|s| s.lock().version() >= capwire_envelope::PROTOCOL_V2)
    }

    /// The protocol version of the session with the peer, if one is up
    /// (1 until its first hello).
    pub(crate) fn version(&self) -> u32 {
        self.peers
            .session(&self.id)
            .map_or(capwire_envelope::PROTOCOL_VERSION, |s| s.lock().version())
    }

    /// The peer's manifest as last received, if a session is up.
    pub fn manifest(&self) -> Option<Arc<Manifest>> {
        self.peers.session(&self.id).and_then(|s| s.manifest())
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

    /// Binds the peer with the code of `invite` (`core.monitoring/bind`):
    /// on success this node is the peer's control plane, and the answer
    /// holds the peer's manifest, roster and configuration.
    ///
    /// # Errors
    /// [`CallError::InvalidInvite`] when the invite is for another node or
    /// carries no code; [`CallError::Denied`] with code `bind_failed` (and
    /// the reason in its detail) when the peer refused the bind; otherwise
    /// as [`Peer::request`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`]; a bind the peer has already carried out is not
    /// undone (its code is then spent).
    pub async fn bind(&self, invite: &Invite) -> Result<BindReply, CallError> {
        if capwire_transport::canonical_node_id(&invite.node_id) != self.id {
            return Err(CallError::InvalidInvite(
                "the invite is for another node".into(),
            ));
        }
        let Some(code) = invite.code.clone() else {
            return Err(CallError::InvalidInvite(
                "the invite carries no bind code".into(),
            ));
        };
        self.request(MonitoringBind, BindArgs { code }).await
    }

    /// Sends request `V` and waits for its one answer, within the node's
    /// default deadline.
    ///
    /// # Errors
    /// Exactly one [`CallError`] when there is no result.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the call: once the request is queued, a
    /// cancel frame is sent and the peer cancels its handler (a handler
    /// that already finished is not undone); dropped while it still waits
    /// for a session or for room in the send queue, nothing is sent.
    pub async fn request<V: RequestVerb>(
        &self,
        verb: V,
        args: V::Args,
    ) -> Result<V::Output, CallError> {
        self.request_within(verb, args, self.default_deadline).await
    }

    /// Like [`Peer::request`], with its own deadline. The deadline travels to
    /// the peer as a relative budget, so its handler can stop in time.
    ///
    /// # Errors
    /// As [`Peer::request`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`].
    pub async fn request_within<V: RequestVerb>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
    ) -> Result<V::Output, CallError> {
        let result = self
            .call_with((V::CAP, V::VERB), deadline, |req_id, budget, trace| {
                codec::control_of(V::CAP, V::VERB, req_id, Some(budget), &args, trace)
            })
            .await?;
        result
            .decode::<V::Output>()
            .map_err(|e| CallError::BadResult(e.to_string()))
    }

    /// Like [`Peer::request_within`], with a `req_id` of the caller's
    /// choosing: for control planes that retry a state-changing request
    /// after their own restart (or the peer's) and must be answered the
    /// remembered result rather than have it applied twice. The peer keys
    /// its answers on (this node, `req_id`): keep ids unique per verb.
    ///
    /// # Errors
    /// As [`Peer::request`]; [`CallError::ReqIdInUse`] when a call with
    /// this id is still waiting on the session; [`CallError::Encode`] for
    /// an empty id (that would be a notification).
    ///
    /// # Cancel safety
    /// As [`Peer::request`].
    pub async fn request_with_id<V: RequestVerb>(
        &self,
        _verb: V,
        args: V::Args,
        req_id: &ReqId,
        deadline: Duration,
    ) -> Result<V::Output, CallError> {
        if req_id.is_fire_and_forget() {
            return Err(CallError::Encode(
                "a request needs a non-empty req_id".into(),
            ));
        }
        let result = self
            .call_as(
                (V::CAP, V::VERB),
                Some(req_id.clone()),
                deadline,
                |req_id, budget, trace| {
                    codec::control_of(V::CAP, V::VERB, req_id, Some(budget), &args, trace)
                },
            )
            .await?;
        result
            .decode::<V::Output>()
            .map_err(|e| CallError::BadResult(e.to_string()))
    }

    /// Sends notification `V`: fire-and-forget, no answer is ever sent or
    /// awaited. Returns once the envelope is queued on the session (waiting,
    /// within the default deadline, while the session's send queue is full).
    ///
    /// # Errors
    /// No session could be had, the args do not encode, or the queue had
    /// no room within the deadline.
    ///
    /// # Cancel safety
    /// Dropped while it waits for a session or for room in the send queue,
    /// nothing is sent; once queued, the notification is sent even if the
    /// future is then dropped. It is never sent twice.
    pub async fn notify<V: NotificationVerb>(
        &self,
        _verb: V,
        args: V::Args,
    ) -> Result<(), CallError> {
        self.notify_with((V::CAP, V::VERB), self.default_deadline, |trace| {
            codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args, trace)
        })
        .await
    }

    /// Like [`Peer::notify`], waiting at most `deadline` for a session and
    /// for room in its send queue.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    ///
    /// # Cancel safety
    /// As [`Peer::notify`].
    pub async fn notify_within<V: NotificationVerb>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
    ) -> Result<(), CallError> {
        self.notify_with((V::CAP, V::VERB), deadline, |trace| {
            codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args, trace)
        })
        .await
    }

    /// As [`Peer::notify_within`], but the notification is queued only if
    /// `still()` holds at the moment it goes into the session's queue:
    /// `Ok(false)` when it did not. For messages that must not reach a peer
    /// once it lost a role (a control plane that was unbound while the
    /// message waited for a session or for room). Not copied to the
    /// monitoring tap.
    pub(crate) async fn notify_if<V: NotificationVerb>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
        still: impl Fn() -> bool,
    ) -> Result<bool, CallError> {
        let deadline_at = deadline_after(deadline);
        let session = self.session(deadline_at).await?;
        let frame = codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args, None)
            .map_err(|e| CallError::Encode(e.to_string()))?;
        // Not tapped: these go to the control plane, whose own traffic is
        // never copied (and one not sent must not show as sent).
        session
            .notify_if(frame, deadline_at, still)
            .await
            .map_err(|e| self.lost_or(e))
    }

    async fn session(&self, deadline: Instant) -> Result<Arc<Session>, CallError> {
        if self.peers.stopping().is_cancelled() {
            return Err(CallError::Shutdown);
        }
        self.peers
            .wait_session(&self.id, deadline)
            .await
            .ok_or(CallError::Unreachable(self.id))
    }

    /// An untyped request: any `cap` and `verb` text, args as raw CBOR.
    /// For tools (and tests) that speak to verbs they have no Rust type for.
    ///
    /// # Errors
    /// As [`Peer::request`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`].
    pub async fn call_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        deadline: Duration,
    ) -> Result<RawValue, CallError> {
        self.call_with((cap, verb), deadline, |req_id, budget, trace| {
            codec::control(cap, verb, req_id, Some(budget), args, trace)
        })
        .await
    }

    /// As [`Peer::call_raw`], with a `req_id` of the caller's choosing (see
    /// [`Peer::request_with_id`]): a request or a task submit sent again
    /// with the same id is answered what the first one was (a task verb:
    /// the same task), never run twice.
    ///
    /// # Errors
    /// As [`Peer::request_with_id`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`].
    pub async fn call_raw_with_id(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        req_id: &ReqId,
        deadline: Duration,
    ) -> Result<RawValue, CallError> {
        if req_id.is_fire_and_forget() {
            return Err(CallError::Encode(
                "a request needs a non-empty req_id".into(),
            ));
        }
        self.call_as(
            (cap, verb),
            Some(req_id.clone()),
            deadline,
            |req_id, budget, trace| codec::control(cap, verb, req_id, Some(budget), args, trace),
        )
        .await
    }

    /// A request to `cap`/`verb` whose frame `encode` builds from its
    /// req_id, budget and trace item.
    async fn call_with(
        &self,
        (cap, verb): (&str, &str),
        deadline: Duration,
        encode: impl Fn(
            &ReqId,
            u64,
            Option<&[u8]>,
        ) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        self.call_as((cap, verb), None, deadline, encode).await
    }

    /// A request with `req_id` (a fresh one when `None`).
    ///
    /// When both nodes dial each other at once, each keeps one of the two
    /// sessions and closes the other with `replaced`; a call sent on the
    /// one being replaced is sent again, with the same req_id, on the
    /// session that replaced it. The peer's replay ledger is keyed by
    /// (sender, req_id) across sessions, so a request that did reach the
    /// peer is never run twice: the retry gets its remembered answer (or
    /// `duplicate` while it still runs).
    ///
    /// The call is one client span (`trace/`), whose context travels with
    /// it.
    pub(crate) async fn call_as(
        &self,
        (cap, verb): (&str, &str),
        req_id: Option<ReqId>,
        deadline: Duration,
        encode: impl Fn(
            &ReqId,
            u64,
            Option<&[u8]>,
        ) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        let (span, cx) = self.span(cap, verb);
        let deadline_at = deadline_after(deadline);
        let req_id = req_id.unwrap_or_else(|| self.peers.next_req_id());
        let mut tries = 0;
        let result = loop {
            let session = self.session(deadline_at).await?;
            match self
                .call_once(&session, &req_id, deadline_at, cx.as_ref(), &encode)
                .await
            {
                Err(CallError::PeerLost)
                    if tries < MAX_REPLACED_RETRIES && was_replaced(&session) =>
                {
                    tries += 1;
                    tracing::debug!(peer = %self.id, %req_id, "session replaced under a call: sent again");
                }
                other => break other,
            }
        };
        end_span(&span, &result);
        result
    }

    /// One send of a request on `session` and the wait for its answer.
    async fn call_once(
        &self,
        session: &Session,
        req_id: &ReqId,
        deadline_at: Instant,
        cx: Option<&TraceContext>,
        encode: &impl Fn(
            &ReqId,
            u64,
            Option<&[u8]>,
        ) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        // The budget is what is left of the deadline after waiting for the
        // session.
        let left = deadline_at.saturating_duration_since(Instant::now());
        let budget_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let trace = Self::trace_item(session, cx);
        let frame = encode(req_id, budget_ms, trace.as_deref())
            .map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers
            .tap()
            .record(Way::Out, &self.id, &frame, None, true);
        let rx = session
            .call(req_id.clone(), frame, deadline_at)
            .await
            .map_err(|e| self.lost_or(e))?;
        let mut call = PendingCall {
            session,
            req_id: req_id.clone(),
            answered: false,
        };
        match tokio::time::timeout_at(deadline_at, rx).await {
            Ok(Ok(reply)) => {
                call.answered = true;
                match reply {
                    // The frame decoder validated the result item.
                    Reply::Ok(raw) => Ok(RawValue::dangerous_from_validated(raw)),
                    Reply::Err(body) => Err(CallError::from_remote(body)),
                }
            }
            Ok(Err(_)) => {
                call.answered = true;
                Err(self.lost_or(CallError::PeerLost))
            }
            // `call` is dropped here: the peer is told to stop.
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// An untyped notification: any `cap` and `verb` text.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    ///
    /// # Cancel safety
    /// As [`Peer::notify`].
    pub async fn notify_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
    ) -> Result<(), CallError> {
        self.notify_raw_within(cap, verb, args, self.default_deadline)
            .await
    }

    /// [`Peer::notify_raw`] with its own deadline for getting a session and
    /// room in the send queue.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    pub async fn notify_raw_within(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        deadline: Duration,
    ) -> Result<(), CallError> {
        self.notify_with((cap, verb), deadline, |trace| {
            codec::control(cap, verb, &ReqId::EMPTY, None, args, trace)
        })
        .await
    }

    /// A notification to `cap`/`verb` whose frame `encode` builds from its
    /// trace item. It is a client span that ends when the notification is
    /// queued.
    async fn notify_with(
        &self,
        (cap, verb): (&str, &str),
        deadline: Duration,
        encode: impl FnOnce(Option<&[u8]>) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<(), CallError> {
        let (span, cx) = self.span(cap, verb);
        let deadline_at = deadline_after(deadline);
        let session = self.session(deadline_at).await?;
        let trace = Self::trace_item(&session, cx.as_ref());
        let frame = encode(trace.as_deref()).map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers
            .tap()
            .record(Way::Out, &self.id, &frame, None, true);
        let result = session
            .notify(frame, deadline_at)
            .await
            .map_err(|e| self.lost_or(e));
        end_span(&span, &result);
        result
    }

    fn lost_or(&self, e: CallError) -> CallError {
        if matches!(e, CallError::PeerLost) && self.peers.stopping().is_cancelled() {
            CallError::Shutdown
        } else {
            e
        }
    }
}

/// Records how a call ended on its client span.
fn end_span<T>(span: &tracing::Span, result: &Result<T, CallError>) {
    match result {
        Ok(_) => crate::trace::record_end(span, "ok", true),
        Err(e) => {
            let what = match e {
                CallError::Denied(b) | CallError::Remote(b) => b.code.as_str(),
                CallError::Timeout => "timeout",
                CallError::Cancelled => "cancelled",
                CallError::Overloaded => "overloaded",
                CallError::TooLarge => "too_large",
                CallError::PeerLost => "peer_lost",
                CallError::Unreachable(_) => "unreachable",
                CallError::Shutdown => "shutdown",
                _ => "error",
            };
            crate::trace::record_end(span, what, false);
        }
    }
}
