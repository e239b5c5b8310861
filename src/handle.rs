//! The narrow handle handlers get on the node they run on.

use std::sync::Arc;
use std::time::Duration;

use capwire_envelope::{ErrorCode, NodeId};
use capwire_manifest::Manifest;

use crate::client::Peer;
use crate::control::Control;
use crate::dispatch::extract::{Context, Extensions, FromContext};
use crate::dispatch::handler::HandlerError;
use crate::net::peers::Peers;

/// What a handler may do with the node it runs on: learn its identity,
/// manifest and control plane, and call other peers. It cannot reach the
/// node's sessions, binding or shutdown.
///
/// ```
/// use capwire::{HandlerError, NodeHandle, Sender};
/// use capwire::manifest::verb;
///
/// verb! { pub struct Whoami: request "app.info" / "whoami", Bootstrap, () => String; }
///
/// async fn whoami(_: (), Sender(from): Sender, node: NodeHandle) -> Result<String, HandlerError> {
///     Ok(format!("{from} asked {}", node.id()))
/// }
/// # let _ = capwire::Capability::new("app.info", "1.0.0").unwrap().handle(Whoami, whoami);
/// ```
#[derive(Clone)]
pub struct NodeHandle {
    id: NodeId,
    peers: Arc<Peers>,
    control: Arc<Control>,
    default_deadline: Duration,
    grant_key: Arc<capwire_authz::GrantKey>,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle").field("id", &self.id).finish()
    }
}

impl NodeHandle {
    pub(crate) fn new(
        id: NodeId,
        peers: Arc<Peers>,
        control: Arc<Control>,
        default_deadline: Duration,
        grant_key: Arc<capwire_authz::GrantKey>,
    ) -> Self {
        Self {
            id,
            peers,
            control,
            default_deadline,
            grant_key,
        }
    }

    /// This node's grant public key (see [`crate::grants`]).
    pub fn grant_key(&self) -> capwire_authz::GrantPublicKey {
        self.grant_key.public()
    }

    /// Hands a grant this node holds on to `to`, narrowed, signed with
    /// this node's grant key ([`Node::hand_on`](crate::Node::hand_on)).
    ///
    /// # Errors
    /// [`GrantError`](capwire_authz::GrantError).
    pub fn hand_on(
        &self,
        token: &str,
        to: NodeId,
        to_key: capwire_authz::GrantPublicKey,
        narrowing: &capwire_authz::Narrowing,
    ) -> Result<String, capwire_authz::GrantError> {
        capwire_authz::delegate(token, &self.grant_key, &to, &to_key, narrowing)
    }

    /// This node's identity.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// This node's manifest.
    pub fn manifest(&self) -> Manifest {
        self.control.manifest()
    }

    /// The control plane this node is bound to, if any.
    pub fn controller(&self) -> Option<NodeId> {
        self.control.binding().controller().copied()
    }

    /// A handle to call `id` (any encoding of the key).
    pub fn peer(&self, id: NodeId) -> Peer {
        Peer::new(
            self.peers.clone(),
            capwire_transport::canonical_node_id(&id),
            self.default_deadline,
        )
    }

    /// The peers with a live session.
    pub fn connected_peers(&self) -> Vec<NodeId> {
        self.peers.connected()
    }

    /// Waits until a session with `id` is up, whoever dials it, or
    /// `deadline`; whether one is.
    pub(crate) async fn wait_any_session(
        &self,
        id: &NodeId,
        deadline: tokio::time::Instant,
    ) -> bool {
        let id = capwire_transport::canonical_node_id(id);
        self.peers.wait_any_session(&id, deadline).await.is_some()
    }
}

impl FromContext for NodeHandle {
    fn from_context(cx: &mut Context) -> Result<Self, HandlerError> {
        cx.runtime::<NodeHandle>().ok_or_else(|| {
            HandlerError::new(ErrorCode::Internal, "the node handle is not installed")
        })
    }

    fn check(extensions: &Extensions) -> Result<(), String> {
        extensions
            .runtime::<NodeHandle>()
            .map(|_| ())
            .ok_or_else(|| "the node handle is not installed".to_owned())
    }
}
