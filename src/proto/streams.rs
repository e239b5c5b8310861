//! Streams in the session core (protocol 2), as plain state: the credit of
//! the peer's streams we serve, and the credit and windows of our own
//! stream calls. No I/O; the session core decides with it.
//!
//! Credit flows as in quinn-proto's and h2's stream windows: the receiver
//! of items grants (`credit` frames: items and bytes, adding up), the
//! sender never exceeds what it was granted, and the receiver grants again
//! as its application takes items, not as they arrive.
//!
//! ```text
//!  caller (opened)                              callee (served)
//!  control + credit(window) ─────────────────►  credit += window
//!                      ◄──── item (within credit, credit -= 1 item, len bytes)
//!  app takes items; half a window taken, or
//!  everything taken ─── credit(taken) ───────►  credit += taken; a waiting
//!                      ◄──── response (the end)                 handler wakes
//! ```

use std::collections::{HashMap, VecDeque};

use capwire_envelope::ReqId;

/// Credit a caller grants a stream at once: the most it buffers for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Items.
    pub(crate) items: u32,
    /// Bytes of items (each item's encoded `item` value).
    pub(crate) bytes: u32,
}

/// The most credit a served stream holds: credit beyond it is not an
/// error (a grant only permits sending), it is just not counted.
const MAX_CREDIT: u64 = u32::MAX as u64;

/// A stream we serve: the peer called one of our stream verbs.
#[derive(Debug)]
struct Served {
    /// The job running it.
    job: u64,
    items: u64,
    bytes: u64,
    /// The bytes of the first grant (the caller's window): an item larger
    /// than it could never be sent.
    window_bytes: Option<u64>,
    /// Its handler waits for credit.
    waiting: bool,
}

/// One of our stream calls.
#[derive(Debug)]
struct Opened<S> {
    sink: S,
    window: Window,
    /// Credit the peer may still use.
    items: u64,
    bytes: u64,
    /// Taken by our application and not yet granted again.
    taken_items: u64,
    taken_bytes: u64,
    /// Items delivered and not yet taken by our application.
    buffered: u64,
    /// Its grant waits in `credits`.
    queued: bool,
}

/// Why an item of a stream we serve cannot go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// No credit for it yet: the handler waits for [`Streams::grant`] to
    /// name its job.
    NoCredit,
    /// Larger than the caller's whole window: it can never be sent.
    LargerThanWindow,
    /// The stream is not (or no longer) served.
    Gone,
}

/// What an item from the peer for one of our calls is.
#[derive(Debug)]
pub(crate) enum Arrived<'a, S> {
    /// Within credit: deliver it here.
    Deliver(&'a S),
    /// Not one of our streams (one we gave up on, or never had): ignored.
    Unknown,
    /// Beyond the credit we granted: the peer broke the protocol.
    Excess,
}

/// The streams of one session.
#[derive(Debug)]
pub(crate) struct Streams<S> {
    served: HashMap<ReqId, Served, foldhash::fast::RandomState>,
    opened: HashMap<ReqId, Opened<S>, foldhash::fast::RandomState>,
    /// Our streams whose grant is to be sent, in order.
    credits: VecDeque<ReqId>,
    /// Bytes of window held by our open streams.
    window_bytes: u64,
}

impl<S> Default for Streams<S> {
    fn default() -> Self {
        Self {
            served: HashMap::default(),
            opened: HashMap::default(),
            credits: VecDeque::new(),
            window_bytes: 0,
        }
    }
}

impl<S> Streams<S> {
    // -----------------------------------------------------------------
    // Streams we serve

    /// The peer's stream `req_id` runs as `job`, with no credit yet.
    pub(crate) fn serve(&mut self, req_id: ReqId, job: u64) {
        self.served.insert(
            req_id,
            Served {
                job,
                items: 0,
                bytes: 0,
                window_bytes: None,
                waiting: false,
            },
        );
    }

    /// Streams we serve now.
    pub(crate) fn served(&self) -> usize {
        self.served.len()
    }

    /// The peer grants `items` and `bytes` more to its stream `req_id`;
    /// the job to wake when its handler waited for credit. A grant for a
    /// stream we do not serve (it ended, or never was) is ignored.
    pub(crate) fn grant(&mut self, req_id: &ReqId, items: u32, bytes: u32) -> Option<u64> {
        let s = self.served.get_mut(req_id)?;
        s.items = (s.items + u64::from(items)).min(MAX_CREDIT);
        s.bytes = (s.bytes + u64::from(bytes)).min(MAX_CREDIT);
        // The first grant with bytes is the caller's window.
        if bytes > 0 {
            s.window_bytes.get_or_insert(u64::from(bytes));
        }
        // A grant that leaves no item to send wakes nobody, and the handler
        // still waits: the grant that gives it an item must wake it.
        let wake = s.waiting && s.items > 0;
        if wake {
            s.waiting = false;
        }
        wake.then_some(s.job)
    }

