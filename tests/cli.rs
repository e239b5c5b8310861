//! The command-line tool end to end: real `capwire node` processes on
//! 127.0.0.1, driven by real `capwire ctl` processes, each with its own
//! temporary state directories. Output is checked in both forms (text and
//! `--json`), failures by their exit code and their one line on stderr.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use cli_support::{
    NodeProc, Spawned, assert_fails, assert_ok, capwire, ctl, ctl_ok, poll, run, tempdir,
};
use serde_json::{Value as Json, json};

/// The names of a roster record's members.
fn member_names(roster: &Json) -> Vec<String> {
    roster["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The capability `id` in a manifest record.
fn capability<'a>(manifest: &'a Json, id: &str) -> &'a Json {
    manifest["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {manifest}"))
}

/// The class of `verb` in a capability record.
fn class_of<'a>(cap: &'a Json, verb: &str) -> &'a str {
    cap["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == verb)
        .unwrap_or_else(|| panic!("no verb {verb} in {cap}"))["class"]
        .as_str()
        .unwrap()
}

#[test]
fn bind_call_notify_manifest_and_status() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);

    // Bound under the manifest's name.
    let out = ctl_ok(&cp, &["bind", node.invite()]);
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("bound alpha ({})", node.id).as_str())
    );
    assert!(
        lines
            .next()
            .unwrap()
            .contains("app capwire.node, monitoring on"),
        "{out:#?}"
    );
    let peers = ctl_ok(&cp, &["--json", "peers"]).record();
    assert_eq!(peers["kind"], "peers");
    assert_eq!(peers["peers"][0]["name"], "alpha");
    assert_eq!(peers["peers"][0]["node_id"], node.id.as_str());
    assert_eq!(peers["peers"][0]["addrs"], json!([node.addr]));
    let text = ctl_ok(&cp, &["peers"]).stdout;
    assert!(
        text.starts_with("alpha ") && text.contains(&node.addr),
        "{text}"
    );

    // echo, by name and by key, as text and as JSON.
    let out = ctl_ok(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "\"hello\""],
    );
    assert_eq!(out.stdout, "alpha: hello\n");
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            &node.id,
            "app.agent",
            "echo",
            "--args",
            "\"hi there\"",
        ],
    );
    assert_eq!(
        out.record(),
        json!({"kind": "result", "value": "alpha: hi there"})
    );

    // A notification is sent and not answered.
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            "\"psst\"",
            "--notify",
        ],
    );
    assert_eq!(
        out.stdout,
        "sent app.agent/echo to alpha (fire-and-forget: no answer)\n"
    );
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            "\"psst\"",
            "--notify",
        ],
    );
    assert_eq!(
        out.record(),
        json!({"kind": "sent", "peer": "alpha", "cap": "app.agent", "verb": "echo"})
    );

    // The manifest, as text: a header, each capability, each verb.
    let text = ctl_ok(&cp, &["manifest", "alpha"]).stdout;
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("alpha ({}) app capwire.node epoch ", node.id))
            && first.ends_with(" monitoring on"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "  app.agent 1.0.0"), "{text}");
    let verb_line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(verb_line("echo"), ["echo", "request", "bootstrap"]);
    assert_eq!(verb_line("ask"), ["ask", "request", "controller"]);
    // ... and as JSON.
    let manifest = ctl_ok(&cp, &["--json", "manifest", "alpha"]).record();
    assert_eq!(manifest["kind"], "manifest");
    assert_eq!(manifest["node_id"], node.id.as_str());
    assert_eq!(manifest["name"], "alpha");
    assert_eq!(manifest["monitoring"], "on");
    let agent = capability(&manifest, "app.agent");
    assert_eq!(agent["version"], "1.0.0");
    assert_eq!(class_of(agent, "echo"), "bootstrap");
    assert_eq!(class_of(agent, "ask"), "controller");
    assert_eq!(
        class_of(capability(&manifest, "core.monitoring"), "status"),
        "bootstrap"
    );

    // This control plane is the node's controller.
    let text = ctl_ok(&cp, &["status", "alpha"]).stdout;
    assert!(
        text.starts_with("alpha: monitoring on; this control plane is its controller; "),
        "{text}"
    );
    let status = ctl_ok(&cp, &["--json", "status", "alpha"]).record();
    assert_eq!(status["kind"], "status");
    assert_eq!(status["value"]["you_are_controller"], true);
    assert_eq!(status["value"]["monitoring"], "on");
}

#[test]
fn denied_calls_exit_3_and_name_the_reason() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let stranger = tmp.path().join("stranger");
    let node = NodeProc::start("alpha", &[]);
    let bound = ctl_ok(&cp, &["--json", "bind", node.invite(), "--name", "front"]).record();
    assert_eq!(bound["kind"], "bound");
    assert_eq!(bound["name"], "front");
    assert_eq!(bound["node_id"], node.id.as_str());
    assert_eq!(bound["manifest"]["name"], "alpha");

    // An unknown verb and an unknown capability: the chokepoint's
    // unknown_verb.
    let out = ctl(&cp, &["call", "front", "app.agent", "no_such_verb"]);
    let line = assert_fails(&out, 3, "unknown_verb");
    assert!(line.contains("app.agent/no_such_verb"), "{line}");
    let out = ctl(&cp, &["call", "front", "app.nothing", "echo"]);
    assert_fails(&out, 3, "unknown_verb");

    // Another control plane, not bound: bootstrap verbs work, controller
    // verbs are unauthorized.
    let ask = json!({"peer": node.id, "text": "hi"}).to_string();
    let out = ctl(
        &stranger,
        &["call", node.invite(), "app.agent", "ask", "--args", &ask],
    );
    assert_fails(&out, 3, "unauthorized");
    let out = ctl(&stranger, &["config", "--peer", node.invite(), "get"]);
    assert_fails(&out, 3, "unauthorized");
    let out = ctl_ok(
        &stranger,
        &[
            "call",
            node.invite(),
            "app.agent",
            "echo",
            "--args",
            "\"hi\"",
        ],
    );
    assert_eq!(out.stdout, "alpha: hi\n");
    let text = ctl_ok(&stranger, &["status", node.invite()]).stdout;
    assert!(
        text.contains("this control plane is not its controller"),
        "{text}"
    );
    let status = ctl_ok(&stranger, &["--json", "status", node.invite()]).record();
    assert_eq!(status["value"]["you_are_controller"], false);

    // The bound one still is its controller.
    let status = ctl_ok(&cp, &["--json", "status", "front"]).record();
    assert_eq!(status["value"]["you_are_controller"], true);
}

