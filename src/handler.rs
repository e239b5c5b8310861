//! Handlers: plain async functions with typed arguments.
//!
//! A handler for a verb `V` is an async function taking `V::Args` first and
//! then up to three extractors ([`FromContext`]), returning
//! `Result<V::Output, HandlerError>`:
//!
//! ```text
//! async fn say(args: SayArgs) -> Result<String, HandlerError> { .. }
//! async fn say_to(args: SayArgs, Sender(from): Sender) -> Result<String, HandlerError> { .. }
//! ```
//!
//! The runtime decodes the arguments only after the chokepoint allowed the
//! envelope, runs the handler, and encodes its result; handlers never touch
//! the connection.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use capwire_envelope::{DecodeError, ErrorBody, ErrorCode, NodeId, RawValue, ReqId};
use capwire_manifest::VerbDef;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::node::Node;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The error a handler returns: a wire error code and a message.
///
/// ```
/// use capwire::HandlerError;
/// use capwire::envelope::ErrorCode;
/// let e = HandlerError::new(ErrorCode::NotFound, "no such member");
/// assert_eq!(e.body().code, ErrorCode::NotFound);
/// let app = HandlerError::app("quota_exceeded", "try later").unwrap();
/// assert_eq!(app.body().code.as_str(), "quota_exceeded");
/// ```
#[derive(Debug, Clone)]
pub struct HandlerError(ErrorBody);

impl HandlerError {
    /// An error with one of the framework's codes.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(ErrorBody::new(code, message))
    }

    /// An error with an application-defined code (`[a-z][a-z0-9_]*`, not one
    /// of the framework's codes).
    ///
    /// # Errors
    /// When `code` is not a valid application code.
    pub fn app(code: &str, message: impl Into<String>) -> Result<Self, capwire_envelope::IdError> {
        let code = ErrorCode::app(code)?;
        Ok(Self(ErrorBody::new(code, message)))
    }

    /// An error with structured detail.
    pub fn with_detail(mut self, detail: RawValue) -> Self {
        self.0.detail = Some(detail);
        self
    }

    /// The error as it travels on the wire.
    pub fn body(&self) -> &ErrorBody {
        &self.0
    }

    pub(crate) fn into_body(self) -> ErrorBody {
        self.0
    }
}

impl From<ErrorBody> for HandlerError {
    fn from(body: ErrorBody) -> Self {
        Self(body)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code, self.0.message)
    }
}

impl std::error::Error for HandlerError {}

/// What the runtime knows about the envelope a handler is running for.
#[derive(Clone)]
pub struct Context {
    pub(crate) node: Node,
    pub(crate) sender: NodeId,
    pub(crate) req_id: ReqId,
    pub(crate) deadline: Option<Instant>,
    pub(crate) cancel: CancellationToken,
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

/// Something a handler can take besides its arguments.
pub trait FromContext: Sized + Send + 'static {
    /// Extracts the value.
    ///
    /// # Errors
    /// An error here is answered to the caller instead of running the handler.
    fn from_context(cx: &Context) -> Result<Self, HandlerError>;
}

/// The authenticated identity of the peer that sent the envelope: the static
/// key proven in the handshake, never a field of the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender(pub NodeId);

impl FromContext for Sender {
    fn from_context(cx: &Context) -> Result<Self, HandlerError> {
        Ok(Sender(cx.sender))
    }
}

/// Request metadata: request id, deadline and cancellation.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The request id (empty for a notification).
    pub req_id: ReqId,
    /// When the caller stops waiting, if it said.
    pub deadline: Option<Instant>,
    /// Cancelled when the caller cancels or the deadline passes.
    pub cancel: CancellationToken,
}

impl FromContext for Meta {
    fn from_context(cx: &Context) -> Result<Self, HandlerError> {
        Ok(Meta {
            req_id: cx.req_id.clone(),
            deadline: cx.deadline,
            cancel: cx.cancel.clone(),
        })
    }
}

impl FromContext for Node {
    fn from_context(cx: &Context) -> Result<Self, HandlerError> {
        Ok(cx.node.clone())
    }
}

/// Shared application state registered with
/// [`NodeBuilder::state`](crate::NodeBuilder::state).
#[derive(Debug, Clone)]
pub struct State<T>(pub T);

impl<T: Clone + Send + Sync + 'static> FromContext for State<T> {
    fn from_context(cx: &Context) -> Result<Self, HandlerError> {
        cx.node.state::<T>().map(State).ok_or_else(|| {
            HandlerError::new(
                ErrorCode::Internal,
                "handler state of this type was not registered",
            )
        })
    }
}

/// An async function that can handle verb `V`. `M` only tells the blanket
/// implementations apart; you never name it.
pub trait Handler<V: VerbDef, M>: Clone + Send + Sync + 'static {
    /// Runs the handler.
    fn call(&self, args: V::Args, cx: Context) -> BoxFuture<Result<V::Output, HandlerError>>;
}

impl<V, F, Fut> Handler<V, ()> for F
where
    V: VerbDef,
    F: Fn(V::Args) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<V::Output, HandlerError>> + Send + 'static,
{
    fn call(&self, args: V::Args, _cx: Context) -> BoxFuture<Result<V::Output, HandlerError>> {
        Box::pin((self)(args))
    }
}

macro_rules! impl_handler {
    ($($e:ident),+) => {
        impl<V, F, Fut, $($e),+> Handler<V, ($($e,)+)> for F
        where
            V: VerbDef,
            F: Fn(V::Args, $($e),+) -> Fut + Clone + Send + Sync + 'static,
            Fut: Future<Output = Result<V::Output, HandlerError>> + Send + 'static,
            $($e: FromContext),+
        {
            #[allow(non_snake_case)]
            fn call(&self, args: V::Args, cx: Context) -> BoxFuture<Result<V::Output, HandlerError>> {
                $(let $e = match $e::from_context(&cx) {
                    Ok(v) => v,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };)+
                Box::pin((self)(args, $($e),+))
            }
        }
    };
}

impl_handler!(E1);
impl_handler!(E1, E2);
impl_handler!(E1, E2, E3);

/// The type-erased handler the registry stores for each route.
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    /// Decodes the raw arguments (after authorization) and starts the
    /// handler. A decode failure is `bad_args`.
    fn start(
        &self,
        args: &[u8],
        cx: Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError>;
}

/// A shareable erased handler, as stored in the registry.
pub(crate) type RouteHandler = Arc<dyn ErasedHandler>;

pub(crate) struct Typed<V, M, H> {
    handler: H,
    _marker: PhantomData<fn() -> (V, M)>,
}

impl<V, M, H> Typed<V, M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _marker: PhantomData,
        }
    }
}

impl<V, M, H> ErasedHandler for Typed<V, M, H>
where
    V: VerbDef,
    M: 'static,
    H: Handler<V, M>,
{
    fn start(
        &self,
        args: &[u8],
        cx: Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let args: V::Args = capwire_envelope::from_slice(args)?;
        let fut = self.handler.call(args, cx);
        Ok(Box::pin(async move {
            let out = fut.await?;
            RawValue::encode(&out).map_err(|e| {
                HandlerError::new(
                    ErrorCode::Internal,
                    format!("result could not be encoded: {e}"),
                )
            })
        }))
    }
}

/// Turns a caught panic payload into a message.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "handler panicked".to_string()
    }
}
