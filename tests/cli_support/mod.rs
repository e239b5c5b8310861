//! Helpers for the command-line tests: spawned processes that are killed
//! when their guard drops (a failing test included), `capwire node`
//! started on 127.0.0.1, one-shot `capwire ctl` runs with a deadline, and
//! the checks every failure message has to pass.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// The `capwire` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_capwire");

/// How long one `capwire ctl` run may take before the test gives up on it.
pub const CTL_DEADLINE: Duration = Duration::from_secs(20);

/// How long a node may take to print its startup lines.
pub const START_DEADLINE: Duration = Duration::from_secs(15);

/// A `capwire` command with an environment that cannot change its
/// behaviour: no log filter, no backtrace setting (so a panic would print
/// its `RUST_BACKTRACE` hint), no default ctl state.
pub fn capwire() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("CAPWIRE_CTL_STATE")
        .stdin(Stdio::null());
    cmd
}

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what`
/// after `within`.
pub fn poll<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Collects a pipe's lines as they come.
fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// A process that runs in the background, killed when this drops.
pub struct Spawned {
    what: String,
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    status: Option<ExitStatus>,
}

impl Spawned {
    /// Starts `cmd` with its output captured line by line.
    pub fn start(mut cmd: Command, what: &str) -> Spawned {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Spawned {
            what: what.to_owned(),
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The lines it printed on stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// The lines it printed on stderr so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// The first stdout line `pred` accepts, waiting for it up to `within`.
    pub fn wait_line(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.stdout().into_iter().find(|l| pred(l)) {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the readers drain the pipes before the last look.
                std::thread::sleep(Duration::from_millis(100));
                if let Some(line) = self.stdout().into_iter().find(|l| pred(l)) {
                    return line;
                }
                panic!(
                    "{} exited ({status}) before printing {what}\nstdout: {:#?}\nstderr: {:#?}",
                    self.what,
                    self.stdout(),
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} printed no {what} within {within:?}\nstdout: {:#?}\nstderr: {:#?}",
                self.what,
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The JSON records it printed on stdout so far (other lines skipped).
    pub fn records(&self) -> Vec<Json> {
        self.stdout()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The first JSON record `pred` accepts, waiting for it up to `within`.
    pub fn wait_record(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Json) -> bool,
    ) -> Json {
        let line = self.wait_line(within, what, |l| {
            serde_json::from_str::<Json>(l).is_ok_and(|r| pred(&r))
        });
        serde_json::from_str(&line).unwrap()
    }

    /// Sends it a signal (`TERM`, `INT`, ...).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits up to `within` for it to exit; its status.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.status = Some(status);
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}\nstderr: {:#?}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A running `capwire node`.
pub struct NodeProc {
    /// The process.
    pub proc: Spawned,
    /// Its key, 64 hex digits.
    pub id: String,
    /// Its first address, `tcp://127.0.0.1:PORT`.
    pub addr: String,
    /// The invite it printed (`None` when it printed none).
    pub invite: Option<String>,
    /// Its metrics endpoint, `http://ADDR/metrics`, when started with
    /// `--metrics`.
    pub metrics: Option<String>,
}

impl NodeProc {
    /// Starts `capwire node --json --name NAME` with `extra` arguments and
    /// reads its startup line.
    pub fn start(name: &str, extra: &[&str]) -> NodeProc {
        let mut cmd = capwire();
        cmd.args(["node", "--json", "--name", name]).args(extra);
        let mut proc = Spawned::start(cmd, &format!("node {name}"));
        let first = proc.wait_record(START_DEADLINE, "its startup line", |r| {
            r.get("node_id").is_some()
        });
        let id = first["node_id"].as_str().unwrap().to_owned();
        assert_eq!(id.len(), 64, "a node id is 64 hex digits: {first}");
        let addr = first["addrs"][0].as_str().unwrap().to_owned();
        assert!(addr.starts_with("tcp://127.0.0.1:"), "{first}");
        let invite = first["invite"].as_str().map(str::to_owned);
        let metrics = first["metrics"].as_str().map(str::to_owned);
        NodeProc {
            proc,
            id,
            addr,
            invite,
            metrics,
        }
    }

    /// Starts a node that serves its metrics on 127.0.0.1.
    pub fn with_metrics(name: &str) -> NodeProc {
        NodeProc::start(name, &["--metrics", "127.0.0.1:0"])
    }

