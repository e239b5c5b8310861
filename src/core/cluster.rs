//! `core.cluster` (controller): the node's children. The roster is kept
//! by [`Roster`](crate::core::roster::Roster) and written with every
//! change; a [`Host`](crate::host::Host) runs the children. Operations
//! that wait for the host are done in steps, each written before the
//! next begins, so that a crash at any point leaves a roster that
//! [`reconcile`] brings in line with what the host runs.
//!
//! Cluster operations run one at a time; reads (`list`, `contact`) do not
//! wait for them.

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{ErrorBody, ErrorCode, NodeId};
use capwire_manifest::{
    ChildArgs, ChildState, ChildStates, ChildStatus, ClusterContact, ClusterCreate,
    ClusterCreatePlaced, ClusterIntroduce, ClusterList, ClusterRemove, ClusterRoster,
    ClusterSetBio, ClusterSetMonitoring, ClusterSetPersona, ClusterStates, ContactReply,
    CreateArgs, CreatePlacedArgs, IntroducePairArgs, Member, MonitoringStatus, NoArgs, Placement,
    Roster, RunState, SetBioArgs, SetMonitoringArgs, SetPersonaArgs,
};
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::contact::Contact;
use crate::core::events::ControlEvent;
use crate::core::roster::{check_name, check_text, monitoring_str, status_of, status_str, view};
use crate::core::state::{Core, CoreState, Durable, OnceKey, lock, typed};
use crate::dispatch::extract::{Meta, Sender};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::host::{ChildInfo, ChildRun, ChildSpec, HostError, HostEvent};
use crate::invite::Invite;
use crate::store::{Batch, MemberRecord};

/// How long one roster push may wait for the control plane's session.
const PUSH_DEADLINE: Duration = Duration::from_secs(5);
/// Longest `detail` of a child's state, in bytes.
const MAX_DETAIL: usize = 1024;

fn not_found(cid: &str) -> ErrorBody {
    ErrorBody::new(ErrorCode::NotFound, format!("no child {cid:?}"))
}

fn host_error(e: &HostError) -> HandlerError {
    match e {
        HostError::NotFound(_) => HandlerError::new(ErrorCode::NotFound, e.to_string()),
        HostError::Capacity(_) => HandlerError::new(ErrorCode::Overloaded, e.to_string()),
        HostError::Refused(_) => HandlerError::new(ErrorCode::BadArgs, e.to_string()),
        HostError::Unavailable(_) => HandlerError::new(ErrorCode::Unavailable, e.to_string()),
        _ => HandlerError::new(ErrorCode::Internal, format!("{e}")),
    }
}

fn host_timeout() -> HandlerError {
    HandlerError::new(ErrorCode::Timeout, "the child host did not finish in time")
}

fn with_info(m: &mut MemberRecord, info: &ChildInfo) {
    m.node_id = Some(info.node_id);
    m.addrs = info.addrs.iter().map(ToString::to_string).collect();
    m.caps = info.caps.clone();
    m.status = status_str(ChildStatus::Running).to_owned();
}

