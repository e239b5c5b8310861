//! `capwire node --metrics ADDR`: the counters an operator scrapes move
//! with real calls made by `capwire ctl`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl(state: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_capwire"))
        .arg("ctl")
        .arg("--state")
        .arg(state)
        .args(args)
        .output()
        .expect("capwire ctl runs")
}

fn scrape(addr: &str) -> String {
    let host = addr
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let mut stream = TcpStream::connect(host).expect("the metrics endpoint accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("the request is sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("the response is read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

fn value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_metrics_endpoint_counts_calls_denials_and_sessions() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut child = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["node", "--json", "--listen", "127.0.0.1:0"])
        .args(["--metrics", "127.0.0.1:0", "--state"])
        .arg(dir.path().join("node"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("capwire node starts");
    let stdout = child.stdout.take().expect("stdout");
    let node = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the node prints its start line");
    let start: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let metrics = start["metrics"]
        .as_str()
        .expect("a metrics address")
        .to_owned();
    let invite = start["invite"].as_str().expect("an invite").to_owned();

    let before = scrape(&metrics);
    assert!(
        before.contains("# TYPE capwire_calls_total counter"),
        "{before}"
    );
    assert_eq!(value(&before, "capwire_sessions{direction=\"inbound\"}"), 0);

    let state = dir.path().join("ctl");
    assert!(
        ctl(&state, &["bind", &invite, "--name", "n"])
            .status
            .success()
    );
    let echo = ctl(
        &state,
        &["call", "n", "app.agent", "echo", "--args", "\"hi\""],
    );
    assert!(echo.status.success(), "{echo:?}");
    let denied = ctl(&state, &["call", "n", "app.agent", "nope"]);
    assert_eq!(denied.status.code(), Some(3));
    let stranger = dir.path().join("stranger");
    let unauthorized = ctl(&stranger, &["call", "capwire-n", "app.agent", "ask"]);
    assert_eq!(
        unauthorized.status.code(),
        Some(2),
        "not in the stranger's book"
    );
    let unauthorized = ctl(
        &stranger,
        &["call", &invite, "core.configuration", "get_config"],
    );
    assert_eq!(unauthorized.status.code(), Some(3), "{unauthorized:?}");

    // Counted when each call was decided; poll briefly for the last one.
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let text = scrape(&metrics);
        let done = value(
            &text,
            "capwire_calls_total{cap=\"core.configuration\",verb=\"get_config\",outcome=\"unauthorized\"}",
        ) == 1;
        if done || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (series, want) in [
        (
            "capwire_calls_total{cap=\"app.agent\",verb=\"echo\",outcome=\"ok\"}",
            1,
        ),
        (
            "capwire_calls_total{cap=\"core.monitoring\",verb=\"bind\",outcome=\"ok\"}",
            1,
        ),
        (
            "capwire_calls_total{cap=\"unknown\",verb=\"unknown\",outcome=\"unknown_verb\"}",
            1,
        ),
        (
            "capwire_calls_total{cap=\"core.configuration\",verb=\"get_config\",outcome=\"unauthorized\"}",
            1,
        ),
    ] {
        assert_eq!(value(&after, series), want, "{series} in:\n{after}");
    }
    assert!(
        value(
            &after,
            "capwire_sessions_opened_total{direction=\"inbound\"}"
        ) >= 4,
        "{after}"
    );
    drop(node);
}
