//! A history checker for simulation tests: std only, no crates.
//!
//! Simulated clients record what they asked and what they were answered;
//! the functions here say whether those records could come from a correct
//! system. Each check returns `Ok(())` or a [`Violation`]: which property
//! broke, why, and the few records that show it, printed one a line (give
//! it the run's seed with [`Violation::with_seed`] so the report says how
//! to replay it).
//!
//! Properties:
//!
//! - [`linearizable`]: the operations on one object (a [`Model`], such as
//!   the versioned configuration value [`Register`]) can be put in one
//!   order that respects real time and explains every answer;
//! - [`exactly_once_requests`] and [`answers_backed_by_executions`]: a
//!   request retried under one req_id runs once, is answered one value,
//!   and a req_id reused on another verb is refused, never answered;
//! - [`exactly_once_submits`]: retries of a task submit get one task, and
//!   no other submit gets that task;
//! - [`subscriber_stream`]: what a subscriber received across its resumes
//!   is the task's event log, in order, nothing lost, nothing doubled;
//! - [`no_effect_after_revocation`]: no controller call invoked after its
//!   authority was revoked or unbound (and not granted again) is
//!   acknowledged.
//!
//! Time is a `u64` tick of the test's clock ([`Tick`]). An operation whose
//! answer was never seen (a timeout, a cut link) has no completion: it may
//! or may not have taken effect, and if it did, at any time after it was
//! invoked.
//!
//! Included by test crates with
//! `#[path = "support/checker.rs"] mod checker;`; its own tests are in
//! `tests/checker_self.rs`.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Debug, Display};
use std::hash::Hash;

/// A point in time of the test's clock, in ticks.
pub(crate) type Tick = u64;

/// Who invoked an operation: a simulated client.
pub(crate) type ClientId = u64;

// ---------------------------------------------------------------------------
// Violations
// ---------------------------------------------------------------------------

/// The property a check is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Property {
    /// The operations on one object have one order that explains them.
    Linearizability,
    /// A request retried under one req_id runs once and is answered once.
    ExactlyOnceRequests,
    /// Retries of a task submit get one task, no other submit gets it.
    ExactlyOnceSubmits,
    /// A subscriber gets the task's events in order, none lost or doubled.
    SubscriberStream,
    /// No controller call is acknowledged once its authority is gone.
    NoEffectAfterRevocation,
    /// No call a grant let through is acknowledged once the node's date
    /// is past the grant's expiry.
    NoEffectAfterExpiry,
    /// A read of a task's state names an event of its log, in the state
    /// the log gives it, and reads in real-time order never go back.
    TaskReads,
}

impl Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Property::Linearizability => "linearizability",
            Property::ExactlyOnceRequests => "exactly-once requests",
            Property::ExactlyOnceSubmits => "exactly-once task submits",
            Property::SubscriberStream => "subscriber stream",
            Property::NoEffectAfterRevocation => "no effect after revocation",
            Property::NoEffectAfterExpiry => "no effect after expiry",
            Property::TaskReads => "task reads",
        })
    }
}

/// Whether a check found the property broken or could not tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The property is broken: the records shown prove it.
    Violated,
    /// The check ran out of its step budget before it could tell (only
    /// [`linearizable`] has a budget).
    Undecided,
}

/// A broken property (or an undecided check) with the records that show it.
///
/// `Display` prints the property, the seed when one was given, the reason
/// and the records, one a line. `Debug` prints the same, so that
/// `result.unwrap()` in a test shows a readable report.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The property checked.
    pub(crate) property: Property,
    /// Broken, or undecided.
    pub(crate) verdict: Verdict,
    /// What is wrong, in a sentence.
    pub(crate) reason: String,
    /// The records that show it (a minimal sub-history), one a line.
    pub(crate) ops: Vec<String>,
    /// For [`linearizable`]: where the operations shown stand in the
    /// history (their indexes). Empty for the other checks, whose lines
    /// carry their own positions (`attempt #3`).
    pub(crate) positions: Vec<usize>,
    /// A closing remark, such as how many operations were left out.
    pub(crate) note: Option<String>,
    /// The run's seed, when the test gave it.
    pub(crate) seed: Option<u64>,
}

impl Violation {
    pub(crate) fn new(property: Property, reason: impl Into<String>, ops: Vec<String>) -> Self {
        Violation {
            property,
            verdict: Verdict::Violated,
            reason: reason.into(),
            ops,
            positions: Vec::new(),
            note: None,
            seed: None,
        }
    }

    /// The same report, naming the seed of the run that produced it.
    #[must_use]
    pub(crate) fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether the check could not tell (rather than found a violation).
    pub(crate) fn is_undecided(&self) -> bool {
        self.verdict == Verdict::Undecided
    }
}

impl Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.verdict {
            Verdict::Violated => write!(f, "{} violated", self.property)?,
            Verdict::Undecided => write!(f, "{} undecided", self.property)?,
        }
        if let Some(seed) = self.seed {
            write!(f, " (seed {seed})")?;
        }
        write!(f, ": {}", self.reason)?;
        for op in &self.ops {
            write!(f, "\n  {op}")?;
        }
        if let Some(note) = &self.note {
            write!(f, "\n  ({note})")?;
        }
        Ok(())
    }
}

impl Debug for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Display::fmt(self, f)
    }
}

impl std::error::Error for Violation {}

/// `[invoke..complete]`, with `?` for a completion never seen.
fn window(invoke: Tick, complete: Option<Tick>) -> String {
    match complete {
        Some(c) => format!("[{invoke}..{c}]"),
        None => format!("[{invoke}..?]"),
    }
}

// ---------------------------------------------------------------------------
// Operations and histories
// ---------------------------------------------------------------------------

/// How an operation ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome<O> {
    /// Answered: it took effect, with this answer.
    Ok(O),
    /// Known not to have taken effect (refused before it ran).
    Fail,
    /// Never answered: it may or may not have taken effect, at any time
    /// after it was invoked.
    Unknown,
}

/// One operation of a history: who invoked what, when, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Op<I, O> {
    /// The client that invoked it.
    pub(crate) client: ClientId,
    /// What was asked.
    pub(crate) input: I,
    /// When it was invoked.
    pub(crate) invoke: Tick,
    /// When its answer arrived; `None` when none did.
    pub(crate) complete: Option<Tick>,
    /// How it ended.
    pub(crate) outcome: Outcome<O>,
}

impl<I, O> Op<I, O> {
    /// An operation answered `output` at `complete`.
    pub(crate) fn ok(client: ClientId, input: I, invoke: Tick, complete: Tick, output: O) -> Self {
        Op {
            client,
            input,
            invoke,
            complete: Some(complete),
            outcome: Outcome::Ok(output),
        }
    }

    /// An operation known at `complete` not to have taken effect.
    pub(crate) fn failed(client: ClientId, input: I, invoke: Tick, complete: Tick) -> Self {
        Op {
            client,
            input,
            invoke,
            complete: Some(complete),
            outcome: Outcome::Fail,
        }
    }

    /// An operation never answered: it may take effect any time after
    /// `invoke`, or never.
    pub(crate) fn unknown(client: ClientId, input: I, invoke: Tick) -> Self {
        Op {
            client,
            input,
            invoke,
            complete: None,
            outcome: Outcome::Unknown,
        }
    }
}

impl<I: Debug, O: Debug> Display for Op<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client {} {} {:?} -> ",
            self.client,
            window(self.invoke, self.complete),
            self.input
        )?;
        match &self.outcome {
            Outcome::Ok(o) => write!(f, "{o:?}"),
            Outcome::Fail => f.write_str("failed (no effect)"),
            Outcome::Unknown => f.write_str("unknown"),
        }
    }
}

/// The handle [`History::invoke`] returns, to complete that operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OpId(pub(crate) usize);

/// A history being recorded: operations in the order they were invoked.
///
/// `invoke` records an operation as unknown; `complete` or `fail` records
/// its end. One never completed stays unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct History<I, O> {
    ops: Vec<Op<I, O>>,
}

