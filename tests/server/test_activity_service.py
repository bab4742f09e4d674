"""The activity buffer over gRPC (RFC 10, 10.1): agents register in-flight work, operators
and automation read it filtered, the scheduler's RPCs poll and purge it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from apiary.core.activity import ActivityBuffer, ActivityLimits
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

a = pb.apiary_pb2
s = pb.scheduler_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


def _entry(agent: str, task: str, repo: str = "app", **fields: str) -> a.RegisterActivityRequest:
    return a.RegisterActivityRequest(
        entry=a.ActivityRecord(
            agent_id=agent, task_id=task, repo_id=repo, worktree_id=f"wt-{agent}",
            branch="main", description="fix the failing test", **fields,
        )
    )  # fmt: skip


@pytest.mark.conformance(
    "activity.buffer.required", "activity.entry.fields", "activity.read.filtered",
    "activity.history.recent",
)  # fmt: skip
async def test_register_poll_filter_complete_and_purge(coordinator: Coordinator) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        buffer = pb.apiary_pb2_grpc.ActivityBufferServiceStub(channel)
        scheduler = pb.scheduler_pb2_grpc.SchedulerServiceStub(channel)
        for agent, task, repo in (
            ("coder", "t1", "app"),
            ("coder", "t2", "docs"),
            ("critic", "t3", "app"),
        ):
            await buffer.Register(_entry(agent, task, repo))
        polled = await scheduler.PollActivityBuffer(s.PollActivityBufferRequest(agent_id="coder"))
        assert [e.task_id for e in polled.entries] == ["t1", "t2"]
        assert polled.entries[0].timestamp.endswith("Z")
        by_repo = await buffer.List(a.ListActivityRequest(repo_id="app"))
        assert [e.task_id for e in by_repo.entries] == ["t1", "t3"]
        done = await buffer.Complete(a.CompleteActivityRequest(agent_id="coder", task_id="t1"))
        assert done.found
        history = await buffer.List(a.ListActivityRequest(history=True))
        assert [(e.task_id, e.outcome) for e in history.entries] == [("t1", "COMPLETED")]
        purged = await scheduler.PurgeActivity(s.PurgeActivityRequest(agent_id="coder"))
        assert purged.purged == 1
        left = await buffer.List(a.ListActivityRequest())
        assert [e.task_id for e in left.entries] == ["t3"]
    kinds = {e.event_type for e in await coordinator.events.read(limit=1000)}
    assert {"activity.registered", "activity.completed", "activity.purged"} <= kinds


@pytest.mark.conformance("activity.entry.description-200-words")
async def test_a_long_description_is_refused_naming_the_field(coordinator: Coordinator) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        buffer = pb.apiary_pb2_grpc.ActivityBufferServiceStub(channel)
        request = _entry("coder", "t1")
        request.entry.description = "word " * 201
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await buffer.Register(request)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "description" in (caught.value.details() or "")


@pytest.mark.conformance(
    "activity.limits.no-silent-drop", "activity.limits.reject-full",
    "activity.limits.warn-80-percent", "activity.limits.operators-monitor",
)  # fmt: skip
async def test_a_full_buffer_rejects_and_warns(coordinator: Coordinator) -> None:
    # A small buffer for the test: 5 entries, 2 per agent.
    assert coordinator.activity is not None
    coordinator.activity.buffer = ActivityBuffer(ActivityLimits(max_entries=5, per_agent=2))
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        buffer = pb.apiary_pb2_grpc.ActivityBufferServiceStub(channel)
        await buffer.Register(_entry("a", "1"))
        await buffer.Register(_entry("a", "2"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await buffer.Register(_entry("a", "3"))
        assert "activity_buffer_full" in (caught.value.details() or "")
        for agent in ("b", "c"):
            await buffer.Register(_entry(agent, "1"))
        listed = await buffer.List(a.ListActivityRequest())
        assert len(listed.entries) == 4 and listed.utilization == pytest.approx(0.8)
        await buffer.Register(_entry("b", "2"))
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{coordinator.http_address}/metrics") as resp,
    ):
        text = await resp.text()
    assert "apiary_activity_buffer_over_warning 1.0" in text


@pytest.mark.conformance("activity.limits.default-10000", "activity.limits.per-agent-100")
def test_default_limits() -> None:
    limits = ActivityLimits()
    assert (limits.max_entries, limits.per_agent, limits.warn_ratio) == (10_000, 100, 0.8)
