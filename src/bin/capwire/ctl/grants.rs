//! `ctl grant`, `ctl attenuate`, `ctl revoke` and `ctl call --token`:
//! delegated rights (`core.grants`, WIRE.md 5.5) from the command line.

use std::time::{Duration, SystemTime};

use capwire::grants::{GrantPublicKey, Narrowing, Right, narrow, revocation_ids};
use capwire::{NodeId, Peer};
use serde_json::json;

use super::exec::{Ctx, Out, emit};
use crate::exit::Failure;

/// `CAP/VERB` (or `CAP/*` when `whole` is allowed) as a right.
fn right(text: &str, whole: bool) -> Result<Right, Failure> {
    let Some((cap, verb)) = text.split_once('/') else {
        return Err(Failure::usage(format!(
            "--verb {text:?}: write CAP/VERB, e.g. core.configuration/set_config"
        )));
    };
    if !capwire::manifest::cap_id_is_well_formed(cap) {
        return Err(Failure::usage(format!(
            "--verb {text:?}: {cap:?} is not a capability id"
        )));
    }
    if verb == "*" && whole {
        return Ok(Right::cap(cap));
    }
    if !capwire::manifest::verb_is_well_formed(verb) {
        return Err(Failure::usage(format!(
            "--verb {text:?}: {verb:?} is not a verb name"
        )));
    }
    Ok(Right::verb(cap, verb))
}

fn key_of(text: &str) -> Result<GrantPublicKey, Failure> {
    text.parse()
        .map_err(|e| Failure::usage(format!("--to-key {text:?}: {e}")))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Ctx {
    /// The holder `spec` names and its grant key: `--to-key`, else the
    /// one its manifest advertises (reaching it when it is in the book or
    /// given by invite).
    async fn holder(
        &self,
        spec: &str,
        key: Option<&str>,
        timeout: Duration,
    ) -> Result<(NodeId, GrantPublicKey), Failure> {
        if let Some(key) = key {
            let key = key_of(key)?;
            let id = match self.book().resolve(spec) {
                Ok(entry) => entry.node_id,
                Err(_) => NodeId::try_from(spec).map_err(|_| {
                    Failure::usage(format!(
                        "--to {spec:?}: not a name in the book, a node id or an invite"
                    ))
                })?,
            };
            return Ok((id, key));
        }
        let entry = self.book().resolve(spec).map_err(|_| {
            Failure::usage(format!(
                "--to {spec:?}: not a name in the book or an invite; for another node give its \
                 id and --to-key KEY (its `ctl identity` or its manifest's core.grants params)"
            ))
        })?;
        let session = self.reach(&entry, timeout).await?;
        let key = session.grant_key().ok_or_else(|| {
            Failure::failed(format!(
                "{} advertises no grant key (protocol 1?): give --to-key",
                entry.name
            ))
        })?;
        Ok((entry.node_id, key))
    }

    /// `ctl grant`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn grant(
        &self,
        node: &str,
        to: &str,
        to_key: Option<&str>,
        verbs: &[String],
        valid_for: Duration,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let rights = verbs
            .iter()
            .map(|v| right(v, true))
            .collect::<Result<Vec<_>, _>>()?;
        let entry = self.book().resolve(node)?;
        let (holder, holder_key) = self.holder(to, to_key, timeout).await?;
        let session = self.reach(&entry, timeout).await?;
        let token = self
            .node
            .grant(&session, holder, holder_key, rights.clone(), valid_for)
            .await
            .map_err(|e| match e {
                capwire::grants::GrantCallError::Call(e) => {
                    Failure::call(&format!("{} core.grants/info", entry.name), &e)
                }
                e => Failure::failed(e.to_string()),
            })?;
        let ids = revocation_ids(&token).map_err(|e| Failure::failed(e.to_string()))?;
        emit(
            out,
            json!({
                "kind": "grant", "peer": entry.name, "holder": holder.to_string(),
                "verbs": rights.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "expires_ms": unix_ms(SystemTime::now() + valid_for),
                "id": ids.first(), "token": token,
            }),
        )
        .await
    }

    /// `ctl attenuate`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attenuate(
        &self,
        token: &str,
        verbs: &[String],
        valid_for: Option<Duration>,
        to: Option<&str>,
        to_key: Option<&str>,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let verbs = if verbs.is_empty() {
            None
        } else {
            Some(
                verbs
                    .iter()
                    .map(|v| match right(v, false)? {
                        Right::Verb { cap, verb } => Ok((cap, verb)),
                        Right::Cap { .. } => Err(Failure::usage("--verb takes CAP/VERB here")),
                    })
                    .collect::<Result<Vec<_>, Failure>>()?,
            )
        };
        let narrowing = Narrowing {
            verbs,
            expires: valid_for.map(|d| SystemTime::now() + d),
        };
        let bad = |e: capwire::grants::GrantError| Failure::usage(format!("the token: {e}"));
        let (token, holder) = match to {
            Some(to) => {
                let (holder, key) = self.holder(to, to_key, timeout).await?;
                let t = self
                    .node
                    .hand_on(token, holder, key, &narrowing)
                    .map_err(bad)?;
                (t, Some(holder.to_string()))
            }
            None => (narrow(token, &narrowing).map_err(bad)?, None),
        };
        let ids = revocation_ids(&token).map_err(bad)?;
        emit(
            out,
            json!({
                "kind": "grant", "holder": holder, "id": ids.last(),
                "blocks": ids.len(), "token": token,
            }),
        )
        .await
    }

    /// `ctl revoke`.
    pub(super) async fn revoke(
        &self,
        node: &str,
        what: &str,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let id = if what.len() <= 128 && what.bytes().all(|b| b.is_ascii_hexdigit()) {
            what.to_ascii_lowercase()
        } else {
            revocation_ids(what)
                .map_err(|e| Failure::usage(format!("neither a revocation id nor a token: {e}")))?
                .swap_remove(0)
        };
        let entry = self.book().resolve(node)?;
        let session = self.reach(&entry, timeout).await?;
        let info = session
            .revoke_grant(&id)
            .await
            .map_err(|e| Failure::call(&format!("{} core.grants/revoke", entry.name), &e))?;
        emit(
            out,
            json!({
                "kind": "done",
                "message": format!(
                    "revoked {}… at {} ({} revocations kept)",
                    &id[..id.len().min(16)], entry.name, info.revocations
                ),
            }),
        )
        .await
    }

    /// Presents `token` to `session` before `ctl call --token` calls.
    pub(super) async fn present(
        &self,
        session: &Peer,
        name: &str,
        token: &str,
    ) -> Result<(), Failure> {
        session
            .present(token)
            .await
            .map(drop)
            .map_err(|e| Failure::call(&format!("{name} core.grants/present"), &e))
    }
}