impl<I, O> Default for History<I, O> {
    fn default() -> Self {
        History { ops: Vec::new() }
    }
}

impl<I, O> History<I, O> {
    /// An empty history.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records that `client` invoked `input` at `at`; unknown until
    /// completed.
    pub(crate) fn invoke(&mut self, client: ClientId, input: I, at: Tick) -> OpId {
        self.ops.push(Op::unknown(client, input, at));
        OpId(self.ops.len() - 1)
    }

    /// Records that the operation was answered `output` at `at`.
    ///
    /// Panics if `id` is not from this history (a bug of the test).
    pub(crate) fn complete(&mut self, id: OpId, at: Tick, output: O) {
        let op = self.op_mut(id);
        op.complete = Some(at);
        op.outcome = Outcome::Ok(output);
    }

    /// Records that the operation was refused at `at` without taking
    /// effect.
    ///
    /// Panics if `id` is not from this history (a bug of the test).
    pub(crate) fn fail(&mut self, id: OpId, at: Tick) {
        let op = self.op_mut(id);
        op.complete = Some(at);
        op.outcome = Outcome::Fail;
    }

    /// Adds a whole operation.
    pub(crate) fn push(&mut self, op: Op<I, O>) -> OpId {
        self.ops.push(op);
        OpId(self.ops.len() - 1)
    }

    /// The operations, in the order they were recorded.
    pub(crate) fn ops(&self) -> &[Op<I, O>] {
        &self.ops
    }

    /// How many operations.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn op_mut(&mut self, id: OpId) -> &mut Op<I, O> {
        let len = self.ops.len();
        match self.ops.get_mut(id.0) {
            Some(op) => op,
            None => panic!("operation {} is not in this history of {len}", id.0),
        }
    }
}

impl<I, O> From<Vec<Op<I, O>>> for History<I, O> {
    fn from(ops: Vec<Op<I, O>>) -> Self {
        History { ops }
    }
}

// ---------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------

/// The sequential specification of an object: its states and how each
/// operation moves from one to the next.
///
/// Models are deterministic: from a state, an input has one answer and
/// one next state. Only `init` and `step` are required; the other methods
/// let the search skip work.
pub(crate) trait Model {
    /// A state of the object.
    type State: Clone + Eq + Hash + Debug;
    /// What an operation asks.
    type Input: Debug;
    /// What an operation answers.
    type Output: Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` is applied to `state`.
    ///
    /// With `Some(output)`: `None` unless the object in `state` answers
    /// `input` with `output`. With `None` (the answer was not seen): the
    /// state after the operation took effect, whatever it answered.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;

    /// Whether `input` never changes the state (a read). A read whose
    /// answer was not seen tells nothing and is left out of the search.
    fn is_read(&self, _input: &Self::Input) -> bool {
        false
    }

    /// Whether an operation answered `output` changed nothing, in any
    /// state where the model gives that answer (a read; a compare-and-set
    /// refused). The search linearizes such an operation as soon as the
    /// state allows and tries no other order for it: that loses nothing,
    /// and spares it the subsets of concurrent reads.
    fn leaves_state(&self, input: &Self::Input, _output: &Self::Output) -> bool {
        self.is_read(input)
    }

    /// Whether two operations whose answers were not seen lead from every
    /// state to the same state. Of such a pair, the search lets the one
    /// invoked first take effect first; without it, it tries every subset
    /// of the unknown operations.
    fn same_effect(&self, _a: &Self::Input, _b: &Self::Input) -> bool {
        false
    }

    /// This model fitted to one history, if fitting helps: one that merges
    /// the states that no answer in `ops` tells apart (a register forgets
    /// the values no read returned). Checked histories are checked with
    /// it; `None`: with this model as it is.
    fn fitted(&self, _ops: &[Op<Self::Input, Self::Output>]) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// A few answered operations of a history the search refused that
    /// break an invariant of the model on their own (positions in `ops`),
    /// and the invariant, or `None`. Asked before shrinking: a violation
    /// it names is reported as it is, sparing the search over every other
    /// operation weakened.
    fn explain(&self, _ops: &[Op<Self::Input, Self::Output>]) -> Option<(Vec<usize>, String)> {
        None
    }
}

/// A versioned value with compare-and-set: a node's configuration value.
///
/// The version starts at 0 (with the initial value) and every successful
/// write adds 1.
#[derive(Clone, Debug)]
pub(crate) struct Register<V> {
    /// The value at version 0.
    pub(crate) initial: V,
    /// The values some read returned, when fitted to a history
    /// ([`Model::fitted`]): the state keeps only these, others are
    /// [`Value::Unread`]. `None`: it keeps every value.
    pub(crate) read: Option<HashSet<V>>,
}

impl<V> Register<V> {
    /// A register holding `initial` at version 0.
    pub(crate) fn new(initial: V) -> Self {
        Register {
            initial,
            read: None,
        }
    }
}

impl<V: Eq + Hash + Clone> Register<V> {
    /// `value` as the state keeps it.
    fn keep(&self, value: &V) -> Value<V> {
        match &self.read {
            Some(read) if !read.contains(value) => Value::Unread,
            _ => Value::Is(value.clone()),
        }
    }
}

/// What a [`Register`] operation asks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RegInput<V> {
    /// Read the version and the value.
    Get,
    /// Write `value` whatever the version.
    Set(V),
    /// Write `value` only if the version is `expect_version`.
    Cas {
        /// The version the writer saw.
        expect_version: u64,
        /// The value to write.
        value: V,
    },
}

/// What a [`Register`] operation answers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RegOutput<V> {
    /// `Get`: the version and the value.
    Got {
        /// The version read.
        version: u64,
        /// The value read.
        value: V,
    },
    /// `Set`, or `Cas` whose expected version held: the new version.
    Written {
        /// The version the write made.
        version: u64,
    },
    /// `Cas` whose expected version did not hold: the version there was.
    Conflict {
        /// The version at the time.
        current: u64,
    },
}

/// A [`Register`]'s state: its version and value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RegState<V> {
    /// The number of successful writes so far.
    pub(crate) version: u64,
    /// The value last written (or the initial one).
    pub(crate) value: Value<V>,
}

/// A value as a [`Register`]'s state keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Value<V> {
    /// This value.
    Is(V),
    /// A value no read of the history returned (which one does not
    /// matter).
    Unread,
}

impl<V: Clone + Eq + Hash + Debug> Model for Register<V> {
    type State = RegState<V>;
    type Input = RegInput<V>;
    type Output = RegOutput<V>;

    fn init(&self) -> RegState<V> {
        RegState {
            version: 0,
            value: self.keep(&self.initial),
        }
    }

    fn step(
        &self,
        state: &RegState<V>,
        input: &RegInput<V>,
        output: Option<&RegOutput<V>>,
    ) -> Option<RegState<V>> {
        let write = |value: &V| -> Option<RegState<V>> {
            let next = RegState {
                version: state.version.checked_add(1)?,
                value: self.keep(value),
            };
            match output {
                None => Some(next),
                Some(RegOutput::Written { version }) if *version == next.version => Some(next),
                Some(_) => None,
            }
        };
        match input {
            RegInput::Get => match output {
                None => Some(state.clone()),
                Some(RegOutput::Got { version, value })
                    if *version == state.version
                        && matches!(&state.value, Value::Is(v) if v == value) =>
                {
                    Some(state.clone())
                }
                Some(_) => None,
            },
            RegInput::Set(value) => write(value),
            RegInput::Cas {
                expect_version,
                value,
            } => {
                if *expect_version == state.version {
                    write(value)
                } else {
                    match output {
                        None => Some(state.clone()),
                        Some(RegOutput::Conflict { current }) if *current == state.version => {
                            Some(state.clone())
                        }
                        Some(_) => None,
                    }
                }
            }
        }
    }

    fn is_read(&self, input: &RegInput<V>) -> bool {
        matches!(input, RegInput::Get)
    }

    fn leaves_state(&self, input: &RegInput<V>, output: &RegOutput<V>) -> bool {
        matches!(input, RegInput::Get) || matches!(output, RegOutput::Conflict { .. })
    }

    fn same_effect(&self, a: &RegInput<V>, b: &RegInput<V>) -> bool {
        match (a, b) {
            (RegInput::Get, RegInput::Get) => true,
            (RegInput::Set(x), RegInput::Set(y)) => self.keep(x) == self.keep(y),
            (
                RegInput::Cas {
                    expect_version: e,
                    value: x,
                },
                RegInput::Cas {
                    expect_version: f,
                    value: y,
                },
            ) => e == f && self.keep(x) == self.keep(y),
            _ => false,
        }
    }

    /// Versions never go back and each is written once: an operation
    /// invoked after another was answered cannot see a version older than
    /// the one that other left; two writes cannot both make one version;
    /// a read of a version answers the value the write of that version
    /// wrote.
    fn explain(&self, ops: &[Op<RegInput<V>, RegOutput<V>>]) -> Option<(Vec<usize>, String)> {
        // The version before and after each answered operation.
        let span = |op: &Op<RegInput<V>, RegOutput<V>>| -> Option<(u64, u64)> {
            match &op.outcome {
                Outcome::Ok(RegOutput::Got { version, .. })
                | Outcome::Ok(RegOutput::Conflict { current: version }) => {
                    Some((*version, *version))
                }
                Outcome::Ok(RegOutput::Written { version }) => {
                    Some((version.checked_sub(1)?, *version))
                }
                _ => None,
            }
        };
        let written = |op: &Op<RegInput<V>, RegOutput<V>>| -> Option<(u64, V)> {
            match (&op.input, &op.outcome) {
                (
                    RegInput::Set(x) | RegInput::Cas { value: x, .. },
                    Outcome::Ok(RegOutput::Written { version }),
                ) => Some((*version, x.clone())),
                _ => None,
            }
        };
        let mut found: Option<(Vec<usize>, String)> = None;
        let mut consider = |earliest: Tick, pair: Vec<usize>, why: String| {
            let better = match &found {
                None => true,
                Some((p, _)) => pair.iter().max() < p.iter().max() && earliest > 0,
            };
            if better {
                found = Some((pair, why));
            }
        };
        for (b, opb) in ops.iter().enumerate() {
            let Some((pre_b, _)) = span(opb) else {
                continue;
            };
            if let Outcome::Ok(RegOutput::Written { version: 0 }) = &opb.outcome {
                consider(
                    1,
                    vec![b],
                    "a write answered version 0, which no write makes".into(),
                );
            }
            for (a, opa) in ops.iter().enumerate() {
                if a == b {
                    continue;
                }
                let Some((_, post_a)) = span(opa) else {
                    continue;
                };
                if opa.complete.is_some_and(|c| c < opb.invoke) && pre_b < post_a {
                    let mut pair = vec![a, b];
                    pair.sort_unstable();
                    consider(
                        1,
                        pair,
                        format!(
                            "#{a} left version {post_a} before #{b} was invoked, which found version {pre_b}: \
                             versions never go back"
                        ),
                    );
                }
                if a < b
                    && let (Some((va, _)), Some((vb, _))) = (written(opa), written(opb))
                    && va == vb
                {
                    consider(
                        1,
                        vec![a, b],
                        format!("#{a} and #{b} both wrote version {va}"),
                    );
                }
                if let (Some((va, x)), Outcome::Ok(RegOutput::Got { version, value })) =
                    (written(opa), &opb.outcome)
                    && va == *version
                    && x != *value
                {
                    let mut pair = vec![a, b];
                    pair.sort_unstable();
                    consider(
                        1,
                        pair,
                        format!(
                            "#{b} read version {va} with a value other than the one #{a} wrote"
                        ),
                    );
                }
            }
        }
        found
    }

    fn fitted(&self, ops: &[Op<RegInput<V>, RegOutput<V>>]) -> Option<Self> {
        let read = ops
            .iter()
            .filter_map(|op| match &op.outcome {
                Outcome::Ok(RegOutput::Got { value, .. }) => Some(value.clone()),
                _ => None,
            })
            .collect();
        Some(Register {
            initial: self.initial.clone(),
            read: Some(read),
        })
    }
}

// ---------------------------------------------------------------------------
// Linearizability
// ---------------------------------------------------------------------------

/// Bounds of [`linearizable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinOptions {
    /// Search steps one check may take before it answers undecided.
    pub(crate) step_budget: u64,
    /// Checks the shrinking of a violation may run; 0 reports the whole
    /// history.
    pub(crate) shrink_checks: u32,
    /// Search steps each of those checks may take. A check that runs out
    /// keeps the operation it tried to set aside: the witness may be
    /// larger than it could be, never wrong.
    pub(crate) shrink_step_budget: u64,
}

impl Default for LinOptions {
    fn default() -> Self {
        LinOptions {
            step_budget: 5_000_000,
            shrink_checks: 1_000,
            shrink_step_budget: 20_000,
        }
    }
}

/// What one search found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SearchResult {
    /// An order explains the history.
    Linearizable,
    /// No order does.
    NotLinearizable,
    /// The step budget ran out first.
    Undecided,
}