    /// Takes the credit for one item of `len` bytes of the stream
    /// `req_id`, if there is enough; otherwise the handler is marked as
    /// waiting.
    pub(crate) fn spend(&mut self, req_id: &ReqId, len: usize) -> Result<(), Held> {
        let Some(s) = self.served.get_mut(req_id) else {
            return Err(Held::Gone);
        };
        let len = len as u64;
        if s.window_bytes.is_some_and(|w| len > w) {
            return Err(Held::LargerThanWindow);
        }
        if s.items == 0 || s.bytes < len {
            s.waiting = true;
            return Err(Held::NoCredit);
        }
        s.items -= 1;
        s.bytes -= len;
        Ok(())
    }

    /// The stream `req_id` we served has ended.
    pub(crate) fn unserve(&mut self, req_id: &ReqId) {
        self.served.remove(req_id);
    }

    // -----------------------------------------------------------------
    // Our streams

    /// Bytes of window our open streams hold.
    pub(crate) fn window_bytes(&self) -> u64 {
        self.window_bytes
    }

    /// Our streams open now.
    pub(crate) fn opened(&self) -> usize {
        self.opened.len()
    }

    /// Opens our stream `req_id`, whose items go to `sink`, granting
    /// `window` at once (the caller queues that first grant after the
    /// stream's control frame).
    pub(crate) fn open(&mut self, req_id: ReqId, sink: S, window: Window) {
        self.window_bytes += u64::from(window.bytes);
        self.opened.insert(
            req_id,
            Opened {
                sink,
                window,
                items: u64::from(window.items),
                bytes: u64::from(window.bytes),
                taken_items: 0,
                taken_bytes: 0,
                buffered: 0,
                queued: false,
            },
        );
    }

