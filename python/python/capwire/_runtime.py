"""The native runtime's bridge to each asyncio loop (one per loop). Not an
API."""

from __future__ import annotations

import asyncio
import functools
import sys
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from . import _capwire

__all__ = ["bridge"]

_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _capwire.Bridge] = weakref.WeakKeyDictionary()


def _task_factory(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]:
    """How a handler's coroutine becomes a task: started at once where
    asyncio can (3.12 and newer: a handler that does not wait answers
    within the same turn of the loop)."""
    if sys.version_info >= (3, 12):
        return functools.partial(asyncio.Task, loop=loop, eager_start=True)
    return loop.create_task


def bridge(loop: asyncio.AbstractEventLoop | None = None) -> _capwire.Bridge:
    """The running loop's bridge: the loop watches its socket and runs, on
    its own thread, what the runtime's threads queue there (handlers to
    start or cancel, outcomes of awaited calls)."""
    loop = loop or asyncio.get_running_loop()
    found = _bridges.get(loop)
    if found is None:
        found = _capwire.Bridge(loop, _task_factory(loop))
        loop.add_reader(found.fileno(), found.drain)
        _bridges[loop] = found
    return found
