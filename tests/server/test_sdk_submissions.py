"""`apiary.Client.submit_task` over real gRPC sockets: concurrent submissions share
SubmitTasks calls (counted by the coordinator's /metrics), each caller getting its own handle
or its own typed error; a coordinator without SubmitTasks (unimplemented) gets SubmitTask
calls from then on; one that allows fewer items to a call gets them in more calls."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from apiary.core.limits import Limits
from apiary.errors import NotFoundError, TaskIdConflictError, UnimplementedError
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.task_handle import TaskHandle
from apiary.sdk.task_submits import CALL_BYTES
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator, register_agent
from apiary.server.services.scheduler import TaskQueryHandler
from apiary.wire import pb

SUBMIT_TASKS = "/apiary.v1.TaskQueryService/SubmitTasks"
SUBMIT_TASK = "/apiary.v1.TaskQueryService/SubmitTask"
N = 20


async def _calls(coordinator: Coordinator) -> dict[tuple[str, str], float]:
    """RPCs answered by (method, code), from /metrics."""
    url = f"http://{coordinator.http_address}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as answer:
        text = await answer.text()
    counted: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("apiary_rpc_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            counted[labels["method"], labels["code"]] = float(line.rsplit(" ", 1)[1])
    return counted


async def _register(coordinator: Coordinator) -> None:
    await register_agent(coordinator, "idle")


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        await _register(running)
        yield running


async def _submit_many(client: Client, ids: list[str]) -> list[TaskHandle | BaseException]:
    return await asyncio.gather(
        *(client.submit_task("idle", {"id": i}, scope=f"repo:{i}", task_id=i) for i in ids),
        return_exceptions=True,
    )


async def test_concurrent_submissions_share_a_call_and_get_their_own_answers(
    coordinator: Coordinator,
) -> None:
    async with Client(str(coordinator.grpc_address)) as client:
        await client.submit_task("idle", {"id": "x-0"}, scope="repo:x-0", task_id="x-0")
        ids = [f"t-{n}" for n in range(N)]
        answers = await _submit_many(client, ids)
        assert [h.task_id for h in answers if isinstance(h, TaskHandle)] == ids
        assert client.task_submissions.calls == 2
        # Each caller gets its own error; the others in the same call their tasks.
        mixed = await asyncio.gather(
            client.submit_task("idle", {"id": "other"}, scope="repo:t-1", task_id="t-1"),
            client.submit_task("nobody", {"id": "u-1"}, scope="repo:u-1", task_id="u-1"),
            client.submit_task("idle", {"id": "t-2"}, scope="repo:t-2", task_id="t-2"),
            client.submit_task("idle", {"id": "u-2"}, scope="repo:u-2"),
            return_exceptions=True,
        )
        conflict, unknown, again, assigned = mixed
        assert isinstance(conflict, TaskIdConflictError)
        assert conflict.details["differs"] == "params"
        assert isinstance(unknown, NotFoundError)
        assert isinstance(again, TaskHandle) and (again.task_id, again.created) == ("t-2", False)
        assert isinstance(assigned, TaskHandle) and assigned.created
        assert (await assigned.status()).state == "QUEUED"
        assert client.task_submissions.calls == 3 and client.task_submissions.fallback is None
    calls = await _calls(coordinator)
    assert calls[SUBMIT_TASKS, "ok"] == 3
    assert (SUBMIT_TASK, "ok") not in calls


async def test_a_coordinator_without_submit_tasks_gets_submit_task_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an older coordinator: SubmitTasks answers unimplemented; the submissions of that
    call, and every one after it, go on SubmitTask."""
    monkeypatch.delattr(TaskQueryHandler, "submit_tasks")
    async with open_test_coordinator(tmp_path) as coordinator:
        await _register(coordinator)
        async with Client(str(coordinator.grpc_address)) as client:
            first = await _submit_many(client, ["f-1", "f-2", "f-3"])
            assert [h.task_id for h in first if isinstance(h, TaskHandle)] == ["f-1", "f-2", "f-3"]
            assert isinstance(client.task_submissions.fallback, UnimplementedError)
            later = await _submit_many(client, ["f-1", "f-4"])
            assert [(h.task_id, h.created) for h in later if isinstance(h, TaskHandle)] == [
                ("f-1", False), ("f-4", True),
            ]  # fmt: skip
            with pytest.raises(TaskIdConflictError):
                await client.submit_task("idle", {"id": "f-9"}, scope="repo:f-1", task_id="f-1")
        calls = await _calls(coordinator)
    assert calls[SUBMIT_TASKS, "unimplemented"] == 1
    assert calls[SUBMIT_TASK, "ok"] == 5
    assert calls[SUBMIT_TASK, "task_id_conflict"] == 1


