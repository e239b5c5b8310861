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
use std::sync::{Arc, OnceLock};

use capwire_envelope::{DecodeError, ErrorCode, RawValue};
use capwire_manifest::{StreamVerb, VerbDef};

pub(crate) use crate::dispatch::error::HandlerError;
use crate::dispatch::extract::{Context, Extensions, FromContext};
use crate::stream::Items;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// An async function that can handle verb `V`. `M` only tells the blanket
/// implementations apart; you never name it.
///
/// Implemented for every `Fn(V::Args, E1, .., En) -> impl Future<Output =
/// Result<V::Output, HandlerError>>` with up to three extractors `Ei:
/// FromContext`.
pub trait Handler<V: VerbDef, M>: Clone + Send + Sync + 'static {
    /// Runs the handler: extracts what it needs from `cx` and starts it.
    fn call(&self, args: V::Args, cx: &mut Context) -> BoxFuture<Result<V::Output, HandlerError>>;

    /// Checks, when the node is built, that `cx` will give every extractor
    /// what it needs (for example the state behind a [`State<T>`](crate::State)).
    ///
    /// # Errors
    /// What is missing, in words.
    fn check(extensions: &Extensions) -> Result<(), String>;
}

impl<V, F, Fut> Handler<V, ()> for F
where
    V: VerbDef,
    F: Fn(V::Args) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<V::Output, HandlerError>> + Send + 'static,
{
    fn call(&self, args: V::Args, _cx: &mut Context) -> BoxFuture<Result<V::Output, HandlerError>> {
        Box::pin((self)(args))
    }

    fn check(_extensions: &Extensions) -> Result<(), String> {
        Ok(())
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
            fn call(&self, args: V::Args, cx: &mut Context) -> BoxFuture<Result<V::Output, HandlerError>> {
                $(let $e = match $e::from_context(cx) {
                    Ok(v) => v,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };)+
                Box::pin((self)(args, $($e),+))
            }

            fn check(extensions: &Extensions) -> Result<(), String> {
                $($e::check(extensions)?;)+
                Ok(())
            }
        }
    };
}

impl_handler!(E1);
impl_handler!(E1, E2);
impl_handler!(E1, E2, E3);

/// An async function that can serve stream verb `V`. `M` only tells the
/// blanket implementations apart; you never name it.
///
/// Implemented for every `Fn(V::Args, Items<V::Output>, E1, .., En) ->
/// impl Future<Output = Result<(), HandlerError>>` with up to three
/// extractors `Ei: FromContext`. The stream ends when the future does:
/// `Ok(())` ends it well, an error ends it with that error.
pub trait StreamHandler<V: StreamVerb, M>: Clone + Send + Sync + 'static {
    /// Runs the handler: extracts what it needs from `cx` and starts it.
    fn call(
        &self,
        args: V::Args,
        items: Items<V::Output>,
        cx: &mut Context,
    ) -> BoxFuture<Result<(), HandlerError>>;

    /// As [`Handler::check`].
    ///
    /// # Errors
    /// What is missing, in words.
    fn check(extensions: &Extensions) -> Result<(), String>;
}

impl<V, F, Fut> StreamHandler<V, ()> for F
where
    V: StreamVerb,
    F: Fn(V::Args, Items<V::Output>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn call(
        &self,
        args: V::Args,
        items: Items<V::Output>,
        _cx: &mut Context,
    ) -> BoxFuture<Result<(), HandlerError>> {
        Box::pin((self)(args, items))
    }

    fn check(_extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }
}

macro_rules! impl_stream_handler {
    ($($e:ident),+) => {
        impl<V, F, Fut, $($e),+> StreamHandler<V, ($($e,)+)> for F
        where
            V: StreamVerb,
            F: Fn(V::Args, Items<V::Output>, $($e),+) -> Fut + Clone + Send + Sync + 'static,
            Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
            $($e: FromContext),+
        {
            #[allow(non_snake_case)]
            fn call(
                &self,
                args: V::Args,
                items: Items<V::Output>,
                cx: &mut Context,
            ) -> BoxFuture<Result<(), HandlerError>> {
                $(let $e = match $e::from_context(cx) {
                    Ok(v) => v,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };)+
                Box::pin((self)(args, items, $($e),+))
            }

            fn check(extensions: &Extensions) -> Result<(), String> {
                $($e::check(extensions)?;)+
                Ok(())
            }
        }
    };
}

