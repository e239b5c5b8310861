//! Dispatch of inbound control envelopes, in exactly this order:
//!
//! ```text
//! header ─► control_auth_class ─► authorizer gate ─► kind ─► ledger ─► bounds ─► args ─► handler
//!  (codec)    deny: unknown_verb     unauthorized     shape   duplicate  overloaded bad_args result
//!                                                              replay    cancelled          (runtime
//!                                                                                            encodes)
//! ```
//!
//! [`Dispatcher::admit`] makes the decision up to the bounds and hands out
//! a [`Job`]; [`job`] runs it (binding re-check, args decode, handler). The
//! permit that lets a handler run comes only from [`capwire_authz::decide`].
//! Nothing here does I/O: the session core calls `admit`, the connection
//! driver runs the job.

pub(crate) mod error;
pub(crate) mod extract;
pub(crate) mod handler;
pub(crate) mod items;
pub(crate) mod job;
pub(crate) mod metrics;
pub(crate) mod raw;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_authz::{
    Decision, Delegations, DenyReason, Gate, OwnedPermit, SharedBinding, Unauthorized, decide,
    decide_with,
};
use capwire_envelope::{ControlRef, ErrorBody, ErrorCode, NodeId, RawValue, ReqId};
use capwire_manifest::{DeclaredClass, Registry, VerbKind};

use crate::audit::{AuditLog, By, Entry, Kind};
use crate::authority::Authorities;
use crate::proto::ledger::{Check, Ledger, Partition};
use crate::proto::session::{Admission, Admit, Work};
use crate::tap::{Tap, Way};
use extract::Extensions;
use handler::RouteHandler;
use metrics::{Metrics, Outcome};

use crate::trace::{TraceContext, TraceCounters};

/// A request or notification the chokepoint allowed, ready to run.
pub(crate) struct Job {
    pub(crate) permit: OwnedPermit<RouteHandler>,
    pub(crate) req_id: ReqId,
    /// The args item, validated by the frame decoder.
    pub(crate) args: RawValue,
    /// When the handler's budget runs out.
    pub(crate) deadline: Instant,
    /// It serves a stream (a stream verb, on a version-2 session).
    pub(crate) stream: bool,
    /// The caller's trace context, when it sent a valid one on a session
    /// of protocol 3.
    pub(crate) trace: Option<TraceContext>,
}

impl Job {
    /// The route's index in the registry.
    pub(crate) fn route(&self) -> u32 {
        self.permit.handler().index()
    }

    pub(crate) fn is_request(&self) -> bool {
        !self.req_id.is_fire_and_forget()
    }

    /// The binding epoch a controller verb's answer belongs to.
    pub(crate) fn answer_epoch(&self) -> Option<u64> {
        (self.permit.class() == DeclaredClass::Controller).then(|| self.permit.binding_epoch())
    }
}

impl Work for Job {
    fn req_id(&self) -> &ReqId {
        &self.req_id
    }

    fn route(&self) -> u32 {
        Job::route(self)
    }

    fn answer_epoch(&self) -> Option<u64> {
        Job::answer_epoch(self)
    }

    fn weight(&self) -> usize {
        self.args.as_bytes().len() + 64
    }

    fn durable(&self) -> bool {
        self.permit.handler().is_durable()
    }

    fn is_stream(&self) -> bool {
        self.stream
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("cap", self.permit.info().cap())
            .field("verb", self.permit.info().verb())
            .field("req_id", &self.req_id)
            .finish_non_exhaustive()
    }
}

/// The chokepoint's consumer: the registry (never written after the node
/// is built, so read without a lock), the authorizer gate, the binding,
/// the replay ledger and the counters.
pub(crate) struct Dispatcher {
    registry: Arc<Registry<RouteHandler>>,
    gate: Gate,
    binding: Arc<SharedBinding>,
    ledger: Ledger,
    metrics: Metrics,
    extensions: Arc<Extensions>,
    max_handler_time: Duration,
    shutting_down: AtomicBool,
    /// Copies of inbound envelopes, for `core.monitoring`.
    tap: Arc<Tap>,
    /// The tokens presented to the node (`core.grants`).
    delegations: Arc<Delegations>,
    /// What running work holds its authority from.
    authorities: Arc<Authorities>,
    /// Where every decision is recorded.
    audit: Arc<AuditLog>,
    /// The trace contexts received and dropped.
    traces: TraceCounters,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("routes", &self.registry.len())
            .finish_non_exhaustive()
    }
}

fn deny_outcome(reason: &DenyReason) -> Outcome {
    match reason {
        DenyReason::Unauthorized { .. } => Outcome::Unauthorized,
        _ => Outcome::UnknownVerb,
    }
}