fn spec_of(parent: NodeId, m: &MemberRecord) -> ChildSpec {
    ChildSpec {
        cid: m.cid.clone(),
        name: m.name.clone(),
        bio: m.bio.clone(),
        addrs: m.addrs.iter().filter_map(|a| a.parse().ok()).collect(),
        parent: Some(parent),
        placement: m.placement.clone().unwrap_or_default(),
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A child's state when its host reported nothing of it: what the
/// roster says.
fn state_of_status(status: ChildStatus) -> RunState {
    match status {
        ChildStatus::Pending => RunState::Pending,
        ChildStatus::Running => RunState::Running,
        ChildStatus::Exited => RunState::Exited,
        ChildStatus::Removing => RunState::Removing,
    }
}

impl CoreState {
    /// Runs a host call within the host timeout.
    async fn host_call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, HostError>>,
    ) -> Result<T, HandlerError> {
        match tokio::time::timeout(self.limits.host_timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(host_error(&e)),
            Err(_) => Err(host_timeout()),
        }
    }

    /// Writes a roster change (with an answer, when `key` is given) and
    /// applies it.
    async fn write_roster<T: serde::Serialize>(
        &self,
        d: &mut Durable,
        put: Vec<MemberRecord>,
        del: Vec<String>,
        answer: Option<(&OnceKey, &Result<T, ErrorBody>)>,
    ) -> Result<(), HandlerError> {
        let meta = d.roster.bumped(d.roster.meta);
        self.write_roster_meta(d, meta, put, del, answer).await
    }

    async fn write_roster_meta<T: serde::Serialize>(
        &self,
        d: &mut Durable,
        meta: crate::store::RosterMeta,
        put: Vec<MemberRecord>,
        del: Vec<String>,
        answer: Option<(&OnceKey, &Result<T, ErrorBody>)>,
    ) -> Result<(), HandlerError> {
        let batch = Batch {
            roster: Some(meta),
            put_members: put.clone(),
            del_members: del.clone(),
            ..Batch::default()
        };
        match answer {
            Some((key, result)) => self.finish(d, key, batch, result).await?,
            None => self.commit(batch).await?,
        }
        d.roster.apply(meta, &put, &del);
        self.publish_roster(d);
        Ok(())
    }

    /// Answers `key` with `result` without changing the roster.
    async fn answer_only<T: serde::Serialize>(
        &self,
        d: &mut Durable,
        key: &OnceKey,
        result: Result<T, ErrorBody>,
    ) -> Result<T, HandlerError> {
        self.finish(d, key, Batch::default(), &result).await?;
        result.map_err(HandlerError::from)
    }

    async fn create(
        &self,
        from: NodeId,
        key: OnceKey,
        args: CreateArgs,
        placement: Option<Placement>,
    ) -> Result<Member, HandlerError> {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        if let Some(answer) = self.remembered(&d, &key) {
            return typed(answer);
        }
        // The same request retried after a crash: carry on with its child.
        let member = match d.roster.by_origin(&from, &key.key.req_id).cloned() {
            Some(m) if status_of(&m) == ChildStatus::Pending => m,
            Some(m) => {
                let result = Ok(view(&m));
                return self.answer_only(&mut d, &key, result).await;
            }
            None => {
                let bio = args.bio.clone().unwrap_or_default();
                let checked = check_name(&args.name).and_then(|()| check_text("bio", &bio));
                if let Err(e) = checked {
                    return self.answer_only::<Member>(&mut d, &key, Err(e)).await;
                }
                if d.roster.name_taken(&args.name) {
                    let e = ErrorBody::new(
                        ErrorCode::Duplicate,
                        format!("a child is already named {:?}", args.name),
                    );
                    return self.answer_only::<Member>(&mut d, &key, Err(e)).await;
                }
                // The host refuses a placement it cannot honour before
                // anything is made (limits that make no sense, a name or
                // an image its engine would refuse).
                let asked = ChildSpec {
                    name: args.name.clone(),
                    bio: bio.clone(),
                    parent: Some(self.id),
                    placement: placement.clone().unwrap_or_default(),
                    ..ChildSpec::default()
                };
                if let Err(e) = self.host.check(&asked) {
                    let e = ErrorBody::new(ErrorCode::BadArgs, e.to_string());
                    return self.answer_only::<Member>(&mut d, &key, Err(e)).await;
                }
                if d.roster.len() >= self.limits.max_children {
                    return Err(HandlerError::new(
                        ErrorCode::Overloaded,
                        "the node has as many children as it may",
                    ));
                }
                let (cid, meta) = d.roster.next_cid();
                let m = MemberRecord {
                    cid,
                    name: args.name.clone(),
                    bio,
                    persona: String::new(),
                    monitoring: monitoring_str(MonitoringStatus::Off).to_owned(),
                    status: status_str(ChildStatus::Pending).to_owned(),
                    node_id: None,
                    addrs: Vec::new(),
                    caps: Vec::new(),
                    origin: Some((from, key.key.req_id.clone())),
                    watcher: None,
                    placement: placement.filter(|p| !p.is_empty()),
                };
                let meta = d.roster.bumped(meta);
                self.write_roster_meta::<()>(&mut d, meta, vec![m.clone()], vec![], None)
                    .await?;
                m
            }
        };
        drop(d);
        let started = self
            .host_call(self.host.start(spec_of(self.id, &member)))
            .await;
        let mut d = self.durable.lock().await;
        let Some(mut current) = d.roster.get(&member.cid).cloned() else {
            // Removed meanwhile.
            let _ = self.host_call(self.host.stop(&member.cid)).await;
            return Err(HandlerError::new(
                ErrorCode::Cancelled,
                "cancelled: the child was removed",
            ));
        };
        match started {
            Ok(info) => {
                with_info(&mut current, &info);
                let result = Ok(view(&current));
                self.write_roster(&mut d, vec![current], vec![], Some((&key, &result)))
                    .await?;
                result.map_err(HandlerError::from)
            }
            Err(e) => {
                drop(d);
                let _ = self.host_call(self.host.stop(&member.cid)).await;
                let mut d = self.durable.lock().await;
                // Undone: the name is free again. The failure is not
                // remembered: nothing changed, a retry may start afresh.
                self.write_roster::<()>(&mut d, vec![], vec![member.cid.clone()], None)
                    .await?;
                Err(e)
            }
        }
    }

    async fn remove(&self, key: OnceKey, cid: String) -> Result<(), HandlerError> {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        if let Some(answer) = self.remembered(&d, &key) {
            return typed(answer);
        }
        let Some(mut m) = d.roster.get(&cid).cloned() else {
            return self.answer_only(&mut d, &key, Ok(())).await;
        };
        m.status = status_str(ChildStatus::Removing).to_owned();
        self.write_roster::<()>(&mut d, vec![m], vec![], None)
            .await?;
        drop(d);
        self.host_call(self.host.stop(&cid)).await?;
        let mut d = self.durable.lock().await;
        let result = Ok(());
        self.write_roster(&mut d, vec![], vec![cid.clone()], Some((&key, &result)))
            .await?;
        lock(&self.invites).remove(&cid);
        lock(&self.runs).remove(&cid);
        Ok(())
    }

    async fn set_text(
        &self,
        key: OnceKey,
        cid: String,
        what: &'static str,
        text: String,
    ) -> Result<Member, HandlerError> {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        if let Some(answer) = self.remembered(&d, &key) {
            return typed(answer);
        }
        if let Err(e) = check_text(what, &text) {
            return self.answer_only::<Member>(&mut d, &key, Err(e)).await;
        }
        let Some(mut m) = d.roster.get(&cid).cloned() else {
            return self
                .answer_only::<Member>(&mut d, &key, Err(not_found(&cid)))
                .await;
        };
        if what == "bio" {
            m.bio = text;
        } else {
            m.persona = text;
        }
        let result = Ok(view(&m));
        self.write_roster(&mut d, vec![m], vec![], Some((&key, &result)))
            .await?;
        result.map_err(HandlerError::from)
    }

    async fn set_monitoring(
        &self,
        key: OnceKey,
        args: SetMonitoringArgs,
    ) -> Result<Member, HandlerError> {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        if let Some(answer) = self.remembered(&d, &key) {
            return typed(answer);
        }
        let Some(m) = d.roster.get(&args.cid).cloned() else {
            return self
                .answer_only::<Member>(&mut d, &key, Err(not_found(&args.cid)))
                .await;
        };
        // The control plane comes from the binding, never from the args.
        let binding = self.control.binding();
        let controller = binding.controller().copied();
        if args.enabled && controller.is_none() {
            let e = ErrorBody::new(
                ErrorCode::NotBound,
                "this node has no control plane to watch its children",
            );
            return self.answer_only::<Member>(&mut d, &key, Err(e)).await;
        }
        let watched_by_it = m.monitoring == monitoring_str(MonitoringStatus::On)
            && m.watcher.is_some()
            && m.watcher == controller;
        if args.enabled && watched_by_it {
            // Already watched by this control plane: nothing to open.
            let result = Ok(view(&m));
            return self.answer_only(&mut d, &key, result).await;
        }
        if status_of(&m) != ChildStatus::Running {
            return Err(HandlerError::new(
                ErrorCode::Unavailable,
                format!("child {:?} is not running", args.cid),
            ));
        }
        drop(d);
        let monitoring = if let (true, Some(controller)) = (args.enabled, controller) {
            if m.monitoring != monitoring_str(MonitoringStatus::Off) {
                // Watched (or about to be) by another control plane: that
                // ends first, so the child is seen to go over.
                self.host_call(self.host.close_bind(&args.cid)).await?;
            }
            let invite = self
                .host_call(self.host.open_bind(&args.cid, controller))
                .await?;
            lock(&self.invites).insert(args.cid.clone(), invite);
            MonitoringStatus::Pending
        } else {
            self.host_call(self.host.close_bind(&args.cid)).await?;
            lock(&self.invites).remove(&args.cid);
            MonitoringStatus::Off
        };
        let mut d = self.durable.lock().await;
        let Some(mut m) = d.roster.get(&args.cid).cloned() else {
            return Err(HandlerError::from(not_found(&args.cid)));
        };
        m.watcher = if args.enabled { controller } else { None };
        if args.enabled && self.control.binding().epoch() != binding.epoch() {
            // The parent's binding changed while the bind was opened: it is
            // for a control plane that is not this node's any more. The
            // child is `off`, and its bind is released like any other a
            // binding change leaves behind.
            m.monitoring = monitoring_str(MonitoringStatus::Off).to_owned();
            self.write_roster::<()>(&mut d, vec![m], vec![], None)
                .await?;
            self.release_wanted.notify_one();
            return Err(HandlerError::new(
                ErrorCode::Unauthorized,
                "unauthorized: the binding changed while the verb ran",
            ));
        }
        m.monitoring = monitoring_str(monitoring).to_owned();
        let result = Ok(view(&m));
        self.write_roster(&mut d, vec![m], vec![], Some((&key, &result)))
            .await?;
        result.map_err(HandlerError::from)
    }

    /// What the host last reported of each child, or the roster's own
    /// word where it reported nothing (or a verb is under way).
    fn states(&self) -> ChildStates {
        let roster = self.roster();
        let runs = lock(&self.runs);
        let children = roster
            .members
            .iter()
            .map(|m| {
                let run = runs.get(&m.cid);
                let state = match (m.status, run) {
                    (ChildStatus::Pending | ChildStatus::Removing, _) | (_, None) => {
                        state_of_status(m.status)
                    }
                    (_, Some(r)) => r.state,
                };
                ChildState {
                    cid: m.cid.clone(),
                    state,
                    exit_code: run.and_then(|r| r.exit_code),
                    oom_killed: run.is_some_and(|r| r.oom_killed),
                    restarts: run.map_or(0, |r| r.restarts),
                    detail: run.map(|r| r.detail.clone()).unwrap_or_default(),
                }
            })
            .collect();
        ChildStates {
            children,
            version: roster.version,
        }
    }

    fn contact(&self, cid: &str) -> Result<ContactReply, HandlerError> {
        let roster = self.roster();
        let m = roster
            .members
            .iter()
            .find(|m| m.cid == cid)
            .ok_or_else(|| HandlerError::from(not_found(cid)))?;
        let Some(node_id) = m.node_id else {
            return Err(HandlerError::new(
                ErrorCode::Unavailable,
                format!("child {cid:?} has not started"),
            ));
        };
        let pending = m.monitoring == MonitoringStatus::Pending;
        let invite = match lock(&self.invites).get(cid) {
            Some(i) if pending => i.clone(),
            _ => Invite {
                node_id,
                addrs: m.addrs.iter().filter_map(|a| a.parse().ok()).collect(),
                code: None,
            },
        };
        Ok(ContactReply {
            invite: invite.to_string(),
        })
    }

    async fn introduce_pair(
        &self,
        key: OnceKey,
        args: IntroducePairArgs,
    ) -> Result<(), HandlerError> {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        if let Some(answer) = self.remembered(&d, &key) {
            return typed(answer);
        }
        if args.peer_a == args.peer_b {
            let e = ErrorBody::new(ErrorCode::BadArgs, "a child is not introduced to itself");
            return self.answer_only::<()>(&mut d, &key, Err(e)).await;
        }
        let (Some(a), Some(b)) = (
            d.roster.get(&args.peer_a).cloned(),
            d.roster.get(&args.peer_b).cloned(),
        ) else {
            let missing = if d.roster.get(&args.peer_a).is_none() {
                &args.peer_a
            } else {
                &args.peer_b
            };
            return self
                .answer_only::<()>(&mut d, &key, Err(not_found(missing)))
                .await;
        };
        let contact_of = |m: &MemberRecord| -> Result<Contact, HandlerError> {
            let id = m.node_id.ok_or_else(|| {
                HandlerError::new(
                    ErrorCode::Unavailable,
                    format!("child {:?} has not started", m.cid),
                )
            })?;
            let addr: Addr = m
                .addrs
                .first()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| {
                    HandlerError::new(
                        ErrorCode::Unavailable,
                        format!("child {:?} has no address", m.cid),
                    )
                })?;
            Ok(Contact {
                name: m.name.clone(),
                id,
                addr,
            })
        };
        let (ca, cb) = (contact_of(&a)?, contact_of(&b)?);
        drop(d);
        self.host_call(self.host.add_contact(&a.cid, cb)).await?;
        self.host_call(self.host.add_contact(&b.cid, ca)).await?;
        let mut d = self.durable.lock().await;
        self.answer_only(&mut d, &key, Ok(())).await
    }

    /// A child changed on its own (the host said so).
    async fn host_event(&self, event: HostEvent) {
        let _ops = self.cluster_ops.lock().await;
        let mut d = self.durable.lock().await;
        let cid = match &event {
            HostEvent::Exited { cid, .. }
            | HostEvent::Monitoring { cid, .. }
            | HostEvent::Run { cid, .. } => cid.clone(),
        };
        let Some(mut m) = d.roster.get(&cid).cloned() else {
            return;
        };
        let before = m.clone();
        match event {
            HostEvent::Exited { detail, .. } => {
                tracing::warn!(cid = %cid, detail = %detail, "child exited");
                let run = ChildRun {
                    state: RunState::Exited,
                    exit_code: None,
                    oom_killed: false,
                    restarts: 0,
                    detail: bounded(detail, MAX_DETAIL),
                };
                lock(&self.runs).insert(cid.clone(), run);
                m.status = status_str(ChildStatus::Exited).to_owned();
            }
            HostEvent::Run { run, info, .. } => {
                let status = status_of(&m);
                if matches!(status, ChildStatus::Pending | ChildStatus::Removing) {
                    // The verb under way decides; the state is kept.
                } else if run.state == RunState::Running {
                    if let Some(info) = &info {
                        with_info(&mut m, info);
                    } else {
                        m.status = status_str(ChildStatus::Running).to_owned();
                    }
                } else if matches!(run.state, RunState::Exited | RunState::Restarting) {
                    if run.state == RunState::Exited {
                        tracing::warn!(cid = %cid, detail = %run.detail, "child exited");
                    }
                    m.status = status_str(ChildStatus::Exited).to_owned();
                }
                let run = ChildRun {
                    detail: bounded(run.detail, MAX_DETAIL),
                    ..run
                };
                lock(&self.runs).insert(cid.clone(), run);
            }
            HostEvent::Monitoring {
                status,
                controller: bound_to,
                ..
            } => {
                // `on` and `pending` mean "watched by this node's control
                // plane" only for a bind the parent opened for it (and `on`
                // only when the child is bound to it); a child still bound
                // to a former one is `off` here, and is released from it.
                let ours = self.control.binding().controller().copied();
                let arranged = m.watcher.is_some() && m.watcher == ours;
                let status = match status {
                    MonitoringStatus::On if arranged && bound_to == ours => MonitoringStatus::On,
                    MonitoringStatus::Pending if arranged => MonitoringStatus::Pending,
                    _ => MonitoringStatus::Off,
                };
                if bound_to.is_some() && bound_to != ours && bound_to == m.watcher {
                    self.release_wanted.notify_one();
                }
                m.monitoring = monitoring_str(status).to_owned();
            }
        }
        if m == before {
            return;
        }
        if let Err(e) = self.write_roster::<()>(&mut d, vec![m], vec![], None).await {
            tracing::error!(error = ?e, "roster change not written");
        }
    }
}

