"""Exceptions: one class per capwire error code, and one per local failure.

A call that a peer answers with an error raises the class of its code
(``Unauthorized`` for ``unauthorized``, ...); ``code`` holds the code as
the wire spells it and ``message`` what the peer said. A handler raises
one of these to answer with that code; any other exception it raises is
answered ``internal``, with no detail sent (it is logged locally).
"""

from __future__ import annotations

__all__ = [
    "CapwireError",
    "Denied",
    "UnknownVerb",
    "Unauthorized",
    "BindFailed",
    "BadArgs",
    "NotFound",
    "Duplicate",
    "NotBound",
    "Conflict",
    "Timeout",
    "Idle",
    "Cancelled",
    "TooLarge",
    "Overloaded",
    "Unavailable",
    "Internal",
    "RemoteError",
    "PeerLost",
    "Unreachable",
    "VersionUnsatisfied",
    "EncodeError",
    "BadResult",
    "Shutdown",
    "ReqIdInUse",
    "InvalidInvite",
    "Unsupported",
    "WrongKind",
    "AlreadyBound",
    "NodeError",
    "StreamClosed",
    "TaskError",
    "NoAnswer",
]


class CapwireError(Exception):
    """Every capwire error. ``code`` is the wire's error code, or ``None``
    for a failure that has none (a lost session, a node that did not
    start)."""

    code: str | None
    message: str
    #: The code a handler answers with when it raises this class.
    default_code: str | None = None

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class Denied(CapwireError):
    """The peer's chokepoint refused the call: no handler ran."""


class UnknownVerb(Denied):
    """``unknown_verb``: the peer has no such capability or verb."""

    default_code = "unknown_verb"


class Unauthorized(Denied):
    """``unauthorized``: the verb is not this caller's to call."""

    default_code = "unauthorized"


class BindFailed(Denied):
    """``bind_failed``: a bind was refused (wrong or used-up code)."""

    default_code = "bind_failed"


class BadArgs(CapwireError):
    """``bad_args``: the args do not match the verb's type."""

    default_code = "bad_args"


class NotFound(CapwireError):
    """``not_found``."""

    default_code = "not_found"


class Duplicate(CapwireError):
    """``duplicate``: a request with this id is still running."""

    default_code = "duplicate"


class NotBound(CapwireError):
    """``not_bound``: the node has no control plane."""

    default_code = "not_bound"


class Conflict(CapwireError):
    """``conflict``: the state changed meanwhile (a compare-and-set)."""

    default_code = "conflict"


class Timeout(CapwireError, TimeoutError):
    """``timeout``: no answer within the deadline (a cancel was sent)."""

    default_code = "timeout"


class Idle(Timeout):
    """A stream sent no item within its idle bound (a cancel was sent)."""


class Cancelled(CapwireError):
    """``cancelled``: the call was cancelled, by either side. (Not
    ``asyncio.CancelledError``: that one cancels your own task.)"""

    default_code = "cancelled"


class TooLarge(CapwireError):
    """``too_large``: an envelope larger than the peer accepts."""

    default_code = "too_large"


class Overloaded(CapwireError):
    """``overloaded``: too many calls in flight, here or at the peer."""

    default_code = "overloaded"


class Unavailable(CapwireError):
    """``unavailable``: the peer cannot serve this now."""

    default_code = "unavailable"


class Internal(CapwireError):
    """``internal``: the handler failed (its detail stays on its node)."""

    default_code = "internal"


class RemoteError(CapwireError):
    """An error code this version does not know."""


class PeerLost(CapwireError):
    """The session to the peer ended before an answer arrived."""


class Unreachable(CapwireError):
    """No session to the peer could be made."""


class VersionUnsatisfied(CapwireError):
    """The peer does not offer the capability version required."""


class EncodeError(CapwireError, TypeError):
    """The args could not be encoded."""


class BadResult(CapwireError):
    """The peer's result does not match the type asked for."""


class Shutdown(CapwireError):
    """This node is shutting down."""


class ReqIdInUse(CapwireError):
    """A call with this req_id is already waiting for its answer."""


class InvalidInvite(CapwireError, ValueError):
    """The invite cannot be used for this."""


class Unsupported(CapwireError):
    """The peer speaks protocol 1 only, which has no streams or tasks."""


class WrongKind(CapwireError, TypeError):
    """The verb is of another kind than the call: ``request()`` on a
    stream, notification or task verb, ``stream()`` on a request verb,
    ``submit()`` on a request verb, ... The peer's manifest says so, and
    the call is refused before anything is sent. The message names the
    call that fits."""


class AlreadyBound(CapwireError):
    """``node.invite()`` on a node that has a control plane: an invite
    would open a rebind that any other control plane presenting it could
    take. ``node.invite(rebind=True)`` asks for one."""


class NodeError(CapwireError):
    """A node could not be built, started or connected."""


class StreamClosed(CapwireError):
    """A stream handler's caller is gone: return from the handler."""


class TaskError(CapwireError):
    """A task's progress or question could not be written."""


class NoAnswer(TaskError):
    """A task's question had no answer in time."""
