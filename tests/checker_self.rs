//! The history checker (`tests/support/checker.rs`) checked: histories it
//! must accept, histories it must reject with the records that show why,
//! the shrinking of a linearizability violation to the operations needed,
//! and randomized histories: linearizable by construction (accepted), the
//! same with one read made observably wrong (rejected), and small random
//! ones whose verdict is compared with an exhaustive search.
//!
//! The randomized tests print their seeds and timings with
//! `-- --nocapture`; `CHECKER_SEEDS=n` runs n seeds instead of the default.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/checker.rs"]
mod checker;

use std::time::{Duration, Instant};

use checker::{
    Answer, AuthorityChange, AuthorityKind, ControllerCall, Event, Execution, History, LinOptions,
    Model, NodeClock, Op, Outcome, Presented, Property, RegInput, RegOutput, Register, Request,
    SearchResult, Segment, SegmentEnd, TaskRead, Verdict, Violation,
};

// ---------------------------------------------------------------------------
// Register histories, written by hand
// ---------------------------------------------------------------------------

type RegOp = Op<RegInput<u32>, RegOutput<u32>>;

fn get(client: u64, t: (u64, u64), version: u64, value: u32) -> RegOp {
    Op::ok(
        client,
        RegInput::Get,
        t.0,
        t.1,
        RegOutput::Got { version, value },
    )
}

fn set(client: u64, t: (u64, u64), value: u32, version: u64) -> RegOp {
    Op::ok(
        client,
        RegInput::Set(value),
        t.0,
        t.1,
        RegOutput::Written { version },
    )
}

fn cas_ok(client: u64, t: (u64, u64), expect_version: u64, value: u32, version: u64) -> RegOp {
    let input = RegInput::Cas {
        expect_version,
        value,
    };
    Op::ok(client, input, t.0, t.1, RegOutput::Written { version })
}

fn cas_conflict(
    client: u64,
    t: (u64, u64),
    expect_version: u64,
    value: u32,
    current: u64,
) -> RegOp {
    let input = RegInput::Cas {
        expect_version,
        value,
    };
    Op::ok(client, input, t.0, t.1, RegOutput::Conflict { current })
}

fn check(ops: Vec<RegOp>) -> Result<(), Violation> {
    checker::linearizable(
        &Register::new(0u32),
        &History::from(ops),
        LinOptions::default(),
    )
}

fn accepted(ops: Vec<RegOp>) {
    if let Err(v) = check(ops) {
        panic!("expected linearizable, got {v}");
    }
}

fn rejected(ops: Vec<RegOp>) -> Violation {
    let v = check(ops).expect_err("expected a violation");
    assert_eq!(v.property, Property::Linearizability);
    assert_eq!(v.verdict, Verdict::Violated, "{v}");
    v
}

#[test]
fn a_sequential_history_is_linearizable() {
    accepted(vec![
        get(1, (0, 1), 0, 0),
        set(1, (2, 3), 10, 1),
        get(2, (4, 5), 1, 10),
        cas_ok(2, (6, 7), 1, 20, 2),
        cas_conflict(1, (8, 9), 1, 30, 2),
        get(1, (10, 11), 2, 20),
    ]);
}

#[test]
fn an_empty_history_is_linearizable() {
    accepted(Vec::new());
}

#[test]
fn overlapping_operations_may_take_effect_in_either_order() {
    // Set 10 is invoked first but takes effect second.
    accepted(vec![
        set(1, (0, 20), 10, 2),
        set(2, (5, 10), 11, 1),
        get(3, (6, 8), 0, 0),
        get(3, (9, 15), 1, 11),
        get(4, (25, 30), 2, 10),
    ]);
    // A read overlapping two writes sees the state between them.
    accepted(vec![
        set(1, (0, 10), 10, 1),
        set(2, (5, 15), 11, 2),
        get(3, (3, 12), 1, 10),
        get(3, (16, 20), 2, 11),
    ]);
    // Two CAS racing on one version: one wins, the other conflicts.
    accepted(vec![
        cas_ok(1, (0, 10), 0, 10, 1),
        cas_conflict(2, (2, 8), 0, 11, 1),
        get(3, (12, 14), 1, 10),
    ]);
}

#[test]
fn operations_whose_times_touch_count_as_concurrent() {
    // The read is invoked at the tick the write completes: either order.
    accepted(vec![set(1, (0, 10), 10, 1), get(2, (10, 12), 0, 0)]);
}

#[test]
fn an_unknown_write_may_have_taken_effect() {
    accepted(vec![
        Op::unknown(1, RegInput::Set(10), 5),
        get(2, (30, 40), 1, 10),
    ]);
}

#[test]
fn an_unknown_write_may_not_have_taken_effect() {
    accepted(vec![
        Op::unknown(1, RegInput::Set(10), 5),
        get(2, (30, 40), 0, 0),
        set(2, (41, 42), 11, 1),
        get(2, (43, 44), 1, 11),
    ]);
}

#[test]
fn an_unknown_write_may_take_effect_long_after_its_invoke() {
    // Not seen by a read well after its invoke, then seen later: it took
    // effect in between (an unknown operation has no completion bound).
    accepted(vec![
        Op::unknown(1, RegInput::Set(10), 5),
        get(2, (100, 110), 0, 0),
        get(2, (200, 210), 1, 10),
    ]);
    // Of two unknown writes of the same effect, the later one took effect
    // (as far as anyone can tell).
    accepted(vec![
        Op::unknown(1, RegInput::Set(10), 5),
        Op::unknown(2, RegInput::Set(11), 50),
        get(3, (20, 30), 0, 0),
        get(3, (100, 110), 1, 11),
        set(3, (120, 130), 20, 2),
        get(3, (140, 150), 2, 20),
    ]);
    // An unknown CAS, too.
    accepted(vec![
        Op::unknown(
            1,
            RegInput::Cas {
                expect_version: 0,
                value: 10,
            },
            5,
        ),
        get(2, (100, 110), 0, 0),
        get(2, (200, 210), 1, 10),
    ]);
}

#[test]
fn failed_writes_and_unknown_reads_are_left_out() {
    accepted(vec![
        Op::failed(1, RegInput::Set(10), 0, 5),
        Op::unknown(2, RegInput::Get, 1),
        get(2, (10, 20), 0, 0),
    ]);
}

