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

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use capwire_envelope::{DecodeError, ErrorCode, RawValue};
use capwire_manifest::{StreamVerb, TaskVerb, VerbDef};

pub(crate) use crate::dispatch::error::HandlerError;
use crate::dispatch::extract::Tasks;
use crate::dispatch::extract::{Context, Extensions, FromContext};
use crate::dispatch::items::Items;
use crate::tasks::Start;
use crate::tasks::task::Task;

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

    /// As [`call`](Handler::call), with the result encoded for the wire
    /// (`null` for a notification, whose outcome nobody is told), in one
    /// boxed future: what the runtime runs.
    #[doc(hidden)]
    fn call_encoded(
        &self,
        args: V::Args,
        cx: &mut Context,
    ) -> BoxFuture<Result<RawValue, HandlerError>> {
        let fut = self.call(args, cx);
        Box::pin(async move { encode_output::<V>(&fut.await?) })
    }

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

    fn call_encoded(
        &self,
        args: V::Args,
        _cx: &mut Context,
    ) -> BoxFuture<Result<RawValue, HandlerError>> {
        let fut = (self)(args);
        Box::pin(async move { encode_output::<V>(&fut.await?) })
    }

    fn check(_extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }
}

/// A handler's result as the wire carries it: `null` for a notification
/// (nobody is told its outcome), else the result encoded.
fn encode_output<V: VerbDef>(out: &V::Output) -> Result<RawValue, HandlerError> {
    if V::KIND == capwire_manifest::VerbKind::Notification {
        return Ok(RawValue::null());
    }
    RawValue::encode(out).map_err(|e| {
        HandlerError::new(
            ErrorCode::Internal,
            format!("result could not be encoded: {e}"),
        )
    })
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

            #[allow(non_snake_case)]
            fn call_encoded(
                &self,
                args: V::Args,
                cx: &mut Context,
            ) -> BoxFuture<Result<RawValue, HandlerError>> {
                $(let $e = match $e::from_context(cx) {
                    Ok(v) => v,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };)+
                let fut = (self)(args, $($e),+);
                Box::pin(async move { encode_output::<V>(&fut.await?) })
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

/// An async function that can run task verb `V`. `M` only tells the
/// blanket implementations apart; you never name it.
///
/// Implemented for every `Fn(V::Args, Task, E1, .., En) -> impl
/// Future<Output = Result<V::Output, HandlerError>>` with up to three
/// extractors `Ei: FromContext`. The task ends when the future does: its
/// result completes it, an error fails it (see [`crate::task`]). The
/// extractors see the task's submitter as [`Sender`](crate::Sender), and
/// [`Meta::cancel`](crate::Meta) fires when the task is cancelled.
pub trait TaskHandler<V: TaskVerb, M>: Clone + Send + Sync + 'static {
    /// Runs the handler: extracts what it needs from `cx` and starts it.
    fn call(
        &self,
        args: V::Args,
        task: Task,
        cx: &mut Context,
    ) -> BoxFuture<Result<V::Output, HandlerError>>;

    /// As [`Handler::check`].
    ///
    /// # Errors
    /// What is missing, in words.
    fn check(extensions: &Extensions) -> Result<(), String>;
}

impl<V, F, Fut> TaskHandler<V, ()> for F
where
    V: TaskVerb,
    F: Fn(V::Args, Task) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<V::Output, HandlerError>> + Send + 'static,
{
    fn call(
        &self,
        args: V::Args,
        task: Task,
        _cx: &mut Context,
    ) -> BoxFuture<Result<V::Output, HandlerError>> {
        Box::pin((self)(args, task))
    }

    fn check(_extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }
}

macro_rules! impl_task_handler {
    ($($e:ident),+) => {
        impl<V, F, Fut, $($e),+> TaskHandler<V, ($($e,)+)> for F
        where
            V: TaskVerb,
            F: Fn(V::Args, Task, $($e),+) -> Fut + Clone + Send + Sync + 'static,
            Fut: Future<Output = Result<V::Output, HandlerError>> + Send + 'static,
            $($e: FromContext),+
        {
            #[allow(non_snake_case)]
            fn call(
                &self,
                args: V::Args,
                task: Task,
                cx: &mut Context,
            ) -> BoxFuture<Result<V::Output, HandlerError>> {
                $(let $e = match $e::from_context(cx) {
                    Ok(v) => v,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };)+
                Box::pin((self)(args, task, $($e),+))
            }

            fn check(extensions: &Extensions) -> Result<(), String> {
                $($e::check(extensions)?;)+
                Ok(())
            }
        }
    };
}

impl_task_handler!(E1);
impl_task_handler!(E1, E2);
impl_task_handler!(E1, E2, E3);

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

    /// For a task verb whose handler may run again after a restart: what
    /// runs task `task` of `submitter` (submitted with `req_id` and
    /// `args`) again, or (`fresh`) for the first time: a task whose
    /// handler never started may be started by any task verb. `None` for
    /// every other handler, and when the args no longer decode.
    fn resume(&self, args: &RawValue, origin: Origin, fresh: bool) -> Option<Start> {
        let _ = (args, origin, fresh);
        None
    }
}

pub(crate) use crate::dispatch::extract::Origin;

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
        Ok(self.handler.call_encoded(args, cx))
    }

    fn check(&self, extensions: &Extensions) -> Result<(), String> {
        H::check(extensions)
    }
}

