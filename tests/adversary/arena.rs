//! The harness: a fresh target node per attack, a snapshot of its state
//! before, the attack, then the same final checks for every attack.
//!
//! ```text
//!  Setup ──► Arena (Node + app.adv + Tally) ──► snapshot
//!                     │
//!          attack(arena) ──► Expect (handler runs it caused, binding)
//!                     │
//!   settle: no session, handshake, job, stream or queued byte left
//!   check:  handler runs (and the ok counters agree), every stream
//!           handler ended, no controller verb ran unbound, binding, config, roster, contacts, ledger
//!           within its budget
//!   honest: a fresh Peer's request succeeds within HONEST
//!   stop:   shutdown within shutdown_grace + close_timeout + 350 ms
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use capwire::authz::Authorizer;
use capwire::envelope::NodeId;
use capwire::manifest::{ConfigValue, Roster};
use capwire::transport::TransportError;
use capwire::{
    Addr, Contact, ContactPolicy, Direction, Keypair, Limits, Node, NodeStats, Outcome,
    TransportConfig,
};
use tokio::time::Instant;

use crate::kit::cap::{self, Echo, Tally, get};
use crate::kit::wire::{Io, Speaks, Wire};

/// How long an honest request may take once the attack is over.
pub const HONEST: Duration = Duration::from_secs(5);

/// How long the node may take to drop what the attack left behind.
const SETTLE: Duration = Duration::from_secs(15);

/// A future an attack returns.
pub type Played = Pin<Box<dyn Future<Output = Expect>>>;

/// An attack: plays against the arena, says what it legitimately caused.
pub type Play = fn(Arena) -> Played;

/// What the target node is.
#[derive(Clone)]
pub struct Setup {
    /// Listen on loopback TCP; otherwise streams go through
    /// `Node::accept_stream` (in-memory pairs, for paused time).
    pub listen: bool,
    pub limits: Limits,
    pub transport: TransportConfig,
    /// The node's own identity.
    pub keypair: Keypair,
    /// The identity of the honest peer of the final check.
    pub honest: Keypair,
    /// Identities an attack may play (known to the setup, e.g. to put in
    /// a contact policy or bind).
    pub spare: Vec<Keypair>,
    pub policy: Option<ContactPolicy>,
    pub bound_to: Option<NodeId>,
    pub authorizer: Option<Arc<dyn Authorizer>>,
}

impl Setup {
    /// A default node on loopback TCP.
    pub fn tcp() -> Self {
        Self {
            listen: true,
            limits: Limits::default(),
            transport: TransportConfig::default(),
            keypair: Keypair::generate().unwrap(),
            honest: Keypair::generate().unwrap(),
            spare: (0..3).map(|_| Keypair::generate().unwrap()).collect(),
            policy: None,
            bound_to: None,
            authorizer: None,
        }
    }

    /// A default node reached only through in-memory pairs.
    pub fn memory() -> Self {
        Self {
            listen: false,
            ..Self::tcp()
        }
    }

    pub fn limits(mut self, f: impl FnOnce(&mut Limits)) -> Self {
        f(&mut self.limits);
        self
    }

    pub fn transport(mut self, f: impl FnOnce(&mut TransportConfig)) -> Self {
        f(&mut self.transport);
        self
    }

    /// Bound to `spare[0]` from the start.
    pub fn bound(mut self) -> Self {
        self.bound_to = Some(self.spare[0].public());
        self
    }
}

/// What an attack legitimately caused; everything else must be as before.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Handler runs (of every `app.adv` verb) the attack caused on purpose.
    pub runs: u64,
    /// The binding the attack ends with (`None`: unchanged).
    pub controller: Option<Option<NodeId>>,
    /// The attack shut the node down.
    pub shut_down: bool,
    /// The configuration's version the attack leaves (`None`: unchanged).
    pub config_version: Option<u64>,
}

impl Expect {
    /// Nothing ran and nothing changed.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// `n` handler runs, nothing else changed.
    pub fn runs(n: u64) -> Self {
        Self {
            runs: n,
            ..Self::default()
        }
    }

    /// The binding is now `controller`.
    pub fn bound_to(mut self, controller: Option<NodeId>) -> Self {
        self.controller = Some(controller);
        self
    }
}

