//! `capwire node`: runs a node.
//!
//! Prints what a peer needs to reach it: its id, where it listens and,
//! while it is unbound, an invite a control plane can bind it with. With
//! `--supervised` it speaks the process host's pipe protocol instead (one
//! JSON object a line on stdout, requests on stdin) and stops when its
//! stdin closes.

use std::path::PathBuf;

use capwire::host::{InProcessHost, ProcessHost};
use capwire::manifest::MonitoringStatus;
use capwire::{Addr, Contact, Invite, Node, NodeId};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_util::codec::{FramedRead, LinesCodec};

use crate::agent::{self, AgentName};
use crate::exit::Failure;

/// Who runs the node's children (`core.cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HostKind {
    /// Each child a node inside this process.
    InProcess,
    /// Each child a `capwire node` process (needs `--state`).
    Process,
    /// Each child a Docker container (needs the `docker` feature and a
    /// Docker daemon; see `--image`).
    Docker,
    /// Each child a Docker Swarm service (needs a swarm manager).
    Swarm,
}

/// Arguments of `capwire node`.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// Keep the node's state (identity, contacts, binding, configuration,
    /// roster) in this directory; without it, nothing survives the process.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// Use the identity in this key file (from `capwire keygen --out`);
    /// with --state, it must be the state's identity or the state new.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Listen here (`tcp://HOST:PORT`, `HOST:PORT` or `unix:PATH`); may be
    /// repeated. Default: tcp://127.0.0.1:0 (a free port).
    #[arg(long, value_name = "ADDR")]
    listen: Vec<Addr>,
    /// Serve metrics in the Prometheus text format at
    /// http://ADDR/metrics (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// The node's name (also how its `app.agent/echo` signs answers).
    #[arg(long, default_value = "capwire-node")]
    name: String,
    /// The application id in the node's manifest.
    #[arg(long, default_value = "capwire.node")]
    app: String,
    /// The node's description in its manifest (a child's bio).
    #[arg(long, value_name = "TEXT", default_value = "")]
    description: String,
    /// Do not open a bind while unbound (by default an unbound node opens
    /// one at start and prints its invite, and again when its control
    /// plane lets it go; an expired code needs a restart).
    #[arg(long)]
    no_invite: bool,
    /// Only this control plane (its key, 64 hex digits) may bind.
    #[arg(long, value_name = "KEY")]
    expect: Option<NodeId>,
    /// Who runs the node's children.
    #[arg(long, value_enum, default_value = "in-process")]
    host: HostKind,
    /// Print the startup lines as one JSON object.
    #[arg(long)]
    json: bool,
    /// Run as a child of a process host: JSON lines on stdout, requests on
    /// stdin, stop when stdin closes (or at SIGTERM).
    #[arg(long)]
    supervised: bool,
    #[command(flatten)]
    engine: crate::engine::EngineArgs,
    /// For tests of a container host's memory limit only: once ready, take
    /// this much memory (e.g. 512m), a MiB at a time, and hold it.
    #[arg(long, value_name = "SIZE", hide = true, value_parser = crate::engine::parse_size)]
    dangerous_hog_memory_for_testing: Option<u64>,
}

pub(crate) fn agent_builder(app: &str, name: &str) -> capwire::NodeBuilder {
    Node::builder(app)
        .name(name)
        .capability(agent::capability())
        .state(AgentName::new(name))
}

fn print(v: &Value) {
    use std::io::Write;
    // A reader that went away (a parent that closed the pipe) is not a
    // reason to panic: a supervised node stops when its input closes.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}").and_then(|()| out.flush());
}

