//! [`NodeBuilder`] and [`Capability`]: what a node is made of, checked when
//! it starts.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use capwire_authz::Authorizer;
use capwire_envelope::{NodeId, RawValue};
use capwire_manifest::{VerbKind, VerbSpec, Version};
use capwire_transport::{ContactPolicy, Keypair, TransportConfig};

use crate::addr::Addr;
use crate::clock::WallClock;
use crate::config::Limits;
use crate::contact::Contact;
use crate::dispatch::extract::Extensions;
use crate::dispatch::handler::{
    Handler, RouteEntry, RouteHandler, StreamHandler, StreamTyped, TaskArgsCheck, TaskHandler,
    TaskTyped, Typed,
};
use crate::dispatch::raw::{ArgsCheck, Raw, RawStream, RawTask, RawVerb};
use crate::error::NodeError;
use crate::host::Host;
use crate::node::runtime::Parts;

/// An `app.*` capability with its typed handlers, ready to be added to a
/// [`NodeBuilder`].
///
/// ```
/// use capwire::{Capability, HandlerError};
/// use capwire::manifest::verb;
///
/// verb! { pub struct Say: request "app.echo" / "say", Bootstrap, String => String; }
///
/// async fn say(text: String) -> Result<String, HandlerError> { Ok(text) }
///
/// let cap = Capability::new("app.echo", "1.0.0").unwrap().handle(Say, say);
/// assert_eq!(cap.id(), "app.echo");
/// ```
pub struct Capability {
    pub(crate) inner: capwire_manifest::Capability<RouteHandler>,
    /// The audit log keeps its calls' args, not only their digest.
    pub(crate) audit_args: bool,
}

impl std::fmt::Debug for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capability")
            .field("id", &self.inner.id())
            .finish_non_exhaustive()
    }
}

impl Capability {
    /// A capability with a semver version and no verbs yet.
    ///
    /// # Errors
    /// When `version` is not a semver version. The id is checked when the
    /// node is built.
    pub fn new(id: &str, version: &str) -> Result<Self, NodeError> {
        let version = Version::parse(version)
            .map_err(|e| NodeError::Config(format!("capability {id}: bad version: {e}")))?;
        Ok(Self {
            inner: capwire_manifest::Capability::new(id, version),
            audit_args: false,
        })
    }

    /// The capability id as given.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// Keeps the args of this capability's calls in the node's audit log
    /// (WIRE.md 5.6: the entry's `args`), not only their BLAKE2s digest.
    /// Off by default: args may hold what the log should not keep, and
    /// they make the log grow by their size.
    ///
    /// ```
    /// let cap = capwire::Capability::new("app.ledger", "1.0.0")
    ///     .unwrap()
    ///     .audit_args(true);
    /// # let _ = cap;
    /// ```
    pub fn audit_args(mut self, keep: bool) -> Self {
        self.audit_args = keep;
        self
    }

    /// Describes the capability's configuration (opaque text).
    pub fn params(mut self, params: impl Into<String>) -> Self {
        self.inner = self.inner.params(params);
        self
    }

    /// Adds verb `V`, handled by `handler`: an async fn taking `V::Args` and
    /// up to three extractors ([`Sender`](crate::Sender),
    /// [`Meta`](crate::Meta), [`State`](crate::State),
    /// [`NodeHandle`](crate::NodeHandle)).
    pub fn handle<V, M, H>(mut self, _verb: V, handler: H) -> Self
    where
        V: capwire_manifest::UnaryVerb,
        M: Send + Sync + 'static,
        H: Handler<V, M>,
    {
        let route: RouteHandler = Arc::new(RouteEntry::new(Typed::<V, M, H>::new(handler)));
        self.inner = self.inner.verb::<V>(route);
        self
    }

