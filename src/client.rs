//! Calling a peer: typed requests with deadlines and cancellation,
//! fire-and-forget notifications, and streams.

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{CloseCode, NodeId, RawValue, ReqId};
use capwire_manifest::{
    BindArgs, BindReply, CapRequirement, CapabilityManifest, Manifest, MonitoringBind,
    NotificationVerb, RequestVerb, StreamVerb, TaskSubmitted, TaskVerb,
};
use tokio::time::Instant;

use crate::error::CallError;
use crate::invite::Invite;
use crate::net::peers::Peers;
use crate::net::session::Session;
use crate::proto::codec;
use crate::proto::session::{End, Reply};
use crate::stream::ItemStream;
use crate::tap::Way;
use crate::task::TaskHandle;

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

/// `now + d`, or a far future when that does not fit.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

impl Peer {
    pub(crate) fn new(peers: Arc<Peers>, id: NodeId, default_deadline: Duration) -> Self {
        Self {
            peers,
            id,
            default_deadline,
        }
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
            .call_with(deadline, |req_id, budget| {
                codec::control_of(V::CAP, V::VERB, req_id, Some(budget), &args)
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
            .call_as(Some(req_id.clone()), deadline, |req_id, budget| {
                codec::control_of(V::CAP, V::VERB, req_id, Some(budget), &args)
            })
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
        self.notify_with(self.default_deadline, || {
            codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args)
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
        self.notify_with(deadline, || {
            codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args)
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
        let frame = codec::control_of(V::CAP, V::VERB, &ReqId::EMPTY, None, &args)
            .map_err(|e| CallError::Encode(e.to_string()))?;
        // Not tapped: these go to the control plane, whose own traffic is
        // never copied (and one not sent must not show as sent).
        session
            .notify_if(frame, deadline_at, still)
            .await
            .map_err(|e| self.lost_or(e))
    }

    /// Calls stream verb `V`: returns once the stream is open (its control
    /// frame and first grant queued); its items then come on the
    /// [`ItemStream`] as the handler produces them, within the window of
    /// [`Limits::stream_window_items`](crate::Limits) and
    /// [`stream_window_bytes`](crate::Limits) (see [`crate::stream`]).
    /// The whole stream has no deadline of its own (the peer bounds it by
    /// its `max_handler_time`); [`Limits::stream_idle_timeout`](crate::Limits)
    /// bounds the wait for each item.
    ///
    /// # Errors
    /// [`CallError::Unsupported`] when the peer speaks protocol 1 only
    /// (nothing is sent); [`CallError::Unreachable`] without a session;
    /// `Overloaded` when this session's streams hold all the window they
    /// may; `Encode`, `TooLarge`. Errors of the stream itself (denied,
    /// the handler's error, a lost session) come as the stream's last item.
    ///
    /// # Cancel safety
    /// Dropped before it returns, the stream is not opened (or, once
    /// queued, is cancelled). Dropping the [`ItemStream`] cancels it.
    pub async fn stream<V: StreamVerb>(
        &self,
        _verb: V,
        args: V::Args,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_as::<V>(&args, None).await
    }

    /// As [`Peer::stream`], with a deadline for the whole stream: the
    /// peer is given it as the stream's budget, and the stream ends with
    /// [`CallError::Timeout`] when it passes.
    ///
    /// # Errors
    /// As [`Peer::stream`].
    ///
    /// # Cancel safety
    /// As [`Peer::stream`].
    pub async fn stream_within<V: StreamVerb>(
        &self,
        _verb: V,
        args: V::Args,
        deadline: Duration,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_as::<V>(&args, Some(deadline)).await
    }

    /// An untyped stream: any `cap` and `verb` text, args as raw CBOR,
    /// each item as raw CBOR. For tools (and tests) that speak to stream
    /// verbs they have no Rust type for; `deadline`, when given, bounds the
    /// whole stream as in [`Peer::stream_within`].
    ///
    /// ```
    /// use capwire::envelope::RawValue;
    /// use capwire::manifest::verb;
    /// use capwire::{Capability, HandlerError, Items, Node};
    ///
    /// verb! {
    ///     /// Counts down to 1.
    ///     struct Down: stream "app.count" / "down", Bootstrap, u32 => u32;
    /// }
    ///
    /// async fn down(from: u32, mut items: Items<u32>) -> Result<(), HandlerError> {
    ///     for n in (1..=from).rev() {
    ///         items.send(n).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = Node::builder("counter")
    ///     .listen("127.0.0.1:0".parse()?)
    ///     .capability(Capability::new("app.count", "1.0.0")?.stream(Down, down))
    ///     .start()
    ///     .await?;
    /// let client = Node::builder("client").start().await?;
    /// let peer = client.connect(&server.local_addrs()[0], Some(server.id())).await?;
    ///
    /// let args = RawValue::encode(&3u32)?;
    /// let mut items = peer.stream_raw("app.count", "down", &args, None).await?;
    /// let mut got = Vec::new();
    /// while let Some(item) = items.next().await {
    ///     got.push(item?.decode::<u32>()?);
    /// }
    /// assert_eq!(got, [3, 2, 1]);
    /// # client.shutdown().await;
    /// # server.shutdown().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Peer::stream`]; a verb the peer does not have is refused
    /// (`unknown_verb`) as the stream's last item. Nothing checks that the
    /// verb is a stream: a request verb opened this way runs once and its
    /// answer is dropped (the stream ends with no item), so look its kind
    /// up in [`Peer::manifest`] first.
    ///
    /// # Cancel safety
    /// As [`Peer::stream`].
    pub async fn stream_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        deadline: Option<Duration>,
    ) -> Result<ItemStream<RawValue>, CallError> {
        self.stream_with(deadline, |req_id, budget| {
            codec::control(cap, verb, req_id, budget, args)
        })
        .await
    }

    /// Submits task verb `V` (see [`crate::task`]): returns once the peer
    /// has written the task, with its handle; the task then runs on the
    /// peer whatever becomes of this session or this node. Within the
    /// node's default deadline.
    ///
    /// # Errors
    /// [`CallError::Unsupported`] when the peer speaks protocol 1 only
    /// (nothing is sent); `Overloaded` when the peer keeps as many tasks
    /// as it may (in all, or for this node); otherwise as
    /// [`Peer::request`].
    ///
    /// # Cancel safety
    /// As [`Peer::request`]: dropped after the request was sent, the task
    /// may exist without this node knowing its id (it is in
    /// `core.tasks/list`); [`Peer::submit_with_id`] finds it again.
    pub async fn submit<V: TaskVerb>(
        &self,
        _verb: V,
        args: V::Args,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        self.submit_as::<V>(&args, None, self.default_deadline)
            .await
    }

    /// As [`Peer::submit`], with a `req_id` of the caller's choosing and
    /// its own deadline: the peer keys tasks on (this node, `req_id`) for
    /// as long as it keeps them, so a submit sent again (after a timeout,
    /// or this node's restart) gets the same task, not a second one.
    ///
    /// # Errors
    /// As [`Peer::submit`] and [`Peer::request_with_id`].
    ///
    /// # Cancel safety
    /// As [`Peer::submit`].
    pub async fn submit_with_id<V: TaskVerb>(
        &self,
        _verb: V,
        args: V::Args,
        req_id: &ReqId,
        deadline: Duration,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        if req_id.is_fire_and_forget() {
            return Err(CallError::Encode("a task needs a non-empty req_id".into()));
        }
        self.submit_as::<V>(&args, Some(req_id.clone()), deadline)
            .await
    }

    /// Submits a task verb given by name, its args as raw CBOR (see
    /// [`Peer::submit`]); the handle's result is raw CBOR too. With
    /// `req_id`, safe to send again (see [`Peer::submit_with_id`]).
    ///
    /// # Errors
    /// As [`Peer::submit`]; a verb that is not a task verb is refused with
    /// [`CallError::BadResult`] (its answer is not a task's id; a request
    /// verb has then run once).
    ///
    /// # Cancel safety
    /// As [`Peer::submit`].
    pub async fn submit_raw(
        &self,
        cap: &str,
        verb: &str,
        args: &RawValue,
        req_id: Option<&ReqId>,
        deadline: Duration,
    ) -> Result<TaskHandle<RawValue>, CallError> {
        let session = self.session(deadline_after(deadline)).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no tasks".to_owned(),
            ));
        }
        let answer = match req_id {
            Some(id) => self.call_raw_with_id(cap, verb, args, id, deadline).await?,
            None => self.call_raw(cap, verb, args, deadline).await?,
        };
        let submitted = answer
            .decode::<TaskSubmitted>()
            .map_err(|e| CallError::BadResult(e.to_string()))?;
        Ok(TaskHandle::new(self.clone(), submitted.task))
    }

