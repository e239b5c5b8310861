//! `core.monitoring`: the bind ceremony (`bind`, bootstrap), `disable`
//! (controller), `status` (bootstrap), the monitoring copies a bound node
//! sends its control plane, and `copy` (bootstrap), where a control plane
//! receives them.

use std::sync::Arc;
use std::time::Duration;

use capwire_authz::{BindUndo, Binding, Refused};
use capwire_envelope::{
    ErrorBody, ErrorCode, FrameRef, MAX_DEPTH, NodeId, PROTOCOL_V2, PROTOCOL_V3, RawValue,
    decode_frame, validate_nested,
};
use capwire_manifest::{
    BindArgs, BindReply, ConfigValue, CopyDirection, CopyRecord, Manifest, MonitoringBind,
    MonitoringCopy, MonitoringDisable, MonitoringStatus, MonitoringStatusRead,
    MonitoringStatusReply, NoArgs, Roster as RosterView,
};
use tokio_util::sync::CancellationToken;

use crate::core::events::ControlEvent;
use crate::core::state::{Core, CoreState, Durable, config_value};
use crate::dispatch::extract::{Channel, Sender};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::tap::{Tapped, Way};

/// How long one copy may wait for the control plane's session.
const COPY_DEADLINE: Duration = Duration::from_secs(5);

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// What a response frame adds around its result, at most: the frame map,
/// its `type`, `req_id` (64 bytes at most) and `ok` keys.
pub(crate) const RESPONSE_OVERHEAD: usize = 128;

/// The answer to a bind from its parts, checked: `too_large` when it would
/// not fit in a frame of `room` bytes (or in the profile), so that a bind
/// that could not be answered is refused instead of made.
fn bind_reply(
    manifest: Manifest,
    roster: &RosterView,
    config: &ConfigValue,
    room: usize,
) -> Result<BindReply, ErrorBody> {
    let too_large = |e: String| ErrorBody::new(ErrorCode::TooLarge, e);
    let reply = BindReply {
        manifest,
        members: RawValue::encode(&roster.members)
            .map_err(|e| too_large(format!("the roster does not encode: {e}")))?,
        config: RawValue::encode(config)
            .map_err(|e| too_large(format!("the configuration does not encode: {e}")))?,
        version: roster.version,
    };
    let len = RawValue::encode(&reply)
        .map_err(|e| too_large(format!("the answer to the bind does not encode: {e}")))?
        .as_bytes()
        .len();
    if len.saturating_add(RESPONSE_OVERHEAD) > room {
        return Err(too_large(format!(
            "the answer to the bind (the manifest, roster and configuration: {len} bytes) \
             is larger than the {room} bytes a frame to the control plane may have"
        )));
    }
    Ok(reply)
}

/// The answer a bind by the control plane of `next` would get, from what
/// the node holds now (the manifest as the bind makes it, the roster with
/// children watched for another control plane `off`).
fn precheck(
    mut manifest: Manifest,
    mut roster: RosterView,
    config: &ConfigValue,
    current: Option<NodeId>,
    next: &Binding,
    room: usize,
) -> Result<(), ErrorBody> {
    manifest.monitoring = MonitoringStatus::On;
    manifest.epoch = manifest.epoch.saturating_add(1);
    if next.controller() != current.as_ref() {
        let mut changed = false;
        for m in &mut roster.members {
            changed |= m.monitoring != MonitoringStatus::Off;
            m.monitoring = MonitoringStatus::Off;
        }
        roster.version += u64::from(changed);
    }
    bind_reply(manifest, &roster, config, room).map(drop)
}

async fn bind(
    args: BindArgs,
    Sender(from): Sender,
    channel: Channel,
    Core(core): Core,
) -> Result<BindReply, HandlerError> {
    // The binding changes at once (on the handler's first poll, in order
    // with the envelopes around it), but only once the code is right and
    // an answer is known to fit; the answer waits until the bind is
    // written, and a bind that cannot be written or answered is undone.
    // The answer carries the manifest as this session shows it (a
    // version-1 peer is not shown stream verbs: WIRE.md 4.1).
    let room = channel.reply_room;
    let view = move |m: Manifest| {
        if channel.version < PROTOCOL_V2 && m.has_protocol_2_verbs() {
            m.version_1_view()
        } else if channel.version < PROTOCOL_V3 {
            m.version_2_view()
        } else {
            m
        }
    };
    let (manifest, roster, config) = (view(core.control.manifest()), core.roster(), core.config());
    let current = core.control.binding().controller().copied();
    let (_, undo) = core
        .control
        .try_bind_checked(&from, &args.code, now(), |next| {
            precheck(manifest, roster, &config, current, next, room)
        })
        .map_err(|refused| match refused {
            Refused::Failed(f) => HandlerError::from(f.error_body()),
            Refused::Check(body) => HandlerError::from(body),
        })?;
    // The control plane's grant key, from the manifest it advertises on
    // this authenticated session, is kept with the binding.
    core.binding_moved(core.advertised_grant_key(&from));
    let c = core.clone();
    core.detached(async move {
        let mut d = c.durable.lock().await;
        let change = c.binding_change(&d);
        let completed = match bind_reply(
            view(c.control.manifest()),
            &change.roster(&d),
            &config_value(&d.config),
            room,
        ) {
            Ok(reply) => c.commit_binding(&mut d, change).await.map(|()| reply),
            Err(body) => Err(HandlerError::from(body)),
        };
        if completed.is_err() {
            // Not written, or not answerable: not bound.
            c.undo_binding(undo);
        }
        completed
    })
    .await
}

