//! Figures the node and two-process benches share: capwire's pipelined
//! requests and connects, and the units they are reported in.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use capwire::manifest::RequestVerb;
use capwire::{Addr, Node, NodeId, Peer};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

/// `n` requests of `verb` with `args`, up to `window` in flight.
pub(crate) async fn pipelined<V>(peer: &Peer, verb: V, args: &str, n: u64, window: usize)
where
    V: RequestVerb<Args = String> + Copy,
{
    let mut in_flight = FuturesUnordered::new();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while in_flight.len() < window && sent < n {
            in_flight.push(peer.request(verb, args.to_owned()));
            sent += 1;
        }
        if let Some(r) = in_flight.next().await {
            r.unwrap();
            done += 1;
        }
    }
}

/// `n` client nodes (started first, not timed) each connect to `addr`
/// and make one request of `verb`, one after the other; the mean time
/// from the connect to the answer.
pub(crate) async fn connect_each<V>(
    addr: &Addr,
    id: NodeId,
    n: u64,
    verb: V,
    args: &str,
) -> Duration
where
    V: RequestVerb<Args = String> + Copy,
{
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(
            Node::builder(format!("bench-dialler-{i}"))
                .start()
                .await
                .unwrap(),
        );
    }
    let mut total = Duration::ZERO;
    for node in &nodes {
        let start = Instant::now();
        let peer = node.connect(addr, Some(id)).await.unwrap();
        peer.request(verb, args.to_owned()).await.unwrap();
        total += start.elapsed();
    }
    let mut stops: FuturesUnordered<_> = nodes.iter().map(Node::shutdown).collect();
    while stops.next().await.is_some() {}
    total / u32::try_from(n.max(1)).unwrap()
}

/// Microseconds per operation.
pub(crate) fn per_op_us(total: Duration, n: u64) -> f64 {
    total.as_secs_f64() * 1e6 / n as f64
}

/// Thousands of operations per second.
pub(crate) fn rate_k(total: Duration, n: u64) -> f64 {
    n as f64 / total.as_secs_f64() / 1e3
}