async def test_a_coordinator_allowing_fewer_items_gets_them_in_more_calls(
    tmp_path: Path,
) -> None:
    async with open_test_coordinator(tmp_path, limits=Limits(submit_tasks=2)) as coordinator:
        await _register(coordinator)
        async with Client(str(coordinator.grpc_address)) as client:
            ids = [f"l-{n}" for n in range(5)]
            answers = await _submit_many(client, ids)
            assert [h.task_id for h in answers if isinstance(h, TaskHandle)] == ids
        calls = await _calls(coordinator)
    assert calls[SUBMIT_TASKS, "validation_error"] == 1  # (then it sends 2 to a call)
    assert calls[SUBMIT_TASKS, "ok"] == 3


async def test_a_caller_cancelled_before_its_call_leaves_submits_nothing(
    coordinator: Coordinator,
) -> None:
    async with Client(str(coordinator.grpc_address)) as client:
        first = asyncio.ensure_future(
            client.submit_task("idle", {"id": "c-1"}, scope="repo:c-1", task_id="c-1")
        )
        second = asyncio.ensure_future(
            client.submit_task("idle", {"id": "c-2"}, scope="repo:c-2", task_id="c-2")
        )
        await asyncio.sleep(0)  # both queued; the first call not yet sent
        second.cancel()
        assert (await first).task_id == "c-1"
        with pytest.raises(asyncio.CancelledError):
            await second
    assert coordinator.scheduler is not None
    assert [t.task_id for t in await coordinator.scheduler.list_tasks(None, None, -1, 10)] == [
        "c-1"
    ]


async def test_a_call_carries_at_most_its_bytes_and_answers_tasks_without_results(
    coordinator: Coordinator,
) -> None:
    """Submissions too large to go together go in several calls; a task given again is
    answered without its result (its size only)."""
    async with Client(str(coordinator.grpc_address)) as client:
        blob = "x" * (CALL_BYTES // 3)
        big = await asyncio.gather(
            *(
                client.submit_task("idle", {"blob": blob, "n": n}, scope=f"repo:b{n}")
                for n in range(5)
            )
        )
        assert all(h.created for h in big)
        assert client.task_submissions.calls == 2 + 1  # (2, 2, 1)

    # A task given again, ended with a result: answered with its result's size only.
    async def answer(task: TaskContext) -> object:
        return {"answer": task.json()["n"]}

    async with (
        Client(str(coordinator.grpc_address)) as client,
        Agent("worker", coordinator=str(coordinator.grpc_address)) as agent,
    ):
        job = asyncio.create_task(TaskRunner(agent, answer).run())
        try:
            first = await client.submit_task("worker", {"n": 42}, scope="repo:w", task_id="w-1")
            assert await first.result(timeout=30) == {"answer": 42}
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
        again = pb.apiary_pb2.SubmitTaskRequest(
            agent_id="worker", task_id="w-1", params=b'{"n": 42}',
            content_type="application/json", scope="repo:w",
        )  # fmt: skip
        reply = await client.task_query.SubmitTasks(pb.apiary_pb2.SubmitTasksRequest(items=[again]))
        view = reply.outcomes[0].submitted.task
        assert (view.state, view.result_json, view.result_size) == ("COMPLETED", "", 13)
        assert (
            await client.task_query.GetTask(pb.apiary_pb2.GetTaskRequest(task_id="w-1"))
        ).result_json == '{"answer":42}'


async def test_a_closed_channel_fails_the_submission_as_a_call_on_it_would(
    coordinator: Coordinator,
) -> None:
    channel = grpc.aio.insecure_channel(str(coordinator.grpc_address))
    client = Client(channel)
    await channel.close()
    with pytest.raises(grpc.aio.UsageError):
        await client.submit_task("idle", {"n": 1}, scope="repo:closed")
    await client.close()
    with pytest.raises(grpc.aio.UsageError):  # after close, alone, as SubmitTask did
        await client.submit_task("idle", {"n": 2}, scope="repo:closed")