impl_stream_handler!(E1);
impl_stream_handler!(E1, E2);
impl_stream_handler!(E1, E2, E3);

/// The type-erased handler of one route.
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    /// Decodes the raw arguments (after authorization) and starts the
    /// handler. A decode failure is `bad_args`.
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError>;

    /// See [`Handler::check`].
    fn check(&self, extensions: &Extensions) -> Result<(), String>;
}

/// What the registry stores for each route: the erased handler and the
/// route's index in the registry (set once the registry is built; it keys
/// the per-route counters and binds ledger entries to their route).
pub(crate) struct RouteEntry {
    handler: Box<dyn ErasedHandler>,
    index: OnceLock<u32>,
    /// The handler remembers its own answers durably (and finishes its
    /// change even when the caller stops waiting): an answer the runtime
    /// made for it (`timeout`, `cancelled`) is not kept for replay.
    durable: bool,
}

impl RouteEntry {
    pub(crate) fn new(handler: impl ErasedHandler) -> Self {
        Self {
            handler: Box::new(handler),
            index: OnceLock::new(),
            durable: false,
        }
    }

    /// A route whose handler keeps exactly-once answers of its own.
    pub(crate) fn durable(handler: impl ErasedHandler) -> Self {
        Self {
            durable: true,
            ..Self::new(handler)
        }
    }

    pub(crate) fn is_durable(&self) -> bool {
        self.durable
    }

    pub(crate) fn handler(&self) -> &dyn ErasedHandler {
        &*self.handler
    }

    /// The route's index; `u32::MAX` before the registry was indexed.
    pub(crate) fn index(&self) -> u32 {
        self.index.get().copied().unwrap_or(u32::MAX)
    }

    pub(crate) fn set_index(&self, index: u32) {
        let _ = self.index.set(index);
    }
}

/// A shareable route handler, as stored in the registry.
pub(crate) type RouteHandler = Arc<RouteEntry>;

/// A typed handler `H` of verb `V`, erased.
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
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let args: V::Args = args.decode()?;
        let fut = self.handler.call(args, cx);
        Ok(Box::pin(async move {
            let out = fut.await?;
            if V::KIND == capwire_manifest::VerbKind::Notification {
                // Nobody is told a notification's outcome.
                return Ok(RawValue::null());
            }
            RawValue::encode(&out).map_err(|e| {
                HandlerError::new(
                    ErrorCode::Internal,
                    format!("result could not be encoded: {e}"),
                )
            })
        }))
    }

    fn check(&self, extensions: &Extensions) -> Result<(), String> {
        H::check(extensions)
    }
}

/// A typed stream handler `H` of verb `V`, erased.
pub(crate) struct StreamTyped<V, M, H> {
    handler: H,
    _marker: PhantomData<fn() -> (V, M)>,
}

impl<V, M, H> StreamTyped<V, M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _marker: PhantomData,
        }
    }
}

impl<V, M, H> ErasedHandler for StreamTyped<V, M, H>
where
    V: StreamVerb,
    M: 'static,
    H: StreamHandler<V, M>,
{
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let args: V::Args = args.decode()?;
        let Some(served) = cx.stream.take() else {
            // Only stream jobs reach a stream verb's handler.
            return Ok(Box::pin(async {
                Err(HandlerError::new(
                    ErrorCode::Internal,
                    "a stream verb ran outside a stream",
                ))
            }));
        };
        let items = Items::new(served, cx.deadline);
        let fut = self.handler.call(args, items, cx);
        Ok(Box::pin(
            async move { fut.await.map(|()| RawValue::null()) },
        ))
    }

    fn check(&self, extensions: &Extensions) -> Result<(), String> {
        H::check(extensions)
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
