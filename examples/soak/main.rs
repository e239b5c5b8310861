//! A soak on demand: many `capwire node` processes under one control
//! plane on loopback, calls between them for a bounded time, random
//! restarts (SIGKILL, then the same state directory and address) at a
//! fixed, seeded cadence, and a report: calls made and answered, errors by
//! type, latency, memory per node and its growth. Exits 1 when the run
//! breaks one of its checks (see `soak.rs`), 2 on bad arguments or a
//! failed setup.
//!
//! ```sh
//! cargo run --release --example soak -- --nodes 50 --secs 60 --restarts-every 5s --seed 7
//! ```
//!
//! The nodes are the `capwire` binary of the same profile, built first
//! (`cargo build --bin capwire`) unless `--bin` or `CAPWIRE_BIN` names
//! one. `tests/soak.rs` runs the same code, smaller, in CI.

mod soak;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// A soak of capwire nodes.
#[derive(Debug, Parser)]
struct Args {
    /// `capwire node` processes.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// Kill and restart a random node this often (e.g. 5s, 500ms).
    #[arg(long, value_parser = parse_duration)]
    restarts_every: Option<Duration>,
    /// Seeds every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Calls per second offered, in all.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Calls at once, at most.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Contacts per node (the nodes its asks go to).
    #[arg(long, default_value_t = 6)]
    contacts: usize,
    /// Deadline of each call (e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    deadline: Duration,
    /// Largest allowed ratio of a node's RSS at the end to its RSS after
    /// the warm-up.
    #[arg(long, default_value_t = 1.5)]
    growth_limit: f64,
    /// The `capwire` binary (default: built next to this example).
    #[arg(long, env = "CAPWIRE_BIN")]
    bin: Option<PathBuf>,
}

/// `500ms`, `5s`, `2m`; a bare number is seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: f64 = n
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("unknown unit {unit:?} (ms, s, m)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"))
}

/// The `capwire` binary of this example's profile, built now (cargo does
/// not build a package's binaries for its examples).
fn capwire_bin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    // target/PROFILE/examples/soak -> target/PROFILE
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .ok_or_else(|| format!("unexpected place: {}", exe.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "--quiet", "--bin", "capwire"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        build.current_dir(dir);
    }
    let status = build
        .status()
        .map_err(|e| format!("cannot run cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build --bin capwire failed: {status}"));
    }
    let bin = profile_dir.join("capwire");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("no {} after the build", bin.display()))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let bin = match args.bin.clone().map(Ok).unwrap_or_else(capwire_bin) {
        Ok(bin) => bin,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let config = soak::Config {
        nodes: args.nodes,
        duration: Duration::from_secs(args.secs),
        restarts_every: args.restarts_every,
        seed: args.seed,
        rate: args.rate,
        workers: args.workers,
        contacts: args.contacts,
        deadline: args.deadline,
        growth_limit: args.growth_limit,
        bin,
    };
    match soak::run(&config).await {
        Ok(report) => {
            print!("{report}");
            if report.violations().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}