#[test]
fn cluster_and_config() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start_in("alpha", &tmp.path().join("node"));
    ctl_ok(&cp, &["bind", node.invite()]);

    // Two children; a second "carol" is refused.
    let text = ctl_ok(&cp, &["cluster", "create", "bob", "--bio", "the first"]).stdout;
    let cols: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(cols[1], "bob", "{text}");
    assert_eq!(cols[3], "monitoring=off", "{text}");
    let bob_cid = cols[0].to_owned();
    let carol = ctl_ok(&cp, &["--json", "cluster", "create", "carol"]).record();
    assert_eq!(carol["kind"], "member");
    assert_eq!(carol["peer"], "alpha");
    assert_eq!(carol["value"]["name"], "carol");
    let carol_cid = carol["value"]["cid"].as_str().unwrap().to_owned();
    assert_ne!(bob_cid, carol_cid);
    let out = ctl(&cp, &["cluster", "create", "carol"]);
    assert_fails(&out, 4, "duplicate");

    // The roster, as text and JSON.
    let text = ctl_ok(&cp, &["cluster", "list"]).stdout;
    assert!(text.starts_with("roster of alpha version "), "{text}");
    assert!(
        text.lines().next().unwrap().ends_with(": 2 members"),
        "{text}"
    );
    let roster = ctl_ok(&cp, &["--json", "cluster", "list"]).record();
    assert_eq!(roster["kind"], "roster");
    assert_eq!(member_names(&roster), ["bob", "carol"]);
    assert_eq!(roster["members"][0]["bio"], "the first");
    assert_eq!(roster["members"][0]["monitoring"], "off");
    let carol_id = roster["members"][1]["node_id"].as_str().unwrap().to_owned();

    // Monitoring on: this control plane binds the child and calls it by
    // its name.
    let text = ctl_ok(&cp, &["cluster", "set-monitoring", "bob", "on"]).stdout;
    assert!(
        text.starts_with(&bob_cid) && text.contains("monitoring=on"),
        "{text}"
    );
    let member = ctl_ok(&cp, &["--json", "cluster", "set-monitoring", "carol", "on"]).record();
    assert_eq!(member["value"]["monitoring"], "on");
    let peers = ctl_ok(&cp, &["--json", "peers"]).record();
    let bob = peers["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "bob")
        .unwrap_or_else(|| panic!("bob is in the book: {peers}"))
        .clone();
    assert_eq!(bob["parent"], "alpha");
    assert_eq!(bob["cid"], bob_cid.as_str());
    let out = ctl_ok(
        &cp,
        &["call", "bob", "app.agent", "echo", "--args", "\"hi\""],
    );
    assert_eq!(out.stdout, "bob: hi\n");
    let status = ctl_ok(&cp, &["--json", "status", "carol"]).record();
    assert_eq!(status["value"]["you_are_controller"], true);

    // Introduced, bob can reach carol (not before).
    let ask = json!({"peer": carol_id, "text": "hello"}).to_string();
    let out = ctl(&cp, &["call", "bob", "app.agent", "ask", "--args", &ask]);
    assert_fails(&out, 4, "not reachable");
    let text = ctl_ok(&cp, &["cluster", "introduce", "bob", "carol"]).stdout;
    assert_eq!(
        text,
        format!("{bob_cid} and {carol_cid} are now each other's contacts\n")
    );
    let out = ctl_ok(&cp, &["call", "bob", "app.agent", "ask", "--args", &ask]);
    assert_eq!(out.stdout, "carol: hello\n");

    // A child's contact is its invite.
    let contact = ctl_ok(&cp, &["--json", "cluster", "contact", "bob"]).record();
    assert_eq!(contact["kind"], "contact");
    assert!(
        contact["value"]["invite"]
            .as_str()
            .unwrap()
            .starts_with(&format!(
                "capwire://{}@127.0.0.1:",
                bob["node_id"].as_str().unwrap()
            )),
        "{contact}"
    );

    // Removed: gone from the roster and from the book.
    let text = ctl_ok(&cp, &["cluster", "remove", "carol"]).stdout;
    assert_eq!(text, format!("removed {carol_cid}\n"));
    let roster = ctl_ok(&cp, &["--json", "cluster", "list"]).record();
    assert_eq!(member_names(&roster), ["bob"]);
    let out = ctl(
        &cp,
        &["call", "carol", "app.agent", "echo", "--args", "\"x\""],
    );
    assert_fails(&out, 2, "unknown peer \"carol\"");

    // Configuration, with a refused compare-and-set.
    assert_eq!(ctl_ok(&cp, &["config", "get"]).stdout, "version 0: null\n");
    let value = r#"{"model":"small","key":{"$bytes":"00ff"},"n":3}"#;
    let text = ctl_ok(&cp, &["config", "set", value]).stdout;
    assert_eq!(text, "configuration now at version 1\n");
    let out = ctl(&cp, &["config", "set", "{}", "--if-version", "0"]);
    let line = assert_fails(&out, 4, "conflict");
    assert!(line.contains("version 1"), "{line}");
    let config = ctl_ok(&cp, &["--json", "config", "get"]).record();
    assert_eq!(config["kind"], "config");
    assert_eq!(config["value"]["version"], 1);
    assert_eq!(
        config["value"]["value"],
        json!({"model": "small", "key": {"$bytes": "00ff"}, "n": 3})
    );
    let set = ctl_ok(
        &cp,
        &[
            "--json",
            "config",
            "--peer",
            "alpha",
            "set",
            "[1,2]",
            "--if-version",
            "1",
        ],
    )
    .record();
    assert_eq!(set["kind"], "config_set");
    assert_eq!(set["value"]["version"], 2);
    assert_eq!(ctl_ok(&cp, &["config", "get"]).stdout, "version 2: [1,2]\n");

    // --peer names the node in every command, before or after a
    // subcommand; the commands that need a node also take it first.
    let set = ctl_ok(
        &cp,
        &[
            "--json",
            "config",
            "set",
            "--peer",
            "alpha",
            "[3]",
            "--if-version",
            "2",
        ],
    )
    .record();
    assert_eq!(set["value"]["version"], 3);
    let text = ctl_ok(&cp, &["config", "get", "--peer", "alpha"]).stdout;
    assert_eq!(text, "version 3: [3]\n");
    let roster = ctl_ok(&cp, &["--json", "cluster", "list", "--peer", "alpha"]).record();
    assert_eq!(roster["peer"], "alpha");
    let roster = ctl_ok(&cp, &["--json", "cluster", "--peer", "alpha", "list"]).record();
    assert_eq!(member_names(&roster), ["bob"]);
    let text = ctl_ok(
        &cp,
        &["cluster", "set-bio", "bob", "renamed", "--peer", "alpha"],
    )
    .stdout;
    assert!(text.contains("bob"), "{text}");
    let text = ctl_ok(&cp, &["status", "--peer", "bob"]).stdout;
    assert!(text.starts_with("bob: monitoring on; "), "{text}");
    let manifest = ctl_ok(&cp, &["--json", "manifest", "--peer", "alpha"]).record();
    assert_eq!(manifest["name"], "alpha");
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "--peer",
            "bob",
            "app.agent",
            "echo",
            "--args",
            "\"opt\"",
        ],
    );
    assert_eq!(out.stdout, "bob: opt\n");
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "app.agent",
            "echo",
            "--args",
            "\"x\"",
            "--peer",
            "alpha",
        ],
    );
    assert_eq!(out.stdout, "alpha: x\n");
    // Named twice, or not at all: bad usage.
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--peer", "bob"],
    );
    assert_fails(&out, 2, "named twice");
    let out = ctl(&cp, &["call", "app.agent", "echo"]);
    assert_fails(&out, 2, "say which node");
    for args in [
        &["status"][..],
        &["manifest"],
        &["status", "alpha", "--peer", "bob"],
    ] {
        let out = ctl(&cp, args);
        assert_eq!(out.code, 2, "{args:?}: {out:#?}");
        assert!(out.stdout.is_empty(), "{out:#?}");
    }
}

#[test]
fn help_shows_how_to_name_a_node_and_where_an_invite_comes_from() {
    let out = run(&["ctl", "bind", "--help"]);
    assert_ok(&out);
    assert!(
        !out.stdout.contains("--invite"),
        "capwire node has no --invite: {}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("the `invite` line `capwire node` prints"),
        "{}",
        out.stdout
    );
    for command in [
        &["call"][..],
        &["status"],
        &["manifest"],
        &["disable"],
        &["forget"],
        &["config"],
        &["config", "set"],
        &["cluster"],
        &["cluster", "create"],
    ] {
        let mut args = vec!["ctl"];
        args.extend_from_slice(command);
        args.push("--help");
        let out = run(&args);
        assert_ok(&out);
        assert!(
            out.stdout.contains("--peer <PEER>"),
            "{command:?}: {}",
            out.stdout
        );
    }
}

#[test]
fn disable_lets_another_control_plane_bind() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let other = tmp.path().join("other");
    let mut node = NodeProc::start("alpha", &[]);
    let first = node.invite().to_owned();

    // A wrong code is refused (and counted); the right one binds, once.
    let wrong = format!("{}#AAAAAAAAAA", first.split('#').next().unwrap());
    let line = assert_fails(&ctl(&cp, &["bind", &wrong]), 3, "bind_failed");
    assert!(line.contains("wrong code"), "{line}");
    ctl_ok(&cp, &["bind", &first]);
    assert_fails(&ctl(&other, &["bind", &first]), 3, "bind_failed");
    assert_fails(
        &ctl(&other, &["config", "--peer", &first, "get"]),
        3,
        "unauthorized",
    );

    // Let go: the node opens a new bind and prints its invite.
    let text = ctl_ok(&cp, &["disable", "alpha"]).stdout;
    assert_eq!(text, "alpha is no longer bound to this control plane\n");
    let again = node
        .proc
        .wait_record(Duration::from_secs(10), "a new invite", |r| {
            r.get("node_id").is_none() && r["invite"].as_str().is_some_and(|i| i != first)
        });
    let again = again["invite"].as_str().unwrap().to_owned();
    assert!(
        again.starts_with(&format!("capwire://{}@", node.id)),
        "{again}"
    );
    let text = ctl_ok(&cp, &["status", "alpha"]).stdout;
    assert!(
        text.contains("this control plane is not its controller"),
        "{text}"
    );
    assert_fails(&ctl(&cp, &["disable", "alpha"]), 3, "unauthorized");

    // Another control plane binds it; the first one is refused.
    let bound = ctl_ok(&other, &["--json", "bind", &again]).record();
    assert_eq!(bound["name"], "alpha");
    ctl_ok(&other, &["config", "get"]);
    assert_fails(&ctl(&cp, &["config", "get"]), 3, "unauthorized");
}