#[test]
fn a_stale_read_after_a_completed_write_is_rejected() {
    let v = rejected(vec![set(1, (0, 10), 10, 1), get(2, (20, 30), 0, 0)]);
    assert_eq!(v.positions, vec![0, 1], "{v}");
}

#[test]
fn a_read_going_back_in_time_is_rejected() {
    rejected(vec![
        set(1, (0, 50), 10, 1),
        get(2, (1, 10), 1, 10),
        get(3, (20, 30), 0, 0),
    ]);
}

#[test]
fn a_cas_that_succeeded_against_a_superseded_version_is_rejected() {
    rejected(vec![
        set(1, (0, 10), 10, 1),
        set(1, (20, 30), 11, 2),
        cas_ok(2, (40, 50), 1, 12, 3),
    ]);
}

#[test]
fn two_cas_on_one_version_both_ok_are_rejected() {
    // Both claim to have written version 1.
    rejected(vec![
        cas_ok(1, (0, 10), 0, 10, 1),
        cas_ok(2, (5, 15), 0, 11, 1),
    ]);
    // One claims version 2, but then its expected version 0 did not hold.
    rejected(vec![
        cas_ok(1, (0, 10), 0, 10, 1),
        cas_ok(2, (5, 15), 0, 11, 2),
    ]);
}

#[test]
fn a_lost_write_read_back_is_rejected() {
    // Set 11 was acknowledged as version 2, yet a later read finds the
    // value of version 1 at version 2.
    rejected(vec![
        set(1, (0, 10), 10, 1),
        set(1, (20, 30), 11, 2),
        get(2, (40, 50), 2, 10),
    ]);
    // A write refused (known not to have taken effect) is read back.
    rejected(vec![
        Op::failed(1, RegInput::Set(10), 0, 10),
        get(2, (20, 30), 1, 10),
    ]);
    // A conflict naming a version that never was.
    rejected(vec![
        set(1, (0, 10), 10, 1),
        cas_conflict(2, (20, 30), 0, 11, 2),
    ]);
}

#[test]
fn a_read_before_a_write_was_invoked_is_rejected() {
    // The only write of 10 is unknown, but invoked after the read ended.
    rejected(vec![
        get(1, (0, 10), 1, 10),
        Op::unknown(2, RegInput::Set(10), 20),
    ]);
}

#[test]
fn a_wrong_kind_of_answer_is_rejected() {
    rejected(vec![Op::ok(
        1,
        RegInput::Get,
        0,
        1,
        RegOutput::Written { version: 1 },
    )]);
}

#[test]
fn a_malformed_history_is_reported() {
    let v = rejected(vec![get(1, (10, 5), 0, 0)]);
    assert!(v.reason.contains("malformed"), "{v}");
}

#[test]
fn an_exhausted_budget_is_reported_undecided() {
    let ops = vec![set(1, (0, 10), 10, 1), get(2, (20, 30), 1, 10)];
    let options = LinOptions {
        step_budget: 1,
        ..LinOptions::default()
    };
    let v = checker::linearizable(&Register::new(0u32), &History::from(ops), options)
        .expect_err("one step is not enough");
    assert!(v.is_undecided(), "{v}");
    assert!(v.to_string().contains("undecided"), "{v}");
}

#[test]
fn the_history_builder_records_ok_failed_and_unknown_operations() {
    let mut h = History::new();
    let a = h.invoke(1, RegInput::Set(10), 0);
    let b = h.invoke(2, RegInput::Set(11), 1);
    let c = h.invoke(3, RegInput::Get, 2);
    h.complete(a, 5, RegOutput::Written { version: 1 });
    h.fail(b, 6);
    h.complete(
        c,
        7,
        RegOutput::Got {
            version: 1,
            value: 10,
        },
    );
    h.invoke(1, RegInput::Set(12), 8);
    assert_eq!(h.len(), 4);
    assert_eq!(h.ops()[1].outcome, Outcome::Fail);
    assert_eq!(h.ops()[3].outcome, Outcome::Unknown);
    assert_eq!(h.ops()[3].complete, None);
    checker::linearizable(&Register::new(0u32), &h, LinOptions::default()).unwrap();
}

// ---------------------------------------------------------------------------
// Shrinking
// ---------------------------------------------------------------------------

#[test]
fn shrinking_keeps_only_the_operations_that_show_the_violation() {
    // A stale read buried in a busy history: reads and writes of other
    // clients before and after, some unknown, some failed.
    let mut ops = Vec::new();
    let mut t = 0;
    let mut version = 0;
    for i in 0..30u32 {
        version += 1;
        ops.push(set(1, (t, t + 3), 100 + i, version));
        ops.push(get(
            2,
            (t + 1, t + 2),
            version - 1,
            if version == 1 { 0 } else { 99 + i },
        ));
        ops.push(Op::failed(3, RegInput::Set(999), t, t + 2));
        t += 5;
    }
    ops.push(Op::unknown(4, RegInput::Set(500), t));
    // The stale read: version 10 was acknowledged long before.
    let stale = ops.len();
    ops.push(get(5, (t + 10, t + 11), 9, 108));
    let v = rejected(ops.clone());
    println!("{v}");
    assert_eq!(v.positions.len(), 2, "{v}");
    assert!(v.positions.contains(&stale), "{v}");
    assert_eq!(v.ops.len(), 2);
    assert!(v.note.as_deref().unwrap_or("").contains("left out"), "{v}");
    // The other op shown is a completed write or read of version 10 or
    // later: it alone contradicts the stale read.
    let other = v.positions.iter().copied().find(|&p| p != stale).unwrap();
    assert!(other < stale);
    assert_minimal(&ops, &v);
}

#[test]
fn shrinking_can_be_turned_off() {
    let ops = vec![
        set(1, (0, 10), 10, 1),
        get(3, (12, 13), 1, 10),
        get(2, (20, 30), 0, 0),
    ];
    let options = LinOptions {
        shrink_checks: 0,
        ..LinOptions::default()
    };
    let v = checker::linearizable(&Register::new(0u32), &History::from(ops), options).unwrap_err();
    assert_eq!(v.positions, vec![0, 1, 2], "{v}");
}

