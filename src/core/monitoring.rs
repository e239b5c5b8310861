//! `core.monitoring`: the bind ceremony (`bind`, bootstrap) and `disable`
//! (controller). Registered like any capability; its handlers reach the
//! node only through the narrow [`ControlHandle`].

use std::sync::Arc;

use capwire_envelope::RawValue;
use capwire_manifest::{BindArgs, BindReply, MonitoringBind, MonitoringDisable, NoArgs};

use crate::control::Control;
use crate::dispatch::extract::Sender;
use crate::dispatch::extract::{Context, Extensions, FromContext};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};

/// The node's binding and manifest, as the core capabilities see them.
#[derive(Clone)]
pub(crate) struct ControlHandle(pub(crate) Arc<Control>);

impl FromContext for ControlHandle {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        cx.runtime::<ControlHandle>().ok_or_else(|| {
            HandlerError::new(
                capwire_envelope::ErrorCode::Internal,
                "the control handle is not installed",
            )
        })
    }

    fn check(extensions: &Extensions) -> Result<(), String> {
        extensions
            .runtime::<ControlHandle>()
            .map(|_| ())
            .ok_or_else(|| "the control handle is not installed".to_owned())
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

async fn bind(
    args: BindArgs,
    Sender(from): Sender,
    ControlHandle(control): ControlHandle,
) -> Result<BindReply, HandlerError> {
    match control.try_bind(&from, &args.code, now()) {
        Ok(_) => {
            // The roster and the configuration come with the cluster and
            // configuration capabilities; until a node has them they are
            // an empty roster at version 0 and no configuration.
            let members = RawValue::encode(&[(); 0]).map_err(|e| {
                HandlerError::new(capwire_envelope::ErrorCode::Internal, e.to_string())
            })?;
            Ok(BindReply {
                manifest: control.manifest(),
                members,
                config: RawValue::null(),
                version: 0,
            })
        }
        Err(failure) => Err(HandlerError::from(failure.error_body())),
    }
}

async fn disable(_args: NoArgs, ControlHandle(control): ControlHandle) -> Result<(), HandlerError> {
    control.unbind(now());
    Ok(())
}

pub(crate) fn bind_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(Typed::<
        MonitoringBind,
        (Sender, ControlHandle),
        _,
    >::new(bind)))
}

pub(crate) fn disable_handler() -> RouteHandler {
    Arc::new(RouteEntry::new(Typed::<
        MonitoringDisable,
        (ControlHandle,),
        _,
    >::new(disable)))
}
