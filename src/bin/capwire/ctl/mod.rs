//! `capwire ctl`: the control-plane side. It has its own state directory
//! (its identity, and `peers.json`: the nodes it bound, by name), binds
//! nodes with their invites and then calls them.
//!
//! Only one process at a time can own a state directory (its store is
//! locked), yet a `ctl watch`, a `ctl top` or a command that follows a task
//! (`call --wait`, `tasks watch`) runs for long while other commands are
//! typed in another terminal. So such an owner also listens
//! on `ctl.sock` in the (owner-only) state directory, and a `ctl` that
//! finds the directory in use hands its command to the owner over that
//! socket and prints what comes back: the same records, the same exit
//! code, and the same session with each node (a second session with the
//! same key would replace the owner's). A directory held by a one-shot
//! command is waited for: it is free again in a moment.

mod audit;
mod book;
pub(crate) mod card;
mod exec;
mod forward;
mod grants;
mod render;
mod task_args;
mod tasks;
mod top;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use capwire::manifest::TaskState;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::exit::{EXIT_CODES, Failure};
pub(crate) use exec::Ctx;

/// How a node is named, then the exit codes, below `capwire ctl --help`.
fn after_help() -> String {
    format!(
        "A node (PEER) is a name from `ctl peers`, a key or an invite, given as --peer PEER\n\
         anywhere after the command's name; call, manifest, status, disable, forget and\n\
         tasks also take it as their first argument (`ctl call PEER CAP VERB`).\n\n{EXIT_CODES}"
    )
}

/// Arguments of `capwire ctl`.
#[derive(Debug, clap::Args)]
#[command(after_help = after_help())]
pub(crate) struct CtlArgs {
    /// The control plane's state directory: its identity and the nodes it
    /// bound. Default: $CAPWIRE_CTL_STATE, else ~/.capwire/ctl.
    #[arg(
        long = "state",
        value_name = "DIR",
        env = "CAPWIRE_CTL_STATE",
        global = true
    )]
    state_dir: Option<PathBuf>,
    /// Print one JSON object a line instead of text for people.
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for a node to answer (e.g. 500ms, 1.5s, 2m, "1h 30m";
    /// a bare number is seconds).
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration, global = true, allow_hyphen_values = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: CtlCommand,
}

