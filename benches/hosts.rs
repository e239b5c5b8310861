//! Children placed by the container host beside children as processes, in
//! the same run, on the same machine (host networking, loopback):
//!
//! - `create`: from `core.cluster/create` to the child's first answer (the
//!   control plane watches it, binds it with its invite, and calls
//!   `app.agent/echo`);
//! - `idle`: the resident memory of an idle child (its process's RSS, read
//!   from `/proc`; for a container, its process as the host sees it);
//! - `rtt`: 64 B round trips to a child, one at a time.
//!
//! Each figure is printed for both hosts with the ratio container/process.
//! Without a Docker engine the bench says so in one line and stops.
//! `cargo bench --bench hosts` (best of 3 creates, 2,000 round trips);
//! `--quick` or `CAPWIRE_BENCH_QUICK=1` for 1 create and 200 round trips.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use capwire::envelope::RawValue;
use capwire::host::{DockerHost, EngineConfig, Host, ProcessHost};
use capwire::manifest::{
    ChildArgs, ClusterContact, ClusterCreate, ClusterRemove, ClusterSetMonitoring, CreateArgs,
    SetMonitoringArgs,
};
use capwire::{Invite, Node, Peer};

#[path = "support/opts.rs"]
mod opts;
use opts::Opts;

fn docker(args: &[&str]) -> Option<String> {
    let out = Command::new("docker").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Removes every container and volume made for `parent`.
fn clean(parent: &str) {
    let filter = format!("label=capwire.parent={parent}");
    for c in docker(&["ps", "-aq", "--filter", &filter])
        .unwrap_or_default()
        .split_whitespace()
    {
        docker(&["rm", "-f", "-v", c]);
    }
    for v in docker(&["volume", "ls", "-q", "--filter", &filter])
        .unwrap_or_default()
        .split_whitespace()
    {
        docker(&["volume", "rm", "-f", v]);
    }
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The pid of the process whose command line holds `needle`.
fn pid_with(needle: &str) -> Option<String> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(needle) {
            return Some(name);
        }
    }
    None
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Process,
    Container,
}

struct Figures {
    create: Duration,
    idle_kib: Option<u64>,
}

/// A parent, its control plane and one child, kept for the round trips.
struct Setup {
    parent: Node,
    cp: Node,
    to_parent: Peer,
    cid: String,
    child: Peer,
}

impl Setup {
    async fn close(self) {
        self.to_parent
            .request(ClusterRemove, ChildArgs { cid: self.cid })
            .await
            .unwrap();
        self.cp.shutdown().await;
        self.parent.shutdown().await;
    }
}

/// Watches child `cid`, binds it with its invite, and calls it once.
async fn first_answer(cp: &Node, to_parent: &Peer, cid: &str) -> Peer {
    to_parent
        .request(
            ClusterSetMonitoring,
            SetMonitoringArgs {
                cid: cid.into(),
                enabled: true,
            },
        )
        .await
        .unwrap();
    let contact = to_parent
        .request(ClusterContact, ChildArgs { cid: cid.into() })
        .await
        .unwrap();
    let invite: Invite = contact.invite.parse().unwrap();
    let (child, _) = cp.connect_invite(&invite).await.unwrap();
    echo(&child).await;
    child
}

async fn echo(child: &Peer) {
    let text = RawValue::encode(&"x".repeat(64)).unwrap();
    child
        .call_raw("app.agent", "echo", &text, Duration::from_secs(10))
        .await
        .unwrap();
}

async fn measure(
    kind: Kind,
    host: impl Host,
    opts: &Opts,
    base: &std::path::Path,
) -> (Figures, Setup) {
    let parent = Node::builder("bench-parent")
        .listen("127.0.0.1:0".parse().unwrap())
        .host(host)
        .start()
        .await
        .unwrap();
    clean(&parent.id().to_string());
    let cp = Node::builder("bench-cp").start().await.unwrap();
    let (to_parent, _) = cp
        .connect_invite(&parent.invite(Some(cp.id())).unwrap())
        .await
        .unwrap();

    let creates = opts.count(3, 1);
    let mut create = Duration::MAX;
    let mut last = None;
    for i in 0..creates {
        let started = Instant::now();
        let member = to_parent
            .request(
                ClusterCreate,
                CreateArgs {
                    name: format!("w{i}"),
                    bio: None,
                },
            )
            .await
            .unwrap();
        let child = first_answer(&cp, &to_parent, &member.cid).await;
        create = create.min(started.elapsed());
        if let Some((cid, _)) = last.replace((member.cid.clone(), child)) {
            to_parent
                .request(ClusterRemove, ChildArgs { cid })
                .await
                .unwrap();
        }
    }
    let (cid, child) = last.unwrap();

    // Idle for a moment, then its resident memory.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = match kind {
        Kind::Container => {
            let filter_p = format!("label=capwire.parent={}", parent.id());
            let filter_c = format!("label=capwire.cid={cid}");
            docker(&["ps", "-q", "--filter", &filter_p, "--filter", &filter_c])
                .and_then(|id| docker(&["inspect", "--format", "{{.State.Pid}}", &id]))
        }
        Kind::Process => pid_with(&base.join(&cid).to_string_lossy()),
    };
    let idle_kib = pid.as_deref().and_then(rss_kib);

    (
        Figures { create, idle_kib },
        Setup {
            parent,
            cp,
            to_parent,
            cid,
            child,
        },
    )
}

