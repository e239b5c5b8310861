//! The options every bench reads from its environment, shared by the
//! benches: `--quick` (or `CAPWIRE_BENCH_QUICK=1`), `CAPWIRE_BENCH_RUNS`,
//! `CAPWIRE_BENCH_N`, and the comma-separated filters
//! `CAPWIRE_BENCH_ONLY` (sections) and `CAPWIRE_BENCH_PLACEMENT`; a bench
//! reads filters of its own with [`list`].
#![allow(dead_code)]

/// The comma-separated names in `var`, if it is set.
pub(crate) fn list(var: &str) -> Option<Vec<String>> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
}

/// Whether `name` passes `filter` (no filter: everything does).
pub(crate) fn wanted(filter: &Option<Vec<String>>, name: &str) -> bool {
    filter.as_ref().is_none_or(|l| l.iter().any(|n| n == name))
}

/// The options of a run.
pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) runs: usize,
    pub(crate) n: Option<u64>,
    pub(crate) sections: Option<Vec<String>>,
    pub(crate) placements: Option<Vec<String>>,
}

impl Opts {
    pub(crate) fn from_env() -> Self {
        let quick = std::env::args().any(|a| a == "--quick" || a == "--test")
            || std::env::var("CAPWIRE_BENCH_QUICK").is_ok_and(|v| v != "0");
        let num = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
        Self {
            quick,
            runs: num("CAPWIRE_BENCH_RUNS").map_or(if quick { 1 } else { 3 }, |r| {
                usize::try_from(r.max(1)).unwrap()
            }),
            n: num("CAPWIRE_BENCH_N"),
            sections: list("CAPWIRE_BENCH_ONLY"),
            placements: list("CAPWIRE_BENCH_PLACEMENT"),
        }
    }

    /// Messages per run: `CAPWIRE_BENCH_N`, else `full`, or `quick` when
    /// the run is quick.
    pub(crate) fn count(&self, full: u64, quick: u64) -> u64 {
        self.n.unwrap_or(if self.quick { quick } else { full })
    }
}