#[test]
fn a_restarted_node_keeps_its_control_plane() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let state = tmp.path().join("node");
    let start = |listen: &str| {
        let mut cmd = capwire();
        cmd.args(["node", "--name", "alpha", "--state"])
            .arg(&state)
            .args(["--listen", listen]);
        Spawned::start(cmd, "node alpha")
    };
    let mut first = start("127.0.0.1:0");
    let id_line = first.wait_line(Duration::from_secs(15), "its id", |l| {
        l.starts_with("node ")
    });
    let id = id_line.split_whitespace().nth(1).unwrap().to_owned();
    let listening = first.wait_line(Duration::from_secs(5), "its address", |l| {
        l.starts_with("listening ")
    });
    let addr = listening.split_whitespace().nth(1).unwrap().to_owned();
    let invite = first.wait_line(Duration::from_secs(5), "an invite", |l| {
        l.starts_with("invite ")
    });
    let invite = invite.split_whitespace().nth(1).unwrap().to_owned();
    assert!(invite.starts_with(&format!("capwire://{id}@")), "{invite}");
    ctl_ok(&cp, &["bind", &invite]);
    ctl_ok(&cp, &["config", "set", r#"{"kept":true}"#]);

    // SIGTERM: a clean exit, quickly.
    let stopped = Instant::now();
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "exit on SIGTERM: {status}");
    assert!(stopped.elapsed() < Duration::from_secs(5));

    // The same state, the same port.
    let port = addr.rsplit(':').next().unwrap();
    let mut second = start(&format!("127.0.0.1:{port}"));
    let again = second.wait_line(Duration::from_secs(15), "its id", |l| {
        l.starts_with("node ")
    });
    assert_eq!(again, id_line, "the same identity");
    second.wait_line(Duration::from_secs(5), "its address", |l| {
        l == listening.as_str()
    });

    // Still its controller: a controller verb works, status says so.
    let config = ctl_ok(&cp, &["--json", "config", "get"]).record();
    assert_eq!(config["value"]["value"], json!({"kept": true}));
    let text = ctl_ok(&cp, &["status", "alpha"]).stdout;
    assert!(
        text.starts_with("alpha: monitoring on; this control plane is its controller"),
        "{text}"
    );
    ctl_ok(&cp, &["cluster", "create", "bob"]);
    // The node answered, so it is past its startup lines: none was an
    // invite.
    let lines = second.stdout();
    assert!(
        lines.iter().all(|l| !l.starts_with("invite")),
        "a bound node prints no invite: {lines:#?}"
    );
    second.signal("TERM");
    assert!(second.wait_exit(Duration::from_secs(5)).success());

    // On another port: the book's address is stale, an invite-form
    // address (no code) finds it, under its name.
    let mut third = start("127.0.0.1:0");
    let moved = third.wait_line(Duration::from_secs(15), "its address", |l| {
        l.starts_with("listening ")
    });
    let moved = moved
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_start_matches("tcp://");
    assert_fails(&ctl(&cp, &["status", "alpha"]), 6, "cannot reach alpha");
    let text = ctl_ok(&cp, &["status", &format!("capwire://{id}@{moved}")]).stdout;
    assert!(
        text.starts_with("alpha: monitoring on; this control plane is its controller"),
        "{text}"
    );
}

#[test]
fn keygen_makes_an_identity_the_node_uses() {
    let tmp = tempdir();
    let key = tmp.path().join("alpha.key");
    let key_arg = key.to_str().unwrap();

    let out = run(&["keygen", "--out", key_arg]);
    assert_ok(&out);
    let id = out.stdout.trim().to_owned();
    assert_eq!(id.len(), 64, "{out:#?}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    let written = std::fs::read(&key).unwrap();

    // Never replaced.
    let out = run(&["keygen", "--out", key_arg]);
    assert_fails(&out, 1, "exists");
    assert_eq!(
        std::fs::read(&key).unwrap(),
        written,
        "the file is untouched"
    );

    // Without --out: the key file's text on stdout, the id on stderr.
    let out = run(&["keygen"]);
    assert_eq!(out.code, 0, "{out:#?}");
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("capwire-identity-v1"));
    assert_eq!(lines.next().map(str::len), Some(64));
    assert!(out.stderr.starts_with("node id: "), "{out:#?}");

    // A node with --key is that identity, with or without a state.
    let node = NodeProc::start("alpha", &["--key", key_arg]);
    assert_eq!(node.id, id);
    assert!(node.invite().starts_with(&format!("capwire://{id}@")));
    node.stop(Duration::from_secs(5));
    let state = tmp.path().join("node");
    let node = NodeProc::start(
        "alpha",
        &["--key", key_arg, "--state", state.to_str().unwrap()],
    );
    assert_eq!(node.id, id);
    node.stop(Duration::from_secs(5));

    // A key that is not there: a clear failure.
    let missing = tmp.path().join("missing.key");
    let out = run(&["node", "--key", missing.to_str().unwrap()]);
    assert_fails(&out, 1, "cannot use the key");
}

#[test]
fn watch_sees_what_forwarded_commands_do() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let stranger = tmp.path().join("stranger");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);

    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).arg("watch");
    let mut watch = Spawned::start(cmd, "ctl watch");
    watch.wait_record(Duration::from_secs(10), "connected to alpha", |r| {
        r["kind"] == "connected" && r["peer"] == "alpha"
    });
    assert!(
        cp.join("ctl.sock").exists(),
        "the owner listens on ctl.sock"
    );

    // Forwarded to the watch (the state is locked), with the output and
    // the exit code of a local run.
    let out = ctl_ok(&cp, &["cluster", "create", "dave", "--bio", "forwarded"]);
    let cols: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(cols[1], "dave", "{out:#?}");
    let member = ctl_ok(&cp, &["--json", "cluster", "create", "erin"]).record();
    assert_eq!(member["kind"], "member");
    assert_eq!(member["value"]["name"], "erin");
    let out = ctl_ok(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "\"via\""],
    );
    assert_eq!(out.stdout, "alpha: via\n");
    let out = ctl(&cp, &["call", "alpha", "app.agent", "nope"]);
    assert_fails(&out, 3, "unknown_verb");
    let out = ctl(&cp, &["call", "nobody", "app.agent", "echo"]);
    assert_fails(&out, 2, "unknown peer");

    // The watch saw the roster change ...
    let roster = watch.wait_record(Duration::from_secs(10), "a roster with erin", |r| {
        r["kind"] == "roster"
            && r["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["name"] == "erin"))
    });
    assert_eq!(roster["peer"], "alpha");
    assert!(member_names(&roster).contains(&"dave".to_owned()));

    // ... and copies of what another peer sent the node.
    ctl_ok(
        &stranger,
        &[
            "call",
            node.invite(),
            "app.agent",
            "echo",
            "--args",
            "\"psst\"",
        ],
    );
    let copy = watch.wait_record(Duration::from_secs(10), "a copy of the echo", |r| {
        r["kind"] == "copy" && r["verb"] == "echo"
    });
    assert_eq!(copy["from"], "alpha");
    assert_eq!(copy["dir"], "in");
    assert_eq!(copy["cap"], "app.agent");
    assert_eq!(copy["body"], "psst");
    assert!(copy["seq"].as_u64().unwrap() >= 1, "{copy}");

    // ... and the calls made through it.
    watch.wait_record(Duration::from_secs(10), "the forwarded create", |r| {
        r["kind"] == "call"
            && r["cap"] == "core.cluster"
            && r["verb"] == "create"
            && r["ok"] == true
    });
    let denied = watch.wait_record(Duration::from_secs(10), "the forwarded denial", |r| {
        r["kind"] == "call" && r["verb"] == "nope"
    });
    assert_eq!(denied["ok"], false);
    assert_eq!(denied["error"], "unknown_verb");

    // A watch handed over holds one of the owner's 8 slots while its
    // client runs, and frees it when the client goes.
    let mut watchers: Vec<Spawned> = (0..8)
        .map(|i| {
            let mut cmd = capwire();
            cmd.args(["ctl", "--json", "--state"]).arg(&cp).arg("watch");
            Spawned::start(cmd, &format!("forwarded watch {i}"))
        })
        .collect();
    for w in &mut watchers {
        w.wait_record(Duration::from_secs(15), "connected to alpha", |r| {
            r["kind"] == "connected" && r["peer"] == "alpha"
        });
    }
    let out = ctl(&cp, &["peers"]);
    assert_fails(&out, 1, "busy");
    for w in &mut watchers {
        w.signal("INT");
        assert!(w.wait_exit(Duration::from_secs(5)).success());
    }
    poll(Duration::from_secs(5), "a free slot", || {
        let out = ctl(&cp, &["--json", "peers"]);
        (out.code == 0).then(|| assert_eq!(out.record()["kind"], "peers"))
    });

    // Every record has a kind.
    for r in watch.records() {
        assert!(r["kind"].is_string(), "{r}");
    }

    // SIGINT ends it cleanly, and a watch handed to it with it; then the
    // state is free again.
    let mut cmd = capwire();
    cmd.args(["ctl", "--state"]).arg(&cp).arg("watch");
    let mut handed = Spawned::start(cmd, "a forwarded watch");
    handed.wait_line(Duration::from_secs(10), "connected to alpha", |l| {
        l == "connected to alpha"
    });
    watch.signal("INT");
    let status = watch.wait_exit(Duration::from_secs(5));
    assert!(
        status.success(),
        "watch exit: {status}\n{:#?}",
        watch.stderr()
    );
    assert!(watch.stderr().is_empty(), "{:#?}", watch.stderr());
    let status = handed.wait_exit(Duration::from_secs(5));
    assert_eq!(status.code(), Some(1), "{:#?}", handed.stderr());
    assert_eq!(
        handed.stderr(),
        ["capwire: the ctl process that owned the state directory stopped"]
    );
    let roster = ctl_ok(&cp, &["--json", "cluster", "list"]).record();
    assert_eq!(member_names(&roster), ["dave", "erin"]);
}

