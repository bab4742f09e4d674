"""WatchTasks names at most `[limits] watch_task_ids` tasks (default 1000) over real gRPC
sockets: a call at the limit is served, one past it is refused as validation_error naming
`task_ids` before any of the ids is read (so an unknown id among them is not what answers)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import apiary
from apiary.core.limits import DEFAULT_LIMITS, Limits
from apiary.errors import NotFoundError, ValidationError
from apiary.sdk.client import Client
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator, register_agent
from apiary.wire import pb

a = pb.apiary_pb2
SMALL = 3


async def _coordinator(tmp_path: Path, limits: Limits) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, limits=limits) as running:
        await register_agent(running, "idle")
        yield running


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async for running in _coordinator(tmp_path, Limits(watch_task_ids=SMALL)):
        yield running


@pytest.fixture
async def default(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async for running in _coordinator(tmp_path, Limits()):
        yield running


async def _submitted(client: Client) -> list[apiary.TaskHandle]:
    """As many tasks as the small limit, each QUEUED for the idle agent."""
    return [await client.submit_task("idle", {"n": n}, scope=f"repo:{n}") for n in range(SMALL)]


async def _watch(client: Client, task_ids: list[str]) -> list[a.TaskView]:
    request = a.WatchTasksRequest(task_ids=task_ids)
    return [view async for view in client.task_query.WatchTasks(request)]


async def test_a_watch_of_as_many_tasks_as_the_limit_is_served(small: Coordinator) -> None:
    async with Client(str(small.grpc_address), agent_id="app") as client:
        handles = await _submitted(client)
        for handle in handles:  # ended, so that the watch of them ends
            await handle.cancel("not needed")
        views = await _watch(client, [h.task_id for h in handles])
    assert sorted(v.task_id for v in views) == sorted(h.task_id for h in handles)
    assert {(v.state, v.error_code) for v in views} == {("FAILED", "cancelled")}


async def test_a_watch_of_more_tasks_than_the_limit_is_refused_naming_task_ids(
    small: Coordinator,
) -> None:
    async with Client(str(small.grpc_address), agent_id="app") as client:
        handles = await _submitted(client)
        ids = [h.task_id for h in handles]
        for past in ([*ids, "never-submitted"], [*ids, ids[0]]):  # counted as sent
            with pytest.raises(ValidationError) as caught:
                await _watch(client, past)
            assert caught.value.details["field"] == "task_ids"
            assert caught.value.details["limit"] == str(SMALL)
            assert "[limits] watch_task_ids" in caught.value.message
        # Refused before it opened a feed: the caller's tasks are still there to watch.
        assert (await handles[0].status()).state == "QUEUED"


async def test_the_default_limit_is_a_thousand_task_ids(default: Coordinator) -> None:
    assert DEFAULT_LIMITS.watch_task_ids == 1000
    unknown = [str(uuid.uuid4()) for _ in range(1001)]
    async with Client(str(default.grpc_address), agent_id="app") as client:
        # At the limit the call goes on to read the ids: an unknown one is not_found.
        with pytest.raises(NotFoundError):
            await _watch(client, unknown[:1000])
        with pytest.raises(ValidationError) as caught:
            await _watch(client, unknown)
    assert caught.value.details["field"] == "task_ids"
    assert "1001 tasks, more than the 1000" in caught.value.message
