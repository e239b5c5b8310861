//! Node runtime benchmarks, each against a baseline measured in the same run:
//!
//! - request/response round trip of a small envelope vs a raw tokio TCP
//!   round trip of the same size vs a snow (Noise XX) echo;
//! - fire-and-forget envelopes per second on one connection;
//! - pipelined requests per second with 128 in flight.
//!
//! Run with `cargo bench --bench node`. Figures are printed with ratios.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use capwire::manifest::verb;
use capwire::{Capability, HandlerError, Limits, Node, State};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

verb! { /** Echo. */ pub struct Echo: request "app.bench" / "echo", Bootstrap, String => String; }
verb! { /** Count. */ pub struct Tick: notification "app.bench" / "tick", Bootstrap, u64; }

const PAYLOAD: usize = 64;

async fn echo(args: String) -> Result<String, HandlerError> {
    Ok(args)
}

async fn tick(_n: u64, State(count): State<Arc<AtomicU64>>) -> Result<(), HandlerError> {
    count.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn per_op(total: Duration, n: u64) -> Duration {
    total / u32::try_from(n).unwrap()
}

/// Best of `runs` measurements of `n` sequential round trips.
async fn best_of<F, Fut>(runs: usize, n: u64, mut f: F) -> Duration
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let mut best = Duration::MAX;
    for _ in 0..runs {
        best = best.min(per_op(f(n).await, n));
    }
    best
}