    /// Adds a verb declared at run time, handled by `handler`: an async fn
    /// taking the args as raw CBOR, the caller's [`Sender`](crate::Sender)
    /// and the request's [`Meta`](crate::Meta), returning the result as
    /// raw CBOR (a notification's result is dropped). For bindings and
    /// bridges whose verbs have no Rust type; the chokepoint, deadlines,
    /// cancellation and the replay ledger treat it as any other verb. The
    /// handler checks the args itself: a mismatch should be answered
    /// `bad_args`.
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Meta, RawVerb, Sender};
    /// use capwire::envelope::{ErrorCode, RawValue};
    /// use capwire::manifest::DeclaredClass;
    ///
    /// async fn shout(args: RawValue, _: Sender, _: Meta) -> Result<RawValue, HandlerError> {
    ///     let text: String = args
    ///         .decode()
    ///         .map_err(|e| HandlerError::new(ErrorCode::BadArgs, e.to_string()))?;
    ///     RawValue::encode(&text.to_uppercase())
    ///         .map_err(|e| HandlerError::new(ErrorCode::Internal, e.to_string()))
    /// }
    ///
    /// let cap = Capability::new("app.loud", "1.0.0")
    ///     .unwrap()
    ///     .handle_raw(RawVerb::request("shout", DeclaredClass::Bootstrap), shout);
    /// # let _ = cap;
    /// ```
    pub fn handle_raw<F, Fut>(self, verb: RawVerb, handler: F) -> Self
    where
        F: Fn(RawValue, crate::Sender, crate::Meta) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RawValue, crate::HandlerError>> + Send + 'static,
    {
        let notification = verb.kind == VerbKind::Notification;
        let unary = matches!(verb.kind, VerbKind::Request | VerbKind::Notification);
        let route = unary.then(|| {
            let route: RouteHandler = Arc::new(RouteEntry::new(Raw::new(handler, notification)));
            route
        });
        self.add_raw(verb, route)
    }

    /// Adds a stream verb declared at run time ([`RawVerb::stream`]),
    /// served by `handler`: an async fn taking the args as raw CBOR, the
    /// [`Items`](crate::Items) sender it writes raw CBOR items to, the
    /// caller's [`Sender`](crate::Sender) and the request's
    /// [`Meta`](crate::Meta); the stream ends when it returns. A request or
    /// notification `RawVerb` given here (or a stream one given to
    /// [`Capability::handle_raw`]) has no handler, and the node refuses to
    /// start.
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Items, Meta, RawVerb, Sender};
    /// use capwire::envelope::RawValue;
    /// use capwire::manifest::DeclaredClass;
    ///
    /// async fn count(
    ///     _: RawValue,
    ///     mut items: Items<RawValue>,
    ///     _: Sender,
    ///     _: Meta,
    /// ) -> Result<(), HandlerError> {
    ///     for n in 0..3u32 {
    ///         items.send(RawValue::encode(&n).unwrap()).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// let cap = Capability::new("app.count", "1.0.0")
    ///     .unwrap()
    ///     .handle_raw_stream(RawVerb::stream("up", DeclaredClass::Bootstrap), count);
    /// # let _ = cap;
    /// ```
    pub fn handle_raw_stream<F, Fut>(self, verb: RawVerb, handler: F) -> Self
    where
        F: Fn(RawValue, crate::Items<RawValue>, crate::Sender, crate::Meta) -> Fut
            + Send
            + Sync
            + 'static,
        Fut: Future<Output = Result<(), crate::HandlerError>> + Send + 'static,
    {
        let route = (verb.kind == VerbKind::Stream).then(|| {
            let route: RouteHandler = Arc::new(RouteEntry::new(RawStream::new(handler)));
            route
        });
        self.add_raw(verb, route)
    }

    /// Adds a task verb declared at run time ([`RawVerb::task`]), run by
    /// `handler`: an async fn taking the args as raw CBOR, the
    /// [`Task`](crate::Task) it reports progress and asks questions
    /// through, the submitter's [`Sender`](crate::Sender) and the submit's
    /// [`Meta`](crate::Meta), returning the result as raw CBOR (see
    /// [`Capability::task`]). With `resumable`, a task that had not ended
    /// when the node stopped runs again when it starts (see
    /// [`Capability::resumable_task`]). A `RawVerb` of another kind has no
    /// handler here, and the node refuses to start.
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Meta, RawVerb, Sender, Task};
    /// use capwire::envelope::{ErrorCode, RawValue};
    /// use capwire::manifest::DeclaredClass;
    ///
    /// async fn count(args: RawValue, task: Task, _: Sender, _: Meta) -> Result<RawValue, HandlerError> {
    ///     let upto: u32 = args
    ///         .decode()
    ///         .map_err(|e| HandlerError::new(ErrorCode::BadArgs, e.to_string()))?;
    ///     for n in 0..upto {
    ///         task.progress(&n).await?;
    ///     }
    ///     Ok(RawValue::encode(&upto).unwrap())
    /// }
    ///
    /// let cap = Capability::new("app.count", "1.0.0")
    ///     .unwrap()
    ///     .handle_raw_task(RawVerb::task("upto", DeclaredClass::Bootstrap), false, count);
    /// # let _ = cap;
    /// ```
    pub fn handle_raw_task<F, Fut>(self, verb: RawVerb, resumable: bool, handler: F) -> Self
    where
        F: Fn(RawValue, crate::Task, crate::Sender, crate::Meta) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RawValue, crate::HandlerError>> + Send + 'static,
    {
        self.add_raw_task(verb, resumable, None, handler)
    }

    /// As [`Capability::handle_raw_task`], with `check` run on the args
    /// (and the submitter's [`Sender`](crate::Sender) and the submit's
    /// [`Meta`](crate::Meta)) before the task is written: an error it
    /// returns (`bad_args`, say) answers the submit, and no task exists.
    /// The check is run again for a submit sent again.
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Meta, RawVerb, Sender, Task};
    /// use capwire::envelope::{ErrorCode, RawValue};
    /// use capwire::manifest::DeclaredClass;
    ///
    /// async fn is_number(args: RawValue, _: Sender, _: Meta) -> Result<(), HandlerError> {
    ///     args.decode::<u32>()
    ///         .map(drop)
    ///         .map_err(|e| HandlerError::new(ErrorCode::BadArgs, e.to_string()))
    /// }
    /// async fn run(args: RawValue, _: Task, _: Sender, _: Meta) -> Result<RawValue, HandlerError> {
    ///     Ok(args)
    /// }
    ///
    /// let cap = Capability::new("app.count", "1.0.0").unwrap().handle_raw_task_checked(
    ///     RawVerb::task("upto", DeclaredClass::Bootstrap),
    ///     false,
    ///     is_number,
    ///     run,
    /// );
    /// # let _ = cap;
    /// ```
    pub fn handle_raw_task_checked<C, CFut, F, Fut>(
        self,
        verb: RawVerb,
        resumable: bool,
        check: C,
        handler: F,
    ) -> Self
    where
        C: Fn(RawValue, crate::Sender, crate::Meta) -> CFut + Send + Sync + 'static,
        CFut: Future<Output = Result<(), crate::HandlerError>> + Send + 'static,
        F: Fn(RawValue, crate::Task, crate::Sender, crate::Meta) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RawValue, crate::HandlerError>> + Send + 'static,
    {
        let check: ArgsCheck = Arc::new(move |args, sender, meta| {
            let fut = check(args, sender, meta);
            Box::pin(fut)
        });
        self.add_raw_task(verb, resumable, Some(check), handler)
    }

    fn add_raw_task<F, Fut>(
        self,
        verb: RawVerb,
        resumable: bool,
        check: Option<ArgsCheck>,
        handler: F,
    ) -> Self
    where
        F: Fn(RawValue, crate::Task, crate::Sender, crate::Meta) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RawValue, crate::HandlerError>> + Send + 'static,
    {
        let route = (verb.kind == VerbKind::Task).then(|| {
            let (cap, name) = (self.id().to_owned(), verb.name.clone());
            let task = RawTask::new(handler, cap, name, resumable, check);
            // Durable: a repeated submit finds its task in the task table.
            let route: RouteHandler = Arc::new(RouteEntry::durable(task));
            route
        });
        self.add_raw(verb, route)
    }

    /// Declares `verb`, with `route` as its handler when it has one.
    fn add_raw(mut self, verb: RawVerb, route: Option<RouteHandler>) -> Self {
        let mut spec = match verb.kind {
            VerbKind::Notification => VerbSpec::notification(verb.name),
            VerbKind::Stream => VerbSpec::stream(verb.name),
            VerbKind::Task => VerbSpec::task(verb.name),
            VerbKind::Request => VerbSpec::request(verb.name),
        }
        .class(verb.class);
        if let Some(route) = route {
            spec = spec.handler(route);
        }
        if let Some(schema) = &verb.args_schema {
            spec = spec.args_schema(schema);
        }
        if let Some(schema) = &verb.result_schema {
            spec = spec.result_schema(schema);
        }
        self.inner = self.inner.verb_spec(spec);
        self
    }

    /// Adds stream verb `V`, served by `handler`: an async fn taking
    /// `V::Args`, the [`Items`](crate::Items) sender it writes the stream's
    /// items to, and up to three extractors, returning `Result<(),
    /// HandlerError>` when the stream ends (see [`crate::stream`]).
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Items};
    /// use capwire::manifest::verb;
    ///
    /// verb! { pub struct Words: stream "app.words" / "split", Bootstrap, String => String; }
    ///
    /// async fn split(text: String, mut items: Items<String>) -> Result<(), HandlerError> {
    ///     for word in text.split_whitespace() {
    ///         items.send(word.to_owned()).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// let cap = Capability::new("app.words", "1.0.0").unwrap().stream(Words, split);
    /// # let _ = cap;
    /// ```
    ///
    /// A request handler is refused for a stream verb, and a stream handler
    /// for a request verb, at compile time:
    ///
    /// ```compile_fail
    /// use capwire::{Capability, HandlerError};
    /// use capwire::manifest::verb;
    /// verb! { pub struct Words: stream "app.words" / "split", Bootstrap, String => String; }
    /// async fn once(text: String) -> Result<String, HandlerError> { Ok(text) }
    /// let _ = Capability::new("app.words", "1.0.0").unwrap().handle(Words, once);
    /// ```
    pub fn stream<V, M, H>(mut self, _verb: V, handler: H) -> Self
    where
        V: capwire_manifest::StreamVerb,
        M: Send + Sync + 'static,
        H: StreamHandler<V, M>,
    {
        let route: RouteHandler = Arc::new(RouteEntry::new(StreamTyped::<V, M, H>::new(handler)));
        self.inner = self.inner.verb::<V>(route);
        self
    }

    /// Adds task verb `V`, run by `handler`: an async fn taking `V::Args`,
    /// the [`Task`](crate::Task) it reports progress and asks questions
    /// through, and up to three extractors, returning `Result<V::Output,
    /// HandlerError>`: its result completes the task, its error fails it
    /// (see [`crate::task`]). Submitting `V` answers the task's id at once;
    /// the handler runs afterwards, on the node, whatever becomes of the
    /// session that submitted it.
    ///
    /// When the node stops while the task runs, the handler is dropped and
    /// the task fails with the code `interrupted` when the node starts
    /// again; [`Capability::resumable_task`] runs it again instead.
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Task};
    /// use capwire::manifest::verb;
    ///
    /// verb! { pub struct Sum: task "app.math" / "sum", Bootstrap, Vec<u64> => u64; }
    ///
    /// async fn sum(numbers: Vec<u64>, task: Task) -> Result<u64, HandlerError> {
    ///     let mut total = 0;
    ///     for (i, n) in numbers.iter().enumerate() {
    ///         total += n;
    ///         task.progress(&i).await?;
    ///     }
    ///     Ok(total)
    /// }
    ///
    /// let cap = Capability::new("app.math", "1.0.0").unwrap().task(Sum, sum);
    /// # let _ = cap;
    /// ```
    pub fn task<V, M, H>(self, verb: V, handler: H) -> Self
    where
        V: capwire_manifest::TaskVerb,
        M: Send + Sync + 'static,
        H: TaskHandler<V, M>,
    {
        self.add_task(verb, handler, false, None)
    }

    /// As [`Capability::task`], but a task that had not ended when the
    /// node stopped is run again when it starts: `handler` is called with
    /// the task's args and a [`Task`](crate::Task) whose
    /// [`resumed`](crate::Task::resumed) is `true`, whose events so far
    /// ([`Task::events`](crate::Task::events)) say how far it got. For
    /// handlers that can pick their work up from what they reported.
    pub fn resumable_task<V, M, H>(self, verb: V, handler: H) -> Self
    where
        V: capwire_manifest::TaskVerb,
        M: Send + Sync + 'static,
        H: TaskHandler<V, M>,
    {
        self.add_task(verb, handler, true, None)
    }

    /// As [`Capability::task`], with `check` run on the decoded args before
    /// the task is written: the bounds of the verb's own that its type
    /// cannot say. An error it returns (`bad_args`, say) answers the
    /// submit, and no task exists. A submit sent again is checked again
    /// (and then finds its task).
    ///
    /// ```
    /// use capwire::{Capability, HandlerError, Task};
    /// use capwire::envelope::ErrorCode;
    /// use capwire::manifest::verb;
    ///
    /// verb! { pub struct Count: task "app.count" / "upto", Bootstrap, u32 => u32; }
    ///
    /// fn at_most_a_thousand(upto: &u32) -> Result<(), HandlerError> {
    ///     if *upto > 1000 {
    ///         return Err(HandlerError::new(ErrorCode::BadArgs, "at most 1000"));
    ///     }
    ///     Ok(())
    /// }
    ///
    /// async fn count(upto: u32, task: Task) -> Result<u32, HandlerError> {
    ///     for n in 1..=upto {
    ///         task.progress(&n).await?;
    ///     }
    ///     Ok(upto)
    /// }
    ///
    /// let cap = Capability::new("app.count", "1.0.0")
    ///     .unwrap()
    ///     .task_checked(Count, at_most_a_thousand, count);
    /// # let _ = cap;
    /// ```
    pub fn task_checked<V, M, H, C>(self, verb: V, check: C, handler: H) -> Self
    where
        V: capwire_manifest::TaskVerb,
        M: Send + Sync + 'static,
        H: TaskHandler<V, M>,
        C: Fn(&V::Args) -> Result<(), crate::HandlerError> + Send + Sync + 'static,
    {
        self.add_task(verb, handler, false, Some(Arc::new(check)))
    }

    /// [`Capability::resumable_task`] with the args check of
    /// [`Capability::task_checked`].
    pub fn resumable_task_checked<V, M, H, C>(self, verb: V, check: C, handler: H) -> Self
    where
        V: capwire_manifest::TaskVerb,
        M: Send + Sync + 'static,
        H: TaskHandler<V, M>,
        C: Fn(&V::Args) -> Result<(), crate::HandlerError> + Send + Sync + 'static,
    {
        self.add_task(verb, handler, true, Some(Arc::new(check)))
    }

    fn add_task<V, M, H>(
        mut self,
        _verb: V,
        handler: H,
        resumable: bool,
        check: Option<TaskArgsCheck<V>>,
    ) -> Self
    where
        V: capwire_manifest::TaskVerb,
        M: Send + Sync + 'static,
        H: TaskHandler<V, M>,
    {
        // Durable: a repeated submit finds its task by (sender, req_id) in
        // the task table, so the ledger keeps no answer of the runtime's.
        let route: RouteHandler = Arc::new(RouteEntry::durable(TaskTyped::<V, M, H>::new(
            handler, resumable, check,
        )));
        self.inner = self.inner.verb::<V>(route);
        self
    }
}