/// A search's result and the steps it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Search {
    /// What it found.
    pub(crate) result: SearchResult,
    /// Steps taken (each a try to linearize an operation or a backtrack).
    pub(crate) steps: u64,
}

/// Whether the history of one object is linearizable with respect to
/// `model`: one order of its operations respects real time (an operation
/// answered before another was invoked comes first) and explains every
/// answer.
///
/// Answered operations must take effect between invoke and completion;
/// failed ones are left out (they took no effect); unknown ones may take
/// effect at any time after their invoke, or never (unknown reads are left
/// out). Operations whose times touch (one completes at the tick another
/// is invoked) count as concurrent.
///
/// On a violation the history is shrunk (within `options.shrink_checks`
/// checks): answered operations are set aside one by one (by halves
/// first) as long as the violation stands, and those left are reported.
/// An operation set aside is not deleted (deleting a write would make the
/// versions read after it impossible, a false witness) but weakened: it
/// may or may not have taken effect within its window, answering
/// anything. So the operations reported cannot be explained however the
/// others went, and each one is needed: weakening any of them too
/// explains the rest.
///
/// When the search runs out of `options.step_budget`, the violation
/// returned is [`Verdict::Undecided`].
pub(crate) fn linearizable<M: Model>(
    model: &M,
    history: &History<M::Input, M::Output>,
    options: LinOptions,
) -> Result<(), Violation> {
    linearizable_ops(model, history.ops(), options)
}

