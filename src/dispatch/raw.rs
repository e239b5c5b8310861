//! Verbs declared at run time: a name, a kind, an auth class and JSON
//! Schemas given as values, served by a handler that takes and returns raw
//! CBOR. For bindings to other languages and for bridges, whose verbs have
//! no Rust type; everything else about them (the chokepoint, the replay
//! ledger, deadlines, cancellation, bounds) is what a typed verb gets.

use std::future::Future;
use std::sync::Arc;

use capwire_envelope::{DecodeError, RawValue};
use capwire_manifest::{DeclaredClass, VerbKind};

use crate::dispatch::extract::{Context, Extensions, FromContext, Meta, Sender};
use crate::dispatch::handler::{
    BoxFuture, ErasedHandler, HandlerError, Origin, fail_now, stream_items, submit_task,
};
use crate::dispatch::items::Items;
use crate::tasks::Start;
use crate::tasks::task::Task;

/// A request or notification verb without a Rust type, for
/// [`Capability::handle_raw`](crate::Capability::handle_raw).
///
/// ```
/// use capwire::RawVerb;
/// use capwire::manifest::DeclaredClass;
///
/// let verb = RawVerb::request("greet", DeclaredClass::Bootstrap)
///     .args_schema(&serde_json::json!({"type": "string"}))
///     .result_schema(&serde_json::json!({"type": "string"}));
/// assert_eq!(verb.name(), "greet");
/// ```
#[derive(Debug, Clone)]
pub struct RawVerb {
    pub(crate) name: String,
    pub(crate) kind: VerbKind,
    pub(crate) class: DeclaredClass,
    pub(crate) args_schema: Option<serde_json::Value>,
    pub(crate) result_schema: Option<serde_json::Value>,
}

impl RawVerb {
    fn new(name: impl Into<String>, kind: VerbKind, class: DeclaredClass) -> Self {
        Self {
            name: name.into(),
            kind,
            class,
            args_schema: None,
            result_schema: None,
        }
    }

    /// A request verb: answered by exactly one response, the handler's
    /// result.
    pub fn request(name: impl Into<String>, class: DeclaredClass) -> Self {
        Self::new(name, VerbKind::Request, class)
    }

    /// A notification verb: never answered (the handler's result is
    /// dropped; declare no result schema).
    pub fn notification(name: impl Into<String>, class: DeclaredClass) -> Self {
        Self::new(name, VerbKind::Notification, class)
    }

    /// A stream verb (protocol 2): items, then one response; for
    /// [`Capability::handle_raw_stream`](crate::Capability::handle_raw_stream).
    /// Its result schema is its items' schema.
    pub fn stream(name: impl Into<String>, class: DeclaredClass) -> Self {
        Self::new(name, VerbKind::Stream, class)
    }

    /// A task verb (protocol 2): submitting it answers the task's id at
    /// once and the handler runs afterwards, on the node; for
    /// [`Capability::handle_raw_task`](crate::Capability::handle_raw_task).
    /// Its result schema is the task's result's.
    pub fn task(name: impl Into<String>, class: DeclaredClass) -> Self {
        Self::new(name, VerbKind::Task, class)
    }

    /// The JSON Schema of the args, shown in the manifest. The runtime
    /// does not check args against it: the handler does (answering
    /// [`ErrorCode::BadArgs`](crate::envelope::ErrorCode::BadArgs)).
    pub fn args_schema(mut self, schema: &serde_json::Value) -> Self {
        self.args_schema = Some(schema.clone());
        self
    }

    /// The JSON Schema of the result (a stream's: of its items), shown in
    /// the manifest. A notification with one is refused when the node is
    /// built.
    pub fn result_schema(mut self, schema: &serde_json::Value) -> Self {
        self.result_schema = Some(schema.clone());
        self
    }