/// The operations `v` shows cannot be explained however the others went,
/// and each is needed: weakening any one of them too explains the rest.
///
/// A pair the model explains (a version going back, one version written
/// twice, a read of a version with another value than its write's) that
/// the search cannot decide (with every other operation weakened it has
/// every subset of them to try) is checked against those invariants.
fn assert_minimal(ops: &[RegOp], v: &Violation) {
    let model = Register::new(0u32);
    let budget = LinOptions::default().step_budget;
    let mut weak: Vec<bool> = (0..ops.len()).map(|i| !v.positions.contains(&i)).collect();
    let s = checker::search_weakened(&model, ops, &weak, budget);
    if let (SearchResult::Undecided, [a, b]) = (s.result, &v.positions[..]) {
        assert!(breaks_an_invariant(&ops[*a], &ops[*b]), "{v}");
        return;
    }
    assert_eq!(s.result, SearchResult::NotLinearizable, "{v}");
    for &p in &v.positions {
        weak[p] = true;
        // Linearizable, or undecided (shrinking keeps what it cannot
        // show to be unneeded).
        let s = checker::search_weakened(&model, ops, &weak, budget);
        assert_ne!(
            s.result,
            SearchResult::NotLinearizable,
            "#{p} is not needed in {v}"
        );
        weak[p] = false;
    }
}

/// Whether two answered register operations (`a` listed first) cannot
/// both hold, whatever else happened.
fn breaks_an_invariant(a: &RegOp, b: &RegOp) -> bool {
    fn before_after(op: &RegOp) -> (u64, u64) {
        match &op.outcome {
            Outcome::Ok(RegOutput::Got { version, .. }) => (*version, *version),
            Outcome::Ok(RegOutput::Conflict { current }) => (*current, *current),
            Outcome::Ok(RegOutput::Written { version }) => (version - 1, *version),
            _ => panic!("not answered: {op}"),
        }
    }
    fn wrote(op: &RegOp) -> Option<(u64, u32)> {
        match (&op.input, &op.outcome) {
            (
                RegInput::Set(x) | RegInput::Cas { value: x, .. },
                Outcome::Ok(RegOutput::Written { version }),
            ) => Some((*version, *x)),
            _ => None,
        }
    }
    fn read(op: &RegOp) -> Option<(u64, u32)> {
        match &op.outcome {
            Outcome::Ok(RegOutput::Got { version, value }) => Some((*version, *value)),
            _ => None,
        }
    }
    let goes_back = |x: &RegOp, y: &RegOp| {
        x.complete.is_some_and(|c| c < y.invoke) && before_after(y).0 < before_after(x).1
    };
    let twice = matches!((wrote(a), wrote(b)), (Some((va, _)), Some((vb, _))) if va == vb);
    let misread = |w: &RegOp, r: &RegOp| matches!((wrote(w), read(r)), (Some((vw, x)), Some((vr, y))) if vw == vr && x != y);
    goes_back(a, b) || goes_back(b, a) || twice || misread(a, b) || misread(b, a)
}

// ---------------------------------------------------------------------------
// Randomized register histories
// ---------------------------------------------------------------------------

