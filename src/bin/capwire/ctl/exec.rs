//! What each `ctl` command does, with the control plane's node. Every
//! command reports JSON records (a `kind` and its fields) on a channel;
//! `render` turns them into text for people, `--json` prints them as they
//! are, and a forwarded command sends them down the socket.
//!
//! Every call the control plane makes, whichever process asked for it, is
//! also told to the running `watch` commands as a `call` record: a node's
//! monitoring copies leave out its control plane's own frames, so this is
//! how a `watch` (or `top`) sees what is done through it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use capwire::envelope::{RawValue, ReqId};
use capwire::json::{cbor_to_json, json_to_cbor};
use capwire::manifest::{CopyRecord, Manifest, Member, NoArgs, ProtocolVersions, Roster, VerbKind};
use capwire::{CallError, ControlEvent, Invite, Limits, Node, NodeError, NodeId, Peer, StoreError};
use serde_json::{Value as Json, json};
use tokio::sync::{broadcast, mpsc};

use super::book::{Book, Entry, short};
use super::task_args::OnQuestion;
use super::{ClusterOp, ConfigOp, CtlCommand, OnOff, call_target, tasks_target};
use crate::exit::{Failure, TIMEOUT, UNREACHABLE, error_code};

/// Why the control plane's node did not open.
pub(crate) enum OpenError {
    /// Another process owns the state directory.
    InUse,
    /// Anything else.
    Failed(Failure),
}

/// The control plane: its node and its address book.
pub(crate) struct Ctx {
    pub(super) node: Node,
    dir: PathBuf,
    book: Mutex<Book>,
    /// The calls made, as `call` records, for the running watches.
    calls: broadcast::Sender<Json>,
}

/// The library's own bound on a stream's wait for an item, above any
/// `--timeout` anyone types.
const STREAM_IDLE: Duration = Duration::from_secs(365 * 86_400);

/// How many `call` records a slow watch may fall behind by.
const CALL_FEED: usize = 256;

/// How long `call --notify` keeps its session after the note's round
/// trip, for the handler to start before the session ends.
const NOTE_SETTLE: Duration = Duration::from_millis(100);

pub(super) type Out = mpsc::Sender<Json>;

