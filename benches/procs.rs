//! Two processes on loopback, as a cluster runs: the serving end is a
//! process of its own, the calling end this one, each with a 2-worker
//! tokio runtime (the machine's two cores shared by both, as two nodes on
//! one host share theirs).
//!
//! - capwire: a `capwire node` process (the command users run: its
//!   `app.agent/echo` answers `NAME: TEXT`, `app.agent/note` counts; run
//!   with `RUST_LOG=warn`, as its note logs at `info`) and a
//!   capwire node in this process calling it;
//! - snow: this binary started again as a snow echo server
//!   (`Noise_XX_25519_ChaChaPoly_BLAKE2s`, one Noise message per payload,
//!   as in the node bench), a snow client here;
//! - raw TCP: the same server without Noise.
//!
//! Figures, each the best of 3 interleaved runs: the round trip of a 64 B
//! payload, requests with 128 in flight, one-way 64 B messages (capwire:
//! notifications, then one request that comes back once they are all
//! handled; the baselines: messages, then one the server answers with the
//! count it received), and a new connection's first answer (capwire: a
//! client node started beforehand connects and makes one request).
//!
//! `cargo bench --bench procs`; `--quick` or `CAPWIRE_BENCH_QUICK=1` for
//! small counts, run once.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use capwire::manifest::verb;
use capwire::{Addr, Node, NodeId, Peer};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/calls.rs"]
mod calls;
use calls::{per_op_us, rate_k};
#[path = "support/wire.rs"]
mod wire;
use wire::Wire;

verb! { /** The node's echo. */ pub struct Echo: request "app.agent" / "echo", Bootstrap, String => String; }
verb! { /** The node's note. */ pub struct Note: notification "app.agent" / "note", Bootstrap, String; }

const PAYLOAD: usize = 64;
const WINDOW: usize = 128;

/// First byte of a baseline message: answer it with itself.
const ECHO: u8 = 0;
/// Take it and answer nothing.
const SINK: u8 = 1;
/// Answer with the count of sink messages since the last report.
const REPORT: u8 = 2;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    Capwire,
    Snow,
    Raw,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Rtt,
    Pipe,
    Faf,
    Connect,
}

impl Which {
    fn label(self) -> &'static str {
        match self {
            Which::Rtt => "round trip, sequential",
            Which::Pipe => "requests, 128 in flight",
            Which::Faf => "one-way 64 B messages",
            Which::Connect => "connect to first answer",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Which::Rtt | Which::Connect => "µs",
            Which::Pipe | Which::Faf => "k msg/s",
        }
    }

    fn higher_is_better(self) -> bool {
        matches!(self, Which::Pipe | Which::Faf)
    }

    fn count(self, quick: bool) -> u64 {
        match (self, quick) {
            (Which::Rtt, false) => 20_000,
            (Which::Rtt, true) => 500,
            (Which::Pipe, false) => 200_000,
            (Which::Pipe, true) => 5_000,
            (Which::Faf, false) => 1_000_000,
            (Which::Faf, true) => 20_000,
            (Which::Connect, false) => 200,
            (Which::Connect, true) => 20,
        }
    }
}

// ---------------------------------------------------------------------------
// The serving processes

/// A server process and where it listens.
struct Server {
    child: Child,
    addr: String,
    id: Option<NodeId>,
}