/// splitmix64: a tiny seeded generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias does not matter here).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `percent` in 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn seeds(default: u64) -> u64 {
    std::env::var("CHECKER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A linearizable history by construction: a sequential run of the
/// register, each operation at its own point in time, its window widened
/// around that point by up to `width` ticks each way. Some writes that
/// took effect are made unknown; some writes that did not are added as
/// unknown or failed; some reads are made unknown.
/// Returns the history and the value of each version.
fn linearizable_history(rng: &mut Rng, n: usize, width: u64) -> (Vec<RegOp>, Vec<u32>) {
    let mut ops = Vec::with_capacity(n);
    let mut values = vec![0u32];
    let mut point = width + 1;
    let mut fresh = 0u32;
    for i in 0..n {
        point += 1 + rng.below(4);
        let invoke = point - rng.below(width + 1);
        let complete = point + rng.below(width + 1);
        let client = i as u64 % 20;
        let version = values.len() as u64 - 1;
        fresh += 1;
        let roll = rng.below(100);
        let op = if roll < 45 {
            let out = RegOutput::Got {
                version,
                value: values[version as usize],
            };
            if rng.chance(3) {
                Op::unknown(client, RegInput::Get, invoke)
            } else {
                Op::ok(client, RegInput::Get, invoke, complete, out)
            }
        } else if roll < 55 {
            // A write that never took effect.
            if rng.chance(50) {
                Op::unknown(client, RegInput::Set(fresh), invoke)
            } else {
                Op::failed(client, RegInput::Set(fresh), invoke, complete)
            }
        } else {
            let input = if roll < 75 {
                RegInput::Set(fresh)
            } else {
                let expect_version = if rng.chance(60) {
                    version
                } else {
                    version.saturating_sub(rng.below(3))
                };
                RegInput::Cas {
                    expect_version,
                    value: fresh,
                }
            };
            let out = match input {
                RegInput::Cas { expect_version, .. } if expect_version != version => {
                    RegOutput::Conflict { current: version }
                }
                _ => {
                    values.push(fresh);
                    RegOutput::Written {
                        version: version + 1,
                    }
                }
            };
            if rng.chance(5) {
                Op::unknown(client, input, invoke)
            } else {
                Op::ok(client, input, invoke, complete, out)
            }
        };
        ops.push(op);
    }
    (ops, values)
}

/// The most operations in flight at once (unknown ones stay in flight).
fn max_concurrency(ops: &[RegOp]) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for op in ops {
        events.push((op.invoke, 1));
        events.push((op.complete.map_or(u64::MAX, |c| c + 1), -1));
    }
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// The version some operation answered before `at` proves the register
/// had reached (0 if none).
fn version_floor(ops: &[RegOp], at: u64) -> u64 {
    ops.iter()
        .filter(|op| op.complete.is_some_and(|c| c < at))
        .filter_map(|op| match &op.outcome {
            Outcome::Ok(RegOutput::Got { version, .. })
            | Outcome::Ok(RegOutput::Written { version })
            | Outcome::Ok(RegOutput::Conflict { current: version }) => Some(*version),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Makes one answered read observably wrong. With a version floor above
/// 0, a stale read (an older version, with that version's true value:
/// consistent, but older than what was already seen); otherwise a value
/// no one ever wrote. Returns the read's position and the kind.
fn corrupt_one_read(
    rng: &mut Rng,
    ops: &mut [RegOp],
    values: &[u32],
) -> Option<(usize, &'static str)> {
    let reads: Vec<usize> = (0..ops.len())
        .filter(|&i| matches!(ops[i].outcome, Outcome::Ok(RegOutput::Got { .. })))
        .collect();
    if reads.is_empty() {
        return None;
    }
    let i = reads[rng.below(reads.len() as u64) as usize];
    let floor = version_floor(ops, ops[i].invoke);
    let Outcome::Ok(RegOutput::Got { version, value }) = &mut ops[i].outcome else {
        unreachable!()
    };
    if floor > 0 {
        let stale = rng.below(floor);
        *version = stale;
        *value = values[stale as usize];
        Some((i, "stale"))
    } else {
        *value = u32::MAX;
        Some((i, "unwritten value"))
    }
}

#[test]
fn random_linearizable_histories_pass_and_a_corrupted_read_fails() {
    let model = Register::new(0u32);
    let options = LinOptions::default();
    let n_seeds = seeds(200);
    let (mut slowest_pass, mut slowest_fail) = (Duration::ZERO, Duration::ZERO);
    let (mut total_pass, mut total_fail) = (Duration::ZERO, Duration::ZERO);
    let mut most_concurrent = 0;
    let mut stale = 0;
    let mut max_shown = 0;
    for seed in 0..n_seeds {
        let mut rng = Rng(seed);
        let width = 5 + rng.below(30);
        let (mut ops, values) = linearizable_history(&mut rng, 200, width);
        most_concurrent = most_concurrent.max(max_concurrency(&ops));
        let started = Instant::now();
        let result = checker::linearizable_ops(&model, &ops, options);
        let took = started.elapsed();
        if let Err(v) = result {
            panic!("{}", v.with_seed(seed));
        }
        slowest_pass = slowest_pass.max(took);
        total_pass += took;

        let Some((at, kind)) = corrupt_one_read(&mut rng, &mut ops, &values) else {
            continue;
        };
        stale += usize::from(kind == "stale");
        let started = Instant::now();
        let result = checker::linearizable_ops(&model, &ops, options);
        let took = started.elapsed();
        slowest_fail = slowest_fail.max(took);
        total_fail += took;
        let v = match result {
            Ok(()) => panic!("seed {seed}: the {kind} read #{at} was not caught"),
            Err(v) => v.with_seed(seed),
        };
        assert_eq!(v.verdict, Verdict::Violated, "{v}");
        assert!(v.positions.contains(&at), "{v}");
        max_shown = max_shown.max(v.positions.len());
        if seed < 20 {
            assert_minimal(&ops, &v);
        }
    }
    println!(
        "{n_seeds} histories of 200 ops, up to {most_concurrent} in flight at once: \
         accepted in {total_pass:?} (slowest {slowest_pass:?}); \
         corrupted ({stale} stale reads, the rest unwritten values) rejected and shrunk \
         in {total_fail:?} (slowest {slowest_fail:?}), at most {max_shown} ops shown"
    );
    assert!(
        most_concurrent >= 20,
        "the histories are not concurrent enough"
    );
    assert!(
        stale > n_seeds as usize / 2,
        "too few stale-read corruptions"
    );
}

#[test]
fn many_unknown_writes_stay_fast() {
    // 200 ops, a third of the writes unknown (each in flight until the
    // end), then a stale read.
    let model = Register::new(0u32);
    let mut worst = Duration::ZERO;
    for seed in 0..seeds(20) {
        let mut rng = Rng(1_000 + seed);
        let mut ops = Vec::new();
        let mut version = 0u64;
        let mut t = 100;
        for i in 0..200u32 {
            t += 1 + rng.below(3);
            let client = u64::from(i % 20);
            if rng.chance(40) {
                if rng.chance(33) {
                    ops.push(Op::unknown(client, RegInput::Set(10_000 + i), t));
                } else {
                    version += 1;
                    ops.push(set(
                        client,
                        (t - rng.below(20), t + rng.below(20)),
                        i,
                        version,
                    ));
                }
            } else {
                let value = ops
                    .iter()
                    .rev()
                    .find_map(|op: &RegOp| match op.outcome {
                        Outcome::Ok(RegOutput::Written { version: v }) if v == version => {
                            match op.input {
                                RegInput::Set(x) => Some(x),
                                _ => None,
                            }
                        }
                        _ => None,
                    })
                    .unwrap_or_default();
                ops.push(get(
                    client,
                    (t - rng.below(20), t + rng.below(20)),
                    version,
                    value,
                ));
            }
        }
        let started = Instant::now();
        let pass = checker::linearizable_ops(&model, &ops, LinOptions::default());
        worst = worst.max(started.elapsed());
        if let Err(v) = pass {
            panic!("{}", v.with_seed(seed));
        }
        ops.push(get(99, (t + 100, t + 101), 0, 0));
        let started = Instant::now();
        let v = checker::linearizable_ops(&model, &ops, LinOptions::default()).unwrap_err();
        worst = worst.max(started.elapsed());
        assert_eq!(v.verdict, Verdict::Violated, "{v}");
        assert_eq!(v.positions.len(), 2, "{v}");
        assert!(v.positions.contains(&(ops.len() - 1)), "{v}");
    }
    println!("many unknown writes: slowest check (with shrinking) {worst:?}");
}

/// Whether some order explains the history, by trying every order and
/// every choice of which unknown (or weakened) operations took effect.
fn exhaustive(ops: &[RegOp], weak: &[bool]) -> bool {
    struct Item<'a> {
        input: &'a RegInput<u32>,
        output: Option<&'a RegOutput<u32>>,
        invoke: u64,
        ret: u64,
        optional: bool,
    }
    let items: Vec<Item<'_>> = ops
        .iter()
        .zip(weak)
        .filter_map(|(op, &w)| match &op.outcome {
            Outcome::Fail => None,
            Outcome::Unknown => Some(Item {
                input: &op.input,
                output: None,
                invoke: op.invoke,
                ret: u64::MAX,
                optional: true,
            }),
            Outcome::Ok(o) => Some(Item {
                input: &op.input,
                output: if w { None } else { Some(o) },
                invoke: op.invoke,
                ret: op.complete.unwrap(),
                optional: w,
            }),
        })
        .collect();
    let model = Register::new(0u32);
    fn go(
        model: &Register<u32>,
        items: &[Item<'_>],
        taken: &mut Vec<bool>,
        state: &checker::RegState<u32>,
    ) -> bool {
        if taken.iter().all(|&t| t) {
            return true;
        }
        for i in 0..items.len() {
            if taken[i] {
                continue;
            }
            // Next only if nothing still to place had to come before it.
            let blocked =
                (0..items.len()).any(|j| j != i && !taken[j] && items[j].ret < items[i].invoke);
            if blocked {
                continue;
            }
            let Some(after) = model.step(state, items[i].input, items[i].output) else {
                continue;
            };
            taken[i] = true;
            if go(model, items, taken, &after) {
                return true;
            }
            taken[i] = false;
        }
        false
    }
    // Which optional operations took effect: every choice. Those that did
    // must be placed (within their windows), the others are left out.
    let optional: Vec<usize> = (0..items.len()).filter(|&i| items[i].optional).collect();
    for mask in 0u32..(1 << optional.len()) {
        let mut taken = vec![false; items.len()];
        for (b, &i) in optional.iter().enumerate() {
            // Marked taken: left out, never placed.
            taken[i] = mask & (1 << b) != 0;
        }
        let state = model.init();
        if go(&model, &items, &mut taken, &state) {
            return true;
        }
    }
    false
}

/// A small history of random answers.
fn random_answers(rng: &mut Rng, n: usize) -> Vec<RegOp> {
    (0..n)
        .map(|i| {
            let invoke = rng.below(20);
            let complete = invoke + rng.below(8);
            let client = i as u64;
            let input = match rng.below(3) {
                0 => RegInput::Get,
                1 => RegInput::Set(1 + rng.below(2) as u32),
                _ => RegInput::Cas {
                    expect_version: rng.below(3),
                    value: 1 + rng.below(2) as u32,
                },
            };
            let output = match &input {
                RegInput::Get => RegOutput::Got {
                    version: rng.below(3),
                    value: rng.below(3) as u32,
                },
                RegInput::Set(_) => RegOutput::Written {
                    version: 1 + rng.below(3),
                },
                RegInput::Cas { .. } if rng.chance(70) => RegOutput::Written {
                    version: 1 + rng.below(3),
                },
                RegInput::Cas { .. } => RegOutput::Conflict {
                    current: rng.below(3),
                },
            };
            match rng.below(10) {
                0 => Op::unknown(client, input, invoke),
                1 => Op::failed(client, input, invoke, complete),
                _ => Op::ok(client, input, invoke, complete, output),
            }
        })
        .collect()
}

#[test]
fn the_search_agrees_with_an_exhaustive_one_on_small_histories() {
    let model = Register::new(0u32);
    let (mut yes, mut no) = (0, 0);
    for seed in 0..seeds(200) * 20 {
        let mut rng = Rng(7_000_000 + seed);
        let n = 1 + rng.below(7) as usize;
        let ops = if rng.chance(50) {
            random_answers(&mut rng, n)
        } else {
            let width = rng.below(6);
            let (mut ops, values) = linearizable_history(&mut rng, n, width);
            if rng.chance(50) {
                corrupt_one_read(&mut rng, &mut ops, &values);
            }
            ops
        };
        let weak: Vec<bool> = (0..n).map(|_| rng.chance(20)).collect();
        let expected = exhaustive(&ops, &weak);
        let found = checker::search_weakened(&model, &ops, &weak, u64::MAX);
        let want = if expected {
            SearchResult::Linearizable
        } else {
            SearchResult::NotLinearizable
        };
        if found.result != want {
            let lines: Vec<String> = ops
                .iter()
                .zip(&weak)
                .map(|(op, w)| format!("  {op}{}", if *w { " (weakened)" } else { "" }))
                .collect();
            panic!(
                "seed {seed}: the search says {:?}, the exhaustive one {want:?}:\n{}",
                found.result,
                lines.join("\n")
            );
        }
        if expected {
            yes += 1;
        } else {
            no += 1;
        }
        if !expected && !weak.iter().any(|&w| w) {
            let v = checker::linearizable_ops(&model, &ops, LinOptions::default()).unwrap_err();
            assert_minimal(&ops, &v);
        }
    }
    println!("small histories: {yes} linearizable, {no} not, all agreed");
    assert!(yes > 100 && no > 100, "{yes} linearizable, {no} not");
}

// ---------------------------------------------------------------------------
// Exactly-once: requests
// ---------------------------------------------------------------------------

fn attempt(sender: u64, req_id: &str, verb: &str, t: u64, answer: Answer<u64>) -> Request<u64> {
    let complete = if answer == Answer::Unknown {
        None
    } else {
        Some(t + 1)
    };
    Request {
        sender,
        req_id: req_id.to_owned(),
        verb: verb.to_owned(),
        invoke: t,
        complete,
        answer,
    }
}

fn ran(sender: u64, req_id: &str, verb: &str, at: u64) -> Execution {
    Execution {
        sender,
        req_id: req_id.to_owned(),
        verb: verb.to_owned(),
        at,
    }
}

fn good_requests() -> (Vec<Request<u64>>, Vec<Execution>) {
    let attempts = vec![
        attempt(1, "r1", "cfg/set", 0, Answer::Unknown),
        attempt(1, "r1", "cfg/set", 10, Answer::Duplicate),
        attempt(1, "r1", "cfg/set", 20, Answer::Ok(7)),
        attempt(1, "r1", "cfg/set", 30, Answer::Ok(7)),
        // The req_id reused on another verb: refused.
        attempt(1, "r1", "cfg/delete", 40, Answer::Duplicate),
        // The same req_id from another sender is another request.
        attempt(2, "r1", "cfg/delete", 5, Answer::Ok(9)),
        attempt(2, "r2", "cfg/set", 6, Answer::Refused("denied".to_owned())),
    ];
    let executions = vec![ran(1, "r1", "cfg/set", 2), ran(2, "r1", "cfg/delete", 6)];
    (attempts, executions)
}

#[test]
fn requests_answered_once_pass() {
    let (attempts, executions) = good_requests();
    checker::exactly_once_requests(&attempts, &executions).unwrap();
    checker::answers_backed_by_executions(&attempts, &executions).unwrap();
}

#[test]
fn a_handler_run_twice_is_caught() {
    let (attempts, mut executions) = good_requests();
    executions.push(ran(1, "r1", "cfg/set", 21));
    let v = checker::exactly_once_requests(&attempts, &executions).unwrap_err();
    assert_eq!(v.property, Property::ExactlyOnceRequests);
    assert!(v.reason.contains("ran 2 times"), "{v}");
    assert_eq!(v.ops.len(), 2, "{v}");
}

#[test]
fn a_retry_answered_another_value_is_caught() {
    let (mut attempts, executions) = good_requests();
    attempts.push(attempt(1, "r1", "cfg/set", 50, Answer::Ok(8)));
    let v = checker::exactly_once_requests(&attempts, &executions).unwrap_err();
    assert!(v.reason.contains("two different values"), "{v}");
    assert!(
        v.ops[0].contains("ok 7") && v.ops[1].contains("ok 8"),
        "{v}"
    );
}

#[test]
fn a_req_id_reused_on_another_verb_answered_with_the_first_result_is_caught() {
    let (mut attempts, executions) = good_requests();
    attempts[4].answer = Answer::Ok(7);
    let v = checker::exactly_once_requests(&attempts, &executions).unwrap_err();
    assert!(v.reason.contains("must be refused duplicate"), "{v}");
    assert!(v.ops[0].starts_with("execution"), "{v}");
    assert!(v.ops[1].contains("cfg/delete"), "{v}");

    // Without a recorded run: answered ok for two verbs.
    let attempts = vec![
        attempt(1, "r9", "cfg/set", 0, Answer::Ok(1)),
        attempt(1, "r9", "cfg/delete", 5, Answer::Ok(1)),
    ];
    let v = checker::exactly_once_requests(&attempts, &[]).unwrap_err();
    assert!(v.reason.contains("two verbs"), "{v}");
}

#[test]
fn an_answer_with_no_run_behind_it_is_caught() {
    let (mut attempts, executions) = good_requests();
    attempts.push(attempt(3, "r5", "cfg/set", 0, Answer::Ok(1)));
    checker::exactly_once_requests(&attempts, &executions).unwrap();
    let v = checker::answers_backed_by_executions(&attempts, &executions).unwrap_err();
    assert!(v.reason.contains("never ran"), "{v}");
}

// ---------------------------------------------------------------------------
// Exactly-once: task submits
// ---------------------------------------------------------------------------

fn submit(
    sender: u64,
    req_id: &str,
    verb: &str,
    t: u64,
    answer: Answer<&'static str>,
) -> Request<&'static str> {
    Request {
        sender,
        req_id: req_id.to_owned(),
        verb: verb.to_owned(),
        invoke: t,
        complete: (answer != Answer::Unknown).then_some(t + 1),
        answer,
    }
}

fn good_submits() -> Vec<Request<&'static str>> {
    vec![
        submit(1, "s1", "job/run", 0, Answer::Unknown),
        submit(1, "s1", "job/run", 10, Answer::Ok("task-a")),
        submit(1, "s1", "job/run", 20, Answer::Ok("task-a")),
        submit(1, "s1", "job/other", 30, Answer::Duplicate),
        submit(1, "s2", "job/run", 40, Answer::Ok("task-b")),
        submit(2, "s1", "job/run", 50, Answer::Ok("task-c")),
    ]
}

#[test]
fn submits_retried_get_one_task() {
    checker::exactly_once_submits(&good_submits()).unwrap();
}

#[test]
fn two_tasks_for_one_submit_are_caught() {
    let mut submits = good_submits();
    submits.push(submit(1, "s1", "job/run", 60, Answer::Ok("task-z")));
    let v = checker::exactly_once_submits(&submits).unwrap_err();
    assert_eq!(v.property, Property::ExactlyOnceSubmits);
    assert!(v.reason.contains("two different tasks"), "{v}");
}

#[test]
fn another_verb_given_the_same_task_is_caught() {
    let mut submits = good_submits();
    submits[3].answer = Answer::Ok("task-a");
    let v = checker::exactly_once_submits(&submits).unwrap_err();
    assert!(
        v.reason.contains("two verbs") || v.reason.contains("same task"),
        "{v}"
    );
    assert!(v.ops.iter().any(|l| l.contains("job/other")), "{v}");

    // Another submit altogether given an existing task.
    let mut submits = good_submits();
    submits.push(submit(3, "s7", "job/run", 70, Answer::Ok("task-b")));
    let v = checker::exactly_once_submits(&submits).unwrap_err();
    assert!(v.reason.contains("two different submits"), "{v}");
}

#[test]
fn a_req_id_reused_on_another_verb_given_a_new_task_is_caught() {
    let mut submits = good_submits();
    submits[3].answer = Answer::Ok("task-new");
    let v = checker::exactly_once_submits(&submits).unwrap_err();
    assert!(v.reason.contains("two verbs"), "{v}");
}

// ---------------------------------------------------------------------------
// Subscriber streams
// ---------------------------------------------------------------------------

fn task_log() -> Vec<Event<&'static str>> {
    ["started", "progress", "progress", "output", "done"]
        .iter()
        .enumerate()
        .map(|(i, k)| Event::new(i as u64 + 1, *k))
        .collect()
}

fn seg(from: u64, seqs: &[u64], end: SegmentEnd) -> Segment<&'static str> {
    let log = task_log();
    Segment {
        from,
        received: seqs.iter().map(|&s| log[s as usize - 1].clone()).collect(),
        end,
    }
}