async fn raw_tcp_rtt(n: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = [0u8; PAYLOAD];
        while s.read_exact(&mut buf).await.is_ok() {
            if s.write_all(&buf).await.is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.set_nodelay(true).unwrap();
    let mut buf = [7u8; PAYLOAD];
    let start = Instant::now();
    for _ in 0..n {
        c.write_all(&buf).await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
    }
    let took = start.elapsed();
    drop(c);
    let _ = server.await;
    took
}

const SNOW_PARAMS: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";

async fn read_msg(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut len = [0u8; 2];
    if s.read_exact(&mut len).await.is_err() {
        return false;
    }
    buf.resize(usize::from(u16::from_be_bytes(len)), 0);
    s.read_exact(buf).await.is_ok()
}

async fn write_msg(s: &mut TcpStream, msg: &[u8]) {
    let mut framed = Vec::with_capacity(2 + msg.len());
    framed.extend_from_slice(&u16::try_from(msg.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(msg);
    s.write_all(&framed).await.unwrap();
}

async fn snow_rtt(n: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let builder = snow::Builder::new(SNOW_PARAMS.parse().unwrap());
        let key = builder.generate_keypair().unwrap();
        let mut hs = snow::Builder::new(SNOW_PARAMS.parse().unwrap())
            .local_private_key(&key.private)
            .unwrap()
            .build_responder()
            .unwrap();
        let mut buf = Vec::new();
        let mut out = vec![0u8; 65535];
        read_msg(&mut s, &mut buf).await;
        hs.read_message(&buf, &mut out).unwrap();
        let len = hs.write_message(&[], &mut out).unwrap();
        write_msg(&mut s, &out[..len]).await;
        read_msg(&mut s, &mut buf).await;
        hs.read_message(&buf, &mut out).unwrap();
        let mut t = hs.into_transport_mode().unwrap();
        let mut plain = vec![0u8; 65535];
        while read_msg(&mut s, &mut buf).await {
            let len = t.read_message(&buf, &mut plain).unwrap();
            let len = t.write_message(&plain[..len], &mut out).unwrap();
            write_msg(&mut s, &out[..len]).await;
        }
    });
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.set_nodelay(true).unwrap();
    let builder = snow::Builder::new(SNOW_PARAMS.parse().unwrap());
    let key = builder.generate_keypair().unwrap();
    let mut hs = snow::Builder::new(SNOW_PARAMS.parse().unwrap())
        .local_private_key(&key.private)
        .unwrap()
        .build_initiator()
        .unwrap();
    let mut out = vec![0u8; 65535];
    let mut buf = Vec::new();
    let len = hs.write_message(&[], &mut out).unwrap();
    write_msg(&mut c, &out[..len]).await;
    read_msg(&mut c, &mut buf).await;
    hs.read_message(&buf, &mut out).unwrap();
    let len = hs.write_message(&[], &mut out).unwrap();
    write_msg(&mut c, &out[..len]).await;
    let mut t = hs.into_transport_mode().unwrap();
    let payload = [7u8; PAYLOAD];
    let mut plain = vec![0u8; 65535];
    let start = Instant::now();
    for _ in 0..n {
        let len = t.write_message(&payload, &mut out).unwrap();
        write_msg(&mut c, &out[..len]).await;
        read_msg(&mut c, &mut buf).await;
        t.read_message(&buf, &mut plain).unwrap();
    }
    let took = start.elapsed();
    drop(c);
    let _ = server.await;
    took
}

struct Pair {
    server: Node,
    client: Node,
    peer: capwire::Peer,
    ticks: Arc<AtomicU64>,
}

async fn pair() -> Pair {
    let ticks = Arc::new(AtomicU64::new(0));
    let cap = Capability::new("app.bench", "1.0.0")
        .unwrap()
        .handle(Echo, echo)
        .handle(Tick, tick);
    let limits = Limits {
        max_inflight_per_session: 4096,
        ..Limits::default()
    };
    let server = Node::builder("bench-server")
        .listen("127.0.0.1:0".parse().unwrap())
        .capability(cap)
        .state(ticks.clone())
        .limits(limits)
        .start()
        .await
        .unwrap();
    let client = Node::builder("bench-client").start().await.unwrap();
    let peer = client
        .connect(&server.local_addrs()[0], Some(server.id()))
        .await
        .unwrap();
    Pair {
        server,
        client,
        peer,
        ticks,
    }
}

async fn capwire_rtt(p: &Pair, n: u64) -> Duration {
    let payload = "x".repeat(PAYLOAD);
    let start = Instant::now();
    for _ in 0..n {
        let out = p.peer.request(Echo, payload.clone()).await.unwrap();
        assert_eq!(out.len(), PAYLOAD);
    }
    start.elapsed()
}

async fn fire_and_forget(p: &Pair, n: u64) -> f64 {
    let before = p.ticks.load(Ordering::Relaxed);
    let start = Instant::now();
    for i in 0..n {
        p.peer.notify(Tick, i).await.unwrap();
    }
    while p.ticks.load(Ordering::Relaxed) < before + n {
        tokio::task::yield_now().await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn pipelined(p: &Pair, n: u64, window: usize) -> f64 {
    let payload = "x".repeat(PAYLOAD);
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut done = 0u64;
    while done < n {
        while in_flight.len() < window && sent < n {
            let peer = p.peer.clone();
            let payload = payload.clone();
            in_flight.push(async move { peer.request(Echo, payload).await });
            sent += 1;
        }
        if let Some(r) = in_flight.next().await {
            r.unwrap();
            done += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test" || a == "--quick");
    let scale: u64 = if quick { 100 } else { 1 };
    let rt = if std::env::var("CAPWIRE_BENCH_RT").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    // Everything runs on the runtime's workers, as in a real node, not on
    // the thread that blocks on the runtime.
    rt.block_on(async move { tokio::spawn(run(scale)).await.unwrap() });
}

async fn run(scale: u64) {
    let only = std::env::var("CAPWIRE_BENCH_ONLY").unwrap_or_default();
    if only == "pipe" {
        let p = pair().await;
        let n = std::env::var("CAPWIRE_BENCH_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600_000 / scale);
        let r = pipelined(&p, n, 128).await;
        println!("pipelined {r:.0} req/s");
        return;
    }
    if only == "faf" {
        let p = pair().await;
        let n = std::env::var("CAPWIRE_BENCH_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3_000_000 / scale);
        let r = fire_and_forget(&p, n).await;
        println!("fire-and-forget {r:.0} /s");
        return;
    }
    if only == "rtt" {
        let p = pair().await;
        let n = std::env::var("CAPWIRE_BENCH_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000 / scale);
        let t = capwire_rtt(&p, n).await;
        if std::env::var_os("CAPWIRE_BENCH_NO_SNOW").is_some() {
            println!("capwire rtt {:.1} us", per_op(t, n).as_secs_f64() * 1e6);
            return;
        }
        let snow = snow_rtt(n / 4).await;
        println!(
            "capwire rtt {:.1} us, snow {:.1} us",
            per_op(t, n).as_secs_f64() * 1e6,
            per_op(snow, n / 4).as_secs_f64() * 1e6
        );
        return;
    }
    {
        let rtt_n = 20_000 / scale;
        let tcp = best_of(3, rtt_n, raw_tcp_rtt).await;
        let snow = best_of(3, rtt_n, snow_rtt).await;
        let p = pair().await;
        let mut cw = Duration::MAX;
        for _ in 0..3 {
            cw = cw.min(per_op(capwire_rtt(&p, rtt_n).await, rtt_n));
        }
        println!("round trip, {PAYLOAD} B payload ({rtt_n} sequential, best of 3):");
        println!("  raw tokio TCP      {:>9.1} us", tcp.as_secs_f64() * 1e6);
        println!("  snow echo          {:>9.1} us", snow.as_secs_f64() * 1e6);
        println!("  capwire request    {:>9.1} us", cw.as_secs_f64() * 1e6);
        println!(
            "  ratio capwire/raw TCP = {:.2}x, capwire/snow = {:.2}x",
            cw.as_secs_f64() / tcp.as_secs_f64(),
            cw.as_secs_f64() / snow.as_secs_f64()
        );

        let faf_n = 1_000_000 / scale;
        let mut faf: f64 = 0.0;
        for _ in 0..3 {
            faf = faf.max(fire_and_forget(&p, faf_n).await);
        }
        println!("fire-and-forget, one connection ({faf_n} notifications, best of 3):");
        println!(
            "  {:>12.0} envelopes/s  (target 1.0M/s: {:.2}x)",
            faf,
            faf / 1e6
        );

        let pipe_n = 300_000 / scale;
        let mut pipe: f64 = 0.0;
        for _ in 0..3 {
            pipe = pipe.max(pipelined(&p, pipe_n, 128).await);
        }
        println!("pipelined requests, 128 in flight ({pipe_n} requests, best of 3):");
        println!(
            "  {:>12.0} requests/s  (target 150k/s: {:.2}x)",
            pipe,
            pipe / 150e3
        );
        println!(
            "  vs sequential capwire: {:.1}x the rate",
            pipe * cw.as_secs_f64()
        );

        p.client.shutdown().await;
        p.server.shutdown().await;
    }
}
