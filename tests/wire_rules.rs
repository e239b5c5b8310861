//! The node does what WIRE.md says, at its edges: close frames and their
//! transport codes, protocol versions, hello limits, bind expiry, budgets,
//! unsolicited answers, verb kinds, and keys in any encoding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use capwire::envelope::{
    CloseCode, ErrorCode, Frame, Hello, Limits as WireLimits, NodeId, RawValue, ReqId,
    encode_frame, encode_response_ok,
};
use capwire::manifest::{Manifest, MonitoringStatus};
use capwire::transport::CloseCode as TransportClose;
use capwire::{
    Addr, Capability, Contact, Keypair, Limits, Node, NodeError, State, TransportConfig,
};
use common::{
    Counters, ManualPeer, RawPeer, Say, bare_manifest, echo_node, echo_node_unlistening, raw,
    tcp_addr,
};

fn close_code(frames: &[Frame]) -> Option<CloseCode> {
    frames.iter().find_map(|f| match f {
        Frame::Close(c) => Some(c.code),
        _ => None,
    })
}

fn hello_with(manifest: &Manifest, protocol: u32, limits: WireLimits) -> Vec<u8> {
    let mut hello = Hello::new(RawValue::encode(manifest).unwrap(), limits);
    hello.protocol = protocol;
    let mut out = Vec::new();
    encode_frame(&Frame::Hello(hello), &mut out).unwrap();
    out
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_ends_with_an_idle_timeout_close_frame() {
    let mut transport = TransportConfig::default();
    transport.idle_timeout = Duration::from_secs(4);
    transport.keepalive_interval = Duration::from_secs(1);
    let server = Node::builder("idle")
        .transport_config(transport)
        .start()
        .await
        .unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let mut peer = ManualPeer::dial(a, server.id()).await;
    // We never send a keepalive; the node's own arrive every second.
    let frames = peer.read_for(Duration::from_secs(10)).await;
    assert_eq!(
        close_code(&frames),
        Some(CloseCode::IdleTimeout),
        "{frames:?}"
    );
    assert_eq!(
        peer.transport_close.map(|c| c.code),
        Some(TransportClose::Normal)
    );
}

#[tokio::test(start_paused = true)]
async fn another_protocol_version_is_answered_unsupported_protocol() {
    let (server, _) = echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let mut peer = ManualPeer::dial_silent(a, server.id()).await;
    peer.send(&hello_with(
        &bare_manifest(peer.id),
        2,
        WireLimits::default(),
    ))
    .await;
    let frames = peer.read_for(Duration::from_secs(2)).await;
    assert_eq!(close_code(&frames), Some(CloseCode::UnsupportedProtocol));
}

#[tokio::test(start_paused = true)]
async fn hello_limits_below_the_minimum_are_a_protocol_error() {
    let (server, _) = echo_node_unlistening(Limits::default()).await;
    for limits in [
        WireLimits {
            max_record: 0,
            ..WireLimits::default()
        },
        WireLimits {
            max_record: 65_535,
            ..WireLimits::default()
        },
        WireLimits {
            max_inflight: 0,
            ..WireLimits::default()
        },
    ] {
        let (a, b) = tokio::io::duplex(64 * 1024);
        server.accept_stream(b);
        let mut peer = ManualPeer::dial_silent(a, server.id()).await;
        peer.send(&hello_with(&bare_manifest(peer.id), 1, limits))
            .await;
        let frames = peer.read_for(Duration::from_secs(2)).await;
        assert_eq!(
            close_code(&frames),
            Some(CloseCode::ProtocolError),
            "{limits:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_close_frame_goes_with_transport_close_code_2() {
    let (server, _) = echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let mut peer = ManualPeer::dial(a, server.id()).await;
    peer.read_for(Duration::from_millis(50)).await;
    let stopping = {
        let server = server.clone();
        tokio::spawn(async move { server.shutdown().await })
    };
    let frames = peer.read_for(Duration::from_secs(3)).await;
    assert_eq!(close_code(&frames), Some(CloseCode::Shutdown));
    assert_eq!(
        peer.transport_close.map(|c| c.code),
        Some(TransportClose::Shutdown)
    );
    stopping.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_expired_pending_bind_is_announced_with_a_new_epoch() {
    let (server, _) = echo_node_unlistening(Limits::default()).await;
    let (a, b) = tokio::io::duplex(64 * 1024);
    server.accept_stream(b);
    let mut peer = ManualPeer::dial(a, server.id()).await;
    peer.read_for(Duration::from_millis(50)).await;
    let _invite = server.invite(None).unwrap();
    assert_eq!(server.manifest().monitoring, MonitoringStatus::Pending);
    let pending_epoch = server.manifest().epoch;
    let mut seen = Vec::new();
    // Keep the session alive past the bind's 300 s.
    for _ in 0..32 {
        peer.keepalive().await;
        seen.extend(peer.read_for(Duration::from_secs(10)).await);
    }
    let manifests: Vec<Manifest> = seen
        .iter()
        .filter_map(|f| match f {
            Frame::Hello(h) => Some(h.manifest.decode().unwrap()),
            _ => None,
        })
        .collect();
    let last = manifests.last().expect("manifest updates");
    assert_eq!(last.monitoring, MonitoringStatus::Off, "{manifests:?}");
    assert!(last.epoch > pending_epoch);
    assert_eq!(server.manifest().monitoring, MonitoringStatus::Off);
    assert_eq!(server.manifest().epoch, last.epoch);
}

#[tokio::test]
async fn a_budget_of_zero_is_a_timeout_and_nothing_runs() {
    let (server, counters) = echo_node(Limits::default()).await;
    let mut peer = RawPeer::connect(&server).await;
    peer.control_with_budget("app.echo", "say", "z", Some(0), &raw("x"))
        .await;
    let r = peer.response("z").await;
    assert_eq!(r.outcome.unwrap_err().code, ErrorCode::Timeout);
    assert_eq!(Counters::get(&counters.say), 0);
    // It was not remembered: the same request with a budget runs.
    peer.control_with_budget("app.echo", "say", "z", Some(1000), &raw("x"))
        .await;
    assert!(peer.response("z").await.outcome.is_ok());
    assert_eq!(Counters::get(&counters.say), 1);
}

#[tokio::test]
async fn an_unsolicited_response_is_ignored() {
    let (server, _) = echo_node(Limits::default()).await;
    let mut peer = RawPeer::connect(&server).await;
    let mut out = Vec::new();
    encode_response_ok(&mut out, &ReqId::try_from("nobody").unwrap(), &[0xf6]).unwrap();
    peer.send_record(out).await;
    peer.control("app.echo", "say", "after", &raw("x")).await;
    assert!(peer.response("after").await.outcome.is_ok());
    assert!(!peer.ended);
}

#[tokio::test]
async fn a_deadline_of_duration_max_does_not_overflow() {
    let (server, _) = echo_node(Limits::default()).await;
    let client = common::client_node().await;
    let peer = common::connect_tcp(&client, &server).await;
    let r = peer
        .request_within(Say, "forever".into(), Duration::MAX)
        .await
        .unwrap();
    assert_eq!(r, "echo: forever");
}

#[tokio::test]
async fn a_handler_needing_state_the_node_lacks_is_refused_at_build() {
    #[derive(Clone)]
    struct Missing;
    capwire::manifest::verb! { pub struct Needs: request "app.needs" / "it", Bootstrap, () => (); }
    async fn needs(_: (), State(_m): State<Missing>) -> Result<(), capwire::HandlerError> {
        Ok(())
    }
    let r = Node::builder("x")
        .capability(
            Capability::new("app.needs", "1.0.0")
                .unwrap()
                .handle(Needs, needs),
        )
        .start()
        .await;
    let Err(NodeError::Config(msg)) = r else {
        panic!("refused at build: {r:?}");
    };
    assert!(
        msg.contains("State<") && msg.contains("app.needs/it"),
        "{msg}"
    );
    // Given the state, it builds.
    let ok = Node::builder("x")
        .capability(
            Capability::new("app.needs", "1.0.0")
                .unwrap()
                .handle(Needs, needs),
        )
        .state(Missing)
        .start()
        .await
        .unwrap();
    ok.shutdown().await;
}

/// The same key with bit 255 set: another encoding of it.
fn alias(id: NodeId) -> NodeId {
    let mut b = *id.as_bytes();
    b[31] |= 0x80;
    NodeId::from_bytes(b)
}

#[tokio::test]
async fn node_apis_take_keys_in_any_encoding() {
    let (server, counters) = echo_node(Limits::default()).await;
    let client = common::client_node().await;
    common::connect_tcp(&client, &server).await;
    // peer(): the alias reaches the same session.
    let peer = client.peer(alias(server.id()));
    assert_eq!(peer.id(), server.id());
    assert_eq!(peer.request(Say, "a".into()).await.unwrap(), "echo: a");

    // invite(expected): the real key may use an invite made for its alias.
    let invite = server.invite(Some(alias(client.id()))).unwrap();
    let reply = peer
        .request(
            capwire::manifest::MonitoringBind,
            capwire::manifest::BindArgs {
                code: invite.code.unwrap(),
            },
        )
        .await
        .unwrap();
    assert_eq!(reply.manifest.monitoring, MonitoringStatus::On);
    assert_eq!(server.controller(), Some(client.id()));

    // bound_to(): an alias binds the real key.
    let bound = Node::builder("bound")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(common::echo_cap())
        .state(common::Shared::default())
        .bound_to(alias(client.id()))
        .start()
        .await
        .unwrap();
    assert_eq!(bound.controller(), Some(client.id()));
    let p = common::connect_tcp(&client, &bound).await;
    assert!(p.request(common::Admin, "x".into()).await.is_ok());

    // Contact ids: stored and dialled as the real key.
    let dialer = common::client_node().await;
    dialer
        .add_contact(Contact {
            name: "server".into(),
            id: alias(server.id()),
            addr: Addr::Tcp(tcp_addr(&server)),
        })
        .await
        .unwrap();
    assert_eq!(dialer.contacts()[0].id, server.id());
    let via = dialer
        .wait_for_peer(alias(server.id()), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(via.request(Say, "c".into()).await.unwrap(), "echo: c");
    assert!(Counters::get(&counters.say) >= 2);
    let _ = Keypair::generate();
}
