//! `capwire demo`: a control plane and a cluster of agents on loopback,
//! with real keys and encrypted sessions, walked through every feature
//! with a line per step. Any step that does not do what it should ends
//! the demo with a non-zero exit code naming the step.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use capwire::authz::BindFailure;
use capwire::envelope::{ErrorCode, RawValue};
use capwire::grants::{Right, revocation_ids};
use capwire::host::InProcessHost;

use crate::engine::EngineArgs;
use capwire::json::cbor_to_json;
use capwire::manifest::{
    ChildArgs, ClusterContact, ClusterCreate, ClusterIntroduce, ClusterList, ClusterRemove,
    ClusterSetMonitoring, CopyDirection, CopyRecord, CreateArgs, DeclaredClass, GetConfig,
    IntroducePairArgs, Manifest, NoArgs, SetConfig, SetConfigArgs, SetMonitoringArgs,
    TaskEventKind, TaskState,
};
use capwire::{CallError, ControlEvent, Invite, Limits, Node, NodeError, NodeId, Peer};

use crate::agent::{
    Ask, AskArgs, Echo, HandOn, HandOnArgs, Note, Probe, ProbeArgs, Tell, Work, WorkArgs, WorkStep,
};
use crate::exit::Failure;
use crate::node::agent_builder;

/// Arguments of `capwire demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// How many agents the cluster gets (2 to 16).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=16))]
    agents: u8,
    /// Where the agents run: in this process, or as Docker containers
    /// (host networking, loopback; the image is built from this program
    /// when it is missing).
    #[arg(long, value_enum, default_value_t = DemoHost::InProcess)]
    host: DemoHost,
}

/// Where the demo's agents run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DemoHost {
    /// In this process (the default: fast).
    InProcess,
    /// As Docker containers, on the local engine.
    Docker,
}

const STEPS: usize = 15;
const APP: &str = "capwire.demo";
/// The control plane's stream window, in items: small, so that the
/// stream step shows the credit at work.
const WINDOW: u32 = 4;

/// Prints the steps as they run.
struct Narrator {
    n: usize,
}

impl Narrator {
    async fn step<T>(
        &mut self,
        title: &str,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<T, Failure> {
        self.n += 1;
        print!("[{:>2}/{STEPS}] {title} ... ", self.n);
        let _ = std::io::stdout().flush();
        let started = Instant::now();
        match tokio::time::timeout(Duration::from_secs(30), work).await {
            Ok(Ok(v)) => {
                println!("ok ({} ms)", started.elapsed().as_millis());
                flush_said();
                Ok(v)
            }
            Ok(Err(e)) => {
                println!("FAILED");
                flush_said();
                Err(Failure::failed(format!(
                    "step {} ({title}) failed: {e}",
                    self.n
                )))
            }
            Err(_) => {
                println!("FAILED");
                flush_said();
                Err(Failure::failed(format!(
                    "step {} ({title}) did not finish in 30 s",
                    self.n
                )))
            }
        }
    }
}

/// What the running step said, printed after its result.
static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn say(line: impl AsRef<str>) {
    SAID.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line.as_ref().to_owned());
}

fn flush_said() {
    for line in SAID
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
    {
        println!("        {line}");
    }
}

