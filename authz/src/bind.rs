//! The bind ceremony of `core.monitoring` and the binding it produces.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use capwire_envelope::{ErrorBody, ErrorCode, NodeId, RawValue};
use capwire_manifest::MonitoringStatus;
use rand_core::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use subtle::{Choice, ConstantTimeEq};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::binding::Binding;
use crate::error::AuthzError;
use crate::limits::{BIND_CODE_ALPHABET, BIND_CODE_LEN, BIND_MAX_ATTEMPTS, BIND_TTL};

/// A bind code: [`BIND_CODE_LEN`] characters of [`BIND_CODE_ALPHABET`],
/// 5 bits each, 50 bits of entropy in all. With [`BIND_MAX_ATTEMPTS`]
/// guesses per code, a guesser wins with probability 3 / 2^50.
///
/// Zeroized on drop; `Debug` does not show it.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct BindCode([u8; BIND_CODE_LEN]);

impl BindCode {
    /// A fresh code from a cryptographic RNG.
    ///
    /// # Errors
    /// [`AuthzError::RngFailed`] when the RNG fails; there is no fallback.
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Result<Self, AuthzError> {
        let mut raw = [0u8; BIND_CODE_LEN];
        rng.try_fill_bytes(&mut raw)
            .map_err(|_| AuthzError::RngFailed)?;
        let alphabet = BIND_CODE_ALPHABET.as_bytes();
        let mut code = [0u8; BIND_CODE_LEN];
        for (c, r) in code.iter_mut().zip(raw.iter()) {
            // 32 divides 256, so the low five bits are uniform.
            *c = alphabet[usize::from(r & 0x1f)];
        }
        raw.zeroize();
        Ok(Self(code))
    }

    /// A fresh code from the operating system's RNG.
    ///
    /// # Errors
    /// [`AuthzError::RngFailed`] when the operating system's RNG fails.
    pub fn random() -> Result<Self, AuthzError> {
        Self::generate(&mut rand_core::OsRng)
    }

    /// A code in the bind-code format, e.g. typed in by a person.
    ///
    /// # Errors
    /// [`AuthzError::MalformedCode`] when it is not [`BIND_CODE_LEN`]
    /// characters of [`BIND_CODE_ALPHABET`].
    pub fn parse(s: &str) -> Result<Self, AuthzError> {
        let bytes = s.as_bytes();
        if bytes.len() != BIND_CODE_LEN
            || !bytes
                .iter()
                .all(|b| BIND_CODE_ALPHABET.as_bytes().contains(b))
        {
            return Err(AuthzError::MalformedCode);
        }
        let mut code = [0u8; BIND_CODE_LEN];
        code.copy_from_slice(bytes);
        Ok(Self(code))
    }

    /// The code's text, for printing the invite.
    pub fn expose(&self) -> &str {
        // Only alphabet bytes (ASCII) are ever stored.
        std::str::from_utf8(&self.0).unwrap_or("")
    }

    /// Compares with a candidate in constant time for any candidate of the
    /// right length; the length itself is public (the format is fixed).
    fn matches(&self, candidate: &str) -> Choice {
        let bytes = candidate.as_bytes();
        let mut buf = [0u8; BIND_CODE_LEN];
        for (i, slot) in buf.iter_mut().enumerate() {
            *slot = bytes.get(i).copied().unwrap_or(0);
        }
        let same = self.0.ct_eq(&buf) & Choice::from(u8::from(bytes.len() == BIND_CODE_LEN));
        buf.zeroize();
        same
    }
}

impl fmt::Debug for BindCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BindCode(<redacted>)")
    }
}