impl CoreState {
    /// Releases every child still bound to, or holding a bind open for, a
    /// control plane that is no longer this node's: the host unbinds it
    /// and drops its pending bind, then the member's `watcher` is cleared.
    /// A child the host cannot reach now (not running, or failing) keeps
    /// its `watcher` and is released on the next binding change or when
    /// the parent starts again. The roster already says `off` for them
    /// (written with the binding change).
    async fn release_children(&self) {
        let to_release = {
            let d = self.durable.lock().await;
            d.roster.to_release(self.control.binding().controller())
        };
        for (cid, watcher) in to_release {
            if let Err(e) = self.host_call(self.host.close_bind(&cid)).await {
                tracing::warn!(
                    cid = %cid, error = ?e,
                    "child not released from its former control plane yet"
                );
                continue;
            }
            lock(&self.invites).remove(&cid);
            let mut d = self.durable.lock().await;
            let Some(mut m) = d.roster.get(&cid).cloned() else {
                continue;
            };
            if m.watcher != Some(watcher) {
                continue;
            }
            m.watcher = None;
            let visible = m.monitoring != monitoring_str(MonitoringStatus::Off);
            m.monitoring = monitoring_str(MonitoringStatus::Off).to_owned();
            // The watcher alone is not in the roster's view: no new version
            // for it.
            let meta = if visible {
                d.roster.bumped(d.roster.meta)
            } else {
                d.roster.meta
            };
            if let Err(e) = self
                .write_roster_meta::<()>(&mut d, meta, vec![m], vec![], None)
                .await
            {
                tracing::error!(error = ?e, "roster change not written");
            }
        }
    }
}

