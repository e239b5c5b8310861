//! `core.monitoring`: the bind ceremony (`bind`, bootstrap), `disable`
//! (controller), `status` (bootstrap), the monitoring copies a bound node
//! sends its control plane, and `copy` (bootstrap), where a control plane
//! receives them.

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{FrameRef, RawValue, decode_frame};
use capwire_manifest::{
    BindArgs, BindReply, CopyDirection, CopyRecord, MonitoringBind, MonitoringCopy,
    MonitoringDisable, MonitoringStatusRead, MonitoringStatusReply, NoArgs,
};
use tokio_util::sync::CancellationToken;

use crate::core::events::ControlEvent;
use crate::core::state::{Core, CoreState, config_value};
use crate::dispatch::extract::Sender;
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::tap::{Tapped, Way};

/// How long one copy may wait for the control plane's session.
const COPY_DEADLINE: Duration = Duration::from_secs(5);

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

fn internal(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(capwire_envelope::ErrorCode::Internal, e.to_string())
}

async fn bind(
    args: BindArgs,
    Sender(from): Sender,
    Core(core): Core,
) -> Result<BindReply, HandlerError> {
    // The binding changes at once (on the handler's first poll, in order
    // with the envelopes around it); the answer waits until it is written.
    let binding = core
        .control
        .try_bind(&from, &args.code, now())
        .map_err(|f| HandlerError::from(f.error_body()))?;
    core.tap.set_controller(binding.controller().copied());
    let c = core.clone();
    core.detached(async move {
        let d = c.durable.lock().await;
        if let Err(e) = c.save_binding().await {
            // Not written: not bound.
            if c.control.binding().is_controller(&from) {
                c.control.unbind(now());
                c.tap.set_controller(None);
            }
            return Err(e);
        }
        let roster = d.roster.view();
        Ok(BindReply {
            manifest: c.control.manifest(),
            members: RawValue::encode(&roster.members).map_err(internal)?,
            config: RawValue::encode(&config_value(&d.config)).map_err(internal)?,
            version: roster.version,
        })
    })
    .await
}

async fn disable(_args: NoArgs, Core(core): Core) -> Result<(), HandlerError> {
    // Unbound at once: envelopes queued behind this one see it.
    core.control.unbind(now());
    core.tap.set_controller(None);
    let c = core.clone();
    core.detached(async move {
        let _d = c.durable.lock().await;
        c.save_binding().await
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
    let _ = core.events.send(ControlEvent::Copy { from, record });
    Ok(())
}

impl CoreState {
    /// Unbinds the control plane, durably; returns the one that was bound.
    pub(crate) async fn unbind(&self) -> Result<Option<capwire_envelope::NodeId>, HandlerError> {
        let previous = self.control.unbind(now());
        self.tap.set_controller(None);
        if previous.is_some() {
            let _d = self.durable.lock().await;
            self.save_binding().await?;
        }
        Ok(previous)
    }
}

pub(crate) fn bind_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(
        Typed::<MonitoringBind, (Sender, Core), _>::new(bind),
    ))
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
    let truncated = item.cut.is_some() || c.args.len() > body_max;
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
    })
}

/// Sends the tapped frames to the control plane, in order, until `stop`.
/// A copy that cannot be sent (no session within [`COPY_DEADLINE`], queue
/// full) is dropped; the next one delivered says how many were. The
/// control plane is seldom one of the node's contacts (it dials the
/// node), so a copy waits for its session whoever dials, rather than
/// being dropped while the control plane reconnects.
pub(crate) async fn copy_loop(core: Arc<CoreState>, stop: CancellationToken) {
    // Per control plane: the last seq it was sent.
    let mut last: Option<(capwire_envelope::NodeId, u64)> = None;
    loop {
        let Some((cp, base, item)) = core.tap.pop() else {
            tokio::select! {
                () = stop.cancelled() => return,
                () = core.tap.ready() => continue,
            }
        };
        // A copy taken for a control plane that is no longer bound is not
        // sent to it.
        if core.control.binding().controller() != Some(&cp) {
            core.tap.count_dropped(1);
            continue;
        }
        let previous = match last {
            Some((c, seq)) if c == cp => seq.max(base),
            _ => base,
        };
        let dropped = item.seq.saturating_sub(previous).saturating_sub(1);
        let Some(record) = copy_of(&item, dropped, core.limits.copy_body_max) else {
            core.tap.count_dropped(1);
            continue;
        };
        let peer = core.handle.peer(cp);
        let deadline = tokio::time::Instant::now() + COPY_DEADLINE;
        let send = async {
            core.handle.wait_any_session(&cp, deadline).await;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            peer.notify_within(MonitoringCopy, record, left).await
        };
        tokio::select! {
            () = stop.cancelled() => return,
            sent = send => match sent {
                Ok(()) => {
                    core.tap.count_sent();
                    last = Some((cp, item.seq));
                }
                Err(e) => {
                    core.tap.count_dropped(1);
                    tracing::debug!(error = %e, seq = item.seq, "monitoring copy dropped");
                }
            },
        }
    }
}
