"""Agents that run several tasks at once, and the prefetch window, on the engine with a fake
clock: the Scheduler keeps `task_concurrency` tasks in flight to an agent plus `prefetch` more,
preemption takes the lowest-priority running task and recalls lower prefetched ones, and a
task is never held by two agents at once (docs/scheduler.md, "Concurrency and prefetch")."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.conflicts import ConflictPolicy
from apiary.core.envelope import AckStage
from apiary.engine.scheduler.scheduler import Scheduler, Submission, SubmitResult
from apiary.engine.settings import SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task as _ack
from tests.engine.task_harness import ready_agent as _agent
from tests.engine.task_harness import submit
from tests.engine.task_harness import task as _task


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1)) as harness:
        yield harness


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


async def _submit(
    h: EngineHarness, task_id: str, agent_id: str = "worker", **fields: Any
) -> SubmitResult:
    return await submit(h, task_id, agent_id, **fields)


def _holding(h: EngineHarness, agent_id: str) -> list[tuple[str, str]]:
    return [(t.task_id, t.state) for t in _sched(h).holding(agent_id)]


async def _controls(h: EngineHarness, agent_id: str) -> list[tuple[str, str]]:
    return [
        (p["command"], p.get("task_id", ""))
        for p in await h.inbox_payloads(agent_id)
        if p["type"] == "CONTROL"
    ]


async def test_an_agent_holds_its_concurrency_and_the_prefetch(h: EngineHarness) -> None:
    await _agent(h, "worker", task_concurrency=3)
    for n in range(6):
        await _submit(h, f"t{n}")
    assert [t for t, _ in _holding(h, "worker")] == ["t0", "t1", "t2", "t3"]  # 3 + 1
    assert [t.task_id for t in _sched(h).queued("worker")] == ["t4", "t5"]
    lifecycles = _sched(h).lifecycles
    assert lifecycles.state("worker") == "SCHEDULED"
    for n in range(3):
        await _ack(h, f"t{n}", AckStage.READ)
    assert lifecycles.state("worker") == "RUNNING"
    await _ack(h, "t0", AckStage.FULFILLED)
    # A running slot freed: the prefetched t3 may start, and t4 is prefetched behind it.
    assert [t for t, _ in _holding(h, "worker")] == ["t1", "t2", "t3", "t4"]
    assert lifecycles.state("worker") == "RUNNING"  # it still runs t1 and t2
    assert _sched(h).active() == {"worker": 1}  # one instance of its type, however many tasks


async def test_an_agent_that_declared_nothing_holds_one_task(h: EngineHarness) -> None:
    await _agent(h, "worker")  # a plain client: no prefetched task may reach it
    for n in range(3):
        await _submit(h, f"t{n}")
    assert [t for t, _ in _holding(h, "worker")] == ["t0"]
    declared = "declared"
    await _agent(h, declared, task_concurrency=1)
    for n in range(3):
        await _submit(h, f"d{n}", declared)
    assert [t for t, _ in _holding(h, declared)] == ["d0", "d1"]  # 1 running + 1 prefetched


async def test_the_agent_frees_once_its_last_task_ends(h: EngineHarness) -> None:
    await _agent(h, "worker", task_concurrency=2)
    lifecycles = _sched(h).lifecycles
    for n in range(2):
        await _submit(h, f"t{n}")
        await _ack(h, f"t{n}", AckStage.READ)
    await _ack(h, "t0", AckStage.FULFILLED)
    assert lifecycles.state("worker") == "RUNNING"
    await _ack(h, "t1", AckStage.FULFILLED)
    assert lifecycles.state("worker") == "RUNNABLE"
    assert _holding(h, "worker") == []
    # Holding only a prefetched task when its running one ends: its window stays occupied,
    # and it goes straight on to that task, RUNNING throughout (core/agent_window.py).
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1)) as h2:
        await _agent(h2, "w", task_concurrency=1)
        await _submit(h2, "a", "w")
        await _ack(h2, "a", AckStage.READ)
        await _submit(h2, "b", "w")
        await _ack(h2, "a", AckStage.FULFILLED)
        assert (_holding(h2, "w"), _sched(h2).lifecycles.state("w")) == (
            [("b", "DISPATCHED")], "RUNNING",
        )  # fmt: skip
        await _ack(h2, "b", AckStage.READ)
        await _ack(h2, "b", AckStage.FULFILLED)
        assert (_holding(h2, "w"), _sched(h2).lifecycles.state("w")) == ([], "RUNNABLE")


@pytest.mark.conformance("preemption.trigger.higher-priority")
async def test_preemption_takes_the_lowest_priority_running_task(h: EngineHarness) -> None:
    # No prefetch: 3 running, nothing waiting.
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=0)) as h0:
        await _agent(h0, "worker", task_concurrency=3)
        for task_id, priority in (("p0", 0), ("p9", 9), ("p5", 5)):
            await _submit(h0, task_id, priority=priority)
            await _ack(h0, task_id, AckStage.READ)
        result = await _submit(h0, "urgent", priority=-5)
        assert result.reason == "queued: preempting task p9 (priority 9)"
        assert await _controls(h0, "worker") == [("preempt_request", "p9")]
        again = await _submit(h0, "urgent-2", priority=-5)
        assert again.reason == "queued: preempting task p5 (priority 5)"
        same = await _submit(h0, "same", priority=0)  # equal to p0: never preempts
        assert not same.reason.startswith("queued: preempting")
        await _ack(h0, "p9", AckStage.FULFILLED, note="yielded")
        assert (await _task(h0, "p9")).state == "QUEUED"
        assert ("urgent", "DISPATCHED") in _holding(h0, "worker")
        await _ack(h0, "p5", AckStage.FULFILLED, note="yielded")
        assert [t for t, _ in _holding(h0, "worker")] == ["p0", "urgent", "urgent-2"]


async def test_a_higher_priority_recalls_lower_prefetched_tasks(h: EngineHarness) -> None:
    await _agent(h, "worker", task_concurrency=1)
    await _submit(h, "low", priority=5)
    await _ack(h, "low", AckStage.READ)
    await _submit(h, "waiting", priority=9)  # prefetched behind low
    assert _holding(h, "worker") == [("low", "RUNNING"), ("waiting", "DISPATCHED")]
    result = await _submit(h, "urgent", priority=-5)
    assert result.reason == "queued: preempting task low (priority 5)"
    assert await _controls(h, "worker") == [("preempt_request", "waiting"),
                                            ("preempt_request", "low")]  # fmt: skip
    await _ack(h, "waiting", AckStage.FULFILLED, note="yielded")  # never started
    assert (await _task(h, "waiting")).state == "QUEUED"
    # Not prefetched behind the task it preempts: it goes once that one yielded.
    assert _holding(h, "worker") == [("low", "RUNNING")]
    await _ack(h, "low", AckStage.FULFILLED, note="yielded")
    assert [t for t, _ in _holding(h, "worker")] == ["urgent", "low"]
    logged = [
        (e.event_type, e.details.get("task_id"))
        for e in await h.store.events.read(limit=10_000)
        if e.event_type in ("task.dispatched", "task.requeued")
    ]
    assert logged.index(("task.requeued", "low")) < logged.index(("task.dispatched", "urgent"))


async def test_a_task_below_every_held_one_is_prefetched(h: EngineHarness) -> None:
    await _agent(h, "worker", task_concurrency=1)
    await _submit(h, "first", priority=-5)
    await _ack(h, "first", AckStage.READ)
    await _submit(h, "same", priority=-5)
    await _submit(h, "lower", priority=3)
    # Neither preempts nor recalls anything: both wait at the agent (prefetch 1 here).
    assert _holding(h, "worker") == [("first", "RUNNING"), ("same", "DISPATCHED")]
    assert await _controls(h, "worker") == []


async def test_a_shared_task_preempts_the_lowest_priority_among_its_agents(
    h: EngineHarness,
) -> None:
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=0)) as h0:
        for agent in ("x", "y"):
            await _agent(h0, agent, "review", task_concurrency=2)
        for task_id, priority in (("x0", 0), ("x3", 3), ("y1", 1), ("y7", 7)):
            await _submit(h0, task_id, task_id[0], priority=priority)
            await _ack(h0, task_id, AckStage.READ)
        result = await _sched(h0).submit(
            Submission("", "urgent", -2, b"{}", scope="repo:u", capability="review")
        )
        assert result.reason == "queued: preempting task y7 (priority 7)"
        await _ack(h0, "y7", AckStage.FULFILLED, note="yielded")
        assert (await _task(h0, "urgent")).agent_id == "y"


async def test_a_shared_task_preempting_is_prefetched_nowhere(h: EngineHarness) -> None:
    """A shared task that preempts on one agent is not prefetched meanwhile to another
    whose running task is above it (it would wait there behind that task): it goes to the
    agent whose task yields, as with no prefetch."""
    for agent in ("x", "y"):
        await _agent(h, agent, "review", task_concurrency=1)
    for task_id, priority in (("x-top", -5), ("y7", 7)):
        await _submit(h, task_id, task_id[0], priority=priority)
        await _ack(h, task_id, AckStage.READ)
    result = await _sched(h).submit(
        Submission("", "urgent", -2, b"{}", scope="repo:u", capability="review")
    )
    assert result.reason == "queued: preempting task y7 (priority 7)"
    assert (await _task(h, "urgent")).state == "QUEUED"
    await _ack(h, "y7", AckStage.FULFILLED, note="yielded")
    urgent = await _task(h, "urgent")
    assert (urgent.state, urgent.agent_id) == ("DISPATCHED", "y")


async def test_an_agent_running_several_tasks_has_their_scopes_compared(
    h: EngineHarness,
) -> None:
    policy = ConflictPolicy(serialize_below=0.7)
    async with open_test_engine(scheduler=SchedulerSettings(conflicts=policy)) as h0:
        await _agent(h0, "worker", task_concurrency=2)
        await _submit(h0, "m1", scope="repo:app path:src/a.py")
        await _submit(h0, "m2", scope="repo:app path:src/a.py")
        # m2 may not run beside m1, though the agent has room for it.
        assert [t for t, _ in _holding(h0, "worker")] == ["m1"]
        assert (await _task(h0, "m2")).note.startswith("SERIALIZE behind m1")
        await _submit(h0, "other", scope="repo:elsewhere")  # FIFO: behind m2
        await _ack(h0, "m1", AckStage.FULFILLED)
        assert [t for t, _ in _holding(h0, "worker")] == ["m2", "other"]


async def test_a_task_is_never_held_by_two_agents(h: EngineHarness) -> None:
    """Random submissions, completions, yields and agents lost and back: at every step each
    live task is held by at most one agent, agrees with its record, and every task ends
    once."""
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1, max_attempts=3)) as h0:
        agents = ("a", "b", "c")
        for n, agent in enumerate(agents, start=1):
            await _agent(h0, agent, "review", task_concurrency=n)
        rng = random.Random(7)
        submitted: list[str] = []
        scheduler = _sched(h0)
        for step in range(300):
            roll = rng.random()
            if roll < 0.3 or not submitted:
                task_id = f"t{step}"
                await _sched(h0).submit(
                    Submission("", task_id, rng.randint(-3, 3), json.dumps([step]).encode(),
                               scope=f"repo:{step}", capability="review")
                )  # fmt: skip
                submitted.append(task_id)
            elif roll < 0.85:
                agent = rng.choice(agents)
                held = scheduler.holding(agent)
                if held:
                    task = rng.choice(held)
                    stage = AckStage.READ if task.state == "DISPATCHED" else AckStage.FULFILLED
                    await h0.ack(agent, task.message_id, stage)
            elif roll < 0.93:
                agent = rng.choice(agents)
                await scheduler.agent_lost(agent, "random loss")
            else:
                agent = rng.choice(agents)
                await scheduler.agent_reported(agent, "RUNNABLE")  # back from recovery
            holders: dict[str, str] = {}
            for agent in agents:
                for task in scheduler.holding(agent):
                    assert task.task_id not in holders, (step, task.task_id)
                    holders[task.task_id] = agent
                    assert task.agent_id == agent and task.state in ("DISPATCHED", "RUNNING")
            for task_id in submitted:
                live = scheduler.get(task_id)
                if live is not None and live.state == "QUEUED":
                    assert task_id not in holders and live.agent_id == ""
        ended = [e for e in await h0.events() if e.event_type in ("task.completed", "task.failed")]
        ends = [str(e.details["task_id"]) for e in ended]
        assert len(ends) == len(set(ends))
        assert any(e.event_type == "task.requeued" for e in await h0.events())


async def test_a_dispatch_refused_for_a_full_buffer_waits_and_is_retried(
    h: EngineHarness,
) -> None:
    """The router refuses the dispatch (and NACKs the Scheduler, which has the refusal in
    hand already): the task waits in its queue and goes out once the buffer has room."""
    await h.register("worker", capacity=1, task_concurrency=2)
    await _sched(h).agent_ready("worker")
    filler = await h.send("someone", "worker", {"fill": 1})
    assert filler.accepted
    result = await _submit(h, "t1")
    assert result.accepted and (await _task(h, "t1")).state == "QUEUED"
    refused = [e for e in await h.events("message.rejected") if e.details["error_code"]]
    assert [e.details["error_code"] for e in refused] == ["buffer_full"]
    (handout,) = await h.take("worker")
    await h.ack("worker", handout.message.message_id, AckStage.FULFILLED)
    h.clock.advance(_sched(h).settings.retry_after_s)
    await _sched(h).fire_due()
    assert (await _task(h, "t1")).state == "DISPATCHED"
