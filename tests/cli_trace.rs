//! The `capwire` command's traces end to end: `capwire node` and
//! `capwire ctl` export their call spans over OTLP/HTTP (protobuf) to a
//! receiver in this test, which decodes each request and keeps the spans
//! with their resource's `service.name`. One `ctl call --trace` is one
//! trace across both processes; `ctl watch` names the trace of the calls
//! it sees; with export off (or asked of an exporter the command does not
//! have) nothing is sent and the call works as before.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cli_support::{
    NodeProc, Out, START_DEADLINE, Spawned, assert_ok, capwire, poll, run_cmd, tempdir,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use prost::Message as _;

/// One span the receiver got, with the `service.name` of its resource.
#[derive(Clone, Debug)]
struct Got {
    service: String,
    span: Span,
}

impl Got {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    fn parent(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    fn kind(&self) -> SpanKind {
        SpanKind::try_from(self.span.kind).unwrap_or(SpanKind::Unspecified)
    }

    /// The attribute `key` as text (`None` when the span has none).
    fn attr(&self, key: &str) -> Option<String> {
        value_of(&self.span.attributes, key)
    }

    fn summary(&self) -> String {
        format!(
            "{} {:?} {:?} trace={} span={} parent={}",
            self.service,
            self.span.name,
            self.kind(),
            self.trace_id(),
            self.span_id(),
            self.parent()
        )
    }
}

/// What the receiver saw: the spans, how many connections were made to
/// it, and whatever was wrong with a request.
#[derive(Default)]
struct Seen {
    spans: Vec<Got>,
    connections: usize,
    faults: Vec<String>,
}

/// An OTLP/HTTP receiver on 127.0.0.1: `POST /v1/traces` with an
/// `ExportTraceServiceRequest` in protobuf, answered 200 with an empty
/// `ExportTraceServiceResponse`. Each request is recorded before it is
/// answered, so what an exited process sent is all here.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the receiver binds");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                seen2.lock().unwrap().connections += 1;
                let seen = Arc::clone(&seen2);
                std::thread::spawn(move || serve(stream, &seen));
            }
        });
        Receiver { addr, seen, stop }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT`'s value for this receiver.
    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Got> {
        self.seen.lock().unwrap().spans.clone()
    }

    fn connections(&self) -> usize {
        self.seen.lock().unwrap().connections
    }

    /// Panics if a request was not what an OTLP/HTTP exporter sends.
    fn assert_no_faults(&self) {
        let faults = self.seen.lock().unwrap().faults.clone();
        assert!(
            faults.is_empty(),
            "bad requests to the receiver: {faults:#?}"
        );
    }

    /// The spans of trace `trace_id`, once `enough` accepts them (within
    /// 10 s).
    fn wait_trace(&self, trace_id: &str, enough: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let mut last = Vec::new();
        let found = poll_or_none(Duration::from_secs(10), || {
            last = self
                .spans()
                .into_iter()
                .filter(|g| g.trace_id() == trace_id)
                .collect::<Vec<_>>();
            enough(&last).then(|| last.clone())
        });
        found.unwrap_or_else(|| {
            panic!(
                "the receiver did not get the spans of trace {trace_id} within 10 s\n\
                 of that trace: {:#?}\nall: {:#?}",
                last.iter().map(Got::summary).collect::<Vec<_>>(),
                self.spans().iter().map(Got::summary).collect::<Vec<_>>()
            )
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Like [`poll`], but `None` at the deadline instead of a panic.
fn poll_or_none<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Serves one connection's requests (HTTP/1.1, kept alive) until it ends.
fn serve(stream: TcpStream, seen: &Mutex<Seen>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = stream.try_clone().expect("the stream clones");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match reader.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let request_line = request_line.trim_end().to_owned();
        let mut length = None;
        let mut chunked = false;
        let mut content_type = String::new();
        let mut encoding = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "content-type" => content_type = value.to_owned(),
                "content-encoding" => encoding = value.to_owned(),
                _ => {}
            }
        }
        let body = if chunked {
            match read_chunked(&mut reader) {
                Some(b) => b,
                None => return,
            }
        } else {
            let mut body = vec![0; length.unwrap_or(0)];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            body
        };
        let status = answer(seen, &request_line, &content_type, &encoding, &body);
        let reply = if status == 200 {
            ExportTraceServiceResponse::default().encode_to_vec()
        } else {
            Vec::new()
        };
        let head = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {}\r\n\r\n",
            if status == 200 { "OK" } else { "Bad Request" },
            reply.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(&reply).is_err() {
            return;
        }
    }
}

/// A chunked body, or `None` if the connection ended in it.
fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        if reader.read_line(&mut size).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        if size == 0 {
            // The CRLF after the last chunk (no trailers are sent).
            return Some(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

/// Records one request; the status to answer it with.
fn answer(
    seen: &Mutex<Seen>,
    request_line: &str,
    content_type: &str,
    encoding: &str,
    body: &[u8],
) -> u16 {
    let mut seen = seen.lock().unwrap();
    if !request_line.starts_with("POST /v1/traces ") {
        seen.faults
            .push(format!("unexpected request: {request_line:?}"));
        return 400;
    }
    if content_type != "application/x-protobuf" {
        seen.faults.push(format!("content-type {content_type:?}"));
        return 400;
    }
    if !encoding.is_empty() {
        seen.faults.push(format!("content-encoding {encoding:?}"));
        return 400;
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => {
            seen.faults.push(format!(
                "not an ExportTraceServiceRequest ({} bytes): {e}",
                body.len()
            ));
            return 400;
        }
    };
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| value_of(&r.attributes, "service.name"))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                seen.spans.push(Got {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    200
}

/// The attribute `key` among `attrs`, as text.
fn value_of(attrs: &[KeyValue], key: &str) -> Option<String> {
    let kv = attrs.iter().find(|kv| kv.key == key)?;
    Some(match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_trace_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && s.bytes().any(|b| b != b'0')
}

/// A `capwire` command with no `OTEL_*` variable of the test's own
/// environment, and the ones given.
fn command(otel: &[(&str, &str)]) -> Command {
    let mut cmd = capwire();
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(name);
        }
    }
    for (name, value) in otel {
        cmd.env(name, value);
    }
    cmd
}

/// The variables that send a process's spans to `rx`, soon.
fn export_to(rx: &Receiver) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ]
}

fn borrowed<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    vars.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Starts `capwire node --json --name NAME` with the `otel` variables
/// (as `NodeProc::start` does, with an environment of its own).
fn start_node(name: &str, otel: &[(&str, &str)]) -> NodeProc {
    let mut cmd = command(otel);
    cmd.args(["node", "--json", "--name", name]);
    let mut proc = Spawned::start(cmd, &format!("node {name}"));
    let first = proc.wait_record(START_DEADLINE, "its startup line", |r| {
        r.get("node_id").is_some()
    });
    let id = first["node_id"].as_str().unwrap().to_owned();
    let addr = first["addrs"][0].as_str().unwrap().to_owned();
    let invite = first["invite"].as_str().map(str::to_owned);
    NodeProc {
        proc,
        id,
        addr,
        invite,
        metrics: None,
    }
}

/// Runs `capwire ctl --state STATE args...` with the `otel` variables.
fn ctl_env(state: &Path, otel: &[(&str, &str)], args: &[&str]) -> Out {
    let mut cmd = command(otel);
    cmd.arg("ctl").arg("--state").arg(state).args(args);
    run_cmd(cmd, &format!("ctl {}", args.join(" ")))
}

/// Runs `capwire ctl` with no `OTEL_*` variable; panics unless it
/// succeeds quietly.
fn ctl_plain(state: &Path, args: &[&str]) -> Out {
    let out = ctl_env(state, &[], args);
    assert_ok(&out);
    out
}

/// The one span in `spans` that `pred` accepts.
fn the<'a>(spans: &'a [Got], what: &str, pred: impl Fn(&Got) -> bool) -> &'a Got {
    let found: Vec<&Got> = spans.iter().filter(|g| pred(g)).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {what} in the trace: {:#?}",
        spans.iter().map(Got::summary).collect::<Vec<_>>()
    );
    found[0]
}

#[test]
fn a_ctl_call_and_the_node_it_reaches_export_one_trace() {
    let rx = Receiver::start();
    let export = export_to(&rx);
    let export = borrowed(&export);
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let node = start_node("alpha", &export);
    ctl_plain(&cp, &["bind", node.invite()]);
    let me = ctl_plain(&cp, &["--json", "peers"]).record()["me"]
        .as_str()
        .unwrap()
        .to_owned();

    let out = ctl_env(
        &cp,
        &export,
        &[
            "--json",
            "call",
            "--trace",
            "alpha",
            "app.agent",
            "echo",
            "--args",
            "\"hi\"",
        ],
    );
    assert_ok(&out);
    let records = out.records();
    assert_eq!(
        records.len(),
        2,
        "the trace record, then the result: {out:#?}"
    );
    let trace = &records[0];
    assert_eq!(
        trace["kind"], "trace",
        "the trace record comes first: {out:#?}"
    );
    let trace_id = trace["trace_id"].as_str().unwrap().to_owned();
    assert!(is_trace_id(&trace_id), "{trace}");
    let traceparent = trace["traceparent"].as_str().unwrap().to_owned();
    assert!(
        records[1].to_string().contains("hi"),
        "the echo's answer: {out:#?}"
    );

    // The node's batch is flushed when it stops.
    node.stop(Duration::from_secs(10));
    let spans = rx.wait_trace(&trace_id, |s| {
        s.iter()
            .any(|g| g.service == "capwire-node" && g.kind() == SpanKind::Server)
            && s.iter().any(|g| g.kind() == SpanKind::Client)
            && s.iter().any(|g| g.span.name.starts_with("ctl call"))
    });
    rx.assert_no_faults();

    let root = the(&spans, "ctl root span", |g| {
        g.span.name == "ctl call app.agent/echo"
    });
    assert_eq!(root.service, "capwire-ctl", "{}", root.summary());
    assert_eq!(
        root.parent(),
        "",
        "the root has no parent: {}",
        root.summary()
    );
    assert_eq!(root.kind(), SpanKind::Internal, "{}", root.summary());
    assert_eq!(
        traceparent,
        format!("00-{trace_id}-{}-01", root.span_id()),
        "the printed traceparent names the root span"
    );

    let client = the(&spans, "client span", |g| g.kind() == SpanKind::Client);
    assert_eq!(client.service, "capwire-ctl", "{}", client.summary());
    assert_eq!(client.span.name, "app.agent/echo", "{}", client.summary());
    assert_eq!(
        client.parent(),
        root.span_id(),
        "the client span is the root's child: {}",
        client.summary()
    );
    assert_eq!(client.attr("capwire.outcome").as_deref(), Some("ok"));

    let server = the(&spans, "server span", |g| g.kind() == SpanKind::Server);
    assert_eq!(server.service, "capwire-node", "{}", server.summary());
    assert_eq!(server.span.name, "app.agent/echo", "{}", server.summary());
    assert_eq!(
        server.parent(),
        client.span_id(),
        "the server span is the client span's child: {}",
        server.summary()
    );
    for (key, want) in [
        ("capwire.outcome", "ok"),
        ("capwire.class", "bootstrap"),
        ("rpc.service", "app.agent"),
        ("rpc.method", "echo"),
        ("capwire.peer", me.as_str()),
    ] {
        assert_eq!(
            server.attr(key).as_deref(),
            Some(want),
            "{key} of the server span: {:#?}",
            server.span.attributes
        );
    }
    assert_eq!(
        spans.len(),
        3,
        "the trace is the root, the client span and the server span: {:#?}",
        spans.iter().map(Got::summary).collect::<Vec<_>>()
    );
}

#[test]
fn watch_names_the_trace_of_a_traced_call_and_none_of_an_untraced_one() {
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    let stranger = tmp.path().join("stranger");
    let node = start_node("alpha", &[]);
    ctl_plain(&cp, &["bind", node.invite()]);

    // The owner's watch in JSON, and a text watch handed to it.
    let mut cmd = command(&[]);
    cmd.args(["ctl", "--json", "--state"]).arg(&cp).arg("watch");
    let mut watch = Spawned::start(cmd, "ctl watch");
    watch.wait_record(Duration::from_secs(10), "connected to alpha", |r| {
        r["kind"] == "connected" && r["peer"] == "alpha"
    });
    let mut cmd = command(&[]);
    cmd.args(["ctl", "--state"]).arg(&cp).arg("watch");
    let mut text = Spawned::start(cmd, "a forwarded text watch");
    text.wait_line(Duration::from_secs(10), "connected to alpha", |l| {
        l == "connected to alpha"
    });

    // Another control identity calls the node, with and without a trace.
    let out = ctl_plain(
        &stranger,
        &[
            "--json",
            "call",
            "--trace",
            node.invite(),
            "app.agent",
            "echo",
            "--args",
            "\"traced\"",
        ],
    );
    let first = &out.records()[0];
    assert_eq!(first["kind"], "trace", "{out:#?}");
    let trace_id = first["trace_id"].as_str().unwrap().to_owned();
    assert!(is_trace_id(&trace_id), "{first}");
    ctl_plain(
        &stranger,
        &[
            "call",
            node.invite(),
            "app.agent",
            "echo",
            "--args",
            "\"plain\"",
        ],
    );

    let traced = watch.wait_record(
        Duration::from_secs(10),
        "the copy of the traced echo",
        |r| r["kind"] == "copy" && r["verb"] == "echo" && r["body"] == "traced",
    );
    assert_eq!(traced["trace"], trace_id.as_str(), "{traced}");
    let plain = watch.wait_record(Duration::from_secs(10), "the copy of the plain echo", |r| {
        r["kind"] == "copy" && r["verb"] == "echo" && r["body"] == "plain"
    });
    assert!(
        plain["trace"].is_null(),
        "no trace on an untraced call: {plain}"
    );

    let traced = text.wait_line(Duration::from_secs(10), "the traced echo's line", |l| {
        l.contains("app.agent/echo") && l.contains("traced")
    });
    assert!(
        traced.contains(&format!(" trace={trace_id}")),
        "the line names the trace: {traced:?}"
    );
    let plain = text.wait_line(Duration::from_secs(10), "the plain echo's line", |l| {
        l.contains("app.agent/echo") && l.contains("plain")
    });
    assert!(
        !plain.contains("trace="),
        "no trace on an untraced call: {plain:?}"
    );

    watch.signal("INT");
    assert!(watch.wait_exit(Duration::from_secs(5)).success());
}

#[test]
fn with_export_off_or_unsupported_nothing_is_sent_and_calls_still_work() {
    let rx = Receiver::start();
    let endpoint = rx.endpoint();
    let tmp = tempdir();
    let cp = tmp.path().join("ctl");
    // A node told where the receiver is, but with the SDK disabled.
    let node = start_node(
        "alpha",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    );
    ctl_plain(&cp, &["bind", node.invite()]);

    let call = [
        "call",
        "--trace",
        "alpha",
        "app.agent",
        "echo",
        "--args",
        "\"hi\"",
    ];
    let check = |out: &Out, what: &str| {
        assert_eq!(out.code, 0, "{what}: the call succeeds: {out:#?}");
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines.len(),
            2,
            "{what}: the trace, then the answer: {out:#?}"
        );
        let id = lines[0]
            .strip_prefix("trace ")
            .unwrap_or_else(|| panic!("{what}: the trace id comes first: {out:#?}"));
        assert!(is_trace_id(id), "{what}: {:?}", lines[0]);
        assert_eq!(lines[1], "alpha: hi", "{what}: {out:#?}");
    };

    // No OTEL variable at all.
    let out = ctl_env(&cp, &[], &call);
    assert_ok(&out);
    check(&out, "no OTEL variable");

    // An endpoint, with export turned off either way.
    for off in [
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_SDK_DISABLED", "true"),
    ] {
        let out = ctl_env(
            &cp,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), off],
            &call,
        );
        assert_ok(&out);
        check(&out, &format!("{}={}", off.0, off.1));
    }

    // An exporter the command does not have: said on stderr, and the call
    // goes on.
    let out = ctl_env(
        &cp,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_EXPORTER", "bogus"),
        ],
        &call,
    );
    check(&out, "OTEL_TRACES_EXPORTER=bogus");
    cli_support::assert_no_panic(&out);
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(said.len(), 1, "one line on stderr: {out:#?}");
    assert!(
        said[0].starts_with("capwire: ") && said[0].contains("OTEL_TRACES_EXPORTER=bogus"),
        "the line names the setting: {:?}",
        said[0]
    );

    // Every process has exited (so would have flushed): nothing came.
    node.stop(Duration::from_secs(10));
    assert_eq!(
        rx.connections(),
        0,
        "nothing may reach the receiver: {:#?}",
        rx.spans().iter().map(Got::summary).collect::<Vec<_>>()
    );
    assert!(rx.spans().is_empty());
}

#[test]
fn the_receiver_answers_what_an_exporter_sends() {
    // The receiver itself: a request it does not expect is a fault, a
    // well-formed export is decoded and answered 200.
    let rx = Receiver::start();
    let mut stream = TcpStream::connect(rx.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let body = ExportTraceServiceRequest::default().encode_to_vec();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
    rx.assert_no_faults();
    poll(Duration::from_secs(5), "the connection counted", || {
        (rx.connections() == 1).then_some(())
    });
}