/// Builds a [`Node`](crate::Node).
///
/// ```no_run
/// # async fn demo() -> Result<(), capwire::NodeError> {
/// use capwire::Node;
/// let node = Node::builder("my-app").listen("127.0.0.1:0".parse()?).start().await?;
/// println!("{} listening on {:?}", node.id(), node.local_addrs());
/// node.shutdown().await;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    pub(crate) app_id: String,
    pub(crate) name: Option<String>,
    pub(crate) description: String,
    pub(crate) keypair: Option<Keypair>,
    pub(crate) listen: Vec<Addr>,
    pub(crate) contacts: Vec<Contact>,
    pub(crate) policy: ContactPolicy,
    pub(crate) caps: Vec<Capability>,
    pub(crate) limits: Limits,
    pub(crate) transport: TransportConfig,
    pub(crate) extensions: Extensions,
    pub(crate) authorizer: Option<Arc<dyn Authorizer>>,
    pub(crate) controller: Option<NodeId>,
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) host: Option<Arc<dyn Host>>,
    pub(crate) wall_clock: Option<Arc<dyn WallClock>>,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("app_id", &self.app_id)
            .field("listen", &self.listen)
            .field("contacts", &self.contacts)
            .finish_non_exhaustive()
    }
}

impl NodeBuilder {
    pub(crate) fn new(app_id: String) -> Self {
        Self {
            app_id,
            name: None,
            description: String::new(),
            keypair: None,
            listen: Vec::new(),
            contacts: Vec::new(),
            policy: ContactPolicy::AcceptAny,
            caps: Vec::new(),
            limits: Limits::default(),
            transport: TransportConfig::default(),
            extensions: Extensions::default(),
            authorizer: None,
            controller: None,
            state_dir: None,
            host: None,
            wall_clock: None,
        }
    }