/// [`linearizable`] on a slice of operations.
pub(crate) fn linearizable_ops<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    options: LinOptions,
) -> Result<(), Violation> {
    if let Some(i) = ops
        .iter()
        .position(|op| op.complete.is_some_and(|c| c < op.invoke))
    {
        let mut v = Violation::new(
            Property::Linearizability,
            "malformed history: an operation completes before it is invoked",
            vec![format!("#{i} {}", ops[i])],
        );
        v.positions = vec![i];
        return Err(v);
    }
    let fitted = model.fitted(ops);
    let model = fitted.as_ref().unwrap_or(model);
    let mut weak = vec![false; ops.len()];
    let first = search(model, ops, &weak, options.step_budget);
    match first.result {
        SearchResult::Linearizable => return Ok(()),
        SearchResult::Undecided => {
            let mut v = Violation::new(
                Property::Linearizability,
                format!(
                    "no answer within the budget of {} steps ({} operations); \
                     raise LinOptions::step_budget",
                    options.step_budget,
                    ops.len()
                ),
                Vec::new(),
            );
            v.verdict = Verdict::Undecided;
            return Err(v);
        }
        SearchResult::NotLinearizable => {}
    }
    let explained = match options.shrink_checks {
        0 => None,
        _ => model.explain(ops),
    };
    // One operation of an explained pair may be a violation on its own
    // (a read of a value nobody wrote; a write that could not reach its
    // version by then).
    let explained = explained.map(|(kept, why)| {
        let alone = kept.iter().copied().find(|&p| {
            let weak: Vec<bool> = (0..ops.len()).map(|i| i != p).collect();
            search(model, ops, &weak, options.shrink_step_budget).result
                == SearchResult::NotLinearizable
        });
        match alone {
            Some(p) => (vec![p], None),
            None => (kept, Some(why)),
        }
    });
    let (kept, why, checks) = match explained {
        Some((kept, why)) => (kept, why, 0),
        None => {
            let checks = shrink(model, ops, &mut weak, options);
            let kept: Vec<usize> = (0..ops.len())
                .filter(|&i| !weak[i] && matches!(ops[i].outcome, Outcome::Ok(_)))
                .collect();
            (kept, None, checks)
        }
    };
    let mut v = Violation::new(
        Property::Linearizability,
        format!(
            "no order of these {} answered operations, respecting their times, explains their answers{}",
            kept.len(),
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        ),
        kept.iter().map(|&i| format!("#{i} {}", ops[i])).collect(),
    );
    let others = ops.len() - kept.len();
    if others > 0 {
        let budget = if checks >= options.shrink_checks {
            "; shrinking stopped at its budget"
        } else {
            ""
        };
        v.note = Some(format!(
            "{others} other operations of the history left out: the violation stands \
             whether or not each of them took effect{budget}"
        ));
    }
    v.positions = kept;
    Err(v)
}

/// The search on `ops`, with those marked in `weak` weakened (each may or
/// may not have taken effect within its window, answering anything), for
/// at most `budget` steps. What [`linearizable`] runs, without the report.
pub(crate) fn search_weakened<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    weak: &[bool],
    budget: u64,
) -> Search {
    let fitted = model.fitted(ops);
    search(fitted.as_ref().unwrap_or(model), ops, weak, budget)
}

fn search<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    weak: &[bool],
    budget: u64,
) -> Search {
    let prepared = prepare(model, ops, weak);
    wing_gong(model, &prepared, budget)
}

/// Sets aside (weakens) as many answered operations as it can while the
/// history stays unexplainable, by chunks halving down to single ones,
/// then single ones again until none more can go. Returns the checks run.
fn shrink<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    weak: &mut [bool],
    options: LinOptions,
) -> u32 {
    let mut checks = 0u32;
    let still_fails = |weak: &[bool], checks: &mut u32| -> Option<bool> {
        if *checks >= options.shrink_checks {
            return None;
        }
        *checks += 1;
        let s = search(model, ops, weak, options.shrink_step_budget);
        Some(s.result == SearchResult::NotLinearizable)
    };
    let candidates = |weak: &[bool]| -> Vec<usize> {
        (0..ops.len())
            .filter(|&i| !weak[i] && matches!(ops[i].outcome, Outcome::Ok(_)))
            .collect()
    };
    let mut chunk = candidates(weak).len() / 2;
    while chunk > 1 {
        let live = candidates(weak);
        for group in live.chunks(chunk) {
            for &i in group {
                weak[i] = true;
            }
            match still_fails(weak, &mut checks) {
                Some(true) => {}
                Some(false) => {
                    for &i in group {
                        weak[i] = false;
                    }
                }
                None => {
                    for &i in group {
                        weak[i] = false;
                    }
                    return checks;
                }
            }
        }
        chunk /= 2;
    }
    loop {
        let mut changed = false;
        // Later operations first: an early write with the reads that
        // contradict it makes a plainer witness than the late ones.
        for i in candidates(weak).into_iter().rev() {
            weak[i] = true;
            match still_fails(weak, &mut checks) {
                Some(true) => changed = true,
                Some(false) => weak[i] = false,
                None => {
                    weak[i] = false;
                    return checks;
                }
            }
        }
        if !changed {
            return checks;
        }
    }
}

/// An operation as the search sees it.
struct SearchOp<'a, I, O> {
    input: &'a I,
    /// The answer to match; `None` when not seen or weakened.
    output: Option<&'a O>,
    invoke: Tick,
    /// By when it must have taken effect; `None`: any time, or never.
    ret: Option<Tick>,
    /// May be skipped (weakened): it took effect within its window or not
    /// at all.
    optional: bool,
    /// Answered, and its answer means it changed nothing
    /// ([`Model::leaves_state`]).
    quiet: bool,
}

fn prepare<'a, M: Model>(
    model: &M,
    ops: &'a [Op<M::Input, M::Output>],
    weak: &[bool],
) -> Vec<SearchOp<'a, M::Input, M::Output>> {
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let weakened = weak.get(i).copied().unwrap_or(false);
        let read = model.is_read(&op.input);
        match &op.outcome {
            Outcome::Fail => {}
            Outcome::Unknown if read => {}
            Outcome::Unknown => out.push(SearchOp {
                input: &op.input,
                output: None,
                invoke: op.invoke,
                ret: None,
                optional: false,
                quiet: false,
            }),
            Outcome::Ok(_) if weakened && read => {}
            Outcome::Ok(o) => out.push(SearchOp {
                input: &op.input,
                output: if weakened { None } else { Some(o) },
                invoke: op.invoke,
                ret: Some(op.complete.unwrap_or(Tick::MAX)),
                optional: weakened,
                quiet: !weakened && model.leaves_state(&op.input, o),
            }),
        }
    }
    out
}

/// A set of operation indexes.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn is_subset(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }
}

const NIL: usize = usize::MAX;

/// The entries of the search, calls and returns in time order, in a
/// doubly linked list from which a linearized operation is lifted (its
/// call and its return) and put back when the search backtracks.
struct Entries {
    /// For each entry: its operation, and whether it is the call.
    kind: Vec<(usize, bool)>,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For each operation: its call entry and its return entry.
    call: Vec<usize>,
    ret: Vec<Option<usize>>,
    head: usize,
}

impl Entries {
    fn new<I, O>(ops: &[SearchOp<'_, I, O>]) -> Self {
        // Calls before returns at one tick: touching operations overlap.
        let mut events: Vec<(Tick, bool, usize)> = Vec::with_capacity(2 * ops.len());
        for (i, op) in ops.iter().enumerate() {
            events.push((op.invoke, false, i));
            if let Some(r) = op.ret {
                events.push((r, true, i));
            }
        }
        events.sort_unstable();
        let n = events.len();
        let head = n;
        let mut call = vec![NIL; ops.len()];
        let mut ret = vec![None; ops.len()];
        let mut kind = Vec::with_capacity(n);
        for (e, &(_, is_ret, op)) in events.iter().enumerate() {
            kind.push((op, !is_ret));
            if is_ret {
                ret[op] = Some(e);
            } else {
                call[op] = e;
            }
        }
        let mut next = vec![NIL; n + 1];
        let mut prev = vec![NIL; n + 1];
        // The head sentinel is `n`, before entry 0.
        let mut last = head;
        for (e, before) in prev.iter_mut().enumerate().take(n) {
            next[last] = e;
            *before = last;
            last = e;
        }
        Entries {
            kind,
            next,
            prev,
            call,
            ret,
            head,
        }
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        if n != NIL {
            self.prev[n] = e;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call[op]);
        if let Some(r) = self.ret[op] {
            self.unlink(r);
        }
    }

    fn unlift(&mut self, op: usize) {
        if let Some(r) = self.ret[op] {
            self.relink(r);
        }
        self.relink(self.call[op]);
    }
}

/// One linearized operation on the search's stack.
struct Frame<S> {
    op: usize,
    /// 0: it took effect; 1: it was skipped (weakened operations only).
    choice: u8,
    /// The pass it was found in (see [`wing_gong`]).
    pass: Pass,
    /// Taken as the only way on (a quiet operation): nothing else is tried
    /// in its place.
    forced: bool,
    /// The state before it.
    before: S,
}

/// Which operations a scan of the candidates tries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Those that must take effect by their completion.
    Bounded,
    /// Unknown ones (no completion): only once no bounded one can go next.
    Unbounded,
}

