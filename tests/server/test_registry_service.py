"""sw4rm.registry.RegistryService over real gRPC sockets (RFC 14): descriptor validation,
join/leave announcements, and heartbeats that bring an agent back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from apiary.engine.presence import PresenceSettings
from apiary.wire import pb
from tests.server.wire_client import (
    WAIT_S,
    Running,
    descriptor,
    error_detail,
    open_running,
    register,
)

registry_pb2 = pb.registry_pb2
apiary_pb2 = pb.apiary_pb2
MANUAL = PresenceSettings(heartbeat_interval_s=1e9)
"""The heartbeat loop never wakes by itself: the tests run rounds with Presence.tick."""


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with open_running(tmp_path, presence=MANUAL) as r:
        await register(r.channel, "alice")
        yield r


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.mark.conformance(
    "registry.register.description-200-words", "registry.register.inference-connector"
)
@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("agent.description", {"description": _words(201)}),
        ("agent.reasoning_connectors", {"reasoning_connectors": []}),
        ("agent.reasoning_connectors", {"reasoning_connectors": ["not a uri"]}),
        ("agent.modalities_supported", {"modalities_supported": ["images"]}),
        ("agent.public_key", {"public_key": b"k" * 31}),
        ("agent.name", {"name": "  "}),
        ("agent.capabilities", {"capabilities": ["summarize", "summarize"]}),
    ],
)
async def test_a_bad_descriptor_is_refused_naming_the_field(
    running: Running, field: str, change: dict[str, Any]
) -> None:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.RegisterAgent(
        registry_pb2.RegisterAgentRequest(agent=descriptor("bob", **change))
    )
    assert not reply.accepted
    assert reply.reason.startswith(f"{field}:"), reply.reason
    discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(running.channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="bob"))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    # Nobody was told about an agent that never joined.
    events = await running.coordinator.store.events.read(limit=1000)
    assert "agent.registered" not in [e.event_type for e in events if e.agent_id == "bob"]


@pytest.mark.conformance("registry.register.description-200-words")
async def test_a_descriptor_at_the_limits_is_accepted(running: Running) -> None:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.RegisterAgent(
        registry_pb2.RegisterAgentRequest(
            agent=descriptor(
                "bob", description=_words(200), capabilities=["summarize", "translate"],
                communication_class=pb.common_pb2.PRIVILEGED, public_key=b"k" * 32,
                modalities_supported=["application/json", "image/*"],
            )
        )
    )  # fmt: skip
    assert reply.accepted, reply.reason
    discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(running.channel)
    info = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="bob"))
    assert info.descriptor.communication_class == pb.common_pb2.PRIVILEGED
    assert list(info.descriptor.capabilities) == ["summarize", "translate"]
    found = await discovery.ListAgents(apiary_pb2.ListAgentsRequest(capability="translate"))
    assert [a.descriptor.agent_id for a in found.agents] == ["bob"]


async def _notifications(call: Any, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while len(found) < count:
        item = await asyncio.wait_for(call.read(), WAIT_S)
        if item.msg.message_type == pb.common_pb2.NOTIFICATION:
            found.append(json.loads(item.msg.payload))
    return found


@pytest.mark.conformance("registry.events.broadcast")
async def test_joins_and_leaves_reach_connected_agents(running: Running) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    stream = router.StreamIncoming(pb.router_pb2.StreamRequest(agent_id="alice"))
    (directory,) = await _notifications(stream, 1)
    assert directory["event"] == "directory"
    await register(running.channel, "bob")
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.DeregisterAgent(
        registry_pb2.DeregisterAgentRequest(agent_id="bob", reason="done for today")
    )
    assert reply.ok
    joined, left = await _notifications(stream, 2)
    stream.cancel()
    assert (joined["event"], joined["agent"]["agent_id"]) == ("agent_joined", "bob")
    assert left == {"event": "agent_left", "agent_id": "bob", "reason": "done for today"}
    again = await stub.DeregisterAgent(registry_pb2.DeregisterAgentRequest(agent_id="bob"))
    assert not again.ok


@pytest.mark.conformance("registry.deregister.explicit", "registry.heartbeat.debounce")
async def test_a_heartbeat_brings_an_unavailable_agent_back(running: Running) -> None:
    discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(running.channel)
    presence = running.coordinator.presence
    running.clock.advance(presence.settings.heartbeat_timeout_s + 1)
    states = []
    for _ in range(presence.settings.debounce):
        await presence.tick()
        info = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="alice"))
        states.append(info.state)
    # Registered without opening its stream, alice has not said it is ready: INITIALIZING
    # (RFC 8.1) until presence loses it (core/agent_state.py).
    assert states == ["INITIALIZING", "INITIALIZING", "UNAVAILABLE"]
    listed = await discovery.ListAgents(apiary_pb2.ListAgentsRequest())
    assert [a.descriptor.agent_id for a in listed.agents] == ["alice"]  # still registered
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.Heartbeat(
        registry_pb2.HeartbeatRequest(agent_id="alice", health={"queue": "0"})
    )
    assert reply.ok
    info = await discovery.GetAgent(apiary_pb2.GetAgentRequest(agent_id="alice"))
    assert info.state == "INITIALIZING"  # available again, and still not ready
    assert info.last_heartbeat_at.seconds == int(running.clock.now())


async def test_a_heartbeat_from_an_unknown_agent_is_not_found(running: Running) -> None:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Heartbeat(registry_pb2.HeartbeatRequest(agent_id="ghost"))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND
    assert error_detail(caught.value).details["agent_id"] == "ghost"


@pytest.mark.conformance("registry.register.inference-connector")
async def test_no_reasoning_connector_is_refused_with_the_fix_over_grpc_and_gateway(
    running: Running,
) -> None:
    """RFC 14: a descriptor without an Inference Engine connector is refused, and the refusal
    says what to add, to a canonical gRPC client and a gateway client alike (one rule)."""
    bare = registry_pb2.RegisterAgentRequest(agent=descriptor("bob", reasoning_connectors=[]))
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.RegisterAgent(bare)
    assert not reply.accepted
    assert reply.reason.startswith("agent.reasoning_connectors: at least one"), reply.reason
    assert "add a reasoning connector such as 'builtin://rules'" in reply.reason
    body = {"agent": {"agent_id": "carol", "name": "carol"}}
    url = f"http://{running.http}/v1/sw4rm.registry.RegistryService/RegisterAgent"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert answer.get("accepted", False) is False
    assert answer["reason"] == reply.reason.replace("bob", "carol")
    # With the fix applied, the same descriptor registers.
    fixed = registry_pb2.RegisterAgentRequest(
        agent=descriptor("bob", reasoning_connectors=["builtin://rules"])
    )
    assert (await stub.RegisterAgent(fixed)).accepted