fn stream(segments: &[Segment<&'static str>]) -> Result<(), Violation> {
    checker::subscriber_stream(1, &task_log(), segments)
}

#[test]
fn a_stream_resumed_without_loss_passes() {
    stream(&[seg(1, &[1, 2, 3, 4, 5], SegmentEnd::Finished)]).unwrap();
    stream(&[
        seg(1, &[1, 2], SegmentEnd::Cut),
        seg(3, &[3, 4, 5], SegmentEnd::Finished),
    ])
    .unwrap();
    // Resumed from an event already seen: it comes again, as asked.
    stream(&[
        seg(0, &[1, 2], SegmentEnd::Cut),
        seg(2, &[2, 3, 4, 5], SegmentEnd::Finished),
    ])
    .unwrap();
    // A subscriber that joined late, or stopped early.
    stream(&[seg(3, &[3, 4, 5], SegmentEnd::Finished)]).unwrap();
    stream(&[seg(1, &[1, 2, 3], SegmentEnd::Cut)]).unwrap();
    stream(&[
        seg(1, &[1, 2], SegmentEnd::Cut),
        seg(3, &[], SegmentEnd::Open),
    ])
    .unwrap();
    stream(&[]).unwrap();
}

#[test]
fn a_lost_event_is_caught() {
    let v = stream(&[seg(1, &[1, 2, 4, 5], SegmentEnd::Finished)]).unwrap_err();
    assert_eq!(v.property, Property::SubscriberStream);
    assert!(v.reason.contains("skipped"), "{v}");
    // Lost between resumes: the resume asked past what was received.
    let v = stream(&[
        seg(1, &[1, 2], SegmentEnd::Cut),
        seg(4, &[4, 5], SegmentEnd::Finished),
    ])
    .unwrap_err();
    assert!(v.reason.contains("event 3 was never delivered"), "{v}");
}

#[test]
fn a_doubled_event_is_caught() {
    let v = stream(&[seg(1, &[1, 2, 2, 3], SegmentEnd::Cut)]).unwrap_err();
    assert!(v.reason.contains("delivered twice"), "{v}");
}

#[test]
fn reordered_events_are_caught() {
    let v = stream(&[seg(1, &[1, 3, 2, 4, 5], SegmentEnd::Finished)]).unwrap_err();
    assert!(
        v.reason.contains("event 2 was delivered after event 3"),
        "{v}"
    );
}

#[test]
fn an_event_before_the_resume_point_delivered_again_is_caught() {
    let v = stream(&[
        seg(1, &[1, 2, 3], SegmentEnd::Cut),
        seg(4, &[3, 4, 5], SegmentEnd::Finished),
    ])
    .unwrap_err();
    assert!(v.reason.contains("after a resume from seq 4"), "{v}");
}

#[test]
fn a_dropped_final_state_is_caught() {
    let v = stream(&[
        seg(1, &[1, 2], SegmentEnd::Cut),
        seg(3, &[3, 4], SegmentEnd::Finished),
    ])
    .unwrap_err();
    assert!(v.reason.contains("final events dropped"), "{v}");
}

#[test]
fn an_event_unlike_the_log_is_caught() {
    let mut s = seg(1, &[1, 2, 3], SegmentEnd::Cut);
    s.received[1].kind = "output";
    let v = stream(&[s]).unwrap_err();
    assert!(v.reason.contains("differs"), "{v}");
    let mut s = seg(1, &[1, 2, 3, 4, 5], SegmentEnd::Cut);
    s.received.push(Event::new(6, "done"));
    let v = stream(&[s]).unwrap_err();
    assert!(v.reason.contains("not in the task's log"), "{v}");
}

// ---------------------------------------------------------------------------
// No controller effect after revocation
// ---------------------------------------------------------------------------

fn change(
    kind: AuthorityKind,
    invoke: u64,
    complete: Option<u64>,
) -> AuthorityChange<&'static str> {
    AuthorityChange {
        key: "cp->node",
        kind,
        invoke,
        complete,
    }
}

