//! The monitoring tap: where the runtime drops a copy of every control
//! envelope it receives or sends while a control plane is bound, for
//! `core.monitoring` to send on. Taking a copy never blocks and never
//! allocates on the data path beyond one queue slot: the frame's bytes
//! are shared, not copied, and a full queue drops the copy (its sequence
//! number is used all the same, so the control plane sees the gap).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use capwire_envelope::NodeId;
use tokio::sync::Notify;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which way a tapped frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    In,
    Out,
}

/// One tapped control frame, waiting to be turned into a copy.
#[derive(Debug, Clone)]
pub(crate) struct Tapped {
    pub(crate) seq: u64,
    pub(crate) way: Way,
    pub(crate) peer: NodeId,
    pub(crate) at_ms: u64,
    /// The control frame; for a frame whose args were over the body limit,
    /// a copy of it with `null` args (then `body_len` says how long they were).
    pub(crate) frame: Bytes,
    /// The args' length when they were left out.
    pub(crate) cut: Option<u64>,
    /// The token that let an inbound controller call through.
    pub(crate) grant: Option<std::sync::Arc<str>>,
    /// The frame's `trace` item, if it has one, was believed (a context
    /// the node dropped is not shown in the copy either).
    pub(crate) traced: bool,
}

/// Bounds of the tap's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TapLimits {
    pub(crate) max_len: usize,
    pub(crate) max_bytes: usize,
    /// Args longer than this are left out of the copy.
    pub(crate) body_max: usize,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Tapped>,
    bytes: usize,
    /// Who the copies are for; frames to or from it are not copied.
    controller: Option<NodeId>,
    /// The last sequence number given out before `controller` was set:
    /// what its first copy's gap is counted from.
    base: u64,
}

/// The tap. Off (one relaxed load per frame) unless a control plane is
/// bound.
#[derive(Debug)]
pub(crate) struct Tap {
    on: AtomicBool,
    seq: AtomicU64,
    queue: Mutex<Queue>,
    ready: Notify,
    limits: TapLimits,
    /// Copies sent to the control plane.
    sent: AtomicU64,
    /// Copies taken (their sequence number used) but never sent.
    dropped: AtomicU64,
}

/// Milliseconds since the Unix epoch, by the wall clock.
pub(crate) use crate::time::unix_ms;

/// `frame` (a control frame) with `null` args and the args' length, when
/// its args are longer than `body_max`; `Some(None)` when they are not;
/// `None` for a frame that is not a control envelope.
#[allow(clippy::option_option)]
fn without_args(frame: &Bytes, body_max: usize) -> Option<Option<(Bytes, u64)>> {
    let capwire_envelope::FrameRef::Control(c) = capwire_envelope::decode_frame(frame).ok()? else {
        return None;
    };
    if c.args.len() <= body_max {
        return Some(None);
    }
    let mut out = Vec::with_capacity(64 + c.cap.len() + c.verb.len());
    capwire_envelope::encode_control(&mut out, c.cap, c.verb, &c.req_id, c.budget_ms, &[0xf6])
        .ok()?;
    Some(Some((Bytes::from(out), c.args.len() as u64)))
}

