//! `app.agent`: the small application capability every `capwire node`
//! runs, so that nodes started from the command line (and the children of
//! a process host) have something to call: `echo` (bootstrap) answers
//! with the node's name, `note` (bootstrap notification) is counted and
//! logged, `ask` (controller) makes the node call another node's `echo`,
//! `probe` (controller) makes it call any verb of another node and say
//! what came back (the demo uses it to show a denial between agents), and
//! `tell` (bootstrap stream, protocol 2) streams its answer word by word,
//! and `work` (bootstrap task, protocol 2) is long-running work in steps
//! that reports progress, may ask whether to go on, and picks up where it
//! was when the node starts again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use capwire::envelope::RawValue;
use capwire::manifest::TaskEventKind;
use capwire::manifest::{NoArgs, verb};
use capwire::{Capability, HandlerError, Items, NodeHandle, NodeId, Sender, State, Task};
use serde::{Deserialize, Serialize};

verb! {
    /// `app.agent/echo`: answers `NAME: TEXT`.
    pub(crate) struct Echo: request "app.agent" / "echo", Bootstrap, String => String;
}

/// Args of `app.agent/ask`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AskArgs {
    /// The node to ask: its key, 64 hex digits.
    pub(crate) peer: String,
    /// What to send its `echo`.
    pub(crate) text: String,
}

verb! {
    /// `app.agent/ask` (controller): calls `peer`'s `app.agent/echo` with
    /// `text` and answers what it said.
    pub(crate) struct Ask: request "app.agent" / "ask", Controller, AskArgs => String;
}

verb! {
    /// `app.agent/note`: a fire-and-forget note, counted and logged.
    pub(crate) struct Note: notification "app.agent" / "note", Bootstrap, String;
}

/// Args of `app.agent/probe`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProbeArgs {
    /// The node to call: its key, 64 hex digits.
    pub(crate) peer: String,
    /// The capability to call.
    pub(crate) cap: String,
    /// The verb to call (with empty args).
    pub(crate) verb: String,
    /// A grant to present to `peer` first (`core.grants`), for a
    /// controller verb of a node this one does not control.
    #[serde(default)]
    pub(crate) token: Option<String>,
}

/// Args of `app.agent/hand_on`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HandOnArgs {
    /// A grant this node holds.
    pub(crate) token: String,
    /// The new holder: its key, 64 hex digits (its grant key is read from
    /// its manifest: it must be connected).
    pub(crate) to: String,
    /// Keep only these verbs (`CAP/VERB`); all when absent.
    #[serde(default)]
    pub(crate) verbs: Option<Vec<String>>,
    /// Valid for at most this many milliseconds from now.
    #[serde(default)]
    pub(crate) for_ms: Option<u64>,
}

verb! {
    /// `app.agent/hand_on` (controller): hands a grant this node holds on
    /// to another node, narrowed, signed with this node's grant key, and
    /// answers the new token.
    pub(crate) struct HandOn: request "app.agent" / "hand_on", Controller, HandOnArgs => String;
}

verb! {
    /// `app.agent/probe` (controller): calls `cap`/`verb` of `peer` with
    /// empty args and answers what came back: `ok`, or the error.
    pub(crate) struct Probe: request "app.agent" / "probe", Controller, ProbeArgs => String;
}

verb! {
    /// `app.agent/tell` (stream): the words of `NAME: TEXT`, one item each,
    /// as the caller takes them.
    pub(crate) struct Tell: stream "app.agent" / "tell", Bootstrap, String => String;
}

/// Args of `app.agent/work`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkArgs {
    /// What the work is about (it is in the result).
    pub(crate) text: String,
    /// How many steps (1 to 1000; default 5).
    #[serde(default)]
    pub(crate) steps: Option<u32>,
    /// Milliseconds per step (at most 60000; default 200).
    #[serde(default)]
    pub(crate) step_ms: Option<u64>,
    /// Ask first whether to go on (answer `true` or `false`).
    #[serde(default)]
    pub(crate) ask: bool,
}

/// One step of `app.agent/work` done: its progress.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkStep {
    /// The step just done, from 1.
    pub(crate) step: u32,
    /// Of how many.
    pub(crate) of: u32,
}

verb! {
    /// `app.agent/work` (task): works through `steps` steps, one progress
    /// each, asking first whether to go on when `ask`; answers
    /// `NAME: TEXT: done in N steps`. Resumed after a restart from the last
    /// step it reported.
    pub(crate) struct Work: task "app.agent" / "work", Bootstrap, WorkArgs => String;
}

/// How long `work` waits for the answer to its question.
const ASK_WITHIN: Duration = Duration::from_secs(600);

/// The node's name, for `echo`, and how many notes it got.
#[derive(Debug, Clone)]
pub(crate) struct AgentName(pub(crate) String, pub(crate) Arc<AtomicU64>);

impl AgentName {
    pub(crate) fn new(name: &str) -> Self {
        Self(name.to_owned(), Arc::new(AtomicU64::new(0)))
    }
}

async fn echo(text: String, State(name): State<AgentName>) -> Result<String, HandlerError> {
    Ok(format!("{}: {text}", name.0))
}