fn call(invoke: u64, complete: Option<u64>, acknowledged: bool) -> ControllerCall<&'static str> {
    ControllerCall {
        key: "cp->node",
        verb: "cluster/create".to_owned(),
        invoke,
        complete,
        acknowledged,
    }
}

#[test]
fn calls_with_authority_pass() {
    let changes = vec![
        change(AuthorityKind::Grant, 0, Some(5)),
        change(AuthorityKind::Revoke, 100, Some(110)),
        change(AuthorityKind::Grant, 200, Some(210)),
        change(AuthorityKind::Unbind, 300, Some(310)),
        // A grant whose answer was lost: it may have taken effect.
        change(AuthorityKind::Grant, 400, None),
    ];
    let calls = vec![
        call(10, Some(20), true),
        // Concurrent with the revoke: either order.
        call(105, Some(120), true),
        // After the revoke: refused, or unknown.
        call(120, Some(125), false),
        call(130, None, false),
        // After the new grant, or while it was in flight.
        call(205, Some(230), true),
        call(220, Some(230), true),
        // After the unbind but while the lost grant may have taken effect.
        call(410, Some(420), true),
    ];
    checker::no_effect_after_revocation(&changes, &calls).unwrap();
    // Another controller's revoke does not matter.
    let other = AuthorityChange {
        key: "other->node",
        ..change(AuthorityKind::Revoke, 0, Some(1))
    };
    checker::no_effect_after_revocation(&[other], &[call(10, Some(20), true)]).unwrap();
    // A revoke whose answer was lost proves nothing.
    checker::no_effect_after_revocation(
        &[change(AuthorityKind::Revoke, 0, None)],
        &[call(10, Some(20), true)],
    )
    .unwrap();
}

