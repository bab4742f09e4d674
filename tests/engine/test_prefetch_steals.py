"""A shared task prefetched to a busy agent is taken back for a free agent of its queue once
it has waited there STEAL_AFTER_S (engine/scheduler/steals.py), on the engine with a fake
clock: the busy agent is asked to give it back (a recall, as at a shutdown), it goes back to
its queue and the free agent takes it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from apiary.core.envelope import AckStage
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.scheduler.steals import STEAL_AFTER_S
from apiary.engine.settings import SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ready_agent, submit, task


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=3)) as harness:
        yield harness


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


async def _recalls(h: EngineHarness, agent_id: str) -> list[str]:
    """The tasks the agent was asked to give back, in order."""
    payloads = await h.inbox_payloads(agent_id)
    return [p["task_id"] for p in payloads if p.get("command") == "preempt_request"]


async def _busy_with_prefetch(h: EngineHarness, count: int) -> None:
    """Agent x of "review" runs t1 and holds t2.. unread (prefetched)."""
    await ready_agent(h, "x", "review", task_concurrency=1)
    for n in range(1, count + 1):
        await submit(h, f"t{n}", capability="review")
    first = await task(h, "t1")
    await h.ack("x", first.message_id, AckStage.READ)
    held = [t.task_id for t in _sched(h).holding("x")]
    assert held == [f"t{n}" for n in range(1, count + 1)]


async def _later(h: EngineHarness, seconds: float) -> None:
    h.clock.advance(seconds)
    await _sched(h).fire_due()


async def test_a_free_agent_takes_back_a_task_that_waited_at_a_busy_one(
    h: EngineHarness,
) -> None:
    await _busy_with_prefetch(h, 3)
    await ready_agent(h, "y", "review", task_concurrency=1)
    # Dispatched just now: likely to start at x within a moment, so left there for now.
    assert await _recalls(h, "x") == []
    await _later(h, STEAL_AFTER_S / 2)
    assert await _recalls(h, "x") == []
    await _later(h, STEAL_AFTER_S / 2)
    # The one that would start last at x, and one only: y has one running slot.
    assert await _recalls(h, "x") == ["t3"]
    requested = await h.events("task.preempt_requested")
    assert requested[-1].details["reason"] == "recalled for y, free, of capability 'review'"
    t3 = await task(h, "t3")
    await h.ack("x", t3.message_id, AckStage.FULFILLED, note="yielded")
    moved = await task(h, "t3")
    assert (moved.state, moved.agent_id) == ("DISPATCHED", "y")
    assert [t.task_id for t in _sched(h).holding("x")] == ["t1", "t2"]
    # y is busy now: however long t2 waits, it stays at x.
    await _later(h, 10 * STEAL_AFTER_S)
    assert await _recalls(h, "x") == ["t3"]


async def test_one_task_a_free_slot_counting_those_on_their_way(h: EngineHarness) -> None:
    await _busy_with_prefetch(h, 4)
    await ready_agent(h, "y", "review", task_concurrency=2)
    await _later(h, STEAL_AFTER_S)
    assert await _recalls(h, "x") == ["t4", "t3"]
    # Before x gives them back, y is looked at again: both are on their way to it.
    _sched(h).wake("y")
    await _later(h, STEAL_AFTER_S)
    assert await _recalls(h, "x") == ["t4", "t3"]
    for task_id in ("t4", "t3"):
        given = await task(h, task_id)
        await h.ack("x", given.message_id, AckStage.FULFILLED, note="yielded")
    assert sorted(t.task_id for t in _sched(h).holding("y")) == ["t3", "t4"]
    assert [t.task_id for t in _sched(h).holding("x")] == ["t1", "t2"]


async def test_no_task_is_taken_back_for_an_agent_that_cannot_take_it(
    h: EngineHarness,
) -> None:
    """Another content type than the free agent admits, or a queue it does not serve."""
    await ready_agent(
        h, "x", "review", "build", task_concurrency=1,
        modalities=("application/json", "image/png"),
    )  # fmt: skip
    await submit(h, "t1", capability="review")
    await submit(h, "t2", capability="build")
    await submit(h, "t3", capability="review", content_type="image/png")
    await h.ack("x", (await task(h, "t1")).message_id, AckStage.READ)
    await ready_agent(h, "y", "review", task_concurrency=1)  # no image/png, no "build"
    await _later(h, 3 * STEAL_AFTER_S)
    assert await _recalls(h, "x") == []
    assert [t.task_id for t in _sched(h).holding("x")] == ["t1", "t2", "t3"]


async def test_a_task_for_one_agent_is_never_taken_back(h: EngineHarness) -> None:
    await ready_agent(h, "x", "review", task_concurrency=1)
    await submit(h, "t1", "x")
    await submit(h, "t2", "x")
    await h.ack("x", (await task(h, "t1")).message_id, AckStage.READ)
    await ready_agent(h, "y", "review", task_concurrency=1)
    await _later(h, 3 * STEAL_AFTER_S)
    assert await _recalls(h, "x") == []
    assert [t.task_id for t in _sched(h).holding("x")] == ["t1", "t2"]


async def test_a_recall_that_crossed_the_tasks_start_is_never_forced(
    h: EngineHarness,
) -> None:
    """x starts the recalled task just as the recall leaves (its running task ended then):
    the request flags a running task, which may yield at a safe point or run to its end;
    the recall's deadline passes without terminating it."""
    await _busy_with_prefetch(h, 2)
    await ready_agent(h, "y", "review", task_concurrency=1)
    await _later(h, STEAL_AFTER_S)
    assert await _recalls(h, "x") == ["t2"]
    # Before x hears of it, t1 ends and t2 starts there.
    t1 = await task(h, "t1")
    await h.ack("x", t1.message_id, AckStage.FULFILLED, note='{"n": 1}')
    t2 = await task(h, "t2")
    await h.ack("x", t2.message_id, AckStage.READ)
    assert (await task(h, "t2")).state == "RUNNING"
    timeout = _sched(h).settings.preemption.safe_point_timeout_s
    await _later(h, timeout + 1.0)
    await _later(h, _sched(h).settings.preemption.grace_s + 1.0)
    commands = [p.get("command") for p in await h.inbox_payloads("x")]
    assert "terminate" not in commands and "kill" not in commands
    running = await task(h, "t2")
    assert (running.state, running.agent_id) == ("RUNNING", "x")
    await h.ack("x", running.message_id, AckStage.FULFILLED, note='{"n": 2}')
    done = await task(h, "t2")
    assert (done.state, done.result) == ("COMPLETED", '{"n": 2}')
