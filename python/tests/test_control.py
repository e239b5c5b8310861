"""A Python node bound and configured by a control plane: `capwire ctl`
(Rust, its own process) or another Python node; its controller verbs,
configuration, status, manifest and metrics."""

import asyncio
import gc
import re
import urllib.request
from pathlib import Path

import capwire
from conftest import Ctl, Nodes, wait_until


def admin_cap(ran: list) -> capwire.Capability:
    cap = capwire.Capability("app.admin", "1.0.0")

    @cap.request("reset", auth="controller")
    async def reset(n: int, ctx: capwire.Context) -> str:
        ran.append((n, ctx.sender))
        return f"reset {n}"

    @cap.request("hello")
    async def hello(name: str) -> str:
        return f"hello {name}"

    return cap


async def test_ctl_binds_python_node_and_calls_its_controller_verb(nodes: Nodes, ctl: Ctl) -> None:
    ran: list = []
    node = await nodes.start("py-admin", admin_cap(ran))
    assert node.controller is None
    record = await ctl.bind(node.invite(), "py")
    ctl_id = await ctl.identity()
    assert record["name"] == "py" and record["node_id"] == node.id
    assert node.controller == ctl_id

    done = await ctl.ok("call", "py", "app.admin", "reset", "--args", "7", "--json")
    assert done.json_lines() == [{"kind": "result", "value": "reset 7"}]
    assert ran == [(7, ctl_id)]

    # An unbound Python peer is refused, and the handler never runs.
    stranger = await nodes.start("stranger", listen=False)
    peer = await asyncio.wait_for(stranger.connect(node.local_addrs()[0], node.id), 10)
    try:
        await asyncio.wait_for(peer.request("app.admin", "reset", 8), 10)
    except capwire.Unauthorized as e:
        assert e.code == "unauthorized"
        assert isinstance(e, capwire.Denied)
    else:
        raise AssertionError("an unbound peer called a controller verb")
    # Its bootstrap verbs stay open to it.
    assert await asyncio.wait_for(peer.request("app.admin", "hello", "s", result=str), 10) == "hello s"
    assert ran == [(7, ctl_id)]


async def test_ctl_identity_status_and_manifest(nodes: Nodes, ctl: Ctl) -> None:
    node = await nodes.start("py-admin", admin_cap([]), name="py-admin-node", description="a Python agent")
    await ctl.bind(node.invite(), "py")

    text = await ctl.ok("identity")
    ids = re.findall(r"node_id\s+([0-9a-f]{64})", text.out)
    assert ids == [node.controller], str(text)

    status = await ctl.ok("status", "py", "--json")
    (record,) = status.json_lines()
    assert record["kind"] == "status" and record["peer"] == "py"
    assert record["value"]["you_are_controller"] is True
    assert record["value"]["monitoring"] == "on"
    plain = await ctl.ok("status", "py")
    assert "this control plane is its controller" in plain.out

    manifest = await ctl.ok("manifest", "py", "--json")
    (m,) = manifest.json_lines()
    assert m["node_id"] == node.id
    assert m["name"] == "py-admin-node" and m["app_id"] == "py-admin"
    assert m["description"] == "a Python agent"
    (cap,) = [c for c in m["capabilities"] if c["id"] == "app.admin"]
    verbs = {v["name"]: (v["kind"], v["class"]) for v in cap["verbs"]}
    assert verbs == {"reset": ("request", "controller"), "hello": ("request", "bootstrap")}
    text = await ctl.ok("manifest", "py")
    assert re.search(r"reset\s+request\s+controller", text.out), text.out

    peers = await ctl.ok("peers", "--json")
    (listing,) = peers.json_lines()
    assert [p["node_id"] for p in listing["peers"] if p["name"] == "py"] == [node.id]


