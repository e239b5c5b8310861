//! `core.protocol` (bootstrap): the wire protocol versions this node
//! speaks. Its presence in the manifest, at version `3.0.0`, is how the
//! node's first hello tells a peer that it speaks protocols 2 and 3 as
//! well
//! (WIRE.md 4.1); `versions` answers the list.

use std::sync::Arc;

use capwire_envelope::{PROTOCOL_V3, PROTOCOL_VERSION};
use capwire_manifest::{NoArgs, ProtocolVersions, VersionsReply};

use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, Typed};

async fn versions(_args: NoArgs) -> Result<VersionsReply, HandlerError> {
    Ok(VersionsReply {
        versions: (PROTOCOL_VERSION..=PROTOCOL_V3).collect(),
    })
}

pub(crate) fn capability() -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(
        capwire_manifest::CORE_PROTOCOL,
        // The major version is the highest protocol version spoken.
        capwire_manifest::Version::new(u64::from(PROTOCOL_V3), 0, 0),
    )
    .verb::<ProtocolVersions>(Arc::new(RouteEntry::new(
        Typed::<ProtocolVersions, (), _>::new(versions),
    )))
}
