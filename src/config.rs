//! Runtime limits and defaults.

use std::time::Duration;

/// Limits and timings of a node. Every queue and table a peer can fill is
/// bounded by one of these; [`Limits::validate`] checks that they can work
/// together (the node builder calls it).
///
/// What one peer can cost a node at most, with these limits: one session
/// (two while a replacement takes over); `max_inflight_per_session` jobs
/// running; `max_queued_bytes_per_session` of frames waiting for the wire
/// plus the responses of its running jobs; `max_parked_bytes_per_session`
/// of notifications waiting for a slot; its ledger partition,
/// `replay_sender_max_bytes`; and one read buffer of about 66 KiB while it
/// sends. A peer that stops reading is closed after `write_timeout`.
///
/// ```
/// use capwire::Limits;
/// let limits = Limits { max_inflight_per_session: 256, ..Limits::default() };
/// assert!(limits.validate().is_ok());
/// assert_eq!(limits.default_deadline.as_secs(), 30);
/// let broken = Limits { max_inflight_per_session: 0, ..Limits::default() };
/// assert!(broken.validate().is_err());
/// // A lost contact redialled at once, in a loop, is refused too.
/// let busy = Limits { reconnect_initial: std::time::Duration::ZERO, ..Limits::default() };
/// assert!(busy.validate().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests and notifications from one session that may be in flight
    /// at once (running, or answered and waiting for the wire); more
    /// requests are answered `overloaded`, more notifications wait for a
    /// slot. Default 1024.
    pub max_inflight_per_session: usize,
    /// Calls this node may have waiting for answers on one session; more
    /// fail locally with `Overloaded`. Default 65536.
    pub max_pending_calls_per_session: usize,
    /// Bytes of frames one session may have waiting to be sent. Beyond it,
    /// callers wait (within their deadline) and the session stops reading
    /// from the peer until the peer takes what it asked for. Default 8 MiB.
    pub max_queued_bytes_per_session: usize,
    /// Bytes of notifications one session may have waiting for a slot
    /// while reading goes on; beyond it the session stops reading from
    /// the peer. Default 1 MiB.
    pub max_parked_bytes_per_session: usize,
    /// A peer that takes none of our bytes for this long, while we have
    /// some for it, is dropped (its calls fail). Default 30 s.
    pub write_timeout: Duration,
    /// Deadline of a call that does not set one. Default 30 s.
    pub default_deadline: Duration,
    /// Longest budget a handler is given, whatever the caller asks. Default 300 s.
    pub max_handler_time: Duration,
    /// How long finished requests are remembered for replay. Default 120 s.
    pub replay_window: Duration,
    /// Bytes the replay ledger may use in all, counting each entry's whole
    /// cost. Default 64 MiB.
    pub replay_max_bytes: usize,
    /// Bytes one sender's part of the replay ledger may use. Beyond it the
    /// sender's own oldest responses are released (their requests stay
    /// known and are answered `duplicate`); a sender whose released
    /// entries alone fill it is answered `overloaded`. Default 16 MiB.
    pub replay_sender_max_bytes: usize,
    /// Time for the peer's hello after the handshake. Default 10 s.
    pub hello_timeout: Duration,
    /// Time for a whole `connect`: dialling, handshake and hello. Default 10 s.
    pub connect_timeout: Duration,
    /// Sessions the peers dialled. Default 1024.
    pub max_inbound_sessions: usize,
    /// Sessions this node dialled. Default 256.
    pub max_outbound_sessions: usize,
    /// Extra sessions kept for contacts and the bound control plane when
    /// the budget of their direction is used up. Default 32.
    pub reserved_sessions: usize,
    /// Inbound handshakes from one source address at once; more are
    /// answered "busy". Default 16.
    pub max_handshakes_per_source: usize,
    /// Inbound connections accepted per second, on average; more are
    /// answered "busy". Default 1000.
    pub accept_rate: u32,
    /// Inbound connections accepted at once above the rate. Default 256.
    pub accept_burst: u32,
    /// Graceful shutdown waits this long for running handlers before it
    /// cancels them. Default 5 s.
    pub shutdown_grace: Duration,
    /// Once a session is closing, it is dropped after this long whatever
    /// the peer does. Default 1 s.
    pub close_timeout: Duration,
    /// First delay before redialling a contact. Default 100 ms.
    pub reconnect_initial: Duration,
    /// Longest delay between redials. Default 30 s.
    pub reconnect_max: Duration,
    /// How long the answers of state-changing controller requests
    /// (`set_config`, `introduce`, `create`, ...) are remembered in the
    /// store, across restarts; within it a retried request gets the
    /// remembered answer and is not applied again. Each sender's share is
    /// bounded by `replay_sender_max_bytes`. Default 1 h.
    pub durable_replay_window: Duration,
    /// Children `core.cluster` may have at once (pending creates
    /// included). Default 64.
    pub max_children: usize,
    /// Time the child host has for one operation (start a child, stop it,
    /// open a bind on it); a create not running by then is answered
    /// `timeout` and undone. Default 30 s.
    pub host_timeout: Duration,
    /// Monitoring copies waiting to be sent to the control plane; beyond
    /// it, copies are dropped and the gap is reported. Default 1024.
    pub copy_queue_len: usize,
    /// Bytes of monitoring copies waiting to be sent. Default 4 MiB.
    pub copy_queue_bytes: usize,
    /// Args larger than this are left out of a monitoring copy (it says
    /// `truncated` and the length). Default 32 KiB, so that a copy always
    /// fits the smallest record a control plane may accept (64 KiB).
    pub copy_body_max: usize,
    /// Items a stream this node calls may have on their way or waiting to
    /// be taken at once: its window, granted to the callee as it starts and
    /// again as the caller takes items. Default 4096: the smallest window
    /// within about 5% of the best throughput of 64 B items, measured from
    /// 32 to 16384 (`benches/streams.rs`); 256 gets about 60% of it, each
    /// grant being a trip through both nodes' tasks. (For items of 64 B,
    /// `stream_window_bytes` binds first, at 3971.)
    pub stream_window_items: u32,
    /// Bytes of items (each item's encoded value) a stream this node calls
    /// may have on their way or waiting at once; no one item may be larger.
    /// Default 256 KiB: what one stream may buffer, so that a session's
    /// 64 MiB of windows holds 256 streams. For 64 KiB items (three fit)
    /// it gets 70-96% of the best throughput measured from 128 KiB to
    /// 8 MiB (`benches/streams.rs`); 512 KiB gets within 5% of it, but a
    /// session would then hold only 128 streams.
    pub stream_window_bytes: u32,
    /// Bytes of window the streams this node calls on one session may hold
    /// in all: the most their items can buffer. A stream beyond it fails
    /// locally with `Overloaded`. Default 64 MiB.
    pub max_stream_window_bytes_per_session: usize,
    /// The longest a stream may go without an item: a caller waiting
    /// longer for the next item (or the end) gives up and cancels it
    /// (`CallError::Idle`), and a handler waiting longer for credit to
    /// send one is stopped and the stream ended with `timeout`. Default
    /// 60 s.
    pub stream_idle_timeout: Duration,
    /// Tasks the node keeps in all, running or ended (until their
    /// retention passes): a submit beyond it is refused `overloaded`.
    /// An ended task costs about 5 KiB of heap, one whose handler waits
    /// for an answer about 6.5 KiB (benches/memory.rs); its args and
    /// events stay in the store. Default 10,000.
    pub max_tasks: usize,
    /// Tasks one submitter may have kept at once. Default 1,000.
    pub max_tasks_per_sender: usize,
    /// Events kept per task: past it, the oldest are deleted (the task's
    /// info keeps its last progress, its question and its result).
    /// Default 1,024.
    pub max_task_events: u64,
    /// The largest body of a task event (args, progress, question,
    /// answer, result), encoded. Default 64 KiB.
    pub max_task_body: usize,
    /// How long an ended task is kept, with its events, for its submitter
    /// and the control plane to read. Default 24 h.
    pub task_retention: Duration,
    /// Keep the audit log (WIRE.md 5.6): every decision of the chokepoint
    /// and every change of state, provable to the control plane. Off, the
    /// node records nothing and `core.audit` answers an empty log. Default
    /// on.
    pub audit: bool,
    /// The audit log's disk budget, in bytes: past it the oldest entries
    /// are pruned, and the log records that it pruned them. At least
    /// 1 MiB. Default 256 MiB (about a million entries). A node without a
    /// state directory keeps its log in memory, within at most 16 MiB.
    pub audit_max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_inflight_per_session: 1024,
            max_pending_calls_per_session: 65536,
            max_queued_bytes_per_session: 8 << 20,
            max_parked_bytes_per_session: 1 << 20,
            write_timeout: Duration::from_secs(30),
            default_deadline: Duration::from_secs(30),
            max_handler_time: Duration::from_secs(300),
            replay_window: Duration::from_secs(120),
            replay_max_bytes: 64 << 20,
            replay_sender_max_bytes: 16 << 20,
            hello_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_inbound_sessions: 1024,
            max_outbound_sessions: 256,
            reserved_sessions: 32,
            max_handshakes_per_source: 16,
            accept_rate: 1000,
            accept_burst: 256,
            shutdown_grace: Duration::from_secs(5),
            close_timeout: Duration::from_secs(1),
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
            durable_replay_window: Duration::from_secs(3600),
            max_children: 64,
            host_timeout: Duration::from_secs(30),
            copy_queue_len: 1024,
            copy_queue_bytes: 4 << 20,
            copy_body_max: 32 << 10,
            stream_window_items: 4096,
            stream_window_bytes: 256 << 10,
            max_stream_window_bytes_per_session: 64 << 20,
            stream_idle_timeout: Duration::from_secs(60),
            max_tasks: 10_000,
            max_tasks_per_sender: 1_000,
            max_task_events: 1_024,
            max_task_body: 64 << 10,
            task_retention: Duration::from_secs(86_400),
            audit: true,
            audit_max_bytes: 256 << 20,
        }
    }
}