/// Releases children from former control planes whenever the binding
/// changes, one cluster operation at a time, until `stop`.
pub(crate) async fn release_loop(core: Arc<CoreState>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = core.release_wanted.notified() => {}
        }
        // Stopped midway, a child keeps its `watcher` and is released when
        // the node starts again.
        tokio::select! {
            () = stop.cancelled() => return,
            () = async {
                let _ops = core.cluster_ops.lock().await;
                core.release_children().await;
            } => {}
        }
    }
}

/// Brings the roster in line with the host after a (re)start: children
/// that should run are started again (with the same identity), removals
/// that were under way are finished, creates that were under way are
/// completed (their requests, retried, find them), binds that were open
/// for the control plane are opened again, and children left bound to a
/// former control plane are released from it.
pub(crate) async fn reconcile(core: Arc<CoreState>) {
    let _ops = core.cluster_ops.lock().await;
    let members: Vec<MemberRecord> = core
        .durable
        .lock()
        .await
        .roster
        .members
        .values()
        .cloned()
        .collect();
    for m in members {
        let status = status_of(&m);
        if status == ChildStatus::Removing {
            if core.host_call(core.host.stop(&m.cid)).await.is_ok() {
                let mut d = core.durable.lock().await;
                let _ = core
                    .write_roster::<()>(&mut d, vec![], vec![m.cid.clone()], None)
                    .await;
            }
            continue;
        }
        let started = core.host_call(core.host.start(spec_of(core.id, &m))).await;
        let mut d = core.durable.lock().await;
        let Some(mut current) = d.roster.get(&m.cid).cloned() else {
            continue;
        };
        match started {
            Ok(info) => with_info(&mut current, &info),
            Err(e) if status == ChildStatus::Pending => {
                tracing::warn!(cid = %m.cid, error = ?e, "pending child did not start: dropped");
                let _ = core
                    .write_roster::<()>(&mut d, vec![], vec![m.cid.clone()], None)
                    .await;
                continue;
            }
            Err(e) => {
                tracing::warn!(cid = %m.cid, error = ?e, "child did not restart");
                current.status = status_str(ChildStatus::Exited).to_owned();
            }
        }
        let reopen = current.monitoring == monitoring_str(MonitoringStatus::Pending)
            && status_of(&current) == ChildStatus::Running;
        if current != m {
            let _ = core
                .write_roster::<()>(&mut d, vec![current.clone()], vec![], None)
                .await;
        }
        drop(d);
        if reopen {
            match core.control.binding().controller().copied() {
                Some(cp) => {
                    if let Ok(invite) = core.host_call(core.host.open_bind(&m.cid, cp)).await {
                        lock(&core.invites).insert(m.cid.clone(), invite);
                    }
                }
                None => {
                    let mut d = core.durable.lock().await;
                    current.monitoring = monitoring_str(MonitoringStatus::Off).to_owned();
                    let _ = core
                        .write_roster::<()>(&mut d, vec![current], vec![], None)
                        .await;
                }
            }
        }
    }
    // What the host still runs for this parent and the roster no longer
    // has (a create or remove cut short by a crash) is removed.
    let keep: Vec<String> = core
        .durable
        .lock()
        .await
        .roster
        .members
        .keys()
        .cloned()
        .collect();
    if let Err(e) = core.host_call(core.host.retain(core.id, keep)).await {
        tracing::warn!(error = ?e, "children the roster no longer has were not removed");
    }
    // Children still bound to a control plane the parent lost while it was
    // down (or before it could release them) are released now that they run.
    core.release_children().await;
}

