//! `core.monitoring`: the bind ceremony (`bind`, bootstrap) and `disable`
//! (controller).

use std::sync::Arc;

use capwire_authz::BindFailure;
use capwire_envelope::{ErrorCode, RawValue};
use capwire_manifest::{BindArgs, BindReply, MonitoringBind, MonitoringDisable, NoArgs};

use crate::handler::{HandlerError, RouteHandler, Sender, Typed};
use crate::node::Node;

async fn bind(args: BindArgs, Sender(from): Sender, node: Node) -> Result<BindReply, HandlerError> {
    let attempt = node
        .inner
        .binding
        .try_bind(&from, &args.code, std::time::Instant::now());
    match attempt {
        Ok(_) => {
            tracing::info!(controller = %from, "bound to a control plane");
            node.inner.manifest_changed();
            // The roster and the configuration come with the cluster and
            // configuration capabilities; until a node has them they are
            // an empty roster at version 0 and no configuration.
            let members = RawValue::encode(&[(); 0]).map_err(internal)?;
            Ok(BindReply {
                manifest: node.manifest(),
                members,
                config: RawValue::null(),
                version: 0,
            })
        }
        Err(failure) => {
            if matches!(failure, BindFailure::TooManyAttempts | BindFailure::Expired) {
                // The pending bind is gone: the manifest's monitoring status
                // changed with it.
                node.inner.manifest_changed();
            }
            let mut err = HandlerError::new(ErrorCode::BindFailed, failure.to_string());
            if let Ok(detail) = RawValue::encode(&failure) {
                err = err.with_detail(detail);
            }
            Err(err)
        }
    }
}

fn internal(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(ErrorCode::Internal, e.to_string())
}

async fn disable(_args: NoArgs, node: Node) -> Result<(), HandlerError> {
    node.unbind();
    Ok(())
}

pub(crate) fn bind_handler() -> RouteHandler {
    Arc::new(Typed::<MonitoringBind, (Sender, Node), _>::new(bind))
}

pub(crate) fn disable_handler() -> RouteHandler {
    Arc::new(Typed::<MonitoringDisable, (Node,), _>::new(disable))
}