/// The configurations the search has reached: the bounded operations
/// done and the state, with the sets of unknown operations done (kept
/// minimal: one that is a superset of another with the same key is never
/// stored).
///
/// A configuration is not explored again if one reached before had the
/// same bounded operations done, the same state, and a subset of its
/// unknown operations done: every way on from the new one is open from
/// the old one too (an unknown operation never has to take effect, nor
/// holds another back), and the old one was explored.
struct Seen<S> {
    map: HashMap<(Bits, S), Vec<Bits>>,
}

impl<S: Clone + Eq + Hash> Seen<S> {
    /// Records the configuration; false if one reached before covers it.
    fn insert(&mut self, bounded: &Bits, unbounded: &Bits, state: &S) -> bool {
        let sets = self
            .map
            .entry((bounded.clone(), state.clone()))
            .or_default();
        if sets.iter().any(|old| old.is_subset(unbounded)) {
            return false;
        }
        sets.retain(|old| !unbounded.is_subset(old));
        sets.push(unbounded.clone());
        true
    }
}

/// The Wing-Gong search with Lowe's memoization.
///
/// Walk the entries from the start; at a call, try to linearize that
/// operation next (if the model accepts its answer, and the configuration
/// reached, operations done and state, is new: see [`Seen`]); at the
/// return of an operation not done yet, undo the last choice and try the
/// next one. Done when every operation with a completion has taken effect
/// (or been skipped, if weakened); unknown operations left over never took
/// effect.
///
/// Three rules keep the search small. A quiet operation (one whose
/// answer says it changed nothing, [`Model::leaves_state`]) that can go
/// next is linearized at once, as the only way on: any order that works
/// still works with it moved first. And unknown operations are tried only
/// after the bounded ones (a second pass over the same candidates): they
/// may take effect at any later point, so the search puts them off until
/// it needs them. Of unknown operations with the same effect, the one
/// invoked first is the one to take effect first.
fn wing_gong<M: Model>(
    model: &M,
    ops: &[SearchOp<'_, M::Input, M::Output>],
    budget: u64,
) -> Search {
    let mut entries = Entries::new(ops);
    // Each operation's index in its own set: bounded or unbounded.
    let mut slot = Vec::with_capacity(ops.len());
    let (mut n_bounded, mut n_unbounded) = (0, 0);
    for op in ops {
        if op.ret.is_some() {
            slot.push(n_bounded);
            n_bounded += 1;
        } else {
            slot.push(n_unbounded);
            n_unbounded += 1;
        }
    }
    // Unknown operations with the same effect ([`Model::same_effect`]),
    // each class in invoke order: only its first one not yet done is tried.
    let mut by_call: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret.is_none()).collect();
    by_call.sort_unstable_by_key(|&i| entries.call[i]);
    let mut class_of = vec![0; ops.len()];
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for i in by_call {
        let same = classes
            .iter()
            .position(|c| model.same_effect(ops[c[0]].input, ops[i].input));
        let c = match same {
            Some(c) => c,
            None => {
                classes.push(Vec::new());
                classes.len() - 1
            }
        };
        classes[c].push(i);
        class_of[i] = c;
    }
    let mut required = n_bounded;
    let mut bounded = Bits::new(n_bounded);
    let mut unbounded = Bits::new(n_unbounded);
    let mut seen = Seen {
        map: HashMap::new(),
    };
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut state = model.init();
    let mut entry = entries.next[entries.head];
    let mut pass = Pass::Bounded;
    let mut first_choice = 0u8;
    // Just arrived at a configuration: look for a quiet operation first.
    let mut arrived = true;
    let mut steps = 0u64;
    loop {
        if required == 0 {
            return Search {
                result: SearchResult::Linearizable,
                steps,
            };
        }
        steps += 1;
        if steps > budget {
            return Search {
                result: SearchResult::Undecided,
                steps,
            };
        }
        if arrived {
            arrived = false;
            let mut e = entries.next[entries.head];
            let mut quiet = None;
            while e != NIL && entries.kind[e].1 {
                let i = entries.kind[e].0;
                let op = &ops[i];
                if op.quiet
                    && let Some(after) = model.step(&state, op.input, op.output)
                {
                    quiet = Some((i, after));
                    break;
                }
                e = entries.next[e];
            }
            if let Some((i, after)) = quiet {
                // Quiet operations are bounded.
                bounded.set(slot[i]);
                if seen.insert(&bounded, &unbounded, &after) {
                    let before = std::mem::replace(&mut state, after);
                    stack.push(Frame {
                        op: i,
                        choice: 0,
                        pass: Pass::Bounded,
                        forced: true,
                        before,
                    });
                    entries.lift(i);
                    required -= 1;
                    arrived = true;
                    entry = entries.next[entries.head];
                    pass = Pass::Bounded;
                } else {
                    // Covered: this configuration leads nowhere new.
                    bounded.clear(slot[i]);
                    entry = NIL;
                    pass = Pass::Unbounded;
                }
                continue;
            }
        }
        let at_call = entry != NIL && entries.kind[entry].1;
        if at_call {
            let i = entries.kind[entry].0;
            let op = &ops[i];
            let in_pass = match pass {
                Pass::Bounded => op.ret.is_some(),
                Pass::Unbounded => {
                    op.ret.is_none()
                        && classes[class_of[i]]
                            .iter()
                            .find(|&&j| !unbounded.get(slot[j]))
                            .is_some_and(|&j| j == i)
                }
            };
            let choices = match (in_pass, op.optional) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            };
            let mut moved = false;
            for choice in first_choice..choices {
                let after = if choice == 0 {
                    model.step(&state, op.input, op.output)
                } else {
                    Some(state.clone())
                };
                let Some(after) = after else { continue };
                let set = if op.ret.is_some() {
                    &mut bounded
                } else {
                    &mut unbounded
                };
                set.set(slot[i]);
                if seen.insert(&bounded, &unbounded, &after) {
                    let before = std::mem::replace(&mut state, after);
                    stack.push(Frame {
                        op: i,
                        choice,
                        pass,
                        forced: false,
                        before,
                    });
                    entries.lift(i);
                    if op.ret.is_some() {
                        required -= 1;
                    }
                    moved = true;
                    break;
                }
                if op.ret.is_some() {
                    bounded.clear(slot[i]);
                } else {
                    unbounded.clear(slot[i]);
                }
            }
            first_choice = 0;
            if moved {
                arrived = true;
                entry = entries.next[entries.head];
                pass = Pass::Bounded;
            } else {
                entry = entries.next[entry];
            }
        } else if pass == Pass::Bounded && n_unbounded > 0 {
            // No bounded operation can go next: try the unknown ones.
            pass = Pass::Unbounded;
            entry = entries.next[entries.head];
        } else {
            // The return of an operation not done yet (or the end): what
            // was chosen before cannot be right.
            let Some(frame) = stack.pop() else {
                return Search {
                    result: SearchResult::NotLinearizable,
                    steps,
                };
            };
            state = frame.before;
            if ops[frame.op].ret.is_some() {
                bounded.clear(slot[frame.op]);
                required += 1;
            } else {
                unbounded.clear(slot[frame.op]);
            }
            entries.unlift(frame.op);
            if frame.forced {
                // It was the only way on from there: back up further.
                entry = NIL;
                pass = Pass::Unbounded;
            } else {
                entry = entries.call[frame.op];
                pass = frame.pass;
                first_choice = frame.choice + 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Exactly-once: requests and task submits
// ---------------------------------------------------------------------------

/// The answer one attempt of a request got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer<A> {
    /// Answered with this result.
    Ok(A),
    /// Refused `duplicate` (the req_id is running, forgotten, or was used
    /// for another verb).
    Duplicate,
    /// Refused with another error (its code or text).
    Refused(String),
    /// No answer arrived.
    Unknown,
}

/// One attempt of a request (a first try or a retry under the same
/// req_id), as its sender saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request<A> {
    /// Who sent it.
    pub(crate) sender: ClientId,
    /// Its req_id; retries keep it.
    pub(crate) req_id: String,
    /// The verb called (`cap/verb`).
    pub(crate) verb: String,
    /// When it was sent.
    pub(crate) invoke: Tick,
    /// When its answer arrived, if one did.
    pub(crate) complete: Option<Tick>,
    /// What it was answered.
    pub(crate) answer: Answer<A>,
}

impl<A: Debug> Request<A> {
    fn line(&self, what: &str, i: usize) -> String {
        let answer = match &self.answer {
            Answer::Ok(a) => format!("ok {a:?}"),
            Answer::Duplicate => "duplicate".to_owned(),
            Answer::Refused(e) => format!("refused {e}"),
            Answer::Unknown => "unknown".to_owned(),
        };
        format!(
            "{what} #{i}: sender {} req_id {:?} {} {} -> {answer}",
            self.sender,
            self.req_id,
            self.verb,
            window(self.invoke, self.complete)
        )
    }
}

/// One run of a handler, as the server's side observed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Execution {
    /// Whose request it ran.
    pub(crate) sender: ClientId,
    /// The request's req_id.
    pub(crate) req_id: String,
    /// The verb whose handler ran.
    pub(crate) verb: String,
    /// When it ran.
    pub(crate) at: Tick,
}

