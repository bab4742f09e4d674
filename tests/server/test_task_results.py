"""Results back to the submitter over real gRPC sockets, with a real coordinator and SDK
agents (asyncio tasks of the test): `apiary.Client.submit_task` returns a handle whose
`result()` is what the agent returned (in its ACK's note, or through CompleteTask when
larger), failures come back as TaskFailedError with the agent's code and message, an
oversize result fails its task, WaitTask answers at its timeout or the call's deadline,
WatchTasks streams the submitter's tasks, task ids are idempotency keys (and assigned when
missing), and a held duplicate is visible as HELD with its reason everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

import apiary
from apiary.core.ids import is_uuid4
from apiary.core.limits import Limits
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.settings import SchedulerSettings
from apiary.errors import (
    DeadlineExceededError,
    DuplicateDetectedError,
    OversizePayloadError,
    TaskIdConflictError,
    ValidationError,
)
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.errors import TaskFailedError, TaskHeldError, TaskTimeoutError
from apiary.sdk.tasks import Handler, TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator, register_agent
from apiary.wire import pb
from apiary.wire.errordetail import error_from_trailers

WAIT_S = 20.0
RESULT_LIMIT = 64 * 1024
TOKEN = "results-operator-token"
HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
a = pb.apiary_pb2
s = pb.scheduler_pb2


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    limits = Limits(task_result_bytes=RESULT_LIMIT)
    async with open_test_coordinator(tmp_path, limits=limits) as running:
        await register_agent(running, "idle")
        yield running


@pytest.fixture
async def client(coordinator: Coordinator) -> AsyncIterator[Client]:
    async with Client(str(coordinator.grpc_address), agent_id="app") as c:
        yield c


async def handler(task: TaskContext) -> Any:
    """Returns what the params ask for: `return` (a value), `size` (a string that long), or
    fails with `fail` (a code) and `message`."""
    asked = task.json()
    if "fail" in asked:
        raise TaskFailedError(asked.get("message", ""), error_code=asked["fail"])
    if "invalid" in asked:
        raise ValidationError.for_field("params", asked["invalid"])
    if "size" in asked:
        return {"blob": "x" * asked["size"]}
    return asked.get("return")


@asynccontextmanager
async def running_agent(
    coordinator: Coordinator, agent_id: str = "worker", work: Handler = handler
) -> AsyncIterator[TaskRunner]:
    async with Agent(agent_id, coordinator=str(coordinator.grpc_address)) as agent:
        runner = TaskRunner(agent, work)
        job = asyncio.create_task(runner.run())
        try:
            yield runner
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


# --- results and failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"fixed": [1, 2, 3], "by": "worker"}, "all done", "42", " ", 7.5, [], None],
    ids=["object", "text", "json-looking-text", "blank-text", "number", "array", "none"],
)
async def test_the_handle_gives_back_what_the_agent_returned(
    coordinator: Coordinator, client: Client, value: Any
) -> None:
    async with running_agent(coordinator):
        handle = await client.submit_task("worker", {"return": value}, scope="repo:a")
        assert handle.created and is_uuid4(handle.task_id)
        assert await handle.result(timeout=WAIT_S) == value
    status = await handle.status()
    assert (status.state, status.done, status.submitter) == ("COMPLETED", True, "app")


async def test_a_result_too_large_for_an_ack_comes_through_complete_task(
    coordinator: Coordinator, client: Client
) -> None:
    async with running_agent(coordinator):
        handle = await client.submit_task("worker", {"size": 40_000}, scope="repo:a")
        assert await handle.result(timeout=WAIT_S) == {"blob": "x" * 40_000}
    view = await client.task_query.GetTask(a.GetTaskRequest(task_id=handle.task_id))
    assert json.loads(view.result_json) == {"blob": "x" * 40_000}
    assert view.result_size == len(view.result_json)
    # ListTasks gives the result's size, never the result itself.
    (listed,) = (await client.task_query.ListTasks(a.ListTasksRequest())).tasks
    assert (listed.result_json, listed.result_size) == ("", view.result_size)


async def test_a_result_past_the_limit_fails_the_task_and_the_agent_goes_on(
    coordinator: Coordinator, client: Client
) -> None:
    async with running_agent(coordinator):
        big = await client.submit_task("worker", {"size": RESULT_LIMIT}, scope="repo:a")
        with pytest.raises(TaskFailedError) as caught:
            await big.result(timeout=WAIT_S)
        assert caught.value.error_code == "oversize_payload"
        assert f"{RESULT_LIMIT}-byte limit ([limits] task_result_bytes)" in caught.value.message
        assert caught.value.task_id == big.task_id
        # Not in limbo: the task ended, and the agent takes the next one.
        nxt = await client.submit_task("worker", {"return": 1}, scope="repo:b")
        assert await nxt.result(timeout=WAIT_S) == 1
    assert (await big.status()).state == "FAILED"


async def test_complete_task_refuses_an_oversize_result_with_oversize_payload(
    coordinator: Coordinator, client: Client
) -> None:
    """What a non-SDK agent sees: the call answers oversize_payload, and the task failed."""
    handle = await client.submit_task("idle", {}, scope="repo:a")
    assert coordinator.scheduler is not None
    await coordinator.scheduler.agent_ready("idle")  # dispatched to it (no stream needed)
    await _reached(handle, "DISPATCHED")
    request = a.CompleteTaskRequest(
        task_id=handle.task_id, agent_id="idle", result_json=json.dumps("y" * RESULT_LIMIT)
    )
    with pytest.raises(OversizePayloadError) as caught:
        await client.task_query.CompleteTask(request)
    assert caught.value.details["field"] == "result_json"
    status = await handle.status()
    assert (status.state, status.error_code) == ("FAILED", "oversize_payload")


async def _reached(handle: apiary.TaskHandle, state: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if (await handle.status()).state == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{handle.task_id} never reached {state}")


async def test_failures_come_back_typed_with_the_agents_code_and_message(
    coordinator: Coordinator, client: Client
) -> None:
    long = "the input had no rows; " * 400  # past an ACK's 4 KB: through CompleteTask
    cases = [
        ({"fail": "empty_input", "message": "no rows"}, "empty_input", "no rows"),
        ({"fail": "empty_input", "message": long}, "empty_input", long),
        ({"invalid": "must name a file"}, "validation_error", "params: must name a file"),
    ]
    async with running_agent(coordinator):
        for i, (params, code, message) in enumerate(cases):
            handle = await client.submit_task("worker", params, scope=f"repo:{i}")
            with pytest.raises(TaskFailedError) as caught:
                await handle.result(timeout=WAIT_S)
            assert (caught.value.error_code, caught.value.message) == (code, message)
            assert str(caught.value).startswith(f"task {handle.task_id} failed: {code}: ")


# --- waiting -----------------------------------------------------------------------------------


async def test_wait_task_answers_the_state_at_its_timeout_or_deadline(
    coordinator: Coordinator, client: Client
) -> None:
    handle = await client.submit_task("idle", {}, scope="repo:a")  # idle never runs it
    queued = await client.task_query.WaitTask(
        a.WaitTaskRequest(task_id=handle.task_id, timeout_ms=50)
    )
    assert (queued.task_id, queued.state) == (handle.task_id, "QUEUED")
    # No timeout_ms: the call's own deadline bounds the wait, and it answers, not fails.
    at_deadline = await client.task_query.WaitTask(
        a.WaitTaskRequest(task_id=handle.task_id), timeout=0.5
    )
    assert at_deadline.state == "QUEUED"
    with pytest.raises(TaskTimeoutError) as caught:
        await handle.result(timeout=0.05)
    assert (caught.value.state, caught.value.task_id) == ("QUEUED", handle.task_id)
    assert isinstance(caught.value, DeadlineExceededError)
    assert not isinstance(caught.value, TaskHeldError)
    assert (await handle.wait(timeout=0.05)).state == "QUEUED"
    with pytest.raises(apiary.errors.NotFoundError):
        await client.task_query.WaitTask(a.WaitTaskRequest(task_id="nope", timeout_ms=1))
    with pytest.raises(ValidationError):
        await client.task_query.WaitTask(a.WaitTaskRequest(timeout_ms=1))


async def test_watch_tasks_streams_the_submitters_tasks_as_they_change(
    coordinator: Coordinator, client: Client
) -> None:
    waiting = await client.submit_task("idle", {}, scope="repo:w")
    seen: list[tuple[str, str, str]] = []

    async def watch() -> None:
        async for view in client.task_query.WatchTasks(a.WatchTasksRequest()):
            seen.append((view.task_id, view.state, view.result_json))

    watcher = asyncio.ensure_future(watch())
    try:
        await _seen(seen, (waiting.task_id, "QUEUED", ""))
        async with running_agent(coordinator):
            handle = await client.submit_task("worker", {"return": {"n": 1}}, scope="repo:a")
            await _seen(seen, (handle.task_id, "COMPLETED", '{"n":1}'))
        # Another submitter's task is not in the caller's stream.
        async with Client(str(coordinator.grpc_address), agent_id="other-app") as other:
            theirs = await other.submit_task("idle", {"x": 1}, scope="repo:o")
        mine = await client.submit_task("idle", {"x": 2}, scope="repo:m")
        await _seen(seen, (mine.task_id, "QUEUED", ""))
        assert theirs.task_id not in {task_id for task_id, _, _ in seen}
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    # Named tasks: each as it stands, then the stream ends once every one has ended.
    request = a.WatchTasksRequest(task_ids=[handle.task_id])
    views = [v async for v in client.task_query.WatchTasks(request)]
    assert [(v.task_id, v.state) for v in views] == [(handle.task_id, "COMPLETED")]


async def _seen(seen: list[tuple[str, str, str]], wanted: tuple[str, str, str]) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if wanted in seen:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{wanted} not among {seen}")


# --- task ids ----------------------------------------------------------------------------------


async def test_a_task_id_is_an_idempotency_key(coordinator: Coordinator, client: Client) -> None:
    async with running_agent(coordinator):
        first = await client.submit_task("worker", {"return": 5}, scope="repo:a", task_id="t-1")
        assert await first.result(timeout=WAIT_S) == 5
        again = await client.submit_task("worker", {"return": 5}, scope="repo:a", task_id="t-1")
        assert (again.task_id, again.created) == ("t-1", False)
        assert again.reason.startswith("already submitted, COMPLETED")
        assert await again.result(timeout=WAIT_S) == 5
    with pytest.raises(TaskIdConflictError) as caught:
        await client.submit_task("worker", {"return": 6}, scope="repo:a", task_id="t-1")
    assert (caught.value.code, caught.value.details["field"]) == ("task_id_conflict", "task_id")
    assert caught.value.details["differs"] == "params"
    # The canonical SubmitTask follows the same rule.
    params = json.dumps({"return": 5}).encode()
    same = s.SubmitTaskRequest(
        agent_id="worker", task_id="t-1", params=params, content_type="application/json",
        scope="repo:a",
    )  # fmt: skip
    canonical = await client.scheduler.SubmitTask(same, metadata=(("apiary-submitter", "app"),))
    assert canonical.accepted and canonical.reason.startswith("already submitted")
    stub = pb.scheduler_pb2_grpc.SchedulerServiceStub(client.channel)
    other = s.SubmitTaskRequest(agent_id="worker", task_id="t-1", scope="repo:b")
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.SubmitTask(other)
    assert raw.value.code() is grpc.StatusCode.ALREADY_EXISTS
    found = error_from_trailers(raw.value.trailing_metadata() or ())
    assert found is not None and found.code == "task_id_conflict"
    assert len((await client.task_query.ListTasks(a.ListTasksRequest())).tasks) == 1


async def test_a_task_without_an_id_gets_one(coordinator: Coordinator, client: Client) -> None:
    handle = await client.submit_task("idle", {"n": 1}, scope="repo:a")
    assert is_uuid4(handle.task_id) and handle.submitted is not None
    assert handle.submitted.state == "QUEUED"
    request = s.SubmitTaskRequest(agent_id="idle", scope="repo:b", params=b"{}")
    reply = await client.scheduler.SubmitTask(request)
    assert reply.accepted
    assigned = reply.reason.split()[1].rstrip(":")
    assert reply.reason.startswith("task ") and is_uuid4(assigned)
    view = await client.task_query.GetTask(a.GetTaskRequest(task_id=assigned))
    assert (view.agent_id, view.scope) == ("idle", "repo:b")


# --- held duplicates ---------------------------------------------------------------------------


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", *args, "--grpc", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in {**os.environ, "COLUMNS": "250"}.items() if k != "APIARY_TOKEN"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


@pytest.fixture
async def with_hitl(tmp_path: Path) -> AsyncIterator[Coordinator]:
    """A coordinator with a HITL operator, so that a duplicate job waits for a decision."""
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        await register_agent(running, "idle")
        yield running


async def test_a_held_duplicate_is_visible_as_held_with_its_reason(
    with_hitl: Coordinator,
) -> None:
    coordinator = with_hitl
    async with Client(str(coordinator.grpc_address), agent_id="app") as client:
        operator = Client(client.channel, metadata={"authorization": f"Bearer {TOKEN}"})
        await _held_everywhere(coordinator, client, operator)


async def _held_everywhere(coordinator: Coordinator, client: Client, operator: Client) -> None:
    first = await client.submit_task("idle", {"job": 1}, scope="repo:a")
    held = await client.submit_task("idle", {"job": 1}, scope="repo:a")
    assert held.created and held.submitted is not None and held.submitted.held
    status = await held.status()
    assert coordinator.hitl is not None
    (invocation,) = await coordinator.hitl.list()
    assert (status.state, status.held, status.done) == ("HELD", True, False)
    assert status.reason == (
        f"held for HITL authorization (invocation {invocation.invocation_id}): duplicate job, "
        f"same job as task {first.task_id} (QUEUED)"
    )
    with pytest.raises(TaskHeldError) as caught:
        await held.result(timeout=0.05)
    assert (caught.value.state, caught.value.reason) == ("HELD", status.reason)
    # The console's task data (the gateway's GetTask, ListTasks) shows it held and why.
    async with aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http:
        path = "/v1/apiary.v1.TaskQueryService/GetTask"
        async with http.post(path, json={"task_id": held.task_id}) as response:
            shown = await response.json()
        # The gateway serves the new methods as any other: WaitTask answers at its timeout.
        wait = "/v1/apiary.v1.TaskQueryService/WaitTask"
        async with http.post(wait, json={"task_id": held.task_id, "timeout_ms": 20}) as response:
            waited = await response.json()
    assert (shown["state"], shown["note"], shown["submitter"]) == ("HELD", status.reason, "app")
    assert (waited["task_id"], waited["state"]) == (held.task_id, "HELD")
    out, _ = await _cli(coordinator, "task", "list", "--state", "HELD", "--json")
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert (listed["task_id"], listed["state"], listed["note"]) == (
        held.task_id, "HELD", status.reason,
    )  # fmt: skip
    table, _ = await _cli(coordinator, "task", "list")
    assert "HELD" in table and "held for HITL" in table
    line, _ = await _cli(coordinator, "task", "status", held.task_id)
    assert line.strip() == f"{held.task_id} HELD: {status.reason}"
    # Cancelled while held (by an operator: the configuration has some): the submitter's
    # handle says how it ended.
    assert (await operator.task(held.task_id).cancel("not needed")).state == "FAILED"
    with pytest.raises(TaskFailedError) as failed:
        await held.result(timeout=WAIT_S)
    assert failed.value.error_code == "cancelled" and "not needed" in failed.value.message


async def test_the_submitter_cancels_its_task_through_its_handle(
    coordinator: Coordinator, client: Client
) -> None:
    handle = await client.submit_task("idle", {}, scope="repo:a")
    cancelled = await handle.cancel("changed my mind")
    assert (cancelled.state, cancelled.error_code) == ("FAILED", "cancelled")
    with pytest.raises(TaskFailedError) as failed:
        await handle.result(timeout=WAIT_S)
    assert failed.value.error_code == "cancelled" and "changed my mind" in failed.value.message
    with pytest.raises(apiary.errors.AlreadyCompletedError):
        await handle.cancel()


async def test_a_rejected_duplicate_is_an_error(tmp_path: Path) -> None:
    settings = SchedulerSettings(duplicate_jobs="reject")
    async with (
        open_test_coordinator(tmp_path, scheduler_settings=settings) as coordinator,
        Client(str(coordinator.grpc_address)) as client,
    ):
        await coordinator.registry.register({
            "agent_id": "idle", "name": "idle", "reasoning_connectors": ["builtin://rules"],
        })  # fmt: skip
        first = await client.submit_task("idle", {"job": 1}, scope="repo:a")
        with pytest.raises(DuplicateDetectedError) as caught:
            await client.submit_task("idle", {"job": 1}, scope="repo:a")
        assert f"same job as task {first.task_id}" in caught.value.message


# --- the command line ----------------------------------------------------------------------------


async def test_task_submit_wait_prints_the_result(coordinator: Coordinator) -> None:
    async with running_agent(coordinator):
        out, err = await _cli(
            coordinator, "task", "submit", "worker", "--scope", "repo:a", "--id", "t-9",
            "--params", '{"return": {"lines": 3}}', "--wait", "--timeout", "30",
        )  # fmt: skip
        assert json.loads(out) == {"lines": 3}
        assert err.startswith("task t-9: ")
        again, _ = await _cli(coordinator, "task", "wait", "t-9")
        assert json.loads(again) == {"lines": 3}
        _, failed = await _cli(
            coordinator, "task", "submit", "worker", "--scope", "repo:b", "--wait",
            "--params", '{"fail": "empty_input", "message": "no rows"}', code=1,
        )  # fmt: skip
        assert failed.strip().endswith("failed: empty_input: no rows")
    _, late = await _cli(
        coordinator, "task", "submit", "idle", "--scope", "repo:c", "--wait", "--timeout", "0.1",
        code=1,
    )  # fmt: skip
    assert "still QUEUED after 0.1 s" in late
