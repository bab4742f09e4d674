"""The control plane's job commands against a real coordinator (HTTP sockets, an SDK agent
over gRPC): a job is a batch of agent tasks whose statuses are their own, while the job's is
derived from them; a retried item writes its one output; cancel_job records the intent
first, cancels the items not ended and keeps the completed ones; job_id and idempotency
keys keep a command's first effect; a job is its owner's. Every event and answer the tests
see is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.errors import NotFoundError
from apiary.sdk.agent import Agent
from apiary.sdk.runtime import RuntimeClient
from apiary.sdk.tasks import TaskRunner
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import WAIT_S, RuntimeHttp, session_events
from tests.server.test_runtime_tasks import AGENT, Worker

OFFLINE = "offline"
"""A registered agent that never takes its tasks: its items stay queued."""


@pytest.fixture
async def worker(coordinator: Coordinator) -> AsyncIterator[Worker]:
    found = Worker()
    async with Agent(AGENT, coordinator=str(coordinator.grpc_address)) as agent:
        job = asyncio.create_task(TaskRunner(agent, found.handle).run())
        try:
            yield found
        finally:
            found.release.set()
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


async def _offline(coordinator: Coordinator) -> None:
    await coordinator.registry.register(
        {"agent_id": OFFLINE, "name": OFFLINE, "reasoning_connectors": ["builtin://rules"]}
    )


async def _job(runtime: RuntimeHttp, job_id: str, *status: str) -> dict[str, Any]:
    doc = await runtime.until("get_job", lambda d: d["job"]["status"] in status, job_id=job_id)
    return dict(doc["job"])


def _job_events(events: list[dict[str, Any]], job_id: str) -> list[tuple[str, str]]:
    """(type, item or job status) of the job's events, in order."""
    return [
        (e["type"], e.get("jobItemId", "")) for e in events
        if e.get("jobId") == job_id and e["type"].startswith("job.")
    ]  # fmt: skip


