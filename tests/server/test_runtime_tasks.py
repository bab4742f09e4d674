"""The control plane's task commands against a real coordinator (HTTP sockets, an SDK agent
over gRPC): an agent task runs as Scheduler tasks of its agent, one per run; a retry adds an
attempt and keeps the old one; pause and cancel record the intent first, then stop the run;
cancelling a parent cancels its children; dependency edges gate a start; idempotency keys
keep a command's first effect; the owner reconciles a task with its artifacts and evidence.
Every event and answer the tests see is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.sdk.agent import Agent
from apiary.sdk.errors import TaskFailedError
from apiary.sdk.runtime import RuntimeClient
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import (
    WAIT_S,
    RuntimeHttp,
    session_events,
    types,
)

AGENT = "worker"


class Worker:
    """Runs the runs of agent tasks: the input's `mode` says what it does (answer, fail,
    hold until released, loop with safe points until preempted)."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.release = asyncio.Event()
        self.runs: list[str] = []

    async def running(self, task_id: str) -> None:
        await asyncio.wait_for(self.started.setdefault(task_id, asyncio.Event()).wait(), WAIT_S)

    async def handle(self, task: TaskContext) -> object:
        body = task.json()
        self.runs.append(body["runId"])
        self.started.setdefault(body["taskId"], asyncio.Event()).set()
        given = body["input"] if isinstance(body["input"], dict) else {}
        mode = given.get("mode", "answer")
        if mode == "fail":
            raise TaskFailedError("could not", error_code="tool_failed")
        if mode == "hold":
            await self.release.wait()
        if mode == "loop":
            while True:
                await task.safe_point()
                await asyncio.sleep(0.01)
        return {"done": body["taskId"], "attempt": body["attempt"]}


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


async def _until(runtime: RuntimeHttp, task_id: str, status: str) -> dict[str, Any]:
    doc = await runtime.until("get_task", lambda d: d["task"]["status"] == status, task_id=task_id)
    return dict(doc["task"])


def _of(events: list[dict[str, Any]], task_id: str) -> list[str]:
    return [e["type"] for e in events if e.get("taskId") == task_id]


