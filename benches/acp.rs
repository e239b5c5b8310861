//! A prompt turn through `capwire acp` beside the same task run other
//! ways, in one run against one `capwire node` process
//! (`app.agent/work`, one step of 0 ms, a 64 B text):
//!
//! - a library run: a node in this process, a session up, `submit_raw`
//!   then `result` (the task's events followed to its end);
//! - `capwire acp`: a `session/prompt` on stdin, its `session/update`s
//!   and its answer on stdout, one turn at a time, session up;
//! - `capwire ctl call --wait` handed to that `capwire acp` (which owns
//!   the control plane's state): a process per task;
//! - `capwire ctl call --wait` alone: a process per task that opens the
//!   state and makes its own session.
//!
//! Run with `cargo bench --bench acp` (`-- --quick` for fewer turns).
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

/// `capwire acp` on stdio over `app.agent/work` with `args`, initialized.
fn start_acp(state: &Path, args: &str) -> Face {
    let mut acp = Face::start(&[
        "acp".as_ref(),
        "--state".as_ref(),
        state.as_os_str(),
        "--verb".as_ref(),
        "app.agent/work".as_ref(),
        "--args".as_ref(),
        args.as_ref(),
    ]);
    acp.call("initialize", json!({"protocolVersion": 1}));
    acp
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick" || a == "--test")
        || std::env::var("CAPWIRE_BENCH_QUICK").is_ok_and(|v| v != "0");
    // A node keeps 1,000 tasks per sender (then `overloaded`): the
    // control plane's turns and processes stay under it.
    let (turns, processes) = if quick { (100, 5) } else { (400, 40) };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ctl");
    let (mut node, info) = start_node(&dir.path().join("node"));
    ctl(
        &state,
        &["bind", info["invite"].as_str().unwrap(), "--name", "bench"],
    );
    let text = "x".repeat(PAYLOAD);
    let shape = json!({"steps": 1, "step_ms": 0});
    let mut full = shape.clone();
    full["text"] = json!(text);
    let full_json = full.to_string();

    // A library run, from a node of this process.
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
        let args = RawValue::encode(&full).unwrap();
        let mut samples = Vec::with_capacity(turns);
        for _ in 0..turns {
            let start = Instant::now();
            let task = peer
                .submit_raw("app.agent", "work", &args, None, Duration::from_secs(10))
                .await
                .unwrap();
            task.result().await.unwrap();
            samples.push(start.elapsed());
        }
        client.shutdown().await;
        median(samples)
    });

    let ctl_wait = |samples: &mut Vec<Duration>| {
        let start = Instant::now();
        ctl(
            &state,
            &[
                "call",
                "bench",
                "app.agent",
                "work",
                "--wait",
                "--args",
                &full_json,
            ],
        );
        samples.push(start.elapsed());
    };
    let mut alone = Vec::new();
    for _ in 0..processes {
        ctl_wait(&mut alone);
    }

    // Through `capwire acp`, which now owns the state.
    let mut acp = start_acp(&state, &shape.to_string());
    let (session, _) = acp.call("session/new", json!({"cwd": "/", "mcpServers": []}));
    let session = session["sessionId"].as_str().unwrap().to_owned();
    let mut through = Vec::with_capacity(turns);
    let mut updates = 0;
    for _ in 0..turns {
        let start = Instant::now();
        let (done, n) = acp.call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        );
        through.push(start.elapsed());
        assert_eq!(done["stopReason"], "end_turn", "{done}");
        updates = n;
    }
    let mut handed = Vec::new();
    for _ in 0..processes {
        ctl_wait(&mut handed);
    }
    acp.stop();
    let _ = node.kill();
    let _ = node.wait();

    let (through, handed, alone) = (median(through), median(handed), median(alone));
    println!(
        "task turn latency, app.agent/work (1 step, {PAYLOAD} B text), one capwire node process on \
         loopback; medians of {turns} turns ({processes} for the processes){}; {updates} updates \
         a prompt",
        if quick { " (quick)" } else { "" }
    );
    println!("{:<56} {:>10} {:>9}", "", "us", "ratio");
    for (what, d) in [
        ("library run (submit_raw + result, session up)", library),
        ("capwire acp over stdio (session/prompt)", through),
        ("capwire ctl call --wait, handed to capwire acp", handed),
        (
            "capwire ctl call --wait alone (process, state, session)",
            alone,
        ),
    ] {
        println!("{what:<56} {:>10.1} {:>8.1}x", us(d), us(d) / us(library));
    }
    println!(
        "the face's overhead against ctl call --wait handed to it: {:.2}x (prompt turn / command)",
        us(through) / us(handed)
    );
}