impl Dispatcher {
    /// A dispatcher over `registry`. Gives every route its index.
    ///
    /// # Errors
    /// A handler whose extractors cannot work with `extensions` (for
    /// example a `State<T>` the node was not given), in words.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        registry: Arc<Registry<RouteHandler>>,
        gate: Gate,
        binding: Arc<SharedBinding>,
        ledger: Ledger,
        extensions: Arc<Extensions>,
        max_handler_time: Duration,
        tap: Arc<Tap>,
        delegations: Arc<Delegations>,
        authorities: Arc<Authorities>,
        audit: Arc<AuditLog>,
    ) -> Result<Self, String> {
        for (i, route) in registry.routes().enumerate() {
            let entry = route.dangerous_handler();
            entry.set_index(u32::try_from(i).unwrap_or(u32::MAX));
            entry.handler().check(&extensions).map_err(|e| {
                format!(
                    "handler of {}/{}: {e}",
                    route.info().cap(),
                    route.info().verb()
                )
            })?;
        }
        Ok(Self {
            metrics: Metrics::for_registry(&registry),
            registry,
            gate,
            binding,
            ledger,
            extensions,
            max_handler_time,
            shutting_down: AtomicBool::new(false),
            tap,
            delegations,
            authorities,
            audit,
            traces: TraceCounters::default(),
        })
    }

    pub(crate) fn audit(&self) -> &Arc<AuditLog> {
        &self.audit
    }

    /// Records a decision the chokepoint answered itself (or dropped): no
    /// handler ran.
    /// Its server span, for a caller that sent its trace context, ends
    /// here too.
    #[allow(clippy::too_many_arguments)]
    fn record_answer(
        &self,
        sender: &NodeId,
        c: &ControlRef<'_>,
        trace: Option<&TraceContext>,
        class: &str,
        by: Option<&OwnedPermit<RouteHandler>>,
        outcome: &str,
    ) {
        crate::trace::denied_span(
            c.cap,
            c.verb,
            sender,
            c.req_id.as_str(),
            class,
            by.and_then(|p| p.grant()).map(|g| &**g),
            outcome,
            trace,
        );
        if !self.audit.is_on() {
            return;
        }
        let mut e = Entry::new(Kind::Call);
        e.peer = Some(sender);
        e.cap = Some(c.cap);
        e.verb = Some(c.verb);
        e.req = (!c.req_id.is_fire_and_forget()).then(|| c.req_id.as_str());
        e.args = Some(digest(c.args));
        e.args_kept = self.audit.keeps_args(c.cap).then_some(c.args);
        e.class = Some(class);
        e.outcome = Some(outcome);
        if let Some(p) = by {
            authority(p, &mut e);
        }
        self.audit.record(&e);
    }

    /// Records how an admitted job ended: its authority and its outcome
    /// (`ok` or the error code it was answered with).
    pub(crate) fn record_end(&self, sender: &NodeId, job: &Job, result: Result<(), &ErrorBody>) {
        if !self.audit.is_on() {
            return;
        }
        let info = job.permit.info();
        let mut e = Entry::new(Kind::Call);
        e.peer = Some(sender);
        e.cap = Some(info.cap().as_str());
        e.verb = Some(info.verb().as_str());
        e.req = job.is_request().then(|| job.req_id.as_str());
        e.args = Some(digest(job.args.as_bytes()));
        e.args_kept = self
            .audit
            .keeps_args(info.cap().as_str())
            .then(|| job.args.as_bytes());
        e.class = Some(job.permit.class().as_str());
        authority(&job.permit, &mut e);
        e.outcome = Some(match result {
            Ok(()) => "ok",
            Err(body) => body.code.as_str(),
        });
        self.audit.record(&e);
    }

    /// The trace contexts received and dropped.
    pub(crate) fn traces(&self) -> &TraceCounters {
        &self.traces
    }

    pub(crate) fn authorities(&self) -> &Arc<Authorities> {
        &self.authorities
    }

    pub(crate) fn binding(&self) -> &SharedBinding {
        &self.binding
    }

    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn extensions(&self) -> &Arc<Extensions> {
        &self.extensions
    }

    /// From now on, new requests are answered `cancelled`.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}

impl Admission for Dispatcher {
    type Job = Job;

