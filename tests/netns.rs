//! Faults between hosts, played with real network namespaces: every
//! `capwire node` and the control plane (`capwire ctl`) run in a namespace
//! of their own, joined by veth pairs to one bridge namespace, with
//! addresses that exist only inside those namespaces (10.77.X.Y/24).
//!
//! ```text
//!   capwire-PID-N-h1        capwire-PID-N-br         capwire-PID-N-h3
//!   alpha 10.77.X.1 eth0 ---- v1 [br0] v3 ---- eth0 10.77.X.3 capwire ctl
//!                                  v2
//!                                  |
//!                        eth0 10.77.X.2 beta   capwire-PID-N-h2
//! ```
//!
//! The faults: a host cut off (`ip link set v1 down`) and back; a lossy,
//! slow link (`tc qdisc ... netem loss 30% delay 100ms`, or, on a kernel
//! without netem, 30% loss by a random classic-BPF filter into a dropping
//! htb class); a session that outlives a partition; a partition between
//! two nodes only (an address filter on their bridge ports) while both
//! still reach the control plane; and a node killed with SIGKILL in the
//! middle of acknowledged compare-and-set writes, restarted on the same
//! state directory and address.
//!
//! Each test builds its own namespaces, named with this process's pid and
//! a counter so that tests running at once never share one, and a guard
//! deletes them (and ends what still runs in them) when the test ends,
//! failed or not. Without root or without `ip netns`, the tests say so
//! and pass, unless `CAPWIRE_REQUIRE_NETNS=1` (CI sets it) makes that a
//! failure.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cli_support::{BIN, Out, START_DEADLINE, Spawned, assert_no_panic, poll, run_cmd, tempdir};
use serde_json::{Value as Json, json};

/// The port every node listens on (each host has its own address).
const PORT: u16 = 7000;

/// How much longer than its `--timeout` a `ctl` may take: the process's
/// own start and exit on a busy machine, and its session's close on exit
/// (up to the node's 1 s close timeout on a lossy link).
const SLACK: Duration = Duration::from_secs(2);

static LABS: AtomicUsize = AtomicUsize::new(0);

/// Runs `program args`; its output when it fails.
fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `ip LINE` (split at spaces), which must succeed.
fn ip(line: &str) {
    let args: Vec<&str> = line.split_whitespace().collect();
    sh("ip", &args).unwrap_or_else(|e| panic!("{e}"));
}

/// `ip netns exec NS tc ARGS...`.
fn try_tc(ns: &str, line: &str) -> Result<String, String> {
    let mut all = vec!["netns", "exec", ns, "tc"];
    all.extend(line.split_whitespace());
    sh("ip", &all)
}

/// `ip netns exec NS tc LINE` (split at spaces), which must succeed.
fn tc(ns: &str, line: &str) {
    try_tc(ns, line).unwrap_or_else(|e| panic!("{e}"));
}

/// `ip netns exec NS tc args`, which must succeed.
fn tc_args(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, "tc"];
    all.extend_from_slice(args);
    sh("ip", &all).unwrap_or_else(|e| panic!("{e}"));
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// How a link is degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shaping {
    /// `netem loss 30% delay 100ms`.
    Netem,
    /// 30% loss by a classic-BPF random filter (the kernel has no netem).
    RandomDrop,
}

/// A bridge namespace and `hosts` host namespaces hanging off it, deleted
/// on drop with whatever still runs in them.
struct Lab {
    prefix: String,
    subnet: usize,
    namespaces: Vec<String>,
}

