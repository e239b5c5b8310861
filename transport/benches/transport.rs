//! capwire-transport against snow (over tokio TCP) and raw tokio TCP, all on
//! loopback, in one run; prints figures and ratios.
//!
//! `cargo bench -p capwire-transport --bench transport`
//! (set `CAPWIRE_BENCH_QUICK=1` for a shorter run).
//!
//! The snow baseline is written the way a tokio user would: 2-byte length
//! prefix, one Noise message per record (split at 65519 bytes), one
//! `write_all` per message, a 64 KiB `BufReader` on the receiving side.
//! The raw TCP baseline carries the same records in clear with the same
//! framing, through a `BufWriter` (so it batches writes: an upper bound).
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use capwire_transport::{
    ContactPolicy, Endpoint, Keypair, PROLOGUE, PROTOCOL_NAME, TransportConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const SMALL: usize = 64;
const LARGE: usize = 64 * 1024;
const SNOW_MAX_PLAIN: usize = 65535 - 16;

struct Sizes {
    reps: usize,
    handshakes: usize,
    concurrent_per_client: usize,
    round_trips: usize,
    small_records: usize,
    large_records: usize,
}

fn sizes() -> Sizes {
    if std::env::var_os("CAPWIRE_BENCH_QUICK").is_some() {
        Sizes {
            reps: 1,
            handshakes: 50,
            concurrent_per_client: 10,
            round_trips: 2_000,
            small_records: 100_000,
            large_records: 300,
        }
    } else {
        Sizes {
            reps: 3,
            handshakes: 300,
            concurrent_per_client: 40,
            round_trips: 20_000,
            small_records: 1_000_000,
            large_records: 2_000,
        }
    }
}

async fn tcp_pair(listener: &TcpListener, addr: SocketAddr) -> (TcpStream, TcpStream) {
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let (a, b) = (a.unwrap(), b.unwrap().0);
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

// ---------------------------------------------------------------------------
// snow over tokio

fn snow_builder(secret: &[u8]) -> snow::Builder<'_> {
    snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(secret)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap()
}

async fn write_framed(s: &mut TcpStream, buf: &mut [u8], n: usize) {
    buf[..2].copy_from_slice(&(n as u16).to_be_bytes());
    s.write_all(&buf[..2 + n]).await.unwrap();
}

async fn read_framed<R: AsyncReadExt + Unpin>(s: &mut R, buf: &mut Vec<u8>) -> usize {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    let n = usize::from(u16::from_be_bytes(len));
    buf.resize(n, 0);
    s.read_exact(&mut buf[..n]).await.unwrap();
    n
}

async fn snow_initiator(mut s: TcpStream, secret: &[u8]) -> (TcpStream, snow::TransportState) {
    let mut hs = snow_builder(secret).build_initiator().unwrap();
    let mut out = vec![0u8; 2 + 65535];
    let mut inb = Vec::new();
    let n = hs.write_message(&[], &mut out[2..]).unwrap();
    write_framed(&mut s, &mut out, n).await;
    let n = read_framed(&mut s, &mut inb).await;
    hs.read_message(&inb[..n], &mut out).unwrap();
    let n = hs.write_message(&[], &mut out[2..]).unwrap();
    write_framed(&mut s, &mut out, n).await;
    (s, hs.into_transport_mode().unwrap())
}

async fn snow_responder(mut s: TcpStream, secret: &[u8]) -> (TcpStream, snow::TransportState) {
    let mut hs = snow_builder(secret).build_responder().unwrap();
    let mut out = vec![0u8; 2 + 65535];
    let mut inb = Vec::new();
    let n = read_framed(&mut s, &mut inb).await;
    hs.read_message(&inb[..n], &mut out).unwrap();
    let n = hs.write_message(&[], &mut out[2..]).unwrap();
    write_framed(&mut s, &mut out, n).await;
    let n = read_framed(&mut s, &mut inb).await;
    hs.read_message(&inb[..n], &mut out).unwrap();
    (s, hs.into_transport_mode().unwrap())
}

/// Sends one record as Noise messages of at most 65535 bytes.
async fn snow_send(s: &mut TcpStream, t: &mut snow::TransportState, out: &mut [u8], record: &[u8]) {
    for part in record.chunks(SNOW_MAX_PLAIN) {
        let n = t.write_message(part, &mut out[2..]).unwrap();
        write_framed(s, out, n).await;
    }
}

/// Receives `len` bytes of records.
async fn snow_recv<R: AsyncReadExt + Unpin>(
    r: &mut R,
    t: &mut snow::TransportState,
    inb: &mut Vec<u8>,
    plain: &mut [u8],
    len: usize,
) {
    let mut got = 0;
    while got < len {
        let n = read_framed(r, inb).await;
        got += t.read_message(&inb[..n], plain).unwrap();
    }
}

// ---------------------------------------------------------------------------
// The five measurements, each for the three stacks.

#[derive(Clone, Copy)]
enum Stack {
    Capwire,
    Snow,
    Raw,
}

const STACKS: [Stack; 3] = [Stack::Capwire, Stack::Snow, Stack::Raw];

struct Ctx {
    listener: TcpListener,
    addr: SocketAddr,
    client: Endpoint,
    server: Endpoint,
    snow_client_key: Vec<u8>,
    snow_server_key: Vec<u8>,
}

impl Ctx {
    async fn new() -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ep = || {
            Endpoint::new(
                Keypair::generate().unwrap(),
                TransportConfig::default(),
                ContactPolicy::AcceptAny,
            )
        };
        let snow_key = || snow_builder(&[0; 32]).generate_keypair().unwrap().private;
        Arc::new(Self {
            listener,
            addr,
            client: ep(),
            server: ep(),
            snow_client_key: snow_key(),
            snow_server_key: snow_key(),
        })
    }
}

