"""Nodes and peers."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import AsyncIterator, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

from . import _capwire, _trace
from ._capability import Capability
from ._errors import AlreadyBound
from ._runtime import bridge
from ._values import plain, validate_result

__all__ = ["Node", "NodeBuilder", "Peer", "Stream", "TaskHandle", "TaskEvent", "ConfigWatch"]

T = TypeVar("T")


class NodeBuilder:
    """What a node is made of; ``start()`` it (awaited, or as an async
    context manager that shuts the node down on exit)."""

    def __init__(self, app_id: str) -> None:
        self._app_id = app_id
        self._opts: dict[str, Any] = {"listen": [], "contacts": [], "verbs": []}
        self._caps: list[Capability] = []

    def name(self, name: str) -> NodeBuilder:
        """The node's name in its manifest (default: the app id)."""
        self._opts["name"] = name
        return self

    def description(self, text: str) -> NodeBuilder:
        """The node's description in its manifest (default: none)."""
        self._opts["description"] = text
        return self

    def listen(self, addr: str) -> NodeBuilder:
        """Listens on ``addr`` (``host:port``, port 0 for any; or
        ``unix:/path``)."""
        self._opts["listen"].append(addr)
        return self

    def state_dir(self, path: str) -> NodeBuilder:
        """Keeps the node's identity, binding, configuration and tasks in
        ``path``, so it comes back as itself after a restart."""
        self._opts["state_dir"] = str(path)
        return self

    def key_file(self, path: str) -> NodeBuilder:
        """Uses the identity in this key file (``capwire keygen --out``)."""
        self._opts["key_file"] = str(path)
        return self

    def bound_to(self, controller: str) -> NodeBuilder:
        """Starts bound to this control plane (unless the state directory
        holds a binding already)."""
        self._opts["bound_to"] = controller
        return self

    def contact(self, name: str, node_id: str, addr: str) -> NodeBuilder:
        """A peer to keep a session with."""
        self._opts["contacts"].append((name, node_id, addr))
        return self

    def capability(self, cap: Capability) -> NodeBuilder:
        self._caps.append(cap)
        return self

    def start(self) -> _Starting:
        """Starts the node on the running loop (its handlers run there)."""
        return _Starting(self)

    async def _start(self) -> Node:
        opts = dict(self._opts)
        opts["verbs"] = [d for cap in self._caps for d in cap.declarations()]
        native = await _capwire.start_node(self._app_id, bridge(), **opts)
        return Node(native)


class _Starting:
    """``await builder.start()`` or ``async with builder.start() as node``."""

    def __init__(self, builder: NodeBuilder) -> None:
        self._builder = builder
        self._node: Node | None = None

    def __await__(self) -> Generator[Any, None, Node]:
        return self._builder._start().__await__()

    async def __aenter__(self) -> Node:
        self._node = await self._builder._start()
        return self._node

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._node is not None:
            await self._node.shutdown()


class Node:
    """A running capwire node: its handlers run on the loop it was
    started on; everything else (sessions, the chokepoint, encryption)
    runs in the Rust runtime, off that loop."""

    def __init__(self, native: _capwire.Node) -> None:
        self._native = native

    @staticmethod
    def builder(app_id: str) -> NodeBuilder:
        return NodeBuilder(app_id)

    @property
    def id(self) -> str:
        """This node's id (its X25519 public key), as hex."""
        return self._native.id

    def local_addrs(self) -> list[str]:
        """The addresses it listens on, with the ports bound."""
        return self._native.local_addrs()

    def manifest(self) -> dict[str, Any]:
        return self._native.manifest()  # type: ignore[no-any-return]

    def invite(self, expected: str | None = None, *, rebind: bool = False) -> str:
        """A fresh one-time invite (``capwire://ID@ADDR#CODE``) that binds
        this node to the control plane that presents it (only ``expected``
        when given), replacing any earlier one.

        A node that is bound already (``controller`` is not ``None``, as
        after a restart with a ``state_dir``) raises ``AlreadyBound``:
        its invite would let any other control plane that presents it take
        the node over. ``rebind=True`` asks for that invite all the same
        (to move the node to another control plane)."""
        if not rebind:
            controller = self.controller
            if controller is not None:
                raise AlreadyBound(
                    f"this node is bound to {controller[:16]}...: it needs no invite "
                    "(invite(rebind=True) opens a bind that another control plane can take)"
                )
        return self._native.invite(expected)

    def cancel_invite(self) -> None:
        """Withdraws the pending invite (its code stops working)."""
        self._native.cancel_invite()

    @property
    def controller(self) -> str | None:
        """The control plane this node is bound to, if any."""
        return self._native.controller()

    async def unbind(self) -> str | None:
        """Forgets the control plane; the one it had."""
        return await self._native.unbind()

    def config(self) -> dict[str, Any]:
        """The configuration its control plane set: ``{"value": ...,
        "version": n}``."""
        return self._native.config()  # type: ignore[no-any-return]

    def watch_config(self) -> ConfigWatch:
        """``async for config in node.watch_config()``: each new
        configuration as the control plane sets it."""
        return ConfigWatch(self._native.watch_config())

    async def connect(self, addr: str, expected: str | None = None) -> Peer:
        """A session with the node at ``addr`` (only ``expected`` when
        given)."""
        return Peer(await self._native.connect(addr, expected))

    async def connect_invite(self, invite: str) -> tuple[Peer, dict[str, Any] | None]:
        """Connects to the node an invite names and binds it when the
        invite has a code: this node becomes its control plane."""
        peer, reply = await self._native.connect_invite(invite)
        return Peer(peer), reply

    def peer(self, node_id: str) -> Peer:
        """A peer by id (a session is made when it is first called)."""
        return Peer(self._native.peer(node_id))

    async def wait_for_peer(self, node_id: str, timeout: float | None = None) -> Peer:
        """Waits until a session with ``node_id`` is up, whichever side
        dialled (a contact being dialled, a peer that connects to this
        node), at most ``timeout`` seconds (default 30): raises
        ``Timeout`` when none came up."""
        return Peer(await self._native.wait_for_peer(node_id, timeout))

    def connected_peers(self) -> list[str]:
        """The ids of the nodes this one has a session with now."""
        return self._native.connected_peers()

    def metrics_text(self) -> str:
        """The node's counters in the Prometheus text format."""
        return self._native.metrics_text()

    async def serve_metrics(self, addr: str = "127.0.0.1:0") -> str:
        """Serves ``/metrics`` over HTTP at ``addr`` until shutdown; the
        address bound."""
        return await self._native.serve_metrics(addr)

    async def shutdown(self) -> None:
        """Stops the node: its sessions are closed and its handlers
        cancelled (after a grace of a few seconds for those still running);
        its own calls in flight end with ``Shutdown`` or ``PeerLost``, and
        its peers' calls to it with ``Cancelled`` or ``PeerLost``."""
        await self._native.shutdown()

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.shutdown()

    def __repr__(self) -> str:
        return f"Node(id={self.id[:16]}..., addrs={self.local_addrs()})"