impl Lab {
    /// The lab, or `None` (with a message) where namespaces cannot be
    /// made here.
    fn new(hosts: usize) -> Option<Lab> {
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let mut lab = Lab {
            prefix: format!("capwire-{}-{n}", std::process::id()),
            subnet: (std::process::id() as usize + n) % 200 + 20,
            namespaces: Vec::new(),
        };
        let br = lab.bridge();
        let unavailable = if !is_root() {
            Some("not running as root".to_owned())
        } else {
            sh("ip", &["netns", "add", &br]).err()
        };
        if let Some(why) = unavailable {
            let message = format!("network namespaces are unavailable ({why})");
            if std::env::var_os("CAPWIRE_REQUIRE_NETNS").is_some_and(|v| v == "1") {
                panic!("{message}, and CAPWIRE_REQUIRE_NETNS=1");
            }
            eprintln!("skipping: {message}");
            return None;
        }
        lab.namespaces.push(br.clone());
        ip(&format!("-n {br} link add br0 type bridge"));
        ip(&format!("-n {br} link set br0 up"));
        for h in 1..=hosts {
            let (ns, port, addr) = (lab.ns(h), Lab::port(h), lab.ip(h));
            ip(&format!("netns add {ns}"));
            lab.namespaces.push(ns.clone());
            ip(&format!(
                "-n {ns} link add eth0 type veth peer name {port} netns {br}"
            ));
            ip(&format!("-n {br} link set {port} master br0"));
            ip(&format!("-n {br} link set {port} up"));
            ip(&format!("-n {ns} addr add {addr}/24 dev eth0"));
            ip(&format!("-n {ns} link set eth0 up"));
            ip(&format!("-n {ns} link set lo up"));
        }
        Some(lab)
    }

    fn bridge(&self) -> String {
        format!("{}-br", self.prefix)
    }

    /// Host `h`'s namespace.
    fn ns(&self, h: usize) -> String {
        format!("{}-h{h}", self.prefix)
    }

    /// Host `h`'s port on the bridge (in the bridge namespace).
    fn port(h: usize) -> String {
        format!("v{h}")
    }

    /// Host `h`'s address.
    fn ip(&self, h: usize) -> String {
        format!("10.77.{}.{h}", self.subnet)
    }

    /// Where a node on host `h` listens.
    fn listen(&self, h: usize) -> String {
        format!("{}:{PORT}", self.ip(h))
    }