pub(super) async fn emit(out: &Out, record: Json) -> Result<(), Failure> {
    // A reader that went away (Ctrl-C, a closed socket) ends the command.
    out.send(record)
        .await
        .map_err(|_| Failure::failed("the output was closed"))
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ctx {
    /// Opens the node of the state directory `dir` (created when missing).
    pub(crate) async fn open(dir: &Path) -> Result<Ctx, OpenError> {
        let node = Node::builder("capwire.ctl")
            .name("capwire-ctl")
            .state_dir(dir.to_path_buf())
            // A stream's wait for its next item is bounded by each
            // command's --timeout instead.
            .limits(Limits {
                stream_idle_timeout: STREAM_IDLE,
                ..Limits::default()
            })
            .start()
            .await
            .map_err(|e| match e {
                NodeError::Store(StoreError::Locked(_)) => OpenError::InUse,
                e => OpenError::Failed(Failure::failed(format!(
                    "cannot open the control plane's state in {}: {e}",
                    dir.display()
                ))),
            })?;
        let book = Book::load(dir).map_err(OpenError::Failed)?;
        Ok(Ctx {
            node,
            dir: dir.to_path_buf(),
            book: Mutex::new(book),
            calls: broadcast::channel(CALL_FEED).0,
        })
    }

    /// The state directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Shuts the node down.
    pub(crate) async fn close(&self) {
        self.node.shutdown().await;
    }

    pub(super) fn book(&self) -> MutexGuard<'_, Book> {
        lock(&self.book)
    }

    /// How a later command names `entry`, which `spec` named: its name
    /// when it is in the book, else `spec` (an invite) quoted for a shell.
    fn via(&self, entry: &Entry, spec: &str) -> String {
        if self.book().peers.iter().any(|p| p.node_id == entry.node_id) {
            entry.name.clone()
        } else {
            format!("'{spec}'")
        }
    }

    /// A session with `entry`: the one up already, or a new one.
    pub(super) async fn reach(&self, entry: &Entry, timeout: Duration) -> Result<Peer, Failure> {
        if self.node.connected_peers().contains(&entry.node_id) {
            return Ok(self.node.peer(entry.node_id));
        }
        let mut last = Failure::usage(format!("{} has no address", entry.name));
        for addr in entry.addrs() {
            match tokio::time::timeout(timeout, self.node.connect(&addr, Some(entry.node_id))).await
            {
                Ok(Ok(peer)) => return Ok(peer),
                Ok(Err(e)) => {
                    last = Failure::connect(&format!("cannot reach {} at {addr}", entry.name), &e);
                }
                // No answer in time, as a call or a bind without one.
                Err(_) => {
                    last = Failure::new(
                        TIMEOUT,
                        format!(
                            "cannot reach {} at {addr}: no answer within the timeout",
                            entry.name
                        ),
                    )
                    .because("timeout");
                }
            }
        }
        Err(last)
    }

    pub(super) async fn call(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        args: &Json,
        timeout: Duration,
    ) -> Result<Json, Failure> {
        let args = cbor_args(args)?;
        self.call_cbor(peer, name, cap, verb, &args, timeout).await
    }

    async fn call_cbor(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        args: &RawValue,
        timeout: Duration,
    ) -> Result<Json, Failure> {
        let reply = self
            .call_raw(peer, name, cap, verb, args, None, timeout)
            .await?;
        cbor_to_json(&reply).map_err(|e| Failure::failed(format!("unreadable result: {e}")))
    }

    /// A request (or a task's submit), with `req_id` when given; its
    /// answer as CBOR.
    #[allow(clippy::too_many_arguments)]
    async fn call_raw(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        args: &RawValue,
        req_id: Option<&ReqId>,
        timeout: Duration,
    ) -> Result<RawValue, Failure> {
        let reply = match req_id {
            Some(id) => peer.call_raw_with_id(cap, verb, args, id, timeout).await,
            None => peer.call_raw(cap, verb, args, timeout).await,
        };
        self.note(peer, name, cap, verb, Way::Request, reply.as_ref().err());
        reply.map_err(|e| Failure::call(&format!("{name} {cap}/{verb}"), &e))
    }

    /// Tells the watches about a call this control plane made.
    pub(super) fn note(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        way: Way,
        error: Option<&CallError>,
    ) {
        let error = error.map(Noted::of);
        self.note_as(peer, name, cap, verb, way, error.as_ref());
    }

    /// Tells the watches about a call that ended with `error`.
    fn note_as(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        way: Way,
        error: Option<&Noted>,
    ) {
        if self.calls.receiver_count() == 0 {
            return;
        }
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        let mut record = json!({
            "kind": "call", "peer": name, "node_id": peer.id().to_string(),
            "cap": cap, "verb": verb, "notify": way == Way::Notify, "at_ms": at_ms,
            "ok": error.is_none(),
            "denied": error.is_some_and(|e| e.denied),
            "error": error.map(|e| e.code.as_str()),
            "message": error.map(|e| e.message.as_str()),
        });
        if let Way::Stream(items) = way {
            record["stream"] = json!(true);
            record["items"] = json!(items);
        }
        let _ = self.calls.send(record);
    }

    /// Streams `cap`/`verb` of `peer` and reports each item as it comes,
    /// then the end: `--timeout` bounds the opening and each wait for the
    /// next item. The stream is cancelled at the node when this future is
    /// dropped (Ctrl-C, a client of `ctl.sock` gone) or gives up.
    #[allow(clippy::too_many_arguments)]
    async fn stream(
        &self,
        peer: &Peer,
        name: &str,
        cap: &str,
        verb: &str,
        args: &RawValue,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let doing = format!("{name} {cap}/{verb}");
        let opened =
            match tokio::time::timeout(timeout, peer.stream_raw(cap, verb, args, None)).await {
                Ok(opened) => opened,
                Err(_) => Err(CallError::Timeout),
            };
        let mut items = match opened {
            Ok(items) => items,
            Err(e) => {
                self.note(peer, name, cap, verb, Way::Stream(0), Some(&e));
                return Err(Failure::call(&doing, &e));
            }
        };
        // Cancelled here (this future dropped): the watches are told so.
        let mut cancelled = OnDrop(
            Some(|seq| {
                let noted = Noted::local("cancelled", "the stream was cancelled by this side");
                self.note_as(peer, name, cap, verb, Way::Stream(seq), Some(&noted));
            }),
            0,
        );
        let mut seq: u64 = 0;
        let ended: Result<(), (Noted, Failure)> = loop {
            let Ok(next) = tokio::time::timeout(timeout, items.next()).await else {
                // Dropping the stream below cancels it at the node.
                let message = format!(
                    "{doing}: no item within the timeout, after {seq} items (the stream was \
                     cancelled)"
                );
                break Err((
                    Noted::local("timeout", &message),
                    Failure::new(TIMEOUT, message),
                ));
            };
            match next.map(|item| item.map(|raw| cbor_to_json(&raw))) {
                None => break Ok(()),
                Some(Ok(Ok(item))) => {
                    seq += 1;
                    cancelled.set(seq);
                    emit(out, json!({"kind": "item", "seq": seq, "item": item})).await?;
                }
                Some(Ok(Err(e))) => {
                    let message = format!("{doing}: item {} is unreadable: {e}", seq + 1);
                    break Err((
                        Noted::local("bad_result", &message),
                        Failure::failed(message),
                    ));
                }
                Some(Err(e)) => break Err((Noted::of(&e), Failure::call(&doing, &e))),
            }
        };
        drop(items);
        cancelled.disarm();
        match ended {
            Ok(()) => {
                self.note_as(peer, name, cap, verb, Way::Stream(seq), None);
                emit(out, json!({"kind": "end", "items": seq})).await
            }
            Err((noted, failure)) => {
                self.note_as(peer, name, cap, verb, Way::Stream(seq), Some(&noted));
                emit(
                    out,
                    json!({
                        "kind": "error", "items": seq, "error": noted.code,
                        "message": failure.message, "exit": failure.code,
                    }),
                )
                .await?;
                Err(failure)
            }
        }
    }

    /// Runs one command.
    pub(crate) async fn exec(
        &self,
        command: CtlCommand,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        match command {
            CtlCommand::Bind { invite, name } => self.bind(&invite, name, timeout, out).await,
            CtlCommand::Peers => {
                let peers: Vec<Json> = self
                    .book()
                    .peers
                    .iter()
                    .map(|p| {
                        json!({
                            "name": p.name, "node_id": p.node_id.to_string(), "addrs": p.addrs,
                            "parent": p.parent, "cid": p.cid,
                            "connected": self.node.connected_peers().contains(&p.node_id),
                        })
                    })
                    .collect();
                emit(
                    out,
                    json!({"kind": "peers", "me": self.node.id().to_string(), "peers": peers}),
                )
                .await
            }
            CtlCommand::Forget { node } => {
                let entry = self.book().resolve(node.get()?)?;
                let removed = self.book().remove(entry.node_id)?;
                let message = if removed {
                    format!("forgot {}", entry.name)
                } else {
                    format!("{} was not in the book", entry.name)
                };
                emit(out, json!({"kind": "done", "message": message})).await
            }
            CtlCommand::Call {
                target,
                peer,
                args,
                notify,
                stream,
                wait,
                answer,
                req_id,
                token,
                trace,
                parent,
            } => {
                let (peer, cap, verb) = call_target(peer.as_deref(), &target)?;
                // Bad input is a usage error whether or not the node is up.
                let args: Json = match args {
                    Some(text) => serde_json::from_str(&text)
                        .map_err(|e| Failure::usage(format!("--args is not JSON: {e}")))?,
                    None => json!({}),
                };
                let args = cbor_args(&args)?;
                let answer = answer
                    .map(|a| super::task_args::answer_of(&a, "--answer"))
                    .transpose()?;
                let req_id = req_id
                    .map(|id| {
                        ReqId::try_from(id.as_str()).map_err(|e| {
                            Failure::usage(format!(
                                "--req-id {id:?}: {e} (printable ASCII, no spaces, at most 64 \
                                 bytes)"
                            ))
                        })
                    })
                    .transpose()?;
                if req_id.as_ref().is_some_and(ReqId::is_fire_and_forget) {
                    return Err(Failure::usage(
                        "--req-id: an empty id would be a notification",
                    ));
                }
                let entry = self.book().resolve(&peer)?;
                let session = self.reach(&entry, timeout).await?;
                if let Some(token) = &token {
                    self.present(&session, &entry.name, token).await?;
                }
                let kind = check_kind(&session, &entry.name, &cap, &verb, stream, notify, wait)?;
                // The command's span (exported when OTLP is configured) is
                // the root of the call's trace, and lives until it ends.
                let _root;
                let session = if trace {
                    let parent = parent.and_then(|(tp, ts)| {
                        capwire::trace::TraceContext::parse(&tp, ts.as_deref()).ok()
                    });
                    let (span, cx) = trace_root(&cap, &verb, parent.as_ref());
                    _root = span;
                    emit(
                        out,
                        json!({"kind": "trace", "trace_id": cx.trace_id_hex(),
                               "traceparent": cx.traceparent()}),
                    )
                    .await?;
                    session.with_trace(cx)
                } else {
                    session
                };
                if stream {
                    return self
                        .stream(&session, &entry.name, &cap, &verb, &args, timeout, out)
                        .await;
                }
                if notify {
                    let sent = session.notify_raw_within(&cap, &verb, &args, timeout).await;
                    self.note(
                        &session,
                        &entry.name,
                        &cap,
                        &verb,
                        Way::Notify,
                        sent.as_ref().err(),
                    );
                    sent.map_err(|e| Failure::call(&format!("{} {cap}/{verb}", entry.name), &e))?;
                    // A node cancels the handlers running for a peer when
                    // its session ends (WIRE.md 4.6), and this command ends
                    // it next. One round trip on the same session, answered
                    // after the note was dispatched (in order), then a
                    // moment, lets a handler that waits for its turn (a
                    // Python one waits for its loop) start first.
                    let settle = timeout.min(Duration::from_secs(2));
                    let _ = session
                        .request_within(ProtocolVersions, NoArgs {}, settle)
                        .await;
                    tokio::time::sleep(NOTE_SETTLE).await;
                    return emit(
                        out,
                        json!({"kind": "sent", "peer": entry.name, "cap": cap, "verb": verb}),
                    )
                    .await;
                }
                let reply = self
                    .call_raw(
                        &session,
                        &entry.name,
                        &cap,
                        &verb,
                        &args,
                        req_id.as_ref(),
                        timeout,
                    )
                    .await?;
                if kind != Some(VerbKind::Task) {
                    let value = cbor_to_json(&reply)
                        .map_err(|e| Failure::failed(format!("unreadable result: {e}")))?;
                    return emit(out, json!({"kind": "result", "value": value})).await;
                }
                let via = self.via(&entry, &peer);
                let task = self
                    .submitted(&entry.name, &via, &cap, &verb, &reply, out)
                    .await?;
                if !wait {
                    return Ok(());
                }
                let on_question = answer.map_or(OnQuestion::Stop, OnQuestion::Answer);
                self.follow(
                    &session,
                    &entry.name,
                    &via,
                    &task,
                    1,
                    on_question,
                    timeout,
                    out,
                )
                .await
            }
            CtlCommand::Tasks { node, peer, op } => {
                let node = tasks_target(node.as_deref(), peer.as_deref())?;
                super::task_args::check(&op)?;
                let entry = self.book().resolve(node)?;
                let session = self.reach(&entry, timeout).await?;
                let via = self.via(&entry, node);
                self.tasks(&session, &entry.name, &via, op, timeout, out)
                    .await
            }
            CtlCommand::Manifest { node } => {
                let (_, manifest) = self.manifest(&node, timeout).await?;
                emit(out, manifest_json(&manifest)).await
            }
            CtlCommand::Card { node } => {
                let (entry, manifest) = self.manifest(&node, timeout).await?;
                // The name this control plane knows it by (the tools'
                // and the served card's); a node not in the book, reached
                // by an invite, goes by its own.
                let known = self.book().peers.iter().any(|p| p.node_id == entry.node_id);
                let name = if known { entry.name.as_str() } else { "" };
                let card = super::card::card_json(name, &manifest_json(&manifest), &entry.addrs);
                emit(
                    out,
                    json!({"kind": "card", "peer": entry.name, "card": card}),
                )
                .await
            }
            CtlCommand::Status { node } => {
                let entry = self.book().resolve(node.get()?)?;
                let session = self.reach(&entry, timeout).await?;
                let reply = self
                    .call(
                        &session,
                        &entry.name,
                        "core.monitoring",
                        "status",
                        &json!({}),
                        timeout,
                    )
                    .await?;
                emit(out, tagged("status", &entry.name, reply)).await
            }
            CtlCommand::Disable { node } => {
                let entry = self.book().resolve(node.get()?)?;
                let session = self.reach(&entry, timeout).await?;
                self.call(
                    &session,
                    &entry.name,
                    "core.monitoring",
                    "disable",
                    &json!({}),
                    timeout,
                )
                .await?;
                let message = format!("{} is no longer bound to this control plane", entry.name);
                emit(out, json!({"kind": "done", "message": message})).await
            }
            CtlCommand::Cluster { peer, op } => {
                let entry = self.book().target(peer.as_deref())?;
                let session = self.reach(&entry, timeout).await?;
                self.cluster(&entry, &session, op, timeout, out).await
            }
            CtlCommand::Config { peer, op } => {
                // Bad input is a usage error whether or not the node is up.
                if let ConfigOp::Set { value, .. } = &op {
                    cbor_args(&config_value(value)?)?;
                }
                let entry = self.book().target(peer.as_deref())?;
                let session = self.reach(&entry, timeout).await?;
                match op {
                    ConfigOp::Get => {
                        let reply = self
                            .call(
                                &session,
                                &entry.name,
                                "core.configuration",
                                "get_config",
                                &json!({}),
                                timeout,
                            )
                            .await?;
                        emit(out, tagged("config", &entry.name, reply)).await
                    }
                    ConfigOp::Set { value, if_version } => {
                        let mut args = json!({"value": config_value(&value)?});
                        if let Some(v) = if_version {
                            args["if_version"] = json!(v);
                        }
                        let reply = self
                            .call(
                                &session,
                                &entry.name,
                                "core.configuration",
                                "set_config",
                                &args,
                                timeout,
                            )
                            .await?;
                        emit(out, tagged("config_set", &entry.name, reply)).await
                    }
                }
            }
            CtlCommand::Watch => self.watch(timeout, out).await,
            CtlCommand::Grant {
                node,
                to,
                to_key,
                verbs,
                valid_for,
            } => {
                self.grant(
                    node.get()?,
                    &to,
                    to_key.as_deref(),
                    &verbs,
                    valid_for,
                    timeout,
                    out,
                )
                .await
            }
            CtlCommand::Attenuate {
                token,
                verbs,
                valid_for,
                to,
                to_key,
            } => {
                self.attenuate(
                    &token,
                    &verbs,
                    valid_for,
                    to.as_deref(),
                    to_key.as_deref(),
                    timeout,
                    out,
                )
                .await
            }
            CtlCommand::Revoke { node, what } => self.revoke(&node, &what, timeout, out).await,
            CtlCommand::Audit {
                node,
                entries,
                dump,
            } => self.audit(&node, entries, dump, timeout, out).await,
            CtlCommand::Identity => {
                emit(
                    out,
                    json!({
                        "kind": "identity",
                        "node_id": self.node.id().to_string(),
                        "grant_key": self.node.grant_key().to_string(),
                    }),
                )
                .await
            }
            CtlCommand::Top { .. } => Err(Failure::usage(
                "top runs in its own terminal; it cannot be handed to another ctl",
            )),
        }
    }

    /// The node named and its manifest, from a session with it.
    async fn manifest(
        &self,
        node: &super::NodeArg,
        timeout: Duration,
    ) -> Result<(Entry, std::sync::Arc<Manifest>), Failure> {
        let entry = self.book().resolve(node.get()?)?;
        let session = self.reach(&entry, timeout).await?;
        let manifest = session.manifest().ok_or_else(|| {
            Failure::new(UNREACHABLE, format!("{}: the session ended", entry.name))
        })?;
        Ok((entry, manifest))
    }

    async fn bind(
        &self,
        invite: &str,
        name: Option<String>,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let invite: Invite = invite
            .trim()
            .parse()
            .map_err(|e| Failure::usage(format!("not an invite: {e}")))?;
        if invite.code.is_none() {
            return Err(Failure::usage(
                "the invite has no code (#CODE): ask the node for a new invite",
            ));
        }
        let (_, reply) = tokio::time::timeout(timeout, self.node.connect_invite(&invite))
            .await
            .map_err(|_| Failure::new(TIMEOUT, "bind: no answer within the timeout"))?
            .map_err(|e| Failure::connect("bind", &e))?;
        let reply = reply.ok_or_else(|| Failure::failed("bind: no reply"))?;
        let name = name.unwrap_or_else(|| {
            let taken = self
                .book()
                .peers
                .iter()
                .any(|p| p.name == reply.manifest.name && p.node_id != invite.node_id);
            if reply.manifest.name.is_empty() || taken {
                short(&invite.node_id)
            } else {
                reply.manifest.name.clone()
            }
        });
        self.book().put(Entry {
            name: name.clone(),
            node_id: invite.node_id,
            addrs: invite.addrs.iter().map(ToString::to_string).collect(),
            parent: None,
            cid: None,
        })?;
        let members = cbor_to_json(&reply.members).unwrap_or(Json::Null);
        let config = cbor_to_json(&reply.config).unwrap_or(Json::Null);
        emit(
            out,
            json!({
                "kind": "bound", "name": name, "node_id": invite.node_id.to_string(),
                "manifest": manifest_json(&reply.manifest), "members": members,
                "config": config, "version": reply.version,
            }),
        )
        .await
    }

    /// The cid `child` names in `parent`'s roster: a cid, or a member's
    /// name (left as it is when neither, for the node to refuse).
    async fn cid(
        &self,
        parent: &Entry,
        session: &Peer,
        child: &str,
        timeout: Duration,
    ) -> Result<String, Failure> {
        let roster = self.roster(parent, session, timeout).await?;
        Ok(roster
            .members
            .iter()
            .find(|m| m.cid == child)
            .or_else(|| roster.members.iter().find(|m| m.name == child))
            .map_or_else(|| child.to_owned(), |m| m.cid.clone()))
    }

    async fn roster(
        &self,
        parent: &Entry,
        session: &Peer,
        timeout: Duration,
    ) -> Result<Roster, Failure> {
        let reply = session
            .request_within(
                capwire::manifest::ClusterList,
                capwire::manifest::NoArgs {},
                timeout,
            )
            .await;
        let error = reply.as_ref().err();
        self.note(
            session,
            &parent.name,
            "core.cluster",
            "list",
            Way::Request,
            error,
        );
        reply.map_err(|e| Failure::call(&format!("{} core.cluster/list", parent.name), &e))
    }

    async fn cluster(
        &self,
        parent: &Entry,
        session: &Peer,
        op: ClusterOp,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let call = |verb: &'static str, args: Json| async move {
            self.call(session, &parent.name, "core.cluster", verb, &args, timeout)
                .await
        };
        match op {
            ClusterOp::List => {
                let roster = self.roster(parent, session, timeout).await?;
                emit(out, roster_json(&parent.name, &roster)).await
            }
            ClusterOp::Create {
                name,
                bio,
                placement,
            } => {
                let mut args = json!({"name": name});
                if let Some(bio) = bio {
                    args["bio"] = json!(bio);
                }
                // A placement goes to core.cluster 1.1's create_placed; a
                // plain create stays what every version takes.
                let placement = placement.placement();
                let verb = if placement.is_empty() {
                    "create"
                } else {
                    args["placement"] = serde_json::to_value(&placement)
                        .map_err(|e| Failure::failed(e.to_string()))?;
                    "create_placed"
                };
                let member = call(verb, args).await?;
                emit(out, tagged("member", &parent.name, member)).await
            }
            ClusterOp::Remove { child } => {
                let cid = self.cid(parent, session, &child, timeout).await?;
                call("remove", json!({"cid": cid})).await?;
                let gone: Vec<NodeId> = self
                    .book()
                    .peers
                    .iter()
                    .filter(|p| {
                        p.parent.as_deref() == Some(&parent.name) && p.cid.as_deref() == Some(&cid)
                    })
                    .map(|p| p.node_id)
                    .collect();
                for id in gone {
                    self.book().remove(id)?;
                }
                emit(
                    out,
                    json!({"kind": "done", "message": format!("removed {cid}")}),
                )
                .await
            }
            ClusterOp::SetBio { child, bio } => {
                let cid = self.cid(parent, session, &child, timeout).await?;
                let member = call("set_bio", json!({"cid": cid, "bio": bio})).await?;
                emit(out, tagged("member", &parent.name, member)).await
            }
            ClusterOp::SetPersona { child, persona } => {
                let cid = self.cid(parent, session, &child, timeout).await?;
                let member = call("set_persona", json!({"cid": cid, "persona": persona})).await?;
                emit(out, tagged("member", &parent.name, member)).await
            }
            ClusterOp::SetMonitoring { child, state } => {
                let cid = self.cid(parent, session, &child, timeout).await?;
                let enabled = state == OnOff::On;
                let mut member =
                    call("set_monitoring", json!({"cid": cid, "enabled": enabled})).await?;
                if enabled {
                    self.bind_child(parent, session, &cid, &member, timeout)
                        .await?;
                    // Bound now: the roster says `on`.
                    let roster = self.roster(parent, session, timeout).await?;
                    if let Some(m) = roster.members.iter().find(|m| m.cid == cid) {
                        member = member_json(m);
                    }
                }
                emit(out, tagged("member", &parent.name, member)).await
            }
            ClusterOp::Introduce { a, b } => {
                let a = self.cid(parent, session, &a, timeout).await?;
                let b = self.cid(parent, session, &b, timeout).await?;
                call("introduce", json!({"peer_a": a, "peer_b": b})).await?;
                let message = format!("{a} and {b} are now each other's contacts");
                emit(out, json!({"kind": "done", "message": message})).await
            }
            ClusterOp::Contact { child } => {
                let cid = self.cid(parent, session, &child, timeout).await?;
                let reply = call("contact", json!({"cid": cid})).await?;
                emit(out, tagged("contact", &parent.name, reply)).await
            }
        }
    }

    /// After `set_monitoring on`: binds the child with the invite its
    /// parent hands over, and adds it to the book.
    async fn bind_child(
        &self,
        parent: &Entry,
        session: &Peer,
        cid: &str,
        member: &Json,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let contact = self
            .call(
                session,
                &parent.name,
                "core.cluster",
                "contact",
                &json!({"cid": cid}),
                timeout,
            )
            .await?;
        let invite: Invite = contact["invite"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Failure::failed("the parent's contact reply has no invite"))?;
        if invite.code.is_some() {
            tokio::time::timeout(timeout, self.node.connect_invite(&invite))
                .await
                .map_err(|_| Failure::new(TIMEOUT, "binding the child: no answer in time"))?
                .map_err(|e| Failure::connect("binding the child", &e))?;
        }
        let child_name = member["name"].as_str().unwrap_or(cid).to_owned();
        let name = {
            let book = self.book();
            let clash = book
                .peers
                .iter()
                .any(|p| p.name == child_name && p.node_id != invite.node_id);
            if clash {
                format!("{}/{child_name}", parent.name)
            } else {
                child_name
            }
        };
        self.book().put(Entry {
            name,
            node_id: invite.node_id,
            addrs: invite.addrs.iter().map(ToString::to_string).collect(),
            parent: Some(parent.name.clone()),
            cid: Some(cid.to_owned()),
        })
    }

    /// Keeps a session with every node in the book and reports the pushes
    /// they send, and the calls this control plane makes, until the output
    /// closes.
    async fn watch(&self, timeout: Duration, out: &Out) -> Result<(), Failure> {
        let mut events = self.node.control_events();
        let mut calls = self.calls.subscribe();
        let mut up: HashSet<NodeId> = HashSet::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let entries = self.book().peers.clone();
                    let connected = self.node.connected_peers();
                    for entry in entries {
                        let now_up = connected.contains(&entry.node_id)
                            || self.reach(&entry, timeout.min(Duration::from_secs(2))).await.is_ok();
                        let was_up = up.contains(&entry.node_id);
                        if now_up != was_up {
                            if now_up {
                                up.insert(entry.node_id);
                            } else {
                                up.remove(&entry.node_id);
                            }
                            let kind = if now_up { "connected" } else { "disconnected" };
                            emit(out, json!({"kind": kind, "peer": entry.name, "node_id": entry.node_id.to_string()})).await?;
                        }
                    }
                }
                event = events.recv() => match event {
                    Ok(ControlEvent::Copy { from, record }) => {
                        let from = self.book().name_of(&from);
                        emit(out, self.copy_json(&from, &record)).await?;
                    }
                    Ok(ControlEvent::Roster { from, roster }) => {
                        let from = self.book().name_of(&from);
                        emit(out, roster_json(&from, &roster)).await?;
                    }
                    Ok(ControlEvent::Task { from, change }) => {
                        let from = self.book().name_of(&from);
                        let submitter = if change.submitter == self.node.id() {
                            "this control plane".to_owned()
                        } else {
                            self.book().name_of(&change.submitter)
                        };
                        emit(out, json!({
                            "kind": "task_changed", "from": from, "task": change.task,
                            "cap": change.cap, "verb": change.verb, "submitter": submitter,
                            "state": change.state.as_str(), "seq": change.seq,
                            "at_ms": change.at_ms, "dropped": change.dropped,
                        })).await?;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        emit(out, json!({"kind": "lagged", "missed": missed})).await?;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                call = calls.recv() => match call {
                    Ok(record) => emit(out, record).await?,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        emit(out, json!({"kind": "lagged", "missed": missed})).await?;
                    }
                    // `self` holds the sender.
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                () = out.closed() => return Ok(()),
            }
        }
    }

    fn copy_json(&self, from: &str, record: &CopyRecord) -> Json {
        let body = if record.truncated {
            Json::Null
        } else {
            cbor_to_json(&record.body).unwrap_or(Json::Null)
        };
        json!({
            "kind": "copy", "from": from, "seq": record.seq, "dropped": record.dropped,
            "dir": match record.dir { capwire::manifest::CopyDirection::In => "in", capwire::manifest::CopyDirection::Out => "out" },
            "peer": self.book().name_of(&record.peer), "peer_id": record.peer.to_string(),
            "at_ms": record.at_ms, "cap": record.cap, "verb": record.verb,
            "req_id": record.req_id, "body": body, "body_len": record.body_len,
            "truncated": record.truncated, "trace": record.trace,
        })
    }
}