    /// Uses this identity (default: a fresh random keypair).
    pub fn keypair(mut self, keypair: Keypair) -> Self {
        self.keypair = Some(keypair);
        self
    }

    /// A human-readable name (default: the app id).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A human-readable description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Listens on this address (TCP or Unix); may be called several times.
    pub fn listen(mut self, addr: Addr) -> Self {
        self.listen.push(addr);
        self
    }

    /// Adds a contact to keep a session with.
    pub fn contact(mut self, contact: Contact) -> Self {
        self.contacts.push(contact);
        self
    }

    /// Who may finish a handshake with this node (default: anyone but itself).
    pub fn contact_policy(mut self, policy: ContactPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Adds a capability with its handlers.
    pub fn capability(mut self, cap: Capability) -> Self {
        self.caps.push(cap);
        self
    }

    /// Replaces the runtime limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Replaces the transport settings.
    pub fn transport_config(mut self, config: TransportConfig) -> Self {
        self.transport = config;
        self
    }

    /// Makes `value` available to handlers through [`State<T>`](crate::State).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert_app(value);
        self
    }

    /// Replaces the authorizer of controller verbs (default: the sender
    /// must be the bound control plane). It is consulted only for
    /// controller verbs and only for the bound control plane; if it errors
    /// or panics the envelope is denied.
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// Starts bound to this control plane, unless the state directory
    /// already holds a binding (which then wins).
    pub fn bound_to(mut self, controller: NodeId) -> Self {
        self.controller = Some(controller);
        self
    }