#[test]
fn an_acknowledged_call_after_a_revoke_is_caught() {
    let changes = vec![
        change(AuthorityKind::Grant, 0, Some(5)),
        change(AuthorityKind::Revoke, 100, Some(110)),
    ];
    let calls = vec![call(10, Some(20), true), call(111, Some(115), true)];
    let v = checker::no_effect_after_revocation(&changes, &calls).unwrap_err();
    assert_eq!(v.property, Property::NoEffectAfterRevocation);
    assert!(v.reason.contains("revoked"), "{v}");
    assert_eq!(v.ops.len(), 2, "{v}");
    assert!(v.ops[1].starts_with("call #1"), "{v}");

    // An unbind, and a grant that completed before the unbind was asked.
    let changes = vec![
        change(AuthorityKind::Grant, 0, Some(5)),
        change(AuthorityKind::Unbind, 100, Some(110)),
    ];
    let v =
        checker::no_effect_after_revocation(&changes, &[call(200, Some(201), true)]).unwrap_err();
    assert!(v.reason.contains("unbound"), "{v}");
}

// ---------------------------------------------------------------------------
// No effect after expiry
// ---------------------------------------------------------------------------

/// A clock at date 1000 at tick 0, stepped by `steps`, with `reads`.
fn clock(steps: &[(u64, i64)], starts: &[u64], reads: &[(u64, u64)]) -> NodeClock {
    NodeClock {
        base: 1000,
        steps: steps.to_vec(),
        starts: starts.to_vec(),
        reads: reads.to_vec(),
    }
}

