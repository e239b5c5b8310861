//! What a handler can take besides its arguments: [`Sender`], [`Meta`],
//! [`State`], and the narrow handles the node registers.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use capwire_envelope::{ErrorCode, NodeId, ReqId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::dispatch::error::HandlerError;

/// Values handlers can extract, by type: the application's state (from
/// [`NodeBuilder::state`](crate::NodeBuilder::state)) and the node's own
/// handles. Built once with the node and never written afterwards.
#[derive(Default)]
pub struct Extensions {
    app: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    runtime: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions")
            .field("app", &self.app.len())
            .field("runtime", &self.runtime.len())
            .finish()
    }
}

impl Extensions {
    /// Registers application state of type `T`.
    pub(crate) fn insert_app<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.app.insert(TypeId::of::<T>(), Box::new(value));
    }

    /// Registers one of the runtime's own handles.
    pub(crate) fn insert_runtime<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.runtime.insert(TypeId::of::<T>(), Box::new(value));
    }

    /// Application state of type `T`, if registered.
    pub(crate) fn app<T: 'static>(&self) -> Option<&T> {
        self.app.get(&TypeId::of::<T>())?.downcast_ref()
    }

    /// A runtime handle of type `T`, if registered.
    pub(crate) fn runtime<T: 'static>(&self) -> Option<&T> {
        self.runtime.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

/// Where a task came from: what its handler's extractors see.
#[derive(Clone)]
pub(crate) struct Origin {
    pub(crate) submitter: NodeId,
    pub(crate) req_id: ReqId,
    pub(crate) extensions: Arc<Extensions>,
    pub(crate) channel: Channel,
}

/// What the runtime knows about the envelope a handler is running for.
pub struct Context {
    pub(crate) sender: NodeId,
    pub(crate) req_id: ReqId,
    pub(crate) deadline: Instant,
    pub(crate) extensions: Arc<Extensions>,
    /// Parent of the job's cancellation token: cancelled when the session
    /// ends or the node stops its handlers.
    pub(crate) parent: CancellationToken,
    /// The job's own token, made when an extractor first asks for it.
    pub(crate) cancel: Option<CancellationToken>,
    /// The session the envelope came on.
    pub(crate) channel: Channel,
    /// For a job serving a stream: where its items go.
    pub(crate) stream: Option<crate::dispatch::items::Served>,
    /// For a controller verb: the authority it was admitted on, which a
    /// task it submits keeps while it runs.
    pub(crate) authority: Option<Arc<crate::authority::Authority>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("sender", &self.sender)
            .field("req_id", &self.req_id)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The context of a task's handler: what its submit's envelope said,
    /// with the task's token as the parent. A task has no budget: it runs
    /// until it ends or is cancelled.
    pub(crate) fn for_task(origin: Origin, token: CancellationToken) -> Self {
        Self {
            sender: origin.submitter,
            req_id: origin.req_id,
            deadline: crate::time::deadline_after(std::time::Duration::from_secs(86_400 * 365)),
            extensions: origin.extensions,
            parent: token,
            cancel: None,
            channel: origin.channel,
            stream: None,
            authority: None,
        }
    }

    /// The authenticated sender.
    pub fn sender(&self) -> NodeId {
        self.sender
    }

    /// The request id (empty for a notification).
    pub fn req_id(&self) -> &ReqId {
        &self.req_id
    }

    /// When the handler's budget runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The job's cancellation token, made on first use. It fires when the
    /// caller cancels, the budget runs out, the session ends or the node
    /// stops its handlers.
    pub fn cancel_token(&mut self) -> CancellationToken {
        self.cancel
            .get_or_insert_with(|| self.parent.child_token())
            .clone()
    }

    /// A runtime handle registered by the node.
    pub(crate) fn runtime<T: Clone + 'static>(&self) -> Option<T> {
        self.extensions.runtime::<T>().cloned()
    }
}

/// Something a handler can take besides its arguments.
pub trait FromContext: Sized + Send + 'static {
    /// Extracts the value.
    ///
    /// # Errors
    /// An error here is answered to the caller instead of running the handler.
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError>;

    /// Checks, when the node is built, that extraction will work; a handler
    /// whose extractor cannot work is refused then, not on every call.
    ///
    /// # Errors
    /// What is missing, in words.
    fn check(extensions: &Extensions) -> Result<(), String> {
        let _ = extensions;
        Ok(())
    }
}

/// The authenticated identity of the peer that sent the envelope: the static
/// key proven in the handshake, never a field of the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender(pub NodeId);

impl FromContext for Sender {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        Ok(Sender(cx.sender))
    }
}

/// Request metadata: request id, deadline and cancellation.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The request id (empty for a notification).
    pub req_id: ReqId,
    /// When the handler's budget runs out: the caller's deadline, bounded
    /// by the node's `max_handler_time`.
    pub deadline: Instant,
    /// Cancelled when the caller cancels, the deadline passes, the session
    /// ends or the node shuts down.
    pub cancel: CancellationToken,
}

impl FromContext for Meta {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        Ok(Meta {
            req_id: cx.req_id.clone(),
            deadline: cx.deadline,
            cancel: cx.cancel_token(),
        })
    }
}

/// What the runtime knows of the session an envelope came on: the
/// largest response frame the sender can take (the smaller of its
/// `max_record` and ours: the core capabilities check that an answer fits
/// before they change anything for it) and the session's protocol version
/// (which view of the manifest the sender is shown).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Channel {
    pub(crate) reply_room: usize,
    pub(crate) version: u32,
}

impl FromContext for Channel {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        Ok(cx.channel)
    }
}

/// Shared application state registered with
/// [`NodeBuilder::state`](crate::NodeBuilder::state). A handler asking for
/// a `State<T>` the node was not given is refused when the node is built.
#[derive(Debug, Clone)]
pub struct State<T>(pub T);

impl<T: Clone + Send + Sync + 'static> FromContext for State<T> {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        cx.extensions.app::<T>().cloned().map(State).ok_or_else(|| {
            // Unreachable once the node is built: `check` refused it.
            HandlerError::new(
                ErrorCode::Internal,
                "handler state of this type was not registered",
            )
        })
    }

    fn check(extensions: &Extensions) -> Result<(), String> {
        match extensions.app::<T>() {
            Some(_) => Ok(()),
            None => Err(format!(
                "the handler takes State<{}>, but the node was not given one (NodeBuilder::state)",
                std::any::type_name::<T>()
            )),
        }
    }
}

/// The task service, as handlers (the task verbs' and `core.tasks`') take
/// it.
#[derive(Clone)]
pub(crate) struct Tasks(pub(crate) Arc<crate::tasks::TaskService>);

impl FromContext for Tasks {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        cx.runtime::<Tasks>().ok_or_else(|| {
            HandlerError::new(ErrorCode::Internal, "the task service is not installed")
        })
    }

    fn check(extensions: &Extensions) -> Result<(), String> {
        extensions
            .runtime::<Tasks>()
            .map(|_| ())
            .ok_or_else(|| "the task service is not installed".to_owned())
    }
}