@pytest.mark.conformance("runtime.task.write-facts", "runtime.task.retry-new-attempt")
async def test_a_task_runs_as_a_scheduler_task_and_a_retry_adds_an_attempt_keeping_the_old(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    created = await runtime.ok(
        "create_task", task_id="fix-7", agent_id=AGENT, title="Fix bug 7",
        objective="make test_7 pass", input={"mode": "fail"}, task_profile={"tier": "small"},
        constraints={"budgetUsd": 1}, acceptance=[{"check": "tests pass"}],
    )  # fmt: skip
    task = created["task"]
    assert created["created"] and task["status"] == "draft" and task["attempts"] == []
    assert (task["title"], task["objective"]) == ("Fix bug 7", "make test_7 pass")
    assert task["taskProfile"] == {"tier": "small"} and task["acceptance"] == [
        {"check": "tests pass"}
    ]
    session_id = created["sessionId"]
    await runtime.ok("start_task", task_id="fix-7")
    failed = await _until(runtime, "fix-7", "failed")
    (first,) = failed["attempts"]
    assert first["status"] == "failed" and first["lastError"]["code"] == "tool_failed"
    assert failed["lastError"]["code"] == "tool_failed"
    # The run is an Apiary task of the agent, submitted by the task's owner.
    assert coordinator.scheduler is not None
    run = await coordinator.scheduler.find(first["runId"])
    assert (run.agent_id, run.state, run.error_code) == (AGENT, "FAILED", "tool_failed")
    # A retry runs it again as a new attempt; the failed one is kept as it ended.
    await runtime.ok("update_task", task_id="fix-7", input={"mode": "answer"})
    await runtime.ok("retry_task", task_id="fix-7", reason="flaky")
    done = await _until(runtime, "fix-7", "completed")
    assert [a["status"] for a in done["attempts"]] == ["failed", "completed"]
    assert [a["attemptCount"] for a in done["attempts"]] == [1, 2]
    assert done["attempts"][0] == first and done["currentRunId"] == done["attempts"][1]["runId"]
    assert done["result"] == {"done": "fix-7", "attempt": 2}
    assert worker.runs == [first["runId"], done["attempts"][1]["runId"]]
    events = await session_events(coordinator, session_id)
    assert _of(events, "fix-7") == [
        "task.created", "task.profile.resolved", "task.started", "task.attempt.started",
        "run.status", "run.status", "task.attempt.failed", "task.failed", "task.updated",
        "task.retrying", "task.attempt.started", "run.status", "run.status",
        "task.attempt.completed", "task.completed",
    ]  # fmt: skip
    attempt_failed = next(e for e in events if e["type"] == "task.attempt.failed")
    assert attempt_failed["payload"]["retryable"] is True
    assert attempt_failed["runId"] == first["runId"] and attempt_failed["attemptId"] == "fix-7#1"
    # The session lists it; a completed task is not retried.
    listed = await runtime.ok("list_tasks", session_id=session_id)
    assert [t["taskId"] for t in listed["tasks"]] == ["fix-7"]
    snapshot = (await runtime.ok("get_session", session_id=session_id))["snapshot"]
    assert [t["taskId"] for t in snapshot["tasks"]] == ["fix-7"]
    assert snapshot["taskSummary"]["completed"] == 1
    error = await runtime.error(409, "retry_task", task_id="fix-7")
    assert error["code"] == "already_completed"


@pytest.mark.conformance("runtime.task.cancel-intent-first")
async def test_cancel_records_the_intent_first_then_stops_the_run_and_the_children(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    parent = await runtime.ok(
        "create_task", task_id="parent", agent_id=AGENT, input={"mode": "loop"}, start=True
    )
    session_id = parent["sessionId"]
    await runtime.ok("create_task", task_id="child", session_id=session_id,
                     parent_task_id="parent")  # fmt: skip
    await runtime.ok("create_task", task_id="other", session_id=session_id)
    await runtime.ok("link_tasks", task_id="parent", target_id="other", kind="child")
    await worker.running("parent")
    answer = await runtime.ok("cancel_task", task_id="parent", reason="not needed")
    assert answer["cancel"] == "requested" and answer["status"] == "cancelling"
    ended = await _until(runtime, "parent", "cancelled")
    assert ended["attempts"][0]["status"] == "cancelled"
    for child in ("child", "other"):
        got = (await runtime.ok("get_task", task_id=child))["task"]
        assert got["status"] == "cancelled", child
    events = await session_events(coordinator, session_id)
    mine = _of(events, "parent")
    assert mine.index("task.cancel_requested") < mine.index("task.cancelled")
    requested = next(e for e in events if e["type"] == "task.cancel_requested")
    assert requested["payload"] == {"reason": "not needed"}
    # The children's intent was recorded after the parent's, before they ended.
    order = [(e["type"], e["taskId"]) for e in events if e["type"].startswith("task.cancel")]
    assert order.index(("task.cancel_requested", "parent")) < order.index(
        ("task.cancel_requested", "child")
    ) < order.index(("task.cancelled", "child"))  # fmt: skip
    error = await runtime.error(409, "cancel_task", task_id="child")
    assert error["code"] == "already_completed"
    # A cancelled task can be retried: a new attempt.
    await runtime.ok("update_task", task_id="parent", input={"mode": "answer"})
    await runtime.ok("retry_task", task_id="parent")
    again = await _until(runtime, "parent", "completed")
    assert [a["status"] for a in again["attempts"]] == ["cancelled", "completed"]


async def test_pause_stops_the_run_and_resume_starts_a_new_one(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    created = await runtime.ok(
        "create_task", task_id="long", agent_id=AGENT, input={"mode": "loop"}, start=True
    )
    await worker.running("long")
    await runtime.ok("pause_task", task_id="long", reason="lunch")
    paused = await _until(runtime, "long", "paused")
    assert paused["attempts"][0]["status"] == "cancelled"
    error = await runtime.error(400, "pause_task", task_id="long")
    assert error["details"]["field"] == "task_id"
    await runtime.ok("update_task", task_id="long", input={"mode": "answer"})
    await runtime.ok("resume_task", task_id="long")
    done = await _until(runtime, "long", "completed")
    assert [a["reason"] for a in done["attempts"]] == ["start", "resume"]
    events = await session_events(coordinator, created["sessionId"])
    mine = _of(events, "long")
    assert mine.index("task.updated") < mine.index("task.paused") < mine.index("task.resumed")


async def test_dependencies_gate_a_start_and_cycles_are_refused(
    runtime: RuntimeHttp, worker: Worker
) -> None:
    first = await runtime.ok("create_task", task_id="a", agent_id=AGENT)
    session_id = first["sessionId"]
    await runtime.ok("create_task", task_id="b", agent_id=AGENT, session_id=session_id,
                     depends_on=["a"])  # fmt: skip
    error = await runtime.error(400, "start_task", task_id="b")
    assert error["details"]["field"] == "task_id" and error["details"]["waitingFor"] == "a"
    cycle = await runtime.error(400, "link_tasks", task_id="a", target_id="b", kind="dependency")
    assert cycle["code"] == "workflow_cycle_detected" and cycle["details"]["field"] == "target_id"
    await runtime.ok("start_task", task_id="a")
    await _until(runtime, "a", "completed")
    await runtime.ok("start_task", task_id="b")
    await _until(runtime, "b", "completed")
    # Unlinking keeps the edge as removed; unlinking it again names the target.
    unlinked = await runtime.ok("unlink_tasks", task_id="b", target_id="a", kind="dependency")
    (edge,) = unlinked["task"]["relationships"]
    assert (edge["kind"], edge["targetId"], edge["status"]) == ("dependency", "a", "removed")
    missing = await runtime.error(404, "unlink_tasks", task_id="b", target_id="a")
    assert missing["details"]["field"] == "target_id"


@pytest.mark.conformance("runtime.idempotency.mutating-keys")
async def test_idempotency_keys_keep_a_commands_first_effect(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    created = await runtime.ok(
        "create_task", task_id="once", agent_id=AGENT, input={"mode": "fail"}
    )
    again = await runtime.ok("create_task", task_id="once", agent_id=AGENT, input={"mode": "fail"})
    assert again["replayed"] and not again["created"] and again["taskId"] == "once"
    other = await runtime.error(409, "create_task", task_id="once", agent_id=AGENT, input=1)
    assert other["details"]["field"] == "task_id"
    await runtime.ok("start_task", task_id="once")
    await _until(runtime, "once", "failed")
    await runtime.ok("update_task", task_id="once", input={"mode": "hold"})
    await runtime.ok("retry_task", task_id="once", idempotency_key="retry-1")
    replay = await runtime.ok("retry_task", task_id="once", idempotency_key="retry-1")
    assert replay["replayed"] and len(replay["task"]["attempts"]) == 2
    reused = await runtime.error(409, "cancel_task", task_id="once", idempotency_key="retry-1")
    assert reused["details"]["field"] == "idempotency_key"
    worker.release.set()
    done = await _until(runtime, "once", "completed")
    assert len(done["attempts"]) == 2
    events = await session_events(coordinator, created["sessionId"])
    assert _of(events, "once").count("task.retrying") == 1


@pytest.mark.conformance("runtime.task.write-facts")
async def test_the_owner_reconciles_progress_artifacts_and_evidence(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    created = await runtime.ok("create_task", title="review by a human")
    task_id = created["taskId"]
    await runtime.ok("append_task_progress", task_id=task_id, phase="reading", percent=40,
                     counters={"files": 3}, output_refs=[{"uri": "file:///notes.md"}])  # fmt: skip
    progressed = await runtime.ok("append_task_progress", task_id=task_id, counters={"lines": 9},
                                  delivery_state={"sent": False})  # fmt: skip
    progress = progressed["task"]["progress"]
    assert progress["phase"] == "reading" and progress["counters"] == {"files": 3, "lines": 9}
    assert progressed["task"]["artifacts"] == [{"uri": "file:///notes.md"}]
    done = await runtime.ok(
        "complete_task", task_id=task_id, result={"verdict": "ok"}, evidence_refs=["ev-1"],
        artifacts=[{"uri": "file:///r.md"}],
    )  # fmt: skip
    task = done["task"]
    assert task["status"] == "completed" and task["result"] == {"verdict": "ok"}
    assert task["evidenceRefs"] == ["ev-1"] and len(task["artifacts"]) == 2
    # Completing it again reconciles what comes along; failing it is refused.
    more = await runtime.ok("complete_task", task_id=task_id, evidence_refs=["ev-2"])
    assert more["task"]["evidenceRefs"] == ["ev-1", "ev-2"]
    error = await runtime.error(409, "fail_task", task_id=task_id, error_code="late")
    assert error["code"] == "already_completed"
    events = await session_events(coordinator, created["sessionId"])
    assert _of(events, task_id) == [
        "task.created", "task.progress", "artifact.changed", "task.progress",
        "task.completed", "artifact.changed", "evidence.changed", "evidence.changed",
    ]  # fmt: skip


async def test_a_run_in_hand_is_completed_by_its_agent_not_by_the_owner(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await coordinator.registry.register(
        {"agent_id": "offline", "name": "offline", "reasoning_connectors": ["builtin://rules"]}
    )
    created = await runtime.ok("create_task", task_id="held", agent_id="offline", start=True)
    assert created["task"]["status"] == "queued"
    error = await runtime.error(409, "complete_task", task_id="held")
    assert error["code"] == "already_in_progress" and error["details"]["field"] == "task_id"
    # Its agent reports progress on it (through the control plane, as itself).
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    agent = Principal(PrincipalKind.AGENT, "offline")
    command = COMMANDS["append_task_progress"]
    answer = await command(control, agent, {"task_id": "held", "summary": "looking"})
    assert answer["task"]["progress"]["summary"] == "looking"
    stranger = Principal(PrincipalKind.AGENT, "stranger")
    with pytest.raises(Exception, match="no task"):
        await command(control, stranger, {"task_id": "held", "summary": "me too"})
    # A queued run is cancelled at once.
    cancelled = await runtime.ok("cancel_task", task_id="held")
    assert cancelled["status"] == "cancelled" and cancelled["cancel"] == "cancelled"


async def test_bad_parameters_name_the_field(runtime: RuntimeHttp) -> None:
    cases: list[tuple[int, str, dict[str, Any], str]] = [
        (400, "create_task", {"task_profile": [1]}, "task_profile"),
        (400, "create_task", {"acceptance": {"x": 1}}, "acceptance"),
        (400, "create_task", {"priority": 99}, "priority"),
        (400, "create_task", {"agent_id": "a", "capability": "c"}, "capability"),
        (404, "create_task", {"agent_id": "nobody"}, "agent_id"),
        (404, "create_task", {"parent_task_id": "nope"}, "parent_task_id"),
        (400, "create_task", {"start": "yes"}, "start"),
        (400, "update_task", {}, "task_id"),
        (404, "start_task", {"task_id": "nope"}, "task_id"),
        (400, "append_task_progress", {"task_id": "x"}, "summary"),
        (400, "append_task_progress", {"task_id": "x", "counters": {"a": "b"}}, "counters"),
        (400, "complete_task", {"task_id": "x", "evidence_refs": [1]}, "evidence_refs"),
        (400, "link_tasks", {"task_id": "x", "target_id": "x"}, "target_id"),
        (400, "link_tasks", {"task_id": "x", "target_id": "y", "kind": "friend"}, "kind"),
        (400, "cancel_task", {"task_id": "x", "colour": "red"}, "colour"),
    ]
    for status, command, params, field in cases:
        error = await runtime.error(status, command, **params)
        assert error["details"]["field"] == field, (command, params, error)
    draft = await runtime.ok("create_task", task_id="d")
    assert draft["task"]["status"] == "draft"
    nobody = await runtime.error(400, "start_task", task_id="d")
    assert nobody["details"]["field"] == "agent_id"
    resumed = await runtime.error(400, "resume_task", task_id="d")
    assert resumed["details"]["field"] == "task_id"


async def test_json_rpc_and_the_sdk_drive_the_same_tasks(
    coordinator: Coordinator, runtime: RuntimeHttp, worker: Worker
) -> None:
    answer = await runtime.call("create_task", task_id="rpc", agent_id=AGENT, start=True)
    assert answer["result"]["taskId"] == "rpc"
    refused = await runtime.call("start_task", task_id="rpc")
    assert refused["error"]["data"]["code"] in ("already_in_progress", "already_completed")
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        task = await client.create_task(task_id="sdk", agent_id=AGENT, title="t")
        assert task.status == "draft"
        started = await client.start_task("sdk")
        assert started.task_id == "sdk"
        done = await client.wait_task("sdk", timeout=WAIT_S)
        assert done.status == "completed" and done.extra["result"]["done"] == "sdk"
        linked = await client.link_tasks("sdk", "rpc", kind="source")
        assert linked.extra["relationships"][0]["kind"] == "source"
    assert types(await session_events(coordinator, task.session_id or ""))