/// The target node and what its handlers did.
#[derive(Clone)]
pub struct Arena {
    pub node: Node,
    pub tally: Arc<Tally>,
    pub setup: Arc<Setup>,
}

impl Arena {
    async fn start(setup: Setup) -> Self {
        let tally = Arc::new(Tally::default());
        let mut b = Node::builder("adversary-target")
            .keypair(setup.keypair.clone())
            .capability(cap::capability())
            .state(tally.clone())
            .limits(setup.limits.clone())
            .transport_config(setup.transport.clone());
        if setup.listen {
            b = b.listen("127.0.0.1:0".parse().unwrap());
        }
        if let Some(p) = &setup.policy {
            b = b.contact_policy(p.clone());
        }
        if let Some(c) = setup.bound_to {
            b = b.bound_to(c);
        }
        if let Some(a) = &setup.authorizer {
            b = b.authorizer(a.clone());
        }
        let node = b.start().await.unwrap();
        Self {
            node,
            tally,
            setup: Arc::new(setup),
        }
    }

    /// The node's identity.
    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    /// Handler runs so far.
    pub fn runs(&self) -> u64 {
        get(&self.tally.runs)
    }

    /// The node's TCP address.
    pub fn addr(&self) -> SocketAddr {
        self.node
            .local_addrs()
            .into_iter()
            .find_map(|a| match a {
                Addr::Tcp(sa) => Some(sa),
                Addr::Unix(_) => None,
            })
            .expect("this arena listens on TCP")
    }

    /// A new connection to the node: TCP when it listens, otherwise one
    /// half of an in-memory pair whose other half the node accepts.
    pub async fn stream(&self) -> Io {
        if self.setup.listen {
            let s = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
            s.set_nodelay(true).unwrap();
            Box::new(s)
        } else {
            let (a, b) = tokio::io::duplex(256 * 1024);
            self.node.accept_stream(b);
            Box::new(a)
        }
    }

    /// The nonce both sides start at (the test hook; 0 normally).
    pub fn start_nonce(&self) -> u64 {
        self.setup.transport.start_nonce_for_testing
    }

    /// A handshake by hand as `keypair`, no hello yet.
    pub async fn handshake_as(&self, keypair: &Keypair) -> Result<Wire, TransportError> {
        let stream = self.stream().await;
        Wire::initiate(stream, keypair, self.start_nonce()).await
    }

    /// A session by hand with a fresh identity, hellos exchanged.
    pub async fn wire(&self) -> Wire {
        self.wire_as(&Keypair::generate().unwrap()).await
    }

    /// A session by hand as `keypair`, hellos exchanged (protocol 2).
    pub async fn wire_as(&self, keypair: &Keypair) -> Wire {
        self.wire_speaking(keypair, Speaks::V2).await
    }

    /// A session by hand with a fresh identity that speaks protocol 1 only.
    pub async fn wire_v1(&self) -> Wire {
        let w = self
            .wire_speaking(&Keypair::generate().unwrap(), Speaks::V1)
            .await;
        assert_eq!(w.version, 1);
        w
    }

    /// A session by hand as `keypair`, speaking `speaks`, hellos exchanged.
    pub async fn wire_speaking(&self, keypair: &Keypair, speaks: Speaks) -> Wire {
        let mut w = self.handshake_as(keypair).await.expect("the handshake");
        assert!(w.hello_as(speaks).await, "the node's hello");
        w
    }

    /// A node of our own that dials the target over the arena's kind of
    /// stream, and the peer it got.
    pub async fn client(&self, keypair: &Keypair) -> Result<(Node, capwire::Peer), String> {
        let client = Node::builder("client")
            .keypair(keypair.clone())
            .transport_config(self.setup.transport.clone())
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let peer = if self.setup.listen {
            client
                .connect(&Addr::Tcp(self.addr()), Some(self.id()))
                .await
        } else {
            let (a, b) = tokio::io::duplex(256 * 1024);
            self.node.accept_stream(b);
            client.connect_stream(a, Some(self.id())).await
        };
        match peer {
            Ok(p) => Ok((client, p)),
            Err(e) => {
                client.shutdown().await;
                Err(e.to_string())
            }
        }
    }