    /// Takes host `h`'s bridge port down (a cut cable) or up again.
    fn link(&self, h: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&format!(
            "-n {} link set {} {state}",
            self.bridge(),
            Lab::port(h)
        ));
    }

    /// Both ends of host `h`'s link: (namespace, device).
    fn ends(&self, h: usize) -> [(String, String); 2] {
        [
            (self.bridge(), Lab::port(h)),
            (self.ns(h), "eth0".to_owned()),
        ]
    }

    /// A root htb on `dev` whose class 1:2 drops everything (a pfifo of
    /// length 0) and whose default class 1:1 passes everything.
    fn dropping_root(ns: &str, dev: &str) {
        tc(
            ns,
            &format!("qdisc add dev {dev} root handle 1: htb default 1"),
        );
        tc(
            ns,
            &format!("class add dev {dev} parent 1: classid 1:1 htb rate 10gbit quantum 60000"),
        );
        tc(
            ns,
            &format!("class add dev {dev} parent 1: classid 1:2 htb rate 8bit quantum 1514"),
        );
        tc(
            ns,
            &format!("qdisc add dev {dev} parent 1:2 handle 20: pfifo limit 0"),
        );
    }

    /// Both directions of host `h`'s link lose 30% of their packets (and,
    /// with netem, take 100 ms longer).
    fn degrade(&self, h: usize) -> Shaping {
        let netem = "root netem loss 30% delay 100ms";
        let [(br, port), (ns, eth0)] = self.ends(h);
        if try_tc(&br, &format!("qdisc add dev {port} {netem}")).is_ok() {
            tc(&ns, &format!("qdisc add dev {eth0} {netem}"));
            return Shaping::Netem;
        }
        // No netem in this kernel: classic BPF, `ld [rand]; jgt 0.7 * 2^32
        // ? ret -1 (class 1:2, dropped) : ret 0 (no match, passed)`.
        let program = "4,32 0 0 4294963256,37 0 1 3006477107,6 0 0 4294967295,6 0 0 0";
        for (ns, dev) in self.ends(h) {
            Lab::dropping_root(&ns, &dev);
            let filter = format!("filter add dev {dev} parent 1: protocol all bpf bytecode");
            let mut args: Vec<&str> = filter.split_whitespace().collect();
            args.extend([program, "flowid", "1:2"]);
            tc_args(&ns, &args);
        }
        Shaping::RandomDrop
    }

    /// Host `h`'s link as it was.
    fn restore(&self, h: usize) {
        for (ns, dev) in self.ends(h) {
            tc(&ns, &format!("qdisc del dev {dev} root"));
        }
    }

    /// Drops everything host `h` sends (it still receives).
    fn drop_egress(&self, h: usize) {
        let ns = self.ns(h);
        Lab::dropping_root(&ns, "eth0");
        tc(
            &ns,
            "filter add dev eth0 parent 1: protocol all u32 match u32 0 0 flowid 1:2",
        );
    }

    /// Undoes [`Lab::drop_egress`].
    fn restore_egress(&self, h: usize) {
        tc(&self.ns(h), "qdisc del dev eth0 root");
    }

    /// Drops every IPv4 packet between hosts `a` and `b` on the bridge
    /// (each sees the other no more; both still reach everyone else).
    fn cut(&self, a: usize, b: usize) {
        let br = self.bridge();
        for (to, from) in [(a, b), (b, a)] {
            let dev = Lab::port(to);
            Lab::dropping_root(&br, &dev);
            let src = self.ip(from);
            tc(
                &br,
                &format!(
                    "filter add dev {dev} parent 1: protocol ip u32 match ip src {src}/32 flowid 1:2"
                ),
            );
        }
    }

    /// Undoes [`Lab::cut`].
    fn uncut(&self, a: usize, b: usize) {
        let br = self.bridge();
        for h in [a, b] {
            tc(&br, &format!("qdisc del dev {} root", Lab::port(h)));
        }
    }

    /// `capwire args` in host `h`'s namespace.
    fn capwire(&self, h: usize, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(h), BIN])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE")
            .env_remove("CAPWIRE_CTL_STATE")
            .stdin(Stdio::null());
        cmd
    }

    /// Starts `capwire node` on host `h` with its state in `state`.
    fn node(&self, h: usize, name: &str, state: &Path) -> LabNode {
        let listen = self.listen(h);
        let cmd = self.capwire(
            h,
            &[
                "node",
                "--json",
                "--name",
                name,
                "--state",
                state.to_str().unwrap(),
                "--listen",
                &listen,
            ],
        );
        let mut proc = Spawned::start(cmd, &format!("node {name} on host {h}"));
        let first = proc.wait_record(START_DEADLINE, "its startup line", |r| {
            r.get("node_id").is_some()
        });
        assert_eq!(
            first["addrs"],
            json!([format!("tcp://{listen}")]),
            "{first}"
        );
        LabNode {
            proc,
            id: first["node_id"].as_str().unwrap().to_owned(),
            invite: first["invite"].as_str().map(str::to_owned),
        }
    }

    /// Runs `capwire ctl --state STATE args...` on host `h` to its end.
    fn ctl(&self, h: usize, state: &Path, args: &[&str]) -> Out {
        let mut all = vec!["ctl", "--state", state.to_str().unwrap()];
        all.extend_from_slice(args);
        run_cmd(self.capwire(h, &all), &all.join(" "))
    }

    /// As [`Lab::ctl`], and it must succeed quietly.
    fn ctl_ok(&self, h: usize, state: &Path, args: &[&str]) -> Out {
        let out = self.ctl(h, state, args);
        assert_eq!(out.code, 0, "expected success: {args:?}: {out:#?}");
        assert_no_panic(&out);
        out
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // The hosts first (their veth pairs go with them), the bridge last.
        for ns in self.namespaces.iter().rev() {
            if let Ok(pids) = sh("ip", &["netns", "pids", ns]) {
                for pid in pids.split_whitespace() {
                    let _ = sh("kill", &["-KILL", pid]);
                }
            }
            if let Err(e) = sh("ip", &["netns", "del", ns]) {
                eprintln!("cannot delete namespace {ns}: {e}");
            }
        }
    }
}

/// A `capwire node` in a namespace.
struct LabNode {
    proc: Spawned,
    id: String,
    invite: Option<String>,
}

