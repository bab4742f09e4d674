"""Cancel (RFC 18.6) over real gRPC, against scripted agent providers: in-flight frames, the
final frame, the answers CANCELLED / NOT_FOUND / ALREADY_COMPLETED, a provider that ignores the
request, one that finished first, and a caller that goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError
from apiary.sdk.tool_provider import Tool
from apiary.sdk.tools import ToolClient, ToolResult
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.tool_agents import never, raw_provider

GRACE_S = 0.5
TOOLS = [Tool("count", never), Tool("add", never)]


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    runtime = Runtime(tools=ToolSettings(cancel_grace_s=GRACE_S))
    async with open_test_coordinator(tmp_path, runtime=runtime) as running:
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[ToolClient]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        yield ToolClient(channel, agent_id="caller")


class Collector:
    """Reads a CallStream in the background; `frames` grows as frames arrive."""

    def __init__(self, client: ToolClient, call_id: str) -> None:
        self.frames: list[ToolResult] = []
        self.arrived = asyncio.Condition()
        self.task = asyncio.create_task(self._read(client, call_id))

    async def _read(self, client: ToolClient, call_id: str) -> None:
        async for frame in client.stream("count", {"n": 10}, call_id=call_id):
            async with self.arrived:
                self.frames.append(frame)
                self.arrived.notify_all()

    async def until(self, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.frames) >= count), 10)

    async def done(self) -> list[ToolResult]:
        await asyncio.wait_for(self.task, 10)
        return self.frames


def data(i: int) -> dict[str, Any]:
    return {"result": {"i": i}, "final": False, "frame_no": i + 1}


async def finished(coordinator: Coordinator, call_id: str) -> dict[str, Any]:
    found = await coordinator.events.read(limit=10_000)
    (event,) = [
        dict(e.details) for e in found
        if e.event_type == "tool.call_finished" and e.details["call_id"] == call_id
    ]  # fmt: skip
    return event


@pytest.mark.conformance(
    "tool.cancel.best-effort", "tool.cancel.in-flight-frames", "tool.cancel.final-frame",
    "tool.cancel.summary-cancelled", "tool.cancel.error-cancelled", "tool.cancel.partial-result",
)  # fmt: skip
async def test_cancel_mid_stream_passes_in_flight_frames_then_ends_cancelled(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(str(coordinator.grpc_address), "counter", TOOLS) as provider:
        stream = Collector(client, "c-1")
        call, doc = await provider.next_call()
        assert doc["stream"] is True
        for i in range(2):
            await provider.result(call, data(i))
        await stream.until(2)
        assert await client.cancel("c-1") == (
            "CANCELLED",
            "c-1: cancellation initiated (CANCELLING)",
        )
        _, request = await provider.next_call()
        assert request == {"action": "cancel", "call_id": "c-1", "provider_id": "counter"}
        # Frames the provider had already sent arrive after Cancel, then its stop.
        for i in range(2, 4):
            await provider.result(call, data(i))
        await provider.result(call, {"final": True, "summary": {"cancelled": True}})
        frames = await stream.done()
    assert [f.final for f in frames] == [False] * 4 + [True]
    assert [f.json() for f in frames[:4]] == [{"i": i} for i in range(4)]
    final = frames[-1]
    assert final.cancelled
    assert final.summary["status"] == "CANCELLED"
    assert final.summary["partial_result"] is True
    assert (final.summary["frames"], final.summary["bytes"]) == (5, 4 * len(b'{"i": 0}'))
    assert await client.cancel("c-1") == ("ALREADY_COMPLETED", "c-1: the call has already ended")
    event = await finished(coordinator, "c-1")
    assert (event["state"], event["frames"]) == ("CANCELLED", 5)


@pytest.mark.conformance("tool.cancel.final-frame")
async def test_a_provider_that_ignores_cancel_is_cut_off_after_the_grace_period(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(str(coordinator.grpc_address), "counter", TOOLS) as provider:
        stream = Collector(client, "c-2")
        call, _ = await provider.next_call()
        code, _ = await client.cancel("c-2")
        assert code == "CANCELLED"
        await provider.next_call()  # the cancel request, which it ignores
        frames = await stream.done()
        await provider.result(call, data(0))  # too late: ignored
    (final,) = frames
    assert final.final
    assert final.summary["status"] == "CANCELLED"
    assert final.summary["partial_result"] is False
    assert final.summary["reason"] == "cancelled by caller"
    assert (await finished(coordinator, "c-2"))["state"] == "CANCELLED"


@pytest.mark.conformance("tool.cancel.normal-terminal")
async def test_a_call_that_completes_before_it_can_stop_ends_with_its_normal_frame(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(str(coordinator.grpc_address), "counter", TOOLS) as provider:
        stream = Collector(client, "c-3")
        call, _ = await provider.next_call()
        await provider.result(call, data(0))
        await stream.until(1)
        assert (await client.cancel("c-3"))[0] == "CANCELLED"
        await provider.next_call()
        # It had finished already: the normal terminal frame follows, with its data.
        await provider.result(call, {"result": {"i": 1}, "final": True})
        frames = await stream.done()
    assert [f.final for f in frames] == [False, True]
    final = frames[-1]
    assert not final.cancelled
    assert final.summary["status"] == "OK"
    assert final.json() == {"i": 1}
    assert (await finished(coordinator, "c-3"))["state"] == "COMPLETED"


@pytest.mark.conformance("tool.cancel.error-not-found")
async def test_cancel_answers_not_found_and_already_completed(
    coordinator: Coordinator, client: ToolClient
) -> None:
    assert await client.cancel("never-made") == ("NOT_FOUND", "never-made: no such call")
    async with raw_provider(str(coordinator.grpc_address), "calc", TOOLS) as provider:
        pending = asyncio.create_task(client.call("add", {}, call_id="done-1"))
        call, _ = await provider.next_call()
        await provider.result(call, {"result": 3})
        assert (await asyncio.wait_for(pending, 10)).json() == 3
    code, message = await client.cancel("done-1")
    assert (code, message) == ("ALREADY_COMPLETED", "done-1: the call has already ended")
    with pytest.raises(ApiaryError) as reused:
        await client.call("add", {}, call_id="done-1")
    assert reused.value.code == "already_exists"


async def test_a_cancelled_unary_call_answers_cancelled(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(str(coordinator.grpc_address), "calc", TOOLS) as provider:
        pending = asyncio.create_task(client.call("add", {}, call_id="u-1"))
        call, _ = await provider.next_call()
        await provider.result(call, data(0))
        assert (await client.cancel("u-1"))[0] == "CANCELLED"
        await provider.next_call()
        await provider.result(call, {"final": True, "summary": {"cancelled": True}})
        with pytest.raises(ApiaryError) as caught:
            await asyncio.wait_for(pending, 10)
    assert caught.value.code == "CANCELLED"


@pytest.mark.conformance("tool.cancel.cleanup")
async def test_a_caller_that_goes_away_cancels_its_call(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(str(coordinator.grpc_address), "counter", TOOLS) as provider:
        stream = Collector(client, "gone-1")
        call, _ = await provider.next_call()
        await provider.result(call, data(0))
        await stream.until(1)
        stream.task.cancel()  # the client stops reading and cancels the RPC
        _, request = await provider.next_call()
        assert request["action"] == "cancel"
        assert request["call_id"] == "gone-1"
    assert coordinator.tools is not None
    for _ in range(200):
        if coordinator.tools.calls.get("gone-1") is None:
            break
        await asyncio.sleep(0.01)
    event = await finished(coordinator, "gone-1")
    assert (event["state"], event["frames"]) == ("CANCELLED", 1)
    assert await client.cancel("gone-1") == (
        "ALREADY_COMPLETED",
        "gone-1: the call has already ended",
    )
