//! The in-process host: each child is a full node (its own keypair,
//! store and loopback listener) running in this process, on the runtime
//! that created it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use capwire_envelope::NodeId;
use capwire_manifest::MonitoringStatus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::contact::Contact;
use crate::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use crate::invite::Invite;
use crate::node::Node;
use crate::node::builder::NodeBuilder;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes the builder of a child from its spec (its capabilities, limits,
/// state); the host then sets its name, description, state directory and
/// loopback listener.
pub type ChildFactory = Arc<dyn Fn(&ChildSpec) -> NodeBuilder + Send + Sync>;

/// Runs children as nodes in this process.
///
/// ```
/// use capwire::host::InProcessHost;
/// use capwire::Node;
///
/// // Children with the app's own capabilities, their state under a directory.
/// let host = InProcessHost::new()
///     .with_factory(|spec| Node::builder("agent").description(format!("child {}", spec.cid)))
///     .state_dir(std::env::temp_dir().join("capwire-doc-children"));
/// # let _ = host;
/// ```
pub struct InProcessHost {
    factory: ChildFactory,
    base: Option<PathBuf>,
    children: Mutex<HashMap<String, Child>>,
    events_tx: mpsc::Sender<HostEvent>,
    events_rx: Mutex<Option<mpsc::Receiver<HostEvent>>>,
}

impl std::fmt::Debug for InProcessHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessHost")
            .field("base", &self.base)
            .field("children", &lock(&self.children).len())
            .finish_non_exhaustive()
    }
}

impl Default for InProcessHost {
    fn default() -> Self {
        Self::new()
    }
}

/// Events waiting for the parent; beyond, each child's watcher waits for
/// room, keeping only the child's newest state meanwhile.
const EVENT_QUEUE: usize = 256;

/// A running child and the watch on its monitoring.
struct Child {
    node: Node,
    watching: CancellationToken,
    /// The task that reports its monitoring state: it holds a handle on
    /// the node, so the node (and its state directory's lock) is only
    /// gone once it has ended too.
    watch: tokio::task::JoinHandle<()>,
}

impl Child {
    async fn end(self) {
        self.watching.cancel();
        self.node.shutdown().await;
        // It stops at once on the cancel (every wait of it selects on it).
        let _ = self.watch.await;
    }
}

impl InProcessHost {
    /// Children are bare nodes (only the core capabilities) kept in memory.
    pub fn new() -> Self {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        Self {
            factory: Arc::new(|_| Node::builder("capwire.child")),
            base: None,
            children: Mutex::new(HashMap::new()),
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
        }
    }

    /// Children are built by `factory`.
    pub fn with_factory(
        mut self,
        factory: impl Fn(&ChildSpec) -> NodeBuilder + Send + Sync + 'static,
    ) -> Self {
        self.factory = Arc::new(factory);
        self
    }

    /// Each child keeps its state (identity, contacts, binding, ...) in
    /// `base/CID`, so that it comes back as itself after a restart.
    pub fn state_dir(mut self, base: impl Into<PathBuf>) -> Self {
        self.base = Some(base.into());
        self
    }

    fn child(&self, cid: &str) -> Result<Node, HostError> {
        lock(&self.children)
            .get(cid)
            .map(|c| c.node.clone())
            .ok_or_else(|| HostError::NotFound(cid.to_owned()))
    }

    async fn start_child(&self, spec: ChildSpec) -> Result<ChildInfo, HostError> {
        if let Ok(node) = self.child(&spec.cid) {
            return Ok(info(&node));
        }
        let build = |addrs: &[Addr]| {
            let mut b = (self.factory)(&spec)
                .name(spec.name.clone())
                .description(spec.bio.clone());
            if let Some(base) = &self.base {
                b = b.state_dir(base.join(&spec.cid));
            }
            let loopback = Addr::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            for a in addrs.iter().chain(addrs.is_empty().then_some(&loopback)) {
                b = b.listen(a.clone());
            }
            b
        };
        // The addresses it had, if they are free; otherwise new ones.
        let node = match build(&spec.addrs).start().await {
            Ok(n) => n,
            Err(_) if !spec.addrs.is_empty() => build(&[])
                .start()
                .await
                .map_err(|e| HostError::Failed(e.to_string()))?,
            Err(e) => return Err(HostError::Failed(e.to_string())),
        };
        let watching = CancellationToken::new();
        let watch = tokio::spawn(watch_monitoring(
            node.clone(),
            spec.cid.clone(),
            self.events_tx.clone(),
            watching.clone(),
        ));
        let child = Child {
            node: node.clone(),
            watching,
            watch,
        };
        lock(&self.children).insert(spec.cid.clone(), child);
        Ok(info(&node))
    }

