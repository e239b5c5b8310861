//! `ctl audit`: reads a node's audit log (`core.audit`, WIRE.md 5.6),
//! checks its signed checkpoint against the one this control plane kept
//! for the node (a smaller size, another root at the same size, or a
//! consistency proof that fails is a rewritten log: exit code 9), and with
//! `--entries` checks every kept entry against the checkpoint. The last
//! verified checkpoint of each node is kept in `checkpoints/<node id>.note` in
//! the control plane's state directory (its own node's audit log is
//! beside it, in `audit/`).

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::Duration;

use capwire::files::Replace;
use capwire::manifest::{
    AuditCheckpoint, AuditEntries, AuditProve, CORE_AUDIT, EntriesArgs, MAX_ENTRIES_PER_CALL,
    NoArgs, ProveArgs,
};
use capwire::{NodeId, Peer};
use capwire_audit::{Checkpoint, Frontier, Hash, NoteVerifier, leaf_hash};
use serde_json::json;

use super::exec::{Ctx, Out, emit};
use crate::exit::{Failure, REWRITTEN};

fn hex32(text: &str) -> Result<Hash, Failure> {
    let mut out = [0u8; 32];
    base16ct::lower::decode(text, &mut out)
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| Failure::failed(format!("a proof hash is not 64 hex digits: {text:?}")))?;
    Ok(out)
}

fn rewritten(name: &str, what: String) -> Failure {
    Failure::new(
        REWRITTEN,
        format!("the audit log of {name} was rewritten: {what}"),
    )
    .because("rewritten")
}

/// The ranges of the siblings on leaf `index`'s path in a tree of `n`
/// leaves, deepest first: the order of an RFC 6962 inclusion proof.
fn path_ranges(index: u64, n: u64) -> Vec<(u64, u64)> {
    let (mut lo, mut hi) = (0, n);
    let mut out = Vec::new();
    while hi - lo > 1 {
        // The largest power of two below the range's length.
        let mut k = 1;
        while k * 2 < hi - lo {
            k *= 2;
        }
        if index < lo + k {
            out.push((lo + k, hi));
            hi = lo + k;
        } else {
            out.push((lo, lo + k));
            lo += k;
        }
    }
    out.reverse();
    out
}

/// RFC 6962's MTH of `leaves`.
fn mth(leaves: &[Hash]) -> Hash {
    let mut f = Frontier::new();
    for l in leaves {
        f.push(*l);
    }
    f.root()
}

impl Ctx {
    fn audit_file(&self, id: &NodeId) -> PathBuf {
        self.dir().join("checkpoints").join(format!("{id}.note"))
    }