    /// An honest request through the node's friendly API, as the setup's
    /// honest identity.
    pub async fn honest(&self) -> Result<String, String> {
        let (client, peer) = self.client(&self.setup.honest).await?;
        let r = peer
            .request_within(Echo, "honest".into(), HONEST)
            .await
            .map_err(|e| e.to_string());
        client.shutdown().await;
        r
    }

    /// Waits until the node holds nothing for the attack any more: no
    /// session, no handshake, no job, no stream, no queued byte.
    async fn settle(&self, name: &str) -> NodeStats {
        let deadline = Instant::now() + SETTLE;
        loop {
            let s = self.node.stats();
            let idle = self.node.connected_peers().is_empty()
                && s.handshakes_in_progress(Direction::Inbound) == 0
                && s.handshakes_in_progress(Direction::Outbound) == 0
                && s.inflight == 0
                && s.queued_bytes == 0
                && s.pending_calls == 0
                && s.streams_served == 0
                && s.streams_called == 0
                && s.ledger.running == 0
                && get(&self.tally.gen_streams) == get(&self.tally.gen_ended);
            if idle {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: the node still holds something for the attack: {s:?}, peers {:?}",
                self.node.connected_peers()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The state the final check compares.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    runs: u64,
    controller: Option<NodeId>,
    config: ConfigValue,
    roster: Roster,
    contacts: Vec<Contact>,
}

impl Snapshot {
    fn of(a: &Arena) -> Self {
        Self {
            runs: a.runs(),
            controller: a.node.controller(),
            config: a.node.config(),
            roster: a.node.roster(),
            contacts: a.node.contacts(),
        }
    }
}

/// Plays one attack against a fresh node and checks what every attack
/// must leave behind.
pub async fn run(name: &str, setup: Setup, play: Play) {
    let started = Instant::now();
    let arena = Arena::start(setup).await;
    let before = Snapshot::of(&arena);
    let expect = play(arena.clone()).await;
    let played = started.elapsed();

    let stats = arena.settle(name).await;
    let after = Snapshot::of(&arena);
    assert_eq!(
        after.runs - before.runs,
        expect.runs,
        "{name}: handler runs (no handler may run but those the attack meant)"
    );
    let metrics = arena.node.metrics();
    for (verb, ran) in [("echo", &arena.tally.echo), ("admin", &arena.tally.admin)] {
        assert_eq!(
            metrics.count("app.adv", verb, Outcome::Ok),
            get(ran),
            "{name}: app.adv/{verb} counted ok exactly as often as it ran"
        );
    }
    assert_eq!(
        get(&arena.tally.unbound_admin),
        0,
        "{name}: a controller verb ran for a sender that was not the control plane"
    );
    assert_eq!(
        after.controller,
        expect.controller.unwrap_or(before.controller),
        "{name}: the binding"
    );
    match expect.config_version {
        None => assert_eq!(after.config, before.config, "{name}: the configuration"),
        Some(v) => assert_eq!(
            after.config.version, v,
            "{name}: the configuration's version"
        ),
    }
    assert_eq!(after.roster, before.roster, "{name}: the roster");
    assert_eq!(after.contacts, before.contacts, "{name}: the contacts");
    let limits = &arena.setup.limits;
    assert!(
        stats.ledger.bytes <= limits.replay_max_bytes,
        "{name}: ledger {:?} over its budget",
        stats.ledger
    );

    if expect.shut_down {
        assert!(
            arena.honest().await.is_err(),
            "{name}: a node that shut down serves nobody"
        );
    } else {
        let t = Instant::now();
        assert_eq!(
            arena.honest().await.as_deref(),
            Ok("echo: honest"),
            "{name}: an honest peer is served afterwards"
        );
        assert!(
            t.elapsed() <= HONEST,
            "{name}: honest request took {:?}",
            t.elapsed()
        );
        assert_eq!(
            arena.runs(),
            after.runs + 1,
            "{name}: the honest request ran once"
        );
        let t = Instant::now();
        arena.node.shutdown().await;
        let bound = limits.shutdown_grace + limits.close_timeout + Duration::from_millis(350);
        assert!(
            t.elapsed() <= bound,
            "{name}: shutdown took {:?}",
            t.elapsed()
        );
    }
    eprintln!(
        "attack {name}: played in {played:?}, whole case {:?}",
        started.elapsed()
    );
}

/// Waits (tokio time) until `cond` holds, or fails after 10 s.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