    async fn stop_child(&self, cid: &str) -> Result<(), HostError> {
        let child = lock(&self.children).remove(cid);
        if let Some(child) = child {
            child.end().await;
        }
        if let Some(base) = &self.base {
            let dir = base.join(cid);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .map_err(|e| HostError::Failed(format!("removing {}: {e}", dir.display())))?;
            }
        }
        Ok(())
    }

    /// Shuts every child down (the parent is stopping). Their state stays.
    pub(crate) async fn shutdown_all(&self) {
        let children: Vec<Child> = lock(&self.children).drain().map(|(_, c)| c).collect();
        for c in children {
            c.end().await;
        }
    }
}

fn info(node: &Node) -> ChildInfo {
    let manifest = node.manifest();
    ChildInfo {
        node_id: node.id(),
        addrs: node.local_addrs(),
        caps: manifest
            .capabilities
            .iter()
            .map(|c| format!("{}@{}", c.id, c.version))
            .collect(),
    }
}

/// Reports the child's monitoring state (its status and the control plane
/// it is bound to) when it starts other than unwatched, and whenever it
/// changes, until `stop`.
async fn watch_monitoring(
    node: Node,
    cid: String,
    events: mpsc::Sender<HostEvent>,
    stop: CancellationToken,
) {
    let mut watch = node.watch_manifest();
    let state = |status: MonitoringStatus| (status, node.controller());
    let mut last = (MonitoringStatus::Off, None);
    let mut now = state(watch.current().monitoring);
    loop {
        if now != last {
            last = now;
            let event = HostEvent::Monitoring {
                cid: cid.clone(),
                status: now.0,
                controller: now.1,
            };
            // Waits for room: the watch keeps only the newest state
            // meanwhile, so nothing piles up and the last state arrives.
            tokio::select! {
                () = stop.cancelled() => return,
                sent = events.send(event) => if sent.is_err() { return },
            }
        }
        // A new controller wakes the watch too, also when the status
        // stays `on`.
        let changed = tokio::select! {
            () = stop.cancelled() => return,
            changed = watch.changed() => changed,
        };
        match changed {
            Some(m) => now = state(m.monitoring),
            None => return,
        }
    }
}

impl Host for InProcessHost {
    fn start(&self, spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        Box::pin(self.start_child(spec))
    }

    fn stop(&self, cid: &str) -> HostFuture<'_, ()> {
        let cid = cid.to_owned();
        Box::pin(async move { self.stop_child(&cid).await })
    }

    fn open_bind(&self, cid: &str, controller: NodeId) -> HostFuture<'_, Invite> {
        let child = self.child(cid);
        Box::pin(async move {
            child?
                .invite(Some(controller))
                .map_err(|e| HostError::Failed(e.to_string()))
        })
    }

    fn close_bind(&self, cid: &str) -> HostFuture<'_, ()> {
        let child = self.child(cid);
        Box::pin(async move {
            let child = child?;
            child.cancel_invite();
            child
                .unbind()
                .await
                .map(|_| ())
                .map_err(|e| HostError::Failed(e.to_string()))
        })
    }

    fn add_contact(&self, cid: &str, contact: Contact) -> HostFuture<'_, ()> {
        let child = self.child(cid);
        Box::pin(async move {
            child?
                .add_contact(contact)
                .await
                .map(|_| ())
                .map_err(|e| HostError::Failed(e.to_string()))
        })
    }

    fn events(&self) -> Option<mpsc::Receiver<HostEvent>> {
        lock(&self.events_rx).take()
    }

    fn shutdown(&self) -> HostFuture<'_, ()> {
        Box::pin(async {
            self.shutdown_all().await;
            Ok(())
        })
    }
}