/// A job that fails at once with `e`.
pub(crate) fn fail_now(e: HandlerError) -> BoxFuture<Result<RawValue, HandlerError>> {
    Box::pin(async move { Err(e) })
}

/// The sender a stream job's handler writes its items to.
///
/// # Errors
/// `internal` for a job that serves no stream (only stream jobs reach a
/// stream verb's handler).
pub(crate) fn stream_items<T: serde::Serialize>(
    cx: &mut Context,
) -> Result<Items<T>, HandlerError> {
    let served = cx.stream.take().ok_or_else(|| {
        HandlerError::new(ErrorCode::Internal, "a stream verb ran outside a stream")
    })?;
    Ok(Items::new(served, cx.deadline))
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
        let items = match stream_items(cx) {
            Ok(items) => items,
            Err(e) => return Ok(fail_now(e)),
        };
        let fut = self.handler.call(args, items, cx);
        Ok(Box::pin(
            async move { fut.await.map(|()| RawValue::null()) },
        ))
    }

    fn check(&self, extensions: &Extensions) -> Result<(), String> {
        H::check(extensions)
    }
}

/// A typed task handler `H` of verb `V`, erased. Starting it submits the
/// task (written before the answer) and answers its id; the handler runs
/// afterwards, on the task service.
pub(crate) struct TaskTyped<V: TaskVerb, M, H> {
    handler: H,
    /// Run again after a restart (else the task fails `interrupted`).
    resumable: bool,
    /// Refuses args before the task is written.
    check: Option<TaskArgsCheck<V>>,
    _marker: PhantomData<fn() -> (V, M)>,
}

/// A task verb's own check of its decoded args, run before the task is
/// written.
pub(crate) type TaskArgsCheck<V> =
    Arc<dyn Fn(&<V as VerbDef>::Args) -> Result<(), HandlerError> + Send + Sync>;

impl<V: TaskVerb, M, H> TaskTyped<V, M, H> {
    pub(crate) fn new(handler: H, resumable: bool, check: Option<TaskArgsCheck<V>>) -> Self {
        Self {
            handler,
            resumable,
            check,
            _marker: PhantomData,
        }
    }
}

impl<V, M, H> TaskTyped<V, M, H>
where
    V: TaskVerb,
    M: 'static,
    H: TaskHandler<V, M>,
{
    /// What runs the handler with `args`, once the task is written.
    fn starter(&self, args: V::Args, origin: Origin) -> Start {
        let handler = self.handler.clone();
        Box::new(move |task: Task| {
            let mut cx = Context::for_task(origin, task.token());
            let fut = handler.call(args, task, &mut cx);
            Box::pin(async move {
                let out = fut.await.map_err(HandlerError::into_body)?;
                crate::tasks::task::encode_result(&out)
            })
        })
    }
}

impl<V, M, H> ErasedHandler for TaskTyped<V, M, H>
where
    V: TaskVerb,
    M: 'static,
    H: TaskHandler<V, M>,
{
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        // Args that do not decode, or that the verb's own check refuses,
        // are refused before a task exists.
        let decoded: V::Args = args.decode()?;
        if let Some(Err(e)) = self.check.as_ref().map(|check| check(&decoded)) {
            return Ok(fail_now(e));
        }
        Ok(submit_task(cx, V::CAP, V::VERB, args, |origin| {
            self.starter(decoded, origin)
        }))
    }

    fn check(&self, extensions: &Extensions) -> Result<(), String> {
        H::check(extensions)
    }

    fn resume(&self, args: &RawValue, origin: Origin, fresh: bool) -> Option<Start> {
        if !(self.resumable || fresh) {
            return None;
        }
        let decoded: V::Args = args.decode().ok()?;
        Some(self.starter(decoded, origin))
    }
}

/// Submits a task of `cap`/`verb` with `args` to the node's task service,
/// its handler made by `starter` from where the task came from; the
/// returned future resolves to the submit's answer (the task's id).
pub(crate) fn submit_task(
    cx: &mut Context,
    cap: impl Into<String>,
    verb: impl Into<String>,
    args: &RawValue,
    starter: impl FnOnce(Origin) -> Start,
) -> BoxFuture<Result<RawValue, HandlerError>> {
    let Some(Tasks(service)) = cx.runtime::<Tasks>() else {
        return fail_now(HandlerError::new(
            ErrorCode::Internal,
            "the task service is not installed",
        ));
    };
    let start = starter(Origin {
        submitter: cx.sender,
        req_id: cx.req_id.clone(),
        extensions: cx.extensions.clone(),
        channel: cx.channel,
    });
    let bytes = args.as_bytes().to_vec();
    let (sender, req_id) = (cx.sender, cx.req_id.as_str().to_owned());
    let (cap, verb) = (cap.into(), verb.into());
    let authority = cx.authority.clone();
    // The task belongs to the submit's trace: its server span's context
    // (or the caller's, as it came), kept with the task.
    let trace = crate::trace::current();
    Box::pin(async move {
        let submitted = service
            .submit(sender, req_id, &cap, &verb, bytes, start, authority, trace)
            .await?;
        RawValue::encode(&submitted).map_err(|e| {
            HandlerError::new(
                ErrorCode::Internal,
                format!("the answer could not be encoded: {e}"),
            )
        })
    })
}
