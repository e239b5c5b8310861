//! The wall clock a node reads for what expires by date: grant tokens
//! (their expiry is a date the control plane wrote in them) and the
//! revocations kept for them.
//!
//! A node reads it through a floor: never earlier than a time it already
//! read. A clock set back (by hand, or by a time service correcting it)
//! then cannot make an expired token valid again, nor bring back a token
//! whose revocation was forgotten because it had expired. The floor is
//! kept in the node's store: written with each revocation, and at most
//! every second while the clock is read (and when the node stops), so a
//! restart keeps it, give or take that second.
//!
//! The source is [`SystemClock`] unless the node is built with another
//! ([`NodeBuilder::wall_clock`](crate::NodeBuilder::wall_clock)): a test
//! that moves time, or a deployment with its own trusted time.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//!
//! use capwire::clock::WallClock;
//!
//! /// A clock a test sets by hand.
//! #[derive(Debug, Default)]
//! struct Manual(AtomicU64);
//!
//! impl WallClock for Manual {
//!     fn now(&self) -> SystemTime {
//!         UNIX_EPOCH + Duration::from_secs(self.0.load(Ordering::SeqCst))
//!     }
//! }
//!
//! let clock = Arc::new(Manual::default());
//! clock.0.store(1_900_000_000, Ordering::SeqCst);
//! let builder = capwire::Node::builder("clocked").wall_clock(clock.clone());
//! # drop(builder);
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a node reads the date.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    /// The date now.
    fn now(&self) -> SystemTime;
}

/// The system's clock ([`SystemTime::now`]): the default.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A [`WallClock`] read through a floor: never earlier than a time it
/// already gave.
pub(crate) struct Clock {
    source: Arc<dyn WallClock>,
    /// The latest time given, in microseconds since the Unix epoch.
    floor_us: AtomicU64,
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Clock")
            .field("source", &self.source)
            .field("floor_us", &self.floor_us.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Clock {
    pub(crate) fn new(source: Arc<dyn WallClock>) -> Self {
        Self {
            source,
            floor_us: AtomicU64::new(0),
        }
    }

    /// The date now: the source's, or the latest given when the source
    /// went back.
    pub(crate) fn now(&self) -> SystemTime {
        if crate::seeded_bugs::planted(crate::seeded_bugs::Bug::ClockRunsBack) {
            return self.source.now();
        }
        let read = micros(self.source.now());
        let before = self.floor_us.fetch_max(read, Ordering::SeqCst);
        UNIX_EPOCH + Duration::from_micros(read.max(before))
    }

    /// The date now in milliseconds since the Unix epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        micros(self.now()) / 1000
    }

    /// The latest date given, in milliseconds since the Unix epoch (0
    /// before the first): what the store keeps as the floor.
    pub(crate) fn given_ms(&self) -> u64 {
        self.floor_us.load(Ordering::SeqCst) / 1000
    }

    /// Never earlier than `ms` (milliseconds since the Unix epoch) from
    /// now on: a floor kept in the store.
    pub(crate) fn raise_floor_ms(&self, ms: u64) {
        self.floor_us
            .fetch_max(ms.saturating_mul(1000), Ordering::SeqCst);
    }
}

/// A clock stopped at one date, for unit tests.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Stopped(pub(crate) SystemTime);

#[cfg(test)]
impl WallClock for Stopped {
    fn now(&self) -> SystemTime {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug)]
    struct Set(Mutex<SystemTime>);

    impl WallClock for Set {
        fn now(&self) -> SystemTime {
            *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_clock_set_back_reads_as_the_latest_time_given() {
        let source = Arc::new(Set(Mutex::new(at(2_000))));
        let clock = Clock::new(source.clone());
        assert_eq!(clock.now(), at(2_000));
        *source
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at(1_000);
        assert_eq!(clock.now(), at(2_000));
        *source
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at(3_000);
        assert_eq!(clock.now(), at(3_000));
        assert_eq!(clock.now_ms(), 3_000_000);
    }

    #[test]
    fn a_stored_floor_holds_from_the_start() {
        let clock = Clock::new(Arc::new(Set(Mutex::new(at(1_000)))));
        clock.raise_floor_ms(5_000_000);
        assert_eq!(clock.now(), at(5_000));
        clock.raise_floor_ms(4_000_000);
        assert_eq!(clock.now(), at(5_000));
    }
}