/// Pushes every roster change to the bound control plane, newest first
/// (changes made while a push is under way are sent as one).
pub(crate) async fn push_loop(core: Arc<CoreState>, stop: CancellationToken) {
    let mut rx = core.watch_roster();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
        let roster = rx.borrow_and_update().clone();
        let binding = core.control.binding();
        let Some(cp) = binding.controller().copied() else {
            continue;
        };
        let peer = core.handle.peer(cp);
        // The control plane dials the node (it is seldom a contact): the
        // push waits for its session whoever dials, and goes out only under
        // the binding it was meant for (see `copy_loop`).
        let deadline = tokio::time::Instant::now() + PUSH_DEADLINE;
        let send = async {
            core.handle.wait_any_session(&cp, deadline).await;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            peer.notify_if(ClusterRoster, roster, left, || {
                core.control.binding().epoch() == binding.epoch()
            })
            .await
        };
        tokio::select! {
            () = stop.cancelled() => return,
            sent = send => match sent {
                Ok(true) => {}
                Ok(false) => tracing::debug!("roster push not sent: the binding changed"),
                Err(e) => tracing::debug!(error = %e, "roster push not delivered"),
            }
        }
    }
}

/// Applies what the host reports about its children, until `stop`.
pub(crate) async fn host_events(core: Arc<CoreState>, stop: CancellationToken) {
    let Some(mut events) = core.host.events() else {
        return;
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            event = events.recv() => match event {
                Some(e) => core.host_event(e).await,
                None => return,
            },
        }
    }
}