impl Execution {
    fn line(&self, i: usize) -> String {
        format!(
            "execution #{i}: sender {} req_id {:?} {} at {}",
            self.sender, self.req_id, self.verb, self.at
        )
    }
}

/// Exactly-once for requests:
///
/// - each (sender, req_id) ran its handler at most once (`executions`);
/// - a req_id that ran under one verb is never answered ok for another
///   (such a reuse must be refused `duplicate`), and without a recorded
///   run, one req_id is not answered ok for two verbs;
/// - every ok answer to the attempts of one (sender, req_id, verb) is the
///   same value.
pub(crate) fn exactly_once_requests<A: Eq + Debug>(
    attempts: &[Request<A>],
    executions: &[Execution],
) -> Result<(), Violation> {
    let p = Property::ExactlyOnceRequests;
    let mut runs: BTreeMap<(ClientId, &str), Vec<usize>> = BTreeMap::new();
    for (i, e) in executions.iter().enumerate() {
        runs.entry((e.sender, e.req_id.as_str()))
            .or_default()
            .push(i);
    }
    for ((sender, req_id), list) in &runs {
        if list.len() > 1 {
            return Err(Violation::new(
                p,
                format!(
                    "the handler ran {} times for sender {sender} req_id {req_id:?}",
                    list.len()
                ),
                list.iter().map(|&i| executions[i].line(i)).collect(),
            ));
        }
    }
    one_verb_per_req_id(p, attempts, |sender, req_id| {
        runs.get(&(sender, req_id))
            .and_then(|l| l.first())
            .map(|&i| (executions[i].verb.as_str(), executions[i].line(i)))
    })?;
    same_answer_per_key(p, attempts)
}

/// Every ok answer has a run behind it: an execution of the same
/// (sender, req_id, verb). For verbs whose runs are all recorded.
pub(crate) fn answers_backed_by_executions<A: Debug>(
    attempts: &[Request<A>],
    executions: &[Execution],
) -> Result<(), Violation> {
    let ran: HashSet<(ClientId, &str, &str)> = executions
        .iter()
        .map(|e| (e.sender, e.req_id.as_str(), e.verb.as_str()))
        .collect();
    for (i, a) in attempts.iter().enumerate() {
        if matches!(a.answer, Answer::Ok(_))
            && !ran.contains(&(a.sender, a.req_id.as_str(), a.verb.as_str()))
        {
            return Err(Violation::new(
                Property::ExactlyOnceRequests,
                "answered ok, but its handler never ran",
                vec![a.line("attempt", i)],
            ));
        }
    }
    Ok(())
}