/// Why a bind attempt failed; the detail of the wire error `bind_failed`.
///
/// Serialised as a map tagged by `reason`, e.g.
/// `{"reason": "wrong_code", "attempts_left": 2}` or
/// `{"reason": "expired"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum BindFailure {
    /// No bind is pending.
    #[error("no bind is pending")]
    NoPending,
    /// The pending bind expired; it is now cleared.
    #[error("the pending bind expired")]
    Expired,
    /// The pending bind expects another control plane; no attempt used.
    #[error("the pending bind expects another control plane")]
    WrongSender,
    /// Wrong code; one attempt used.
    #[error("wrong code, {attempts_left} attempt(s) left")]
    WrongCode {
        /// Attempts left before the pending bind is cleared.
        attempts_left: u8,
    },
    /// Wrong code on the last attempt; the pending bind is now cleared.
    #[error("wrong code too many times; the pending bind is cleared")]
    TooManyAttempts,
}

impl BindFailure {
    /// The wire error code of every bind failure: `"bind_failed"`.
    pub const CODE: &'static str = "bind_failed";

    /// The error half of the response that answers a failed bind: code
    /// `bind_failed`, this failure as the message, and as `detail` the map
    /// `{reason, attempts_left?}`.
    pub fn error_body(&self) -> ErrorBody {
        let body = ErrorBody::new(ErrorCode::BindFailed, self.to_string());
        match RawValue::encode(self) {
            Ok(detail) => body.with_detail(detail),
            // A map of one text and one small integer always encodes.
            Err(_) => body,
        }
    }

    /// The `reason` text: `no_pending`, `expired`, `wrong_sender`,
    /// `wrong_code` or `too_many_attempts`.
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::NoPending => "no_pending",
            Self::Expired => "expired",
            Self::WrongSender => "wrong_sender",
            Self::WrongCode { .. } => "wrong_code",
            Self::TooManyAttempts => "too_many_attempts",
        }
    }
}

#[derive(Debug, Clone)]
struct PendingBind {
    code: BindCode,
    expected: Option<NodeId>,
    expires_at: Instant,
    attempts_used: u8,
}

/// What is known about the pending bind, without its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingInfo {
    /// The control plane it is reserved for, if any.
    pub expected: Option<NodeId>,
    /// When it expires.
    pub expires_at: Instant,
    /// Wrong codes still allowed.
    pub attempts_left: u8,
}

/// Why [`BindingState::try_bind_checked`] did not bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused<E> {
    /// The bind ceremony refused the attempt.
    Failed(BindFailure),
    /// The code was right, but the caller's check refused the bind; nothing
    /// changed.
    Check(E),
}

/// What a bind (or an unbind) replaced, to put back with
/// [`BindingState::undo_bind`] when it cannot be completed (its answer
/// cannot be built, or it cannot be written). Holds the pending bind's code: zeroized on drop, and its
/// `Debug` does not show it.
#[derive(Debug, Clone)]
pub struct BindUndo {
    controller: Option<NodeId>,
    pending: Option<PendingBind>,
    epoch: u64,
}

impl BindUndo {
    /// The epoch of the binding the bind (or unbind) made.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// The binding and the pending bind, as pure state: every method takes the
/// current time as an argument and does no I/O.
///
/// ```
/// use std::time::{Duration, Instant};
/// use capwire_authz::{BindCode, BindFailure, BindingState};
/// use capwire_envelope::{ErrorBody, ErrorCode, NodeId, RawValue};
///
/// let control_plane = NodeId::from_bytes([9; 32]);
/// let now = Instant::now();
/// let mut state = BindingState::new();
/// let code = BindCode::parse("ABCDE23456").unwrap();
/// state.create_pending(code, Some(control_plane), now);
///
/// let wrong = state.try_bind(&control_plane, "ZZZZZZZZZZ", now);
/// assert_eq!(wrong, Err(BindFailure::WrongCode { attempts_left: 2 }));
///
/// let binding = state.try_bind(&control_plane, "ABCDE23456", now + Duration::from_secs(5))?;
/// assert_eq!(binding.controller(), Some(&control_plane));
/// assert_eq!(binding.epoch(), 1);
/// # Ok::<(), BindFailure>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct BindingState {
    binding: Binding,
    pending: Option<PendingBind>,
}