// ---------------------------------------------------------------------
// Handlers

async fn list(_args: NoArgs, Core(core): Core) -> Result<Roster, HandlerError> {
    Ok(core.roster())
}

async fn create(
    args: CreateArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<Member, HandlerError> {
    let key = OnceKey::of::<ClusterCreate>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.create(from, key, args, None).await })
        .await
}

async fn create_placed(
    args: CreatePlacedArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<Member, HandlerError> {
    let key = OnceKey::of::<ClusterCreatePlaced>(from, &meta.req_id);
    let c = core.clone();
    let CreatePlacedArgs {
        name,
        bio,
        placement,
    } = args;
    let args = CreateArgs { name, bio };
    core.detached(async move { c.create(from, key, args, Some(placement)).await })
        .await
}

async fn states(_args: NoArgs, Core(core): Core) -> Result<ChildStates, HandlerError> {
    Ok(core.states())
}

async fn remove(
    args: ChildArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<(), HandlerError> {
    let key = OnceKey::of::<ClusterRemove>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.remove(key, args.cid).await })
        .await
}

async fn set_bio(
    args: SetBioArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<Member, HandlerError> {
    let key = OnceKey::of::<ClusterSetBio>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.set_text(key, args.cid, "bio", args.bio).await })
        .await
}