    /// A handle to the task `id` on this peer, known from an earlier
    /// submit, a list or a push: nothing is sent until it is used. `T` is
    /// its verb's result type.
    pub fn task<T: serde::de::DeserializeOwned>(&self, id: impl Into<String>) -> TaskHandle<T> {
        TaskHandle::new(self.clone(), id.into())
    }

    async fn submit_as<V: TaskVerb>(
        &self,
        args: &V::Args,
        req_id: Option<ReqId>,
        deadline: Duration,
    ) -> Result<TaskHandle<V::Output>, CallError> {
        let session = self.session(deadline_after(deadline)).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no tasks".to_owned(),
            ));
        }
        let answer = self
            .call_as(req_id, deadline, |req_id, budget| {
                codec::control_of(V::CAP, V::VERB, req_id, Some(budget), args)
            })
            .await?;
        let submitted = answer
            .decode::<TaskSubmitted>()
            .map_err(|e| CallError::BadResult(e.to_string()))?;
        Ok(TaskHandle::new(self.clone(), submitted.task))
    }

    async fn stream_as<V: StreamVerb>(
        &self,
        args: &V::Args,
        deadline: Option<Duration>,
    ) -> Result<ItemStream<V::Output>, CallError> {
        self.stream_with(deadline, |req_id, budget| {
            codec::control_of(V::CAP, V::VERB, req_id, budget, args)
        })
        .await
    }

    /// Opens a stream whose control frame `encode` builds from its req_id
    /// and budget.
    async fn stream_with<T: serde::de::DeserializeOwned>(
        &self,
        deadline: Option<Duration>,
        encode: impl FnOnce(&ReqId, Option<u64>) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<ItemStream<T>, CallError> {
        let defaults = self.peers.stream_defaults();
        let deadline_at = deadline.map(deadline_after);
        let open_by = deadline_at.unwrap_or_else(|| deadline_after(self.default_deadline));
        let session = self.session(open_by).await?;
        if session.lock().version() < capwire_envelope::PROTOCOL_V2 {
            return Err(CallError::Unsupported(
                "the peer speaks protocol 1, which has no streams".to_owned(),
            ));
        }
        let req_id = self.peers.next_req_id();
        let budget = deadline_at.map(|d| {
            u64::try_from(d.saturating_duration_since(Instant::now()).as_millis())
                .unwrap_or(u64::MAX)
        });
        let frame = encode(&req_id, budget).map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers.tap().record(Way::Out, &self.id, &frame, None);
        let sink = session
            .open_stream(req_id.clone(), frame, defaults.window, open_by)
            .await
            .map_err(|e| self.lost_or(e))?;
        Ok(ItemStream::new(
            sink,
            session,
            req_id,
            deadline_at,
            defaults.idle,
        ))
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
        self.call_with(deadline, |req_id, budget| {
            codec::control(cap, verb, req_id, Some(budget), args)
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
        self.call_as(Some(req_id.clone()), deadline, |req_id, budget| {
            codec::control(cap, verb, req_id, Some(budget), args)
        })
        .await
    }

    /// A request whose frame `encode` builds from its req_id and budget.
    async fn call_with(
        &self,
        deadline: Duration,
        encode: impl Fn(&ReqId, u64) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        self.call_as(None, deadline, encode).await
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
    async fn call_as(
        &self,
        req_id: Option<ReqId>,
        deadline: Duration,
        encode: impl Fn(&ReqId, u64) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        let deadline_at = deadline_after(deadline);
        let req_id = req_id.unwrap_or_else(|| self.peers.next_req_id());
        let mut tries = 0;
        loop {
            let session = self.session(deadline_at).await?;
            match self
                .call_once(&session, &req_id, deadline_at, &encode)
                .await
            {
                Err(CallError::PeerLost)
                    if tries < MAX_REPLACED_RETRIES && was_replaced(&session) =>
                {
                    tries += 1;
                    tracing::debug!(peer = %self.id, %req_id, "session replaced under a call: sent again");
                }
                other => return other,
            }
        }
    }

    /// One send of a request on `session` and the wait for its answer.
    async fn call_once(
        &self,
        session: &Session,
        req_id: &ReqId,
        deadline_at: Instant,
        encode: &impl Fn(&ReqId, u64) -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<RawValue, CallError> {
        // The budget is what is left of the deadline after waiting for the
        // session.
        let left = deadline_at.saturating_duration_since(Instant::now());
        let budget_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let frame = encode(req_id, budget_ms).map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers.tap().record(Way::Out, &self.id, &frame, None);
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
        self.notify_with(deadline, || {
            codec::control(cap, verb, &ReqId::EMPTY, None, args)
        })
        .await
    }

    /// A notification whose frame `encode` builds.
    async fn notify_with(
        &self,
        deadline: Duration,
        encode: impl FnOnce() -> Result<bytes::Bytes, capwire_envelope::EncodeError>,
    ) -> Result<(), CallError> {
        let deadline_at = deadline_after(deadline);
        let session = self.session(deadline_at).await?;
        let frame = encode().map_err(|e| CallError::Encode(e.to_string()))?;
        self.peers.tap().record(Way::Out, &self.id, &frame, None);
        session
            .notify(frame, deadline_at)
            .await
            .map_err(|e| self.lost_or(e))
    }

    fn lost_or(&self, e: CallError) -> CallError {
        if matches!(e, CallError::PeerLost) && self.peers.stopping().is_cancelled() {
            CallError::Shutdown
        } else {
            e
        }
    }
}