pub(crate) async fn run(args: NodeArgs) -> Result<(), Failure> {
    let mut builder = agent_builder(&args.app, &args.name).description(args.description.clone());
    if let Some(path) = &args.key {
        let key = capwire::identity::read_key_file(path)
            .map_err(|e| Failure::failed(format!("cannot use the key: {e}")))?;
        builder = builder.keypair(key);
    }
    if let Some(dir) = &args.state {
        builder = builder.state_dir(dir.clone());
    }
    let listen = if args.listen.is_empty() {
        vec![Addr::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))]
    } else {
        args.listen.clone()
    };
    for a in listen {
        builder = builder.listen(a);
    }
    let children = args.state.as_ref().map(|d| d.join("children"));
    builder = match (args.host, children) {
        (HostKind::Process, Some(base)) => {
            let program = std::env::current_exe()
                .map_err(|e| Failure::failed(format!("cannot find this program: {e}")))?;
            builder.host(ProcessHost::new(program, base))
        }
        (HostKind::Process, None) => {
            return Err(Failure::usage("--host process needs --state DIR"));
        }
        (HostKind::Docker | HostKind::Swarm, _) => {
            crate::engine::with_host(builder, args.host == HostKind::Swarm, &args.engine)?
        }
        (HostKind::InProcess, base) => {
            let app = args.app.clone();
            let mut host =
                InProcessHost::new().with_factory(move |spec| agent_builder(&app, &spec.name));
            if let Some(base) = base {
                host = host.state_dir(base);
            }
            builder.host(host)
        }
    };
    let node = builder
        .start()
        .await
        .map_err(|e| Failure::failed(format!("the node did not start: {e}")))?;
    let metrics = match args.metrics {
        Some(addr) => Some(
            capwire::prometheus::MetricsServer::bind(addr, node.clone())
                .await
                .map_err(|e| Failure::failed(format!("cannot serve metrics on {addr}: {e}")))?,
        ),
        None => None,
    };
    let metrics_addr = metrics
        .as_ref()
        .map(|m| format!("http://{}/metrics", m.local_addr()));
    let invite = if !args.no_invite && !args.supervised && node.controller().is_none() {
        Some(
            node.invite(args.expect)
                .map_err(|e| Failure::failed(format!("no invite: {e}")))?,
        )
    } else {
        None
    };
    let addrs: Vec<String> = node.local_addrs().iter().map(ToString::to_string).collect();
    if args.supervised {
        let caps: Vec<String> = node
            .manifest()
            .capabilities
            .iter()
            .map(|c| format!("{}@{}", c.id, c.version))
            .collect();
        print(
            &json!({"event": "ready", "node_id": node.id().to_string(), "addrs": addrs, "caps": caps}),
        );
        let _hog = args
            .dangerous_hog_memory_for_testing
            .map(|size| tokio::spawn(hog(size)));
        tokio::select! {
            () = supervised(&node) => {}
            () = wait_for_signal() => {}
        }
    } else {
        if args.json {
            print(&json!({
                "node_id": node.id().to_string(),
                "addrs": addrs,
                "invite": invite.as_ref().map(ToString::to_string),
                "metrics": metrics_addr,
            }));
        } else {
            println!("node      {}", node.id());
            for a in &addrs {
                println!("listening {a}");
            }
            if let Some(m) = &metrics_addr {
                println!("metrics   {m}");
            }
            if let Some(i) = &invite {
                println!("invite    {i}");
            }
        }
        if args.no_invite {
            wait_for_signal().await;
        } else {
            tokio::select! {
                () = wait_for_signal() => {}
                () = invite_while_unbound(&node, args.expect, args.json) => {}
            }
        }
    }
    node.shutdown().await;
    Ok(())
}

/// Opens a new bind, and prints its invite, when the node's control plane
/// lets it go (`disable`). A code that expired or was guessed wrong too
/// often is not replaced: that would give a guesser new attempts without
/// end; restart the node for a new one.
async fn invite_while_unbound(node: &Node, expect: Option<NodeId>, json: bool) {
    let mut watch = node.watch_manifest();
    let mut was_bound = node.controller().is_some();
    while let Some(m) = watch.changed().await {
        let bound = node.controller().is_some();
        let released = was_bound && !bound;
        was_bound = bound;
        if !released || m.monitoring != capwire::manifest::MonitoringStatus::Off {
            continue;
        }
        match node.invite(expect) {
            Ok(i) if json => print(&json!({"invite": i.to_string()})),
            Ok(i) => println!("invite    {i}"),
            Err(e) => tracing::warn!("no new invite: {e}"),
        }
    }
}

