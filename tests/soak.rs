//! The soak of `examples/soak`, short: 12 `capwire node` processes under
//! one control plane for 15 s, node-to-node requests (`ask`), requests and
//! notifications from the control plane, and two nodes killed with
//! SIGKILL and restarted on their state directory and address. The run
//! must show every call ended, errors only around the restarts, the right
//! answers, every node still bound, gauges drained and memory growth
//! within 1.5x; the report is printed (`--nocapture`) and shown on
//! failure. The long run: `cargo run --release --example soak`.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../examples/soak/soak.rs"]
mod soak;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_nodes_for_15_s_with_two_restarts_answer_everything_and_stay_bounded() {
    let config = soak::Config {
        nodes: 12,
        duration: Duration::from_secs(15),
        restarts_every: Some(Duration::from_secs(5)),
        seed: 0x50a4,
        rate: 200,
        workers: 16,
        contacts: 4,
        deadline: Duration::from_secs(5),
        growth_limit: 1.5,
        bin: env!("CARGO_BIN_EXE_capwire").into(),
    };
    let report = soak::run(&config).await.unwrap();
    println!("{report}");
    assert_eq!(report.restarts.len(), 2, "{report}");
    assert!(report.requests.ok > 1000, "{report}");
    let violations = report.violations();
    assert!(violations.is_empty(), "{violations:#?}\n{report}");
}