/// Exactly-once for task submits (each answered the task's id):
///
/// - every ok answer to the attempts of one (sender, req_id, verb) is the
///   same task;
/// - one (sender, req_id) is not answered ok for two verbs (a reuse on
///   another verb must be refused `duplicate`);
/// - no other submit (another verb, req_id or sender) gets that task.
pub(crate) fn exactly_once_submits<T: Eq + Hash + Debug>(
    submits: &[Request<T>],
) -> Result<(), Violation> {
    let p = Property::ExactlyOnceSubmits;
    same_answer_per_key(p, submits)?;
    one_verb_per_req_id(p, submits, |_, _| None)?;
    let mut owner: HashMap<&T, usize> = HashMap::new();
    for (i, s) in submits.iter().enumerate() {
        let Answer::Ok(task) = &s.answer else {
            continue;
        };
        match owner.get(task) {
            None => {
                owner.insert(task, i);
            }
            Some(&j) => {
                let o = &submits[j];
                if (o.sender, &o.req_id, &o.verb) != (s.sender, &s.req_id, &s.verb) {
                    let reason = if (o.sender, &o.req_id) == (s.sender, &s.req_id) {
                        "a submit of another verb under the same req_id was given the same task"
                    } else {
                        "two different submits were given the same task"
                    };
                    return Err(Violation::new(
                        p,
                        reason,
                        vec![o.line("submit", j), s.line("submit", i)],
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every ok answer of one (sender, req_id, verb) is the same.
fn same_answer_per_key<A: Eq + Debug>(
    p: Property,
    attempts: &[Request<A>],
) -> Result<(), Violation> {
    let what = if p == Property::ExactlyOnceSubmits {
        "submit"
    } else {
        "attempt"
    };
    let mut first: HashMap<(ClientId, &str, &str), usize> = HashMap::new();
    for (i, a) in attempts.iter().enumerate() {
        let Answer::Ok(value) = &a.answer else {
            continue;
        };
        let key = (a.sender, a.req_id.as_str(), a.verb.as_str());
        match first.get(&key) {
            None => {
                first.insert(key, i);
            }
            Some(&j) => {
                if let Answer::Ok(earlier) = &attempts[j].answer
                    && earlier != value
                {
                    let reason = if p == Property::ExactlyOnceSubmits {
                        "retries of one submit were given two different tasks"
                    } else {
                        "retries of one request were answered two different values"
                    };
                    return Err(Violation::new(
                        p,
                        reason,
                        vec![attempts[j].line(what, j), a.line(what, i)],
                    ));
                }
            }
        }
    }
    Ok(())
}

/// No (sender, req_id) is answered ok for a verb other than the one it
/// belongs to: the verb that ran it (`ran` gives it, with the line that
/// shows the run), or else the verb first answered ok.
fn one_verb_per_req_id<'a, A: Debug>(
    p: Property,
    attempts: &'a [Request<A>],
    ran: impl Fn(ClientId, &str) -> Option<(&'a str, String)>,
) -> Result<(), Violation> {
    let what = if p == Property::ExactlyOnceSubmits {
        "submit"
    } else {
        "attempt"
    };
    let mut first_ok: HashMap<(ClientId, &str), usize> = HashMap::new();
    for (i, a) in attempts.iter().enumerate() {
        if !matches!(a.answer, Answer::Ok(_)) {
            continue;
        }
        if let Some((verb, line)) = ran(a.sender, &a.req_id) {
            if verb != a.verb {
                return Err(Violation::new(
                    p,
                    format!(
                        "req_id {:?} ran as {verb} but an attempt of {} was answered ok \
                         (it must be refused duplicate)",
                        a.req_id, a.verb
                    ),
                    vec![line, a.line(what, i)],
                ));
            }
            continue;
        }
        match first_ok.get(&(a.sender, a.req_id.as_str())) {
            None => {
                first_ok.insert((a.sender, a.req_id.as_str()), i);
            }
            Some(&j) if attempts[j].verb != a.verb => {
                return Err(Violation::new(
                    p,
                    format!(
                        "req_id {:?} was answered ok for two verbs (the reuse must be refused duplicate)",
                        a.req_id
                    ),
                    vec![attempts[j].line(what, j), a.line(what, i)],
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Subscriber streams
// ---------------------------------------------------------------------------

/// One event of a task's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Event<K> {
    /// Its place in the log, from 1.
    pub(crate) seq: u64,
    /// What it says (its kind, with whatever content is compared).
    pub(crate) kind: K,
}

impl<K> Event<K> {
    /// An event.
    pub(crate) fn new(seq: u64, kind: K) -> Self {
        Event { seq, kind }
    }
}

/// How one subscription (the first or a resume) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentEnd {
    /// The server ended the stream: the task is over, every event sent.
    Finished,
    /// Cut (an error, the link, the subscriber's choice) before the end.
    Cut,
    /// Still open when the test stopped.
    Open,
}

/// One subscription of a subscriber: asked from `from`, it received
/// `received`, then ended `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment<K> {
    /// The first seq asked for (0 or 1: from the start).
    pub(crate) from: u64,
    /// The events received, in the order received.
    pub(crate) received: Vec<Event<K>>,
    /// How it ended.
    pub(crate) end: SegmentEnd,
}

/// What one subscriber received of a task, across its resumes, checked
/// against the task's authoritative event log (seqs 1..=n in order):
///
/// - each subscription delivers the log from its `from` on, consecutively:
///   nothing below `from` (a resume from k gets no event before k again),
///   nothing doubled, nothing out of order, nothing skipped, each event
///   equal to the log's;
/// - one that the server finished delivered through the log's last event
///   (its final state);
/// - together they cover every seq from the first `from` to the end of the
///   log (when a subscription finished) or else to the last seq received.
pub(crate) fn subscriber_stream<K: Eq + Debug>(
    subscriber: ClientId,
    log: &[Event<K>],
    segments: &[Segment<K>],
) -> Result<(), Violation> {
    let p = Property::SubscriberStream;
    let who = format!("subscriber {subscriber}");
    for (i, e) in log.iter().enumerate() {
        if e.seq != i as u64 + 1 {
            return Err(Violation::new(
                p,
                "the task's log is not numbered 1..n",
                vec![format!("log #{i}: seq {} {:?}", e.seq, e.kind)],
            ));
        }
    }
    let n = log.len() as u64;
    let got =
        |s: usize, e: &Event<K>| format!("{who} resume #{s} received seq {} {:?}", e.seq, e.kind);
    let asked = |s: usize, seg: &Segment<K>| format!("{who} resume #{s} from seq {}", seg.from);
    let logged = |seq: u64| -> String {
        match log.get(seq.saturating_sub(1) as usize) {
            Some(e) => format!("log: seq {} {:?}", e.seq, e.kind),
            None => format!("log: ends at seq {n}"),
        }
    };
    let mut covered = vec![false; log.len() + 1];
    let mut reached_end = false;
    let mut last_seen = 0u64;
    for (s, seg) in segments.iter().enumerate() {
        let from = seg.from.max(1);
        let mut expect = from;
        for (j, e) in seg.received.iter().enumerate() {
            if e.seq == 0 || e.seq > n {
                return Err(Violation::new(
                    p,
                    "an event that is not in the task's log was delivered",
                    vec![asked(s, seg), got(s, e), logged(e.seq)],
                ));
            }
            if e.seq < from {
                return Err(Violation::new(
                    p,
                    format!("after a resume from seq {from}, an earlier event was delivered again"),
                    vec![asked(s, seg), got(s, e)],
                ));
            }
            if e.seq < expect {
                let first = seg.received[..j]
                    .iter()
                    .find(|d| d.seq == e.seq)
                    .map_or_else(String::new, |d| got(s, d));
                return Err(Violation::new(
                    p,
                    format!("event {} was delivered twice", e.seq),
                    vec![asked(s, seg), first, got(s, e)],
                ));
            }
            if e.seq > expect {
                let late = seg.received[j + 1..]
                    .iter()
                    .find(|d| d.seq >= expect && d.seq < e.seq);
                return Err(match late {
                    Some(d) => Violation::new(
                        p,
                        format!("event {} was delivered after event {}", d.seq, e.seq),
                        vec![asked(s, seg), got(s, e), got(s, d)],
                    ),
                    None => Violation::new(
                        p,
                        format!(
                            "events {expect}..{} were skipped (lost) in this subscription",
                            e.seq - 1
                        ),
                        vec![asked(s, seg), logged(expect), got(s, e)],
                    ),
                });
            }
            if log[e.seq as usize - 1].kind != e.kind {
                return Err(Violation::new(
                    p,
                    format!("event {} differs from the log's", e.seq),
                    vec![got(s, e), logged(e.seq)],
                ));
            }
            covered[e.seq as usize] = true;
            last_seen = last_seen.max(e.seq);
            expect += 1;
        }
        if seg.end == SegmentEnd::Finished {
            if expect <= n {
                let last = seg
                    .received
                    .last()
                    .map_or_else(|| asked(s, seg), |e| got(s, e));
                return Err(Violation::new(
                    p,
                    format!(
                        "the stream was finished at seq {} but the log goes on to seq {n} (final events dropped)",
                        expect - 1
                    ),
                    vec![asked(s, seg), last, logged(n)],
                ));
            }
            reached_end = true;
        }
    }
    let Some(first) = segments.first() else {
        return Ok(());
    };
    let start = first.from.max(1);
    let stop = if reached_end { n } else { last_seen };
    if let Some(missing) = (start..=stop).find(|&q| !covered[q as usize]) {
        let mut lines = vec![logged(missing)];
        lines.extend(segments.iter().enumerate().map(|(s, seg)| {
            let span = match (seg.received.first(), seg.received.last()) {
                (Some(a), Some(b)) => format!("seqs {}..{}", a.seq, b.seq),
                _ => "nothing".to_owned(),
            };
            format!("{} received {span}, {:?}", asked(s, seg), seg.end)
        }));
        return Err(Violation::new(
            p,
            format!("event {missing} was never delivered (lost between resumes)"),
            lines,
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// No controller effect after revocation
// ---------------------------------------------------------------------------

/// What an authority change does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthorityKind {
    /// Gives authority (a bind, a rebind, a fresh grant).
    Grant,
    /// Takes it away by revoking it.
    Revoke,
    /// Takes it away by unbinding.
    Unbind,
}

/// A change of one controller's authority (over one target: `key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AuthorityChange<K> {
    /// Whose authority over what.
    pub(crate) key: K,
    /// What the change does.
    pub(crate) kind: AuthorityKind,
    /// When it was asked.
    pub(crate) invoke: Tick,
    /// When it was acknowledged done; `None` when unknown (it may take
    /// effect any time after `invoke`, or never).
    pub(crate) complete: Option<Tick>,
}

/// A controller call that needs the authority `key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControllerCall<K> {
    /// The authority it needs.
    pub(crate) key: K,
    /// The verb called.
    pub(crate) verb: String,
    /// When it was sent.
    pub(crate) invoke: Tick,
    /// When its answer arrived, if one did.
    pub(crate) complete: Option<Tick>,
    /// Whether it was acknowledged ok (its effect done).
    pub(crate) acknowledged: bool,
}

/// No controller call invoked after a revoke or unbind of its authority
/// completed is acknowledged ok, unless a grant could have given the
/// authority back in between: one that may have taken effect after the
/// revoke did (it completed at or after the revoke was invoked, or never
/// completed) and before the call did (it was invoked at or before the
/// call completed).
pub(crate) fn no_effect_after_revocation<K: Eq + Debug>(
    changes: &[AuthorityChange<K>],
    calls: &[ControllerCall<K>],
) -> Result<(), Violation> {
    for (ci, call) in calls.iter().enumerate() {
        if !call.acknowledged {
            continue;
        }
        let call_done = call.complete.unwrap_or(Tick::MAX);
        for (ri, revoke) in changes.iter().enumerate() {
            if revoke.kind == AuthorityKind::Grant || revoke.key != call.key {
                continue;
            }
            let Some(revoked) = revoke.complete else {
                continue;
            };
            if revoked >= call.invoke {
                continue;
            }
            let regranted = changes.iter().any(|g| {
                g.kind == AuthorityKind::Grant
                    && g.key == call.key
                    && g.complete.unwrap_or(Tick::MAX) >= revoke.invoke
                    && g.invoke <= call_done
            });
            if !regranted {
                let how = match revoke.kind {
                    AuthorityKind::Unbind => "unbound",
                    _ => "revoked",
                };
                return Err(Violation::new(
                    Property::NoEffectAfterRevocation,
                    format!(
                        "a controller call invoked after its authority was {how} (done at {revoked}) \
                         was acknowledged ok"
                    ),
                    vec![
                        format!(
                            "change #{ri}: {:?} {:?} {}",
                            revoke.kind,
                            revoke.key,
                            window(revoke.invoke, revoke.complete)
                        ),
                        format!(
                            "call #{ci}: {:?} {} {} -> ok",
                            call.key,
                            call.verb,
                            window(call.invoke, call.complete)
                        ),
                    ],
                ));
            }
        }
    }
    Ok(())
}

/// The node's wall clock as the harness moved it, and what the node read
/// of it. Dates are in ms.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeClock {
    /// The date at tick 0.
    pub(crate) base: u64,
    /// Steps, in tick order: from this tick on, the date is
    /// `base + tick + offset`.
    pub(crate) steps: Vec<(Tick, i64)>,
    /// When the node started; a start forgets what the node read before.
    pub(crate) starts: Vec<Tick>,
    /// The node's reads: when, and the date it was given.
    pub(crate) reads: Vec<(Tick, u64)>,
}

impl NodeClock {
    /// The clock's date at `t`.
    pub(crate) fn date(&self, t: Tick) -> u64 {
        let offset = self
            .steps
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map_or(0, |(_, o)| *o);
        (i128::from(self.base) + i128::from(t) + i128::from(offset)).clamp(0, i128::from(u64::MAX))
            as u64
    }

    /// The least date the clock showed within `[from, to]`.
    fn least(&self, from: Tick, to: Tick) -> u64 {
        self.steps
            .iter()
            .filter(|(at, _)| *at > from && *at <= to)
            .map(|(at, _)| self.date(*at))
            .fold(self.date(from), u64::min)
    }

    /// The latest date the node read before `t` since its last start at
    /// or before `t` (reads in the start's own tick are left out: they may
    /// be the run before's).
    fn floor(&self, t: Tick) -> Option<(Tick, u64)> {
        let start = self.starts.iter().filter(|s| **s <= t).max().copied();
        self.reads
            .iter()
            .filter(|(at, _)| *at < t && start.is_none_or(|s| *at > s))
            .max_by_key(|(_, d)| *d)
            .copied()
    }
}

/// A token presented for `key` (the presentation invoked at `invoke`),
/// valid until the date `expires` (ms; at least its real expiry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Presented<K> {
    pub(crate) key: K,
    pub(crate) invoke: Tick,
    pub(crate) expires: u64,
}

/// No controller call needing a grant (its key has tokens presented) is
/// acknowledged ok when the date the node went by was past the expiry of
/// every token presented by then. That date is at least the clock's least
/// in the call's window, and at least the latest date the node had read
/// before the call in the same start: a clock set back must not make it
/// earlier, or an expired token would be valid again.
pub(crate) fn no_effect_after_expiry<K: Eq + Debug>(
    clock: &NodeClock,
    presented: &[Presented<K>],
    calls: &[ControllerCall<K>],
) -> Result<(), Violation> {
    for (ci, call) in calls.iter().enumerate() {
        if !call.acknowledged {
            continue;
        }
        let Some(done) = call.complete else {
            continue;
        };
        let Some((pi, latest)) = presented
            .iter()
            .enumerate()
            .filter(|(_, p)| p.key == call.key && p.invoke <= done)
            .max_by_key(|(_, p)| p.expires)
        else {
            continue;
        };
        let least = clock.least(call.invoke, done);
        let floor = clock.floor(call.invoke);
        let date = least.max(floor.map_or(0, |(_, d)| d));
        if date >= latest.expires {
            let mut records = vec![
                format!(
                    "token #{pi}: {:?} presented at {}, expires at date {}",
                    latest.key, latest.invoke, latest.expires
                ),
                format!(
                    "clock: least date {least} in the call's window{}",
                    floor.map_or(String::new(), |(at, d)| format!(
                        "; the node had read date {d} at {at}"
                    ))
                ),
            ];
            records.extend(
                clock
                    .steps
                    .iter()
                    .filter(|(at, _)| *at <= done)
                    .map(|(at, o)| format!("clock step at {at}: offset {o} ms")),
            );
            records.push(format!(
                "call #{ci}: {:?} {} {} -> ok",
                call.key,
                call.verb,
                window(call.invoke, call.complete)
            ));
            return Err(Violation::new(
                Property::NoEffectAfterExpiry,
                format!(
                    "a call acknowledged ok when the node's date was at least {date}, past the \
                     expiry of every token presented ({})",
                    latest.expires
                ),
                records,
            ));
        }
    }
    Ok(())
}

/// A read of one task's state (`core.tasks/get`, or a cancel's answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskRead<S> {
    pub(crate) invoke: Tick,
    pub(crate) complete: Option<Tick>,
    /// What it said: the seq of the task's last event and the task's
    /// state; `None` when it failed or its answer was lost.
    pub(crate) saw: Option<(u64, S)>,
}

/// Every read of a task names an event of its final `log` (a seq at most
/// the log's last), in the state that event gives the task (`state_is`;
/// not checked for events folded out of the log), and a read invoked
/// after another completed never sees an earlier seq: what a read shows
/// was durable and stays.
pub(crate) fn task_reads<E: Debug, S: Debug>(
    task: &str,
    log: &[Event<E>],
    reads: &[TaskRead<S>],
    state_is: impl Fn(&E, &S) -> bool,
) -> Result<(), Violation> {
    let last = log.last().map_or(0, |e| e.seq);
    let show = |i: usize, r: &TaskRead<S>| {
        format!(
            "read #{i}: {} -> {}",
            window(r.invoke, r.complete),
            match &r.saw {
                Some((seq, state)) => format!("seq {seq} {state:?}"),
                None => "no answer".into(),
            }
        )
    };
    for (i, r) in reads.iter().enumerate() {
        let Some((seq, state)) = &r.saw else {
            continue;
        };
        if *seq > last {
            return Err(Violation::new(
                Property::TaskReads,
                format!("task {task}: a read saw seq {seq}, past the log's last ({last})"),
                vec![show(i, r)],
            ));
        }
        if let Some(e) = log.iter().find(|e| e.seq == *seq)
            && !state_is(&e.kind, state)
        {
            return Err(Violation::new(
                Property::TaskReads,
                format!("task {task}: a read saw seq {seq} in a state its event does not give"),
                vec![show(i, r), format!("event seq {}: {:?}", e.seq, e.kind)],
            ));
        }
    }
    for (a, ra) in reads.iter().enumerate() {
        let (Some(done), Some((seen, _))) = (ra.complete, &ra.saw) else {
            continue;
        };
        for (b, rb) in reads.iter().enumerate() {
            if let Some((later, _)) = &rb.saw
                && rb.invoke > done
                && later < seen
            {
                return Err(Violation::new(
                    Property::TaskReads,
                    format!(
                        "task {task}: a read invoked after another completed saw an earlier seq"
                    ),
                    vec![show(a, ra), show(b, rb)],
                ));
            }
        }
    }
    Ok(())
}
