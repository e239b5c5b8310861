//! `core.monitoring`: the bind ceremony (`bind`, bootstrap) and `disable`
//! (controller).

use std::sync::Arc;

use capwire_envelope::{ErrorCode, RawValue};
use capwire_manifest::{BindArgs, MonitoringBind, MonitoringDisable, NoArgs};

use crate::handler::{HandlerError, RouteHandler, Sender, Typed};
use crate::node::Node;

async fn bind(args: BindArgs, Sender(from): Sender, node: Node) -> Result<(), HandlerError> {
    let attempt = node
        .inner
        .binding
        .try_bind(&from, &args.code, std::time::Instant::now());
    match attempt {
        Ok(_) => {
            tracing::info!(controller = %from, "bound to a control plane");
            node.inner.manifest_changed();
            Ok(())
        }
        Err(failure) => {
            let mut err = HandlerError::new(ErrorCode::BindFailed, failure.to_string());
            if let Ok(detail) = RawValue::encode(&failure) {
                err = err.with_detail(detail);
            }
            Err(err)
        }
    }
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