class ConfigWatch:
    """The node's configuration as it changes."""

    def __init__(self, native: _capwire.ConfigWatch) -> None:
        self._native = native

    def current(self) -> dict[str, Any]:
        return self._native.current()  # type: ignore[no-any-return]

    def __aiter__(self) -> ConfigWatch:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._native.changed()  # type: ignore[no-any-return]


class Peer:
    """Another node, by id. Every call goes through its chokepoint;
    cancelling an awaited call (``asyncio`` cancellation, a timeout) sends
    the peer a cancel."""

    def __init__(self, native: _capwire.Peer) -> None:
        self._native = native

    @property
    def id(self) -> str:
        return self._native.id

    def manifest(self) -> dict[str, Any] | None:
        """Its manifest, when a session is up."""
        return self._native.manifest()

    @overload
    async def request(self, cap: str, verb: str, args: Any = None, *, result: type[T], timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> T: ...
    @overload
    async def request(self, cap: str, verb: str, args: Any = None, *, result: None = None, timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> Any: ...
    async def request(self, cap: str, verb: str, args: Any = None, *, result: Any = None, timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> Any:
        """Calls a request verb and returns its result, validated as
        ``result`` when given. ``timeout`` in seconds (default 30); with
        ``req_id``, the call is safe to send again (the same id is
        answered what it was, never run twice). With ``traceparent`` (and
        ``tracestate``), the call belongs to that W3C trace context
        (``ValueError`` when it is malformed); without, to the current
        OpenTelemetry span's, or the running handler's (see Tracing in the
        README)."""
        tp, ts, ambient = _trace.outgoing(traceparent, tracestate)
        raw = await self._native.request(cap, verb, plain(args), timeout, req_id, tp, ts, ambient)
        return validate_result(raw, result)

    async def notify(self, cap: str, verb: str, args: Any = None, *, timeout: float | None = None, traceparent: str | None = None, tracestate: str | None = None) -> None:
        """Sends a notification (fire-and-forget): returns once it is
        queued on the session. ``traceparent``, ``tracestate``: as for
        ``request``."""
        tp, ts, ambient = _trace.outgoing(traceparent, tracestate)
        await self._native.notify(cap, verb, plain(args), timeout, tp, ts, ambient)

    def stream(self, cap: str, verb: str, args: Any = None, *, item: type[T] | None = None, timeout: float | None = None, traceparent: str | None = None, tracestate: str | None = None) -> Stream[T]:
        """Opens a stream verb: ``async for x in peer.stream(...)``. Items
        come as this side takes them (credit-based: a slow consumer slows
        the producer, memory stays bounded). Leaving the loop early, or
        ``aclose()``, cancels it at the peer. ``traceparent``,
        ``tracestate``: as for ``request`` (the trace context is the one
        current here, where the stream is made)."""
        trace = _trace.outgoing(traceparent, tracestate)
        if not trace[2]:
            _capwire.check_trace(traceparent, tracestate)
        return Stream(self._native, cap, verb, plain(args), item, timeout, trace)

    @overload
    async def submit(self, cap: str, verb: str, args: Any = None, *, result: type[T], timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> TaskHandle[T]: ...
    @overload
    async def submit(self, cap: str, verb: str, args: Any = None, *, result: None = None, timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> TaskHandle[Any]: ...
    async def submit(self, cap: str, verb: str, args: Any = None, *, result: Any = None, timeout: float | None = None, req_id: str | None = None, traceparent: str | None = None, tracestate: str | None = None) -> TaskHandle[Any]:
        """Submits a task verb; returns once the peer has written the
        task. With ``req_id``, a submit sent again is the same task.
        ``traceparent``, ``tracestate``: as for ``request`` (the task's
        handler runs in that trace)."""
        tp, ts, ambient = _trace.outgoing(traceparent, tracestate)
        native = await self._native.submit(cap, verb, plain(args), timeout, req_id, tp, ts, ambient)
        return TaskHandle(native, result)

    def task(self, task_id: str, result: type[T] | None = None) -> TaskHandle[T]:
        """A handle to a task known by id."""
        return TaskHandle(self._native.task(task_id), result)

    async def bind(self, invite: str) -> dict[str, Any]:
        """Binds the peer with its invite: this node becomes its control
        plane. What it answered: its manifest, roster and configuration."""
        return await self._native.bind(invite)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Peer({self.id[:16]}...)"


class Stream(Generic[T]):
    """A stream's items, as an async iterator (and an async context
    manager that closes it)."""

    def __init__(
        self,
        native: _capwire.Peer,
        cap: str,
        verb: str,
        args: Any,
        item: type[T] | None,
        timeout: float | None,
        trace: tuple[str | None, str | None, bool] = (None, None, True),
    ) -> None:
        self._peer, self._cap, self._verb, self._args = native, cap, verb, args
        self._item, self._timeout, self._trace = item, timeout, trace
        self._native: _capwire.ItemStream | None = None
        self._ready: collections.deque[Any] = collections.deque()
        self._closed = False

    async def _open(self) -> _capwire.ItemStream:
        if self._native is None:
            tp, ts, ambient = self._trace
            self._native = await self._peer.stream(self._cap, self._verb, self._args, self._timeout, tp, ts, ambient)
        return self._native

    def __aiter__(self) -> Stream[T]:
        return self

    async def __anext__(self) -> T:
        if not self._ready:
            if self._closed:
                raise StopAsyncIteration
            native = await self._open()
            # Every item already here comes in one hop.
            self._ready.extend(await native.next_batch(256))
        return validate_result(self._ready.popleft(), self._item)

    async def aclose(self) -> None:
        """Stops the stream; the peer is told to stop if it had not ended."""
        self._closed = True
        self._ready.clear()
        if self._native is not None:
            await self._native.close()

    async def __aenter__(self) -> Stream[T]:
        await self._open()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


@dataclasses.dataclass(frozen=True)
class TaskEvent:
    """One event of a task's log."""

    #: Its number in the task's log, from 1, in order.
    seq: int
    #: ``state``, ``progress``, ``question``, ``answer``, ``result`` or
    #: ``error``.
    kind: str
    #: The task's state after it: ``submitted``, ``working``,
    #: ``input_required``, ``completed``, ``failed``, ``canceled`` or
    #: ``rejected``.
    state: str
    #: The progress value, question, answer or result; an error's
    #: ``{"code": ..., "message": ...}``.
    body: Any
    #: When it happened, in milliseconds since the Unix epoch.
    at_ms: int

    @property
    def final(self) -> bool:
        """``True`` for the task's last event (it has ended)."""
        return self.state in ("completed", "failed", "canceled", "rejected")


class TaskHandle(Generic[T]):
    """A task on a peer."""

    def __init__(self, native: _capwire.TaskHandle, result: type[T] | None) -> None:
        self._native = native
        self._result = result

    @property
    def id(self) -> str:
        return self._native.id

    async def get(self) -> dict[str, Any]:
        """What is known about the task now (``core.tasks/get``)."""
        return await self._native.get()  # type: ignore[no-any-return]

    async def result(self) -> T:
        """Waits for the task to end: its result, or the error it failed
        with (raised)."""
        return validate_result(await self._native.result(), self._result)

    async def respond(self, answer: Any, *, question_seq: int | None = None) -> dict[str, Any]:
        """Answers the question the task waits on."""
        return await self._native.respond(plain(answer), question_seq)  # type: ignore[no-any-return]

    async def cancel(self) -> dict[str, Any]:
        return await self._native.cancel()  # type: ignore[no-any-return]

    async def events(self, start: int = 1) -> AsyncIterator[TaskEvent]:
        """The task's events from seq ``start`` on, then each new one,
        until its final event."""
        native = await self._native.events(start)
        while True:
            try:
                ev = await native.next()
            except StopAsyncIteration:
                return
            yield TaskEvent(seq=ev["seq"], kind=ev["kind"], state=ev["state"], body=ev["body"], at_ms=ev["at_ms"])

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"
