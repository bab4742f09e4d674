"""The SDK agent against a real coordinator over gRPC sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage, MessageType
from apiary.errors import NoRouteError, ValidationError
from apiary.sdk.agent import Agent
from apiary.sdk.connection import Delivery
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


async def _next_data(deliveries: AsyncIterator[Delivery]) -> Delivery:
    while True:
        delivery = await asyncio.wait_for(anext(deliveries), 10)
        if delivery.envelope.message_type is MessageType.DATA:
            return delivery


@pytest.mark.conformance("registry.events.local-discovery")
async def test_agents_keep_local_discovery_state_from_join_and_leave(
    coordinator: Coordinator,
) -> None:
    address = str(coordinator.grpc_address)
    async with Agent("alice", coordinator=address) as alice:
        await Agent("bob", coordinator=address, capabilities=["review"]).start()
        deliveries = alice.deliveries()
        pump = asyncio.create_task(_drain(deliveries))
        await _until(lambda: "bob" in alice.directory)
        assert alice.directory["bob"]["capabilities"] == ["review"]
        async with Agent("carol", coordinator=address) as carol:
            await _until(lambda: "carol" in alice.directory)
            late = carol.deliveries()
            carol_pump = asyncio.create_task(_drain(late))
            await _until(lambda: {"alice", "bob"} <= set(carol.directory))
            carol_pump.cancel()
        await _until(lambda: "carol" not in alice.directory)
        pump.cancel()


async def _drain(deliveries: AsyncIterator[Delivery]) -> None:
    async for _ in deliveries:
        pass


async def _until(condition: object, rounds: int = 500) -> None:
    for _ in range(rounds):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_send_receive_ack_and_resume(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    async with (
        Agent("alice", coordinator=address) as alice,
        Agent("bob", coordinator=address) as bob,
    ):
        first = await alice.send("bob", {"n": 1})
        second = await alice.send("bob", {"n": 2})
        stream = bob.deliveries()
        got = await _next_data(stream)
        assert got.envelope.message_id == first.message_id
        await bob.ack(got.envelope, AckStage.FULFILLED)
        await _next_data(stream)  # the second arrives but is not acknowledged
        await stream.aclose()
        # A new stream resumes after the last acknowledged offset: the second comes again.
        again = await _next_data(bob.deliveries())
        assert again.envelope.message_id == second.message_id
        assert again.attempt == 2


async def test_sdk_raises_apiary_errors(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    async with Agent("alice", coordinator=address) as alice:
        with pytest.raises(NoRouteError):
            await alice.send("nobody", {"n": 1})
    with pytest.raises(ValidationError, match="reasoning_connectors"):
        await Agent("bad", coordinator=address, reasoning_connectors=()).start()


async def test_an_agent_leaving_on_an_error_raises_it_though_it_cannot_deregister(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's error is the one its caller sees, not the deregistration's `unavailable`
    (the coordinator gone meanwhile), which is logged."""
    stop_coordinator = contextlib.AsyncExitStack()
    coordinator = await stop_coordinator.enter_async_context(open_test_coordinator(tmp_path))
    with pytest.raises(LookupError, match="the agent's own error"):
        async with Agent("alice", coordinator=str(coordinator.grpc_address)):
            await stop_coordinator.aclose()
            raise LookupError("the agent's own error")
    assert [r.getMessage() for r in caplog.records if "could not deregister" in r.getMessage()]


@pytest.mark.conformance("envelope.data.streaming-large")
async def test_a_large_payload_travels_as_a_chunked_transfer(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    payload = bytes(range(256)) * 4096  # 1 MiB
    async with (
        Agent("alice", coordinator=address) as alice,
        Agent("bob", coordinator=address, capabilities=["chunking"],
              modalities=["application/octet-stream"]) as bob,
    ):  # fmt: skip
        message_id = await alice.send_chunked(
            "bob", payload, "application/octet-stream", chunk_bytes=256 * 1024
        )
        got = await _next_data(bob.deliveries())
        assert (got.envelope.message_id, got.envelope.payload) == (message_id, payload)
