"""A Python agent on a capwire cluster.

Run it, then bind it from a control plane with the invite it prints:

    python examples/python/agent.py --listen 127.0.0.1:7100 --state /tmp/py-agent
    capwire ctl bind 'capwire://...' --name py-agent
    capwire ctl call py-agent app.summarize summarize --args '{"text": "a b c a", "top": 2}'
    capwire ctl call py-agent app.summarize words --args '"one two three"' --stream
    capwire ctl call py-agent app.summarize index --args '{"docs": ["x", "y"]}' --wait --answer true
    capwire ctl call py-agent app.summarize reset
    capwire ctl config set '{"top": 5}' --peer py-agent
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import signal
from collections.abc import AsyncIterator

from pydantic import BaseModel, Field

import capwire


class Summarize(BaseModel):
    text: str = Field(max_length=100_000)
    top: int = Field(default=3, ge=1, le=100)


class Summary(BaseModel):
    words: int
    top: list[tuple[str, int]]


class Index(BaseModel):
    docs: list[str]


cap = capwire.Capability("app.summarize", "1.0.0")
seen = collections.Counter[str]()


@cap.request("summarize")
async def summarize(args: Summarize, ctx: capwire.Context) -> Summary:
    """The most frequent words of a text."""
    words = args.text.split()
    seen.update(words)
    return Summary(words=len(words), top=collections.Counter(words).most_common(args.top))


@cap.stream("words")
async def words(text: str) -> AsyncIterator[str]:
    """Each word, as the caller takes them."""
    for word in text.split():
        yield word


@cap.task("index")
async def index(args: Index, task: capwire.Task) -> int:
    """Indexes documents, after asking whether to go on."""
    if not await task.ask(f"index {len(args.docs)} documents?", bool, within=60):
        raise capwire.Cancelled("declined")
    for i, doc in enumerate(args.docs, 1):
        seen.update(doc.split())
        await task.progress({"done": i, "of": len(args.docs)})
        await asyncio.sleep(0.1)
    return len(args.docs)


@cap.request("reset", auth="controller")
async def reset() -> int:
    """Forgets every word seen (only the bound control plane may)."""
    n = len(seen)
    seen.clear()
    return n


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--state", help="state directory (identity, binding, configuration, tasks)")
    opts = parser.parse_args()

    builder = capwire.Node.builder("py-agent").listen(opts.listen).capability(cap)
    if opts.state:
        builder = builder.state_dir(opts.state)
    async with builder.start() as node:
        print(f"node     {node.id}", flush=True)
        print(f"listen   {node.local_addrs()[0]}", flush=True)
        if node.controller is None:
            print(f"invite   {node.invite()}", flush=True)
        else:
            print(f"bound to {node.controller}", flush=True)

        async def follow_config() -> None:
            async for config in node.watch_config():
                logging.info("configuration %s: %s", config["version"], config["value"])

        watcher = asyncio.create_task(follow_config())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        watcher.cancel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main())