/// Median connect + handshake time (both sides done), sequentially.
async fn handshake_latency(ctx: &Arc<Ctx>, stack: Stack, n: usize) -> Duration {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        // Let the previous connection's teardown (close records, sockets)
        // finish first, for every stack alike.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        let (a, b) = tcp_pair(&ctx.listener, ctx.addr).await;
        match stack {
            Stack::Capwire => {
                let (c, s) = tokio::join!(ctx.client.connect(a, None), ctx.server.accept(b));
                samples.push(start.elapsed());
                // Tear down completely before the next one.
                let (c, s) = (c.unwrap(), s.unwrap());
                c.close("").await.unwrap();
                s.sender().ended().await;
            }
            Stack::Snow => {
                let (c, s) = tokio::join!(
                    snow_initiator(a, &ctx.snow_client_key),
                    snow_responder(b, &ctx.snow_server_key)
                );
                samples.push(start.elapsed());
                drop((c, s));
            }
            Stack::Raw => {
                samples.push(start.elapsed());
                drop((a, b));
            }
        }
    }
    median(samples)
}

/// The median: robust against the odd sample slowed by other work on the
/// machine.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// Handshakes per second with 16 concurrent clients.
async fn handshake_rate(ctx: &Arc<Ctx>, stack: Stack, per_client: usize) -> f64 {
    const CLIENTS: usize = 16;
    let total = CLIENTS * per_client;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<()>();
    let server_ctx = ctx.clone();
    let server = tokio::spawn(async move {
        for _ in 0..total {
            let (s, _) = server_ctx.listener.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            let ctx = server_ctx.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                match stack {
                    Stack::Capwire => drop(ctx.server.accept(s).await.unwrap()),
                    Stack::Snow => drop(snow_responder(s, &ctx.snow_server_key).await),
                    Stack::Raw => drop(s),
                }
                let _ = done.send(());
            });
        }
    });
    let start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let ctx = ctx.clone();
        clients.push(tokio::spawn(async move {
            for _ in 0..per_client {
                let s = TcpStream::connect(ctx.addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                match stack {
                    Stack::Capwire => drop(ctx.client.connect(s, None).await.unwrap()),
                    Stack::Snow => drop(snow_initiator(s, &ctx.snow_client_key).await),
                    Stack::Raw => drop(s),
                }
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    for _ in 0..total {
        done_rx.recv().await.unwrap();
    }
    let elapsed = start.elapsed();
    server.await.unwrap();
    total as f64 / elapsed.as_secs_f64()
}

/// Median round trip of a 64-byte record echoed by the server.
async fn round_trip(ctx: &Arc<Ctx>, stack: Stack, n: usize) -> Duration {
    let (a, b) = tcp_pair(&ctx.listener, ctx.addr).await;
    let record = vec![7u8; SMALL];
    match stack {
        Stack::Capwire => {
            let (c, s) = tokio::join!(ctx.client.connect(a, None), ctx.server.accept(b));
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            let echo = tokio::spawn(async move {
                while let Ok(Some(r)) = s.recv().await {
                    s.send(r).await.unwrap();
                }
            });
            let record = Bytes::from(record);
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                c.send(record.clone()).await.unwrap();
                c.recv().await.unwrap().unwrap();
                samples.push(start.elapsed());
            }
            c.close("").await.unwrap();
            echo.await.unwrap();
            median(samples)
        }
        Stack::Snow => {
            let ((mut a, mut ta), (mut b, mut tb)) = tokio::join!(
                snow_initiator(a, &ctx.snow_client_key),
                snow_responder(b, &ctx.snow_server_key)
            );
            let echo = tokio::spawn(async move {
                let (mut inb, mut plain, mut out) =
                    (Vec::new(), vec![0u8; 65535], vec![0u8; 65537]);
                for _ in 0..n {
                    let len = read_framed(&mut b, &mut inb).await;
                    let p = tb.read_message(&inb[..len], &mut plain).unwrap();
                    let m = tb.write_message(&plain[..p], &mut out[2..]).unwrap();
                    write_framed(&mut b, &mut out, m).await;
                }
            });
            let (mut inb, mut plain, mut out) = (Vec::new(), vec![0u8; 65535], vec![0u8; 65537]);
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                snow_send(&mut a, &mut ta, &mut out, &record).await;
                snow_recv(&mut a, &mut ta, &mut inb, &mut plain, SMALL).await;
                samples.push(start.elapsed());
            }
            echo.await.unwrap();
            median(samples)
        }
        Stack::Raw => {
            let (mut a, mut b) = (a, b);
            let echo = tokio::spawn(async move {
                let mut buf = vec![0u8; 2 + SMALL];
                for _ in 0..n {
                    b.read_exact(&mut buf).await.unwrap();
                    b.write_all(&buf).await.unwrap();
                }
            });
            let mut framed = (SMALL as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&record);
            let mut back = vec![0u8; framed.len()];
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                a.write_all(&framed).await.unwrap();
                a.read_exact(&mut back).await.unwrap();
                samples.push(start.elapsed());
            }
            echo.await.unwrap();
            median(samples)
        }
    }
}

/// One-way transfer of `count` records of `size` bytes; returns the time
/// from the first send to the last record received.
async fn one_way(ctx: &Arc<Ctx>, stack: Stack, size: usize, count: usize) -> Duration {
    let (a, b) = tcp_pair(&ctx.listener, ctx.addr).await;
    let payload = vec![0x5au8; size];
    match stack {
        Stack::Capwire => {
            let (c, s) = tokio::join!(ctx.client.connect(a, None), ctx.server.accept(b));
            let (c, mut s) = (c.unwrap(), s.unwrap());
            let record = Bytes::from(payload);
            let start = Instant::now();
            let receiver = tokio::spawn(async move {
                for _ in 0..count {
                    let r = s.recv().await.unwrap().unwrap();
                    assert_eq!(r.len(), size);
                }
                Instant::now()
            });
            for _ in 0..count {
                c.send(record.clone()).await.unwrap();
            }
            let end = receiver.await.unwrap();
            c.close("").await.unwrap();
            end - start
        }
        Stack::Snow => {
            let ((mut a, mut ta), (b, mut tb)) = tokio::join!(
                snow_initiator(a, &ctx.snow_client_key),
                snow_responder(b, &ctx.snow_server_key)
            );
            let start = Instant::now();
            let receiver = tokio::spawn(async move {
                let mut r = BufReader::with_capacity(64 * 1024, b);
                let (mut inb, mut plain) = (Vec::new(), vec![0u8; 65535]);
                for _ in 0..count {
                    snow_recv(&mut r, &mut tb, &mut inb, &mut plain, size).await;
                }
                Instant::now()
            });
            let mut out = vec![0u8; 65537];
            for _ in 0..count {
                snow_send(&mut a, &mut ta, &mut out, &payload).await;
            }
            receiver.await.unwrap() - start
        }
        Stack::Raw => {
            let start = Instant::now();
            let receiver = tokio::spawn(async move {
                let mut r = BufReader::with_capacity(64 * 1024, b);
                let mut buf = vec![0u8; size];
                for _ in 0..count {
                    let mut len = [0u8; 4];
                    r.read_exact(&mut len).await.unwrap();
                    r.read_exact(&mut buf[..u32::from_be_bytes(len) as usize])
                        .await
                        .unwrap();
                }
                Instant::now()
            });
            let mut w = BufWriter::with_capacity(64 * 1024, a);
            for _ in 0..count {
                w.write_all(&(size as u32).to_be_bytes()).await.unwrap();
                w.write_all(&payload).await.unwrap();
            }
            w.flush().await.unwrap();
            receiver.await.unwrap() - start
        }
    }
}

// ---------------------------------------------------------------------------

/// Whether the stack was asked for (`CAPWIRE_BENCH_STACK=capwire|snow|raw`;
/// all by default). For profiling one stack at a time.
fn stack_wanted(stack: Stack) -> bool {
    let name = match stack {
        Stack::Capwire => "capwire",
        Stack::Snow => "snow",
        Stack::Raw => "raw",
    };
    std::env::var("CAPWIRE_BENCH_STACK").map_or(true, |only| only == name)
}

fn row(name: &str, unit: &str, c: f64, s: f64, r: f64, higher_is_better: bool, target: &str) {
    let ratio = if higher_is_better { c / s } else { s / c };
    println!("{name:<26} {c:>10.1} {s:>10.1} {r:>10.1}  {unit:<8} {ratio:>5.2}x  {target}");
}

/// Whether the measurement named `name` was asked for
/// (`CAPWIRE_BENCH_ONLY=name,name`; all by default).
fn wanted(name: &str) -> bool {
    std::env::var("CAPWIRE_BENCH_ONLY").map_or(true, |only| only.split(',').any(|n| n == name))
}

#[derive(Clone, Copy)]
enum Which {
    Handshake,
    Rate,
    RoundTrip,
    Small,
    Large,
}

/// One measurement of one stack, in the unit printed.
async fn measure(ctx: &Arc<Ctx>, sz: &Sizes, which: Which, stack: Stack) -> f64 {
    match which {
        Which::Handshake => {
            handshake_latency(ctx, stack, sz.handshakes)
                .await
                .as_secs_f64()
                * 1e6
        }
        Which::Rate => handshake_rate(ctx, stack, sz.concurrent_per_client).await,
        Which::RoundTrip => round_trip(ctx, stack, sz.round_trips).await.as_secs_f64() * 1e6,
        Which::Small => {
            let t = one_way(ctx, stack, SMALL, sz.small_records).await;
            sz.small_records as f64 / t.as_secs_f64() / 1e3
        }
        Which::Large => {
            let t = one_way(ctx, stack, LARGE, sz.large_records).await;
            (sz.large_records * LARGE) as f64 / t.as_secs_f64() / (1 << 20) as f64
        }
    }
}

async fn run() {
    let sz = sizes();
    let ctx = Ctx::new().await;
    println!(
        "capwire-transport vs snow vs raw tokio TCP, loopback, 2 worker threads, \
         best of {} interleaved runs",
        sz.reps
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10}  {:<8} {:>6}  (capwire's advantage over snow; target)",
        "", "capwire", "snow", "raw tcp", "unit", "ratio"
    );
    let table = [
        (
            Which::Handshake,
            "handshake",
            "connect + handshake",
            "µs",
            false,
            ">= 1.0 (time <= snow's)",
        ),
        (
            Which::Rate,
            "rate",
            "handshakes/s, 16 clients",
            "1/s",
            true,
            "",
        ),
        (Which::RoundTrip, "rtt", "64 B round trip", "µs", false, ""),
        (
            Which::Small,
            "small",
            "one-way 64 B records",
            "k rec/s",
            true,
            ">= 2.0",
        ),
        (
            Which::Large,
            "large",
            "one-way 64 KiB records",
            "MiB/s",
            true,
            ">= 1.5",
        ),
    ];
    for (which, key, name, unit, higher_is_better, target) in table {
        if !wanted(key) {
            continue;
        }
        let mut best: [Option<f64>; 3] = [None; 3];
        // Interleave the stacks so that background load hits all alike.
        for _ in 0..sz.reps {
            for (i, stack) in STACKS.into_iter().enumerate() {
                if !stack_wanted(stack) {
                    continue;
                }
                let v = measure(&ctx, &sz, which, stack).await;
                best[i] = Some(match best[i] {
                    None => v,
                    Some(b) if higher_is_better => b.max(v),
                    Some(b) => b.min(v),
                });
            }
        }
        let [c, s, r] = best.map(|b| b.unwrap_or(f64::NAN));
        row(name, unit, c, s, r, higher_is_better, target);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either: both run the full program unless told to be quick.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Everything runs on the runtime's workers, as in an application,
    // not on the thread that blocks on the runtime.
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}
