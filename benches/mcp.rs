//! Tool-call latency through `capwire mcp` over stdio, beside the same
//! call made directly, in one run against one `capwire node` process
//! (`app.agent/echo`, a 64 B string):
//!
//! - a library call: a node in this process, a session up, `call_raw`;
//! - `capwire mcp`: a `tools/call` of `bench__agent__echo`, JSON-RPC lines
//!   on its stdin and stdout, one call at a time;
//! - `capwire ctl call` handed to that `capwire mcp` (which owns the
//!   control plane's state): a process per call, its command sent over
//!   `ctl.sock`;
//! - `capwire ctl call` alone: a process per call that opens the state
//!   and makes its own session (what a script pays).
//!
//! Run with `cargo bench --bench mcp` (`-- --quick` for fewer calls).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::time::{Duration, Instant};

use capwire::envelope::RawValue;
use capwire::{Addr, Node, NodeId};
use serde_json::json;

const PAYLOAD: usize = 64;

#[path = "support/faces.rs"]
mod faces;

use faces::{Face, ctl, median, start_node, us};

/// `capwire mcp` on stdio, initialized.
fn start_mcp(state: &Path) -> Face {
    let mut mcp = Face::start(&["mcp".as_ref(), "--state".as_ref(), state.as_os_str()]);
    mcp.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "bench", "version": "0"}}),
    );
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    mcp
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick" || a == "--test")
        || std::env::var("CAPWIRE_BENCH_QUICK").is_ok_and(|v| v != "0");
    let (calls, processes) = if quick { (200, 5) } else { (2_000, 40) };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ctl");
    let (mut node, info) = start_node(&dir.path().join("node"));
    ctl(
        &state,
        &["bind", info["invite"].as_str().unwrap(), "--name", "bench"],
    );
    let text = "x".repeat(PAYLOAD);
    let args_json = serde_json::to_string(&text).unwrap();

    // A library call, from a node of this process.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr: Addr = info["addrs"][0].as_str().unwrap().parse().unwrap();
    let id: NodeId = info["node_id"].as_str().unwrap().parse().unwrap();
    let library = rt.block_on(async {
        let client = Node::builder("bench-client").start().await.unwrap();
        let peer = client.connect(&addr, Some(id)).await.unwrap();
        let args = RawValue::encode(&text).unwrap();
        let mut samples = Vec::with_capacity(calls);
        for _ in 0..calls {
            let start = Instant::now();
            peer.call_raw("app.agent", "echo", &args, Duration::from_secs(10))
                .await
                .unwrap();
            samples.push(start.elapsed());
        }
        client.shutdown().await;
        median(samples)
    });

    // `capwire ctl call` on its own: a process that opens the state.
    let ctl_call = |samples: &mut Vec<Duration>| {
        let start = Instant::now();
        ctl(
            &state,
            &["call", "bench", "app.agent", "echo", "--args", &args_json],
        );
        samples.push(start.elapsed());
    };
    let mut alone = Vec::new();
    for _ in 0..processes {
        ctl_call(&mut alone);
    }

    // Through `capwire mcp`, which now owns the state.
    let mut mcp = start_mcp(&state);
    let (tools, _) = mcp.call("tools/list", json!({}));
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "bench__agent__echo"),
        "{tools}"
    );
    let mut through = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let (result, _) = mcp.call(
            "tools/call",
            json!({"name": "bench__agent__echo", "arguments": {"value": text}}),
        );
        through.push(start.elapsed());
        assert_eq!(result["isError"], false, "{result}");
    }
    let mut handed = Vec::new();
    for _ in 0..processes {
        ctl_call(&mut handed);
    }
    mcp.stop();
    let _ = node.kill();
    let _ = node.wait();

    let (through, handed, alone) = (median(through), median(handed), median(alone));
    println!(
        "tool-call latency, {PAYLOAD} B echo, one capwire node process on loopback; medians of \
         {calls} calls ({processes} for the processes){}",
        if quick { " (quick)" } else { "" }
    );
    println!("{:<52} {:>10} {:>9}", "", "us", "ratio");
    for (what, d) in [
        ("library call (Peer::call_raw, session up)", library),
        ("capwire mcp over stdio (tools/call)", through),
        ("capwire ctl call, handed to capwire mcp", handed),
        ("capwire ctl call alone (process, state, session)", alone),
    ] {
        println!("{what:<52} {:>10.1} {:>8.1}x", us(d), us(d) / us(library));
    }
}