impl BindingState {
    /// Unbound, nothing pending, epoch 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A state restored from storage: bound to `controller` (if any),
    /// nothing pending, epoch 0.
    pub fn restore(controller: Option<NodeId>) -> Self {
        Self {
            binding: Binding::new(controller, 0),
            pending: None,
        }
    }

    /// A state restored from storage with its epoch: bound as `binding`
    /// says, nothing pending. Epochs keep counting from there, so an
    /// answer remembered under an earlier epoch is never taken for one of
    /// the restored binding.
    pub fn restore_binding(binding: Binding) -> Self {
        Self {
            binding,
            pending: None,
        }
    }

    /// The current binding.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// Makes (or replaces) the pending bind: `code`, optionally reserved
    /// for one control plane, expiring [`BIND_TTL`] after `now`, with
    /// [`BIND_MAX_ATTEMPTS`] attempts.
    pub fn create_pending(&mut self, code: BindCode, expected: Option<NodeId>, now: Instant) {
        self.pending = Some(PendingBind {
            code,
            expected,
            // An unrepresentable expiry means "already expired": fail closed.
            expires_at: now.checked_add(BIND_TTL).unwrap_or(now),
            attempts_used: 0,
        });
    }

    /// Drops the pending bind; `true` if there was one.
    pub fn cancel_pending(&mut self) -> bool {
        self.pending.take().is_some()
    }

    /// The pending bind, if any and not expired at `now`.
    pub fn pending(&self, now: Instant) -> Option<PendingInfo> {
        self.pending
            .as_ref()
            .filter(|p| now < p.expires_at)
            .map(|p| PendingInfo {
                expected: p.expected,
                expires_at: p.expires_at,
                attempts_left: BIND_MAX_ATTEMPTS.saturating_sub(p.attempts_used),
            })
    }

    /// `on` when bound, else `pending` when a bind is pending at `now`,
    /// else `off`.
    pub fn status(&self, now: Instant) -> MonitoringStatus {
        if self.binding.is_bound() {
            MonitoringStatus::On
        } else if self.pending(now).is_some() {
            MonitoringStatus::Pending
        } else {
            MonitoringStatus::Off
        }
    }

    /// One bind attempt by `sender` with `code`, checked in this order:
    /// no pending bind → `NoPending`; expired → cleared, `Expired`; a
    /// reserved bind and another sender → `WrongSender` (no attempt used);
    /// wrong code → one attempt used, `WrongCode` with the attempts left, or
    /// `TooManyAttempts` and cleared at the last one. On success the
    /// sender is bound, the binding epoch bumped and the pending bind
    /// cleared.
    ///
    /// # Errors
    /// The [`BindFailure`] reason.
    pub fn try_bind(
        &mut self,
        sender: &NodeId,
        code: &str,
        now: Instant,
    ) -> Result<Binding, BindFailure> {
        match self.try_bind_checked(sender, code, now, |_| Ok::<(), ()>(())) {
            Ok((binding, _undo)) => Ok(binding),
            Err(Refused::Failed(f)) => Err(f),
            // The check above never refuses.
            Err(Refused::Check(())) => Err(BindFailure::NoPending),
        }
    }