#[test]
fn commands_at_once_on_one_state_directory_all_succeed() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);
    let state = cp.to_str().unwrap();
    for round in 0..5 {
        let text = format!("\"round {round}\"");
        let commands: Vec<Vec<&str>> = vec![
            vec![
                "ctl",
                "--state",
                state,
                "call",
                "alpha",
                "app.agent",
                "echo",
                "--args",
                &text,
            ],
            vec!["ctl", "--state", state, "--json", "cluster", "list"],
            vec!["ctl", "--state", state, "status", "alpha"],
            vec![
                "ctl",
                "--state",
                state,
                "call",
                "alpha",
                "app.agent",
                "nope",
            ],
        ];
        let outs: Vec<_> = std::thread::scope(|s| {
            let running: Vec<_> = commands
                .iter()
                .map(|args| s.spawn(move || run(args)))
                .collect();
            running.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(
            assert_ok(&outs[0]).stdout,
            format!("alpha: round {round}\n")
        );
        assert_eq!(assert_ok(&outs[1]).record()["kind"], "roster");
        assert!(
            assert_ok(&outs[2]).stdout.contains("is its controller"),
            "{outs:#?}"
        );
        assert_fails(&outs[3], 3, "unknown_verb");
    }
}

#[test]
fn bad_input_fails_with_one_clear_line() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);

    // Malformed invites.
    let out = ctl(&cp, &["bind", "capwire://not-a-key@127.0.0.1:1#ABC"]);
    assert_fails(&out, 2, "not an invite");
    let out = ctl(&cp, &["bind", "hello"]);
    assert_fails(&out, 2, "not an invite");
    let no_code = node.invite().split('#').next().unwrap().to_owned();
    let out = ctl(&cp, &["bind", &no_code]);
    assert_fails(&out, 2, "no code");

    // An unknown peer.
    let out = ctl(&cp, &["call", "bogus", "app.agent", "echo"]);
    let line = assert_fails(&out, 2, "unknown peer \"bogus\"");
    assert!(line.contains("alpha"), "it names the known ones: {line}");

    // --args that do not parse, and args the verb refuses.
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "{\"a\":"],
    );
    assert_fails(&out, 2, "--args is not JSON");
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "[1]"],
    );
    assert_fails(&out, 4, "bad_args");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            r#"{"$int":"x"}"#,
        ],
    );
    assert_fails(&out, 2, "bad args");
    let ask = r#"{"peer":"zz","text":"x"}"#;
    let out = ctl(&cp, &["call", "alpha", "app.agent", "ask", "--args", ask]);
    assert_fails(&out, 4, "bad_args");
    let out = ctl(&cp, &["config", "set", "{nope"]);
    assert_fails(&out, 2, "not JSON");

    // A peer that takes the connection and never answers: a timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stranger_key = node_id_of(&cp);
    let silent = format!("{stranger_key}@{}", silent.local_addr().unwrap());
    let out = ctl(
        &cp,
        &[
            "--timeout",
            "300ms",
            "status",
            &format!("capwire://{silent}"),
        ],
    );
    assert_fails(&out, 5, "no answer within the timeout");
    assert!(out.took < Duration::from_secs(3), "took {:?}", out.took);
    let out = ctl(
        &cp,
        &[
            "--timeout",
            "300ms",
            "bind",
            &format!("capwire://{silent}#ABCDEFGHJK"),
        ],
    );
    assert_fails(&out, 5, "no answer within the timeout");

    // Bad durations (clap's own errors, also one line and exit 2).
    for bad in ["5x", "soon", "-1s", "1e400", "", "0", "0ms"] {
        let flag = format!("--timeout={bad}");
        let out = ctl(&cp, &[&flag, "peers"]);
        assert_fails(&out, 2, "error:");
    }
    let out = ctl(&cp, &["--timeout", "5x", "peers"]);
    assert_fails(&out, 2, "unknown unit");
    for good in ["1.5s", "7", "1m 30s", "2500ms"] {
        ctl_ok(&cp, &["--timeout", good, "peers"]);
    }
    // Bad usage.
    let out = ctl(&cp, &["call", "alpha"]);
    assert_eq!(out.code, 2, "{out:#?}");
    let out = ctl(&cp, &["cluster", "set-monitoring", "x", "maybe"]);
    assert_eq!(out.code, 2, "{out:#?}");

    // A node that is not running: exit 6, quickly; bad input still 2.
    node.stop(Duration::from_secs(5));
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "echo", "--args", "\"x\""],
    );
    assert_fails(&out, 6, "cannot reach alpha");
    assert!(out.took < Duration::from_secs(3), "took {:?}", out.took);
    let out = ctl(&cp, &["status", "alpha"]);
    assert_fails(&out, 6, "cannot reach alpha");
    let out = ctl(&cp, &["config", "set", "{nope"]);
    assert_fails(&out, 2, "not JSON");
    let out = ctl(&cp, &["call", "alpha", "app.agent", "echo", "--args", "{"]);
    assert_fails(&out, 2, "--args is not JSON");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            r#"{"$int":"x"}"#,
        ],
    );
    assert_fails(&out, 2, "bad args");

    // Forgotten: an unknown peer.
    assert_eq!(ctl_ok(&cp, &["forget", "alpha"]).stdout, "forgot alpha\n");
    let out = ctl(&cp, &["status", "alpha"]);
    assert_fails(&out, 2, "no node is bound yet");
    let out = ctl(&cp, &["cluster", "list"]);
    assert_fails(&out, 2, "no node is bound yet");

    // Even an address nobody listens on, given as an invite.
    let dead = format!("capwire://{}@127.0.0.1:1", node_id_of(&cp));
    let started = Instant::now();
    let out = ctl(&cp, &["status", &dead]);
    assert_fails(&out, 6, "cannot reach");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// Some valid key: this control plane's own.
fn node_id_of(cp: &std::path::Path) -> String {
    ctl_ok(cp, &["--json", "peers"]).record()["me"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The kind of `verb` in a capability record.
fn kind_of<'a>(cap: &'a Json, verb: &str) -> &'a str {
    cap["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == verb)
        .unwrap_or_else(|| panic!("no verb {verb} in {cap}"))["kind"]
        .as_str()
        .unwrap()
}

/// `ctl call ... --stream` printed one line of JSON per item: the items.
fn text_items(out: &cli_support::Out) -> Vec<String> {
    out.stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<String>(l)
                .unwrap_or_else(|e| panic!("not a JSON string: {l:?}: {e}"))
        })
        .collect()
}

/// The args of `app.agent/tell` for a text of `words` one-letter words.
fn many_words(words: usize) -> String {
    serde_json::to_string(&vec!["w"; words].join(" ")).unwrap()
}

/// Checks the records of a stream under --json: items numbered from 1,
/// then one last record of `last_kind` that counts them; the items.
fn json_items(records: &[Json], last_kind: &str) -> Vec<Json> {
    let (last, items) = records.split_last().expect("at least the last record");
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item["kind"], "item", "{item}");
        assert_eq!(item["seq"], i + 1, "{item}");
        assert_eq!(item.as_object().unwrap().len(), 3, "{item}");
    }
    assert_eq!(last["kind"], last_kind, "{last}");
    assert_eq!(last["items"], items.len(), "{last}");
    items.iter().map(|r| r["item"].clone()).collect()
}

#[test]
fn call_stream_prints_each_item_and_the_manifest_shows_the_kind() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);

    // The manifest says which verbs are streams.
    let text = ctl_ok(&cp, &["manifest", "alpha"]).stdout;
    let verb_line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(verb_line("tell"), ["tell", "stream", "bootstrap"]);
    assert_eq!(verb_line("note"), ["note", "notification", "bootstrap"]);
    let manifest = ctl_ok(&cp, &["--json", "manifest", "alpha"]).record();
    let agent = capability(&manifest, "app.agent");
    assert_eq!(kind_of(agent, "tell"), "stream");
    assert_eq!(kind_of(agent, "echo"), "request");
    assert_eq!(kind_of(agent, "note"), "notification");
    assert_eq!(
        kind_of(capability(&manifest, "core.protocol"), "versions"),
        "request"
    );

    // Text: one line of JSON per item; the items make NAME: TEXT again.
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"hello streaming world\"",
            "--stream",
        ],
    );
    assert_eq!(
        text_items(&out),
        ["alpha:", "hello", "streaming", "world"],
        "{out:#?}"
    );
    // Items that need escaping stay one line each.
    let tricky = "tab\there \"quoted\" ünïcödé back\\slash";
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "--peer",
            &node.id,
            "app.agent",
            "tell",
            "--stream",
            "--args",
            &serde_json::to_string(tricky).unwrap(),
        ],
    );
    let items = text_items(&out);
    assert_eq!(
        items.join(" "),
        format!("alpha: {}", tricky.replace('\t', " "))
    );
    assert_eq!(out.stdout.lines().count(), 6, "{out:#?}");

    // --json: an item record each, numbered, then the end.
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"one two\"",
            "--stream",
        ],
    );
    let records = out.records();
    assert_eq!(
        records[0],
        json!({"kind": "item", "seq": 1, "item": "alpha:"})
    );
    assert_eq!(json_items(&records, "end"), ["alpha:", "one", "two"]);
    assert_eq!(records.last().unwrap(), &json!({"kind": "end", "items": 3}));

    // More items than the window (256 items): the credit is granted
    // again as they are taken, and every one arrives, in order.
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            &many_words(1000),
            "--stream",
        ],
    );
    let items = json_items(&out.records(), "end");
    assert_eq!(items.len(), 1001);
    assert_eq!(items[0], "alpha:");
    assert!(items[1..].iter().all(|w| w == "w"));

    // A control plane that is not the node's controller may call it too:
    // tell is a bootstrap verb.
    let stranger = tmp.path().join("stranger");
    let out = ctl_ok(
        &stranger,
        &[
            "call",
            node.invite(),
            "app.agent",
            "tell",
            "--args",
            "\"hi\"",
            "--stream",
        ],
    );
    assert_eq!(text_items(&out), ["alpha:", "hi"]);
}

