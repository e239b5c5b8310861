//! Bounded exponential backoff with jitter for reconnecting to contacts.
//!
//! Kept here rather than taken from a crate such as backon: its
//! exponential backoff adds its jitter on top of the capped delay (up to
//! twice `reconnect_max`, which the limits document as the longest delay
//! between redials) and scales durations through `f32`; the same
//! behaviour from it would take about as many lines as this whole file.
//! Here a delay is always within `[3/4 base, base]`, `base` doubling
//! exactly (`Duration` arithmetic) up to the cap, and the jitter is
//! seeded from the contact's id: no RNG to draw from, yet nodes that lost
//! the same peer do not redial in step. The tests below pin all three.

use std::time::Duration;

/// Reconnection delays: doubling from `initial` up to `max`, each with up to
/// 25% random jitter subtracted so that many nodes do not retry in step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    seed: u64,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Self {
            initial,
            max,
            current: initial,
            seed: seed | 1,
        }
    }

    /// The next delay to wait before retrying.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        // xorshift64: jitter only, not security relevant.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let quarter = base.as_micros() as u64 / 4;
        let jitter = if quarter == 0 { 0 } else { self.seed % quarter };
        base.saturating_sub(Duration::from_micros(jitter))
    }

    /// Back to the initial delay, after a successful connection.
    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 42);
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = Duration::from_millis(100 * (1 << i.min(5))).min(Duration::from_secs(2));
            assert!(*d <= base && *d >= base * 3 / 4, "{i}: {d:?} vs {base:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    /// The cap is the longest delay ever waited, whatever the seed and
    /// however long the contact stays away (a jitter added on top of the
    /// cap would break this), and the shortest is 3/4 of it.
    #[test]
    fn no_delay_exceeds_the_cap_for_any_seed() {
        let max = Duration::from_secs(30);
        for seed in 0..200u64 {
            let mut b = Backoff::new(
                Duration::from_millis(100),
                max,
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let delays: Vec<_> = (0..64).map(|_| b.next_delay()).collect();
            assert!(delays.iter().all(|d| *d <= max), "seed {seed}: {delays:?}");
            assert!(
                delays[20..].iter().all(|d| *d >= max * 3 / 4),
                "seed {seed}: {delays:?}"
            );
        }
    }

    /// Doubling is exact: with a delay too short to jitter (a quarter of it
    /// under a microsecond), the delays are the powers of two themselves.
    #[test]
    fn doubling_is_exact() {
        let mut b = Backoff::new(Duration::from_nanos(1), Duration::from_nanos(1 << 10), 7);
        let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
        let want: Vec<_> = (0..12u32)
            .map(|i| Duration::from_nanos(1 << i.min(10)))
            .collect();
        assert_eq!(delays, want);
    }

    /// The same seed gives the same delays; other seeds (other contacts)
    /// give others, so that redials are spread out.
    #[test]
    fn the_jitter_follows_the_seed() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        let runs: std::collections::HashSet<_> = (1..=16u64).map(|s| run(s * 1_000_003)).collect();
        assert!(runs.len() > 12, "{} distinct of 16", runs.len());
    }
}
