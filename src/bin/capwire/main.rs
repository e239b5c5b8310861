//! The `capwire` command-line tool.
//!
//! `capwire node` runs a node (see `capwire node --help`).

mod agent;
mod node;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// capwire: capability-aware, authenticated messaging between the nodes
/// of an agent cluster.
#[derive(Debug, Parser)]
#[command(name = "capwire", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a node until interrupted (or, supervised, until its input closes).
    Node(node::NodeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAPWIRE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("capwire: cannot start the runtime: {e}");
            return ExitCode::from(70);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Node(args) => node::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capwire: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

/// A failure of a subcommand: what to print and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) code: u8,
}

impl Failure {
    /// Bad usage or input (exit code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 2,
        }
    }

    /// The node could not start or run (exit code 1).
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }
}
