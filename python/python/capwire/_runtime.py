"""The native runtime's bridge to each asyncio loop (one per loop). Not an
API."""

from __future__ import annotations

import asyncio
import weakref

from . import _capwire

__all__ = ["bridge"]

_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _capwire.Bridge] = weakref.WeakKeyDictionary()


def bridge(loop: asyncio.AbstractEventLoop | None = None) -> _capwire.Bridge:
    """The running loop's bridge: the loop watches its socket and runs, on
    its own thread, what the runtime's threads queue there (handlers to
    start or cancel, outcomes of awaited calls)."""
    loop = loop or asyncio.get_running_loop()
    found = _bridges.get(loop)
    if found is None:
        found = _capwire.Bridge(loop)
        loop.add_reader(found.fileno(), found.drain)
        _bridges[loop] = found
    return found
