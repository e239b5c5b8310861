//! The `capwire` command-line tool: make keys, run nodes, control them,
//! and see it all at work in `capwire demo`.

mod acp;
mod agent;
mod ctl;
mod demo;
mod engine;
mod exit;
mod keygen;
mod mcp;
mod node;
mod otel;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::EXIT_CODES;

/// capwire: capability-aware, authenticated messaging between the nodes
/// of an agent cluster.
///
/// JSON on the command line, CBOR on the wire (see `capwire ctl call
/// --help` for the mapping). Logs go to stderr, in colour only when it is
/// a terminal and NO_COLOR is not set; set RUST_LOG (e.g.
/// RUST_LOG=capwire=debug) to see more.
#[derive(Debug, Parser)]
#[command(name = "capwire", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Makes a new node identity (an X25519 key).
    Keygen(keygen::KeygenArgs),
    /// Runs a node until Ctrl-C or SIGTERM (or, supervised, until its
    /// input closes).
    Node(Box<node::NodeArgs>),
    /// The control plane: bind nodes, call their verbs, run their
    /// clusters, watch them.
    Ctl(ctl::CtlArgs),
    /// Runs a whole cluster on loopback and shows every feature end to end.
    Demo(demo::DemoArgs),
    /// An MCP server (stdio, or streamable HTTP with --http) whose tools
    /// are the app.* verbs of the nodes a control plane bound; bootstrap
    /// verbs only unless --allow-controller.
    Mcp(mcp::McpArgs),
    /// An Agent Client Protocol agent on stdio (for editors): one task
    /// verb of one node, a prompt turn a task.
    Acp(acp::AcpArgs),
    /// The children's container image: `capwire image build` makes it on
    /// the local Docker engine, without a registry.
    Image(engine::ImageArgs),
}

/// Whether the logs on stderr are coloured: only for a terminal, never for
/// a pipe or a file (an MCP host's log, a supervisor's, a log file get
/// plain text), and not when `NO_COLOR` is set to anything but the empty
/// text (<https://no-color.org>).
fn log_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    // A `ctl` command reports what went wrong in its one line on stderr;
    // the node it runs inside says nothing more unless RUST_LOG asks (a
    // session to a node on a lossy link may take longer than the close
    // bound to end, which is no failure of the command).
    let default_level = match cli.command {
        Command::Node(_) => "info",
        Command::Ctl(_) => "error",
        _ => "warn",
    };
    // Spans of calls (target capwire::otel) go to the OpenTelemetry export
    // when one is configured, never to the log.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
        .add_directive(otel::QUIET.parse().unwrap_or_default());
    let service = match cli.command {
        Command::Node(_) => "capwire-node",
        Command::Ctl(_) => "capwire-ctl",
        Command::Mcp(_) => "capwire-mcp",
        Command::Acp(_) => "capwire-acp",
        Command::Demo(_) => "capwire-demo",
        _ => "capwire",
    };
    let export = otel::Otel::from_env(service);
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let log = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(log_colour())
            .with_filter(filter);
        let registry = tracing_subscriber::registry().with(log);
        match &export {
            Some(e) => registry.with(e.layer()).init(),
            None => registry.init(),
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("capwire: cannot start the runtime: {e}");
            return ExitCode::from(exit::LOCAL);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Keygen(args) => keygen::run(&args),
            Command::Node(args) => node::run(*args).await,
            Command::Ctl(args) => ctl::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Mcp(args) => mcp::run(args).await,
            Command::Acp(args) => acp::run(args).await,
            Command::Image(args) => engine::image(args).await,
        }
    });
    // Tasks still running (a watch, a forwarding server) are not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    if let Some(e) = export {
        e.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capwire: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
