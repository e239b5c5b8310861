"""A node's A2A Agent Card, from `capwire ctl card` and from `capwire mcp
--http`, validated with the `a2a-sdk` package's own types."""

import json
from typing import Any

import httpx
from a2a.client.card_resolver import A2ACardResolver, parse_agent_card
from a2a.types.a2a_pb2 import AgentCard
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from google.protobuf.json_format import MessageToDict, ParseDict
from mcp import Client

from conftest import Cluster, HttpFace, start_http, stop_process, wait_for

#: What A2A 1.0 requires of a card.
REQUIRED = ("name", "description", "supportedInterfaces", "version", "capabilities",
            "defaultInputModes", "defaultOutputModes", "skills")


def strict(card: dict[str, Any]) -> AgentCard:
    """Parsed with no unknown field allowed, every required one present."""
    for field in REQUIRED:
        assert field in card, f"the card has no {field}"
    parsed = ParseDict(card, AgentCard(), ignore_unknown_fields=False)
    for skill in card["skills"]:
        for field in ("id", "name", "description", "tags"):
            assert skill.get(field), f"a skill without {field}: {skill}"
    return parsed


async def test_ctl_card_is_a_valid_a2a_card(cluster: Cluster) -> None:
    (alpha,) = cluster.agents
    done = await cluster.ctl("card", "alpha")
    card = json.loads(done.out)
    parsed = strict(card)
    assert parse_agent_card(dict(card)) == parsed, "the SDK's own parser reads the same card"
    assert parsed.name == "alpha"
    assert parsed.capabilities.streaming, "alpha has a stream verb (tell)"
    (interface,) = parsed.supported_interfaces
    # The address as an invite without a code (`tcp://` left out).
    assert interface.url == f"capwire://{alpha.id}@{alpha.addr.removeprefix('tcp://')}"
    assert interface.protocol_binding == "capwire"
    # The version of A2A the card follows, the one the SDK speaks; capwire's
    # own wire protocol version is in its extension.
    assert interface.protocol_version == PROTOCOL_VERSION_CURRENT == "1.0"
    skills = {s.id: s for s in parsed.skills}
    assert set(skills) == {
        "app.agent/echo", "app.agent/note", "app.agent/tell", "app.agent/work",
        "app.agent/ask", "app.agent/probe", "app.agent/hand_on",
    }
    assert "controller" in skills["app.agent/ask"].tags
    assert list(skills["app.agent/echo"].input_modes) == ["application/json"]
    (ext,) = parsed.capabilities.extensions
    params = MessageToDict(ext.params)
    assert params["wireVersion"] == 3
    assert params["appId"] == "capwire.node" and params["nodeName"] == "alpha"
    verbs = params["verbs"]
    assert verbs["app.agent/work"]["kind"] == "task"
    assert verbs["app.agent/work"]["argsSchema"]["properties"]["text"]["type"] == "string"
    assert verbs["app.agent/tell"]["resultSchema"]["type"] == "string"

    # --json: the card as a record.
    (record,) = await cluster.ctl_json("card", "alpha")
    assert record["kind"] == "card" and record["card"] == card


async def test_the_http_face_serves_the_cards(cluster: Cluster, http_face: HttpFace) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        resolver = A2ACardResolver(http, http_face.base)
        card = await resolver.get_agent_card()
        assert card.name == "alpha"
        same = await resolver.get_agent_card("/nodes/alpha/.well-known/agent-card.json")
        assert same == card
        strict((await http.get(f"{http_face.base}/.well-known/agent-card.json")).json())

        await cluster.start_agent("beta")

        async def two() -> bool:
            r = await http.get(f"{http_face.base}/.well-known/agent-card.json")
            return r.status_code == 404

        await wait_for(two, what="a second node served")
        listing = (await http.get(f"{http_face.base}/.well-known/agent-card.json")).json()
        assert sorted(listing["cards"]) == [
            "/nodes/alpha/.well-known/agent-card.json",
            "/nodes/beta/.well-known/agent-card.json",
        ]
        beta = await resolver.get_agent_card("/nodes/beta/.well-known/agent-card.json")
        assert beta.name == "beta"


async def app_version(cluster: Cluster, node: str) -> str:
    (manifest,) = await cluster.ctl_json("manifest", node)
    (app,) = [c for c in manifest["capabilities"] if c["id"].startswith("app.")]
    return str(app["version"])


async def test_the_version_is_the_agents_and_outlives_a_restart(cluster: Cluster) -> None:
    (alpha,) = cluster.agents
    version = await app_version(cluster, "alpha")
    card = json.loads((await cluster.ctl("card", "alpha")).out)
    assert card["version"] == version, "the version of the agent's app.* capability"

    # The same agent, run again (its manifest's epoch starts again): its
    # card keeps its version.
    await cluster.restart_agent(alpha)
    again = json.loads((await cluster.ctl("card", "alpha")).out)
    assert again["version"] == card["version"] == version
    assert again == card, "nothing else changed either"


async def test_the_card_goes_by_the_name_the_tools_and_its_path_use(cluster: Cluster) -> None:
    # A node that calls itself "self-named", bound as "renamed".
    agent = await cluster.start_agent("self-named", bind=False)
    (record,) = await cluster.ctl_json("bind", agent.invite, "--name", "renamed")
    assert record["kind"] == "bound", record
    card = json.loads((await cluster.ctl("card", "renamed")).out)
    strict(card)
    assert card["name"] == "renamed"
    (ext,) = card["capabilities"]["extensions"]
    assert ext["params"]["nodeName"] == "self-named", "its own name is kept in the extension"

    face = await start_http(cluster, "--node", "renamed")
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            served = (await http.get(f"{face.base}/nodes/renamed/.well-known/agent-card.json")).json()
            assert served == card
            only = (await http.get(f"{face.base}/.well-known/agent-card.json")).json()
            assert only == card
        async with Client(face.mcp_url) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
        assert "renamed__agent__echo" in tools, tools
        assert all(name.startswith(f"{card['name']}__") for name in tools), tools
    finally:
        await stop_process(face.proc)


async def test_the_cards_answer_only_for_the_served_hosts(http_face: HttpFace) -> None:
    port = http_face.base.rsplit(":", 1)[1]
    paths = ["/.well-known/agent-card.json", "/nodes/alpha/.well-known/agent-card.json", "/nothing"]
    async with httpx.AsyncClient(timeout=10) as http:
        for path in paths:
            url = f"{http_face.base}{path}"
            # A name that resolves to loopback for a page elsewhere (DNS
            # rebinding): refused as on /mcp.
            for host in ("evil.example", f"evil.example:{port}", f"127.0.0.2:{port}"):
                r = await http.get(url, headers={"Host": host})
                assert r.status_code == 403, (path, host, r.status_code)
                assert "alpha" not in r.text
            r = await http.post(url, content=b"", headers={"Host": "evil.example"})
            assert r.status_code == 403, (path, r.status_code)
            # The loopback names and the address listened on are served.
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
                r = await http.get(url, headers={"Host": host})
                assert r.status_code == (404 if path == "/nothing" else 200), (path, host, r.status_code)
        r = await http.post(http_face.mcp_url, content=b"{}", headers={"Host": "evil.example"})
        assert r.status_code == 403, "the same as /mcp"