/// The root of a `call --trace` (or, under `parent`, the continuation of
/// the caller's trace): the command's own span when an OpenTelemetry
/// export records it (its context then names it as the parent), else a
/// context of its own, a child of `parent` or a new trace.
fn trace_root(
    cap: &str,
    verb: &str,
    parent: Option<&capwire::trace::TraceContext>,
) -> (tracing::Span, capwire::trace::TraceContext) {
    let span = tracing::info_span!(
        target: capwire::trace::SPAN_TARGET,
        "capwire.ctl",
        otel.name = %format_args!("ctl call {cap}/{verb}"),
        otel.kind = "internal",
    );
    if let Some(p) = parent {
        capwire::trace::set_parent(&span, p);
    }
    let cx = span.in_scope(capwire::trace::current).unwrap_or_else(|| {
        parent.map_or_else(
            || capwire::trace::TraceContext::new_root(true),
            capwire::trace::TraceContext::child,
        )
    });
    (span, cx)
}

/// Runs its function with the last count it was given when it drops,
/// unless disarmed.
struct OnDrop<F: FnOnce(u64)>(Option<F>, u64);

impl<F: FnOnce(u64)> OnDrop<F> {
    fn set(&mut self, n: u64) {
        self.1 = n;
    }

    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce(u64)> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(self.1);
        }
    }
}

