//! Classify + authorize one envelope header on a registry of 100
//! capabilities × 10 verbs. Target: ≤ 100 ns per envelope.
//!
//! Besides criterion's report, `cargo bench` prints the time per envelope
//! and its ratio to a baseline measured in the same run: one lookup of the
//! capability id in a `HashMap<String, _>`, the least any table lookup costs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use capwire_authz::{Binding, Decision, Gate, control_auth_class, decide};
use capwire_envelope::NodeId;
use capwire_manifest::{
    Capability, DeclaredClass, MonitoringHandlers, NodeInfo, Registry, VerbSpec, Version,
};
use criterion::{Criterion, Throughput};

const CAPS: usize = 100;
const VERBS: usize = 10;

fn registry() -> Registry<u32> {
    let mut b = Registry::builder(
        NodeInfo::new(NodeId::from_bytes([0; 32]), "bench"),
        MonitoringHandlers {
            bind: 0,
            disable: 1,
        },
    );
    let mut h = 2;
    // core.monitoring plus 99 app capabilities: 100 capabilities.
    for c in 0..CAPS - 1 {
        let mut cap = Capability::new(format!("app.capability_{c:03}"), Version::new(1, 0, 0));
        for v in 0..VERBS {
            let class = if v % 2 == 0 {
                DeclaredClass::Bootstrap
            } else {
                DeclaredClass::Controller
            };
            cap = cap.verb_spec(
                VerbSpec::request(format!("verb_{v}"))
                    .class(class)
                    .handler(h),
            );
            h += 1;
        }
        b = b.capability(cap);
    }
    b.build().unwrap()
}

/// A mix of envelope headers: declared bootstrap and controller verbs from
/// the control plane and from strangers, and undeclared names.
fn headers() -> Vec<(String, String, NodeId)> {
    let cp = NodeId::from_bytes([0xc0; 32]);
    let stranger = NodeId::from_bytes([0x0e; 32]);
    let mut out = Vec::new();
    for i in 0..1024usize {
        let c = (i * 37) % (CAPS - 1);
        let v = (i * 7) % VERBS;
        let sender = if i % 4 == 0 { stranger } else { cp };
        let (cap, verb) = match i % 8 {
            6 => (format!("app.capability_{c:03}"), format!("Verb_{v}")),
            7 => (format!("app.unknown_{c:03}"), format!("verb_{v}")),
            _ => (format!("app.capability_{c:03}"), format!("verb_{v}")),
        };
        out.push((cap, verb, sender));
    }
    out
}

fn run_decide(
    r: &Registry<u32>,
    gate: &Gate,
    binding: &Binding,
    hs: &[(String, String, NodeId)],
) -> u32 {
    let mut acc = 0u32;
    for (cap, verb, sender) in hs {
        match decide(r, gate, binding, sender, cap, verb) {
            Decision::Allowed(p) => acc = acc.wrapping_add(*p.handler()),
            Decision::Denied(reason) => acc = acc.wrapping_add(reason.code_str().len() as u32),
        }
    }
    acc
}

fn run_baseline(map: &HashMap<String, u32>, hs: &[(String, String, NodeId)]) -> u32 {
    let mut acc = 0u32;
    for (cap, _, _) in hs {
        acc = acc.wrapping_add(map.get(cap.as_str()).copied().unwrap_or(1));
    }
    acc
}

fn benches(c: &mut Criterion) {
    let r = registry();
    let gate = Gate::default();
    let binding = Binding::new(Some(NodeId::from_bytes([0xc0; 32])), 3);
    let hs = headers();
    let mut group = c.benchmark_group("chokepoint");
    group.throughput(Throughput::Elements(hs.len() as u64));
    group.bench_function("decide (classify + authorize)", |b| {
        b.iter(|| run_decide(black_box(&r), &gate, &binding, black_box(&hs)))
    });
    group.bench_function("control_auth_class", |b| {
        b.iter(|| {
            let mut acc = 0usize;
            for (cap, verb, _) in black_box(&hs) {
                acc += control_auth_class(&r, cap, verb) as usize;
            }
            acc
        })
    });
    let map: HashMap<String, u32> = (0..CAPS as u32)
        .map(|i| (format!("app.capability_{i:03}"), i))
        .collect();
    group.bench_function("baseline: one HashMap<String, _> lookup", |b| {
        b.iter(|| run_baseline(black_box(&map), black_box(&hs)))
    });
    group.finish();
}

/// Average nanoseconds per envelope of `f` over a batch of `n` envelopes.
fn per_envelope(n: usize, mut f: impl FnMut() -> u32) -> f64 {
    let mut sink = 0u32;
    for _ in 0..200 {
        sink = sink.wrapping_add(f());
    }
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < Duration::from_secs(2) {
        for _ in 0..100 {
            sink = sink.wrapping_add(f());
        }
        rounds += 100;
    }
    black_box(sink);
    start.elapsed().as_nanos() as f64 / (f64::from(rounds) * n as f64)
}

fn report() {
    let r = registry();
    let gate = Gate::default();
    let binding = Binding::new(Some(NodeId::from_bytes([0xc0; 32])), 3);
    let hs = headers();
    let map: HashMap<String, u32> = (0..CAPS as u32)
        .map(|i| (format!("app.capability_{i:03}"), i))
        .collect();
    let decide_ns = per_envelope(hs.len(), || {
        run_decide(black_box(&r), &gate, &binding, black_box(&hs))
    });
    let base_ns = per_envelope(hs.len(), || run_baseline(black_box(&map), black_box(&hs)));
    println!(
        "chokepoint: {} routes; decide = {decide_ns:.1} ns/envelope (target <= 100 ns); \
         baseline (one HashMap lookup) = {base_ns:.1} ns; ratio = {:.2}x",
        r.len(),
        decide_ns / base_ns
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        report();
    }
}