#[test]
fn call_stream_errors_have_the_usual_exit_codes() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::with_metrics("alpha");
    ctl_ok(&cp, &["bind", node.invite()]);
    let calls = |verb: &str| {
        let scraped = node.scrape();
        let prefix = format!("capwire_calls_total{{cap=\"app.agent\",verb=\"{verb}\",");
        scraped
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };

    // The manifest's kind decides, before anything is sent: --stream is
    // for stream verbs only, and a stream verb needs it.
    let out = ctl(&cp, &["call", "alpha", "app.agent", "echo", "--stream"]);
    let line = assert_fails(&out, 2, "app.agent/echo of alpha is a request verb");
    assert!(line.contains("without --stream"), "{line}");
    let out = ctl(&cp, &["call", "alpha", "app.agent", "note", "--stream"]);
    let line = assert_fails(&out, 2, "is a notification verb");
    assert!(line.contains("--notify"), "{line}");
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "tell", "--args", "\"x\""],
    );
    let line = assert_fails(&out, 2, "app.agent/tell of alpha is a stream verb");
    assert!(line.contains("call it with --stream"), "{line}");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"x\"",
            "--notify",
        ],
    );
    assert_fails(&out, 2, "call it with --stream");
    assert_eq!(calls("echo"), 0, "nothing was sent");
    assert_eq!(calls("note"), 0, "nothing was sent");
    assert_eq!(calls("tell"), 0, "nothing was sent");
    // --notify and --stream do not go together.
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "tell", "--stream", "--notify"],
    );
    assert_eq!(out.code, 2, "{out:#?}");
    assert!(out.stderr.contains("cannot be used with"), "{out:#?}");

    // A verb the node does not have: its chokepoint's unknown_verb.
    let out = ctl(&cp, &["call", "alpha", "app.agent", "nope", "--stream"]);
    let line = assert_fails(&out, 3, "unknown_verb");
    assert!(line.contains("alpha app.agent/nope"), "{line}");
    let out = ctl(
        &cp,
        &["--json", "call", "alpha", "app.agent", "nope", "--stream"],
    );
    assert_eq!(out.code, 3, "{out:#?}");
    let end = out.record();
    assert_eq!(end["kind"], "error");
    assert_eq!(end["items"], 0);
    assert_eq!(end["error"], "unknown_verb");
    assert_eq!(end["exit"], 3);
    assert!(
        out.stderr.contains("unknown_verb") && out.stderr.lines().count() == 1,
        "{out:#?}"
    );

    // Args the handler refuses: bad_args, exit 4.
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "[1]",
            "--stream",
        ],
    );
    assert_fails(&out, 4, "bad_args");
    let out = ctl(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "[1]",
            "--stream",
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    let end = out.record();
    assert_eq!(
        (&end["kind"], &end["error"], &end["items"]),
        (&json!("error"), &json!("bad_args"), &json!(0)),
        "{end}"
    );
    // Args that are not JSON, or not CBOR: bad input, before the node.
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "{",
            "--stream",
        ],
    );
    assert_fails(&out, 2, "--args is not JSON");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            r#"{"$int":"x"}"#,
            "--stream",
        ],
    );
    assert_fails(&out, 2, "bad args");
    assert_eq!(calls("tell"), 2, "only the two [1] reached the node");

    // A node that is not running: exit 6.
    node.stop(Duration::from_secs(5));
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"x\"",
            "--stream",
        ],
    );
    assert_fails(&out, 6, "cannot reach alpha");
}

#[test]
fn ctrl_c_cancels_a_stream_and_its_handler_stops() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::with_metrics("alpha");
    ctl_ok(&cp, &["bind", node.invite()]);

    // A stream far longer than the pipe to this test holds; the test
    // reads one line and then nothing.
    let words = 50_000;
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).args([
        "call",
        "alpha",
        "app.agent",
        "tell",
        "--args",
        &many_words(words),
        "--stream",
    ]);
    let mut stream = cli_support::Held::start(cmd, "ctl call --stream");
    assert_eq!(
        stream.record(),
        json!({"kind": "item", "seq": 1, "item": "alpha:"})
    );

    // The handler runs ahead only by what the buffers and the window
    // hold: it waits for credit, and the stream stays open.
    poll(
        Duration::from_secs(10),
        "the handler to wait for credit",
        || (node.metric("capwire_stream_credit_stalls_total") > 0).then_some(()),
    );
    assert_eq!(node.metric("capwire_streams{side=\"served\"}"), 1);
    let sent = node.metric("capwire_stream_items_total{direction=\"sent\"}");
    assert!(
        sent < words as u64,
        "the handler sent {sent} of {words} items to a reader that took one"
    );

    // Ctrl-C: the stream is cancelled, what was printed is counted.
    stream.signal("INT");
    let stderr = stream.stderr();
    let (status, lines) = stream.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{stderr:#?}");
    let mut records: Vec<Json> = vec![json!({"kind": "item", "seq": 1, "item": "alpha:"})];
    records.extend(
        lines
            .iter()
            .map(|l| serde_json::from_str::<Json>(l).unwrap()),
    );
    let items = json_items(&records, "cancelled");
    assert!(items.len() < words, "{} items printed", items.len());

    // The node's handler stopped: no stream is served, and it ended as
    // cancelled.
    poll(Duration::from_secs(10), "the served stream to end", || {
        (node.metric("capwire_streams{side=\"served\"}") == 0).then_some(())
    });
    poll(Duration::from_secs(10), "the cancelled outcome", || {
        let series = "capwire_calls_total{cap=\"app.agent\",verb=\"tell\",outcome=\"cancelled\"}";
        (node.metric(series) == 1).then_some(())
    });
    assert_eq!(
        node.metric("capwire_calls_total{cap=\"app.agent\",verb=\"tell\",outcome=\"ok\"}"),
        0
    );
}

#[test]
fn streams_handed_to_the_owner_flow_as_they_arrive_and_cancel_there() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::with_metrics("alpha");
    ctl_ok(&cp, &["bind", node.invite()]);
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).arg("watch");
    let mut watch = Spawned::start(cmd, "ctl watch");
    watch.wait_record(Duration::from_secs(10), "connected to alpha", |r| {
        r["kind"] == "connected" && r["peer"] == "alpha"
    });

    // Handed over: the same output, text and JSON.
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"via the owner\"",
            "--stream",
        ],
    );
    assert_eq!(text_items(&out), ["alpha:", "via", "the", "owner"]);
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            &many_words(600),
            "--stream",
        ],
    );
    assert_eq!(json_items(&out.records(), "end").len(), 601);
    let out = ctl(&cp, &["call", "alpha", "app.agent", "echo", "--stream"]);
    assert_fails(&out, 2, "is a request verb");
    let out = ctl(
        &cp,
        &["--json", "call", "alpha", "app.agent", "nope", "--stream"],
    );
    assert_eq!(out.code, 3, "{out:#?}");
    assert_eq!(out.record()["error"], "unknown_verb");
    // The watch saw them, with their items.
    let seen = watch.wait_record(Duration::from_secs(10), "the stream's call record", |r| {
        r["kind"] == "call" && r["stream"] == true && r["items"] == 601
    });
    assert_eq!((&seen["verb"], &seen["ok"]), (&json!("tell"), &json!(true)));

    // A long one, read one line at a time: its first item is printed
    // while the node still serves it (the records flow as they arrive),
    // and then it waits for this reader.
    let sessions = node.metric("capwire_sessions_opened_total{direction=\"inbound\"}");
    let words = 30_000;
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).args([
        "call",
        "alpha",
        "app.agent",
        "tell",
        "--args",
        &many_words(words),
        "--stream",
    ]);
    let mut stream = cli_support::Held::start(cmd, "a forwarded ctl call --stream");
    assert_eq!(
        stream.record(),
        json!({"kind": "item", "seq": 1, "item": "alpha:"})
    );
    assert_eq!(node.metric("capwire_streams{side=\"served\"}"), 1);
    poll(
        Duration::from_secs(10),
        "the handler to wait for credit",
        || (node.metric("capwire_stream_credit_stalls_total") > 0).then_some(()),
    );

    // Ctrl-C on the client: the owner cancels the stream on its session
    // with the node, which stays up.
    stream.signal("INT");
    let (status, lines) = stream.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let last: Json = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(last["kind"], "cancelled", "{last}");
    assert_eq!(
        last["items"],
        lines.len(),
        "the first line and the rest but the last"
    );
    poll(Duration::from_secs(10), "the served stream to end", || {
        (node.metric("capwire_streams{side=\"served\"}") == 0).then_some(())
    });
    assert_eq!(
        node.metric("capwire_calls_total{cap=\"app.agent\",verb=\"tell\",outcome=\"cancelled\"}"),
        1
    );
    assert_eq!(node.metric("capwire_sessions{direction=\"inbound\"}"), 1);
    assert_eq!(
        node.metric("capwire_sessions_opened_total{direction=\"inbound\"}"),
        sessions,
        "the owner's session with the node is the one it had"
    );
    let cancelled = watch.wait_record(Duration::from_secs(10), "the cancelled stream", |r| {
        r["kind"] == "call" && r["stream"] == true && r["error"] == "cancelled"
    });
    assert_eq!(cancelled["ok"], false);

    // The owner still serves.
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "tell",
            "--args",
            "\"after\"",
            "--stream",
        ],
    );
    assert_eq!(text_items(&out), ["alpha:", "after"]);
    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(5)).success());
}

// ---------------------------------------------------------------------
// Tasks: `ctl call --wait` and `ctl tasks ...` against `app.agent/work`.

