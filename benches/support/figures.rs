//! How the benches turn measurements into the figures they print, shared
//! by the benches: rates, the best of runs, medians, ratios.
#![allow(dead_code)]

use std::time::Duration;

/// `count` operations in `t`, per second.
pub(crate) fn rate(count: u64, t: Duration) -> f64 {
    count as f64 / t.as_secs_f64()
}

/// Keeps the best of `best` and `v`: the higher, or the lower.
pub(crate) fn keep_best(best: &mut Option<f64>, v: f64, higher_is_better: bool) {
    *best = Some(match *best {
        None => v,
        Some(b) if higher_is_better => b.max(v),
        Some(b) => b.min(v),
    });
}

/// `v / scale` with one decimal, or `-` for none.
pub(crate) fn fig(v: Option<f64>, scale: f64) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}", v / scale))
}

/// `a / b` as `1.23x`, or `-` when either is missing.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

/// A target's verdict.
pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

/// The median of `v` (the upper one of an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