    /// As [`try_bind`](Self::try_bind), with one more step between a right
    /// code and the bind: `check` sees the binding the bind would make and
    /// may refuse it (say, because the answer to the bind could not be
    /// delivered). A refusal changes nothing: the code is not used up and
    /// no attempt is counted. On success, the [`BindUndo`] puts everything
    /// back if the bind cannot be completed after all
    /// ([`undo_bind`](Self::undo_bind)).
    ///
    /// ```
    /// use std::time::Instant;
    /// use capwire_authz::{BindCode, BindingState, Refused};
    /// use capwire_envelope::NodeId;
    ///
    /// let (cp, now) = (NodeId::from_bytes([7; 32]), Instant::now());
    /// let mut state = BindingState::new();
    /// state.create_pending(BindCode::parse("ABCDE23456").unwrap(), None, now);
    /// let refused = state.try_bind_checked(&cp, "ABCDE23456", now, |_| Err("too large"));
    /// assert!(matches!(refused, Err(Refused::Check("too large"))));
    /// assert_eq!(state.pending(now).unwrap().attempts_left, 3, "nothing used");
    ///
    /// let (binding, undo) = state.try_bind_checked(&cp, "ABCDE23456", now, |_| Ok::<(), ()>(())).unwrap();
    /// assert_eq!(binding.controller(), Some(&cp));
    /// assert!(state.undo_bind(undo));
    /// assert_eq!(state.binding().controller(), None);
    /// assert!(state.binding().epoch() > binding.epoch(), "epochs only grow");
    /// assert!(state.pending(now).is_some(), "the code works again");
    /// ```
    ///
    /// # Errors
    /// [`Refused::Failed`] with the [`BindFailure`] reason, or
    /// [`Refused::Check`] with what `check` said.
    pub fn try_bind_checked<E>(
        &mut self,
        sender: &NodeId,
        code: &str,
        now: Instant,
        check: impl FnOnce(&Binding) -> Result<(), E>,
    ) -> Result<(Binding, BindUndo), Refused<E>> {
        self.verify(sender, code, now).map_err(Refused::Failed)?;
        let next = self.binding.bumped(Some(*sender));
        check(&next).map_err(Refused::Check)?;
        let undo = BindUndo {
            controller: self.binding.controller().copied(),
            pending: self.pending.take(),
            epoch: next.epoch(),
        };
        self.binding = next;
        Ok((next, undo))
    }

    /// Puts back what the bind that gave `undo` replaced: the control
    /// plane bound before it (under a new epoch, so that nothing decided
    /// under the undone bind holds) and its pending bind, with the attempts
    /// it had left, unless a newer one was made since. Only while that bind
    /// is still the current binding; `false` (and nothing done) otherwise.
    pub fn undo_bind(&mut self, undo: BindUndo) -> bool {
        if self.binding.epoch() != undo.epoch {
            return false;
        }
        self.binding = self.binding.bumped(undo.controller);
        if self.pending.is_none() {
            self.pending = undo.pending;
        }
        true
    }

    /// The checks of a bind attempt, in order; a wrong code uses an attempt.
    fn verify(&mut self, sender: &NodeId, code: &str, now: Instant) -> Result<(), BindFailure> {
        let Some(pending) = self.pending.as_mut() else {
            return Err(BindFailure::NoPending);
        };
        if now >= pending.expires_at {
            self.pending = None;
            return Err(BindFailure::Expired);
        }
        if pending.expected.is_some_and(|expected| expected != *sender) {
            return Err(BindFailure::WrongSender);
        }
        if !bool::from(pending.code.matches(code)) {
            pending.attempts_used = pending.attempts_used.saturating_add(1);
            if pending.attempts_used >= BIND_MAX_ATTEMPTS {
                self.pending = None;
                return Err(BindFailure::TooManyAttempts);
            }
            return Err(BindFailure::WrongCode {
                attempts_left: BIND_MAX_ATTEMPTS - pending.attempts_used,
            });
        }
        Ok(())
    }

    /// Unbinds (`core.monitoring/disable`): clears the binding and bumps the
    /// epoch. Returns the control plane that was bound; when none was,
    /// nothing changes.
    pub fn unbind(&mut self) -> Option<NodeId> {
        self.unbind_undoable().map(|(previous, _)| previous)
    }

    /// As [`unbind`](Self::unbind), with what puts the binding back if the
    /// unbind cannot be completed (it could not be written):
    /// [`undo_bind`](Self::undo_bind) binds the same control plane again,
    /// under a new epoch.
    pub fn unbind_undoable(&mut self) -> Option<(NodeId, BindUndo)> {
        let previous = self.binding.controller().copied()?;
        self.binding = self.binding.bumped(None);
        let undo = BindUndo {
            controller: Some(previous),
            pending: None,
            epoch: self.binding.epoch(),
        };
        Some((previous, undo))
    }
}

