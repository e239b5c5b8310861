"""A node's A2A Agent Card, from `capwire ctl card` and from `capwire mcp
--http`, validated with the `a2a-sdk` package's own types."""

import json
from typing import Any

import httpx
from a2a.client.card_resolver import A2ACardResolver, parse_agent_card
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import MessageToDict, ParseDict

from conftest import Cluster, HttpFace, wait_for

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
    skills = {s.id: s for s in parsed.skills}
    assert set(skills) == {
        "app.agent/echo", "app.agent/note", "app.agent/tell", "app.agent/work",
        "app.agent/ask", "app.agent/probe", "app.agent/hand_on",
    }
    assert "controller" in skills["app.agent/ask"].tags
    assert list(skills["app.agent/echo"].input_modes) == ["application/json"]
    (ext,) = parsed.capabilities.extensions
    verbs = MessageToDict(ext.params)["verbs"]
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
