//! What a hostile peer can cost a node is bounded: a peer that never reads,
//! floods of silent sockets, idle sessions from throwaway keys, and
//! manifests that break the rules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use capwire::envelope::{CloseCode, Frame, NodeId};
use capwire::manifest::{CapabilityManifest, Manifest, VerbManifest};
use capwire::{Addr, Contact, Keypair, Limits, NodeError, TransportConfig};
use common::{
    RawPeer, bare_manifest, client_node, connect_tcp, echo_node, raw, tcp_addr, wait_until,
};
use tokio::net::TcpSocket;

#[tokio::test]
async fn a_peer_that_never_reads_is_bounded_then_dropped_and_others_are_served() {
    let limits = Limits {
        max_inflight_per_session: 16,
        max_queued_bytes_per_session: 512 * 1024,
        write_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let (server, _counters) = echo_node(limits.clone()).await;
    let hog = RawPeer::connect(&server).await;
    // Ask for far more than the node may queue (2000 x 60 KB = 120 MB) and
    // never read any of it. The sends themselves stall once the node stops
    // reading, so they run on their own task.
    let hog_id = hog.id;
    let sender = tokio::spawn(async move {
        for i in 0..2000 {
            hog.control("app.echo", "repeat", &format!("r{i}"), &raw(&60_000u32))
                .await;
        }
        hog
    });
    let client = client_node().await;
    let honest = connect_tcp(&client, &server).await;
    let mut peak_queued = 0;
    let mut peak_inflight = 0;
    let started = tokio::time::Instant::now();
    while server.connected_peers().contains(&hog_id)
        || started.elapsed() < Duration::from_millis(200)
    {
        peak_queued = peak_queued.max(server.queued_bytes());
        peak_inflight = peak_inflight.max(server.inflight());
        // Others are served meanwhile.
        assert_eq!(
            honest
                .request(common::Say, "still here".into())
                .await
                .unwrap(),
            "echo: still here"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the peer that never reads is dropped after the write deadline"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(peak_inflight <= 16 + 1, "in flight: {peak_inflight}");
    // The queue's bound, plus the answers of the jobs in flight.
    assert!(
        peak_queued <= 512 * 1024 + 17 * 60_100,
        "queued: {peak_queued} bytes"
    );
    sender.abort();
    assert_eq!(server.connected_peers(), vec![client.id()]);
}

/// A TCP socket from another loopback address that connects and sends
/// nothing.
async fn silent_socket(server: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    socket.connect(server).await.unwrap()
}

#[tokio::test]
async fn silent_sockets_do_not_lock_out_honest_peers() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let addr = tcp_addr(&server);
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(silent_socket(addr).await);
    }
    wait_until("the flood is accepted or refused", || {
        server.refused_connections() > 0
    })
    .await;
    // The source's share of handshake slots is bounded; the rest are free.
    wait_until("the source holds at most its share", || {
        server.available_handshake_slots() >= 64 - 16
    })
    .await;
    let client = client_node().await;
    let peer = client
        .connect(&Addr::Tcp(addr), Some(server.id()))
        .await
        .expect("an honest peer gets in while the flood sits there");
    assert_eq!(
        peer.request(common::Say, "in".into()).await.unwrap(),
        "echo: in"
    );
    drop(silent);
}

#[tokio::test(start_paused = true)]
async fn a_silent_socket_is_dropped_after_the_first_message_deadline() {
    let (server, _counters) = common::echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(1024);
    server.accept_stream(b);
    let before = server.available_handshake_slots();
    assert_eq!(before, 64 - 1);
    let started = tokio::time::Instant::now();
    wait_until("the slot is free again", || {
        server.available_handshake_slots() == 64
    })
    .await;
    assert!(
        started.elapsed() <= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(a);
}

#[tokio::test]
async fn throwaway_keys_cannot_take_the_slots_of_contacts_and_the_controller() {
    let controller = client_node().await;
    let contact_key = Keypair::generate().unwrap();
    let contact_id = contact_key.public();
    let server = capwire::Node::builder("server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(common::echo_cap())
        .state(common::Shared::default())
        .bound_to(controller.id())
        .limits(Limits {
            max_inbound_sessions: 3,
            reserved_sessions: 2,
            ..Limits::default()
        })
        .start()
        .await
        .unwrap();
    server
        .add_contact(Contact {
            name: "friend".into(),
            id: contact_id,
            // Nobody listens there: the node's own dialling fails, quietly.
            addr: "127.0.0.1:9".parse().unwrap(),
        })
        .await
        .unwrap();
    let mut throwaway = Vec::new();
    for _ in 0..3 {
        throwaway.push(RawPeer::connect(&server).await);
    }
    wait_until("three sessions", || server.connected_peers().len() == 3).await;

    // A fourth stranger is refused with a clear error.
    let stranger = client_node().await;
    let refused = stranger
        .connect(&Addr::Tcp(tcp_addr(&server)), Some(server.id()))
        .await;
    assert!(
        matches!(
            &refused,
            Err(NodeError::Refused {
                code: CloseCode::Overloaded,
                ..
            })
        ),
        "{refused:?}"
    );

    // The bound control plane and the contact still get in.
    let cp = connect_tcp(&controller, &server).await;
    assert_eq!(
        cp.request(common::Admin, "x".into()).await.unwrap(),
        format!("x for {}", controller.id())
    );
    let friend = RawPeer::connect_as(&server, contact_key).await;
    assert!(!friend.ended);
    wait_until("both are in", || server.connected_peers().len() == 5).await;

    // The node still dials out: the outbound budget is its own.
    let (other, _) = echo_node(Limits::default()).await;
    let out = server
        .connect(&Addr::Tcp(tcp_addr(&other)), Some(other.id()))
        .await
        .expect("outbound sessions have their own budget");
    assert_eq!(out.id(), other.id());
    drop(throwaway);
}

fn verb(name: &str) -> VerbManifest {
    bare_manifest(NodeId::from_bytes([0; 32])).capabilities[0].verbs[0]
        .clone()
        .with_name(name)
}

trait WithName {
    fn with_name(self, name: &str) -> Self;
}

impl WithName for VerbManifest {
    fn with_name(mut self, name: &str) -> Self {
        self.name = name.try_into().unwrap();
        self
    }
}

fn app_cap(id: &str) -> CapabilityManifest {
    CapabilityManifest {
        id: id.try_into().unwrap(),
        version: "1.0.0".parse().unwrap(),
        params: None,
        verbs: vec![verb("go")],
    }
}

/// Manifests that break one rule of WIRE.md 3.1 each.
fn broken(id: NodeId) -> Vec<(&'static str, Manifest)> {
    let base = bare_manifest(id);
    let with = |f: &dyn Fn(&mut Manifest)| {
        let mut m = base.clone();
        f(&mut m);
        m
    };
    vec![
        (
            "unsorted capability ids",
            with(&|m| m.capabilities.push(app_cap("app.zz"))),
        ),
        (
            "duplicate capability ids",
            with(&|m| {
                m.capabilities.insert(0, app_cap("app.a"));
                m.capabilities.insert(0, app_cap("app.a"));
            }),
        ),
        (
            "a capability without verbs",
            with(&|m| {
                let mut c = app_cap("app.a");
                c.verbs.clear();
                m.capabilities.insert(0, c);
            }),
        ),
        (
            "params over 4096 bytes",
            with(&|m| {
                let mut c = app_cap("app.a");
                c.params = Some("p".repeat(4097));
                m.capabilities.insert(0, c);
            }),
        ),
        (
            "a schema over 16 KiB",
            with(&|m| {
                let mut c = app_cap("app.a");
                c.verbs[0].args_schema = Some("s".repeat(16 * 1024 + 1));
                m.capabilities.insert(0, c);
            }),
        ),
        (
            "a result schema on a notification",
            with(&|m| {
                let mut c = app_cap("app.a");
                c.verbs[0].kind = capwire::manifest::VerbKind::Notification;
                c.verbs[0].result_schema = Some("{}".into());
                m.capabilities.insert(0, c);
            }),
        ),
        ("a 65-byte app_id", with(&|m| m.app_id = "a".repeat(65))),
        (
            "a 1 MiB description",
            with(&|m| m.description = "d".repeat(1 << 20)),
        ),
        (
            "no core.monitoring",
            with(&|m| m.capabilities = vec![app_cap("app.a")]),
        ),
        (
            "too many capabilities",
            with(&|m| {
                let mut caps: Vec<_> = (0..200).map(|i| app_cap(&format!("app.c{i:03}"))).collect();
                caps.push(m.capabilities[0].clone());
                caps.sort_by(|a, b| a.id.cmp(&b.id));
                m.capabilities = caps;
            }),
        ),
    ]
}

#[tokio::test]
async fn manifests_that_break_the_rules_end_the_session() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let rules = broken(NodeId::from_bytes([0; 32])).len();
    for i in 0..rules {
        let key = Keypair::generate().unwrap();
        let (rule, manifest) = broken(key.public()).swap_remove(i);
        let stream = tokio::net::TcpStream::connect(tcp_addr(&server))
            .await
            .unwrap();
        let mut peer = RawPeer::over_with_manifest(stream, server.id(), key, &manifest).await;
        let frame = peer.next_frame(Duration::from_secs(5)).await;
        assert!(
            matches!(&frame, Some(Frame::Close(c)) if c.code == CloseCode::ProtocolError),
            "{rule}: {frame:?}"
        );
        peer.drain(Duration::from_millis(200)).await;
        assert!(peer.ended, "{rule}: the session ends");
    }
    assert!(server.connected_peers().is_empty());
}

#[tokio::test]
async fn a_hello_naming_the_key_in_another_encoding_is_refused() {
    let (server, _counters) = echo_node(Limits::default()).await;
    let key = Keypair::generate().unwrap();
    let mut alias = *key.public().as_bytes();
    alias[31] |= 0x80;
    let manifest = bare_manifest(NodeId::from_bytes(alias));
    let stream = tokio::net::TcpStream::connect(tcp_addr(&server))
        .await
        .unwrap();
    let mut peer = RawPeer::over_with_manifest(stream, server.id(), key, &manifest).await;
    let frame = peer.next_frame(Duration::from_secs(5)).await;
    assert!(
        matches!(&frame, Some(Frame::Close(c)) if c.code == CloseCode::ProtocolError),
        "{frame:?}"
    );
}

#[tokio::test]
async fn the_transport_limits_apply_to_the_node() {
    // A transport config the node must refuse.
    let mut bad = TransportConfig::default();
    bad.keepalive_interval = bad.idle_timeout;
    let r = capwire::Node::builder("x")
        .transport_config(bad)
        .start()
        .await;
    assert!(matches!(r, Err(NodeError::Transport(_))), "{r:?}");
    let r = capwire::Node::builder("x")
        .limits(Limits {
            max_handler_time: Duration::MAX,
            ..Limits::default()
        })
        .start()
        .await;
    assert!(matches!(r, Err(NodeError::Config(_))), "{r:?}");
}