async fn tell(
    text: String,
    mut words: Items<String>,
    State(name): State<AgentName>,
) -> Result<(), HandlerError> {
    let answer = format!("{}: {text}", name.0);
    for word in answer.split_whitespace() {
        words.send(word.to_owned()).await?;
    }
    Ok(())
}

/// The bounds of `work`'s args, checked before its task is written.
fn work_fits(args: &WorkArgs) -> Result<(), HandlerError> {
    let bad = |m: &str| HandlerError::new(capwire::envelope::ErrorCode::BadArgs, m);
    if !(1..=1000).contains(&args.steps.unwrap_or(5)) {
        return Err(bad("steps: 1 to 1000"));
    }
    if args.step_ms.unwrap_or(200) > 60_000 {
        return Err(bad("step_ms: at most 60000"));
    }
    Ok(())
}

async fn work(
    args: WorkArgs,
    task: Task,
    State(name): State<AgentName>,
) -> Result<String, HandlerError> {
    let steps = args.steps.unwrap_or(5);
    let step_ms = args.step_ms.unwrap_or(200);
    // A resumed run goes on after the last step it reported, with the
    // answer it was given (if it was).
    let mut done = 0;
    let mut answered = None;
    if task.resumed() {
        for e in task.events(1).await? {
            match e.kind {
                TaskEventKind::Progress => {
                    if let Ok(s) = e.body.decode::<WorkStep>() {
                        done = s.step;
                    }
                }
                TaskEventKind::Answer => answered = e.body.decode::<bool>().ok(),
                _ => {}
            }
        }
    }
    if args.ask && answered.is_none() && done == 0 {
        let question = format!("{}: go on with {:?} ({steps} steps)?", name.0, args.text);
        answered = Some(task.ask::<_, bool>(&question, ASK_WITHIN).await?);
    }
    if answered == Some(false) {
        return Err(
            HandlerError::app("declined", "told not to go on").unwrap_or_else(|_| {
                HandlerError::new(capwire::envelope::ErrorCode::Cancelled, "declined")
            }),
        );
    }
    for step in done + 1..=steps {
        tokio::time::sleep(Duration::from_millis(step_ms)).await;
        task.progress(&WorkStep { step, of: steps }).await?;
    }
    Ok(format!("{}: {}: done in {steps} steps", name.0, args.text))
}

async fn note(
    text: String,
    State(name): State<AgentName>,
    Sender(from): Sender,
) -> Result<(), HandlerError> {
    let n = name.1.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::info!(agent = %name.0, %from, n, "note: {text}");
    Ok(())
}

fn key(peer: &str) -> Result<NodeId, HandlerError> {
    NodeId::try_from(peer)
        .map_err(|e| HandlerError::new(capwire::envelope::ErrorCode::BadArgs, format!("peer: {e}")))
}

async fn probe(args: ProbeArgs, node: NodeHandle) -> Result<String, HandlerError> {
    let peer = node.peer(key(&args.peer)?);
    if let Some(token) = &args.token
        && let Err(e) = peer.present(token).await
    {
        return Ok(e.to_string());
    }
    let empty = RawValue::encode(&NoArgs {})
        .map_err(|e| HandlerError::new(capwire::envelope::ErrorCode::Internal, e.to_string()))?;
    Ok(
        match peer
            .call_raw(&args.cap, &args.verb, &empty, Duration::from_secs(5))
            .await
        {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.to_string(),
        },
    )
}

async fn hand_on(args: HandOnArgs, node: NodeHandle) -> Result<String, HandlerError> {
    let bad = |m: String| HandlerError::new(capwire::envelope::ErrorCode::BadArgs, m);
    let to = key(&args.to)?;
    let to_key = node
        .peer(to)
        .grant_key()
        .ok_or_else(|| bad("the new holder is not connected, or advertises no grant key".into()))?;
    let verbs = args
        .verbs
        .map(|v| {
            v.iter()
                .map(|cv| {
                    cv.split_once('/')
                        .map(|(c, v)| (c.to_owned(), v.to_owned()))
                        .ok_or_else(|| bad(format!("{cv:?} is not CAP/VERB")))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let narrowing = capwire::grants::Narrowing {
        verbs,
        expires: args
            .for_ms
            .map(|ms| std::time::SystemTime::now() + Duration::from_millis(ms)),
    };
    node.hand_on(&args.token, to, to_key, &narrowing)
        .map_err(|e| bad(e.to_string()))
}

async fn ask(args: AskArgs, node: NodeHandle) -> Result<String, HandlerError> {
    node.peer(key(&args.peer)?)
        .request(Echo, args.text)
        .await
        .map_err(|e| HandlerError::new(capwire::envelope::ErrorCode::Unavailable, e.to_string()))
}

/// The capability (the node also needs [`AgentName`] as state).
pub(crate) fn capability() -> Capability {
    match Capability::new("app.agent", "1.0.0") {
        Ok(cap) => cap
            .handle(Echo, echo)
            .handle(Note, note)
            .handle(Ask, ask)
            .handle(Probe, probe)
            .handle(HandOn, hand_on)
            .stream(Tell, tell)
            .resumable_task_checked(Work, work_fits, work),
        // "1.0.0" is a valid version.
        Err(_) => unreachable!("app.agent's version is valid"),
    }
}