/// `n` round trips to `child`, per call.
async fn round_trips(child: &Peer, n: u64) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        echo(child).await;
    }
    started.elapsed() / u32::try_from(n).unwrap()
}

fn main() {
    let opts = Opts::from_env();
    if docker(&["info", "--format", "{{.ServerVersion}}"]).is_none() {
        println!("hosts: no Docker engine answers; nothing measured");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_capwire");
    let built = Command::new(bin)
        .args(["image", "build", "--tag", "capwire:latest"])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "capwire image build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let base = tempfile::tempdir().unwrap();
    let (process, p) = rt.block_on(measure(
        Kind::Process,
        ProcessHost::new(bin, base.path().to_path_buf()),
        &opts,
        base.path(),
    ));
    let (container, c) = rt.block_on(measure(
        Kind::Container,
        DockerHost::new(EngineConfig::default()),
        &opts,
        base.path(),
    ));
    // The same without the default limit of one CPU: what the container's
    // own isolation costs, apart from the CPU quota.
    let mut unlimited = EngineConfig::default();
    unlimited.defaults.cpus_milli = None;
    let (_, f) = rt.block_on(measure(
        Kind::Container,
        DockerHost::new(unlimited),
        &opts,
        base.path(),
    ));
    // Round trips interleaved, best of the runs, so that the machine's
    // moods hit all three alike.
    let n = opts.count(2_000, 200);
    let (mut rtt_p, mut rtt_c, mut rtt_f) = (Duration::MAX, Duration::MAX, Duration::MAX);
    rt.block_on(async {
        for child in [&p.child, &c.child, &f.child] {
            round_trips(child, n / 10).await;
        }
        for _ in 0..opts.runs.max(3) {
            rtt_p = rtt_p.min(round_trips(&p.child, n).await);
            rtt_c = rtt_c.min(round_trips(&c.child, n).await);
            rtt_f = rtt_f.min(round_trips(&f.child, n).await);
        }
        for s in [p, c, f] {
            s.close().await;
        }
    });

    println!("children on one machine, host networking, loopback: container host vs process host");
    println!(
        "{:<44}{:>12}{:>12}{:>10}",
        "", "container", "process", "ratio"
    );
    let row = |what: &str, c: f64, p: f64, unit: &str| {
        println!("{what:<44}{c:>12.1}{p:>12.1}{:>9.2}x  {unit}", c / p);
    };
    row(
        "create to the child's first answer (best)",
        container.create.as_secs_f64() * 1e3,
        process.create.as_secs_f64() * 1e3,
        "ms",
    );
    match (container.idle_kib, process.idle_kib) {
        (Some(c), Some(p)) => row(
            "resident memory of an idle child",
            c as f64 / 1024.0,
            p as f64 / 1024.0,
            "MiB",
        ),
        _ => println!("resident memory of an idle child: not found"),
    }
    row(
        "round trip, 64 B, one at a time (best)",
        rtt_c.as_secs_f64() * 1e6,
        rtt_p.as_secs_f64() * 1e6,
        "µs",
    );
    row(
        "the same, the container without a CPU limit",
        rtt_f.as_secs_f64() * 1e6,
        rtt_p.as_secs_f64() * 1e6,
        "µs",
    );
    let ratio = rtt_c.as_secs_f64() / rtt_p.as_secs_f64();
    println!(
        "target: round trip container/process <= 1.05x: {:.2}x, {}",
        ratio,
        if ratio <= 1.05 { "met" } else { "missed" }
    );
}
