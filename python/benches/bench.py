"""Python beside Rust, in one run: 64 B request/response round trips
(Rust->Rust, Rust->Python handler, Python->Rust, Python->Python),
notifications per second from Python, and stream items per second into
Python. Every node is a real node on loopback TCP with encrypted sessions,
all in this process (the Rust nodes and callers are the native module's
bench helpers, run on the same runtime).

    python python/benches/bench.py [--calls N] [--rounds R]

Prints each figure (the median of the rounds) and the ratios to the
Rust->Rust round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time

import capwire
from capwire import _capwire
from capwire._runtime import bridge

PAYLOAD = bytes(range(64))

cap = capwire.Capability("app.pybench", "1.0.0")


@cap.request("echo")
async def echo(payload: bytes) -> bytes:
    return payload


def served(node: capwire.Node, verb: str) -> int:
    """How many calls of `verb` the node counted as handled."""
    total = 0
    for line in node.metrics_text().splitlines():
        if line.startswith("capwire_calls_total") and f'verb="{verb}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def rtt_python(peer: capwire.Peer, cap_id: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await peer.request(cap_id, "echo", PAYLOAD)
    return (time.perf_counter() - start) / n


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    n = opts.calls

    rust = capwire.Node(await _capwire.bench.rust_echo_node(bridge(), "127.0.0.1:0"))
    py = await capwire.Node.builder("bench-py").listen("127.0.0.1:0").capability(cap).start()
    client = await capwire.Node.builder("bench-client").start()
    to_rust = await client.connect(rust.local_addrs()[0], rust.id)
    to_py = await client.connect(py.local_addrs()[0], py.id)
    native = client._native

    async def rust_rtt(peer: str, cap_id: str) -> float:
        return await _capwire.bench.rust_calls(native, peer, cap_id, "echo", PAYLOAD, n) / n

    figures: dict[str, list[float]] = {k: [] for k in ("rust_rust", "rust_py", "py_rust", "py_py", "notify", "items")}
    # Warm-up: sessions, adapters, allocator.
    await rust_rtt(rust.id, "app.bench")
    await rust_rtt(py.id, "app.pybench")
    await rtt_python(to_rust, "app.bench", n // 10)
    await rtt_python(to_py, "app.pybench", n // 10)
    for _ in range(opts.rounds):
        figures["rust_rust"].append(await rust_rtt(rust.id, "app.bench"))
        figures["rust_py"].append(await rust_rtt(py.id, "app.pybench"))
        figures["py_rust"].append(await rtt_python(to_rust, "app.bench", n))
        figures["py_py"].append(await rtt_python(to_py, "app.pybench", n))

        before = served(rust, "sink")
        start = time.perf_counter()
        for _ in range(n * 4):
            await to_rust.notify("app.bench", "sink", PAYLOAD)
        while served(rust, "sink") < before + n * 4:
            await asyncio.sleep(0.001)
        figures["notify"].append(n * 4 / (time.perf_counter() - start))

        start = time.perf_counter()
        count = 0
        async for _item in to_rust.stream("app.bench", "flood", [n * 4, 64]):
            count += 1
        assert count == n * 4
        figures["items"].append(count / (time.perf_counter() - start))

    med = {k: statistics.median(v) for k, v in figures.items()}
    base = med["rust_rust"]
    if opts.json:
        print(json.dumps(med))
    print(f"64 B round trip, median of {opts.rounds} rounds of {n} calls:")
    for key, label in (
        ("rust_rust", "Rust -> Rust handler"),
        ("rust_py", "Rust -> Python handler"),
        ("py_rust", "Python -> Rust handler"),
        ("py_py", "Python -> Python handler"),
    ):
        print(f"  {label:26} {med[key] * 1e6:8.1f} us  {med[key] / base:5.2f}x")
    print(f"notifications from Python   {med['notify'] / 1e3:8.1f} k/s (64 B, until all handled)")
    print(f"stream items into Python    {med['items'] / 1e3:8.1f} k/s (64 B)")

    await client.shutdown()
    await py.shutdown()
    await rust.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
