"""A client's task handles wait over one FollowTasks stream (sdk/task_waits.py), against a
real coordinator over real gRPC sockets with SDK agents as asyncio tasks of the test: many
handles are answered over one stream and no WaitTask, a task that ended before its handle
waited is answered, timeouts, failures and holds read as before, one waiter's cancellation
leaves the others waiting, the stream is opened again after the coordinator restarts, and a
coordinator that does not serve the stream leaves the waits to WaitTask."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apiary.core.records import TaskState
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import UnimplementedError
from apiary.sdk import task_waits
from apiary.sdk.client import Client
from apiary.sdk.errors import CoordinatorUnreachableError, TaskFailedError, TaskTimeoutError
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator, register_agent
from apiary.testing.events import wait_for_event
from tests.server.test_task_results import client, running_agent

WAIT_S = 20.0
WAIT_TASK = "/apiary.v1.TaskQueryService/WaitTask"
__all__ = ["client"]  # (the fixture, as test_task_results.py gives it)


async def _register(coordinator: Coordinator) -> None:
    """The agent the tasks are for, before it runs (tasks wait QUEUED for it)."""
    await register_agent(coordinator, "worker")


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        await _register(running)
        yield running


def _scheduler(coordinator: Coordinator) -> Scheduler:
    assert coordinator.scheduler is not None
    return coordinator.scheduler


async def _answered(coordinator: Coordinator, method: str) -> int:
    """Calls of `method` the coordinator answered (its /metrics counter, every code)."""
    url = f"http://{coordinator.http_address}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as reply:
        text = await reply.text()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("apiary_rpc_total{") and f'method="{method}"' in line
    )


async def _ended(coordinator: Coordinator, task_id: str) -> None:
    await wait_for_event(
        coordinator.events,
        lambda e: (
            e.event_type in ("task.completed", "task.failed")
            and e.details.get("task_id") == task_id
        ),
        timeout_s=WAIT_S,
    )


async def _until(check: Any) -> None:
    async with asyncio.timeout(WAIT_S):
        while not check():  # noqa: ASYNC110 - the state polled has no event of its own
            await asyncio.sleep(0.01)


async def test_many_handles_are_answered_over_one_stream_without_wait_task(
    coordinator: Coordinator, client: Client
) -> None:
    handles = [await client.submit_task("worker", {"return": n}, scope="repo:a") for n in range(60)]
    async with running_agent(coordinator):
        values = await asyncio.gather(*(h.result(timeout=WAIT_S) for h in handles))
    assert values == list(range(60))
    assert client.task_waits.opened == 1
    assert client.task_waits.fallback is None
    assert await _answered(coordinator, WAIT_TASK) == 0
    # Nothing stays followed, on either side.
    assert client.task_waits.waiting() == 0
    assert _scheduler(coordinator).watch.waiting() == 0


async def test_a_task_that_ended_before_its_handle_waited_is_answered(
    coordinator: Coordinator, client: Client
) -> None:
    async with running_agent(coordinator):
        first = await client.submit_task("worker", {"return": "first"}, scope="repo:a")
        assert await first.result(timeout=WAIT_S) == "first"  # (the stream is open now)
        early = await client.submit_task("worker", {"return": "early"}, scope="repo:a")
        failed = await client.submit_task("worker", {"fail": "bad_input"}, scope="repo:a")
        await _ended(coordinator, early.task_id)
        await _ended(coordinator, failed.task_id)
    # Both ended before anyone waited, the stream open all along: they are read when followed.
    assert await early.result(timeout=WAIT_S) == "early"
    assert (await client.task(early.task_id).wait(timeout=WAIT_S)).state == TaskState.COMPLETED
    with pytest.raises(TaskFailedError) as caught:
        await failed.result(timeout=WAIT_S)
    assert caught.value.error_code == "bad_input"
    assert client.task_waits.opened == 1
    assert await _answered(coordinator, WAIT_TASK) == 0


async def test_a_failure_comes_back_with_the_agents_code_and_message(
    coordinator: Coordinator, client: Client
) -> None:
    async with running_agent(coordinator):
        handle = await client.submit_task(
            "worker", {"fail": "empty_input", "message": "the file is empty"}, scope="repo:a"
        )
        with pytest.raises(TaskFailedError) as caught:
            await handle.result(timeout=WAIT_S)
    assert (caught.value.error_code, caught.value.message) == ("empty_input", "the file is empty")
    assert caught.value.task_id == handle.task_id
    assert await _answered(coordinator, WAIT_TASK) == 0


async def test_a_wait_that_runs_out_reads_where_the_task_stands_and_stops_following(
    coordinator: Coordinator, client: Client
) -> None:
    handle = await client.submit_task("worker", {"return": 1}, scope="repo:a")  # no agent runs
    with pytest.raises(TaskTimeoutError) as caught:
        await handle.result(timeout=0.2)
    assert (caught.value.task_id, caught.value.state) == (handle.task_id, "QUEUED")
    status = await handle.wait(timeout=0.1)
    assert (status.state, status.done) == ("QUEUED", False)
    # One WaitTask per wait that ran out (the read of where it stands), none while waiting.
    assert await _answered(coordinator, WAIT_TASK) == 2
    assert client.task_waits.waiting() == 0
    await _until(lambda: _scheduler(coordinator).watch.waiting() == 0)  # (unfollowed)
    # Waiting again follows it again, and its end comes.
    async with running_agent(coordinator):
        assert await handle.result(timeout=WAIT_S) == 1


async def test_one_waiters_cancellation_leaves_the_others_waiting(
    coordinator: Coordinator, client: Client
) -> None:
    shared = await client.submit_task("worker", {"return": "shared"}, scope="repo:a")
    other = await client.submit_task("worker", {"return": "other"}, scope="repo:a")
    gone = asyncio.create_task(shared.result())
    staying = asyncio.create_task(client.task(shared.task_id).result(timeout=WAIT_S))
    elsewhere = asyncio.create_task(other.result(timeout=WAIT_S))
    await _until(lambda: _scheduler(coordinator).watch.waiting() == 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert client.task_waits.waiting() == 2  # (the shared task still has a waiter)
    async with running_agent(coordinator):
        assert await staying == "shared"
        assert await elsewhere == "other"
    assert client.task_waits.opened == 1


async def test_a_stream_is_opened_anew_after_its_session_and_the_waits_go_on(
    coordinator: Coordinator, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_waits, "SESSION_S", 0.05)
    handle = await client.submit_task("worker", {"return": "late"}, scope="repo:a")
    waiting = asyncio.create_task(handle.result(timeout=WAIT_S))
    await _until(lambda: client.task_waits.opened >= 4)
    assert not waiting.done()
    async with running_agent(coordinator):
        assert await waiting == "late"
    assert client.task_waits.fallback is None
    assert await _answered(coordinator, WAIT_TASK) == 0
    await _until(lambda: _scheduler(coordinator).watch.waiting() == 0)


async def test_a_wait_open_when_its_client_closes_raises_unreachable(
    coordinator: Coordinator,
) -> None:
    async with Client(str(coordinator.grpc_address), agent_id="app") as client:
        handle = await client.submit_task("worker", {"return": 1}, scope="repo:a")
        waiting = asyncio.create_task(handle.result())
        await _until(lambda: _scheduler(coordinator).watch.waiting() == 1)
    with pytest.raises(CoordinatorUnreachableError):
        await waiting
    await _until(lambda: _scheduler(coordinator).watch.waiting() == 0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_stream_is_opened_again_after_the_coordinator_restarts_elsewhere(
    tmp_path: Path,
) -> None:
    """The client knows two addresses; the coordinator stops with five handles waiting and
    starts again (same store) at the second: the stream is opened there, names the five
    again, and their ends reach them."""
    second = _free_port()

    def config(port: int) -> ServerConfig:
        return ServerConfig(
            data_dir=tmp_path / "data",
            grpc=Address("127.0.0.1", port),
            http=Address("127.0.0.1", 0),
        )

    async with AsyncExitStack() as first:
        coordinator = await first.enter_async_context(open_coordinator(config(0)))
        await _register(coordinator)
        addresses = f"{coordinator.grpc_address},127.0.0.1:{second}"
        async with Client(addresses, agent_id="app") as client:
            handles = [
                await client.submit_task("worker", {"return": n}, scope="repo:a") for n in range(5)
            ]
            waits = [asyncio.create_task(h.result(timeout=WAIT_S)) for h in handles]
            await _until(lambda: _scheduler(coordinator).watch.waiting() == 5)
            await first.aclose()
            async with open_coordinator(config(second)) as again:
                async with running_agent(again):
                    # Ended on the coordinator that came back: each end reaches its waiter,
                    # whether the stream was open again before or after it.
                    assert await asyncio.gather(*waits) == list(range(5))
                assert await _answered(again, WAIT_TASK) == 0
                assert client.task_waits.opened >= 2
                assert client.task_waits.fallback is None
                await client.close()  # (its stream would hold the shutdown's grace period)


async def test_waits_go_to_wait_task_where_the_stream_is_not_served(
    coordinator: Coordinator, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older coordinator (or a replica that does not lead) answers unimplemented: every
    wait is then WaitTask's, as before."""
    scheduler = _scheduler(coordinator)

    def unserved(*_args: Any) -> Any:
        raise UnimplementedError("FollowTasks is not served here")

    monkeypatch.setattr(scheduler.watch, "follower", unserved)
    handles = [await client.submit_task("worker", {"return": n}, scope="repo:a") for n in range(3)]
    async with running_agent(coordinator):
        values = await asyncio.gather(*(h.result(timeout=WAIT_S) for h in handles))
    assert values == [0, 1, 2]
    assert isinstance(client.task_waits.fallback, UnimplementedError)
    assert await _answered(coordinator, WAIT_TASK) >= 3
