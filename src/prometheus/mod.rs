//! The node's metrics for Prometheus: a [`Collector`] that reads the
//! node's snapshot ([`Node::stats`]) at scrape time, an encoder for the
//! Prometheus text format (version 0.0.4), and a small HTTP endpoint that
//! serves it on `GET /metrics`.
//!
//! ```
//! use capwire::Node;
//! use capwire::prometheus::MetricsServer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = Node::builder("metered").start().await?;
//! // Serves http://127.0.0.1:PORT/metrics until the node shuts down.
//! let server = MetricsServer::bind("127.0.0.1:0".parse()?, node.clone()).await?;
//! println!("metrics on http://{}/metrics", server.local_addr());
//!
//! // The same text, without HTTP:
//! let text = capwire::prometheus::encode(&node);
//! assert!(text.contains("capwire_sessions{direction=\"inbound\"} 0"));
//!
//! node.shutdown().await;
//! server.stopped().await;
//! # Ok(()) }
//! ```
//!
//! ```text
//!  scraper ── GET /metrics ──► MetricsServer / serve() ──► encode()
//!                                                            │
//!            NodeCollector::encode (at scrape time) ◄────────┘
//!                │ Node::stats(): atomics, a brief lock per session
//!                ▼
//!  capwire_calls_total{cap,verb,outcome}, capwire_sessions{direction}, ...
//! ```
//!
//! Every metric is named `capwire_*`. Label values come from a fixed set
//! (directions, reasons, outcomes, pools) or from the node's own registry
//! (capability and verb names the application registered); an envelope
//! whose (cap, verb) is not registered is counted under
//! `cap="unknown", verb="unknown"` (registered capabilities always start
//! with `core.` or `app.`), so a peer cannot add series.
//!
//! To serve the node's metrics beside an application's own, register a
//! [`NodeCollector`] in the application's
//! [`prometheus_client::registry::Registry`] (same major version of
//! `prometheus-client` as this crate).

mod http;

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::net::counters::Direction;
use crate::net::counters::HandshakeFailure;
use crate::node::Node;
use crate::stats::NodeStats;

pub use http::{MetricsServer, ServerLimits, serve, serve_with};

/// The `Content-Type` of what [`encode`] returns: the Prometheus text
/// format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The label value that stands for every capability and verb the node
/// has not registered.
pub const UNREGISTERED: &str = "unknown";

/// A [`Collector`] of one node's metrics: each scrape takes a fresh
/// [`Node::stats`] snapshot and encodes it.
///
/// ```
/// use capwire::Node;
/// use capwire::prometheus::NodeCollector;
/// use prometheus_client::registry::Registry;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = Node::builder("metered").start().await?;
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(NodeCollector::new(node.clone())));
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry)?;
/// assert!(text.contains("capwire_pending_calls 0"));
/// node.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NodeCollector {
    node: Node,
}

impl NodeCollector {
    /// A collector of `node`'s metrics. It keeps the node's state alive
    /// as long as it is registered.
    pub fn new(node: Node) -> Self {
        Self { node }
    }
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        write_stats(&self.node.stats(), &mut encoder)
    }
}

/// `node`'s metrics now, in the Prometheus text format (version 0.0.4,
/// [`CONTENT_TYPE`]).
pub fn encode(node: &Node) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(NodeCollector::new(node.clone())));
    encode_registry(&registry)
}

fn encode_registry(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail, and every value is a plain number.
    if prometheus_client::encoding::prometheus_text::encode(&mut text, registry).is_err() {
        tracing::warn!("metrics could not be encoded");
    }
    text
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: usize) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A family of labelled series of one type, from (labels, metric) pairs.
fn family<L, M>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result
where
    L: EncodeLabelSet,
    M: EncodeMetric,
{
    let mut family = enc.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge with one label.
fn gauges<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, usize)>,
) -> fmt::Result {
    family(
        enc,
        name,
        help,
        MetricType::Gauge,
        values
            .into_iter()
            .map(|(value, n)| ([(label, value)], ConstGauge::new(n))),
    )
}