/// The `event` records among `records`, checked for their shape and
/// numbered without gaps from their first one.
fn task_events(records: &[Json], task: &str) -> Vec<Json> {
    let events: Vec<Json> = records
        .iter()
        .filter(|r| r["kind"] == "event")
        .cloned()
        .collect();
    for pair in events.windows(2) {
        assert_eq!(
            pair[1]["seq"].as_u64().unwrap(),
            pair[0]["seq"].as_u64().unwrap() + 1,
            "events follow each other: {records:#?}"
        );
    }
    for e in &events {
        assert_eq!(e["task"], task, "{e}");
        assert_eq!(e["peer"], "alpha", "{e}");
        assert_eq!(e["via"], "alpha", "{e}");
        assert!(e["at_ms"].as_u64().unwrap() > 0, "{e}");
    }
    events
}

/// (state, event kind) of each event.
fn shapes(events: &[Json]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["state"].as_str().unwrap().to_owned(),
                e["event"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(state: &str, event: &str) -> (String, String) {
    (state.to_owned(), event.to_owned())
}

/// The `submitted` record a task verb's call starts with; the task's id.
fn submitted(records: &[Json]) -> String {
    let first = &records[0];
    assert_eq!(first["kind"], "submitted", "{records:#?}");
    assert_eq!(first["peer"], "alpha");
    assert_eq!(first["cap"], "app.agent");
    assert_eq!(first["verb"], "work");
    let task = first["task"].as_str().unwrap().to_owned();
    assert_eq!(task.len(), 32, "{first}");
    assert!(
        task.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{first}"
    );
    task
}

/// A task's info, as `tasks get --json` prints it.
fn task_info(cp: &std::path::Path, task: &str) -> Json {
    let record = ctl_ok(cp, &["--json", "tasks", "alpha", "get", task]).record();
    assert_eq!(record["kind"], "task", "{record}");
    assert_eq!(record["value"]["task"], task, "{record}");
    record["value"].clone()
}

/// The one line on stderr of a run that printed records on stdout.
fn stderr_line(out: &cli_support::Out) -> String {
    cli_support::assert_no_panic(out);
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {out:#?}");
    assert!(lines[0].starts_with("capwire: "), "{lines:?}");
    lines[0].to_owned()
}

#[test]
fn call_wait_follows_a_task_to_its_end() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);

    // The manifest says work is a task verb.
    let manifest = ctl_ok(&cp, &["--json", "manifest", "alpha"]).record();
    assert_eq!(kind_of(capability(&manifest, "app.agent"), "work"), "task");

    // Without --wait: the id at once, and the task runs on at the node.
    let args = r#"{"text": "build", "steps": 3, "step_ms": 10}"#;
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            args,
        ],
    );
    let records = out.records();
    assert_eq!(records.len(), 1, "{out:#?}");
    let first = submitted(&records);
    assert_eq!(records[0]["state"], "submitted");
    let done = poll(Duration::from_secs(10), "the task to complete", || {
        let info = task_info(&cp, &first);
        (info["state"] == "completed").then_some(info)
    });
    assert_eq!(done["result"], "alpha: build: done in 3 steps");
    assert_eq!(done["progress"], json!({"step": 3, "of": 3}));

    // --wait: every event, in order, until the result; exit code 0.
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            args,
            "--wait",
        ],
    );
    let records = out.records();
    let task = submitted(&records);
    assert_ne!(task, first, "a new call is a new task");
    let events = task_events(&records[1..], &task);
    assert_eq!(events.len(), records.len() - 1, "only events follow");
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(
        shapes(&events),
        [
            pair("submitted", "state"),
            pair("working", "state"),
            pair("working", "progress"),
            pair("working", "progress"),
            pair("working", "progress"),
            pair("completed", "result"),
        ]
    );
    for (i, e) in events[2..5].iter().enumerate() {
        assert_eq!(e["body"], json!({"step": i + 1, "of": 3}));
    }
    assert_eq!(events[5]["body"], "alpha: build: done in 3 steps");

    // The same as text: the id first, an event a line, the result last.
    let out = ctl_ok(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            args,
            "--wait",
        ],
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 7, "{out:#?}");
    assert!(lines[0].starts_with("task "), "{lines:?}");
    assert!(
        lines[0].ends_with(" on alpha (app.agent/work): submitted"),
        "{lines:?}"
    );
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(words(lines[1])[0], "#1");
    assert_eq!(words(lines[1])[2..], ["submitted", "state"]);
    assert_eq!(
        words(lines[3])[2..],
        ["working", "progress", r#"{"of":3,"step":1}"#]
    );
    assert_eq!(
        words(lines[6])[2..],
        [
            "completed",
            "result",
            "alpha:",
            "build:",
            "done",
            "in",
            "3",
            "steps"
        ]
    );

    // Args outside the verb's own bounds: refused before a task exists,
    // exit code 4.
    let out = ctl(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            r#"{"text": "x", "steps": 0}"#,
            "--wait",
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        !out.records().iter().any(|r| r["kind"] == "submitted"),
        "{out:#?}"
    );
    let line = stderr_line(&out);
    assert!(line.contains("bad_args: steps: 1 to 1000"), "{line}");

    // A question answered with --answer: the answer is an event, the task
    // goes on to its result.
    let ask = r#"{"text": "ship", "steps": 2, "step_ms": 10, "ask": true}"#;
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            ask,
            "--wait",
            "--answer",
            "true",
        ],
    );
    let records = out.records();
    let answered = submitted(&records);
    let events = task_events(&records[1..], &answered);
    assert_eq!(
        shapes(&events),
        [
            pair("submitted", "state"),
            pair("working", "state"),
            pair("input_required", "question"),
            pair("working", "answer"),
            pair("working", "progress"),
            pair("working", "progress"),
            pair("completed", "result"),
        ]
    );
    assert_eq!(events[2]["body"], "alpha: go on with \"ship\" (2 steps)?");
    assert_eq!(events[3]["body"], true);
    assert_eq!(events[6]["body"], "alpha: ship: done in 2 steps");

    // Answered no: the handler declines, exit code 4.
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            ask,
            "--wait",
            "--answer",
            "false",
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(stderr_line(&out).contains("failed: declined: told not to go on"));
    // The answer line came just before the error's.
    let last_two: Vec<&str> = out.stdout.lines().rev().take(2).collect();
    assert!(
        last_two[0].contains("failed") && last_two[0].contains("error"),
        "{out:#?}"
    );
    assert!(
        last_two[1].contains("answer") && last_two[1].contains("false"),
        "{out:#?}"
    );

    // A question without --answer: exit code 8 and how to answer; the
    // task waits at the node.
    let out = ctl(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            ask,
            "--wait",
        ],
    );
    assert_eq!(out.code, 8, "{out:#?}");
    let records = out.records();
    let waiting = submitted(&records);
    let events = task_events(&records[1..], &waiting);
    assert_eq!(
        shapes(std::slice::from_ref(events.last().unwrap())),
        [pair("input_required", "question")]
    );
    let line = stderr_line(&out);
    for needle in [
        format!("task {waiting} waits for an answer"),
        format!("capwire ctl tasks alpha respond {waiting} JSON"),
        format!("capwire ctl tasks alpha watch {waiting} --from 4"),
    ] {
        assert!(line.contains(&needle), "{needle:?} in {line}");
    }
    let info = task_info(&cp, &waiting);
    assert_eq!(info["state"], "input_required");
    assert_eq!(info["question_seq"], 3);
    // Answered as the message says, then followed from there.
    let answered = ctl_ok(
        &cp,
        &["--json", "tasks", "alpha", "respond", &waiting, "true"],
    )
    .record();
    // Working again, or done already: its handler goes on at once.
    let state = &answered["value"]["state"];
    assert!(state == "working" || state == "completed", "{answered}");
    let out = ctl_ok(
        &cp,
        &["--json", "tasks", "alpha", "watch", &waiting, "--from", "4"],
    );
    let events = task_events(&out.records(), &waiting);
    assert_eq!(events[0]["seq"], 4);
    assert_eq!(events[0]["event"], "answer");
    assert_eq!(events.last().unwrap()["state"], "completed");

    // --req-id: the same id is the same task, another id another one.
    let submit = |id: &str| {
        let out = ctl_ok(
            &cp,
            &[
                "--json",
                "call",
                "alpha",
                "app.agent",
                "work",
                "--args",
                args,
                "--req-id",
                id,
            ],
        );
        submitted(&out.records())
    };
    let once = submit("build-42");
    assert_eq!(submit("build-42"), once);
    assert_ne!(submit("build-43"), once);
    // A request with the same id is answered what the first one was.
    let echo = |text: &str| {
        let args = serde_json::to_string(text).unwrap();
        let out = ctl_ok(
            &cp,
            &[
                "call",
                "alpha",
                "app.agent",
                "echo",
                "--args",
                &args,
                "--req-id",
                "echo-1",
            ],
        );
        out.stdout
    };
    assert_eq!(echo("first"), "alpha: first\n");
    assert_eq!(echo("second"), "alpha: first\n");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            args,
            "--req-id",
            "a b",
        ],
    );
    assert_fails(&out, 2, "--req-id");

    // A running watch sees the node's pushes of each change of state,
    // and serves the call handed to it.
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).arg("watch");
    let mut watch = Spawned::start(cmd, "ctl watch");
    watch.wait_record(Duration::from_secs(10), "the connected record", |r| {
        r["kind"] == "connected"
    });
    let out = ctl_ok(
        &cp,
        &[
            "--json",
            "call",
            "alpha",
            "app.agent",
            "work",
            "--args",
            args,
            "--wait",
        ],
    );
    let pushed = submitted(&out.records());
    let last = watch.wait_record(Duration::from_secs(10), "the completed push", |r| {
        r["kind"] == "task_changed" && r["task"] == pushed.as_str() && r["state"] == "completed"
    });
    assert_eq!(last["from"], "alpha", "{last}");
    assert_eq!(last["submitter"], "this control plane", "{last}");
    assert_eq!(last["cap"], "app.agent", "{last}");
    assert_eq!(last["seq"], 6, "{last}");
    let states: Vec<Json> = watch
        .records()
        .into_iter()
        .filter(|r| r["kind"] == "task_changed" && r["task"] == pushed.as_str())
        .map(|r| r["state"].clone())
        .collect();
    // Every event but progress is pushed.
    assert_eq!(states, ["submitted", "working", "completed"], "{states:?}");
    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(10)).success());

    // --wait is for task verbs; --answer needs --wait; a task verb is no
    // notification. Nothing is sent.
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            "\"x\"",
            "--wait",
        ],
    );
    let line = assert_fails(
        &out,
        2,
        "app.agent/echo of alpha is a request verb, not a task",
    );
    assert!(line.contains("--wait is for task verbs"), "{line}");
    let out = ctl(
        &cp,
        &["call", "alpha", "app.agent", "work", "--answer", "true"],
    );
    assert_eq!(out.code, 2, "{out:#?}");
    cli_support::assert_no_panic(&out);
    assert!(
        out.stderr.contains("required arguments were not provided"),
        "{out:#?}"
    );
    assert!(out.stderr.contains("--wait"), "{out:#?}");
    assert!(out.stdout.is_empty(), "{out:#?}");
    let out = ctl(&cp, &["call", "alpha", "app.agent", "work", "--notify"]);
    assert_fails(&out, 2, "is a task verb: call it without --notify");
    let out = ctl(
        &cp,
        &[
            "call",
            "alpha",
            "app.agent",
            "work",
            "--wait",
            "--answer",
            "{nope",
        ],
    );
    assert_fails(&out, 2, "--answer is not JSON");
}