async fn disable(_args: NoArgs, Core(core): Core) -> Result<(), HandlerError> {
    // Unbound at once: envelopes queued behind this one see it.
    let undo = core.control.unbind(now()).map(|(_, undo)| undo);
    core.binding_moved(None);
    let c = core.clone();
    core.detached(async move {
        let mut d = c.durable.lock().await;
        c.save_unbinding(&mut d, undo).await
    })
    .await
}

async fn status(
    _args: NoArgs,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<MonitoringStatusReply, HandlerError> {
    Ok(MonitoringStatusReply {
        monitoring: core.control.manifest().monitoring,
        you_are_controller: core.control.binding().is_controller(&from),
        copy_seq: core.tap.last_seq(),
    })
}

async fn copy(
    record: CopyRecord,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<(), HandlerError> {
    // No receiver (nobody watches) is not an error.
    core.push_event(ControlEvent::Copy { from, record });
    Ok(())
}

impl CoreState {
    /// Unbinds the control plane, durably; returns the one that was bound.
    pub(crate) async fn unbind(&self) -> Result<Option<NodeId>, HandlerError> {
        let Some((previous, undo)) = self.control.unbind(now()) else {
            return Ok(None);
        };
        self.binding_moved(None);
        let mut d = self.durable.lock().await;
        self.save_unbinding(&mut d, Some(undo)).await?;
        Ok(Some(previous))
    }

    /// Writes an unbind made with `undo`; when it cannot be written, the
    /// control plane is bound again (an error changes nothing).
    async fn save_unbinding(
        &self,
        d: &mut Durable,
        undo: Option<BindUndo>,
    ) -> Result<(), HandlerError> {
        let saved = self.save_binding(d).await;
        if saved.is_err()
            && let Some(undo) = undo
        {
            self.undo_binding(undo);
        }
        saved
    }

    /// What follows every change of the binding: monitoring copies go to
    /// the control plane bound now, and the grant state follows it (`key`
    /// is its grant key; every earlier token and revocation is void).
    fn binding_moved(&self, key: Option<capwire_authz::GrantPublicKey>) {
        let binding = self.control.binding();
        self.tap.set_controller(binding.controller().copied());
        self.grants.moved(binding.epoch(), key);
    }

    /// Undoes a binding change that could not be completed: the control
    /// plane bound before it is bound again (under a new epoch), with the
    /// grant key its own bind took, so that it can mint again.
    fn undo_binding(&self, undo: BindUndo) {
        if !self.control.undo_bind(undo, now()) {
            return;
        }
        let binding = self.control.binding();
        // Its epoch before the change that was undone: two epochs back.
        let key = binding
            .controller()
            .and_then(|_| self.grants.controller_key(binding.epoch().wrapping_sub(2)));
        self.binding_moved(key);
    }
}

pub(crate) fn bind_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(Typed::<
        MonitoringBind,
        (Sender, Channel, Core),
        _,
    >::new(bind)))
}

pub(crate) fn disable_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(
        Typed::<MonitoringDisable, (Core,), _>::new(disable),
    ))
}

pub(crate) fn status_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(Typed::<
        MonitoringStatusRead,
        (Sender, Core),
        _,
    >::new(status)))
}

pub(crate) fn copy_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(
        Typed::<MonitoringCopy, (Sender, Core), _>::new(copy),
    ))
}

