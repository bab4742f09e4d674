"""A task's activity entry (RFC 10) is the coordinator's to keep: registered when the task is
dispatched (before its agent can start it: the SDK starts a handler before its READ is
answered), with the repository fields its JSON params carry, and finished when the task
ends, each recorded by the task's own event; advisory, so a full buffer leaves the task
running (the refusal recorded)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from apiary.core.activity import ActivityEntry, ActivityLimits
from apiary.core.envelope import AckStage
from apiary.core.records import TaskState
from apiary.engine.scheduler.scheduler import Submission
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, ready_agent, task


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        yield harness


async def _submit(h: EngineHarness, task_id: str, body: object) -> None:
    params = json.dumps(body).encode()
    sub = Submission("worker", task_id, params=params, scope=f"repo:{task_id}")
    assert (await h.engine.scheduler.submit(sub)).accepted


async def test_the_dispatch_registers_the_entry_and_the_end_finishes_it(
    h: EngineHarness,
) -> None:
    await ready_agent(h, "worker")
    body = {"repo_id": "r1", "worktree_id": "w1", "branch": "main", "description": "fix it",
            "other": 1}  # fmt: skip
    await _submit(h, "t1", body)
    assert (await task(h, "t1")).state == TaskState.DISPATCHED
    buffer = h.engine.activity.buffer
    (entry,) = buffer.active()  # dispatched, not read yet: there before its agent starts it
    assert (entry.agent_id, entry.task_id) == ("worker", "t1")
    assert (entry.repo_id, entry.worktree_id, entry.branch, entry.description) == (
        "r1", "w1", "main", "fix it",
    )  # fmt: skip
    await ack_task(h, "t1", AckStage.READ)
    assert buffer.active() == [entry]  # the READ leaves it as it was
    await ack_task(h, "t1", AckStage.FULFILLED)
    assert buffer.active() == []
    assert [(e.task_id, e.outcome) for e in buffer.history()] == [("t1", "COMPLETED")]
    # The task's own events record its entry's registration and completion: no second
    # record of either (engine/activity.py).
    shown = ("task.dispatched", "task.running", "task.completed")
    kinds = [
        e.event_type for e in await h.events()
        if e.event_type.startswith("activity.") or e.event_type in shown
    ]  # fmt: skip
    assert kinds == ["task.dispatched", "task.running", "task.completed"]


async def test_params_that_are_not_a_json_object_give_a_bare_entry(h: EngineHarness) -> None:
    await ready_agent(h, "worker")
    await _submit(h, "t2", ["not", "an", "object"])
    (entry,) = h.engine.activity.buffer.active()
    assert (entry.task_id, entry.repo_id, entry.description) == ("t2", "", "")


async def test_a_full_buffer_leaves_the_task_running_without_an_entry(
    h: EngineHarness, caplog: pytest.LogCaptureFixture
) -> None:
    await ready_agent(h, "worker")
    activity = h.engine.activity
    for n in range(ActivityLimits().per_agent):  # the agent's share of the buffer, taken
        await activity.register(ActivityEntry(agent_id="worker", task_id=f"x{n}"))
    await _submit(h, "t3", {"repo_id": "r3"})  # refused at its dispatch
    await ack_task(h, "t3", AckStage.READ)
    assert (await task(h, "t3")).state == TaskState.RUNNING
    assert "t3" not in {e.task_id for e in activity.buffer.active()}
    assert "t3 runs without an activity entry" in caplog.text
    (refused,) = await h.events("activity.refused")
    assert (refused.details["task_id"], refused.details["error_code"]) == (
        "t3", "activity_buffer_full",
    )  # fmt: skip
    await ack_task(h, "t3", AckStage.FULFILLED)
    assert (await task(h, "t3")).state == TaskState.COMPLETED


async def test_an_attempt_back_in_its_queue_has_its_entry_closed(h: EngineHarness) -> None:
    """A dispatch that timed out (RETRY) closes its attempt's entry, FAILED: no entry
    lingers for an attempt no agent holds."""
    await ready_agent(h, "worker")
    await _submit(h, "t4", {"repo_id": "r4"})
    buffer = h.engine.activity.buffer
    assert [e.task_id for e in buffer.active()] == ["t4"]
    await ack_task(h, "t4", AckStage.TIMED_OUT)
    assert (await task(h, "t4")).state == TaskState.QUEUED
    assert buffer.active() == []
    assert [(e.task_id, e.outcome) for e in buffer.history()] == [("t4", "FAILED")]
