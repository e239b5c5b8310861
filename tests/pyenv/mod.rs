//! The tests' Python: a virtual environment under the target directory
//! (`target/pyvenv`, which `.ci/run` prepares) with pinned packages,
//! reused while it holds them. Without Python a test that needs it fails,
//! unless `CAPWIRE_SKIP_PYTHON=1` says to skip it.
#![allow(dead_code, unreachable_pub, clippy::panic, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};

/// Exits 0 when every `name==version` line of the requirements is installed.
const PINNED: &str = r##"
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert m.version(name) == version, line
"##;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn venv_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is `<target dir>/tmp`.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("pyvenv")
}

/// Python is missing or will not set up: a failure, or a skip when asked.
/// Returns `None` when the test should be skipped.
pub fn unavailable(what: &str) -> Option<PathBuf> {
    if std::env::var("CAPWIRE_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("skipped: this test needs {what} (CAPWIRE_SKIP_PYTHON=1)");
        return None;
    }
    panic!(
        "this test needs {what}; install python3 with venv and pip \
         (or set CAPWIRE_SKIP_PYTHON=1 to skip this test)"
    );
}

pub fn run(cmd: &mut Command) -> Result<std::process::Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The venv's python, with the pinned requirements installed.
pub fn python() -> Option<PathBuf> {
    python_with(&["tests/python/requirements.txt"])
}

/// The venv's python, with the pinned packages of each requirements file
/// (relative to the repository) installed.
pub fn python_with(files: &[&str]) -> Option<PathBuf> {
    // The tests of this file run at once; one of them makes the venv.
    static SETUP: Mutex<()> = Mutex::new(());
    let _one = SETUP.lock().unwrap_or_else(PoisonError::into_inner);
    let venv = venv_dir();
    let python = venv.join("bin").join("python");
    let files: Vec<PathBuf> = files.iter().map(|f| repo().join(f)).collect();
    let has_them = || {
        files.iter().all(|requirements| {
            Command::new(&python)
                .args(["-c", PINNED])
                .arg(requirements)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    };
    if has_them() {
        return Some(python);
    }
    if let Err(e) = run(Command::new("python3").arg("--version")) {
        return unavailable(&format!("python3 on PATH ({e})"));
    }
    let make_venv = || {
        run(Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv))
    };
    if !python.exists()
        && let Err(e) = make_venv()
    {
        return unavailable(&format!("a virtual environment ({e})"));
    }
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]);
    for requirements in &files {
        pip.arg("-r").arg(requirements);
    }
    let install = run(&mut pip);
    if let Err(e) = install {
        return unavailable(&format!("its packages from the registry ({e})"));
    }
    assert!(
        has_them(),
        "the venv lacks the pinned packages after pip install"
    );
    Some(python)
}

/// Runs pytest in `dir` (relative to the repository) against this
/// build's `capwire` binary (`CAPWIRE_BIN`), killing it past `deadline`;
/// a failing or overlong suite fails the test.
pub fn pytest(python: &Path, dir: &str, deadline: std::time::Duration) {
    let started = std::time::Instant::now();
    let mut pytest = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(repo().join(dir))
        .env("CAPWIRE_BIN", env!("CARGO_BIN_EXE_capwire"))
        .stdin(Stdio::null())
        .spawn()
        .expect("pytest starts");
    let status = loop {
        if let Some(status) = pytest.try_wait().expect("pytest is waited on") {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = pytest.kill();
            let _ = pytest.wait();
            panic!("the pytest suite in {dir} ran longer than {deadline:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "the pytest suite in {dir} failed: {status}"
    );
}