async fn set_persona(
    args: SetPersonaArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<Member, HandlerError> {
    let key = OnceKey::of::<ClusterSetPersona>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.set_text(key, args.cid, "persona", args.persona).await })
        .await
}

async fn set_monitoring(
    args: SetMonitoringArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<Member, HandlerError> {
    let key = OnceKey::of::<ClusterSetMonitoring>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.set_monitoring(key, args).await })
        .await
}

async fn contact(args: ChildArgs, Core(core): Core) -> Result<ContactReply, HandlerError> {
    core.contact(&args.cid)
}

async fn introduce(
    args: IntroducePairArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<(), HandlerError> {
    let key = OnceKey::of::<ClusterIntroduce>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move { c.introduce_pair(key, args).await })
        .await
}

async fn roster(
    roster: Roster,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<(), HandlerError> {
    core.push_event(ControlEvent::Roster { from, roster });
    Ok(())
}

macro_rules! route {
    ($verb:ty, ($($e:ty),+), $f:expr) => {
        Arc::new(RouteEntry::new(Typed::<$verb, ($($e,)+), _>::new($f))) as RouteHandler
    };
    (durable $verb:ty, ($($e:ty),+), $f:expr) => {
        Arc::new(RouteEntry::durable(Typed::<$verb, ($($e,)+), _>::new($f))) as RouteHandler
    };
}

pub(crate) fn capability() -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(
        capwire_manifest::CORE_CLUSTER,
        capwire_manifest::Version::new(1, 1, 0),
    )
    .verb::<ClusterList>(route!(ClusterList, (Core), list))
    .verb::<ClusterStates>(route!(ClusterStates, (Core), states))
    .verb::<ClusterCreate>(route!(durable ClusterCreate, (Sender, Meta, Core), create))
    .verb::<ClusterCreatePlaced>(route!(
        durable ClusterCreatePlaced,
        (Sender, Meta, Core),
        create_placed
    ))
    .verb::<ClusterRemove>(route!(durable ClusterRemove, (Sender, Meta, Core), remove))
    .verb::<ClusterSetBio>(route!(durable ClusterSetBio, (Sender, Meta, Core), set_bio))
    .verb::<ClusterSetPersona>(route!(durable ClusterSetPersona, (Sender, Meta, Core), set_persona))
    .verb::<ClusterSetMonitoring>(route!(
        durable ClusterSetMonitoring,
        (Sender, Meta, Core),
        set_monitoring
    ))
    .verb::<ClusterContact>(route!(ClusterContact, (Core), contact))
    .verb::<ClusterIntroduce>(route!(durable ClusterIntroduce, (Sender, Meta, Core), introduce))
    .verb::<ClusterRoster>(route!(ClusterRoster, (Sender, Core), roster))
}
