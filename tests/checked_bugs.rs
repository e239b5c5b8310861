//! The history checker checked end to end: each known defect, planted in
//! the library at run time (the `seeded-bugs` feature, never on in a
//! release), makes the checked simulation of `tests/sim_checked.rs` fail
//! with the property it breaks. `.ci/run` runs it:
//!
//! ```text
//! cargo test --features seeded-bugs --test checked_bugs -- --nocapture
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/checked_sim.rs"]
mod checked_sim;
#[path = "support/checker.rs"]
mod checker;

use capwire::seeded_bugs::{Bug, plant};

/// Seeds tried per defect before it counts as missed.
const SEEDS: u64 = 60;

/// Plants `bug`, runs seeds until one fails, and returns the failure.
fn first_failure(bug: Bug) -> Option<(u64, String)> {
    plant(Some(bug));
    let found = (0..SEEDS).find_map(|seed| checked_sim::run(seed, 3, 30).err().map(|e| (seed, e)));
    plant(None);
    found
}

// One test: a planted defect holds for the whole process.
#[test]
fn every_seeded_defect_is_caught_with_the_property_it_breaks() {
    // Without a defect, the first seeds pass.
    for seed in 0..3 {
        if let Err(e) = checked_sim::run(seed, 3, 30) {
            panic!("seed {seed} fails with no defect planted:\n{e}");
        }
    }
    let cases = [
        (
            Bug::LedgerForgetsEarly,
            "exactly-once requests",
            "the handler ran 2 times",
        ),
        (
            Bug::TasksKeyedWithoutVerb,
            "exactly-once task submits",
            "two verbs",
        ),
        (Bug::FoldDropsFinalState, "subscriber stream", "seq"),
        (
            Bug::CacheOutlivesRevocation,
            "no effect after revocation",
            "delegate",
        ),
        (
            Bug::ClockRunsBack,
            "no effect after expiry",
            "the node had read date",
        ),
    ];
    for (bug, property, says) in cases {
        let Some((seed, report)) = first_failure(bug) else {
            panic!("{bug:?}: not caught in {SEEDS} seeds");
        };
        println!("{bug:?}: caught at seed {seed}:\n{report}\n");
        assert!(
            report.contains(property),
            "{bug:?}: another property broke:\n{report}"
        );
        assert!(report.contains(says), "{bug:?}: {report}");
        assert!(
            report.contains(&format!("CAPWIRE_CHK_SEED={seed}")),
            "{report}"
        );
    }
}
