//! Bounded exponential backoff with jitter for reconnecting to contacts.

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
}