/// What `capwire ctl` does.
///
/// A node is named the same way in every command: `--peer PEER` (a name
/// in the book, a key or an invite), anywhere after the command's name.
/// The commands that cannot go without a node also take it as their first
/// argument (`ctl call PEER CAP VERB`, `ctl status PEER`); `cluster` and
/// `config` go to the one bound node that is nobody's child when none is
/// named.
#[derive(Debug, Clone, clap::Subcommand, Serialize, Deserialize)]
pub(crate) enum CtlCommand {
    /// Binds a node: connects with its invite (`capwire://ID@ADDR#CODE`,
    /// the `invite` line `capwire node` prints while the node is unbound),
    /// proves the code, and remembers the node under a name.
    Bind {
        /// The node's invite.
        invite: String,
        /// The name to call it by (default: the name in its manifest).
        #[arg(long)]
        name: Option<String>,
    },
    /// Lists the nodes this control plane knows.
    Peers,
    /// Forgets a node (it stays bound until `disable`).
    Forget {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Calls a verb of a node with JSON args (sent as CBOR; see
    /// `capwire ctl call --help` for the mapping) and prints the result,
    /// or with --stream each item of a stream verb as it arrives, or for a
    /// task verb the task's id (and with --wait its events until it ends).
    #[command(
        after_help = call_help(),
        override_usage = "capwire ctl call [OPTIONS] <PEER> <CAP> <VERB>\n       capwire ctl call [OPTIONS] --peer <PEER> <CAP> <VERB>"
    )]
    Call {
        /// PEER CAP VERB, or CAP VERB after --peer PEER: the node (a name,
        /// a key or an invite), the capability, e.g. app.agent, and the
        /// verb, e.g. echo.
        #[arg(value_names = ["PEER", "CAP", "VERB"], num_args = 2..=3, required = true)]
        target: Vec<String>,
        /// The node: a name, a key or an invite.
        #[arg(long, value_name = "PEER")]
        peer: Option<String>,
        /// The args as JSON (default: {}, what verbs without arguments take).
        #[arg(long, value_name = "JSON")]
        args: Option<String>,
        /// Send it as a fire-and-forget notification (no answer).
        #[arg(long, conflicts_with = "stream")]
        notify: bool,
        /// Open a stream (a verb of kind `stream`) and print each item as
        /// it arrives: a line of JSON each, or with --json the records
        /// {"kind":"item","seq":N,"item":...} and a last one,
        /// {"kind":"end","items":N}. --timeout bounds the wait for the
        /// stream to open and for each next item, not the whole stream.
        /// Ctrl-C cancels the stream at the node (the last record is then
        /// {"kind":"cancelled","items":N}; exit code 0).
        #[arg(long)]
        #[serde(default)]
        stream: bool,
        /// For a task verb (kind `task`): follow the task after its id is
        /// printed, an event a line, until it ends. Exit code 0 when it
        /// completed, 4 when it failed, 7 when it was canceled; a question
        /// stops the wait with exit code 8 and how to answer it, unless
        /// --answer answers it.
        #[arg(long, conflicts_with_all = ["notify", "stream"])]
        #[serde(default)]
        wait: bool,
        /// With --wait: the answer (JSON) to the task's first question.
        #[arg(long, value_name = "JSON", requires = "wait")]
        #[serde(default)]
        answer: Option<String>,
        /// The request's id (printable ASCII, at most 64 bytes, e.g.
        /// build-42): the same id again gets the first answer, and for a
        /// task verb the same task, so a submit whose answer was lost can
        /// be sent again. Default: a fresh id each time.
        #[arg(long, value_name = "ID", conflicts_with_all = ["notify", "stream"])]
        #[serde(default)]
        req_id: Option<String>,
        /// A grant (from `ctl grant` or `ctl attenuate`) to present to the
        /// node first: this control plane is then the token's holder and
        /// calls the verbs it grants although it is not the node's
        /// controller.
        #[arg(long, value_name = "TOKEN")]
        #[serde(default)]
        token: Option<String>,
        /// Start a new trace (W3C trace context) for this call, print its
        /// id first (a line `trace ID`, or with --json the record
        /// {"kind":"trace","trace_id":ID,"traceparent":...}) and send its
        /// context with the call (to a node that speaks protocol 3). With
        /// an OTLP exporter configured (OTEL_EXPORTER_OTLP_ENDPOINT), the
        /// command's own span is the trace's root.
        #[arg(long)]
        #[serde(default)]
        trace: bool,
        /// With `trace`: the caller's W3C context (`traceparent`,
        /// `tracestate`) the trace continues (the MCP face's
        /// `_meta.traceparent`); a malformed one starts a new trace.
        #[arg(skip)]
        #[serde(default)]
        parent: Option<(String, Option<String>)>,
    },
    /// Grants a node (--to) a narrow, expiring right to some controller
    /// verbs of a node this control plane binds, and prints the token
    /// (`core.grants`). The holder presents it (`ctl call --token`, or
    /// `Peer::present`); nobody else can use it. `core.monitoring/disable`
    /// and `core.grants` are never granted.
    Grant {
        #[command(flatten)]
        node: NodeArg,
        /// The holder: a name, a key or an invite. Its grant key is read
        /// from its manifest unless --to-key gives it.
        #[arg(long, value_name = "HOLDER")]
        to: String,
        /// The holder's grant key (`ed25519/` and 64 hex digits, as `ctl
        /// identity` or its manifest's `core.grants` params show it).
        #[arg(long, value_name = "KEY")]
        to_key: Option<String>,
        /// A verb granted, CAP/VERB, or CAP/* for every controller verb of
        /// CAP; repeat for more.
        #[arg(long = "verb", value_name = "CAP/VERB", required = true)]
        verbs: Vec<String>,
        /// How long it is valid (e.g. 10m, 1h; at most 30 days).
        #[arg(long = "for", value_name = "DUR", default_value = "10m", value_parser = parse_duration)]
        valid_for: Duration,
    },
    /// Narrows a token: fewer verbs (--verb), a sooner expiry (--for), and
    /// with --to hands it on to another holder, signed by this control
    /// plane's own grant key (only the token's holder can do that).
    /// Prints the new token; narrowing can only take rights away.
    Attenuate {
        /// The token.
        token: String,
        /// Keep only these verbs (CAP/VERB); repeat for more.
        #[arg(long = "verb", value_name = "CAP/VERB")]
        verbs: Vec<String>,
        /// Valid for at most this long from now.
        #[arg(long = "for", value_name = "DUR", value_parser = parse_duration)]
        valid_for: Option<Duration>,
        /// Hand it on to this holder (a name, a key or an invite).
        #[arg(long, value_name = "HOLDER")]
        to: Option<String>,
        /// The new holder's grant key (else read from its manifest).
        #[arg(long, value_name = "KEY", requires = "to")]
        to_key: Option<String>,
    },
    /// Revokes a token, and every copy made from it, at a node this
    /// control plane binds: by the token itself or by one of its
    /// revocation ids. Durable.
    Revoke {
        /// The node: a name, a key or an invite.
        #[arg(value_name = "PEER")]
        node: String,
        /// The token, or a revocation id (128 hex digits).
        #[arg(value_name = "TOKEN_OR_ID")]
        what: String,
    },
    /// Checks a node's audit log (`core.audit`, protocol 3): fetches its
    /// signed checkpoint, verifies the signature with the key in its
    /// manifest, and checks it against the checkpoint kept from the last
    /// check (a consistency proof; a smaller log, or another root at the
    /// same size, is a rewritten one: exit code 9). With --entries, reads
    /// every kept entry and checks it against the checkpoint.
    Audit {
        /// The node: a name, a key or an invite.
        #[arg(value_name = "PEER")]
        node: String,
        /// Read and check every entry still kept.
        #[arg(long)]
        #[serde(default)]
        entries: bool,
        /// Write what was checked (notes, entries, proofs) as JSON to FILE,
        /// for another verifier (WIRE.md 5.6).
        #[arg(long, value_name = "FILE")]
        #[serde(default)]
        dump: Option<std::path::PathBuf>,
    },
    /// Prints this control plane's node id and grant key (what another
    /// control plane names with `ctl grant --to ID --to-key KEY`).
    Identity,
    /// The tasks of a node (`core.tasks`): those this control plane
    /// submitted, and every task of a node it controls.
    #[command(
        override_usage = "capwire ctl tasks [OPTIONS] <PEER> <COMMAND>\n       capwire ctl tasks [OPTIONS] --peer <PEER> <COMMAND>"
    )]
    Tasks {
        /// The node: a name, a key or an invite (or give it with --peer).
        #[arg(value_name = "PEER")]
        node: Option<String>,
        /// The node: a name, a key or an invite.
        #[arg(long, value_name = "PEER", global = true)]
        peer: Option<String>,
        #[command(subcommand)]
        op: TasksOp,
    },
    /// Shows a node's manifest: its capabilities, verbs and their classes
    /// (with --json, each verb's args and result schemas too).
    Manifest {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Prints a node's A2A Agent Card (A2A 1.0, JSON): its name here (as
    /// `ctl peers` has it), the version of its app.* capability, its
    /// app.* verbs as skills, its capwire address as its interface, each
    /// verb's kind, class and schemas in the card's `urn:capwire:verbs:1`
    /// extension. The card describes the agent; calling it takes capwire
    /// (or `capwire mcp`), not A2A's JSON-RPC.
    Card {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Shows a node's monitoring status and whether this is its controller.
    Status {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Unbinds a node (`core.monitoring/disable`): this control plane
    /// gives up control of it.
    Disable {
        #[command(flatten)]
        node: NodeArg,
    },
    /// A node's cluster of child agents (`core.cluster`).
    Cluster {
        /// The parent node: a name, a key or an invite (default: the one
        /// bound node that is nobody's child).
        #[arg(long, value_name = "PEER", global = true)]
        peer: Option<String>,
        #[command(subcommand)]
        op: ClusterOp,
    },
    /// A node's configuration (`core.configuration`).
    Config {
        /// The node: a name, a key or an invite (default: the one bound
        /// node that is nobody's child).
        #[arg(long, value_name = "PEER", global = true)]
        peer: Option<String>,
        #[command(subcommand)]
        op: ConfigOp,
    },
    /// Prints roster changes and monitoring copies from every bound node,
    /// and the calls this control plane makes (the commands other ctl
    /// processes hand to it included), as they arrive, until interrupted.
    Watch,
    /// A live view of the cluster: members and their monitoring, calls and
    /// denials per verb, the calls made from here, recent monitoring
    /// copies. q or Ctrl-C quits.
    Top {
        /// How many recent copies to show.
        #[arg(long, default_value_t = 12)]
        copies: usize,
    },
}

/// The node of a command that needs one: its first argument, or
/// `--peer`.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub(crate) struct NodeArg {
    /// The node: a name, a key or an invite (or give it with --peer).
    #[arg(
        value_name = "PEER",
        required_unless_present = "peer",
        conflicts_with = "peer"
    )]
    node: Option<String>,
    /// The node: a name, a key or an invite.
    #[arg(long, value_name = "PEER")]
    peer: Option<String>,
}

