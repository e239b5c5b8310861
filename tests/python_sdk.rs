//! The Python SDK (`python/`): its wheel is built (maturin, release) and
//! installed into the tests' virtual environment (`tests/pyenv`), its
//! package and the example agent are type-checked (mypy, strict), and its
//! pytest suite (`python/tests`) runs against real nodes over real
//! sessions: Python nodes, the in-process Rust nodes of its bench module,
//! and this build's `capwire` binary (`capwire node`, `capwire ctl`,
//! `capwire mcp`), one trace across them collected by an OTLP receiver.
//! Without Python the test fails, unless `CAPWIRE_SKIP_PYTHON=1` says to
//! skip it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pyenv;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pyenv::{repo, run};

/// How long the suite may take, whatever it waits on.
const SUITE_DEADLINE: Duration = Duration::from_secs(600);

/// PATH with the venv's `bin` first (maturin is there).
fn venv_path(python: &Path) -> String {
    let bin = python.parent().expect("the venv's bin");
    match std::env::var("PATH") {
        Ok(path) => format!("{}:{path}", bin.display()),
        Err(_) => bin.display().to_string(),
    }
}

/// Builds the wheel and installs it, replacing any earlier build.
fn install_wheel(python: &Path) {
    let target: PathBuf = pyenv::venv_dir()
        .parent()
        .expect("the target directory")
        .join("python-wheel");
    let started = Instant::now();
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(repo().join("python"))
        .env("PATH", venv_path(python))
        .env("CARGO_TARGET_DIR", &target))
    .unwrap_or_else(|e| panic!("the wheel did not build or install: {e}"));
    eprintln!("wheel built and installed in {:?}", started.elapsed());
}

#[test]
fn the_python_sdk_builds_type_checks_and_passes_its_suite() {
    // The MCP client and OpenTelemetry's SDK, exporter and protobuf types:
    // python/tests/test_trace_chain.py.
    let Some(python) = pyenv::python_with(&[
        "tests/python/requirements.txt",
        "python/requirements-dev.txt",
        "tests/mcp/requirements.txt",
        "python/requirements-trace.txt",
    ]) else {
        return;
    };
    install_wheel(&python);

    let config = repo().join("python/pyproject.toml");
    run(Command::new(&python)
        .args(["-m", "mypy", "--strict", "--config-file"])
        .arg(&config)
        .arg(repo().join("python/python/capwire"))
        .arg(repo().join("examples/python"))
        .current_dir(repo()))
    .unwrap_or_else(|e| panic!("mypy found errors: {e}"));

    pyenv::pytest(&python, "python", SUITE_DEADLINE);
}