fn short(id: &NodeId) -> String {
    id.to_string().chars().take(12).collect()
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The pushes the control plane received, in order.
#[derive(Default)]
struct Pushes(Mutex<Vec<ControlEvent>>);

impl Pushes {
    fn all(&self) -> Vec<ControlEvent> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn copies(&self) -> Vec<(NodeId, CopyRecord)> {
        self.all()
            .into_iter()
            .filter_map(|e| match e {
                ControlEvent::Copy { from, record } => Some((from, record)),
                _ => None,
            })
            .collect()
    }

    /// Waits until a push matches, or 5 s pass.
    async fn wait_for(&self, what: impl Fn(&ControlEvent) -> bool) -> Option<ControlEvent> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(e) = self.all().into_iter().find(|e| what(e)) {
                return Some(e);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One agent as the control plane knows it.
struct Agent {
    name: String,
    cid: String,
    peer: Peer,
}

fn expect_denied(
    result: Result<impl std::fmt::Debug, CallError>,
    code: ErrorCode,
) -> Result<String, String> {
    match result {
        Err(CallError::Denied(body)) if body.code == code => {
            Ok(format!("{}: {}", body.code, body.message))
        }
        other => Err(format!("expected {code}, got {other:?}")),
    }
}

/// How long the demo's grant is valid, and its handed-on copy.
const GRANT_FOR: Duration = Duration::from_secs(3);
const HAND_ON_FOR: Duration = Duration::from_secs(2);

pub(crate) async fn run(args: DemoArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let agents_wanted = usize::from(args.agents);
    let host = args.host;
    let mut narrator = Narrator { n: 0 };
    println!("capwire demo: a control plane and a cluster of {agents_wanted} agents on loopback\n");

    // 1. The node and the control plane.
    let (hub, cp) = narrator
        .step(
            "start a node and a control plane (each with its own X25519 key)",
            async {
                let hub = agent_builder(APP, "hub").listen("127.0.0.1:0".parse().map_err(err)?);
                let hub = match host {
                    DemoHost::InProcess => hub.host(
                        InProcessHost::new().with_factory(|spec| agent_builder(APP, &spec.name)),
                    ),
                    DemoHost::Docker => {
                        crate::engine::ensure_image().await.map_err(err)?;
                        crate::engine::with_host(hub, false, &EngineArgs::default()).map_err(err)?
                    }
                };
                let hub = hub.start().await.map_err(err)?;
                let cp = Node::builder("capwire.demo.control-plane")
                    .name("control-plane")
                    .limits(Limits {
                        stream_window_items: WINDOW,
                        ..Limits::default()
                    })
                    .start()
                    .await
                    .map_err(err)?;
                let hub_addr = hub
                    .local_addrs()
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                say(format!(
                    "node          {} listening on {hub_addr}",
                    hub.id()
                ));
                say(format!("control plane {}", cp.id()));
                Ok((hub, cp))
            },
        )
        .await?;
    let pushes = Arc::new(Pushes::default());
    let mut events = cp.control_events();
    let collector = {
        let pushes = Arc::clone(&pushes);
        tokio::spawn(async move {
            while let Ok(e) = events.recv().await {
                pushes
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e);
            }
        })
    };

    // 2. The bind ceremony.
    let parent = narrator
        .step(
            "bind the node with its one-time code (a wrong code first)",
            async {
                let invite = hub.invite(Some(cp.id())).map_err(err)?;
                say(format!("the node prints its invite: {invite}"));
                let code = invite.code.clone().unwrap_or_default();
                let mut wrong = invite.clone();
                wrong.code = Some(code.chars().rev().collect());
                match cp.connect_invite(&wrong).await {
                    Err(NodeError::Bind(CallError::Denied(body))) => {
                        let why = body
                            .detail
                            .and_then(|d| d.decode::<BindFailure>().ok())
                            .map_or_else(|| body.message.clone(), |f| f.to_string());
                        say(format!("a wrong code is refused: {}: {why}", body.code));
                    }
                    other => return Err(format!("a wrong code was not refused: {other:?}")),
                }
                let (peer, reply) = cp.connect_invite(&invite).await.map_err(err)?;
                let reply = reply.ok_or("no bind reply")?;
                if hub.controller() != Some(cp.id()) {
                    return Err("the node does not name the control plane as its controller".into());
                }
                say(format!(
                    "bound over Noise XX: the node's monitoring is {}, roster v{}, config v{}",
                    reply.manifest.monitoring,
                    reply.version,
                    cbor_to_json(&reply.config).map_err(err)?["version"]
                ));
                Ok(peer)
            },
        )
        .await?;

    // 3. Manifests.
    narrator
        .step("read the node's manifest", async {
            let manifest = parent.manifest().ok_or("no manifest")?;
            for line in manifest_lines(&manifest) {
                say(line);
            }
            Ok(())
        })
        .await?;

    // 4. Children.
    let agents = narrator
        .step(&format!("create {agents_wanted} agents and watch each (core.cluster)"), async {
            let mut agents = Vec::new();
            for i in 1..=agents_wanted {
                let name = format!("agent-{i}");
                let member = parent
                    .request(ClusterCreate, CreateArgs { name: name.clone(), bio: Some(format!("demo agent {i}")) })
                    .await
                    .map_err(err)?;
                parent
                    .request(ClusterSetMonitoring, SetMonitoringArgs { cid: member.cid.clone(), enabled: true })
                    .await
                    .map_err(err)?;
                let contact = parent
                    .request(ClusterContact, ChildArgs { cid: member.cid.clone() })
                    .await
                    .map_err(err)?;
                let invite: Invite = contact.invite.parse().map_err(err)?;
                let (peer, _) = cp.connect_invite(&invite).await.map_err(err)?;
                say(format!(
                    "{name}: cid {}, node {}, its own key, store and listener; bound to this control plane",
                    member.cid,
                    short(&peer.id())
                ));
                agents.push(Agent { name, cid: member.cid, peer });
            }
            let roster = parent.request(ClusterList, NoArgs {}).await.map_err(err)?;
            say(format!("roster v{}: {} members", roster.version, roster.members.len()));
            if let Some(m) = agents.first().and_then(|a: &Agent| a.peer.manifest()) {
                say(format!("{}'s manifest, read from its session:", m.name));
                for line in manifest_lines(&m).into_iter().skip(1).filter(|l| l.starts_with("app.")) {
                    say(format!("  {line}"));
                }
            }
            pushes
                .wait_for(|e| matches!(e, ControlEvent::Roster { roster: r, .. } if r.members.len() == agents_wanted))
                .await
                .ok_or("no roster push with every agent reached the control plane")?;
            say("each change was pushed to the control plane as a new roster version");
            Ok(agents)
        })
        .await?;
    let (first, second) = (&agents[0], &agents[1]);
    // Kept for the summary: a removed agent's session (and manifest) goes.
    let manifests: HashMap<NodeId, Arc<Manifest>> = agents
        .iter()
        .filter_map(|a| a.peer.manifest().map(|m| (a.peer.id(), m)))
        .collect();

    // 5. A request.
    narrator
        .step(
            &format!("call {}'s app.agent/echo (request/response)", first.name),
            async {
                let said = first
                    .peer
                    .request(Echo, "hello".to_owned())
                    .await
                    .map_err(err)?;
                if said != format!("{}: hello", first.name) {
                    return Err(format!("unexpected answer {said:?}"));
                }
                say(format!("answer: {said:?}"));
                Ok(())
            },
        )
        .await?;

    // 6. A notification.
    narrator
        .step("send the node a fire-and-forget app.agent/note", async {
            parent
                .notify(Note, "the demo says hi".to_owned())
                .await
                .map_err(err)?;
            say("no answer comes back; the node's counters show its handler ran:");
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let ran = hub
                    .metrics()
                    .count("app.agent", "note", capwire::Outcome::Ok);
                if ran == 1 {
                    say("  app.agent/note ok = 1");
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!("the note's handler ran {ran} times, not once"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await?;

    // 7. A stream.
    narrator
        .step(
            &format!(
                "{}'s app.agent/tell streams its answer ({WINDOW} items of credit at a time)",
                first.name
            ),
            async {
                let text = "streams come word by word as the caller takes them";
                let before = cp.stats();
                let opened = Instant::now();
                let mut words = first
                    .peer
                    .stream(Tell, text.to_owned())
                    .await
                    .map_err(err)?;
                let mut got: Vec<String> = Vec::new();
                let mut most = 0;
                while let Some(word) = words.next().await {
                    let word = word.map_err(err)?;
                    // A consumer slower than the agent: it fills the
                    // window, then sends one item per item taken.
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let waiting = words.buffered();
                    most = most.max(waiting);
                    say(format!(
                        "+{:>3} ms  item {:>2} {:<12} {waiting} more arrived, not taken yet",
                        opened.elapsed().as_millis(),
                        got.len() + 1,
                        format!("{word:?}"),
                    ));
                    got.push(word);
                }
                let answer = got.join(" ");
                if answer != format!("{}: {text}", first.name) {
                    return Err(format!("the items do not make the answer: {answer:?}"));
                }
                if most > WINDOW as usize {
                    return Err(format!(
                        "{most} items waited to be taken: more than the window of {WINDOW}"
                    ));
                }
                let after = cp.stats();
                say(format!("{} items, then the end: {answer:?}", got.len()));
                say(format!(
                    "never more than {WINDOW} on their way or waiting: the agent sent each one \
                     only with credit, which the caller grants as it takes items ({} received)",
                    after.stream_items_received - before.stream_items_received
                ));
                Ok(())
            },
        )
        .await?;

    // 8. A task.
    narrator
        .step(
            &format!(
                "submit a task to {}'s app.agent/work: progress, a question, an answer, a result",
                first.name
            ),
            async {
                let text = "index the docs";
                let args = WorkArgs {
                    text: text.to_owned(),
                    steps: Some(3),
                    step_ms: Some(20),
                    ask: true,
                };
                let task = first.peer.submit(Work, args).await.map_err(err)?;
                say(format!(
                    "task {} written at {} before the answer; its events:",
                    task.id(),
                    first.name
                ));
                let mut events = task.events(1).await.map_err(err)?;
                let mut answered = false;
                while let Some(event) = events.next().await {
                    let event = event.map_err(err)?;
                    let body = match event.kind {
                        TaskEventKind::Progress => event
                            .body
                            .decode::<WorkStep>()
                            .map(|s| format!("step {} of {}", s.step, s.of))
                            .map_err(err)?,
                        _ if event.body.is_null() => String::new(),
                        _ => cbor_to_json(&event.body).map_err(err)?.to_string(),
                    };
                    let kind = format!("{:?}", event.kind).to_lowercase();
                    let line = format!(
                        "  #{} {:<14} {kind:<8} {body}",
                        event.seq,
                        event.state.as_str()
                    );
                    say(line.trim_end());
                    if event.state == TaskState::InputRequired && !answered {
                        task.respond(&true).await.map_err(err)?;
                        answered = true;
                        say("  (answered true with core.tasks/respond)");
                    }
                }
                let result = task.result().await.map_err(err)?;
                if !answered || result != format!("{}: {text}: done in 3 steps", first.name) {
                    return Err(format!("unexpected end: answered {answered}, {result:?}"));
                }
                say(format!("result: {result:?}"));
                Ok(())
            },
        )
        .await?;

    // 9. Unknown verb.
    narrator
        .step(
            "call a verb the node's manifest does not list (app.agent/launch)",
            async {
                let empty = RawValue::encode(&NoArgs {}).map_err(err)?;
                let result = parent
                    .call_raw("app.agent", "launch", &empty, Duration::from_secs(5))
                    .await;
                say(format!(
                    "denied by the chokepoint, no handler ran: {}",
                    expect_denied(result, ErrorCode::UnknownVerb)?
                ));
                Ok(())
            },
        )
        .await?;

    // 10. Introduce, and one agent calls another.
    narrator
        .step(
            &format!(
                "introduce {} and {}; {} calls {}",
                first.name, second.name, first.name, second.name
            ),
            async {
                parent
                    .request(
                        ClusterIntroduce,
                        IntroducePairArgs {
                            peer_a: first.cid.clone(),
                            peer_b: second.cid.clone(),
                        },
                    )
                    .await
                    .map_err(err)?;
                let said = first
                    .peer
                    .request(
                        Ask,
                        AskArgs {
                            peer: second.peer.id().to_string(),
                            text: format!("hi from {}", first.name),
                        },
                    )
                    .await
                    .map_err(err)?;
                say(format!("{} asked {}: {said:?}", first.name, second.name));
                Ok(())
            },
        )
        .await?;

    // 11. An agent tries a controller verb.
    narrator
        .step(
            &format!(
                "{} tries {}'s controller verb app.agent/ask",
                second.name, first.name
            ),
            async {
                let answer = second
                    .peer
                    .request(
                        Probe,
                        ProbeArgs {
                            peer: first.peer.id().to_string(),
                            cap: "app.agent".into(),
                            verb: "ask".into(),
                            token: None,
                        },
                    )
                    .await
                    .map_err(err)?;
                if !answer.contains("unauthorized") {
                    return Err(format!("expected unauthorized, got {answer:?}"));
                }
                say(format!(
                    "{} is not {}'s control plane: {answer}",
                    second.name, first.name
                ));
                Ok(())
            },
        )
        .await?;

    // 12. Delegated rights: a grant, handed on, expiring.
    {
        let third = agents.get(2);
        let title = match third {
            Some(third) => format!(
                "grant {} {}'s core.configuration/get_config for {} s; it hands it on to {}; both expire",
                second.name,
                first.name,
                GRANT_FOR.as_secs(),
                third.name
            ),
            None => format!(
                "grant {} {}'s core.configuration/get_config for {} s; it expires",
                second.name,
                first.name,
                GRANT_FOR.as_secs()
            ),
        };
        narrator
            .step(
                &title,
                async {
                    let probe = |who: &Agent, token: Option<String>| {
                        let peer = who.peer.clone();
                        let args = ProbeArgs {
                            peer: first.peer.id().to_string(),
                            cap: "core.configuration".into(),
                            verb: "get_config".into(),
                            token,
                        };
                        async move { peer.request(Probe, args).await.map_err(err) }
                    };
                    // The agents meet (a session between them carries
                    // their grant keys).
                    for (a, b) in third.iter().flat_map(|t| [(second, *t), (first, *t)]) {
                        parent
                            .request(
                                ClusterIntroduce,
                                IntroducePairArgs {
                                    peer_a: a.cid.clone(),
                                    peer_b: b.cid.clone(),
                                },
                            )
                            .await
                            .map_err(err)?;
                    }
                    if let Some(third) = third {
                        second
                            .peer
                            .request(Ask, AskArgs { peer: third.peer.id().to_string(), text: "hello".into() })
                            .await
                            .map_err(err)?;
                    }
                    let holder_key = second.peer.grant_key().ok_or("no grant key in the manifest")?;
                    let granted_at = Instant::now();
                    let token = cp
                        .grant(
                            &first.peer,
                            second.peer.id(),
                            holder_key,
                            vec![Right::verb("core.configuration", "get_config")],
                            GRANT_FOR,
                        )
                        .await
                        .map_err(err)?;
                    let id = revocation_ids(&token).map_err(err)?.remove(0);
                    say(format!(
                        "the control plane mints a biscuit token ({} characters) for {}, signed with its grant key",
                        token.len(),
                        second.name
                    ));
                    let answer = probe(second, Some(token.clone())).await?;
                    if answer != "ok" {
                        return Err(format!("{} was refused with its grant: {answer}", second.name));
                    }
                    say(format!("{} presents it and calls {}'s controller verb: {answer}", second.name, first.name));
                    if let Some(third) = third {
                    let copy = second
                        .peer
                        .request(
                            HandOn,
                            HandOnArgs {
                                token: token.clone(),
                                to: third.peer.id().to_string(),
                                verbs: None,
                                for_ms: Some(u64::try_from(HAND_ON_FOR.as_millis()).unwrap_or(u64::MAX)),
                            },
                        )
                        .await
                        .map_err(err)?;
                    let answer = probe(third, Some(copy)).await?;
                    if answer != "ok" {
                        return Err(format!("{} was refused with its copy: {answer}", third.name));
                    }
                    say(format!(
                        "{} hands a copy to {}, valid {} s, signed with its own key; {} calls: {answer}",
                        second.name,
                        third.name,
                        HAND_ON_FOR.as_secs(),
                        third.name
                    ));
                    let stolen = probe(third, Some(token)).await?;
                    if !stolen.contains("holder") {
                        return Err(format!("a stolen token was not refused: {stolen}"));
                    }
                    say(format!("{} presenting {}'s own token is refused: {stolen}", third.name, second.name));
                    }
                    pushes
                        .wait_for(|e| matches!(e, ControlEvent::Copy { record, .. } if record.grant.as_deref() == Some(id.as_str())))
                        .await
                        .ok_or("no monitoring copy named the token")?;
                    say(format!("{}'s monitoring copies name the token that let the call through ({}…)", first.name, &id[..16]));
                    tokio::time::sleep((granted_at + GRANT_FOR + Duration::from_millis(1100)).saturating_duration_since(Instant::now())).await;
                    for who in std::iter::once(second).chain(third) {
                        let answer = probe(who, None).await?;
                        if !answer.contains("expired") {
                            return Err(format!("{} was not refused after the expiry: {answer}", who.name));
                        }
                    }
                    say(if third.is_some() {
                        "after the expiry both are refused: the token has expired"
                    } else {
                        "after the expiry it is refused: the token has expired"
                    });
                    Ok(())
                },
            )
            .await?;
    }

    // 12. Configuration.
    narrator
        .step("set the node's configuration with compare-and-set", async {
            let value = RawValue::encode(
                &serde_json::json!({"replicas": agents_wanted, "region": "local"}),
            )
            .map_err(err)?;
            let set = parent
                .request(
                    SetConfig,
                    SetConfigArgs {
                        value: value.clone(),
                        if_version: Some(0),
                    },
                )
                .await
                .map_err(err)?;
            say(format!(
                "set_config if_version 0: now version {}",
                set.version
            ));
            let stale = parent
                .request(
                    SetConfig,
                    SetConfigArgs {
                        value: RawValue::encode(&serde_json::json!({"replicas": 0}))
                            .map_err(err)?,
                        if_version: Some(0),
                    },
                )
                .await;
            match stale {
                Err(CallError::Remote(body)) if body.code == ErrorCode::Conflict => {
                    say(format!(
                        "set_config if_version 0 again: refused, {}: {}",
                        body.code, body.message
                    ));
                }
                other => {
                    return Err(format!(
                        "a stale compare-and-set was not refused: {other:?}"
                    ));
                }
            }
            let got = parent.request(GetConfig, NoArgs {}).await.map_err(err)?;
            if got.value != value {
                return Err("get_config did not return what was set".into());
            }
            say(format!(
                "get_config: version {} {}",
                got.version,
                cbor_to_json(&got.value).map_err(err)?
            ));
            Ok(())
        })
        .await?;

    // 13. Remove an agent.
    let last = agents.last().ok_or_else(|| Failure::failed("no agents"))?;
    narrator
        .step(&format!("remove {} (core.cluster/remove)", last.name), async {
            parent.request(ClusterRemove, ChildArgs { cid: last.cid.clone() }).await.map_err(err)?;
            let roster = parent.request(ClusterList, NoArgs {}).await.map_err(err)?;
            if roster.members.iter().any(|m| m.cid == last.cid) {
                return Err("the removed agent is still in the roster".into());
            }
            let version = roster.version;
            pushes
                .wait_for(|e| matches!(e, ControlEvent::Roster { roster: r, .. } if r.version == version))
                .await
                .ok_or("the roster push for the removal did not arrive")?;
            say(format!("roster v{version}: {} members, pushed to the control plane", roster.members.len()));
            Ok(())
        })
        .await?;

    // 14. Monitoring copies.
    let copies = narrator
        .step("look at the monitoring copies the agents sent", async {
            let copies = pushes.copies();
            if copies.is_empty() {
                return Err("no monitoring copies arrived".into());
            }
            let gaps: u64 = copies.iter().map(|(_, r)| r.dropped).sum();
            say(format!(
                "{} copies of control messages in and out, {} dropped; the latest:",
                copies.len(),
                gaps
            ));
            for (from, record) in copies.iter().rev().take(6).rev() {
                say(format!("  {}", copy_line(&agents, &cp, *from, record)));
            }
            Ok(copies)
        })
        .await?;

    summary(&hub, &cp, &agents, &manifests, &copies);
    if host == DemoHost::Docker {
        // Containers outlive their parent (one that starts again adopts
        // them): the demo removes its own, volumes and all.
        for a in &agents {
            if let Err(e) = parent
                .request(ClusterRemove, ChildArgs { cid: a.cid.clone() })
                .await
            {
                eprintln!("capwire demo: {} was not removed: {e}", a.name);
            }
        }
    }
    collector.abort();
    cp.shutdown().await;
    hub.shutdown().await;
    println!(
        "\nall {STEPS} steps passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn manifest_lines(m: &Manifest) -> Vec<String> {
    let mut lines = vec![format!(
        "{} (app {}), epoch {}, monitoring {}",
        m.name, m.app_id, m.epoch, m.monitoring
    )];
    for c in &m.capabilities {
        let verbs: Vec<String> = c
            .verbs
            .iter()
            .map(|v| format!("{} ({}, {})", v.name.as_str(), v.kind, v.class))
            .collect();
        lines.push(format!(
            "{} {}: {}",
            c.id.as_str(),
            c.version,
            verbs.join(", ")
        ));
    }
    lines
}

fn name_of(agents: &[Agent], cp: &Node, id: NodeId) -> String {
    if id == cp.id() {
        return "control-plane".into();
    }
    agents
        .iter()
        .find(|a| a.peer.id() == id)
        .map_or_else(|| short(&id), |a| a.name.clone())
}

fn copy_line(agents: &[Agent], cp: &Node, from: NodeId, r: &CopyRecord) -> String {
    let (arrow, word) = match r.dir {
        CopyDirection::In => ("<-", "from"),
        CopyDirection::Out => ("->", "to"),
    };
    let body = if r.truncated {
        format!("({} bytes)", r.body_len)
    } else {
        cbor_to_json(&r.body).map_or_else(|_| "?".into(), |v| v.to_string())
    };
    let body: String = body.chars().take(50).collect();
    format!(
        "#{:<3} {:<8} {arrow} {word:<4} {:<9} {}/{} {}",
        r.seq,
        name_of(agents, cp, from),
        name_of(agents, cp, r.peer),
        r.cap,
        r.verb,
        body
    )
}

/// The summary: what the node decided (its own counters), and what each
/// agent received, judged by its chokepoint's rule, from the copies.
fn summary(
    hub: &Node,
    cp: &Node,
    agents: &[Agent],
    manifests: &HashMap<NodeId, Arc<Manifest>>,
    copies: &[(NodeId, CopyRecord)],
) {
    println!("\nthe node's decisions (its counters per cap, verb and outcome):");
    println!("  {:<36} {:<14} {:>5}", "CAP/VERB", "OUTCOME", "COUNT");
    for row in hub.metrics().rows {
        let name = match (&row.cap, &row.verb) {
            (Some(c), Some(v)) => format!("{c}/{v}"),
            _ => "(unlisted names)".into(),
        };
        println!(
            "  {:<36} {:<14} {:>5}",
            name,
            row.outcome.as_str(),
            row.count
        );
    }

    let mut table: BTreeMap<(String, String), [u64; 3]> = BTreeMap::new();
    for (from, r) in copies {
        let row = table
            .entry((name_of(agents, cp, *from), format!("{}/{}", r.cap, r.verb)))
            .or_default();
        match r.dir {
            CopyDirection::Out => row[2] += 1,
            CopyDirection::In => {
                row[0] += 1;
                let class = manifests
                    .get(from)
                    .and_then(|m| m.capability(&r.cap))
                    .and_then(|c| c.verb(&r.verb))
                    .map(|v| v.class);
                let denied = match class {
                    None => true,
                    // A grant names the token that let a call through.
                    Some(DeclaredClass::Controller) => r.peer != cp.id() && r.grant.is_none(),
                    Some(_) => false,
                };
                if denied {
                    row[1] += 1;
                }
            }
        }
    }
    println!("\nwhat the agents received and sent (from their monitoring copies):");
    println!(
        "  {:<10} {:<32} {:>8} {:>7} {:>5}",
        "AGENT", "CAP/VERB", "RECEIVED", "DENIED", "SENT"
    );
    for ((agent, verb), [received, denied, sent]) in &table {
        println!("  {agent:<10} {verb:<32} {received:>8} {denied:>7} {sent:>5}");
    }
}