impl NodeArg {
    /// The node named.
    pub(crate) fn new(peer: impl Into<String>) -> NodeArg {
        NodeArg {
            node: Some(peer.into()),
            peer: None,
        }
    }

    /// The node, however it was given.
    ///
    /// # Errors
    /// A usage failure when it is given twice or not at all (a command
    /// handed over by another process is not checked by clap).
    pub(crate) fn get(&self) -> Result<&str, Failure> {
        match (&self.node, &self.peer) {
            (Some(node), None) | (None, Some(node)) => Ok(node),
            (Some(_), Some(_)) => Err(twice()),
            (None, None) => Err(Failure::usage(
                "say which node: PEER or --peer PEER (a name, a key or an invite)",
            )),
        }
    }
}

fn twice() -> Failure {
    Failure::usage("the node is named twice: give PEER or --peer PEER, not both")
}

/// What `ctl call` calls: the node, the capability and the verb.
pub(crate) fn call_target(
    peer: Option<&str>,
    target: &[String],
) -> Result<(String, String, String), Failure> {
    match (peer, target) {
        (Some(peer), [cap, verb]) => Ok((peer.to_owned(), cap.clone(), verb.clone())),
        (None, [peer, cap, verb]) => Ok((peer.clone(), cap.clone(), verb.clone())),
        (Some(_), [_, _, _]) => Err(twice()),
        (None, [_, _]) => Err(Failure::usage(
            "say which node: `capwire ctl call PEER CAP VERB`, or --peer PEER",
        )),
        _ => Err(Failure::usage("call takes PEER CAP VERB")),
    }
}

