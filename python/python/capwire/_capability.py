"""Capabilities declared with decorators over ``async def`` handlers."""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import json
import logging
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from . import _capwire, _trace
from ._errors import BadArgs, CapwireError, EncodeError, Internal
from ._values import adapter, brief, plain

__all__ = ["Capability", "Task", "Auth"]

log = logging.getLogger("capwire")

Auth = Literal["bootstrap", "controller"]
Kind = Literal["request", "notification", "stream", "task"]
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_MISSING = inspect.Parameter.empty


class Task:
    """What a task's handler reports through: progress, questions to its
    submitter (or the node's control plane), its id."""

    __slots__ = ("_native",)

    def __init__(self, native: _capwire.TaskContext) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The task's id, as ``core.tasks`` names it."""
        return self._native.id

    @property
    def resumed(self) -> bool:
        """``True`` when this run is a resume after the node restarted."""
        return self._native.resumed

    @property
    def sender(self) -> str:
        """The submitter's node id, as hex."""
        return self._native.sender

    async def progress(self, value: Any) -> None:
        """Writes a ``progress`` event with ``value`` (durably) before it
        returns. Raises ``TaskError`` when it could not be written (a
        cancel of the task meanwhile raises ``asyncio.CancelledError``)."""
        await self._native.progress(plain(value))

    async def ask(self, question: Any, answer: type[T] = typing.Any, *, within: float = 300.0) -> T:  # type: ignore[assignment]
        """Asks a question and waits at most ``within`` seconds for the
        answer (given with ``core.tasks/respond``), validated as
        ``answer``. Raises ``NoAnswer`` when none came in time, ``BadArgs``
        when the answer does not fit ``answer``, ``TaskError`` when the
        question could not be written. A cancel of the task meanwhile
        cancels the handler here (``asyncio.CancelledError``)."""
        raw = await self._native.ask(plain(question), within)
        try:
            return adapter(typing.cast(Any, answer)).validate_python(raw)  # type: ignore[no-any-return]
        except ValidationError as e:
            raise BadArgs(f"the answer does not fit: {brief(e)}") from None


def _schema(tp: Any, mode: Literal["validation", "serialization"]) -> str | None:
    if tp is _MISSING or tp is typing.Any:
        return None
    return json.dumps(adapter(tp).json_schema(mode=mode), separators=(",", ":"))


def _item_type(tp: Any) -> Any:
    """``T`` of ``AsyncIterator[T]`` / ``AsyncGenerator[T, None]``."""
    origin = typing.get_origin(tp)
    if origin in (
        collections.abc.AsyncIterator,
        collections.abc.AsyncGenerator,
        collections.abc.AsyncIterable,
    ):
        args = typing.get_args(tp)
        return args[0] if args else _MISSING
    return _MISSING