/// What went wrong with a call, for the watches.
struct Noted {
    /// One word: the peer's error code, or the local reason.
    code: String,
    /// The peer's chokepoint refused it.
    denied: bool,
    message: String,
}

impl Noted {
    /// What `e` says.
    fn of(e: &CallError) -> Noted {
        Noted {
            code: error_code(e),
            denied: matches!(e, CallError::Denied(_)),
            message: e.to_string(),
        }
    }

    /// A failure on this side.
    fn local(code: &str, message: &str) -> Noted {
        Noted {
            code: code.to_owned(),
            denied: false,
            message: message.to_owned(),
        }
    }
}

/// How a call was made, for the watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    Request,
    Notify,
    /// A stream, and how many items it brought.
    Stream(u64),
}

/// Refuses, before anything is sent, a call whose form does not fit the
/// verb's kind in the node's manifest: `--stream` is for stream verbs
/// only, and a stream verb takes nothing else; `--wait` is for task verbs
/// only, and a task verb is not sent as a notification. A verb the
/// manifest does not list is left for the node to refuse (`unknown_verb`).
/// The verb's kind, when the manifest lists it.
fn check_kind(
    peer: &Peer,
    name: &str,
    cap: &str,
    verb: &str,
    stream: bool,
    notify: bool,
    wait: bool,
) -> Result<Option<VerbKind>, Failure> {
    let manifest = peer
        .manifest()
        .ok_or_else(|| Failure::new(UNREACHABLE, format!("{name}: the session ended")))?;
    let Some(kind) = manifest
        .capability(cap)
        .and_then(|c| c.verb(verb))
        .map(|v| v.kind)
    else {
        return Ok(None);
    };
    match kind {
        VerbKind::Task if notify => {
            return Err(Failure::usage(format!(
                "{cap}/{verb} of {name} is a task verb: call it without --notify (its answer is \
                 the task's id)"
            )));
        }
        VerbKind::Task | VerbKind::Stream => {}
        other if wait => {
            return Err(Failure::usage(format!(
                "{cap}/{verb} of {name} is a {other} verb, not a task: --wait is for task verbs"
            )));
        }
        _ => {}
    }
    match (kind, stream) {
        (VerbKind::Stream, false) => Err(Failure::usage(format!(
            "{cap}/{verb} of {name} is a stream verb: call it with --stream{}",
            if notify { " (not --notify)" } else { "" }
        ))),
        (VerbKind::Stream, true) => Ok(Some(kind)),
        (other, true) => Err(Failure::usage(format!(
            "{cap}/{verb} of {name} is a {other} verb, not a stream: call it without --stream{}",
            if other == VerbKind::Notification {
                " (with --notify)"
            } else {
                ""
            }
        ))),
        (_, false) => Ok(Some(kind)),
    }
}

