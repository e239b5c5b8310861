//! What tracing costs a call (README, "Tracing"). A 64 B request
//! (`app.bench/echo`) one at a time between two nodes of one process,
//! both on one 2-worker runtime, in three modes, each in a process of its
//! own (the global `tracing` subscriber is per process), the modes in
//! turn, in rounds, so that all three share the machine's moods:
//!
//! - `off`: no subscriber at all, as a node runs with no exporter
//!   configured (the baseline);
//! - `all`: an OpenTelemetry layer (`tracing-opentelemetry`) exporting
//!   every call's client and server spans over OTLP/HTTP (protobuf, batch
//!   processor) to a sink in the parent process (target: at most 1.3x);
//! - `ratio`: the same with 1% of the traces sampled (parent-based,
//!   trace-id ratio; target: at most 1.05x).
//!
//! Every call starts a trace of its own (the caller's client span is a
//! root). The figure is the median of the per-call round trips; p99
//! beside it. The cost of tracing built in but not configured, against
//! the library before tracing, is `benches/node.rs` run on both builds
//! (README).
//!
//! `cargo bench --bench trace` (about a minute); `--quick` or
//! `CAPWIRE_BENCH_QUICK=1` for seconds; `CAPWIRE_BENCH_N` calls per run.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Node, Peer};

#[path = "support/runtimes.rs"]
mod runtimes;
use runtimes::{Placement, run_on};
#[path = "support/figures.rs"]
mod figures;
use figures::{median, verdict};
#[path = "support/opts.rs"]
mod opts;
use opts::Opts;

verb! { /** Echo. */
pub struct Echo: request "app.bench" / "echo", Bootstrap, String => String; }

async fn echo(s: String) -> Result<String, HandlerError> {
    Ok(s)
}

const MODE: &str = "CAPWIRE_BENCH_TRACE_MODE";

fn main() {
    match std::env::var(MODE) {
        Ok(mode) => child(&mode),
        Err(_) => parent(),
    }
}

/// An OTLP/HTTP sink: answers every request `200` with an empty body,
/// counting the bytes it was sent.
fn sink() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bytes = Arc::new(AtomicU64::new(0));
    let counted = bytes.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    // The request line and headers.
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = l.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    counted.fetch_add(len as u64, Ordering::Relaxed);
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if out.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), bytes)
}

fn parent() {
    let opts = Opts::from_env();
    let rounds = if opts.quick { 2 } else { 6 };
    let n = opts.count(3_000, 300);
    let (endpoint, sent) = sink();
    let exe = std::env::current_exe().unwrap();
    let modes = ["off", "all", "ratio"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..rounds {
        for (i, mode) in modes.iter().enumerate() {
            let out = Command::new(&exe)
                .env(MODE, mode)
                .env("CAPWIRE_BENCH_N", n.to_string())
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the {mode} run failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            times[i].extend(
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(|t| t.parse::<f64>().unwrap()),
            );
        }
    }
    let p99 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    };
    let base = median(times[0].clone());
    println!(
        "trace off   64 B round trip p50 {base:.1} µs, p99 {:.1} µs (no subscriber: the baseline)",
        p99(&times[0])
    );
    for (i, (mode, target)) in [("all", 1.3), ("ratio", 1.05)].iter().enumerate() {
        let m = median(times[i + 1].clone());
        let r = m / base;
        println!(
            "trace {mode:<5} 64 B round trip p50 {m:.1} µs, p99 {:.1} µs: {r:.3}x off (target <= {target}x) {}",
            p99(&times[i + 1]),
            verdict(r <= *target)
        );
    }
    println!(
        "  exported: {:.1} MB of OTLP in all ({} calls a run, {rounds} rounds)",
        sent.load(Ordering::Relaxed) as f64 / 1e6,
        n
    );
}

/// One run in `mode`: prints each call's round trip in microseconds.
fn child(mode: &str) {
    let n: u64 = std::env::var("CAPWIRE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let provider = match mode {
        "off" => None,
        "all" | "ratio" => Some(install(mode == "ratio")),
        other => panic!("unknown mode {other}"),
    };
    let placement = Placement::shared(false);
    let (s, c) = (placement.server.clone(), placement.client.clone());
    let server = run_on(&s, async {
        let cap = Capability::new("app.bench", "1.0.0")
            .unwrap()
            .handle(Echo, echo);
        Node::builder("bench-server")
            .listen("127.0.0.1:0".parse().unwrap())
            .capability(cap)
            .start()
            .await
            .unwrap()
    });
    let to = server.clone();
    let (client, peer) = run_on(&c, async move {
        let client = Node::builder("bench-client").start().await.unwrap();
        let addr = to.local_addrs()[0].clone();
        let peer = client.connect(&addr, Some(to.id())).await.unwrap();
        (client, peer)
    });
    // Warm up, then measure.
    run_on(&c, calls(peer.clone(), n / 10 + 10));
    let times = run_on(&c, calls(peer, n));
    let line: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
    println!("{}", line.join(" "));
    run_on(&c, async move { client.shutdown().await });
    run_on(&s, async move { server.shutdown().await });
    drop(placement);
    if let Some(p) = provider {
        p.shutdown().unwrap();
    }
}

async fn calls(peer: Peer, n: u64) -> Vec<f64> {
    let payload = "x".repeat(64);
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap());
    for _ in 0..n {
        let t = Instant::now();
        peer.request(Echo, payload.clone()).await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// The global subscriber of an exporting run: OTLP/HTTP to the parent's
/// sink, every trace sampled or 1% of them.
fn install(ratio: bool) -> opentelemetry_sdk::trace::SdkTracerProvider {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::Sampler;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .unwrap();
    let sampler = if ratio {
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(0.01)))
    } else {
        Sampler::AlwaysOn
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("bench"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::Targets::new().with_target(
            capwire::trace::SPAN_TARGET,
            tracing_subscriber::filter::LevelFilter::INFO,
        ));
    tracing_subscriber::registry().with(layer).init();
    provider
}