class _Verb:
    """One declared verb and the coroutine the runtime starts for it."""

    def __init__(self, cap: Capability, name: str, kind: Kind, auth: Auth, fn: Callable[..., Any], resumable: bool) -> None:
        if auth not in ("bootstrap", "controller"):
            raise ValueError(f"auth must be 'bootstrap' or 'controller', not {auth!r}")
        if kind == "stream":
            if not inspect.isasyncgenfunction(fn):
                raise TypeError(f"{cap.id}/{name}: a stream handler is an async generator (async def with yield)")
        elif not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{cap.id}/{name}: a handler is an async def")
        self.cap, self.name, self.kind, self.auth = cap, name, kind, auth
        self.fn, self.resumable = fn, resumable
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        hints = typing.get_type_hints(fn)
        # args, then (a task's Task), then an optional Context; a request,
        # notification or stream handler may take no args at all (whatever
        # args come are then ignored: `ctl call` sends `{}`).
        fixed = 2 if kind == "task" else 1
        self.takes_args = True
        if kind != "task" and not params:
            self.takes_args, fixed = False, 0
        if len(params) < fixed or len(params) > fixed + 1:
            want = "(args, task[, ctx])" if kind == "task" else "([args[, ctx]])"
            raise TypeError(f"{cap.id}/{name}: the handler takes {want}")
        self.wants_ctx = len(params) == fixed + 1
        self.args_type = hints.get(params[0].name, _MISSING) if self.takes_args else _MISSING
        ret = hints.get("return", _MISSING)
        if kind == "stream":
            ret = _item_type(ret)
        if kind == "notification":
            ret = _MISSING
        self.result_type = ret
        self.args_adapter = None if self.args_type is _MISSING else adapter(self.args_type)
        self.result_adapter = None if ret is _MISSING else adapter(ret)

    def declaration(self) -> dict[str, Any]:
        return {
            "cap": self.cap.id,
            "version": self.cap.version,
            "name": self.name,
            "kind": self.kind,
            "auth": self.auth,
            "args_schema": _schema(self.args_type, "validation"),
            "result_schema": _schema(self.result_type, "serialization"),
            "invoke": self.invoke,
            "resumable": self.resumable,
            "check": self.check if self.kind == "task" and self.args_adapter is not None else None,
        }

    async def check(self, raw: Any, ctx: _capwire.Context, extra: Any, done: _capwire.Completion) -> None:
        """A task's args, checked before the task is written: a mismatch
        answers the submit ``bad_args`` and no task exists."""
        assert self.args_adapter is not None
        try:
            self.args_adapter.validate_python(raw)
        except ValidationError as e:
            done.error(BadArgs(brief(e)))
            return
        done.ok(None)

    def _out(self, value: Any) -> Any:
        try:
            if self.result_adapter is None:
                return plain(value)
            return plain(self.result_adapter.dump_python(value))
        except EncodeError as e:
            # The handler's fault, not the caller's: logged, answered internal.
            log.error("handler %s/%s: its result cannot be sent: %s", self.cap.id, self.name, e.message)
            raise Internal("the handler's result could not be encoded") from None

    async def invoke(self, raw: Any, ctx: _capwire.Context, extra: Any, done: _capwire.Completion) -> None:
        """Runs on the node's loop as the call's task, and tells ``done``
        how it ended (in the same step: no extra turn of the loop)."""
        try:
            traceparent = ctx.traceparent
            if traceparent is None and _trace.tracing() is None:
                out = await self._run(raw, ctx, extra)
            else:
                out = await _trace.serve(self._run(raw, ctx, extra), self.cap.id, self.name, traceparent, ctx.tracestate)
        except asyncio.CancelledError:
            done.cancelled()
            raise
        except CapwireError as e:
            if e.code is None:
                # A local failure (a lost session, an unanswered question)
                # has no code to answer with: `internal`, logged here.
                log.error("handler %s/%s raised %r", self.cap.id, self.name, e)
            done.error(e)
            return
        done.ok(out)

    async def _run(self, raw: Any, ctx: _capwire.Context, extra: Any) -> Any:
        """Args checked, handler run, result dumped; a raise that is not a
        capwire error is logged here and answered ``internal``."""
        if self.args_adapter is not None:
            try:
                args = self.args_adapter.validate_python(raw)
            except ValidationError as e:
                raise BadArgs(brief(e)) from None
        else:
            args = raw
        more: list[Any] = [args] if self.takes_args else []
        if self.kind == "task":
            more.append(Task(extra))
        if self.wants_ctx:
            more.append(ctx)
        try:
            if self.kind == "stream":
                gen = self.fn(*more)
                try:
                    async for item in gen:
                        await extra.send(self._out(item))
                finally:
                    await gen.aclose()
                return None
            out = await self.fn(*more)
            return None if self.kind == "notification" else self._out(out)
        except asyncio.CancelledError:
            raise
        except CapwireError as e:
            _trace.record(e)
            raise
        except Exception as e:
            log.exception("handler %s/%s raised", self.cap.id, self.name)
            _trace.record(e)
            raise Internal("the handler failed") from None


class Capability:
    """An ``app.*`` capability: a semver version and verbs, each an
    ``async def`` handler declared with a decorator::

        cap = Capability("app.echo", "1.0.0")

        @cap.request("say")
        async def say(text: str) -> str:
            return text

    A handler takes its args first (their annotation is the args' type:
    a pydantic model, a dataclass, ``str``, ``list[int]``...), then, for a
    task, its ``Task``, then optionally a ``Context`` (the caller's id, the
    request's id and deadline). The args' and result's JSON Schemas go
    into the manifest; args are validated before the handler runs (a
    mismatch is answered ``bad_args``).
    """

    def __init__(self, id: str, version: str = "1.0.0") -> None:
        self.id = id
        self.version = version
        self._verbs: list[_Verb] = []

    def _add(self, name: str, kind: Kind, auth: Auth, resumable: bool = False) -> Callable[[F], F]:
        def register(fn: F) -> F:
            if any(v.name == name for v in self._verbs):
                raise ValueError(f"{self.id}/{name} is declared twice")
            self._verbs.append(_Verb(self, name, kind, auth, fn, resumable))
            return fn

        return register

    def request(self, name: str, *, auth: Auth = "bootstrap") -> Callable[[F], F]:
        """A request verb: one answer, the handler's return value."""
        return self._add(name, "request", auth)

    def notification(self, name: str, *, auth: Auth = "bootstrap") -> Callable[[F], F]:
        """A notification verb: never answered (fire-and-forget)."""
        return self._add(name, "notification", auth)

    def stream(self, name: str, *, auth: Auth = "bootstrap") -> Callable[[F], F]:
        """A stream verb: an async generator whose items go to the caller
        as it grants credit (the generator waits while it has none)."""
        return self._add(name, "stream", auth)

    def task(self, name: str, *, auth: Auth = "bootstrap", resumable: bool = False) -> Callable[[F], F]:
        """A task verb: submitting it answers the task's id at once; the
        handler runs on, durably, whatever becomes of the caller's session.
        With ``resumable``, a task that had not ended when the node stopped
        runs again when it starts (``task.resumed`` is then ``True``)."""
        return self._add(name, "task", auth, resumable)

    def declarations(self) -> list[dict[str, Any]]:
        """What the native runtime is given for each verb."""
        return [v.declaration() for v in self._verbs]

    def __repr__(self) -> str:
        return f"Capability({self.id!r}, {self.version!r}, verbs={[v.name for v in self._verbs]})"
