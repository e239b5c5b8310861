//! `core.configuration`: `get_config` and `set_config` (controller). The
//! configuration is one opaque CBOR item with a version; `set_config`
//! writes it durably, with its answer, before answering, and may
//! compare-and-set on the version. The application watches it through
//! [`ConfigWatch`].

use std::sync::Arc;

use capwire_envelope::{ErrorBody, ErrorCode, MAX_DEPTH, RawValue, validate_nested};
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

/// The largest configuration, encoded: `get_config`'s answer then fits in
/// the smallest `max_record` a peer may announce (64 KiB), with room for
/// the response frame around it.
pub(crate) const MAX_CONFIG_BYTES: usize = 63 * 1024;

/// The deepest configuration, in levels of arrays and maps: the bind's
/// answer embeds it two levels down (`result.config.value`), and the
/// profile allows 32 levels in all.
pub(crate) const MAX_CONFIG_DEPTH: usize = MAX_DEPTH - 2;

/// `too_large` or `bad_args` for a configuration a node does not keep.
fn check_value(value: &RawValue) -> Result<(), HandlerError> {
    let len = value.as_bytes().len();
    if len > MAX_CONFIG_BYTES {
        return Err(HandlerError::new(
            ErrorCode::TooLarge,
            format!(
                "a configuration is at most {MAX_CONFIG_BYTES} bytes encoded; this one is {len}"
            ),
        ));
    }
    if validate_nested(value.as_bytes(), MAX_CONFIG_DEPTH).is_err() {
        return Err(HandlerError::new(
            ErrorCode::BadArgs,
            format!("a configuration is nested at most {MAX_CONFIG_DEPTH} levels deep"),
        ));
    }
    Ok(())
}

async fn set_config(
    args: SetConfigArgs,
    Sender(from): Sender,
    meta: Meta,
    Core(core): Core,
) -> Result<SetConfigReply, HandlerError> {
    // Refused before anything is looked up or written: every answer that
    // carries the configuration must be able to.
    check_value(&args.value)?;
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