/// The node of `ctl tasks`: its first argument, or `--peer`.
pub(crate) fn tasks_target<'a>(
    node: Option<&'a str>,
    peer: Option<&'a str>,
) -> Result<&'a str, Failure> {
    match (node, peer) {
        (Some(node), None) | (None, Some(node)) => Ok(node),
        (Some(_), Some(_)) => Err(twice()),
        (None, None) => Err(Failure::usage(
            "say which node: `capwire ctl tasks PEER list`, or --peer PEER",
        )),
    }
}

impl CtlCommand {
    /// Whether it runs until it ends or is interrupted, printing as it
    /// goes: a watch, a stream, a task followed.
    pub(crate) fn is_long_running(&self) -> bool {
        matches!(
            self,
            CtlCommand::Watch
                | CtlCommand::Call { stream: true, .. }
                | CtlCommand::Call { wait: true, .. }
                | CtlCommand::Tasks {
                    op: TasksOp::Watch { .. },
                    ..
                }
        )
    }

    /// Whether it follows a task until it ends (`call --wait`, `tasks
    /// watch`).
    pub(crate) fn follows_task(&self) -> bool {
        matches!(
            self,
            CtlCommand::Call { wait: true, .. }
                | CtlCommand::Tasks {
                    op: TasksOp::Watch { .. },
                    ..
                }
        )
    }