#[test]
fn tasks_list_get_watch_cancel_respond_and_what_a_stranger_sees() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite()]);
    let submit = |args: &str| {
        let out = ctl_ok(
            &cp,
            &[
                "--json",
                "call",
                "alpha",
                "app.agent",
                "work",
                "--args",
                args,
            ],
        );
        submitted(&out.records())
    };

    // Three tasks: one done, one waiting on its question, one long.
    let done = submit(r#"{"text": "done", "steps": 1, "step_ms": 0}"#);
    poll(
        Duration::from_secs(10),
        "the first task to complete",
        || (task_info(&cp, &done)["state"] == "completed").then_some(()),
    );
    let asking = submit(r#"{"text": "asking", "steps": 1, "step_ms": 0, "ask": true}"#);
    poll(Duration::from_secs(10), "the question", || {
        (task_info(&cp, &asking)["state"] == "input_required").then_some(())
    });
    let long = submit(r#"{"text": "long", "steps": 1000, "step_ms": 100}"#);

    // list: newest first, filtered, in pages.
    let ids = |args: &[&str]| {
        let mut all = vec!["--json", "tasks", "alpha", "list"];
        all.extend_from_slice(args);
        let record = ctl_ok(&cp, &all).record();
        assert_eq!(record["kind"], "tasks", "{record}");
        let ids: Vec<String> = record["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["task"].as_str().unwrap().to_owned())
            .collect();
        (ids, record["next"].clone())
    };
    assert_eq!(
        ids(&[]),
        (vec![long.clone(), asking.clone(), done.clone()], Json::Null)
    );
    assert_eq!(ids(&["--task-state", "completed"]).0, [done.as_str()]);
    assert_eq!(
        ids(&["--task-state", "input_required"]).0,
        [asking.as_str()]
    );
    assert_eq!(ids(&["--verb", "app.agent/work"]).0.len(), 3);
    assert_eq!(ids(&["--verb", "app.agent"]).0.len(), 3);
    assert!(ids(&["--verb", "app.agent/echo"]).0.is_empty());
    let (page, next) = ids(&["--limit", "2"]);
    assert_eq!(page, [long.clone(), asking.clone()]);
    assert_eq!(next, json!(asking));
    assert_eq!(
        ids(&["--limit", "2", "--before", &asking]),
        (vec![done.clone()], Json::Null)
    );
    // As text: a header, then a line per task.
    let text = ctl_ok(&cp, &["tasks", "alpha", "list"]).stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("TASK "), "{text}");
    let row = |l: &str| {
        l.split_whitespace()
            .take(3)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row(lines[2]),
        [asking.as_str(), "input_required", "app.agent/work"]
    );
    assert_eq!(
        row(lines[3]),
        [done.as_str(), "completed", "app.agent/work"]
    );
    let out = ctl(&cp, &["tasks", "alpha", "list", "--verb", "app.agent/"]);
    assert_fails(&out, 2, "give CAP/VERB");
    let out = ctl(&cp, &["tasks", "alpha", "list", "--task-state", "finished"]);
    assert_eq!(out.code, 2, "{out:#?}");
    assert!(out.stderr.contains("is not a task state"), "{out:#?}");

    // get: the question and how to answer it.
    let info = task_info(&cp, &asking);
    assert_eq!(info["cap"], "app.agent");
    assert_eq!(info["verb"], "work");
    assert_eq!(info["question"], "alpha: go on with \"asking\" (1 steps)?");
    assert_eq!(info["question_seq"], 3);
    assert_eq!(info["seq"], 3);
    assert_eq!(info["first_seq"], 1);
    assert_eq!(info["result"], Json::Null);
    let text = ctl_ok(&cp, &["tasks", "alpha", "get", &asking]).stdout;
    assert!(
        text.starts_with(&format!(
            "task {asking} on alpha (app.agent/work): input_required\n"
        )),
        "{text}"
    );
    assert!(text.contains("question (event #3)"), "{text}");
    assert!(
        text.contains(&format!("capwire ctl tasks alpha respond {asking} JSON")),
        "{text}"
    );

    // watch, interrupted: it says where to pick up...
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"])
        .arg(&cp)
        .args(["tasks", "alpha", "watch", &long]);
    let mut watch = cli_support::Held::start(cmd, "ctl tasks watch");
    let mut seen: Vec<Json> = (0..4).map(|_| watch.record()).collect();
    watch.signal("INT");
    let (status, rest) = watch.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{rest:#?}");
    seen.extend(
        rest.iter()
            .map(|l| serde_json::from_str::<Json>(l).unwrap()),
    );
    let detached = seen.pop().unwrap();
    let before = task_events(&seen, &long);
    assert_eq!(before.len(), seen.len(), "{seen:#?}");
    assert_eq!(before[0]["seq"], 1);
    let from = before.last().unwrap()["seq"].as_u64().unwrap() + 1;
    assert_eq!(
        detached,
        json!({"kind": "detached", "peer": "alpha", "via": "alpha", "task": long, "from": from})
    );
    // ... and the task went on meanwhile.
    poll(Duration::from_secs(10), "more progress", || {
        (task_info(&cp, &long)["seq"].as_u64().unwrap() > from + 2).then_some(())
    });

    // cancel: the task ends canceled; resumed from where the watch
    // stopped, the events go on without one seen twice, to the end.
    let canceled = ctl_ok(&cp, &["--json", "tasks", "alpha", "cancel", &long]).record();
    assert_eq!(canceled["value"]["state"], "canceled", "{canceled}");
    assert_eq!(
        canceled["value"]["error"]["code"], "cancelled",
        "{canceled}"
    );
    let out = ctl(
        &cp,
        &[
            "--json",
            "tasks",
            "alpha",
            "watch",
            &long,
            "--from",
            &from.to_string(),
        ],
    );
    assert_eq!(out.code, 7, "{out:#?}");
    assert!(stderr_line(&out).contains(&format!("task {long} was canceled")));
    let after = task_events(&out.records(), &long);
    assert_eq!(after.len(), out.records().len());
    assert_eq!(after[0]["seq"], from, "no event twice, none missed");
    let last = after.last().unwrap();
    assert_eq!(
        shapes(std::slice::from_ref(last)),
        [pair("canceled", "error")]
    );
    assert_eq!(last["seq"], canceled["value"]["seq"]);
    // From past the end: nothing more to print, the end is said.
    let past = (last["seq"].as_u64().unwrap() + 1).to_string();
    let out = ctl(
        &cp,
        &["--json", "tasks", "alpha", "watch", &long, "--from", &past],
    );
    assert_eq!(out.code, 7, "{out:#?}");
    assert_eq!(out.record()["kind"], "ended");
    assert_eq!(out.record()["state"], "canceled");
    // Cancelling a task that has ended leaves it as it is.
    let again = ctl_ok(&cp, &["--json", "tasks", "alpha", "cancel", &done]).record();
    assert_eq!(again["value"]["state"], "completed", "{again}");
    let text = ctl_ok(&cp, &["tasks", "alpha", "cancel", &done]).stdout;
    assert!(
        text.contains("result alpha: done: done in 1 steps"),
        "{text}"
    );

    // A watch of the task that waits says so and follows on; meanwhile it
    // serves the other commands on this state directory, the answer too.
    let mut cmd = capwire();
    cmd.args(["ctl", "--json", "--state"])
        .arg(&cp)
        .args(["tasks", "alpha", "watch", &asking]);
    let mut waiter = cli_support::Held::start(cmd, "ctl tasks watch (a question)");
    let mut first: Vec<Json> = (0..4).map(|_| waiter.record()).collect();
    assert_eq!(
        first.pop().unwrap(),
        json!({
            "kind": "waiting", "peer": "alpha", "via": "alpha", "task": asking,
            "question_seq": 3,
            "question": "alpha: go on with \"asking\" (1 steps)?",
        })
    );
    assert_eq!(task_events(&first, &asking).len(), 3);

    // respond: the question's seq must match when given; a task that
    // waits on nothing is a conflict; the answer goes on to the result.
    let out = ctl(
        &cp,
        &[
            "tasks",
            "alpha",
            "respond",
            &asking,
            "true",
            "--question-seq",
            "2",
        ],
    );
    assert_fails(&out, 4, "conflict");
    let out = ctl(&cp, &["tasks", "alpha", "respond", &done, "true"]);
    assert_fails(&out, 4, "conflict");
    let out = ctl(&cp, &["tasks", "alpha", "respond", &asking, "{bad"]);
    assert_fails(&out, 2, "the answer is not JSON");
    let answered = ctl_ok(
        &cp,
        &[
            "--json",
            "tasks",
            "alpha",
            "respond",
            &asking,
            "true",
            "--question-seq",
            "3",
        ],
    )
    .record();
    // Working again, or done already: its handler goes on at once.
    let state = &answered["value"]["state"];
    assert!(state == "working" || state == "completed", "{answered}");
    assert_eq!(answered["value"]["question"], Json::Null, "{answered}");
    let stderr = waiter.stderr();
    let (status, rest) = waiter.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{stderr:#?}");
    let rest: Vec<Json> = rest
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events = task_events(&rest, &asking);
    assert_eq!(events.len(), rest.len(), "{rest:#?}");
    assert_eq!(events[0]["seq"], 4, "{rest:#?}");
    assert_eq!(events.last().unwrap()["state"], "completed");
    let out = ctl_ok(&cp, &["--json", "tasks", "alpha", "watch", &asking]);
    let events = task_events(&out.records(), &asking);
    assert_eq!(
        shapes(&events),
        [
            pair("submitted", "state"),
            pair("working", "state"),
            pair("input_required", "question"),
            pair("working", "answer"),
            pair("working", "progress"),
            pair("completed", "result"),
        ]
    );
    assert_eq!(events[3]["body"], true);
    // A watch from the start shows the old question, not as waiting.
    assert!(!out.records().iter().any(|r| r["kind"] == "waiting"));

    // Ids are checked before anything is sent.
    for op in ["get", "watch", "cancel"] {
        let out = ctl(&cp, &["tasks", "alpha", op, "not-a-task"]);
        assert_fails(&out, 2, "is not a task id");
    }
    let out = ctl(&cp, &["tasks", "list"]);
    assert_fails(&out, 2, "say which node");

    // Another control plane, not the node's: it sees none of these tasks,
    // exactly as if they did not exist...
    let stranger = tmp.path().join("stranger");
    let invite = node.invite();
    for op in ["get", "watch", "cancel"] {
        let out = ctl(&stranger, &["tasks", invite, op, &done]);
        assert_fails(&out, 4, "not_found: no such task");
    }
    let out = ctl(&stranger, &["tasks", invite, "respond", &asking, "true"]);
    assert_fails(&out, 4, "not_found: no such task");
    let out = ctl(
        &stranger,
        &["tasks", invite, "get", "0123456789abcdef0123456789abcdef"],
    );
    assert_fails(&out, 4, "not_found: no such task");
    let record = ctl_ok(&stranger, &["--json", "tasks", invite, "list"]).record();
    assert_eq!(record["tasks"], json!([]), "{record}");
    // ... and sees its own, which the node's control plane sees too.
    let out = ctl_ok(
        &stranger,
        &[
            "--json",
            "call",
            invite,
            "app.agent",
            "work",
            "--args",
            r#"{"text": "mine", "steps": 1, "step_ms": 0}"#,
            "--wait",
        ],
    );
    let records = out.records();
    let theirs = records[0]["task"].as_str().unwrap().to_owned();
    let record = ctl_ok(&stranger, &["--json", "tasks", invite, "list"]).record();
    assert_eq!(record["tasks"].as_array().unwrap().len(), 1, "{record}");
    assert_eq!(record["tasks"][0]["task"], theirs.as_str());
    assert_eq!(ids(&[]).0, [theirs, long, asking, done]);
    // A node it names by its invite is named so in what it is told to
    // type next.
    let out = ctl(
        &stranger,
        &[
            "call",
            invite,
            "app.agent",
            "work",
            "--args",
            r#"{"text": "ask me", "ask": true}"#,
            "--wait",
        ],
    );
    assert_eq!(out.code, 8, "{out:#?}");
    let line = stderr_line(&out);
    assert!(
        line.contains(&format!("capwire ctl tasks '{invite}' respond ")),
        "{line}"
    );
}

/// `ctl identity`'s node id and grant key.
fn identity(dir: &std::path::Path) -> (String, String) {
    let r = ctl_ok(dir, &["--json", "identity"]).record();
    assert_eq!(r["kind"], "identity");
    (
        r["node_id"].as_str().unwrap().to_owned(),
        r["grant_key"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn grant_attenuate_revoke_and_call_with_a_token() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let worker = tmp.path().join("worker");
    let helper = tmp.path().join("helper");
    let node = NodeProc::start("alpha", &[]);
    ctl_ok(&cp, &["bind", node.invite(), "--name", "front"]);
    let (worker_id, worker_key) = identity(&worker);
    let (helper_id, helper_key) = identity(&helper);
    assert!(
        worker_key.starts_with("ed25519/") && worker_key.len() == 72,
        "{worker_key}"
    );

    // The control plane grants the worker get_config for ten minutes; the
    // text output is the token alone.
    let token = ctl_ok(
        &cp,
        &[
            "grant",
            "front",
            "--to",
            &worker_id,
            "--to-key",
            &worker_key,
            "--verb",
            "core.configuration/get_config",
            "--for",
            "10m",
        ],
    )
    .stdout
    .trim()
    .to_owned();
    assert!(!token.is_empty() && !token.contains(' '), "{token}");

    // Without the token the worker is refused; with it, the call runs.
    let out = ctl(&worker, &["config", "--peer", node.invite(), "get"]);
    assert_fails(&out, 3, "unauthorized");
    let got = ctl_ok(
        &worker,
        &[
            "--json",
            "call",
            node.invite(),
            "core.configuration",
            "get_config",
            "--token",
            &token,
        ],
    )
    .record();
    assert_eq!(got["value"]["version"], 0);
    // A verb it does not grant.
    let out = ctl(
        &worker,
        &[
            "call",
            node.invite(),
            "core.configuration",
            "set_config",
            "--args",
            r#"{"value": 1, "if_version": null}"#,
            "--token",
            &token,
        ],
    );
    let line = assert_fails(&out, 3, "unauthorized");
    assert!(line.contains("does not grant"), "{line}");

    // The worker hands a one-minute copy to the helper.
    let copy = ctl_ok(
        &worker,
        &[
            "attenuate",
            &token,
            "--to",
            &helper_id,
            "--to-key",
            &helper_key,
            "--for",
            "1m",
        ],
    )
    .stdout
    .trim()
    .to_owned();
    assert_ne!(copy, token);
    ctl_ok(
        &helper,
        &[
            "call",
            node.invite(),
            "core.configuration",
            "get_config",
            "--token",
            &copy,
        ],
    );
    // The worker's own token in the helper's hands is refused.
    let out = ctl(
        &helper,
        &[
            "call",
            node.invite(),
            "core.configuration",
            "get_config",
            "--token",
            &token,
        ],
    );
    let line = assert_fails(&out, 3, "unauthorized");
    assert!(line.contains("holder"), "{line}");

    // Revoked by the control plane: the copy goes with it.
    let done = ctl_ok(&cp, &["revoke", "front", &token]).stdout;
    assert!(done.contains("revoked"), "{done}");
    let out = ctl(
        &helper,
        &[
            "call",
            node.invite(),
            "core.configuration",
            "get_config",
            "--token",
            &copy,
        ],
    );
    let line = assert_fails(&out, 3, "unauthorized");
    assert!(line.contains("revoked"), "{line}");

    // Bad input is refused before anything is sent.
    let out = ctl(
        &cp,
        &[
            "grant",
            "front",
            "--to",
            &worker_id,
            "--to-key",
            &worker_key,
            "--verb",
            "nope",
        ],
    );
    assert_fails(&out, 2, "CAP/VERB");
    let out = ctl(
        &cp,
        &[
            "grant",
            "front",
            "--to",
            &worker_id,
            "--to-key",
            "ed25519/zz",
            "--verb",
            "app.x/y",
        ],
    );
    assert_fails(&out, 2, "--to-key");
    let out = ctl(&worker, &["attenuate", "not-a-token", "--for", "1m"]);
    assert_fails(&out, 2, "the token");
    // Only its control plane may grant: the worker is refused.
    let out = ctl(
        &worker,
        &[
            "grant",
            node.invite(),
            "--to",
            &helper_id,
            "--to-key",
            &helper_key,
            "--verb",
            "core.configuration/get_config",
        ],
    );
    assert_fails(&out, 3, "unauthorized");
}
