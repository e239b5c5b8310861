//! Delegated rights: a control plane lets another node call some of a
//! bound node's controller verbs, for a while, without making it that
//! node's controller (WIRE.md 5.5).
//!
//! A grant is a [biscuit](https://www.biscuitsec.org/) token. The bound
//! control plane mints it ([`Node::grant`]) for one node, one holder, some
//! verbs and an expiry; the holder presents it to the node once per node
//! ([`Peer::present`]) and then calls those verbs as usual; the
//! chokepoint checks the holder against the Noise-authenticated sender,
//! so a stolen token is useless. The holder can hand on a narrower copy
//! to another node ([`Node::hand_on`]); anyone can narrow a copy further
//! ([`narrow`]). The control plane revokes a token or any copy made from
//! it ([`Peer::revoke_grant`]), and a new binding voids every token.
//!
//! ```
//! use std::time::Duration;
//! use capwire::grants::{Narrowing, Right};
//! use capwire::manifest::{GetConfig, NoArgs};
//! use capwire::Node;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = Node::builder("agent-1").listen("127.0.0.1:0".parse()?).start().await?;
//! let addr = node.local_addrs()[0].clone();
//! let control_plane = Node::builder("control-plane").start().await?;
//! let worker = Node::builder("agent-2").start().await?;
//!
//! let to_node = control_plane.connect(&addr, Some(node.id())).await?;
//! to_node.bind(&node.invite(None)?).await?;
//!
//! // The worker is refused the controller verb...
//! let from_worker = worker.connect(&addr, Some(node.id())).await?;
//! assert!(from_worker.request(GetConfig, NoArgs {}).await.is_err());
//!
//! // ...until the control plane grants it, for ten minutes.
//! let token = control_plane
//!     .grant(&to_node, worker.id(), worker.grant_key(),
//!            vec![Right::verb("core.configuration", "get_config")], Duration::from_secs(600))
//!     .await?;
//! from_worker.present(&token).await?;
//! let config = from_worker.request(GetConfig, NoArgs {}).await?;
//! assert_eq!(config.version, 0);
//!
//! // A narrower copy for a third node: the same verb for one minute.
//! let helper = Node::builder("agent-3").start().await?;
//! let narrower = worker.hand_on(&token, helper.id(), helper.grant_key(),
//!     &Narrowing { verbs: None, expires: Some(std::time::SystemTime::now() + Duration::from_secs(60)) })?;
//! let from_helper = helper.connect(&addr, Some(node.id())).await?;
//! from_helper.present(&narrower).await?;
//! assert!(from_helper.request(GetConfig, NoArgs {}).await.is_ok());
//!
//! // Revoking the first token revokes every copy made from it.
//! let ids = capwire::grants::revocation_ids(&token)?;
//! to_node.revoke_grant(&ids[0]).await?;
//! assert!(from_helper.request(GetConfig, NoArgs {}).await.is_err());
//! # for n in [helper, worker, control_plane, node] { n.shutdown().await; }
//! # Ok(()) }
//! ```

use std::time::Duration;

pub use capwire_authz::{
    GRANT_MAX_BLOCKS, GRANT_MAX_LIFETIME, GRANT_MAX_TOKEN, GrantDenied, GrantError, GrantKey,
    GrantPublicKey, GrantSpec, Narrowing, Right, narrow, revocation_ids,
};
use capwire_manifest::{GrantsInfo, GrantsInfoRead, GrantsPresent, GrantsRevoke, NoArgs};
pub use capwire_manifest::{PresentArgs, PresentReply, RevokeArgs};

use crate::{CallError, Node, NodeId, Peer};