impl LabNode {
    fn invite(&self) -> &str {
        self.invite.as_deref().expect("the node printed an invite")
    }

    /// SIGKILL, and waits for it to be gone.
    fn kill_9(&mut self) {
        self.proc.signal("KILL");
        self.proc.wait_exit(Duration::from_secs(5));
    }
}

/// Panics unless `out` is a prompt failure with a documented code for an
/// unreachable or silent peer: 5 (no answer in time) or 6 (not reachable,
/// connection lost), one line on stderr, nothing on stdout, and no longer
/// than `steps` times its `timeout` (plus [`SLACK`]): `--timeout` bounds
/// each step of a command, the connection and then the call. The code.
fn assert_prompt_failure(out: &Out, steps: u32, timeout: Duration, what: &str) -> i32 {
    assert!(
        out.code == 5 || out.code == 6,
        "{what}: expected exit code 5 or 6: {out:#?}"
    );
    assert_no_panic(out);
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: one line on stderr: {out:#?}");
    assert!(lines[0].starts_with("capwire: "), "{what}: {out:#?}");
    assert!(out.stdout.is_empty(), "{what}: nothing on stdout: {out:#?}");
    assert!(
        out.took <= timeout * steps + SLACK,
        "{what}: took {:?} with --timeout {timeout:?} ({steps} steps)",
        out.took
    );
    out.code
}

/// `--timeout` as ctl takes it.
fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The record of a `--json` run that succeeded.
fn record(out: &Out) -> Json {
    out.record()
}

/// Polls a ctl command on host `h` until it succeeds; how long that took.
fn until_ok(lab: &Lab, h: usize, state: &Path, args: &[&str], within: Duration) -> Duration {
    let started = Instant::now();
    poll(within, &format!("{args:?} to succeed again"), || {
        (lab.ctl(h, state, args).code == 0).then_some(())
    });
    started.elapsed()
}

/// Panics unless this control plane is `peer`'s controller.
fn assert_controller(lab: &Lab, h: usize, state: &Path, peer: &str) {
    let status = record(&lab.ctl_ok(h, state, &["--json", "status", peer]));
    assert_eq!(
        status["value"]["you_are_controller"], true,
        "{peer} is still bound to this control plane: {status}"
    );
}

#[test]
fn a_cut_or_lossy_link_fails_calls_promptly_and_heals_with_the_binding_kept() {
    let Some(lab) = Lab::new(3) else { return };
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let (alpha, beta, ctl_host) = (1, 2, 3);
    let a = lab.node(alpha, "alpha", &tmp.path().join("alpha"));
    let b = lab.node(beta, "beta", &tmp.path().join("beta"));
    lab.ctl_ok(ctl_host, &cp, &["bind", a.invite()]);
    lab.ctl_ok(ctl_host, &cp, &["bind", b.invite()]);
    let echo = ["call", "alpha", "app.agent", "echo", "--args", "\"ping\""];
    assert_eq!(lab.ctl_ok(ctl_host, &cp, &echo).stdout, "alpha: ping\n");
    let set = lab.ctl_ok(
        ctl_host,
        &cp,
        &[
            "--json",
            "config",
            "--peer",
            "alpha",
            "set",
            r#"{"n":1}"#,
            "--if-version",
            "0",
        ],
    );
    assert_eq!(record(&set)["value"]["version"], 1);

    // 1. alpha's cable is cut: calls to it fail within their timeout;
    // beta, on the same bridge, still answers.
    let timeout = Duration::from_millis(1500);
    let t = ms(timeout);
    lab.link(alpha, false);
    let cut_at = Instant::now();
    let mut codes = Vec::new();
    for args in [
        &[
            "--timeout",
            &t,
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            "\"x\"",
        ][..],
        &["--timeout", &t, "config", "--peer", "alpha", "get"],
        &["--timeout", &t, "status", "alpha"],
        &[
            "--timeout",
            &t,
            "config",
            "--peer",
            "alpha",
            "set",
            "2",
            "--if-version",
            "1",
        ],
    ] {
        let out = lab.ctl(ctl_host, &cp, args);
        codes.push((
            assert_prompt_failure(&out, 1, timeout, &args.join(" ")),
            out.took,
        ));
    }
    let out = lab.ctl_ok(
        ctl_host,
        &cp,
        &[
            "--timeout",
            &t,
            "call",
            "beta",
            "app.agent",
            "echo",
            "--args",
            "\"x\"",
        ],
    );
    assert_eq!(out.stdout, "beta: x\n");
    lab.link(alpha, true);
    let partition = cut_at.elapsed();
    let healed = until_ok(&lab, ctl_host, &cp, &echo, Duration::from_secs(15));
    assert_controller(&lab, ctl_host, &cp, "alpha");
    let config = record(&lab.ctl_ok(
        ctl_host,
        &cp,
        &["--json", "config", "--peer", "alpha", "get"],
    ));
    assert_eq!(
        config["value"],
        json!({"value": {"n": 1}, "version": 1}),
        "the write refused during the cut was not applied"
    );
    eprintln!(
        "cut cable: {} calls failed (exit code, time) {codes:?} during a {partition:.1?} cut; \
         answered again {healed:.1?} after the heal",
        codes.len()
    );

    // 2. A lossy (and, with netem, slow) link: every call ends within its
    // timeout, answered or with a documented code. Here both steps of a
    // command can take their time: the connection (lost handshake
    // packets) and then the call.
    let shaping = lab.degrade(alpha);
    let timeout = Duration::from_secs(1);
    let t = ms(timeout);
    let (mut ok, mut slow, mut lost) = (0, 0, 0);
    let mut longest = Duration::ZERO;
    let started = Instant::now();
    for i in 0..10 {
        let text = format!("\"lossy {i}\"");
        let args = [
            "--timeout",
            &t,
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            &text,
        ];
        let out = lab.ctl(ctl_host, &cp, &args);
        longest = longest.max(out.took);
        if out.code == 0 {
            assert_eq!(out.stdout, format!("alpha: lossy {i}\n"), "{out:#?}");
            assert!(out.took <= timeout * 2 + SLACK, "took {:?}", out.took);
            ok += 1;
        } else if assert_prompt_failure(&out, 2, timeout, &args.join(" ")) == 5 {
            slow += 1;
        } else {
            lost += 1;
        }
    }
    let lossy_for = started.elapsed();
    lab.restore(alpha);
    let healed = until_ok(&lab, ctl_host, &cp, &echo, Duration::from_secs(15));
    assert_controller(&lab, ctl_host, &cp, "alpha");
    let set = lab.ctl_ok(
        ctl_host,
        &cp,
        &[
            "--json",
            "config",
            "--peer",
            "alpha",
            "set",
            r#"{"n":2}"#,
            "--if-version",
            "1",
        ],
    );
    assert_eq!(record(&set)["value"]["version"], 2);
    eprintln!(
        "lossy link ({shaping:?}): 10 calls in {lossy_for:.1?}: {ok} answered, {slow} timed out \
         (5), {lost} unreachable (6), the longest {longest:.1?}; answered again {healed:.1?} \
         after the heal"
    );

    // 3. A session that outlives a cut: a `ctl watch` owns the state and
    // keeps a session with each node; commands are handed to it and use
    // that session. While the cable is cut, they time out (the session
    // sees nothing); after the heal the same control plane is answered.
    let cmd = lab.capwire(
        ctl_host,
        &["ctl", "--json", "--state", cp.to_str().unwrap(), "watch"],
    );
    let mut watch = Spawned::start(cmd, "ctl watch");
    for name in ["alpha", "beta"] {
        watch.wait_record(Duration::from_secs(15), "connected", |r| {
            r["kind"] == "connected" && r["peer"] == name
        });
    }
    let get = ["--json", "config", "--peer", "alpha", "get"];
    assert_eq!(
        record(&lab.ctl_ok(ctl_host, &cp, &get))["value"]["version"],
        2
    );
    lab.link(alpha, false);
    let cut_at = Instant::now();
    let timeout = Duration::from_millis(1500);
    let t = ms(timeout);
    let failed = lab.ctl(
        ctl_host,
        &cp,
        &["--timeout", &t, "config", "--peer", "alpha", "get"],
    );
    let code = assert_prompt_failure(&failed, 1, timeout, "config get over the watch's session");
    let out = lab.ctl_ok(
        ctl_host,
        &cp,
        &[
            "--timeout",
            &t,
            "call",
            "beta",
            "app.agent",
            "echo",
            "--args",
            "\"y\"",
        ],
    );
    assert_eq!(out.stdout, "beta: y\n");
    std::thread::sleep(Duration::from_secs(2));
    lab.link(alpha, true);
    let partition = cut_at.elapsed();
    let healed = until_ok(&lab, ctl_host, &cp, &get, Duration::from_secs(20));
    assert_controller(&lab, ctl_host, &cp, "alpha");
    assert_eq!(
        record(&lab.ctl_ok(ctl_host, &cp, &get))["value"]["version"],
        2
    );
    watch.signal("INT");
    assert!(
        watch.wait_exit(Duration::from_secs(10)).success(),
        "{:#?}",
        watch.stderr()
    );
    eprintln!(
        "session across a {partition:.1?} cut: a call on it failed with {code} in {:.1?}; \
         answered again {healed:.1?} after the heal",
        failed.took
    );
    drop((a, b));
}

#[test]
fn a_partition_between_two_nodes_fails_their_calls_promptly_and_heals() {
    let Some(lab) = Lab::new(3) else { return };
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let (alpha, beta, ctl_host) = (1, 2, 3);
    let a = lab.node(alpha, "alpha", &tmp.path().join("alpha"));
    let b = lab.node(beta, "beta", &tmp.path().join("beta"));
    lab.ctl_ok(ctl_host, &cp, &["bind", a.invite()]);
    lab.ctl_ok(ctl_host, &cp, &["bind", b.invite()]);
    // beta becomes alpha's durable contact: alpha dials it and keeps the
    // session.
    let contact =
        json!({"name": "beta", "node_id": {"$bytes": b.id}, "addr": format!("tcp://{}", lab.listen(beta))})
            .to_string();
    let out = lab.ctl_ok(
        ctl_host,
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "core.connect",
            "introduce",
            "--args",
            &contact,
        ],
    );
    assert_eq!(record(&out)["value"]["added"], true, "{out:#?}");
    let ask = json!({"peer": b.id, "text": "hello"}).to_string();
    let ask = ["call", "alpha", "app.agent", "ask", "--args", &ask];
    let answered = until_ok(&lab, ctl_host, &cp, &ask, Duration::from_secs(10));
    assert_eq!(lab.ctl_ok(ctl_host, &cp, &ask).stdout, "beta: hello\n");

    // Cut between alpha and beta only.
    lab.cut(alpha, beta);
    let cut_at = Instant::now();
    let timeout = Duration::from_millis(1500);
    let t = ms(timeout);
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let mut args = vec!["--timeout", &t];
        args.extend_from_slice(&ask);
        let out = lab.ctl(ctl_host, &cp, &args);
        // The control plane reaches alpha; alpha's call to beta gets no
        // answer: a timeout (5), or alpha's typed `unavailable` (4) once it
        // knows beta is gone. Never an answer, never a hang.
        assert!(out.code == 5 || out.code == 4, "{out:#?}");
        if out.code == 4 {
            assert!(out.stderr.contains("unavailable"), "{out:#?}");
        }
        assert_no_panic(&out);
        assert!(out.stdout.is_empty(), "{out:#?}");
        assert!(out.took <= timeout + SLACK, "took {:?}", out.took);
        outcomes.push((out.code, out.took));
    }
    // Both still answer the control plane.
    for name in ["alpha", "beta"] {
        let args = [
            "--timeout",
            &t,
            "call",
            name,
            "app.agent",
            "echo",
            "--args",
            "\"z\"",
        ];
        assert_eq!(
            lab.ctl_ok(ctl_host, &cp, &args).stdout,
            format!("{name}: z\n")
        );
    }
    lab.uncut(alpha, beta);
    let partition = cut_at.elapsed();
    let healed = until_ok(&lab, ctl_host, &cp, &ask, Duration::from_secs(20));
    assert_eq!(lab.ctl_ok(ctl_host, &cp, &ask).stdout, "beta: hello\n");
    assert_controller(&lab, ctl_host, &cp, "alpha");
    assert_controller(&lab, ctl_host, &cp, "beta");
    eprintln!(
        "partition alpha|beta: first ask answered after {answered:.1?}; during a {partition:.1?} \
         cut asks ended (exit code, time) {outcomes:?}; answered again {healed:.1?} after the heal"
    );
}