    /// An item of `len` bytes arrived for `req_id`.
    pub(crate) fn arrived(&mut self, req_id: &ReqId, len: usize) -> Arrived<'_, S> {
        let Some(s) = self.opened.get_mut(req_id) else {
            return Arrived::Unknown;
        };
        let len = len as u64;
        if s.items == 0 || s.bytes < len {
            return Arrived::Excess;
        }
        s.items -= 1;
        s.bytes -= len;
        s.buffered += 1;
        Arrived::Deliver(&s.sink)
    }

    /// Our application took `items` items of `bytes` bytes of `req_id`:
    /// `true` when a grant is now to be sent (half a window was taken, or
    /// everything delivered was, so that a producer never waits on credit
    /// the application no longer needs).
    pub(crate) fn taken(&mut self, req_id: &ReqId, items: u64, bytes: u64) -> bool {
        let Some(s) = self.opened.get_mut(req_id) else {
            return false;
        };
        s.taken_items += items;
        s.taken_bytes += bytes;
        s.buffered = s.buffered.saturating_sub(items);
        let half = s.taken_items * 2 >= u64::from(s.window.items)
            || s.taken_bytes * 2 >= u64::from(s.window.bytes);
        let drained = s.buffered == 0 && s.taken_items > 0;
        if (half || drained) && !s.queued {
            s.queued = true;
            self.credits.push_back(req_id.clone());
            return true;
        }
        false
    }

    /// The next grant to send: (req_id, items, bytes). Grants of streams
    /// that ended meanwhile are skipped.
    pub(crate) fn next_grant(&mut self) -> Option<(ReqId, u32, u32)> {
        while let Some(req_id) = self.credits.pop_front() {
            let Some(s) = self.opened.get_mut(&req_id) else {
                continue;
            };
            s.queued = false;
            let items = u32::try_from(s.taken_items).unwrap_or(u32::MAX);
            let bytes = u32::try_from(s.taken_bytes).unwrap_or(u32::MAX);
            s.taken_items -= u64::from(items);
            s.taken_bytes -= u64::from(bytes);
            s.items += u64::from(items);
            s.bytes += u64::from(bytes);
            if items == 0 && bytes == 0 {
                continue;
            }
            return Some((req_id, items, bytes));
        }
        None
    }

    /// Whether grants wait to be sent.
    pub(crate) fn has_grants(&self) -> bool {
        !self.credits.is_empty()
    }

    /// Our stream `req_id` ended (its response arrived, or we gave up):
    /// its sink, if it was open.
    pub(crate) fn close(&mut self, req_id: &ReqId) -> Option<S> {
        let s = self.opened.remove(req_id)?;
        self.window_bytes -= u64::from(s.window.bytes);
        Some(s.sink)
    }

    /// Forgets everything (the session ended); the sinks of our streams.
    pub(crate) fn clear(&mut self) -> Vec<S> {
        self.served.clear();
        self.credits.clear();
        self.window_bytes = 0;
        self.opened.drain().map(|(_, s)| s.sink).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ReqId {
        ReqId::try_from(s).unwrap()
    }

    #[test]
    fn a_served_stream_sends_within_its_credit_and_wakes_on_a_grant() {
        let mut s: Streams<()> = Streams::default();
        s.serve(id("a"), 7);
        assert_eq!(s.spend(&id("a"), 10), Err(Held::NoCredit));
        assert_eq!(s.grant(&id("a"), 2, 25), Some(7), "the waiting job wakes");
        assert_eq!(s.spend(&id("a"), 10), Ok(()));
        assert_eq!(s.spend(&id("a"), 20), Err(Held::NoCredit), "15 bytes left");
        assert_eq!(s.grant(&id("a"), 0, 5), Some(7));
        assert_eq!(s.spend(&id("a"), 20), Ok(()));
        assert_eq!(s.spend(&id("a"), 1), Err(Held::NoCredit), "no item left");
        // Larger than the first grant: never.
        assert_eq!(s.spend(&id("a"), 26), Err(Held::LargerThanWindow));
        // Absurd grants are capped, not an error.
        for _ in 0..4 {
            s.grant(&id("a"), u32::MAX, u32::MAX);
        }
        assert_eq!(s.spend(&id("a"), 25), Ok(()));
        s.unserve(&id("a"));
        assert_eq!(s.spend(&id("a"), 1), Err(Held::Gone));
        assert_eq!(
            s.grant(&id("a"), 1, 1),
            None,
            "a grant for nothing is ignored"
        );
    }

    #[test]
    fn a_grant_of_no_item_keeps_the_handler_waiting_for_the_next() {
        let mut s: Streams<()> = Streams::default();
        s.serve(id("a"), 7);
        assert_eq!(s.grant(&id("a"), 1, 100), None, "nobody waits yet");
        assert_eq!(s.spend(&id("a"), 10), Ok(()));
        assert_eq!(s.spend(&id("a"), 10), Err(Held::NoCredit));
        assert_eq!(s.grant(&id("a"), 0, 0), None, "still no item to send");
        assert_eq!(s.grant(&id("a"), 0, 50), None, "bytes alone send nothing");
        assert_eq!(s.grant(&id("a"), 3, 0), Some(7), "the waiting job wakes");
        assert_eq!(s.spend(&id("a"), 10), Ok(()));
    }

    #[test]
    fn the_window_is_the_first_grant_with_bytes() {
        let mut s: Streams<()> = Streams::default();
        s.serve(id("w"), 1);
        s.grant(&id("w"), 4, 0);
        assert_eq!(s.spend(&id("w"), 10), Err(Held::NoCredit), "no bytes yet");
        s.grant(&id("w"), 0, 100);
        assert_eq!(s.spend(&id("w"), 10), Ok(()));
        assert_eq!(s.spend(&id("w"), 101), Err(Held::LargerThanWindow));
    }

    #[test]
    fn our_stream_grants_again_as_items_are_taken() {
        let mut s: Streams<u8> = Streams::default();
        let w = Window {
            items: 4,
            bytes: 100,
        };
        s.open(id("b"), 9, w);
        assert_eq!(s.window_bytes(), 100);
        for _ in 0..4 {
            assert!(matches!(s.arrived(&id("b"), 10), Arrived::Deliver(9)));
        }
        assert!(matches!(s.arrived(&id("b"), 1), Arrived::Excess));
        assert!(matches!(s.arrived(&id("x"), 1), Arrived::Unknown));
        assert!(!s.taken(&id("b"), 1, 10), "a quarter taken, more buffered");
        assert!(s.taken(&id("b"), 1, 10), "half the items taken");
        assert!(!s.taken(&id("b"), 1, 10), "a grant is queued already");
        assert_eq!(s.next_grant(), Some((id("b"), 3, 30)));
        assert_eq!(s.next_grant(), None);
        // The last buffered item taken: what was taken goes back at once.
        assert!(s.taken(&id("b"), 1, 10));
        assert_eq!(s.next_grant(), Some((id("b"), 1, 10)));
        assert_eq!(s.close(&id("b")), Some(9));
        assert_eq!(s.window_bytes(), 0);
        assert!(!s.taken(&id("b"), 1, 1));
    }

    #[test]
    fn grants_of_ended_streams_are_skipped() {
        let mut s: Streams<u8> = Streams::default();
        let w = Window { items: 2, bytes: 8 };
        s.open(id("c"), 1, w);
        s.open(id("d"), 2, w);
        for r in ["c", "d"] {
            let _ = s.arrived(&id(r), 4);
            assert!(s.taken(&id(r), 1, 4));
        }
        s.close(&id("c"));
        assert_eq!(s.next_grant(), Some((id("d"), 1, 4)));
        assert!(!s.has_grants());
        assert_eq!(s.clear(), vec![2]);
    }
}
