"""The Scheduler's lanes and agent lifecycle: communication classes of task envelopes and what
an agent's lifecycle does to its tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.activity import ActivityEntry
from apiary.core.envelope import AckStage
from apiary.core.lanes import LanePolicy
from apiary.engine.settings import SchedulerSettings
from apiary.errors import (
    AgentShutdownError,
    AlreadyCompletedError,
    AlreadyInProgressError,
    NotFoundError,
    ValidationError,
)
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.scheduler_harness import (
    _finish,
    _inbox,
    _ready,
    _sched,
    _state,
    _submit,
)
from tests.engine.task_harness import ack_task, task
from tests.engine.test_scheduler import _controls


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        yield harness


# --- lanes and lifecycle --------------------------------------------------------------------


@pytest.mark.conformance(
    "scheduler.lanes.privileged-after-current", "scheduler.lanes.privileged-no-hard-preemption"
)  # fmt: skip
async def test_a_privileged_task_runs_next_without_preempting(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _ready(h, "boss", communication_class="PRIVILEGED")
    await _submit(h, "current")
    await _submit(h, "standard", scope="repo:app path:b")
    await _submit(h, "urgent", scope="repo:app path:c", submitter="boss")
    assert (await _sched(h).find("urgent")).lane == "PRIVILEGED"
    assert _controls(await _inbox(h, "worker")) == []
    await _finish(h, "current")
    assert _sched(h).running("worker").task_id == "urgent"  # type: ignore[union-attr]


@pytest.mark.conformance(
    "scheduler.lanes.privileged-rate-limit",
    "scheduler.lanes.privileged-overflow-to-standard",
    "scheduler.lanes.rate-limit-configurable",
)
async def test_privileged_tasks_are_rate_limited_and_overflow_to_standard_share() -> None:
    # An administrator's policy: bursts of 2 urgent tasks, then one token a day.
    lanes = LanePolicy(privileged_rate=1 / 86_400, privileged_burst=2)
    async with open_test_engine(scheduler=SchedulerSettings(lanes=lanes)) as h:
        await _ready(h, "worker")
        await _ready(h, "boss", communication_class="PRIVILEGED")
        await _submit(h, "current")
        for n in range(6):
            await _submit(h, f"u{n}", scope=f"repo:app path:u{n}", submitter="boss")
        for n in range(3):
            await _submit(h, f"s{n}", scope=f"repo:app path:s{n}")
        order: list[str] = []
        await _finish(h, "current")
        while (running := _sched(h).running("worker")) is not None:
            order.append(running.task_id)
            await _finish(h, running.task_id)
        dispatched = {
            e.details["task_id"]: e.details
            for e in await h.engine.events.read(limit=10_000)
            if e.event_type == "task.dispatched"
        }
    assert sorted(order) == sorted([*(f"u{n}" for n in range(6)), "s0", "s1", "s2"])
    assert order[:2] == ["u0", "u1"]  # the burst goes urgent, ahead of STANDARD
    assert all(dispatched[t]["urgent"] for t in order[:2])
    # Past the burst no token is left: the rest is overflow with STANDARD's weight, so
    # STANDARD is served before the privileged flood is through.
    rest = order[2:]
    assert all(dispatched[t]["overflowed"] and not dispatched[t]["urgent"]
               for t in rest if t.startswith("u"))  # fmt: skip
    assert rest.index("s0") < max(rest.index(f"u{n}") for n in range(2, 6))
    runs = "".join(t[0] for t in rest).split("s")  # overflow picks between STANDARD ones
    assert max(len(run) for run in runs) <= 2  # STANDARD's weight
    with pytest.raises(ValidationError) as caught:
        LanePolicy(privileged_rate=0)
    assert caught.value.details["field"] == "lanes.privileged_rate"


@pytest.mark.conformance(
    "lifecycle.shutting-down.no-dispatch", "lifecycle.shutdown.no-new-tasks",
    "lifecycle.initializing.no-tasks",
)  # fmt: skip
async def test_no_task_goes_to_an_initializing_or_shutting_down_agent(h: EngineHarness) -> None:
    await h.register("worker")
    await _sched(h).agent_registered("worker", "worker")
    await _submit(h, "t1")
    assert await _state(h, "t1") == "QUEUED"  # INITIALIZING takes no task
    await _sched(h).agent_ready("worker")
    assert await _state(h, "t1") == "DISPATCHED"
    await _submit(h, "t2", scope="repo:app path:other")
    await _sched(h).shutdown_agent("worker", 5.0)
    t2 = await _sched(h).find("t2")
    assert (t2.state, t2.error_code) == ("FAILED", "agent_shutdown")
    assert "shutdown" in _controls(await _inbox(h, "worker"))
    with pytest.raises(AgentShutdownError):
        await _submit(h, "t3", scope="repo:app path:third")


async def test_queued_and_running_tasks_survive_a_restart(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path) as h:
        await _ready(h, "worker")
        await _submit(h, "t1")
        await _submit(h, "t2", priority=3, scope="repo:app path:two")
        clock, ids = h.clock, h.ids
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        assert _sched(h).running("worker").task_id == "t1"  # type: ignore[union-attr]
        assert [t.task_id for t in _sched(h).queued("worker")] == ["t2"]
        await _sched(h).agent_ready("worker")
        await _finish(h, "t1")
        assert await _state(h, "t2") == "DISPATCHED"


@pytest.mark.conformance("activity.reconcile.purge")
async def test_activity_of_ended_or_unknown_tasks_is_reconciled_away(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _submit(h, "running")
    await _submit(h, "done", scope="repo:app path:done")
    activity = h.engine.activity
    for task_id in ("running", "done", "stranger"):
        await activity.register(ActivityEntry(agent_id="worker", task_id=task_id,
                                              description=f"working on {task_id}"))  # fmt: skip
    await _finish(h, "running")  # completes "running"; "done" starts
    await activity.register(ActivityEntry(agent_id="worker", task_id="running", description="x"))
    assert await _sched(h).reconcile_activity() == 1  # "running" is COMPLETED
    assert {e.task_id for e in activity.buffer.active()} == {"done", "stranger"}
    h.clock.advance(61)  # an unknown task's entry gets a grace period, then goes too
    assert await _sched(h).reconcile_activity() == 1
    assert [e.task_id for e in activity.buffer.active()] == ["done"]


async def test_an_operator_cancels_only_what_has_not_started(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _submit(h, "running")
    await _submit(h, "waiting", scope="repo:other path:x")
    await _submit(h, "next", scope="repo:other path:y")
    assert (await _state(h, "running"), await _state(h, "waiting")) == ("DISPATCHED", "QUEUED")
    await ack_task(h, "running", AckStage.READ)
    with pytest.raises(AlreadyInProgressError) as caught:
        await _sched(h).cancel("running", "too late", "olivia")
    assert caught.value.details["state"] == "RUNNING"
    cancelled = await _sched(h).cancel("waiting", "wrong repo", "olivia")
    assert (cancelled.state, cancelled.error_code, cancelled.note) == (
        "FAILED", "cancelled", "cancelled by olivia: wrong repo",
    )  # fmt: skip
    assert [t.task_id for t in _sched(h).queued("worker")] == ["next"]
    with pytest.raises(AlreadyCompletedError):
        await _sched(h).cancel("waiting", "", "olivia")
    with pytest.raises(NotFoundError):
        await _sched(h).cancel("never", "", "olivia")
    await _finish(h, "running")
    await _sched(h).fire_due()
    assert await _state(h, "next") == "DISPATCHED"  # the queue moved on past the cancelled one


@pytest.mark.parametrize(
    ("stage", "error_code", "note"),
    [
        (AckStage.FULFILLED, "", "yielded"),  # a client that yields what it was asked back
        (AckStage.FAILED, "cancelled", "interrupt: cancelled by olivia: wrong repo"),  # the SDK
    ],
)
async def test_a_dispatched_task_not_read_is_cancelled_once_its_agent_gives_it_back(
    h: EngineHarness, stage: AckStage, error_code: str, note: str
) -> None:
    await _ready(h, "worker")
    await _submit(h, "waiting")
    assert await _state(h, "waiting") == "DISPATCHED"
    asked = await _sched(h).cancel("waiting", "wrong repo", "olivia")
    assert asked.state == "DISPATCHED"  # until the agent gives it back
    (control,) = [p for p in await _inbox(h, "worker") if p["type"] == "CONTROL"]
    assert (control["command"], control["task_id"]) == ("preempt_request", "waiting")
    assert control["reason"] == "interrupt: cancelled by olivia: wrong repo"
    held = await task(h, "waiting")
    await h.ack("worker", held.message_id, stage, error_code=error_code, note=note)
    ended = await task(h, "waiting")
    assert (ended.state, ended.error_code) == ("FAILED", "cancelled")
    assert "cancelled by olivia: wrong repo" in ended.note
    assert _sched(h).holding("worker") == [] and _sched(h).queued("worker") == []