/// How far the write loop got.
#[derive(Default)]
struct Progress {
    /// The values (= expected versions) of the acknowledged writes.
    acked: Vec<u64>,
    /// How long each acknowledged write took.
    took: Vec<Duration>,
    /// The write running now: its value and when its ctl was started.
    running: Option<(u64, Instant)>,
}

/// `ctl config set VERSION --if-version VERSION` from `from`, one after
/// another, until one fails: the value written is the version it expects,
/// so an applied write leaves version = value + 1. The write that failed
/// (its value) and its run.
fn write_loop(
    lab: &Lab,
    h: usize,
    state: &Path,
    from: u64,
    timeout: Duration,
    progress: &Mutex<Progress>,
) -> (u64, Out) {
    let t = ms(timeout);
    let mut v = from;
    loop {
        let value = v.to_string();
        progress.lock().unwrap().running = Some((v, Instant::now()));
        let out = lab.ctl(
            h,
            state,
            &[
                "--json",
                "--timeout",
                &t,
                "config",
                "set",
                &value,
                "--if-version",
                &value,
            ],
        );
        if out.code != 0 {
            return (v, out);
        }
        let version = record(&out)["value"]["version"].as_u64().unwrap();
        assert_eq!(version, v + 1, "each write applied once: {out:#?}");
        let mut p = progress.lock().unwrap();
        p.acked.push(v);
        p.took.push(out.took);
        v += 1;
    }
}

