//! A state-changing control request that outlives its caller's deadline
//! still finishes, once; the caller's retry (same req_id) is answered
//! what really happened, not the `timeout` it saw.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use capwire::envelope::ReqId;
use capwire::host::{ChildInfo, ChildSpec, Host, HostError, HostEvent, HostFuture};
use capwire::manifest::{ChildStatus, ClusterCreate, ClusterList, CreateArgs, NoArgs};
use capwire::{CallError, Contact, Invite, Keypair, Limits, Node, NodeId};
use tokio::sync::{Notify, mpsc};

/// A host whose `start` waits until the test lets it go.
struct SlowHost {
    release: Arc<Notify>,
    child: NodeId,
}

impl Host for SlowHost {
    fn start(&self, _spec: ChildSpec) -> HostFuture<'_, ChildInfo> {
        Box::pin(async move {
            self.release.notified().await;
            Ok(ChildInfo {
                node_id: self.child,
                addrs: vec!["127.0.0.1:9".parse().unwrap()],
                caps: vec!["core.monitoring@1.1.0".into()],
            })
        })
    }
    fn stop(&self, _cid: &str) -> HostFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn open_bind(&self, cid: &str, _: NodeId) -> HostFuture<'_, Invite> {
        let cid = cid.to_owned();
        Box::pin(async move { Err(HostError::NotFound(cid)) })
    }
    fn close_bind(&self, _cid: &str) -> HostFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn add_contact(&self, _cid: &str, _: Contact) -> HostFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn events(&self) -> Option<mpsc::Receiver<HostEvent>> {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_past_its_deadline_finishes_once_and_its_retry_gets_the_member() {
    let release = Arc::new(Notify::new());
    // The node answers `timeout` itself after 100 ms, while the caller
    // would wait much longer.
    let node = Node::builder("parent")
        .limits(Limits {
            max_handler_time: Duration::from_millis(100),
            ..Limits::default()
        })
        .listen("127.0.0.1:0".parse().unwrap())
        .host(SlowHost {
            release: release.clone(),
            child: Keypair::generate().unwrap().public(),
        })
        .start()
        .await
        .unwrap();
    let cp = Node::builder("cp").start().await.unwrap();
    let (peer, _) = cp
        .connect_invite(&node.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();
    let req = ReqId::try_from("create-slow").unwrap();
    let args = || CreateArgs {
        name: "slow".into(),
        bio: None,
    };
    let first = peer
        .request_with_id(ClusterCreate, args(), &req, Duration::from_secs(5))
        .await;
    assert!(matches!(first, Err(CallError::Timeout)), "{first:?}");
    // The create goes on without its caller; the host finishes.
    release.notify_one();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let roster = peer.request(ClusterList, NoArgs {}).await.unwrap();
        if roster
            .members
            .iter()
            .any(|m| m.status == ChildStatus::Running)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{roster:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The retry, right away (well within the replay window): the member.
    let retried = peer
        .request_with_id(ClusterCreate, args(), &req, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(retried.name, "slow");
    assert_eq!(retried.status, ChildStatus::Running);
    let roster = peer.request(ClusterList, NoArgs {}).await.unwrap();
    assert_eq!(roster.members.len(), 1, "created once");
    cp.shutdown().await;
    node.shutdown().await;
}
