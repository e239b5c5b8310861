//! `core.audit` (protocol 3, WIRE.md 5.6): the node's audit log, read by
//! its control plane (or a holder of a grant for these verbs): the latest
//! signed checkpoint, a range of entries as a stream, and inclusion and
//! consistency proofs. The capability's params are the log's verifier key
//! (signed-note key text), so a peer learns it from the authenticated
//! manifest.

use std::sync::Arc;

use capwire_envelope::ErrorCode;
use capwire_manifest::{
    AuditCheckpoint, AuditEntries, AuditProve, CORE_AUDIT, CheckpointReply, EntriesArgs, EntryItem,
    MAX_ENTRIES_PER_CALL, NoArgs, ProveArgs, ProveReply,
};

use crate::audit::{AuditError, AuditLog};
use crate::core::state::Core;
use crate::dispatch::handler::{HandlerError, RouteEntry, RouteHandler, StreamTyped, Typed};
use crate::dispatch::items::Items;

fn refused(e: AuditError) -> HandlerError {
    match e {
        AuditError::Pruned(_) => HandlerError::new(ErrorCode::NotFound, e.to_string()),
        AuditError::Range(_) => HandlerError::new(ErrorCode::BadArgs, e.to_string()),
        AuditError::Io(_) => HandlerError::new(ErrorCode::Unavailable, e.to_string()),
    }
}

/// Runs `f` on the log off the executor (it reads and syncs files).
async fn blocking<T: Send + 'static>(
    log: &Arc<AuditLog>,
    f: impl FnOnce(&AuditLog) -> Result<T, AuditError> + Send + 'static,
) -> Result<T, HandlerError> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || f(&log))
        .await
        .map_err(|_| HandlerError::new(ErrorCode::Internal, "the audit log's reader failed"))?
        .map_err(refused)
}

async fn checkpoint(_args: NoArgs, Core(core): Core) -> Result<CheckpointReply, HandlerError> {
    let (note, size, pruned) = blocking(&core.audit, AuditLog::checkpoint).await?;
    Ok(CheckpointReply { note, size, pruned })
}

async fn entries(
    args: EntriesArgs,
    mut items: Items<EntryItem>,
    Core(core): Core,
) -> Result<(), HandlerError> {
    if args.to < args.from || args.to - args.from > MAX_ENTRIES_PER_CALL {
        return Err(HandlerError::new(
            ErrorCode::BadArgs,
            format!("from..to must be a range of at most {MAX_ENTRIES_PER_CALL} entries"),
        ));
    }
    let mut next = args.from;
    while next < args.to {
        let to = args.to;
        let batch = blocking(&core.audit, move |log| log.entries(next, to)).await?;
        let Some(last) = batch.last().map(|(i, _)| *i) else {
            break;
        };
        for (index, bytes) in batch {
            items
                .send(EntryItem {
                    index,
                    entry: base16ct::lower::encode_string(&bytes),
                })
                .await
                .map_err(HandlerError::from)?;
        }
        next = last + 1;
    }
    Ok(())
}

async fn prove(args: ProveArgs, Core(core): Core) -> Result<ProveReply, HandlerError> {
    let size = args.size;
    let proof = match (args.index, args.from) {
        (Some(index), None) => {
            blocking(&core.audit, move |log| log.prove_inclusion(index, size)).await?
        }
        (None, Some(from)) => {
            blocking(&core.audit, move |log| log.prove_consistency(from, size)).await?
        }
        _ => {
            return Err(HandlerError::new(
                ErrorCode::BadArgs,
                "exactly one of index and from is given",
            ));
        }
    };
    Ok(ProveReply {
        proof: proof
            .iter()
            .map(|h| base16ct::lower::encode_string(h))
            .collect(),
    })
}

pub(crate) fn capability(vkey: &str) -> capwire_manifest::Capability<RouteHandler> {
    capwire_manifest::Capability::new(CORE_AUDIT, capwire_manifest::Version::new(1, 0, 0))
        .params(vkey)
        .verb::<AuditCheckpoint>(Arc::new(RouteEntry::new(
            Typed::<AuditCheckpoint, (Core,), _>::new(checkpoint),
        )) as RouteHandler)
        .verb::<AuditEntries>(Arc::new(RouteEntry::new(
            StreamTyped::<AuditEntries, (Core,), _>::new(entries),
        )) as RouteHandler)
        .verb::<AuditProve>(
            Arc::new(RouteEntry::new(Typed::<AuditProve, (Core,), _>::new(prove))) as RouteHandler,
        )
}
