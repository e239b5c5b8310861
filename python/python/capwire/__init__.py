"""capwire for Python: agents that join a capwire cluster as nodes, on
capwire's Rust runtime (the same wire, chokepoint, bounds and speed).

A node with one capability, called by a peer::

    import asyncio
    import capwire

    echo = capwire.Capability("app.echo", "1.0.0")

    @echo.request("say")
    async def say(text: str) -> str:
        return text.upper()

    async def main() -> None:
        async with capwire.Node.builder("echo").listen("127.0.0.1:0").capability(echo).start() as node:
            async with capwire.Node.builder("client").start() as client:
                peer = await client.connect(node.local_addrs()[0], node.id)
                print(await peer.request("app.echo", "say", "hi", result=str))

    asyncio.run(main())
"""

from __future__ import annotations

from ._capability import Auth, Capability, Task
from ._capwire import PROTOCOL_VERSION, Context
from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._node import ConfigWatch, Node, NodeBuilder, Peer, Stream, TaskEvent, TaskHandle

__all__ = [
    "Auth",
    "Capability",
    "ConfigWatch",
    "Context",
    "Node",
    "NodeBuilder",
    "Peer",
    "PROTOCOL_VERSION",
    "Stream",
    "Task",
    "TaskEvent",
    "TaskHandle",
    *_errors_all,
]