async def test_ctl_config_set_seen_by_watch_config(nodes: Nodes, ctl: Ctl) -> None:
    node = await nodes.start("py-admin", admin_cap([]))
    await ctl.bind(node.invite(), "py")
    assert node.config() == {"value": None, "version": 0}

    seen: list[dict] = []
    got_two = asyncio.Event()

    async def follow() -> None:
        async for config in node.watch_config():
            seen.append(config)
            if len(seen) == 2:
                got_two.set()
                return

    watcher = asyncio.create_task(follow())
    try:
        await ctl.ok("config", "set", '{"replicas": 3}', "--peer", "py")
        await wait_until(lambda: len(seen) >= 1, what="the first configuration reaching watch_config")
        assert seen[0] == {"value": {"replicas": 3}, "version": 1}
        assert node.config() == {"value": {"replicas": 3}, "version": 1}

        # Compare-and-set: a stale version is refused, the current one taken.
        stale = await ctl("config", "set", '{"replicas": 9}', "--if-version", "0", "--peer", "py")
        assert stale.rc == 4 and "conflict" in stale.err, str(stale)
        await ctl.ok("config", "set", '{"replicas": 5, "mode": "fast"}', "--if-version", "1", "--peer", "py")
        await asyncio.wait_for(got_two.wait(), 10)
        assert seen == [
            {"value": {"replicas": 3}, "version": 1},
            {"value": {"replicas": 5, "mode": "fast"}, "version": 2},
        ]
        assert node.config() == {"value": {"replicas": 5, "mode": "fast"}, "version": 2}
        got = await ctl.ok("config", "get", "--peer", "py", "--json")
        assert got.json_lines() == [
            {"kind": "config", "peer": "py", "value": {"value": {"replicas": 5, "mode": "fast"}, "version": 2}}
        ]
    finally:
        watcher.cancel()


async def test_config_set_by_unbound_peer_is_refused(nodes: Nodes) -> None:
    node = await nodes.start("py-admin", admin_cap([]))
    stranger = await nodes.start("stranger", listen=False)
    peer = await asyncio.wait_for(stranger.connect(node.local_addrs()[0], node.id), 10)
    try:
        await asyncio.wait_for(
            peer.request("core.configuration", "set_config", {"value": {"replicas": 1}}), 10
        )
    except capwire.Unauthorized:
        pass
    else:
        raise AssertionError("an unbound peer set the configuration")
    assert node.config() == {"value": None, "version": 0}


async def test_metrics_count_calls_per_verb(nodes: Nodes, ctl: Ctl) -> None:
    node = await nodes.start("py-admin", admin_cap([]))
    await ctl.bind(node.invite(), "py")
    for _ in range(3):
        await ctl.ok("call", "py", "app.admin", "hello", "--args", '"m"')
    await ctl.ok("call", "py", "app.admin", "reset", "--args", "1")
    stranger = await nodes.start("stranger", listen=False)
    peer = await asyncio.wait_for(stranger.connect(node.local_addrs()[0], node.id), 10)
    try:
        await asyncio.wait_for(peer.request("app.admin", "reset", 2), 10)
    except capwire.Unauthorized:
        pass

    addr = await asyncio.wait_for(node.serve_metrics("127.0.0.1:0"), 10)

    def get() -> tuple[int, str, str]:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()

    status, content_type, text = await asyncio.wait_for(asyncio.to_thread(get), 20)
    assert status == 200
    assert content_type.startswith("text/plain")

    def counter(verb: str, outcome: str) -> float:
        pattern = rf'^capwire_calls_total\{{cap="app\.admin",verb="{verb}",outcome="{outcome}"\}} (\S+)$'
        found = re.findall(pattern, text, re.M)
        assert len(found) == 1, f"no {verb}/{outcome} counter in:\n{text}"
        return float(found[0])

    assert counter("hello", "ok") == 3
    assert counter("reset", "ok") == 1
    assert counter("reset", "unauthorized") == 1
    assert node.metrics_text().count('verb="hello",outcome="ok"') == 1