/// Takes `size` bytes, a MiB at a time (each page written), and holds
/// them: a child that goes over its memory limit, for the container
/// hosts' tests.
async fn hog(size: u64) {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut taken = 0u64;
    while taken < size {
        held.push(vec![1u8; 1 << 20]);
        taken += 1 << 20;
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    std::future::pending::<()>().await;
    drop(held);
}

/// Returns at Ctrl-C or SIGTERM.
pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Longest line of the pipe protocol, either way (the process host's
/// bound), its newline not counted.
const PIPE_MAX_LINE: usize = 64 * 1024;

/// The pipe protocol's report of the node's monitoring: its status and
/// the control plane it is bound to now.
fn monitoring_line(status: MonitoringStatus, controller: Option<NodeId>) -> Value {
    json!({
        "event": "monitoring",
        "status": status,
        "controller": controller.map(|c| c.to_string()),
    })
}

/// Serves the parent's requests until stdin closes; reports the node's
/// monitoring state at once and whenever its status or its controller
/// changes. A line from the parent that breaks the pipe protocol (over
/// its bound, not UTF-8, not a request) ends it as a closed stdin does.
async fn supervised(node: &Node) {
    let mut watch = node.watch_manifest();
    let mut last = (watch.current().monitoring, node.controller());
    print(&monitoring_line(last.0, last.1));
    let codec = LinesCodec::new_with_max_length(PIPE_MAX_LINE);
    let mut lines = FramedRead::new(tokio::io::stdin(), codec);
    loop {
        tokio::select! {
            line = lines.next() => match line {
                Some(Ok(line)) => match request(node, &line).await {
                    Some(reply) => {
                        let ready = reply.get("node_id").is_some();
                        print(&reply);
                        // A parent that attached anew learns the state too.
                        if ready {
                            print(&monitoring_line(last.0, last.1));
                        }
                    }
                    None => {
                        tracing::error!("the parent sent a line that is not a request: stopping");
                        return;
                    }
                },
                Some(Err(e)) => {
                    tracing::error!(error = %e, "the parent broke the pipe protocol: stopping");
                    return;
                }
                // The parent is gone (or closed our input): stop.
                None => return,
            },
            changed = watch.changed() => match changed {
                // Also woken when a new controller leaves the status as
                // it was.
                Some(m) => {
                    let now = (m.monitoring, node.controller());
                    if now != last {
                        last = now;
                        print(&monitoring_line(now.0, now.1));
                    }
                }
                None => return,
            },
        }
    }
}

async fn request(node: &Node, line: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(line).ok()?;
    let id = v["id"].as_u64()?;
    let result: Result<Value, String> = match v["op"].as_str() {
        Some("open_bind") => match v["controller"].as_str().map(NodeId::try_from) {
            Some(Ok(cp)) => node
                .invite(Some(cp))
                .map(|i: Invite| json!({"invite": i.to_string()}))
                .map_err(|e| e.to_string()),
            _ => Err("open_bind needs a controller key".into()),
        },
        Some("close_bind") => {
            node.cancel_invite();
            node.unbind()
                .await
                .map(|_| json!({}))
                .map_err(|e| e.to_string())
        }
        Some("ready") => {
            let caps: Vec<String> = node
                .manifest()
                .capabilities
                .iter()
                .map(|c| format!("{}@{}", c.id, c.version))
                .collect();
            let addrs: Vec<String> = node.local_addrs().iter().map(ToString::to_string).collect();
            Ok(json!({"node_id": node.id().to_string(), "addrs": addrs, "caps": caps}))
        }
        Some("add_contact") => {
            let contact = (|| {
                Some(Contact {
                    name: v["name"].as_str()?.to_owned(),
                    id: NodeId::try_from(v["node_id"].as_str()?).ok()?,
                    addr: v["addr"].as_str()?.parse().ok()?,
                })
            })();
            match contact {
                Some(c) => node
                    .add_contact(c)
                    .await
                    .map(|_| json!({}))
                    .map_err(|e| e.to_string()),
                None => Err("add_contact needs name, node_id and addr".into()),
            }
        }
        _ => Err("unknown op".into()),
    };
    Some(match result {
        Ok(mut extra) => {
            extra["reply"] = json!(id);
            extra["ok"] = json!(true);
            extra
        }
        Err(e) => json!({"reply": id, "ok": false, "error": e}),
    })
}