    /// `ctl audit PEER [--entries] [--dump FILE]`.
    pub(super) async fn audit(
        &self,
        node: &str,
        entries: bool,
        dump: Option<PathBuf>,
        timeout: Duration,
        out: &Out,
    ) -> Result<(), Failure> {
        let entry = self.book().resolve(node)?;
        let name = entry.name.clone();
        let session = self.reach(&entry, timeout).await?;
        let vkey = session
            .manifest()
            .and_then(|m| m.capability(CORE_AUDIT).and_then(|c| c.params.clone()))
            .ok_or_else(|| {
                Failure::failed(format!(
                    "{name} keeps no audit log it shows (it speaks protocol 2 or older, or its log is off)"
                ))
            })?;
        let verifier = NoteVerifier::parse(&vkey)
            .map_err(|e| Failure::failed(format!("{name}'s audit key {vkey:?}: {e}")))?;
        if verifier.name() != format!("capwire.audit/{}", entry.node_id) {
            return Err(rewritten(
                &name,
                format!("its audit key names {:?}", verifier.name()),
            ));
        }
        let doing = |verb: &str| format!("{name} core.audit/{verb}");
        let reply = session
            .request_within(AuditCheckpoint, NoArgs {}, timeout)
            .await
            .map_err(|e| Failure::call(&doing("checkpoint"), &e))?;
        let cp = verifier
            .verify(&reply.note)
            .map_err(|e| rewritten(&name, format!("its checkpoint does not verify: {e}")))?;
        if cp.size != reply.size {
            return Err(rewritten(
                &name,
                "the checkpoint's size is not the one it says".into(),
            ));
        }
        // The checkpoint kept from before, verified again with the same key.
        let file = self.audit_file(&entry.node_id);
        let kept: Option<(String, Checkpoint)> = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| verifier.verify(&t).ok().map(|c| (t, c)));
        let mut consistency = Vec::new();
        let status = match &kept {
            None => "first",
            Some((_, old)) if old.size > cp.size => {
                return Err(rewritten(
                    &name,
                    format!(
                        "rolled back or truncated: {} entries now, {} at the last check",
                        cp.size, old.size
                    ),
                ));
            }
            Some((_, old)) if old.size == cp.size => {
                if old.root != cp.root {
                    return Err(rewritten(
                        &name,
                        format!("forked: two checkpoints of {} entries disagree", cp.size),
                    ));
                }
                "unchanged"
            }
            Some((_, old)) if old.size == 0 => "consistent",
            // No proof joins a size the node has pruned past (WIRE.md 5.6).
            Some((_, old)) if old.size < reply.pruned => "pruned past the last check",
            Some((_, old)) => {
                let proof = session
                    .request_within(
                        AuditProve,
                        ProveArgs {
                            size: cp.size,
                            index: None,
                            from: Some(old.size),
                        },
                        timeout,
                    )
                    .await
                    .map_err(|e| Failure::call(&doing("prove"), &e))?;
                let hashes = proof
                    .proof
                    .iter()
                    .map(|h| hex32(h))
                    .collect::<Result<Vec<_>, _>>()?;
                capwire_audit::verify_consistency(old.size, cp.size, &old.root, &cp.root, &hashes)
                    .map_err(|e| {
                        rewritten(
                            &name,
                            format!(
                                "{} entries do not extend the {} checked before: {e}",
                                cp.size, old.size
                            ),
                        )
                    })?;
                consistency.push(json!({"from": old.size, "size": cp.size, "proof": proof.proof}));
                "consistent"
            }
        };
        let mut items = Vec::new();
        let mut inclusion = Vec::new();
        if entries && cp.size > reply.pruned {
            let leaves = self
                .audit_entries(
                    &session,
                    reply.pruned,
                    cp.size,
                    timeout,
                    &doing("entries"),
                    dump.is_some().then_some(&mut items),
                )
                .await?;
            self.audit_check_leaves(
                &session,
                &name,
                &cp,
                reply.pruned,
                &leaves,
                timeout,
                &mut inclusion,
            )
            .await?;
        }
        // Only a checked checkpoint is kept.
        let dir = self.dir().join("checkpoints");
        let leaf = format!("{}.note", entry.node_id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| {
                capwire::files::write_private(&dir, &leaf, reply.note.as_bytes(), Replace::Always)
            })
            .map_err(|e| {
                Failure::failed(format!(
                    "cannot keep the checkpoint in {}: {e}",
                    file.display()
                ))
            })?;
        if let Some(path) = dump {
            let mut notes: Vec<&str> = kept.iter().map(|(t, _)| t.as_str()).collect();
            notes.push(&reply.note);
            let doc = json!({
                "node_id": entry.node_id.to_string(),
                "vkey": vkey,
                "checkpoints": notes,
                "pruned": reply.pruned,
                "entries": items,
                "inclusion": inclusion,
                "consistency": consistency,
            });
            std::fs::write(&path, doc.to_string())
                .map_err(|e| Failure::failed(format!("cannot write {}: {e}", path.display())))?;
        }
        emit(
            out,
            json!({
                "kind": "audit",
                "node": name,
                "size": cp.size,
                "pruned": reply.pruned,
                "status": status,
                "entries_checked": if entries { cp.size - reply.pruned.min(cp.size) } else { 0 },
                "message": format!(
                    "{name}: {} audit entries, signed; {status}{}",
                    cp.size,
                    if entries { ", every kept entry checked" } else { "" }
                ),
            }),
        )
        .await
    }

    /// Reads entries `from..to` (keeping them in `items` for a dump, when
    /// asked); their leaf hashes.
    async fn audit_entries(
        &self,
        session: &Peer,
        from: u64,
        to: u64,
        timeout: Duration,
        doing: &str,
        mut items: Option<&mut Vec<serde_json::Value>>,
    ) -> Result<Vec<Hash>, Failure> {
        let mut leaves = Vec::with_capacity(usize::try_from(to - from).unwrap_or(0));
        let mut next = from;
        while next < to {
            let end = to.min(next + MAX_ENTRIES_PER_CALL);
            let mut stream = session
                .stream_within(
                    AuditEntries,
                    EntriesArgs {
                        from: next,
                        to: end,
                    },
                    timeout,
                )
                .await
                .map_err(|e| Failure::call(doing, &e))?;
            while let Some(item) = stream.next().await {
                let item = item.map_err(|e| Failure::call(doing, &e))?;
                if item.index != next {
                    return Err(Failure::failed(format!(
                        "{doing}: entry {} came where {next} was due",
                        item.index
                    )));
                }
                let bytes = base16ct::lower::decode_vec(&item.entry)
                    .map_err(|_| Failure::failed(format!("{doing}: entry {next} is not hex")))?;
                leaves.push(leaf_hash(&bytes));
                if let Some(items) = items.as_mut() {
                    items.push(json!({"index": item.index, "entry": item.entry}));
                }
                next += 1;
            }
            if next < end {
                return Err(Failure::failed(format!(
                    "{doing}: the stream ended at {next} of {end}"
                )));
            }
        }
        Ok(leaves)
    }

    /// Checks that `leaves` (entries `first..cp.size`) are the checkpoint's:
    /// the whole tree's root when nothing was pruned; otherwise the first
    /// kept entry's inclusion proof, whose right-hand siblings must be the
    /// roots of the kept leaves.
    #[allow(clippy::too_many_arguments)]
    async fn audit_check_leaves(
        &self,
        session: &Peer,
        name: &str,
        cp: &Checkpoint,
        first: u64,
        leaves: &[Hash],
        timeout: Duration,
        inclusion: &mut Vec<serde_json::Value>,
    ) -> Result<(), Failure> {
        if first == 0 {
            if mth(leaves) != cp.root {
                return Err(rewritten(
                    name,
                    "its entries do not make the signed root".into(),
                ));
            }
            return Ok(());
        }
        let proof = session
            .request_within(
                AuditProve,
                ProveArgs {
                    size: cp.size,
                    index: Some(first),
                    from: None,
                },
                timeout,
            )
            .await
            .map_err(|e| Failure::call(&format!("{name} core.audit/prove"), &e))?;
        let hashes = proof
            .proof
            .iter()
            .map(|h| hex32(h))
            .collect::<Result<Vec<_>, _>>()?;
        let ranges = path_ranges(first, cp.size);
        if ranges.len() != hashes.len() {
            return Err(rewritten(
                name,
                "an inclusion proof of the wrong length".into(),
            ));
        }
        for ((lo, hi), h) in ranges.iter().zip(&hashes) {
            if *lo > first {
                let at = usize::try_from(lo - first).unwrap_or(usize::MAX);
                let to = usize::try_from(hi - first).unwrap_or(usize::MAX);
                if leaves.get(at..to).map(mth) != Some(*h) {
                    return Err(rewritten(
                        name,
                        format!("entries {lo}..{hi} are not the signed ones"),
                    ));
                }
            }
        }
        capwire_audit::verify_inclusion(first, cp.size, &leaves[0], &hashes, &cp.root).map_err(
            |e| {
                rewritten(
                    name,
                    format!("entry {first} is not in the signed tree: {e}"),
                )
            },
        )?;
        inclusion.push(json!({"index": first, "size": cp.size, "proof": proof.proof}));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranges of a path, from RFC 6962's recursive definition.
    fn naive(m: u64, lo: u64, hi: u64, out: &mut Vec<(u64, u64)>) {
        if hi - lo <= 1 {
            return;
        }
        let mut k = 1;
        while k * 2 < hi - lo {
            k *= 2;
        }
        if m < lo + k {
            naive(m, lo, lo + k, out);
            out.push((lo + k, hi));
        } else {
            naive(m, lo + k, hi, out);
            out.push((lo, lo + k));
        }
    }

    #[test]
    fn path_ranges_are_rfc_6962_paths() {
        for n in 1..80 {
            for m in 0..n {
                let mut want = Vec::new();
                naive(m, 0, n, &mut want);
                assert_eq!(path_ranges(m, n), want, "m {m} n {n}");
            }
        }
    }
}
