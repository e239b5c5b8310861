//! `capwire demo` is the README's main command: it must run every step and
//! exit 0, and a wrong argument must be a usage error, not a panic.

use std::process::Command;

#[test]
fn the_demo_runs_every_step_and_exits_zero() {
    let out = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["demo", "--agents", "3"])
        .output()
        .expect("capwire demo starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for step in 1..=15 {
        let line = format!("[{step:>2}/15]");
        let found = stdout
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("no step {step}:\n{stdout}"));
        assert!(
            found.contains("... ok ("),
            "step {step} did not pass: {found}"
        );
    }
    for expected in [
        "a wrong code is refused: bind_failed",
        "unknown_verb",
        "unauthorized",
        "refused, conflict",
        "agent-1 asked agent-2: \"agent-2: hi from agent-1\"",
        "app.agent/note ok = 1",
        "agent-1's app.agent/tell streams its answer",
        "item  1 \"agent-1:\"",
        "11 items, then the end: \"agent-1: streams come word by word as the caller takes them\"",
        "agent-1's app.agent/work: progress, a question, an answer, a result",
        "input_required question \"agent-1: go on with \\\"index the docs\\\" (3 steps)?\"",
        "(answered true with core.tasks/respond)",
        "working        answer   true",
        "working        progress step 3 of 3",
        "completed      result   \"agent-1: index the docs: done in 3 steps\"",
        "result: \"agent-1: index the docs: done in 3 steps\"",
        "agent-2 presents it and calls agent-1's controller verb: ok",
        "agent-2 hands a copy to agent-3, valid 2 s, signed with its own key; agent-3 calls: ok",
        "agent-3 presenting agent-2's own token is refused",
        "monitoring copies name the token that let the call through",
        "after the expiry both are refused: the token has expired",
        "all 15 steps passed",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?}:\n{stdout}");
    }
    // The summary shows the node's own decisions, denials included.
    let decisions = stdout
        .split("the node's decisions")
        .nth(1)
        .expect("a summary table");
    assert!(decisions.contains("unknown_verb"), "{decisions}");
    assert!(decisions.contains("core.cluster/create"), "{decisions}");
}

#[test]
fn a_bad_agent_count_is_a_usage_error() {
    for bad in ["0", "1", "17", "many"] {
        let out = Command::new(env!("CARGO_BIN_EXE_capwire"))
            .args(["demo", "--agents", bad])
            .output()
            .expect("capwire demo starts");
        assert_eq!(out.status.code(), Some(2), "--agents {bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `capwire demo --host docker`: the same story with every agent a Docker
/// container (host networking, loopback), and nothing left behind. Without
/// a Docker engine it skips with one line, unless `CAPWIRE_REQUIRE_DOCKER=1`.
#[test]
fn the_demo_runs_with_its_agents_in_containers() {
    let docker = |args: &[&str]| {
        Command::new("docker")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    if docker(&["info", "--format", "{{.ServerVersion}}"]).is_none() {
        assert!(
            std::env::var("CAPWIRE_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "CAPWIRE_REQUIRE_DOCKER=1 and no Docker engine answers"
        );
        eprintln!("skipped: no Docker engine answers (CAPWIRE_REQUIRE_DOCKER=1 requires one)");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_capwire"))
        .args(["demo", "--agents", "2", "--host", "docker"])
        .output()
        .expect("capwire demo starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Whatever happened, the demo's containers and volumes are gone.
    let left = docker(&["ps", "-aq", "--filter", "name=capwire-"]).unwrap_or_default();
    if !left.is_empty() {
        let ids: Vec<&str> = left.lines().collect();
        let mut rm = vec!["rm", "-f", "-v"];
        rm.extend(ids);
        docker(&rm);
    }
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all 15 steps passed"), "{stdout}");
    assert!(left.is_empty(), "containers left behind: {left}");
}