/// Why [`Node::grant`] made no token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantCallError {
    /// Asking the node for its binding epoch failed (e.g. `unauthorized`:
    /// the caller is not its control plane).
    #[error("core.grants/info: {0}")]
    Call(#[from] CallError),
    /// The node holds no grant key of this control plane (bound by an
    /// older control plane, or through an older node).
    #[error("the node holds no grant key for this control plane: bind it again")]
    NoGrantKey,
    /// `valid_for` is longer than [`GRANT_MAX_LIFETIME`] (30 days): a node
    /// would refuse the token (`too_long`).
    #[error("a grant is valid for at most 30 days")]
    TooLong,
    /// The token could not be made.
    #[error(transparent)]
    Grant(#[from] GrantError),
}

impl Node {
    /// This node's grant public key: what a control plane names as a
    /// holder's key, and what signs the tokens it mints and hands on.
    pub fn grant_key(&self) -> GrantPublicKey {
        self.rt.core.grants.key().public()
    }

    /// Mints a token that lets `holder` (whose grant key is `holder_key`,
    /// as its `core.grants` params say: [`Peer::grant_key`]) call `rights`
    /// of the node behind `node`, for `valid_for`. This node must be that
    /// node's bound control plane, and the bind must have taken its grant
    /// key ([`GrantCallError::NoGrantKey`] otherwise).
    ///
    /// # Errors
    /// [`GrantCallError`]; [`GrantCallError::TooLong`] for a `valid_for`
    /// over [`GRANT_MAX_LIFETIME`].
    pub async fn grant(
        &self,
        node: &Peer,
        holder: NodeId,
        holder_key: GrantPublicKey,
        rights: Vec<Right>,
        valid_for: Duration,
    ) -> Result<String, GrantCallError> {
        if valid_for > GRANT_MAX_LIFETIME {
            return Err(GrantCallError::TooLong);
        }
        let info = node.request(GrantsInfoRead, NoArgs {}).await?;
        if info.control_plane_key != Some(self.grant_key().to_string()) {
            return Err(GrantCallError::NoGrantKey);
        }
        let spec = GrantSpec {
            node: node.id(),
            epoch: info.epoch,
            holder,
            holder_key,
            rights,
            expires: self.rt.core.grants.clock.now() + valid_for,
        };
        Ok(capwire_authz::mint(self.rt.core.grants.key(), &spec)?)
    }

    /// Hands `token`, held by this node, on to `to` (whose grant key is
    /// `to_key`), narrowed by `narrowing`. Signed with this node's grant
    /// key: only the current holder can hand a token on.
    ///
    /// # Errors
    /// [`GrantError`].
    pub fn hand_on(
        &self,
        token: &str,
        to: NodeId,
        to_key: GrantPublicKey,
        narrowing: &Narrowing,
    ) -> Result<String, GrantError> {
        capwire_authz::delegate(token, self.rt.core.grants.key(), &to, &to_key, narrowing)
    }
}

impl Peer {
    /// The grant key the peer advertises (its `core.grants` params), if a
    /// session is up and it speaks protocol 2.
    pub fn grant_key(&self) -> Option<GrantPublicKey> {
        crate::core::grants::advertised_key(&*self.manifest()?)
    }

    /// Presents a token to the peer: from now on its chokepoint lets this
    /// node's controller calls through as far as the token says, until
    /// it expires, is revoked or the peer's binding changes.
    ///
    /// # Errors
    /// `unauthorized` with the reason in the message and as the detail's
    /// `reason` (`bad_signature`, `wrong_holder`, `expired`, ...);
    /// `unknown_verb` from a protocol-1 peer.
    pub async fn present(&self, token: &str) -> Result<PresentReply, CallError> {
        self.request(
            GrantsPresent,
            PresentArgs {
                token: token.to_owned(),
            },
        )
        .await
    }

    /// Revokes a token block (a revocation id from [`revocation_ids`]) on
    /// the peer, durably. This node must be the peer's control plane.
    ///
    /// # Errors
    /// As [`Peer::request`].
    pub async fn revoke_grant(&self, id: &str) -> Result<GrantsInfo, CallError> {
        self.request(GrantsRevoke, RevokeArgs { id: id.to_owned() })
            .await
    }
}