    /// Refuses a command whose arguments do not fit together, before any
    /// state is opened.
    fn check(&self) -> Result<(), Failure> {
        match self {
            CtlCommand::Call { target, peer, .. } => call_target(peer.as_deref(), target).map(drop),
            CtlCommand::Tasks { node, peer, op } => {
                tasks_target(node.as_deref(), peer.as_deref())?;
                task_args::check(op)
            }
            CtlCommand::Forget { node }
            | CtlCommand::Manifest { node }
            | CtlCommand::Card { node }
            | CtlCommand::Status { node }
            | CtlCommand::Disable { node }
            | CtlCommand::Grant { node, .. } => node.get().map(drop),
            _ => Ok(()),
        }
    }
}

/// `capwire ctl cluster ...`. A child is named by its cid or its name.
#[derive(Debug, Clone, clap::Subcommand, Serialize, Deserialize)]
pub(crate) enum ClusterOp {
    /// Lists the members and the roster version.
    List,
    /// Creates a child agent node.
    Create {
        /// Its name (unique in the cluster).
        name: String,
        /// A short description.
        #[arg(long)]
        bio: Option<String>,
        /// Where and how it runs, for a parent whose children are
        /// containers or Swarm services (`capwire node --host
        /// docker|swarm`).
        #[command(flatten)]
        placement: crate::engine::PlacementArgs,
    },
    /// Stops and forgets a child (an absent child is already removed).
    Remove {
        /// The child.
        child: String,
    },
    /// Sets a child's bio.
    SetBio {
        /// The child.
        child: String,
        /// The new bio.
        bio: String,
    },
    /// Sets a child's persona.
    SetPersona {
        /// The child.
        child: String,
        /// The new persona.
        persona: String,
    },
    /// Turns monitoring of a child on (this control plane binds it and can
    /// then call it by its name) or off.
    SetMonitoring {
        /// The child.
        child: String,
        /// on or off.
        state: OnOff,
    },
    /// Makes two children each other's contacts.
    Introduce {
        /// One child.
        a: String,
        /// The other.
        b: String,
    },
    /// Prints how to reach a child: its invite.
    Contact {
        /// The child.
        child: String,
    },
}

/// on / off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub(crate) enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `capwire ctl config ...`.
#[derive(Debug, Clone, clap::Subcommand, Serialize, Deserialize)]
pub(crate) enum ConfigOp {
    /// Prints the configuration and its version.
    Get,
    /// Replaces the configuration with a JSON value (stored as CBOR).
    Set {
        /// The new value, as JSON.
        value: String,
        /// Only if the configuration is still at this version
        /// (compare-and-set; refused with `conflict` otherwise).
        #[arg(long, value_name = "N")]
        if_version: Option<u64>,
    },
}

