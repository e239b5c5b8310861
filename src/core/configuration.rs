//! `core.configuration`: `get_config` and `set_config` (controller). The
//! configuration is one opaque CBOR item with a version; `set_config`
//! writes it durably, with its answer, before answering, and may
//! compare-and-set on the version. The application watches it through
//! [`ConfigWatch`].

use std::sync::Arc;

use capwire_envelope::{ErrorBody, ErrorCode, RawValue};
use capwire_manifest::{ConfigValue, GetConfig, NoArgs, SetConfig, SetConfigArgs, SetConfigReply};
use tokio::sync::watch;

use crate::core::state::{Core, OnceKey, typed};
use crate::dispatch::extract::{Meta, Sender};
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};
use crate::store::{Batch, ConfigRecord};

/// Watches the node's configuration: each `set_config` that succeeds is
/// seen here once it is durable.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = capwire::Node::builder("app").start().await?;
/// let mut config = node.watch_config();
/// assert_eq!(config.current().version, 0);
/// // ... a control plane calls core.configuration/set_config ...
/// # node.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConfigWatch(pub(crate) watch::Receiver<ConfigValue>);

impl ConfigWatch {
    /// The configuration now (`version` 0 and `null` until first set).
    pub fn current(&self) -> ConfigValue {
        self.0.borrow().clone()
    }

    /// Waits for the next change and returns it; `None` when the node is
    /// gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a change that happened while nobody waited is returned
    /// by the next call.
    pub async fn changed(&mut self) -> Option<ConfigValue> {
        self.0.changed().await.ok()?;
        Some(self.0.borrow_and_update().clone())
    }
}

async fn get_config(_args: NoArgs, Core(core): Core) -> Result<ConfigValue, HandlerError> {
    Ok(core.config())
}

fn conflict(current: u64) -> ErrorBody {
    let mut body = ErrorBody::new(
        ErrorCode::Conflict,
        format!("the configuration is at version {current}"),
    );
    #[derive(serde::Serialize)]
    struct Detail {
        version: u64,
    }
    body.detail = RawValue::encode(&Detail { version: current }).ok();
    body
}

async fn set_config(
    args: SetConfigArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<SetConfigReply, HandlerError> {
    let key = OnceKey::of::<SetConfig>(from, &meta.req_id);
    let c = core.clone();
    core.detached(async move {
        let mut d = c.durable.lock().await;
        if let Some(answer) = c.remembered(&d, &key) {
            return typed(answer);
        }
        let current = d.config.version;
        let result = match args.if_version {
            Some(v) if v != current => Err(conflict(current)),
            _ => Ok(SetConfigReply {
                version: current + 1,
            }),
        };
        let record = ConfigRecord {
            version: current + 1,
            value: args.value.as_bytes().to_vec(),
        };
        let batch = Batch {
            config: result.is_ok().then(|| record.clone()),
            ..Batch::default()
        };
        c.finish(&mut d, &key, batch, &result).await?;
        if result.is_ok() {
            c.publish_config(&mut d, record);
        }
        result.map_err(HandlerError::from)
    })
    .await
}

pub(crate) fn capability() -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(
        capwire_manifest::CORE_CONFIGURATION,
        capwire_manifest::Version::new(1, 0, 0),
    )
    .verb::<GetConfig>(Arc::new(RouteEntry::new(
        Typed::<GetConfig, (Core,), _>::new(get_config),
    )))
    .verb::<SetConfig>(Arc::new(RouteEntry::durable(Typed::<
        SetConfig,
        (Sender, Meta, Core),
        _,
    >::new(set_config))))
}