/// A [`BindingState`] shared between threads: every operation takes the
/// lock for its own duration only and never blocks on anything else, so
/// two concurrent binds are serialised and exactly one can win.
#[derive(Debug, Default)]
pub struct SharedBinding {
    state: Mutex<BindingState>,
}

impl SharedBinding {
    /// Shares `state`.
    pub fn new(state: BindingState) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BindingState> {
        // The state is updated in place by code that does not panic, so a
        // poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current binding, for [`decide`](crate::decide) and for
    /// [`Permit::recheck`](crate::Permit::recheck).
    pub fn snapshot(&self) -> Binding {
        self.lock().binding()
    }

    /// See [`BindingState::create_pending`].
    pub fn create_pending(&self, code: BindCode, expected: Option<NodeId>, now: Instant) {
        self.lock().create_pending(code, expected, now);
    }

    /// See [`BindingState::cancel_pending`].
    pub fn cancel_pending(&self) -> bool {
        self.lock().cancel_pending()
    }

    /// See [`BindingState::try_bind`].
    ///
    /// # Errors
    /// The [`BindFailure`] reason.
    pub fn try_bind(
        &self,
        sender: &NodeId,
        code: &str,
        now: Instant,
    ) -> Result<Binding, BindFailure> {
        self.lock().try_bind(sender, code, now)
    }

    /// See [`BindingState::try_bind_checked`]; `check` runs under the
    /// lock, so it must not block.
    ///
    /// # Errors
    /// As [`BindingState::try_bind_checked`].
    pub fn try_bind_checked<E>(
        &self,
        sender: &NodeId,
        code: &str,
        now: Instant,
        check: impl FnOnce(&Binding) -> Result<(), E>,
    ) -> Result<(Binding, BindUndo), Refused<E>> {
        self.lock().try_bind_checked(sender, code, now, check)
    }

    /// See [`BindingState::undo_bind`].
    pub fn undo_bind(&self, undo: BindUndo) -> bool {
        self.lock().undo_bind(undo)
    }

    /// See [`BindingState::unbind`].
    pub fn unbind(&self) -> Option<NodeId> {
        self.lock().unbind()
    }

    /// See [`BindingState::unbind_undoable`].
    pub fn unbind_undoable(&self) -> Option<(NodeId, BindUndo)> {
        self.lock().unbind_undoable()
    }

    /// See [`BindingState::pending`].
    pub fn pending(&self, now: Instant) -> Option<PendingInfo> {
        self.lock().pending(now)
    }

    /// See [`BindingState::status`].
    pub fn status(&self, now: Instant) -> MonitoringStatus {
        self.lock().status(now)
    }

    /// Runs `f` on the state under the lock, e.g. to persist the binding in
    /// the same critical section as a change. `f` must not block.
    pub fn with<R>(&self, f: impl FnOnce(&mut BindingState) -> R) -> R {
        f(&mut self.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_code() {
        let code = BindCode::parse("ABCDEFGH23").unwrap();
        assert!(bool::from(code.matches("ABCDEFGH23")));
        for other in [
            "",
            "A",
            "ABCDEFGH2",
            "ABCDEFGH234",
            "ABCDEFGH23\0",
            "abcdefgh23",
            "ABCDEFGH24",
            "\0\0\0\0\0\0\0\0\0\0",
            "ABCDEFGH23ABCDEFGH23",
        ] {
            assert!(!bool::from(code.matches(other)), "{other:?}");
        }
        // A zero-padded prefix is not the code either.
        let padded = BindCode([b'A', b'B', 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(!bool::from(padded.matches("AB")));
    }

    #[test]
    fn a_pending_bind_expires_one_ttl_after_creation() {
        let now = Instant::now();
        let mut state = BindingState::new();
        state.create_pending(BindCode::parse("2345678923").unwrap(), None, now);
        assert!(state.pending(now).is_some());
        assert_eq!(
            state.pending.as_ref().map(|p| p.expires_at),
            Some(now + BIND_TTL)
        );
    }
}