    /// The verb's name as given (checked when the node is built).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The extractors a raw handler is given.
fn extract(cx: &mut Context) -> Result<(Sender, Meta), HandlerError> {
    Ok((Sender::from_context(cx)?, Meta::from_context(cx)?))
}

/// A raw handler, erased: its args stay CBOR.
pub(crate) struct Raw<F> {
    handler: F,
    notification: bool,
}

impl<F> Raw<F> {
    pub(crate) fn new(handler: F, notification: bool) -> Self {
        Self {
            handler,
            notification,
        }
    }
}

impl<F, Fut> ErasedHandler for Raw<F>
where
    F: Fn(RawValue, Sender, Meta) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<RawValue, HandlerError>> + Send + 'static,
{
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let (sender, meta) = match extract(cx) {
            Ok(both) => both,
            Err(e) => return Ok(fail_now(e)),
        };
        let fut = (self.handler)(args.clone(), sender, meta);
        let notification = self.notification;
        Ok(Box::pin(async move {
            let out = fut.await?;
            // Nobody is told a notification's outcome.
            Ok(if notification { RawValue::null() } else { out })
        }))
    }

    fn check(&self, _extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }
}

/// A raw stream handler, erased: its args and items stay CBOR.
pub(crate) struct RawStream<F> {
    handler: F,
}

impl<F> RawStream<F> {
    pub(crate) fn new(handler: F) -> Self {
        Self { handler }
    }
}

impl<F, Fut> ErasedHandler for RawStream<F>
where
    F: Fn(RawValue, Items<RawValue>, Sender, Meta) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let started = stream_items(cx).and_then(|items| Ok((items, extract(cx)?)));
        let (items, (sender, meta)) = match started {
            Ok(parts) => parts,
            Err(e) => return Ok(fail_now(e)),
        };
        let fut = (self.handler)(args.clone(), items, sender, meta);
        Ok(Box::pin(
            async move { fut.await.map(|()| RawValue::null()) },
        ))
    }

    fn check(&self, _extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }
}

/// A raw task handler, erased: its args and result stay CBOR.
pub(crate) struct RawTask<F> {
    handler: Arc<F>,
    cap: String,
    verb: String,
    resumable: bool,
    check: Option<ArgsCheck>,
}

/// A raw task verb's check of its args, run before the task exists.
pub(crate) type ArgsCheck =
    Arc<dyn Fn(RawValue, Sender, Meta) -> BoxFuture<Result<(), HandlerError>> + Send + Sync>;

impl<F> RawTask<F> {
    pub(crate) fn new(
        handler: F,
        cap: String,
        verb: String,
        resumable: bool,
        check: Option<ArgsCheck>,
    ) -> Self {
        Self {
            handler: Arc::new(handler),
            cap,
            verb,
            resumable,
            check,
        }
    }
}

impl<F, Fut> RawTask<F>
where
    F: Fn(RawValue, Task, Sender, Meta) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<RawValue, HandlerError>> + Send + 'static,
{
    /// What runs the handler with `args`, once the task is written.
    fn starter(&self, args: RawValue, origin: Origin) -> Start {
        let handler = Arc::clone(&self.handler);
        Box::new(move |task: Task| {
            let mut cx = Context::for_task(origin, task.token());
            let parts = extract(&mut cx);
            Box::pin(async move {
                let (sender, meta) = parts.map_err(HandlerError::into_body)?;
                handler(args, task, sender, meta)
                    .await
                    .map_err(HandlerError::into_body)
            })
        })
    }
}

impl<F, Fut> ErasedHandler for RawTask<F>
where
    F: Fn(RawValue, Task, Sender, Meta) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<RawValue, HandlerError>> + Send + 'static,
{
    fn start(
        &self,
        args: &RawValue,
        cx: &mut Context,
    ) -> Result<BoxFuture<Result<RawValue, HandlerError>>, DecodeError> {
        let check = match &self.check {
            Some(check) => match extract(cx) {
                Ok((sender, meta)) => Some(check(args.clone(), sender, meta)),
                Err(e) => return Ok(fail_now(e)),
            },
            None => None,
        };
        let submit = submit_task(cx, &self.cap, &self.verb, args, |origin| {
            self.starter(args.clone(), origin)
        });
        Ok(match check {
            // Args the check refuses are refused before a task exists.
            Some(check) => Box::pin(async move {
                check.await?;
                submit.await
            }),
            None => submit,
        })
    }

    fn check(&self, _extensions: &Extensions) -> Result<(), String> {
        Ok(())
    }

    fn resume(&self, args: &RawValue, origin: Origin, fresh: bool) -> Option<Start> {
        (self.resumable || fresh).then(|| self.starter(args.clone(), origin))
    }
}