/// `capwire ctl tasks PEER ...`. A task is named by its id (32 hex
/// digits, as `call` and `list` print it).
#[derive(Debug, Clone, clap::Subcommand, Serialize, Deserialize)]
pub(crate) enum TasksOp {
    /// Lists the tasks, newest first.
    List {
        /// Only tasks in this state: submitted, working, input_required,
        /// completed, failed, canceled or rejected. (`--state` is the
        /// control plane's state directory.)
        #[arg(long = "task-state", value_name = "STATE", value_parser = task_state)]
        state: Option<TaskState>,
        /// Only tasks of this task verb (CAP/VERB), or of this capability
        /// (CAP).
        #[arg(long, value_name = "CAP/VERB")]
        verb: Option<String>,
        /// At most this many (1 to 200; default 50).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: Option<u32>,
        /// Only tasks submitted before this one: the `next` of the page
        /// before.
        #[arg(long, value_name = "ID")]
        before: Option<String>,
    },
    /// Shows one task: its state, last progress, question, result or
    /// error.
    Get {
        /// The task's id.
        id: String,
    },
    /// Prints the task's events, then each new one as it happens, until
    /// it ends (exit codes as `call --wait`; Ctrl-C stops watching, not
    /// the task).
    Watch {
        /// The task's id.
        id: String,
        /// The first event to print: the seq of the last one seen plus 1
        /// (default 1, all that are kept).
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
    },
    /// Cancels the task (one that has ended is left as it is).
    Cancel {
        /// The task's id.
        id: String,
    },
    /// Answers the question the task waits on.
    Respond {
        /// The task's id.
        id: String,
        /// The answer, as JSON.
        answer: String,
        /// Only if the question it waits on is the one of this event (as
        /// `get` or `watch` shows it).
        #[arg(long, value_name = "SEQ")]
        question_seq: Option<u64>,
    },
}

/// A task state as `--state` takes it.
fn task_state(text: &str) -> Result<TaskState, String> {
    TaskState::ALL
        .into_iter()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| {
            let all: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
            format!("{text:?} is not a task state ({})", all.join(", "))
        })
}