/// The copy a tapped frame becomes; `None` for a frame that is not a
/// control envelope.
fn copy_of(item: &Tapped, dropped: u64, body_max: usize) -> Option<CopyRecord> {
    let Ok(FrameRef::Control(c)) = decode_frame(&item.frame) else {
        return None;
    };
    let body_len = item.cut.unwrap_or(c.args.len() as u64);
    // The record embeds the body one level down: args nested as deep as a
    // frame allows would break the profile there, and are left out as a
    // long body is (a deep item is at least as long as it is deep).
    let too_deep = c.args.len() >= MAX_DEPTH && validate_nested(c.args, MAX_DEPTH - 1).is_err();
    let truncated = item.cut.is_some() || c.args.len() > body_max || too_deep;
    let body = if truncated {
        RawValue::null()
    } else {
        // The frame was validated when it was decoded or encoded.
        RawValue::dangerous_from_validated(item.frame.slice_ref(c.args))
    };
    Some(CopyRecord {
        seq: item.seq,
        dropped,
        dir: match item.way {
            Way::In => CopyDirection::In,
            Way::Out => CopyDirection::Out,
        },
        peer: item.peer,
        at_ms: item.at_ms,
        cap: c.cap.to_owned(),
        verb: c.verb.to_owned(),
        req_id: c.req_id.as_str().to_owned(),
        body,
        body_len,
        truncated,
        grant: item.grant.as_deref().map(str::to_owned),
        trace: c
            .trace
            .filter(|_| item.traced)
            .and_then(|t| crate::trace::TraceContext::from_item(t).ok())
            .map(|cx| cx.trace_id_hex()),
    })
}

/// Sends the tapped frames to the control plane, in order, until `stop`.
/// A copy that cannot be sent (no session within [`COPY_DEADLINE`], queue
/// full) is dropped; the next one delivered says how many were. The
/// control plane is seldom one of the node's contacts (it dials the
/// node), so a copy waits for its session whoever dials, rather than
/// being dropped while the control plane reconnects. A copy goes out only
/// under the binding it was taken for: the binding is checked again at the
/// moment the copy enters the session's queue, so a control plane unbound
/// while the copy waited never gets it.
pub(crate) async fn copy_loop(core: Arc<CoreState>, stop: CancellationToken) {
    // Per control plane: the last seq it was sent.
    let mut last: Option<(NodeId, u64)> = None;
    loop {
        let Some((cp, base, item)) = core.tap.pop() else {
            tokio::select! {
                () = stop.cancelled() => return,
                () = core.tap.ready() => continue,
            }
        };
        // A copy taken for a control plane that is no longer bound is not
        // sent to it.
        let binding = core.control.binding();
        if binding.controller() != Some(&cp) {
            core.tap.count_dropped(1);
            continue;
        }
        let previous = match last {
            Some((c, seq)) if c == cp => seq.max(base),
            _ => base,
        };
        let dropped = item.seq.saturating_sub(previous).saturating_sub(1);
        let Some(mut record) = copy_of(&item, dropped, core.limits.copy_body_max) else {
            core.tap.count_dropped(1);
            continue;
        };
        let peer = core.handle.peer(cp);
        let deadline = tokio::time::Instant::now() + COPY_DEADLINE;
        let send = async {
            core.handle.wait_any_session(&cp, deadline).await;
            // A control plane below protocol 3 knows no `trace` field.
            if record.trace.is_some() && peer.version() < capwire_envelope::PROTOCOL_V3 {
                record.trace = None;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            peer.notify_if(MonitoringCopy, record, left, || {
                core.control.binding().epoch() == binding.epoch()
            })
            .await
        };
        tokio::select! {
            () = stop.cancelled() => return,
            sent = send => match sent {
                Ok(true) => {
                    core.tap.count_sent();
                    last = Some((cp, item.seq));
                }
                Ok(false) => {
                    core.tap.count_dropped(1);
                    tracing::debug!(seq = item.seq, "monitoring copy dropped: the binding changed");
                }
                Err(e) => {
                    core.tap.count_dropped(1);
                    tracing::debug!(error = %e, seq = item.seq, "monitoring copy dropped");
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A tapped request carrying a valid trace context, `traced` as the
    /// dispatcher judged it.
    fn tapped(traced: bool) -> (Tapped, crate::trace::TraceContext) {
        let cx = crate::trace::TraceContext::new_root(true);
        let frame = crate::proto::codec::control(
            "app.x",
            "y",
            &capwire_envelope::ReqId::from_u64(1),
            None,
            &RawValue::null(),
            Some(&cx.to_item()),
        )
        .unwrap();
        let item = Tapped {
            seq: 1,
            way: Way::In,
            peer: capwire_envelope::NodeId::from_bytes([7; 32]),
            at_ms: 0,
            frame,
            cut: None,
            grant: None,
            traced,
        };
        (item, cx)
    }

    #[test]
    fn a_copy_names_a_believed_context_and_never_a_dropped_one() {
        let (believed, cx) = tapped(true);
        let copy = copy_of(&believed, 0, 1024).unwrap();
        assert_eq!(copy.trace, Some(cx.trace_id_hex()));
        // Came on a session below protocol 3: the node dropped it, and the
        // copy does not show it either.
        let (dropped, _) = tapped(false);
        assert_eq!(copy_of(&dropped, 0, 1024).unwrap().trace, None);
    }
}
