//! Graceful shutdown, within a bound whatever peers do:
//!
//! ```text
//!  stop accepting and dialling; new requests answered `cancelled`
//!    └► wait for running handlers ............ at most shutdown_grace
//!        └► cancel the rest (they answer `cancelled`) .. at most SETTLE
//!            └► close every session (`shutdown`), all at once
//!                 each is dropped after close_timeout at the latest
//!                └► wait for every task of the node ... at most close_timeout + SLACK
//!  (children the host runs in this process shut down alongside, from the start)
//! ```
//!
//! So `shutdown` returns within `shutdown_grace + close_timeout + 350 ms`
//! (with the defaults, about 6.4 s), even when a peer never reads, stalls,
//! or finishes a handshake in the middle of it (such a session is refused
//! with close code `shutdown`).

use std::time::Duration;

use tokio::time::Instant;

use crate::node::runtime::Runtime;

/// How long cancelled handlers get to queue their `cancelled` answers.
pub(crate) const SETTLE: Duration = Duration::from_millis(100);
/// Extra time for tasks to notice they are done.
pub(crate) const SLACK: Duration = Duration::from_millis(250);
/// How often the running work is counted while waiting.
const POLL: Duration = Duration::from_millis(5);

fn running(rt: &Runtime) -> usize {
    rt.peers
        .sessions()
        .iter()
        .map(|s| s.lock().running_jobs())
        .sum()
}

async fn wait_idle(rt: &Runtime, until: Instant) {
    while running(rt) > 0 && Instant::now() < until {
        tokio::time::sleep(POLL).await;
    }
}

/// Shuts `rt` down; a second call waits for the first.
pub(crate) async fn shutdown(rt: &Runtime) {
    let mut done = rt.shutdown.lock().await;
    if *done {
        return;
    }
    rt.dispatcher.begin_shutdown();
    rt.peers.stopping().cancel();
    rt.stop_background.cancel();
    // Children the host runs here stop alongside (their own graceful
    // shutdown, started now); not waited for beyond the bound.
    let host = rt.core.host.clone();
    let children = tokio::spawn(async move { host.shutdown().await });

    wait_idle(rt, Instant::now() + rt.limits.shutdown_grace).await;
    rt.stop_handlers.cancel();
    wait_idle(rt, Instant::now() + SETTLE).await;

    // Every session, open or still waiting for its hello, closes now.
    rt.net.env.close_all.cancel();
    rt.tracker.close();
    let bound = rt.limits.close_timeout + SLACK;
    // Children that cannot outlive the node stop alongside, in the same bound.
    let children = async move {
        if tokio::time::timeout(bound, children).await.is_err() {
            tracing::warn!("shutdown: children still stopping after the close bound");
        }
    };
    let (waited, ()) = tokio::join!(tokio::time::timeout(bound, rt.tracker.wait()), children);
    if waited.is_err() {
        tracing::warn!(
            tasks = rt.tracker.len(),
            "shutdown: tasks still running after the close bound; leaving them"
        );
    }
    // What the log recorded is written and synced.
    let audit = rt.core.audit.clone();
    let synced = tokio::task::spawn_blocking(move || audit.sync()).await;
    if let Ok(Err(e)) = synced {
        tracing::warn!(error = %e, "shutdown: the audit log could not be synced");
    }
    *done = true;
}