/// JSON args as CBOR; what cannot be mapped is bad input.
fn cbor_args(args: &Json) -> Result<RawValue, Failure> {
    json_to_cbor(args).map_err(|e| Failure::usage(format!("bad args: {e}")))
}

/// The value of `config set`.
fn config_value(text: &str) -> Result<Json, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::usage(format!("the value is not JSON: {e}")))
}

fn tagged(kind: &str, peer: &str, value: Json) -> Json {
    json!({"kind": kind, "peer": peer, "value": value})
}

fn member_json(m: &Member) -> Json {
    serde_json::to_value(m).unwrap_or(Json::Null)
}

pub(crate) fn roster_json(from: &str, roster: &Roster) -> Json {
    json!({
        "kind": "roster", "peer": from, "version": roster.version,
        "members": roster.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

/// A manifest as JSON: keys as hex, every capability with its verbs and
/// their schemas (as JSON, `null` when a verb declares none).
pub(crate) fn manifest_json(m: &Manifest) -> Json {
    let caps: Vec<Json> = m
        .capabilities
        .iter()
        .map(|c| {
            json!({
                "id": c.id.as_str(), "version": c.version.to_string(),
                "verbs": c.verbs.iter().map(|v| json!({
                    "name": v.name.as_str(), "kind": v.kind.to_string(), "class": v.class.to_string(),
                    "args_schema": schema_json(v.args_schema.as_deref()),
                    "result_schema": schema_json(v.result_schema.as_deref()),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "kind": "manifest", "node_id": m.node_id.to_string(), "app_id": m.app_id,
        "name": m.name, "description": m.description, "epoch": m.epoch,
        "monitoring": m.monitoring.to_string(), "capabilities": caps,
    })
}

/// A schema's JSON text as JSON (text that is not JSON as the string it is).
fn schema_json(text: Option<&str>) -> Json {
    text.map_or(Json::Null, |t| {
        serde_json::from_str(t).unwrap_or_else(|_| Json::String(t.to_owned()))
    })
}
