"""The SDK's side of handoffs against a real coordinator over gRPC sockets (RFC 17.6):
discovery of pending offers with GetPendingHandoffs when an agent (re)starts, refusals as
rejection reasons, and an origin's ticket that settles on a final rejection. Agents run as
asyncio tasks of the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

import apiary
from apiary.core.events import Event
from apiary.errors import NoRouteError, ValidationError
from apiary.sdk.connection import Delivery
from apiary.sdk.handoff import HandoffClient
from apiary.server.coordinator import Coordinator
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from tests.server.wire_client import descriptor

WAIT_S = 20.0
REVIEW = "security-review"


@asynccontextmanager
async def running(agent: apiary.Agent) -> AsyncIterator[asyncio.Task[None]]:
    job = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent._runner is not None)
        yield job
    finally:
        if not job.done():
            job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job


async def until(check: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not check():  # noqa: ASYNC110 - polls plain attributes of the agent
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), WAIT_S)


async def event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


class Deaf(apiary.Agent):
    """A reviewer whose handoff notifications are lost (say, its inbox was purged while it
    was down): only GetPendingHandoffs can tell it about offers."""

    capabilities = (REVIEW,)
    handoff_poll_s = 0.05

    def __init__(self, agent_id: str, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.offers: list[apiary.Handoff] = []

    async def _on_notice(self, delivery: Delivery) -> None:
        body = json.loads(delivery.envelope.payload or b"{}")
        if not str(body.get("event", "")).startswith("handoff."):  # lose handoff notices
            await super()._on_notice(delivery)

    async def on_handoff(self, offer: apiary.Handoff) -> None:
        self.offers.append(offer)


class Origin(apiary.Agent):
    handoff_poll_s = 0.0


class Grumpy(apiary.Agent):
    capabilities = (REVIEW,)
    handoff_poll_s = 0.0

    async def on_handoff(self, offer: apiary.Handoff) -> None:
        raise RuntimeError("not today")


@pytest.mark.conformance("handoff.discovery.poll-pending", "patterns.handoff.poll-pending")
async def test_a_restarted_agent_finds_its_pending_offers_with_get_pending_handoffs(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    registry = pb.registry_pb2_grpc.RegistryServiceStub(channel)
    for agent_id, capabilities in (("alice", []), ("bob", [REVIEW])):
        agent = descriptor(agent_id, capabilities=capabilities)
        await registry.RegisterAgent(pb.registry_pb2.RegisterAgentRequest(agent=agent))
    # bob is registered but not running (it crashed) when alice hands work to it.
    origin = HandoffClient(channel, "alice")
    request_id = await origin.request("bob", context={"step": 3}, capabilities=[REVIEW])
    bob = Deaf("bob", coordinator=str(coordinator.grpc_address))
    async with running(bob):
        await until(lambda: bool(bob.offers))
        accepted = await event(coordinator, lambda e: e.event_type == "handoff.accepted")
        # While it runs, a later offer is found by the next periodic poll.
        later = await origin.request("bob", context=b"notes", content_type="text/plain")
        await until(lambda: len(bob.offers) == 2)
    first, second = bob.offers
    assert (first.request_id, first.from_agent, first.state) == (request_id, "alice", "PENDING")
    assert first.json() == {"step": 3} and first.content_type == "application/json"
    assert accepted.correlation_id == request_id and accepted.actor == "bob"
    assert (second.request_id, second.text(), second.content_type) == (later, "notes", "text/plain")


async def test_a_refusing_handler_rejects_with_its_reason_and_the_ticket_settles(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    address = str(coordinator.grpc_address)
    grumpy = Grumpy("grumpy", coordinator=address)
    alice = Origin("alice", coordinator=address)
    async with running(grumpy), running(alice):
        ticket = await alice.handoff("grumpy", context=b"\x00raw", capabilities=[REVIEW])
        assert await ticket.outcome(WAIT_S) == "REJECTED"
        assert [u["event"] for u in ticket.updates] == [
            "handoff.requested",
            "handoff.rejected",
            "handoff.not_rerouted",
        ]
        assert ticket.updates[1]["rejection_reason"] == "RuntimeError: not today"
        with pytest.raises(NoRouteError) as unknown:
            await alice.handoff("nobody", context={})
        assert unknown.value.details["field"] == "to_agent"
        with pytest.raises(ValidationError) as itself:
            await alice.handoffs.request("alice", context={})
        assert itself.value.details["field"] == "to_agent"
    # The rejecting agent lost access to the context; the origin keeps it (nothing moved).
    view = await HandoffClient(channel, "alice").get(ticket.request_id)
    assert view.state == "REJECTED" and view.snapshot == b"\x00raw" and view.content_type == ""
    assert view.rejection_reason == "RuntimeError: not today"