    /// Keeps the node's state in `dir`: its identity, contacts, binding,
    /// configuration, cluster roster and the answers of state-changing
    /// control requests, so that it comes back as itself after a restart.
    /// A missing directory is created (owner-only). A directory another
    /// node has open, or holding a damaged or foreign store, makes
    /// [`start`](Self::start) fail with [`StoreError`](crate::StoreError);
    /// nothing is replaced. Without a state directory the node keeps its
    /// state in memory.
    ///
    /// With [`keypair`](Self::keypair) as well, the key must be the one the
    /// directory holds (or the directory is new).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Runs the node's children (`core.cluster`) with `host`. Default: an
    /// [`InProcessHost`](crate::host::InProcessHost) of bare nodes, keeping
    /// their state under `STATE_DIR/children` when the node has a state
    /// directory.
    pub fn host(mut self, host: impl Host) -> Self {
        self.host = Some(Arc::new(host));
        self
    }

    /// Reads dates (for grant tokens' expiry) from `clock` instead of the
    /// system's clock, through a floor: the node never takes a date
    /// earlier than one it already read ([`crate::clock`]). The node's
    /// own tokens ([`Node::grant`](crate::Node::grant)) are dated by it
    /// too.
    pub fn wall_clock(mut self, clock: Arc<dyn WallClock>) -> Self {
        self.wall_clock = Some(clock);
        self
    }

    /// What the node is built from, and where it listens and whom it dials.
    pub(crate) fn into_parts(self) -> (Parts, Vec<Addr>, Vec<Contact>) {
        let parts = Parts {
            app_id: self.app_id,
            name: self.name,
            description: self.description,
            keypair: self.keypair,
            policy: self.policy,
            audit_args: self
                .caps
                .iter()
                .filter(|c| c.audit_args)
                .map(|c| c.id().to_owned())
                .collect(),
            caps: self.caps.into_iter().map(|c| c.inner).collect(),
            limits: self.limits,
            transport: self.transport,
            extensions: self.extensions,
            authorizer: self.authorizer,
            controller: self.controller,
            state_dir: self.state_dir,
            host: self.host,
            wall_clock: self.wall_clock,
        };
        (parts, self.listen, self.contacts)
    }
}
