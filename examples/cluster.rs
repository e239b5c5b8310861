//! A control plane and a small cluster: the control plane binds a node,
//! has it create three agent children, watches them, introduces two, has
//! one call the other, reads the roster, sets the node's configuration
//! with compare-and-set, and removes a child. Everything runs on loopback
//! in this process (the node's default host runs children in process).
use std::time::Duration;

use capwire::envelope::RawValue;
use capwire::host::InProcessHost;
use capwire::manifest::{
    ChildArgs, ClusterContact, ClusterCreate, ClusterIntroduce, ClusterList, ClusterRemove,
    ClusterSetMonitoring, CreateArgs, GetConfig, IntroducePairArgs, NoArgs, SetConfig,
    SetConfigArgs, SetMonitoringArgs, verb,
};
use capwire::{Capability, ControlEvent, HandlerError, Invite, Node, NodeHandle, NodeId, State};

verb! { /** Answers with the agent's name. */ pub struct Echo: request "app.agent" / "echo", Bootstrap, String => String; }
verb! { /** Makes the agent call another agent's echo. */ pub struct Ask: request "app.agent" / "ask", Controller, (NodeId, String) => String; }

#[derive(Clone)]
struct Name(String);

async fn echo(text: String, State(Name(me)): State<Name>) -> Result<String, HandlerError> {
    Ok(format!("{me} heard: {text}"))
}

async fn ask((peer, text): (NodeId, String), node: NodeHandle) -> Result<String, HandlerError> {
    let unavailable = |e: capwire::CallError| {
        HandlerError::new(capwire::envelope::ErrorCode::Unavailable, e.to_string())
    };
    node.peer(peer)
        .request(Echo, text)
        .await
        .map_err(unavailable)
}

/// Each child is an agent node with `app.agent`.
fn agent(name: &str) -> capwire::NodeBuilder {
    let cap = Capability::new("app.agent", "1.0.0").expect("a valid version");
    Node::builder("agent")
        .capability(cap.handle(Echo, echo).handle(Ask, ask))
        .state(Name(name.to_owned()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = Node::builder("cluster-node")
        .listen("127.0.0.1:0".parse()?)
        .host(InProcessHost::new().with_factory(|spec| agent(&spec.name)))
        .start()
        .await?;
    let cp = Node::builder("control-plane").start().await?;
    let mut pushes = cp.control_events();

    // The node prints an invite; the control plane binds it with it.
    let invite = node.invite(Some(cp.id()))?.to_string();
    println!("invite: {invite}");
    let (parent, _) = cp.connect_invite(&invite.parse()?).await?;

    // Three children, each watched by the control plane.
    let mut agents = Vec::new();
    for name in ["alice", "bob", "carol"] {
        let m = parent
            .request(
                ClusterCreate,
                CreateArgs {
                    name: name.into(),
                    bio: None,
                },
            )
            .await?;
        parent
            .request(
                ClusterSetMonitoring,
                SetMonitoringArgs {
                    cid: m.cid.clone(),
                    enabled: true,
                },
            )
            .await?;
        let contact = parent
            .request(ClusterContact, ChildArgs { cid: m.cid.clone() })
            .await?;
        let (child, _) = cp
            .connect_invite(&contact.invite.parse::<Invite>()?)
            .await?;
        println!(
            "created {name} ({}), now watched: {}",
            m.cid,
            m.node_id.map(|i| i.to_string()).unwrap_or_default()
        );
        agents.push((m.cid, child));
    }

    // Alice and Bob become each other's contacts; Alice calls Bob.
    let (alice, bob) = (&agents[0], &agents[1]);
    parent
        .request(
            ClusterIntroduce,
            IntroducePairArgs {
                peer_a: alice.0.clone(),
                peer_b: bob.0.clone(),
            },
        )
        .await?;
    let said = alice
        .1
        .request(Ask, (bob.1.id(), "hello from alice".into()))
        .await?;
    println!("alice asked bob: {said}");

    let roster = parent.request(ClusterList, NoArgs {}).await?;
    for m in &roster.members {
        println!(
            "roster v{}: {} {} monitoring={:?} status={:?}",
            roster.version, m.cid, m.name, m.monitoring, m.status
        );
    }

    // Configuration with compare-and-set.
    let v1 = parent
        .request(
            SetConfig,
            SetConfigArgs {
                value: RawValue::encode("replicas=3")?,
                if_version: Some(0),
            },
        )
        .await?;
    let stale = parent
        .request(
            SetConfig,
            SetConfigArgs {
                value: RawValue::encode("replicas=5")?,
                if_version: Some(0),
            },
        )
        .await;
    println!(
        "config set to version {}; a stale write got: {}",
        v1.version,
        stale.map_or_else(|e| e.to_string(), |_| "ok?".into())
    );
    let config = parent.request(GetConfig, NoArgs {}).await?;
    println!(
        "config now: {} (version {})",
        config.value.decode::<String>()?,
        config.version
    );

    parent
        .request(
            ClusterRemove,
            ChildArgs {
                cid: agents[2].0.clone(),
            },
        )
        .await?;
    println!(
        "removed carol; {} children left",
        parent.request(ClusterList, NoArgs {}).await?.members.len()
    );

    // What the nodes pushed to the control plane meanwhile.
    let (mut rosters, mut copies) = (0, 0);
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(300), pushes.recv()).await {
        match e {
            ControlEvent::Roster { .. } => rosters += 1,
            ControlEvent::Copy { record, .. } => {
                copies += 1;
                println!(
                    "copy #{} {:?} {}/{}",
                    record.seq, record.dir, record.cap, record.verb
                );
            }
            _ => {}
        }
    }
    println!("the control plane received {rosters} roster pushes and {copies} monitoring copies");

    cp.shutdown().await;
    node.shutdown().await;
    Ok(())
}
