"""Starts handlers' coroutines on the node's loop for the native runtime,
which calls ``start`` from its own threads. Not an API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["start"]


class _Call:
    """A handler's run on the loop; the runtime cancels it when it lets go
    of the call (a cancel from the caller, the deadline, the session's end,
    shutdown)."""

    __slots__ = ("_loop", "_task", "_dropped")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._dropped = False

    def _go(
        self,
        invoke: Callable[[Any, Any, Any], Coroutine[Any, Any, Any]],
        args: Any,
        ctx: Any,
        extra: Any,
        done: Callable[[asyncio.Task[Any]], None],
    ) -> None:
        if self._dropped:
            return
        self._task = self._loop.create_task(invoke(args, ctx, extra))
        self._task.add_done_callback(done)

    def _drop(self) -> None:
        self._dropped = True
        if self._task is not None:
            self._task.cancel()

    def cancel(self) -> None:
        """Called from any thread."""
        try:
            self._loop.call_soon_threadsafe(self._drop)
        except RuntimeError:
            # The loop is closed: nothing runs on it any more.
            pass


def start(
    loop: asyncio.AbstractEventLoop,
    invoke: Callable[[Any, Any, Any], Coroutine[Any, Any, Any]],
    args: Any,
    ctx: Any,
    extra: Any,
    done: Callable[[asyncio.Task[Any]], None],
) -> _Call:
    """Schedules ``invoke(args, ctx, extra)`` on ``loop``; ``done`` gets
    the finished task."""
    call = _Call(loop)
    loop.call_soon_threadsafe(call._go, invoke, args, ctx, extra, done)
    return call