/// Writes every metric of `s`.
fn write_stats(s: &NodeStats, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    family(
        enc,
        "capwire_calls",
        "Inbound control envelopes (requests and notifications) by capability, verb and outcome; unregistered names count under cap=\"unknown\", verb=\"unknown\".",
        MetricType::Counter,
        s.calls.rows.iter().map(|row| {
            let labels = [
                ("cap", row.cap.as_deref().unwrap_or(UNREGISTERED)),
                ("verb", row.verb.as_deref().unwrap_or(UNREGISTERED)),
                ("outcome", row.outcome.as_str()),
            ];
            (labels, ConstCounter::new(row.count))
        }),
    )?;

    gauges(
        enc,
        "capwire_sessions",
        "Sessions open now (hello exchanged, not yet ended), by who dialled.",
        "direction",
        Direction::ALL.map(|d| (d.as_str(), s.sessions(d))),
    )?;

    family(
        enc,
        "capwire_sessions_opened",
        "Sessions opened since the node started, by who dialled.",
        MetricType::Counter,
        Direction::ALL.map(|d| {
            (
                [("direction", d.as_str())],
                ConstCounter::new(s.sessions_opened(d)),
            )
        }),
    )?;

    gauges(
        enc,
        "capwire_handshakes_in_progress",
        "Noise handshakes in progress now, by who dialled.",
        "direction",
        Direction::ALL.map(|d| (d.as_str(), s.handshakes_in_progress(d))),
    )?;

    family(
        enc,
        "capwire_handshake_failures",
        "Connections that did not become a session, by who dialled and why (refused before the handshake, failed in it, or ended before the hello); only the reasons that can happen in a direction are listed for it.",
        MetricType::Counter,
        Direction::ALL.into_iter().flat_map(|d| {
            HandshakeFailure::ALL
                .into_iter()
                .filter(move |r| r.occurs(d))
                .map(move |r| {
                    let labels = [("direction", d.as_str()), ("reason", r.as_str())];
                    (labels, ConstCounter::new(s.handshake_failures(d, r)))
                })
        }),
    )?;

    let (used_in, used_out, used_reserved) = s.budget_used;
    gauges(
        enc,
        "capwire_session_budget_used",
        "Sessions counted against each session budget now (sessions waiting for their hello included).",
        "pool",
        [
            ("inbound", used_in),
            ("outbound", used_out),
            ("reserved", used_reserved),
        ],
    )?;
    let (max_in, max_out, max_reserved) = s.budget_limits;
    gauges(
        enc,
        "capwire_session_budget_limit",
        "The size of each session budget (max_inbound_sessions, max_outbound_sessions, reserved_sessions).",
        "pool",
        [
            ("inbound", max_in),
            ("outbound", max_out),
            ("reserved", max_reserved),
        ],
    )?;

    gauge(
        enc,
        "capwire_pending_calls",
        "Calls this node has waiting for an answer, over all sessions.",
        s.pending_calls,
    )?;
    gauge(
        enc,
        "capwire_inflight",
        "Peers' requests and notifications in flight here (running, or answered and waiting for the wire), over all sessions.",
        s.inflight,
    )?;
    gauge(
        enc,
        "capwire_queued_bytes",
        "Bytes of frames waiting to be sent, over all sessions.",
        s.queued_bytes,
    )?;

    let l = &s.ledger;
    gauges(
        enc,
        "capwire_ledger_entries",
        "Entries of the replay ledger: requests running, finished with their response remembered, and finished with the response released.",
        "state",
        [
            ("running", l.running),
            ("remembered", l.remembered),
            ("forgotten", l.forgotten),
        ],
    )?;
    gauge(
        enc,
        "capwire_ledger_bytes",
        "Bytes charged to the replay ledger (whole entries).",
        l.bytes,
    )?;
    gauge(
        enc,
        "capwire_ledger_senders",
        "Senders with a partition in the replay ledger.",
        l.senders,
    )?;

    counter(
        enc,
        "capwire_copies_sent",
        "Monitoring copies sent to the bound control plane.",
        s.copies_sent,
    )?;
    counter(
        enc,
        "capwire_copies_dropped",
        "Monitoring copies given up: queue full, control plane changed or unbound, or not reachable in time.",
        s.copies_dropped,
    )?;
    gauge(
        enc,
        "capwire_copies_queued",
        "Monitoring copies waiting to be sent.",
        s.copies_queued,
    )?;

    gauges(
        enc,
        "capwire_streams",
        "Streams open now: peers' streams this node serves, and this node's streams on peers.",
        "side",
        [("served", s.streams_served), ("called", s.streams_called)],
    )?;
    family(
        enc,
        "capwire_stream_items",
        "Stream items sent by this node's handlers, and received for this node's streams.",
        MetricType::Counter,
        [
            ("sent", s.stream_items_sent),
            ("received", s.stream_items_received),
        ]
        .map(|(way, n)| ([("direction", way)], ConstCounter::new(n))),
    )?;
    counter(
        enc,
        "capwire_stream_credit_stalls",
        "Times a handler serving a stream waited for its caller's credit (the consumer was slower than the producer).",
        s.stream_credit_stalls,
    )?;

    gauges(
        enc,
        "capwire_tasks",
        "Tasks this node keeps, by state.",
        "state",
        s.tasks.iter().map(|(state, n)| (state.as_str(), *n)),
    )?;
    counter(
        enc,
        "capwire_task_events",
        "Task events written (submits, state changes, progress, questions, answers, ends).",
        s.task_events,
    )?;
    counter(
        enc,
        "capwire_task_pushes_dropped",
        "Task state changes not pushed to the control plane: its queue was full.",
        s.task_pushes_dropped,
    )?;

    counter(
        enc,
        "capwire_grants_presented",
        "Grant tokens presented to this node and kept (core.grants/present).",
        s.grants_presented,
    )?;
    counter(
        enc,
        "capwire_grant_calls",
        "Controller calls a presented grant let through.",
        s.grant_calls,
    )?;
    family(
        enc,
        "capwire_grants_refused",
        "Grant presentations and delegated calls refused, by reason.",
        MetricType::Counter,
        s.grants_refused
            .iter()
            .map(|(reason, n)| ([("reason", *reason)], ConstCounter::new(*n))),
    )?;
    gauge(
        enc,
        "capwire_grant_holders",
        "Holders with grant tokens kept.",
        s.grant_holders,
    )?;
    gauge(
        enc,
        "capwire_grant_revocations",
        "Grant revocations kept.",
        s.grant_revocations,
    )?;
    counter(
        enc,
        "capwire_trace_contexts_accepted",
        "W3C trace contexts received with calls and believed.",
        s.trace_contexts_accepted,
    )?;
    family(
        enc,
        "capwire_trace_contexts_dropped",
        "Trace contexts dropped (the calls served without them), by reason.",
        MetricType::Counter,
        s.trace_contexts_dropped
            .iter()
            .map(|(reason, n)| ([("reason", *reason)], ConstCounter::new(*n))),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::metrics::{MetricRow, MetricsSnapshot, Outcome};

    #[derive(Debug)]
    struct Fixed(NodeStats);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
            write_stats(&self.0, &mut encoder)
        }
    }

    fn text_of(stats: NodeStats) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(stats)));
        encode_registry(&registry)
    }

    fn row(cap: Option<&str>, verb: Option<&str>, outcome: Outcome, count: u64) -> MetricRow {
        MetricRow {
            cap: cap.map(str::to_owned),
            verb: verb.map(str::to_owned),
            outcome,
            count,
        }
    }

    #[test]
    fn every_family_has_help_and_type_and_starts_at_zero() {
        let text = text_of(NodeStats::default());
        for family in [
            "capwire_calls_total counter",
            "capwire_sessions gauge",
            "capwire_sessions_opened_total counter",
            "capwire_handshakes_in_progress gauge",
            "capwire_handshake_failures_total counter",
            "capwire_session_budget_used gauge",
            "capwire_session_budget_limit gauge",
            "capwire_pending_calls gauge",
            "capwire_inflight gauge",
            "capwire_queued_bytes gauge",
            "capwire_ledger_entries gauge",
            "capwire_ledger_bytes gauge",
            "capwire_ledger_senders gauge",
            "capwire_copies_sent_total counter",
            "capwire_copies_dropped_total counter",
            "capwire_copies_queued gauge",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{text}"
            );
        }
        assert!(text.contains(
            "capwire_handshake_failures_total{direction=\"inbound\",reason=\"timeout\"} 0\n"
        ));
        assert!(text.contains("capwire_sessions{direction=\"outbound\"} 0\n"));
        assert!(text.contains("capwire_copies_dropped_total 0\n"));
        // No calls yet: no call series.
        assert!(!text.contains("capwire_calls_total{"));
        // Every sample line is `name{labels} value` or `name value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect(line);
            assert!(series.starts_with("capwire_"), "{line}");
            assert!(value.parse::<u64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn calls_are_labelled_and_unregistered_names_share_one_series() {
        let stats = NodeStats {
            calls: MetricsSnapshot {
                rows: vec![
                    row(Some("app.echo"), Some("say"), Outcome::Ok, 3),
                    row(Some("app.echo"), Some("admin"), Outcome::Unauthorized, 1),
                    row(None, None, Outcome::UnknownVerb, 7),
                ],
            },
            ..NodeStats::default()
        };
        let text = text_of(stats);
        assert!(
            text.contains("capwire_calls_total{cap=\"app.echo\",verb=\"say\",outcome=\"ok\"} 3\n"),
            "{text}"
        );
        assert!(text.contains(
            "capwire_calls_total{cap=\"app.echo\",verb=\"admin\",outcome=\"unauthorized\"} 1\n"
        ));
        assert!(text.contains(
            "capwire_calls_total{cap=\"unknown\",verb=\"unknown\",outcome=\"unknown_verb\"} 7\n"
        ));
        assert_eq!(text.matches("# TYPE capwire_calls_total").count(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        // Registered names cannot hold these characters; the encoder
        // escapes them all the same.
        let stats = NodeStats {
            calls: MetricsSnapshot {
                rows: vec![row(Some("app.\"x\"\n\\"), Some("v"), Outcome::Ok, 1)],
            },
            ..NodeStats::default()
        };
        let text = text_of(stats);
        assert!(
            text.contains(
                "capwire_calls_total{cap=\"app.\\\"x\\\"\\n\\\\\",verb=\"v\",outcome=\"ok\"} 1\n"
            ),
            "{text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("capwire_calls_total"))
                .count(),
            1
        );
    }

    #[test]
    fn gauges_and_counters_carry_their_values() {
        let mut stats = NodeStats {
            pending_calls: 2,
            inflight: 5,
            queued_bytes: 1234,
            copies_sent: 9,
            copies_dropped: 4,
            copies_queued: 1,
            budget_used: (1, 2, 3),
            budget_limits: (1024, 256, 32),
            ..NodeStats::default()
        };
        stats.ledger.running = 6;
        stats.ledger.bytes = 4096;
        let text = text_of(stats);
        for line in [
            "capwire_pending_calls 2",
            "capwire_inflight 5",
            "capwire_queued_bytes 1234",
            "capwire_copies_sent_total 9",
            "capwire_copies_dropped_total 4",
            "capwire_copies_queued 1",
            "capwire_session_budget_used{pool=\"reserved\"} 3",
            "capwire_session_budget_limit{pool=\"outbound\"} 256",
            "capwire_ledger_entries{state=\"running\"} 6",
            "capwire_ledger_bytes 4096",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}:\n{text}");
        }
    }
}