const JSON_MAPPING: &str = "\
JSON to CBOR: null, booleans, strings, arrays and objects map as they are;
a number without fraction or exponent is an integer, one with them a float.
Special forms (one-key objects):
  {\"$bytes\": \"00ff\"}           a byte string (hex)
  {\"$map\": [[1, \"a\"], ...]}     a map with integer, byte or any keys
  {\"$int\": \"-18446744073709551616\"}  an integer beyond 64 bits
  {\"$float\": \"nan\"|\"inf\"|\"-inf\"}  a float JSON cannot write
Results are printed with the same forms.";

/// Below `capwire ctl call --help`, after the JSON mapping.
const STREAMS_HELP: &str = "\
Streams: the node's manifest says each verb's kind (`ctl manifest`). A stream
verb takes --stream, and only a stream verb does: the other way round is
refused before anything is sent (exit code 2). Items come as fast as they are
printed: the node's handler waits while this side holds its window of items
(4096) not yet taken. A stream that ends with an error prints the record
{\"kind\":\"error\",\"items\":N,\"error\":CODE,\"message\":...} under --json,
the error on stderr, and exits with the code the error calls for.";

/// Below `capwire ctl call --help`, after the streams.
const TASKS_HELP: &str = "\
Tasks: a task verb answers at once with the id of a task that then runs at the
node, whatever becomes of this command: the id is printed (`task ID on PEER
(CAP/VERB): submitted`; --json: {\"kind\":\"submitted\",\"task\":ID,...}). With
--wait the task's events follow, a line each (--json: {\"kind\":\"event\",\"seq\":N,
\"state\":...,\"event\":\"progress\",\"body\":...}), until it ends: exit code 0 when
it completed, 4 when it failed, 7 when it was canceled. A question stops the
wait with exit code 8 and the command that answers it (`ctl tasks PEER respond
ID JSON`), unless --answer JSON answers it; Ctrl-C stops following, not the
task, and says where to pick up (`ctl tasks PEER watch ID --from N`).
--timeout bounds each call, not the task. --req-id ID makes a submit safe to
send again: the same id from this control plane is the same task.";

/// What `capwire ctl call --help` ends with.
fn call_help() -> String {
    format!("{JSON_MAPPING}\n\n{STREAMS_HELP}\n\n{TASKS_HELP}")
}

/// A command and its timeout, as one `ctl` hands it to another.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) command: CtlCommand,
    pub(crate) timeout_ms: u64,
}

/// Runs a command here or hands it to the process that owns the state.
#[derive(Clone)]
pub(crate) enum Backend {
    /// This process owns the state directory.
    Local(Arc<Ctx>),
    /// Another process does; its socket.
    Remote(PathBuf),
}

/// A started command's task, aborted when this is dropped (the call
/// that waited on it was cancelled).
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<Result<(), Failure>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Backend {
    /// Starts `command`; its records come on the receiver, its outcome
    /// from the handle.
    pub(crate) fn start(
        &self,
        command: CtlCommand,
        timeout: Duration,
    ) -> (mpsc::Receiver<Json>, JoinHandle<Result<(), Failure>>) {
        let (tx, rx) = mpsc::channel(256);
        let handle = match self {
            Backend::Local(ctx) => {
                let ctx = Arc::clone(ctx);
                tokio::spawn(async move { ctx.exec(command, timeout, &tx).await })
            }
            Backend::Remote(socket) => {
                let request = Request {
                    command,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                };
                let socket = socket.clone();
                tokio::spawn(async move { forward::send(&socket, &request, &tx).await })
            }
        };
        (rx, handle)
    }
}

fn state_dir(args: &CtlArgs) -> Result<PathBuf, Failure> {
    state_dir_of(args.state_dir.as_deref())
}

/// The state directory given, else the default one.
pub(crate) fn state_dir_of(dir: Option<&std::path::Path>) -> Result<PathBuf, Failure> {
    if let Some(dir) = dir {
        return Ok(dir.to_path_buf());
    }
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => Ok(PathBuf::from(home).join(".capwire").join("ctl")),
        _ => Err(Failure::usage(
            "no state directory: give --state DIR or set CAPWIRE_CTL_STATE",
        )),
    }
}

/// How long a `ctl` waits, at least, for a state directory that another
/// one-shot command holds.
const WAIT_FOR_STATE: Duration = Duration::from_secs(3);
/// How often it looks.
const RETRY_STATE: Duration = Duration::from_millis(50);

/// The state directory `dir`, opened here, or the socket of the `ctl`
/// that owns it; with `serve`, this process serves the others while it
/// runs. A directory held by a command that does not serve is waited for
/// (up to `wait`, or [`WAIT_FOR_STATE`]).
pub(crate) async fn open(
    dir: &std::path::Path,
    serve: bool,
    wait: Duration,
) -> Result<(Backend, Option<forward::Server>), Failure> {
    let deadline = tokio::time::Instant::now() + wait.max(WAIT_FOR_STATE);
    loop {
        match Ctx::open(dir).await {
            Ok(ctx) => {
                let ctx = Arc::new(ctx);
                let server = if serve {
                    forward::serve(Arc::clone(&ctx))
                } else {
                    None
                };
                return Ok((Backend::Local(ctx), server));
            }
            Err(exec::OpenError::InUse) => {
                let socket = forward::socket_path(dir);
                if tokio::net::UnixStream::connect(&socket).await.is_ok() {
                    return Ok((Backend::Remote(socket), None));
                }
            }
            Err(exec::OpenError::Failed(f)) => return Err(f),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Failure::failed(format!(
                "the control plane's state directory {} is in use by another process (a ctl \
                 command that is still running?)",
                dir.display()
            )));
        }
        tokio::time::sleep(RETRY_STATE).await;
    }
}

/// `capwire ctl ...`.
pub(crate) async fn run(args: CtlArgs) -> Result<(), Failure> {
    args.command.check()?;
    let dir = state_dir(&args)?;
    // Following a task is long too, and is answered from another
    // terminal meanwhile (`tasks respond`).
    let serve = matches!(args.command, CtlCommand::Watch | CtlCommand::Top { .. })
        || args.command.follows_task();
    let (backend, server) = open(&dir, serve, args.timeout).await?;
    let result = match args.command {
        CtlCommand::Top { copies } => top::run(&backend, args.timeout, copies).await,
        command => print_records(&backend, command, args.timeout, args.json).await,
    };
    if let Backend::Local(ctx) = backend {
        if let Some(server) = server {
            server.close(args.timeout).await;
        }
        ctx.close().await;
    }
    result
}

/// How long the output has, after an interrupt, to take the rest.
const LAST_LINE: Duration = Duration::from_secs(5);

/// Runs `command` and prints its records as they come. A long-running
/// one (a watch, a stream) also ends at Ctrl-C or SIGTERM: the command is
/// stopped (a stream is cancelled at the node) and, for a stream, the
/// record `cancelled` says how many items were printed.
async fn print_records(
    backend: &Backend,
    command: CtlCommand,
    timeout: Duration,
    json: bool,
) -> Result<(), Failure> {
    let long_running = command.is_long_running();
    let streaming = matches!(command, CtlCommand::Call { stream: true, .. });
    let (mut records, done) = backend.start(command, timeout);
    let mut printer = render::Printer::new(json);
    let printing = async {
        while let Some(record) = records.recv().await {
            printer.print(&record).await?;
            // Out as soon as nothing else is ready: one write for a burst.
            if records.is_empty() {
                printer.flush().await?;
            }
        }
        printer.flush().await
    };
    // `None`: interrupted.
    let printed = if long_running {
        tokio::select! {
            printed = printing => Some(printed),
            () = crate::node::wait_for_signal() => None,
        }
    } else {
        Some(printing.await)
    };
    let stop = |done: JoinHandle<Result<(), Failure>>| async move {
        // Dropping the command's future cancels what it was doing (a
        // stream, at the node) before this process goes on to close.
        done.abort();
        let _ = done.await;
    };
    match printed {
        // The records end when the command does (a watch handed to
        // another ctl ends when that one stops).
        Some(Ok(())) => done
            .await
            .unwrap_or_else(|e| Err(Failure::failed(format!("the command failed: {e}")))),
        Some(Err(e)) => {
            stop(done).await;
            Err(Failure::failed(format!("cannot write the output: {e}")))
        }
        None => {
            stop(done).await;
            let record = if streaming {
                Some(serde_json::json!({"kind": "cancelled", "items": printer.items()}))
            } else {
                // A task followed goes on at the node: where to pick up.
                printer.detached()
            };
            let last = async {
                if let Some(record) = record {
                    printer.print(&record).await?;
                }
                printer.flush().await
            };
            // An output that takes nothing more (a reader that ignores
            // Ctrl-C) does not keep this process.
            match tokio::time::timeout(LAST_LINE, last).await {
                Ok(printed) => {
                    printed.map_err(|e| Failure::failed(format!("cannot write the output: {e}")))
                }
                Err(_) => Err(Failure::failed(format!(
                    "the output took nothing for {} s after the interrupt",
                    LAST_LINE.as_secs()
                ))),
            }
        }
    }
}

/// Parses a duration as humantime does (`500ms`, `10s`, `1.5s`, `2m`,
/// `1h 30m`, ...), and a bare number as seconds; not 0.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bare = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let parsed = if bare {
        humantime::parse_duration(&format!("{text}s"))
    } else {
        humantime::parse_duration(text)
    };
    let duration = parsed.map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } if !unit.is_empty() => {
            format!("unknown unit {unit:?} in {text:?} (e.g. 500ms, 10s, 2m, 1h)")
        }
        humantime::DurationError::NumberOverflow => format!("{text:?} is out of range"),
        _ => format!("{text:?} is not a duration (e.g. 500ms, 10s, 2m)"),
    })?;
    if duration.is_zero() {
        return Err("a timeout of 0 lets nothing finish; give more (e.g. 500ms)".into());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration(" 7 "), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        for bad in [
            "", "s", "5x", "-1s", "1.2.3s", "nan", "inf", "1e400", "0", "0ms", "0.0", ".",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} is refused");
        }
        assert!(parse_duration("5x").is_err_and(|e| e.contains("unknown unit")));
        assert!(parse_duration("0").is_err_and(|e| e.contains("timeout of 0")));
    }
}
