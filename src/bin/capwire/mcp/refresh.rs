//! Keeps the catalog of tools as the cluster is: rebuilt from the book
//! and the nodes' manifests when a roster changes, a node comes or goes
//! (the control plane's `watch` records), or the book does (looked at
//! every 2 s), and published only when it changed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value as Json;
use tokio::sync::watch;

use super::catalog::{Catalog, NodeView};
use super::server::Listing;
use crate::ctl::{Backend, CtlCommand, NodeArg};
use crate::exit::Failure;

/// How often the book is looked at.
const BOOK_TICK: Duration = Duration::from_secs(2);
/// How long a burst of changes is let settle before the catalog is made.
const SETTLE: Duration = Duration::from_millis(100);
/// The bound on reading one node's manifest.
const MANIFEST_WAIT: Duration = Duration::from_secs(5);

/// What is served: the nodes (for their cards) and their tools.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) nodes: Vec<NodeView>,
    pub(crate) listing: Arc<Listing>,
}

/// Which nodes, and which of their verbs.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// Only this node (a name or key in the book).
    pub(crate) node: Option<String>,
    /// Controller verbs too.
    pub(crate) controller: bool,
}

/// The records of one command, all of them, and how it ended.
pub(crate) async fn run_one(
    backend: &Backend,
    command: CtlCommand,
    timeout: Duration,
) -> Result<Vec<Json>, Failure> {
    let (mut rx, done) = backend.start(command, timeout);
    let mut records = Vec::new();
    while let Some(record) = rx.recv().await {
        records.push(record);
    }
    done.await
        .map_err(|e| Failure::failed(format!("the command failed: {e}")))??;
    Ok(records)
}

/// The book's entries as `(name, node_id, addrs)`.
async fn book(
    backend: &Backend,
    timeout: Duration,
) -> Result<Vec<(String, String, Vec<String>)>, Failure> {
    let records = run_one(backend, CtlCommand::Peers, timeout).await?;
    let peers = records
        .first()
        .and_then(|r| r["peers"].as_array())
        .cloned()
        .unwrap_or_default();
    Ok(peers
        .iter()
        .map(|p| {
            let addrs = p["addrs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["node_id"].as_str().unwrap_or_default().to_owned(),
                addrs,
            )
        })
        .collect())
}

fn in_scope(scope: &Scope, name: &str, node_id: &str) -> bool {
    scope
        .node
        .as_deref()
        .is_none_or(|only| only == name || only.eq_ignore_ascii_case(node_id))
}

/// What is served now: every node in scope that answers with its
/// manifest (one that does not has no tools until it does).
///
/// # Errors
/// The book cannot be read, or the one node asked for is not in it.
pub(crate) async fn served(
    backend: &Backend,
    scope: &Scope,
    timeout: Duration,
) -> Result<Served, Failure> {
    let entries = book(backend, timeout).await?;
    let entries: Vec<_> = entries
        .into_iter()
        .filter(|(name, id, _)| in_scope(scope, name, id))
        .collect();
    if let (Some(only), true) = (&scope.node, entries.is_empty()) {
        return Err(Failure::usage(format!(
            "{only} is not a node this control plane knows (`capwire ctl peers` lists them)"
        )));
    }
    let wait = timeout.min(MANIFEST_WAIT);
    let manifests = join_all(entries.iter().map(|(_, id, _)| {
        run_one(
            backend,
            CtlCommand::Manifest {
                node: NodeArg::new(id.clone()),
            },
            wait,
        )
    }))
    .await;
    let mut nodes = Vec::new();
    for ((name, _, addrs), manifest) in entries.into_iter().zip(manifests) {
        match manifest {
            Ok(records) => {
                if let Some(manifest) = records.into_iter().find(|r| r["kind"] == "manifest") {
                    nodes.push(NodeView {
                        name,
                        addrs,
                        manifest,
                    });
                }
            }
            Err(e) => tracing::debug!("{name} has no tools for now: {e}"),
        }
    }
    let listing = Arc::new(Listing::new(Catalog::build(&nodes, scope.controller)));
    Ok(Served { nodes, listing })
}

/// Keeps `tools` and `nodes` as the cluster is, until the control
/// plane's watch ends (the `ctl` this process handed its commands to
/// stopped): then it returns.
pub(crate) async fn maintain(
    backend: Backend,
    scope: Scope,
    timeout: Duration,
    tools: watch::Sender<Arc<Listing>>,
    nodes: watch::Sender<Arc<Vec<NodeView>>>,
) {
    let (mut records, _watching) = backend.start(CtlCommand::Watch, timeout);
    let mut tick = tokio::time::interval(BOOK_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_book = book(&backend, timeout).await.ok();
    loop {
        let dirty = tokio::select! {
            record = records.recv() => match record {
                None => return,
                Some(record) => matches!(
                    record["kind"].as_str(),
                    Some("roster" | "connected" | "disconnected" | "lagged")
                ),
            },
            _ = tick.tick() => {
                let now = book(&backend, timeout).await.ok();
                let changed = now.is_some() && now != last_book;
                if changed {
                    last_book = now;
                }
                changed
            }
        };
        if !dirty {
            continue;
        }
        // A burst (a roster push, then the sessions it brings) is one
        // rebuild.
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                () = &mut settle => break,
                record = records.recv() => if record.is_none() { return },
            }
        }
        match served(&backend, &scope, timeout).await {
            Ok(now) => {
                tools.send_if_modified(|old| {
                    let changed = old.catalog != now.listing.catalog;
                    if changed {
                        *old = Arc::clone(&now.listing);
                    }
                    changed
                });
                nodes.send_replace(Arc::new(now.nodes));
            }
            Err(e) => tracing::warn!("the tools were not rebuilt: {e}"),
        }
    }
}