/// Starts a server process with piped input and output.
fn spawn(cmd: &mut Command) -> (Child, BufReader<ChildStdout>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

impl Server {
    fn capwire() -> Self {
        let (mut child, mut out) = spawn(
            Command::new(env!("CARGO_BIN_EXE_capwire"))
                .args(["node", "--no-invite", "--json", "--name", "bench"])
                // Its note handler logs each note at `info`: not what is measured.
                .env("RUST_LOG", "warn"),
        );
        let ready = std::iter::from_fn(|| {
            let mut line = String::new();
            (out.read_line(&mut line).ok()? > 0).then_some(line)
        })
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
        .find(|v| v["node_id"].is_string());
        let Some(v) = ready else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("capwire node ended before it was ready");
        };
        Self {
            child,
            addr: v["addrs"][0].as_str().unwrap().to_owned(),
            id: Some(v["node_id"].as_str().unwrap().parse().unwrap()),
        }
    }

    fn baseline(noise: bool) -> Self {
        let (child, mut out) = spawn(
            Command::new(std::env::current_exe().unwrap())
                .args(["--serve", if noise { "snow" } else { "raw" }]),
        );
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        Self {
            child,
            addr: line.trim().to_owned(),
            id: None,
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The baseline server: echoes, sinks and reports on every connection.
fn serve(noise: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        });
        tokio::pin!(stdin_closed);
        loop {
            tokio::select! {
                _ = &mut stdin_closed => return,
                accepted = listener.accept() => {
                    let Ok((s, _)) = accepted else { return };
                    tokio::spawn(async move {
                        let mut wire = Wire::open(s, noise, false).await;
                        let mut msg = Vec::new();
                        let mut sunk = 0u64;
                        while wire.recv(&mut msg).await {
                            match msg.first().copied() {
                                Some(SINK) => sunk += 1,
                                Some(REPORT) => {
                                    wire.send(&sunk.to_be_bytes()).await;
                                    sunk = 0;
                                }
                                _ => wire.send(&msg).await,
                            }
                            if !wire.buffered() {
                                wire.flush().await;
                            }
                        }
                    });
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------
// The calling end

async fn baseline(addr: &str, noise: bool, which: Which, n: u64) -> f64 {
    let connect =
        || async { Wire::open(TcpStream::connect(addr).await.unwrap(), noise, true).await };
    let mut payload = [7u8; PAYLOAD];
    let mut msg = Vec::new();
    if which == Which::Connect {
        let mut open = Vec::new();
        let mut total = Duration::ZERO;
        payload[0] = ECHO;
        for _ in 0..n {
            let start = Instant::now();
            let mut wire = connect().await;
            wire.send(&payload).await;
            wire.flush().await;
            assert!(wire.recv(&mut msg).await);
            total += start.elapsed();
            open.push(wire);
        }
        return per_op_us(total, n);
    }
    let mut wire = connect().await;
    let start = Instant::now();
    match which {
        Which::Rtt => {
            payload[0] = ECHO;
            for _ in 0..n {
                wire.send(&payload).await;
                wire.flush().await;
                assert!(wire.recv(&mut msg).await);
                assert_eq!(msg.len(), PAYLOAD);
            }
            per_op_us(start.elapsed(), n)
        }
        Which::Pipe => {
            payload[0] = ECHO;
            wire.pipelined(&payload, n, WINDOW as u64).await;
            rate_k(start.elapsed(), n)
        }
        Which::Faf => {
            payload[0] = SINK;
            for _ in 0..n {
                wire.send(&payload).await;
            }
            wire.send(&[REPORT]).await;
            wire.flush().await;
            assert!(wire.recv(&mut msg).await);
            assert_eq!(u64::from_be_bytes(msg[..8].try_into().unwrap()), n);
            rate_k(start.elapsed(), n)
        }
        Which::Connect => unreachable!("handled above"),
    }
}

async fn capwire_figure(peer: &Peer, which: Which, n: u64) -> f64 {
    let payload = "x".repeat(PAYLOAD);
    let start = Instant::now();
    match which {
        Which::Rtt => {
            for _ in 0..n {
                peer.request(Echo, payload.clone()).await.unwrap();
            }
            per_op_us(start.elapsed(), n)
        }
        Which::Pipe => {
            calls::pipelined(peer, Echo, &payload, n, WINDOW).await;
            rate_k(start.elapsed(), n)
        }
        Which::Faf => {
            for _ in 0..n {
                peer.notify(Note, payload.clone()).await.unwrap();
            }
            // Records are handled in order: this answer comes once every
            // note before it was.
            peer.request(Echo, payload.clone()).await.unwrap();
            rate_k(start.elapsed(), n)
        }
        Which::Connect => unreachable!("calls::connect_each"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args[i + 1] == "snow");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick" || a == "--test")
        || std::env::var("CAPWIRE_BENCH_QUICK").is_ok_and(|v| v != "0");
    let runs = if quick { 1 } else { 3 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let servers = [
        Server::capwire(),
        Server::baseline(true),
        Server::baseline(false),
    ];
    let cw_addr: Addr = servers[0].addr.parse().unwrap();
    let cw_id = servers[0].id.unwrap();
    let (client, peer) = rt.block_on(async {
        let client = Node::builder("bench-client").start().await.unwrap();
        let peer = client.connect(&cw_addr, Some(cw_id)).await.unwrap();
        (client, peer)
    });
    println!(
        "two processes on loopback (server | this process), 2-worker runtimes, {PAYLOAD} B \
         payload, best of {runs} interleaved runs{}",
        if quick { " (quick)" } else { "" }
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9}  {:<8} {:>8} {:>8}",
        "", "capwire", "snow", "raw tcp", "unit", "cw/snow", "cw/raw"
    );
    for which in [Which::Rtt, Which::Pipe, Which::Faf, Which::Connect] {
        let n = which.count(quick);
        let mut best: [Option<f64>; 3] = [None; 3];
        for _ in 0..runs {
            for (i, stack) in [Stack::Capwire, Stack::Snow, Stack::Raw]
                .into_iter()
                .enumerate()
            {
                let v = rt.block_on(async {
                    match stack {
                        Stack::Capwire if which == Which::Connect => per_op_us(
                            calls::connect_each(&cw_addr, cw_id, n, Echo, &"x".repeat(PAYLOAD))
                                .await,
                            1,
                        ),
                        Stack::Capwire => capwire_figure(&peer, which, n).await,
                        Stack::Snow => baseline(&servers[1].addr, true, which, n).await,
                        Stack::Raw => baseline(&servers[2].addr, false, which, n).await,
                    }
                });
                best[i] = Some(match best[i] {
                    None => v,
                    Some(b) if which.higher_is_better() => b.max(v),
                    Some(b) => b.min(v),
                });
            }
        }
        let [c, s, r] = best.map(Option::unwrap);
        println!(
            "{:<34} {c:>9.1} {s:>9.1} {r:>9.1}  {:<8} {:>7.2}x {:>7.2}x",
            format!("{} ({n})", which.label()),
            which.unit(),
            c / s,
            c / r,
        );
    }
    rt.block_on(client.shutdown());
    for s in servers {
        s.stop();
    }
}