@pytest.mark.conformance("runtime.job.status-distinct", "runtime.job.retry-no-duplicate")
async def test_a_jobs_status_derives_from_its_items_and_a_retried_item_writes_one_output(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    made = await runtime.ok(
        "create_job", job_id="batch-1", agent_id=AGENT, title="Fix the bugs",
        items=[{"task_id": "i-a", "input": {"mode": "answer"}},
               {"task_id": "i-b", "input": {"mode": "fail"}},
               {"task_id": "i-c", "input": {"mode": "answer"}, "title": "third"}],
    )  # fmt: skip
    assert made["created"] is True and made["job"]["itemCount"] == 3
    session_id = made["sessionId"]
    partial = await _job(runtime, "batch-1", "partial")
    # The job's status is its own; each item keeps its task's.
    assert {i["taskId"]: i["status"] for i in partial["items"]} == {
        "i-a": "completed", "i-b": "failed", "i-c": "completed",
    }  # fmt: skip
    assert partial["itemCounts"] == {"completed": 2, "failed": 1}
    outputs = {i["taskId"]: i.get("output") for i in partial["items"]}
    assert outputs == {"i-a": {"done": "i-a", "attempt": 1}, "i-b": None,
                       "i-c": {"done": "i-c", "attempt": 1}}  # fmt: skip
    failed_item = next(i for i in partial["items"] if i["taskId"] == "i-b")
    assert failed_item["lastError"]["code"] == "tool_failed"
    item = (await runtime.ok("get_task", task_id="i-c"))["task"]
    assert item["title"] == "third" and item["taskKind"] == "job_item"
    assert item["jobId"] == "batch-1"
    # A completed item is not run again: its output stays the one it wrote.
    error = await runtime.error(409, "retry_task", task_id="i-a")
    assert error["code"] == "already_completed"
    # The failed item is retried: a new attempt of the same task, its one output.
    await runtime.ok("update_task", task_id="i-b", input={"mode": "answer"})
    await runtime.ok("retry_task", task_id="i-b")
    done = await _job(runtime, "batch-1", "completed")
    retried = next(i for i in done["items"] if i["taskId"] == "i-b")
    assert retried["output"] == {"done": "i-b", "attempt": 2} and retried["attemptCount"] == 2
    assert [i["attemptCount"] for i in done["items"]] == [1, 2, 1]
    assert len(worker.runs) == 4  # three first runs and one retry, no second run of a, c
    events = await session_events(coordinator, session_id)
    mine = _job_events(events, "batch-1")
    kinds = [kind for kind, _ in mine]
    assert kinds[0] == "job.created" and kinds.count("job.started") == 1
    assert kinds.count("job.item.completed") == 3 and kinds.count("job.item.failed") == 1
    assert kinds.index("job.failed") < kinds.index("job.completed") == len(kinds) - 1
    assert [item for kind, item in mine if kind == "job.item.completed"].count("i-b") == 1
    completed = [e for e in events if e["type"] == "task.completed" and e["taskId"] == "i-b"]
    assert len(completed) == 1  # one output written for the retried item
    # The item's events come before the job's they lead to.
    ended = [k for k, _ in mine if k in ("job.item.failed", "job.failed")]
    assert ended == ["job.item.failed", "job.failed"]
    snapshot = (await runtime.ok("get_session", session_id=session_id))["snapshot"]
    jobs = snapshot["subagentJobSummary"]
    assert [j["jobId"] for j in jobs["jobs"]] == ["batch-1"] and jobs["jobCounts"] == {
        "completed": 1
    }


@pytest.mark.conformance("runtime.job.cancel-keeps-completed", "runtime.task.cancel-intent-first")
async def test_cancel_records_the_intent_then_cancels_the_items_not_ended_keeping_completed(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    await _offline(coordinator)
    made = await runtime.ok(
        "create_job", job_id="batch-2", agent_id=AGENT,
        items=[{"task_id": "done", "input": {"mode": "answer"}},
               {"task_id": "busy", "input": {"mode": "loop"}},
               {"task_id": "waiting", "agent_id": OFFLINE}],
    )  # fmt: skip
    session_id = made["sessionId"]
    await worker.running("busy")
    await runtime.until("get_task", lambda d: d["task"]["status"] == "completed", task_id="done")
    # Running from the coordinator's side once the handler's READ (sent lazily) is taken.
    await runtime.until("get_task", lambda d: d["task"]["status"] == "running", task_id="busy")
    running = await _job(runtime, "batch-2", "running")
    assert running["itemCounts"] == {"completed": 1, "queued": 1, "running": 1}
    answer = await runtime.ok("cancel_job", job_id="batch-2", reason="enough")
    assert answer["cancel"] in ("requested", "cancelled")
    assert answer["job"]["intent"] == {"kind": "cancel", "reason": "enough"}
    cancelled = await _job(runtime, "batch-2", "cancelled")
    statuses = {i["taskId"]: i["status"] for i in cancelled["items"]}
    assert statuses == {"done": "completed", "busy": "cancelled", "waiting": "cancelled"}
    kept = next(i for i in cancelled["items"] if i["taskId"] == "done")
    assert kept["output"] == {"done": "done", "attempt": 1}
    events = await session_events(coordinator, session_id)
    order = [(e["type"], e.get("taskId", "")) for e in events]
    intent = next(
        n for n, e in enumerate(events)
        if e["type"] == "job.progress" and (e.get("payload") or {}).get("intent") == "cancel"
    )  # fmt: skip
    assert intent < order.index(("task.cancel_requested", "busy"))
    assert order.index(("task.cancelled", "busy")) < order.index(("job.cancelled", ""))
    assert ("task.cancel_requested", "done") not in order
    assert [t for t, _ in order].count("job.cancelled") == 1
    # A cancelled job's items are not run again; cancelling again answers the job.
    error = await runtime.error(409, "retry_task", task_id="busy")
    assert error["code"] == "already_completed" and error["details"]["job_id"] == "batch-2"
    again = await runtime.ok("cancel_job", job_id="batch-2")
    assert again["cancel"] == "cancelled" and again["status"] == "cancelled"


async def test_a_job_id_answers_the_same_job_and_a_job_is_its_owners(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _offline(coordinator)
    items = [{"task_id": "k-1"}, {"task_id": "k-2"}]
    first = await runtime.ok("create_job", job_id="keyed", agent_id=OFFLINE, items=items)
    assert first["created"] is True and first["status"] == "queued"
    again = await runtime.ok("create_job", job_id="keyed", agent_id=OFFLINE, items=items)
    assert again["created"] is False and again["replayed"] is True
    assert again["job"]["items"] == first["job"]["items"]
    other = await runtime.error(409, "create_job", job_id="keyed", agent_id=OFFLINE,
                                items=[{"task_id": "k-3"}])  # fmt: skip
    assert other["code"] == "already_exists" and other["details"]["field"] == "job_id"
    taken = await runtime.error(409, "create_job", agent_id=OFFLINE, items=[{"task_id": "k-1"}])
    assert taken["details"]["field"] == "items[0].task_id"
    # cancel_job's idempotency key keeps its first answer; reused for another request it
    # is refused.
    await runtime.ok("create_job", job_id="other", agent_id=OFFLINE, items=[{}])
    cancel = await runtime.ok("cancel_job", job_id="keyed", idempotency_key="c-1")
    assert cancel["status"] == "cancelled" and cancel["cancel"] == "cancelled"
    replay = await runtime.ok("cancel_job", job_id="keyed", idempotency_key="c-1")
    assert replay["replayed"] is True and replay["jobId"] == "keyed"
    reused = await runtime.error(409, "cancel_job", job_id="other", idempotency_key="c-1")
    assert reused["details"]["field"] == "idempotency_key"
    # Another principal is answered as if there were no job; an operator with `tasks`
    # reads and cancels it.
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    stranger = Principal(PrincipalKind.APPLICATION, "stranger")
    for command, params in (("get_job", {"job_id": "other"}),
                            ("cancel_job", {"job_id": "other"})):  # fmt: skip
        with pytest.raises(NotFoundError) as refused:
            await COMMANDS[command](control, stranger, params)
        assert refused.value.details["field"] == "job_id"
    operator = Principal(PrincipalKind.OPERATOR, "ops", roles=frozenset({Role.TASKS}))
    seen = await COMMANDS["get_job"](control, operator, {"job_id": "other"})
    assert seen["job"]["status"] == "queued"
    ended = await COMMANDS["cancel_job"](control, operator, {"job_id": "other"})
    assert ended["status"] == "cancelled"


async def test_cancelling_a_parent_task_cancels_its_job(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _offline(coordinator)
    parent = await runtime.ok("create_task", task_id="lead", agent_id=OFFLINE)
    made = await runtime.ok(
        "create_job", job_id="under", session_id=parent["sessionId"], agent_id=OFFLINE,
        parent_task_id="lead", items=[{"task_id": "u-1"}, {"task_id": "u-2"}],
    )  # fmt: skip
    assert made["job"]["parentTaskId"] == "lead"
    await runtime.ok("cancel_task", task_id="lead")
    job = await _job(runtime, "under", "cancelled")
    assert [i["status"] for i in job["items"]] == ["cancelled", "cancelled"]
    assert job["intent"]["reason"] == "its parent task lead was cancelled"
    # `propagate: false` cancels the task alone: its job goes on.
    await runtime.ok("create_task", task_id="lone", agent_id=OFFLINE)
    await runtime.ok("create_job", job_id="kept", agent_id=OFFLINE, parent_task_id="lone",
                     items=[{}])  # fmt: skip
    await runtime.ok("cancel_task", task_id="lone", propagate=False)
    kept = (await runtime.ok("get_job", job_id="kept"))["job"]
    assert kept["status"] == "queued" and "intent" not in kept
    # An item cancelled on its own counts as not completed: the job fails.
    alone = await runtime.ok("create_job", agent_id=OFFLINE, items=[{"task_id": "solo"}])
    await runtime.ok("cancel_task", task_id="solo")
    failed = await _job(runtime, alone["jobId"], "failed")
    assert failed["itemCounts"] == {"cancelled": 1}


async def test_bad_parameters_name_the_field(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _offline(coordinator)
    cases: list[tuple[int, dict[str, Any], str]] = [
        (400, {"agent_id": OFFLINE}, "items"),
        (400, {"agent_id": OFFLINE, "items": []}, "items"),
        (400, {"agent_id": OFFLINE, "items": [1]}, "items[0]"),
        (400, {"agent_id": OFFLINE, "items": [{}, {"colour": "red"}]}, "items[1].colour"),
        (400, {"agent_id": OFFLINE, "items": [{"task_id": 7}]}, "items[0].task_id"),
        (400, {"items": [{}]}, "items[0].agent_id"),
        (400, {"agent_id": OFFLINE, "items": [{"agent_id": "a", "capability": "c"}]},
         "items[0].capability"),
        (400, {"agent_id": OFFLINE, "items": [{"task_id": "x"}, {"task_id": "x"}]}, "items"),
        (404, {"agent_id": OFFLINE, "items": [{}, {"agent_id": "nobody"}]}, "items[1].agent_id"),
        (404, {"agent_id": "nobody", "items": [{}]}, "agent_id"),
        (404, {"agent_id": OFFLINE, "items": [{}], "parent_task_id": "nope"}, "parent_task_id"),
        (400, {"agent_id": OFFLINE, "items": [{}], "priority": 99}, "priority"),
    ]  # fmt: skip
    for status, params, field in cases:
        error = await runtime.error(status, "create_job", **params)
        assert error["details"]["field"] == field, (params, error)
    for command, params, field in (
        ("get_job", {}, "job_id"), ("cancel_job", {}, "job_id"),
        ("cancel_job", {"job_id": "j", "propagate": True}, "propagate"),
    ):  # fmt: skip
        error = await runtime.error(400, command, **params)
        assert error["details"]["field"] == field, (command, error)
    missing = await runtime.error(404, "get_job", job_id="nope")
    assert missing["details"]["field"] == "job_id"


async def test_json_rpc_and_the_sdk_drive_the_same_jobs(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    answer = await runtime.call("create_job", job_id="rpc", agent_id=AGENT, items=[{}])
    assert answer["result"]["jobId"] == "rpc"
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        job = await client.create_job(
            [{"input": {"mode": "answer"}}, {"input": {"mode": "loop"}}], agent_id=AGENT,
            job_id="sdk",
        )  # fmt: skip
        assert job.job_id == "sdk" and len(job.items) == 2
        again = await client.get_job("sdk")
        assert again.session_id == job.session_id
        cancelled = await client.cancel_job("sdk", reason="sdk")
        assert cancelled.intent == {"kind": "cancel", "reason": "sdk"}
        ended = await client.wait_job("sdk", timeout=WAIT_S)
        assert ended.status in ("cancelled", "partial")
        assert {i["status"] for i in ended.items} <= {"completed", "cancelled"}