fn token(invoke: u64, expires: u64) -> Presented<&'static str> {
    Presented {
        key: "cp->node",
        invoke,
        expires,
    }
}

#[test]
fn calls_before_expiry_pass() {
    // Valid until date 1500: calls up to tick 499 are in time.
    let tokens = [token(0, 1500)];
    let calls = [call(10, Some(20), true), call(480, Some(600), true)];
    checker::no_effect_after_expiry(&clock(&[], &[], &[]), &tokens, &calls).unwrap();
    // Past the expiry, refused or unanswered: nothing to say.
    let late = [call(600, Some(610), false), call(620, None, true)];
    checker::no_effect_after_expiry(&clock(&[], &[], &[]), &tokens, &late).unwrap();
    // A later token gives it back.
    let tokens = [token(0, 1500), token(700, 2500)];
    checker::no_effect_after_expiry(
        &clock(&[], &[], &[]),
        &tokens,
        &[call(800, Some(810), true)],
    )
    .unwrap();
    // A clock set back in the call's window: it may have run then.
    let c = clock(&[(100, 1000), (300, 0)], &[], &[]);
    checker::no_effect_after_expiry(&c, &tokens[..1], &[call(250, Some(320), true)]).unwrap();
    // What the node read before its last start does not hold it.
    let c = clock(&[(100, 1000), (300, 0)], &[350], &[(200, 2200)]);
    checker::no_effect_after_expiry(&c, &tokens[..1], &[call(400, Some(410), true)]).unwrap();
    // Keys with no token are not this property's.
    let other = ControllerCall {
        key: "other",
        ..call(5000, Some(5001), true)
    };
    checker::no_effect_after_expiry(&clock(&[], &[], &[]), &tokens, &[other]).unwrap();
}

#[test]
fn a_call_past_expiry_is_caught() {
    let tokens = [token(0, 1500)];
    let v = checker::no_effect_after_expiry(
        &clock(&[], &[], &[]),
        &tokens,
        &[call(10, Some(20), true), call(600, Some(610), true)],
    )
    .unwrap_err();
    assert_eq!(v.property, Property::NoEffectAfterExpiry);
    assert!(v.ops.last().unwrap().starts_with("call #1"), "{v}");

    // Stepped past it for the whole window.
    let c = clock(&[(100, 1000)], &[], &[]);
    let v = checker::no_effect_after_expiry(&c, &tokens, &[call(150, Some(160), true)]);
    assert!(v.is_err());

    // Set back again, but the node had read a later date in this start:
    // its date does not go back.
    let c = clock(&[(100, 1000), (300, 0)], &[], &[(200, 2200)]);
    let v =
        checker::no_effect_after_expiry(&c, &tokens, &[call(400, Some(410), true)]).unwrap_err();
    assert!(v.reason.contains("2200"), "{v}");
    assert!(
        v.ops
            .iter()
            .any(|o| o.contains("the node had read date 2200")),
        "{v}"
    );
}

// ---------------------------------------------------------------------------
// Task reads
// ---------------------------------------------------------------------------

fn read(
    invoke: u64,
    complete: Option<u64>,
    saw: Option<(u64, &'static str)>,
) -> TaskRead<&'static str> {
    TaskRead {
        invoke,
        complete,
        saw,
    }
}

fn state_log() -> Vec<Event<&'static str>> {
    vec![
        Event::new(1, "working"),
        Event::new(2, "working"),
        Event::new(3, "input_required"),
        Event::new(4, "working"),
        Event::new(5, "completed"),
    ]
}

fn reads_of(reads: &[TaskRead<&'static str>]) -> Result<(), Violation> {
    checker::task_reads("t", &state_log(), reads, |e, s| e == s)
}

#[test]
fn reads_that_follow_the_log_pass() {
    reads_of(&[
        read(0, Some(5), Some((1, "working"))),
        read(10, Some(15), Some((3, "input_required"))),
        // Overlapping reads may see either order.
        read(20, Some(40), Some((5, "completed"))),
        read(21, Some(30), Some((4, "working"))),
        read(50, None, None),
        read(60, Some(61), Some((5, "completed"))),
    ])
    .unwrap();
    // A read of an event folded out of the log is not compared.
    checker::task_reads(
        "t",
        &state_log()[2..],
        &[read(0, Some(1), Some((1, "anything")))],
        |e, s| e == s,
    )
    .unwrap();
}

#[test]
fn reads_that_contradict_the_log_are_caught() {
    let v = reads_of(&[read(0, Some(5), Some((6, "completed")))]).unwrap_err();
    assert_eq!(v.property, Property::TaskReads);
    assert!(v.reason.contains("past the log's last"), "{v}");

    let v = reads_of(&[read(0, Some(5), Some((3, "working")))]).unwrap_err();
    assert!(v.reason.contains("does not give"), "{v}");
    assert_eq!(v.ops.len(), 2, "{v}");

    // Seen, then unseen: a later read went back.
    let v = reads_of(&[
        read(0, Some(5), Some((4, "working"))),
        read(6, Some(8), Some((2, "working"))),
    ])
    .unwrap_err();
    assert!(v.reason.contains("earlier seq"), "{v}");
    assert!(
        v.ops[0].starts_with("read #0") && v.ops[1].starts_with("read #1"),
        "{v}"
    );
}

// ---------------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------------

#[test]
fn a_violation_prints_its_property_seed_and_operations() {
    let v = rejected(vec![set(1, (0, 10), 10, 1), get(2, (20, 30), 0, 0)]).with_seed(42);
    let text = v.to_string();
    println!("{text}");
    assert!(
        text.starts_with("linearizability violated (seed 42): "),
        "{text}"
    );
    assert!(
        text.contains("\n  #0 client 1 [0..10] Set(10) -> Written { version: 1 }"),
        "{text}"
    );
    assert!(
        text.contains("\n  #1 client 2 [20..30] Get -> Got { version: 0, value: 0 }"),
        "{text}"
    );
    assert_eq!(format!("{v:?}"), text);
}