/// The smallest audit budget ([`Limits::audit_max_bytes`]): room for a
/// few segments of the log.
pub const MIN_AUDIT_BUDGET: u64 = 1 << 20;

/// The longest any duration setting may be: ten years. Longer values
/// would overflow clock arithmetic.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

impl Limits {
    /// Checks that the values can work together.
    ///
    /// # Errors
    /// A message naming the first problem.
    pub fn validate(&self) -> Result<(), String> {
        let counts = [
            ("max_inflight_per_session", self.max_inflight_per_session),
            (
                "max_pending_calls_per_session",
                self.max_pending_calls_per_session,
            ),
            (
                "max_queued_bytes_per_session",
                self.max_queued_bytes_per_session,
            ),
            (
                "max_parked_bytes_per_session",
                self.max_parked_bytes_per_session,
            ),
            ("replay_max_bytes", self.replay_max_bytes),
            ("replay_sender_max_bytes", self.replay_sender_max_bytes),
            ("max_inbound_sessions", self.max_inbound_sessions),
            ("max_outbound_sessions", self.max_outbound_sessions),
            ("max_handshakes_per_source", self.max_handshakes_per_source),
            ("copy_queue_len", self.copy_queue_len),
            ("copy_queue_bytes", self.copy_queue_bytes),
            ("max_tasks", self.max_tasks),
            ("max_tasks_per_sender", self.max_tasks_per_sender),
            ("max_task_body", self.max_task_body),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.audit_max_bytes < MIN_AUDIT_BUDGET {
            return Err("audit_max_bytes must be at least 1 MiB".into());
        }
        if self.accept_rate == 0 || self.accept_burst == 0 {
            return Err("accept_rate and accept_burst must be at least 1".into());
        }
        let durations = [
            ("write_timeout", self.write_timeout),
            ("default_deadline", self.default_deadline),
            ("max_handler_time", self.max_handler_time),
            ("replay_window", self.replay_window),
            ("hello_timeout", self.hello_timeout),
            ("connect_timeout", self.connect_timeout),
            ("shutdown_grace", self.shutdown_grace),
            ("close_timeout", self.close_timeout),
            ("reconnect_initial", self.reconnect_initial),
            ("reconnect_max", self.reconnect_max),
            ("durable_replay_window", self.durable_replay_window),
            ("host_timeout", self.host_timeout),
            ("stream_idle_timeout", self.stream_idle_timeout),
            ("task_retention", self.task_retention),
        ];
        for (name, value) in durations {
            if value > MAX_DURATION {
                return Err(format!("{name} must be at most ten years"));
            }
        }
        for (name, value) in [
            ("write_timeout", self.write_timeout),
            ("hello_timeout", self.hello_timeout),
            ("connect_timeout", self.connect_timeout),
            ("close_timeout", self.close_timeout),
            ("replay_window", self.replay_window),
            ("host_timeout", self.host_timeout),
            // A contact lost is dialled again after this: 0 would redial in
            // a tight loop.
            ("reconnect_initial", self.reconnect_initial),
            ("stream_idle_timeout", self.stream_idle_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.stream_window_items == 0 || self.stream_window_bytes == 0 {
            return Err("stream_window_items and stream_window_bytes must be at least 1".into());
        }
        if (self.stream_window_bytes as usize) > self.max_stream_window_bytes_per_session {
            return Err(
                "stream_window_bytes must not exceed max_stream_window_bytes_per_session".into(),
            );
        }
        if self.max_task_events < 2 {
            // A task's first and last events are kept whatever happens.
            return Err("max_task_events must be at least 2".into());
        }
        if self.reconnect_initial > self.reconnect_max {
            return Err("reconnect_initial must not exceed reconnect_max".into());
        }
        Ok(())
    }
}