async def test_python_control_plane_binds_python_node(nodes: Nodes) -> None:
    ran: list = []
    node = await nodes.start("py-admin", admin_cap(ran))
    plane = await nodes.start("py-plane", listen=False)
    peer = await asyncio.wait_for(plane.connect(node.local_addrs()[0], node.id), 10)

    # Not bound yet: refused.
    try:
        await asyncio.wait_for(peer.request("app.admin", "reset", 1), 10)
    except capwire.Unauthorized:
        pass
    else:
        raise AssertionError("a controller verb answered before the bind")

    invite = node.invite()
    reply = await asyncio.wait_for(peer.bind(invite), 10)
    assert reply["manifest"]["name"] == "py-admin"
    assert reply["config"] == {"value": None, "version": 0}
    assert node.controller == plane.id
    assert await asyncio.wait_for(peer.request("app.admin", "reset", 2, result=str), 10) == "reset 2"
    assert ran == [(2, plane.id)]

    # The invite was good for one bind.
    other = await nodes.start("other", listen=False)
    other_peer = await asyncio.wait_for(other.connect(node.local_addrs()[0], node.id), 10)
    try:
        await asyncio.wait_for(other_peer.bind(invite), 10)
    except capwire.BindFailed as e:
        assert isinstance(e, capwire.Denied)
    else:
        raise AssertionError("an invite bound twice")
    assert node.controller == plane.id

    # The control plane configures it through core.configuration.
    changed = node.watch_config()
    await asyncio.wait_for(peer.request("core.configuration", "set_config", {"value": {"replicas": 3}}), 10)
    assert await asyncio.wait_for(changed.__anext__(), 10) == {"value": {"replicas": 3}, "version": 1}

    # Unbound, it is refused again.
    assert await node.unbind() == plane.id
    assert node.controller is None
    try:
        await asyncio.wait_for(peer.request("app.admin", "reset", 3), 10)
    except capwire.Unauthorized:
        pass
    else:
        raise AssertionError("a controller verb answered after the unbind")
    assert ran == [(2, plane.id)]


async def test_connect_invite_binds(nodes: Nodes) -> None:
    ran: list = []
    node = await nodes.start("py-admin", admin_cap(ran))
    plane = await nodes.start("py-plane", listen=False)
    peer, reply = await asyncio.wait_for(plane.connect_invite(node.invite()), 10)
    assert reply is not None and reply["manifest"]["name"] == "py-admin"
    assert peer.id == node.id and node.controller == plane.id
    assert await asyncio.wait_for(peer.request("app.admin", "reset", 4, result=str), 10) == "reset 4"


async def test_invite_for_expected_control_plane_only(nodes: Nodes) -> None:
    node = await nodes.start("py-admin", admin_cap([]))
    plane = await nodes.start("py-plane", listen=False)
    intruder = await nodes.start("intruder", listen=False)
    invite = node.invite(expected=plane.id)
    bad = await asyncio.wait_for(intruder.connect(node.local_addrs()[0], node.id), 10)
    try:
        await asyncio.wait_for(bad.bind(invite), 10)
    except capwire.BindFailed:
        pass
    else:
        raise AssertionError("an invite for another control plane bound")
    assert node.controller is None


async def test_invite_on_a_bound_node_needs_rebind(nodes: Nodes) -> None:
    node = await nodes.start("py-admin", admin_cap([]))
    plane = await nodes.start("py-plane", listen=False)
    await asyncio.wait_for(plane.connect_invite(node.invite()), 10)
    assert node.controller == plane.id

    # Bound: an invite would let any other control plane take the node.
    try:
        node.invite()
    except capwire.AlreadyBound as e:
        assert isinstance(e, capwire.CapwireError)
        assert "rebind=True" in e.message
    else:
        raise AssertionError("a bound node gave an invite without rebind=True")
    assert node.manifest()["monitoring"] == "on"

    # Asked for, the rebind moves the node to the control plane that uses it.
    other = await nodes.start("other-plane", listen=False)
    invite = node.invite(rebind=True)
    await asyncio.wait_for(other.connect_invite(invite), 10)
    assert node.controller == other.id
    try:
        node.invite(expected=plane.id)
    except capwire.AlreadyBound:
        pass
    else:
        raise AssertionError("a bound node gave an invite without rebind=True")

    # Unbound, it gives one again.
    assert await node.unbind() == other.id
    assert node.invite().startswith(f"capwire://{node.id}@")


async def test_restarted_bound_node_gives_no_invite(nodes: Nodes, tmp_path: Path) -> None:
    """An agent with a state directory, started again: it comes back bound
    and must not open a bind for anyone else."""
    state = tmp_path / "agent"
    plane = await nodes.start("py-plane", listen=False)
    builder = capwire.Node.builder("py-admin").listen("127.0.0.1:0").state_dir(str(state))
    async with builder.start() as first:
        first_id = first.id
        await asyncio.wait_for(plane.connect_invite(first.invite()), 10)
    del first
    gc.collect()  # its state directory is free once the node is gone

    again = await nodes.start("py-admin", admin_cap([]), state_dir=str(state))
    assert again.id == first_id and again.controller == plane.id
    try:
        again.invite()
    except capwire.AlreadyBound:
        pass
    else:
        raise AssertionError("a restarted bound node gave an invite")
    assert again.controller == plane.id and again.manifest()["monitoring"] == "on"