    /// Decides what becomes of one inbound control envelope from `sender`
    /// (the channel's authenticated key). `record` is the received record
    /// `c` was decoded from; `part` is the sender's ledger partition;
    /// `room` says whether the session may start one more job now;
    /// `version` is the session's protocol version.
    fn admit(
        &self,
        part: &Partition,
        sender: &NodeId,
        c: &ControlRef<'_>,
        record: &Bytes,
        now: Instant,
        room: bool,
        version: u32,
    ) -> Admit<Job> {
        let notification = c.req_id.is_fire_and_forget();
        // The caller's trace context is judged first: a malformed one, or
        // one on an older session, is dropped and counted, and the call
        // goes on without it.
        let trace = self.traces.read(c.trace, version);
        // Nothing goes on unrecorded: with a log that cannot be written,
        // every envelope is refused.
        if self.audit.is_failed() {
            return if notification {
                Admit::Drop
            } else {
                Admit::Answer(ErrorBody::new(
                    ErrorCode::Unavailable,
                    "the node's audit log cannot be written",
                ))
            };
        }
        // A peer is not shown what exists from a later protocol than its
        // session's (stream and task verbs, `core.tasks`, `core.grants`
        // from 2, `core.audit` from 3): for it there is no such verb,
        // whoever it is, so this comes before the controller gate (which
        // would tell it the verb exists).
        if version < capwire_envelope::PROTOCOL_V3
            && let Some(route) = self.registry.lookup(c.cap, c.verb)
            && (route.info().kind().since() > version
                || capwire_manifest::capability_since(c.cap) > version)
        {
            self.tap.record(
                Way::In,
                sender,
                record,
                None,
                c.trace.is_none() || trace.is_some(),
            );
            self.metrics
                .count(route.dangerous_handler().index(), Outcome::WrongKind);
            let outcome = if notification {
                "dropped"
            } else {
                "unknown_verb"
            };
            self.record_answer(sender, c, trace.as_ref(), "deny", None, outcome);
            return if notification {
                Admit::Drop
            } else {
                Admit::Answer(ErrorBody::new(
                    ErrorCode::UnknownVerb,
                    "the capability has no verb with this exact name",
                ))
            };
        }
        let binding = self.binding.snapshot();
        let mut decision = decide(&self.registry, &self.gate, &binding, sender, c.cap, c.verb);
        // A controller verb from a sender that is not the control plane:
        // the tokens it presented, if any, are asked (and only then is the
        // clock read).
        if matches!(
            &decision,
            Decision::Denied(DenyReason::Unauthorized {
                why: Unauthorized::NotController
            })
        ) && self.delegations.holders() > 0
        {
            decision = decide_with(
                &self.registry,
                &self.gate,
                &binding,
                sender,
                c.cap,
                c.verb,
                Some((&self.delegations, self.authorities.now())),
            );
        }
        let grant = match &decision {
            Decision::Allowed(p) => p.grant().cloned(),
            Decision::Denied(_) => None,
        };
        match &decision {
            Decision::Allowed(_) if grant.is_some() => self.delegations.count_call(),
            Decision::Denied(DenyReason::Unauthorized {
                why: Unauthorized::Grant(g),
            }) => self.delegations.count_refused(g),
            _ => {}
        }
        self.tap.record(
            Way::In,
            sender,
            record,
            grant,
            c.trace.is_none() || trace.is_some(),
        );
        let permit = match decision.into_result() {
            Ok(p) => p.into_owned(),
            Err(reason) => {
                let outcome = deny_outcome(&reason);
                match self.registry.lookup(c.cap, c.verb) {
                    Some(route) => self
                        .metrics
                        .count(route.dangerous_handler().index(), outcome),
                    None => self.metrics.count_unknown(),
                }
                tracing::debug!(
                    peer = %sender, cap = c.cap, verb = c.verb, req_id = c.req_id.as_str(),
                    decision = outcome.as_str(), reason = reason.label(), "envelope denied"
                );
                let class = match &reason {
                    DenyReason::Unauthorized { .. } => "controller",
                    _ => "deny",
                };
                let body = reason.error_body();
                let said = if notification {
                    "dropped"
                } else {
                    body.code.as_str()
                };
                self.record_answer(sender, c, trace.as_ref(), class, None, said);
                return if notification {
                    Admit::Drop
                } else {
                    Admit::Answer(body)
                };
            }
        };
        let route = permit.handler().index();
        let kind = permit.info().kind();
        match (kind, notification) {
            (VerbKind::Request | VerbKind::Stream | VerbKind::Task, true) => {
                // No req_id to answer on; refused and counted.
                self.metrics.count(route, Outcome::WrongKind);
                tracing::debug!(peer = %sender, cap = c.cap, verb = c.verb,
                    "request verb sent as a notification: dropped");
                self.record_answer(
                    sender,
                    c,
                    trace.as_ref(),
                    permit.class().as_str(),
                    Some(&permit),
                    "dropped",
                );
                return Admit::Drop;
            }
            (VerbKind::Notification, false) => {
                self.metrics.count(route, Outcome::WrongKind);
                let class = permit.class().as_str();
                self.record_answer(
                    sender,
                    c,
                    trace.as_ref(),
                    class,
                    Some(&permit),
                    "unknown_verb",
                );
                return Admit::Answer(ErrorBody::new(
                    ErrorCode::UnknownVerb,
                    "this verb is a notification and takes no req_id",
                ));
            }
            _ => {}
        }
        let stream = kind == VerbKind::Stream;
        let args = RawValue::dangerous_from_validated(record.slice_ref(c.args));
        if notification {
            if self.is_shutting_down() {
                self.metrics.count(route, Outcome::Cancelled);
                self.record_answer(
                    sender,
                    c,
                    trace.as_ref(),
                    permit.class().as_str(),
                    Some(&permit),
                    "dropped",
                );
                return Admit::Drop;
            }
            return Admit::Run(Job {
                permit,
                req_id: ReqId::EMPTY,
                args,
                deadline: deadline(now, None, self.max_handler_time),
                stream: false,
                trace,
            });
        }

        // The ledger answers repeats and duplicates whatever the bounds; a
        // new request that may run is recorded as running in the same step.
        let shutting_down = self.is_shutting_down();
        let begin = !shutting_down && room && c.budget_ms != Some(0);
        let mut ledger = part
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A task submit whose answer the ledger released goes on to the
        // task service, which finds its task by (sender, req_id) and verb.
        let keyed = kind == VerbKind::Task;
        let (outcome, answer) =
            match ledger.check(&c.req_id, route, binding.epoch(), now, begin, keyed) {
                Check::Replay(frame) => {
                    self.metrics.count(route, Outcome::Replayed);
                    drop(ledger);
                    let class = permit.class().as_str();
                    self.record_answer(sender, c, trace.as_ref(), class, Some(&permit), "replayed");
                    return Admit::Replay(frame);
                }
                Check::Running => (
                    Outcome::Duplicate,
                    "a request with this req_id is still running",
                ),
                Check::OtherVerb => (Outcome::Duplicate, "this req_id was used for another verb"),
                Check::Forgotten => (
                    Outcome::Duplicate,
                    "a request with this req_id was already answered",
                ),
                Check::Full => (
                    Outcome::Overloaded,
                    "this sender's replay quota is used up; retry later",
                ),
                Check::New if shutting_down => {
                    self.metrics.count(route, Outcome::Cancelled);
                    drop(ledger);
                    let class = permit.class().as_str();
                    self.record_answer(
                        sender,
                        c,
                        trace.as_ref(),
                        class,
                        Some(&permit),
                        "cancelled",
                    );
                    return Admit::Answer(ErrorBody::new(
                        ErrorCode::Cancelled,
                        "cancelled: the node is shutting down",
                    ));
                }
                Check::New if !room => (Outcome::Overloaded, "too many requests in flight"),
                Check::New => {
                    // Nothing could finish in no time: not run, not recorded.
                    self.metrics.count(route, Outcome::Cancelled);
                    drop(ledger);
                    let class = permit.class().as_str();
                    self.record_answer(sender, c, trace.as_ref(), class, Some(&permit), "timeout");
                    return Admit::Answer(ErrorBody::new(
                        ErrorCode::Timeout,
                        "the request came with a budget of 0 ms",
                    ));
                }
                Check::Begun => {
                    return Admit::Run(Job {
                        permit,
                        req_id: c.req_id.clone(),
                        args,
                        deadline: deadline(now, c.budget_ms, self.max_handler_time),
                        stream,
                        trace,
                    });
                }
            };
        drop(ledger);
        self.metrics.count(route, outcome);
        let code = if outcome == Outcome::Overloaded {
            ErrorCode::Overloaded
        } else {
            ErrorCode::Duplicate
        };
        self.record_answer(
            sender,
            c,
            trace.as_ref(),
            permit.class().as_str(),
            Some(&permit),
            code.as_str(),
        );
        Admit::Answer(ErrorBody::new(code, answer))
    }
}

/// The BLAKE2s-256 digest of an envelope's args item (WIRE.md 5.6).
fn digest(args: &[u8]) -> [u8; 32] {
    use blake2::Digest;
    blake2::Blake2s256::digest(args).into()
}

/// The authority a permit let a call through on, into an entry.
fn authority<'a>(p: &'a OwnedPermit<RouteHandler>, e: &mut Entry<'a>) {
    match (p.class(), p.grant()) {
        (_, Some(g)) => {
            e.by = Some(By::Grant);
            e.epoch = Some(p.binding_epoch());
            e.grant = Some(g);
        }
        (DeclaredClass::Controller, None) => {
            e.by = Some(By::ControlPlane);
            e.epoch = Some(p.binding_epoch());
        }
        (DeclaredClass::Bootstrap, None) => e.by = Some(By::Bootstrap),
    }
}

/// The handler's deadline: the caller's budget, at most `max`.
fn deadline(now: Instant, budget_ms: Option<u64>, max: Duration) -> Instant {
    let budget = budget_ms.map_or(max, |ms| Duration::from_millis(ms).min(max));
    now.checked_add(budget)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}