impl Tap {
    pub(crate) fn new(limits: TapLimits) -> Self {
        Self {
            on: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            limits,
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Copies go to `controller` from now on; `None` turns the tap off and
    /// drops what is queued.
    pub(crate) fn set_controller(&self, controller: Option<NodeId>) {
        let mut q = lock(&self.queue);
        if q.controller != controller {
            self.count_dropped(q.items.len());
            q.items.clear();
            q.bytes = 0;
            q.base = self.seq.load(Ordering::Relaxed);
        }
        q.controller = controller;
        self.on.store(controller.is_some(), Ordering::Release);
    }

    /// The last sequence number given out (0: none yet).
    pub(crate) fn last_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Takes a copy of `frame`, sent to or received from `peer`;
    /// `traced`: its `trace` item, if any, was believed.
    pub(crate) fn record(
        &self,
        way: Way,
        peer: &NodeId,
        frame: &Bytes,
        grant: Option<std::sync::Arc<str>>,
        traced: bool,
    ) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        // A large frame is not kept: a small one in its place says what it
        // was (its args are left out of the copy anyway).
        let (frame, cut) = if frame.len() > self.limits.body_max {
            match without_args(frame, self.limits.body_max) {
                Some(Some((small, len))) => (small, Some(len)),
                Some(None) => (frame.clone(), None),
                None => return,
            }
        } else {
            (frame.clone(), None)
        };
        let mut q = lock(&self.queue);
        let Some(controller) = q.controller else {
            return;
        };
        // The control plane's own traffic is not copied back to it (and
        // the copies themselves are sent to it).
        if *peer == controller {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if q.items.len() >= self.limits.max_len || q.bytes + frame.len() > self.limits.max_bytes {
            // Dropped: `seq` is used, so the next delivered copy shows it.
            drop(q);
            self.count_dropped(1);
            return;
        }
        q.bytes += frame.len();
        q.items.push_back(Tapped {
            seq,
            way,
            peer: *peer,
            at_ms: unix_ms(),
            frame,
            cut,
            grant,
            traced,
        });
        drop(q);
        self.ready.notify_one();
    }

    /// The oldest waiting copy, the control plane it is for, and the
    /// sequence number that control plane's copies count from.
    pub(crate) fn pop(&self) -> Option<(NodeId, u64, Tapped)> {
        let mut q = lock(&self.queue);
        let controller = q.controller?;
        let item = q.items.pop_front()?;
        q.bytes -= item.frame.len();
        Some((controller, q.base, item))
    }

    /// Waits until something may have been queued.
    pub(crate) async fn ready(&self) {
        self.ready.notified().await;
    }

    /// Copies waiting.
    pub(crate) fn queued(&self) -> usize {
        lock(&self.queue).items.len()
    }

    /// A copy reached the control plane's session.
    pub(crate) fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` copies were given up.
    pub(crate) fn count_dropped(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Copies (sent, dropped) so far.
    pub(crate) fn copies(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(max_len: usize) -> Tap {
        Tap::new(TapLimits {
            max_len,
            max_bytes: 1 << 20,
            body_max: 1 << 10,
        })
    }

    #[test]
    fn off_until_a_controller_is_set_and_never_copies_its_traffic() {
        let t = tap(8);
        let (cp, other) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        let frame = Bytes::from_static(b"x");
        t.record(Way::In, &other, &frame, None, true);
        assert_eq!((t.queued(), t.last_seq()), (0, 0));
        t.set_controller(Some(cp));
        t.record(Way::In, &cp, &frame, None, true);
        t.record(Way::Out, &other, &frame, None, true);
        assert_eq!((t.queued(), t.last_seq()), (1, 1));
        let (to, base, item) = t.pop().unwrap();
        assert_eq!(
            (to, base, item.seq, item.way, item.peer),
            (cp, 0, 1, Way::Out, other)
        );
    }

    #[test]
    fn a_full_queue_drops_but_uses_the_sequence_number() {
        let t = tap(2);
        let (cp, other) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        t.set_controller(Some(cp));
        let frame = Bytes::from_static(b"x");
        for _ in 0..5 {
            t.record(Way::In, &other, &frame, None, true);
        }
        assert_eq!(t.queued(), 2);
        assert_eq!(t.copies(), (0, 3));
        assert_eq!(t.pop().unwrap().2.seq, 1);
        assert_eq!(t.pop().unwrap().2.seq, 2);
        t.record(Way::In, &other, &frame, None, true);
        // Seqs 3 to 5 were dropped: the next copy is 6.
        assert_eq!(t.pop().unwrap().2.seq, 6);
        t.record(Way::In, &other, &frame, None, true);
        // Unbinding gives up what was waiting.
        t.set_controller(None);
        assert_eq!(t.copies(), (0, 4));
        t.record(Way::In, &other, &frame, None, true);
        assert!(t.pop().is_none());
    }
}

#[cfg(test)]
mod big_frames {
    use super::*;

    #[test]
    fn a_frame_over_the_body_limit_is_kept_small_with_its_length() {
        let t = Tap::new(TapLimits {
            max_len: 4,
            max_bytes: 4096,
            body_max: 1024,
        });
        let (cp, other) = (NodeId::from_bytes([1; 32]), NodeId::from_bytes([2; 32]));
        t.set_controller(Some(cp));
        let args = capwire_envelope::to_vec(&"x".repeat(100_000)).unwrap();
        let mut frame = Vec::new();
        capwire_envelope::encode_control(
            &mut frame,
            "app.x",
            "put",
            &capwire_envelope::ReqId::try_from("r1").unwrap(),
            None,
            &args,
        )
        .unwrap();
        t.record(Way::In, &other, &Bytes::from(frame), None, true);
        let (_, _, item) = t.pop().expect("copied although far over the queue's bytes");
        assert_eq!(item.cut, Some(args.len() as u64));
        assert!(item.frame.len() < 64);
    }
}