    /// Its metrics, as the Prometheus text it serves.
    pub fn scrape(&self) -> String {
        let url = self.metrics.as_deref().expect("started with --metrics");
        let host = url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics");
        let mut stream = TcpStream::connect(host).expect("the metrics endpoint accepts");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
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

    /// The value of one series (`name{labels}` exactly as served), 0 when
    /// it is not there.
    pub fn metric(&self, series: &str) -> u64 {
        self.scrape()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    }

    /// Starts a node with a state directory.
    pub fn start_in(name: &str, state: &Path) -> NodeProc {
        NodeProc::start(name, &["--state", state.to_str().unwrap()])
    }

    /// The invite; panics when it printed none.
    pub fn invite(&self) -> &str {
        self.invite.as_deref().expect("the node printed an invite")
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Stops it with SIGTERM; panics unless it exits 0 within `within`.
    pub fn stop(mut self, within: Duration) -> Duration {
        let started = Instant::now();
        self.proc.signal("TERM");
        let status = self.proc.wait_exit(within);
        assert!(
            status.success(),
            "the node exited with {status} on SIGTERM\nstderr: {:#?}",
            self.proc.stderr()
        );
        started.elapsed()
    }
}

/// A process whose stdout the test reads a line at a time, when it
/// chooses: what it does not read stays in the pipe, so a process that
/// writes more than the pipe holds waits, as behind a slow reader.
pub struct Held {
    what: String,
    child: Child,
    stdout: Option<BufReader<std::process::ChildStdout>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Held {
    /// Starts `cmd`; its stderr is collected as it comes.
    pub fn start(mut cmd: Command, what: &str) -> Held {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = Some(BufReader::new(child.stdout.take().unwrap()));
        let stderr = collect(child.stderr.take().unwrap());
        Held {
            what: what.to_owned(),
            child,
            stdout,
            stderr,
        }
    }

    /// Its next stdout line (without the newline); panics at the end.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .stdout
            .as_mut()
            .expect("stdout is still held")
            .read_line(&mut line)
            .expect("stdout is read");
        assert!(
            n > 0,
            "{} closed its stdout\nstderr: {:#?}",
            self.what,
            self.stderr()
        );
        line.trim_end_matches('\n').to_owned()
    }

    /// Its next stdout line as JSON.
    pub fn record(&mut self) -> Json {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    /// The lines on stderr so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends it a signal (`INT`, `TERM`, ...).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {} failed", self.child.id());
    }

    /// Reads the rest of its stdout (it must end within `within`) and
    /// waits for it to exit: its status and those lines.
    pub fn finish(mut self, within: Duration) -> (ExitStatus, Vec<String>) {
        let mut stdout = self.stdout.take().expect("stdout is still held");
        let rest = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut line = String::new();
            while stdout.read_line(&mut line).unwrap_or(0) > 0 {
                lines.push(line.trim_end_matches('\n').to_owned());
                line.clear();
            }
            lines
        });
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}\nstderr: {:#?}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, rest.join().unwrap())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one `capwire ctl` run did.
#[derive(Debug)]
pub struct Out {
    /// Its exit code.
    pub code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// How long it ran.
    pub took: Duration,
}

impl Out {
    /// Its stdout lines parsed as JSON records.
    pub fn records(&self) -> Vec<Json> {
        self.stdout
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON record: {l:?}: {e}"))
            })
            .collect()
    }

    /// Its one JSON record.
    pub fn record(&self) -> Json {
        let mut records = self.records();
        assert_eq!(records.len(), 1, "one record expected: {self:#?}");
        records.remove(0)
    }
}

/// Runs `capwire` with `args` to its end (killing it after
/// [`CTL_DEADLINE`]).
pub fn run(args: &[&str]) -> Out {
    let mut cmd = capwire();
    cmd.args(args);
    run_cmd(cmd, &args.join(" "))
}

/// Runs `cmd` to its end (killing it after [`CTL_DEADLINE`]).
pub fn run_cmd(mut cmd: Command, what: &str) -> Out {
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start capwire {what}: {e}"));
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CTL_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("capwire {what} did not end within {CTL_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    Out {
        code: status
            .code()
            .unwrap_or_else(|| panic!("capwire {what} was killed: {status}")),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        took,
    }
}

/// Runs `capwire ctl --state STATE args...`.
pub fn ctl(state: &Path, args: &[&str]) -> Out {
    let mut all = vec!["ctl", "--state", state.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

/// Panics unless stderr shows no panic and no backtrace hint.
pub fn assert_no_panic(out: &Out) {
    assert!(!out.stderr.contains("panicked"), "a panic: {out:#?}");
    assert!(
        !out.stderr.contains("RUST_BACKTRACE"),
        "a backtrace hint: {out:#?}"
    );
}

/// Panics unless the run exited 0 without a word on stderr.
pub fn assert_ok(out: &Out) -> &Out {
    assert_eq!(out.code, 0, "expected success: {out:#?}");
    assert_no_panic(out);
    assert!(
        out.stderr.trim().is_empty(),
        "expected a quiet stderr: {out:#?}"
    );
    out
}

/// Runs `capwire ctl` and panics unless it succeeds quietly.
pub fn ctl_ok(state: &Path, args: &[&str]) -> Out {
    let out = ctl(state, args);
    assert_ok(&out);
    out
}

/// Panics unless the run failed with `code` and one line on stderr (clap's
/// `For more information` hint aside) that mentions `needle`, and printed
/// nothing on stdout; that line.
pub fn assert_fails(out: &Out, code: i32, needle: &str) -> String {
    assert_eq!(out.code, code, "expected exit code {code}: {out:#?}");
    assert_no_panic(out);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr: {out:#?}");
    let line = lines[0];
    assert!(
        line.starts_with("capwire: ") || line.starts_with("error: "),
        "the message says who speaks: {line:?}"
    );
    assert!(line.contains(needle), "expected {needle:?} in {line:?}");
    assert!(out.stdout.trim().is_empty(), "nothing on stdout: {out:#?}");
    line.to_owned()
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cw")
        .tempdir()
        .expect("a temporary directory")
}