/// How a round of writes is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGKILL this long after a write's ctl was started (so that the kill
    /// lands before its connection, during it, or after its answer).
    KillAfter(Duration),
    /// The writes go over a `ctl watch`'s session; the node's answers are
    /// dropped from one write on (that write is applied, its answer never
    /// arrives), then SIGKILL.
    AnswerLostThenKill,
}

#[test]
fn kill_9_mid_writes_loses_no_acknowledged_write_and_a_retry_applies_once() {
    let Some(lab) = Lab::new(2) else { return };
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let state = tmp.path().join("node");
    let (node_host, ctl_host) = (1, 2);
    let mut node = lab.node(node_host, "alpha", &state);
    let id = node.id.clone();
    lab.ctl_ok(ctl_host, &cp, &["bind", node.invite()]);
    let get = ["--json", "config", "get"];
    let timeout = Duration::from_millis(1500);
    let mut next = 0u64;
    let rounds = [
        Stop::KillAfter(Duration::from_millis(40)),
        Stop::KillAfter(Duration::from_millis(80)),
        Stop::KillAfter(Duration::from_millis(120)),
        Stop::AnswerLostThenKill,
    ];
    for (round, stop) in rounds.into_iter().enumerate() {
        let round = round + 1;
        let mut watch = matches!(stop, Stop::AnswerLostThenKill).then(|| {
            let cmd = lab.capwire(
                ctl_host,
                &["ctl", "--json", "--state", cp.to_str().unwrap(), "watch"],
            );
            let mut watch = Spawned::start(cmd, "ctl watch");
            watch.wait_record(Duration::from_secs(15), "connected", |r| {
                r["kind"] == "connected" && r["peer"] == "alpha"
            });
            watch
        });
        // Writes until the node is killed under them.
        let progress = Mutex::new(Progress::default());
        let (in_flight, failed) = std::thread::scope(|s| {
            let writes = s.spawn(|| write_loop(&lab, ctl_host, &cp, next, timeout, &progress));
            let enough = next + 5;
            let started = poll(Duration::from_secs(30), "acknowledged writes", || {
                let p = progress.lock().unwrap();
                match (p.acked.last(), p.running) {
                    (Some(&last), Some((v, at))) if last >= enough && v == last + 1 => Some(at),
                    _ => None,
                }
            });
            match stop {
                Stop::KillAfter(offset) => {
                    std::thread::sleep(
                        (started + offset).saturating_duration_since(Instant::now()),
                    );
                    node.kill_9();
                    writes.join().unwrap()
                }
                Stop::AnswerLostThenKill => {
                    lab.drop_egress(node_host);
                    let ended = writes.join().unwrap();
                    node.kill_9();
                    lab.restore_egress(node_host);
                    ended
                }
            }
        });
        let killed_at = Instant::now();
        if let Some(mut watch) = watch.take() {
            watch.signal("INT");
            watch.wait_exit(Duration::from_secs(10));
        }
        let Progress { acked, took, .. } = progress.into_inner().unwrap();
        let last = *acked.last().unwrap();
        assert_eq!(in_flight, last + 1);
        let code = assert_prompt_failure(&failed, 1, timeout, "the write in flight");

        // Restarted on the same directory and address: the same node,
        // still bound (no invite), with every acknowledged write.
        node = lab.node(node_host, "alpha", &state);
        let restart = killed_at.elapsed();
        assert_eq!(node.id, id, "the identity survives");
        assert!(node.invite.is_none(), "a bound node opens no bind");
        assert_controller(&lab, ctl_host, &cp, "alpha");
        let config = record(&lab.ctl_ok(ctl_host, &cp, &get))["value"].clone();
        let found = config["value"].as_u64().unwrap();
        assert!(
            found == last || found == in_flight,
            "round {round}: value {found} after the restart; acknowledged up to {last}, \
             {in_flight} in flight"
        );
        assert_eq!(config["version"], found + 1, "{config}");
        let applied_before = found == in_flight;
        if matches!(stop, Stop::AnswerLostThenKill) {
            assert_eq!(code, 5, "the answer never came: {failed:#?}");
            assert!(
                applied_before,
                "the write whose answer was lost was applied"
            );
        }

        // The write in flight, retried: applied once, whether or not it
        // had been applied before the kill.
        let value = in_flight.to_string();
        let retry = lab.ctl(
            ctl_host,
            &cp,
            &["--json", "config", "set", &value, "--if-version", &value],
        );
        assert_no_panic(&retry);
        if applied_before {
            assert_eq!(retry.code, 4, "a second apply is refused: {retry:#?}");
            assert!(
                retry.stderr.contains("conflict")
                    && retry.stderr.contains(&format!("version {}", in_flight + 1)),
                "{retry:#?}"
            );
        } else {
            assert_eq!(retry.code, 0, "{retry:#?}");
            assert_eq!(record(&retry)["value"]["version"], in_flight + 1);
        }
        // The last acknowledged write, retried: refused, not applied again.
        let value = last.to_string();
        let again = lab.ctl(
            ctl_host,
            &cp,
            &["config", "set", &value, "--if-version", &value],
        );
        assert_eq!(again.code, 4, "{again:#?}");
        assert!(again.stderr.contains("conflict"), "{again:#?}");
        let config = record(&lab.ctl_ok(ctl_host, &cp, &get))["value"].clone();
        assert_eq!(
            config,
            json!({"value": in_flight, "version": in_flight + 1}),
            "round {round}: no write lost, none applied twice"
        );
        eprintln!(
            "round {round} ({stop:?}): {} writes acknowledged (up to version {}, {:.1?} each); \
             the one in flight ended with exit {code} after {:.1?} and {} before the kill; \
             restarted and answering in {restart:.1?}",
            acked.len(),
            last + 1,
            took.iter().sum::<Duration>() / took.len() as u32,
            failed.took,
            if applied_before {
                "was applied"
            } else {
                "was not applied"
            },
        );
        next = in_flight + 1;
    }
}
