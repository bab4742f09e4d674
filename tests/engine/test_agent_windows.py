"""The agent lifecycle stepped when its window of tasks changes between empty and occupied
(core/agent_window.py, engine/scheduler/windows.py), on the engine with a fake clock: an
agent that goes straight on to its next task stays RUNNING, with no `agent.lifecycle` events
between its tasks, and its state is right whenever a Scheduler call has returned (idle
after its last task, RUNNING while one runs, through preemption and suspension)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from apiary.core.conflicts import ConflictPolicy
from apiary.core.envelope import AckStage
from apiary.core.preemption import PreemptionPolicy
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.settings import SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task as _ack
from tests.engine.task_harness import ready_agent as _agent
from tests.engine.task_harness import submit as _submit
from tests.engine.task_harness import task as _task

N = 20
_ROUND = [
    ("RUNNABLE", "SCHEDULED"), ("SCHEDULED", "RUNNING"), ("RUNNING", "COMPLETED"),
    ("COMPLETED", "RUNNABLE"),
]  # fmt: skip
"""An idle agent's way through one task: its window occupied, then empty again."""


ONE_FILE = "repo:app path:src/a.py"
"""A scope that the conflict policy of `_serializing_agents` runs one task at a time."""


@asynccontextmanager
async def _serializing_agents() -> AsyncIterator[EngineHarness]:
    """Agents w and x ready, under a conflict policy that serializes tasks on ONE_FILE."""
    policy = ConflictPolicy(serialize_below=0.7)
    async with open_test_engine(scheduler=SchedulerSettings(conflicts=policy)) as h:
        await _agent(h, "w")
        await _agent(h, "x")
        yield h


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        yield harness


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


def _state(h: EngineHarness, agent_id: str = "w") -> str:
    state = _sched(h).lifecycles.state(agent_id)
    assert state is not None
    return state.value


async def _moves(h: EngineHarness, agent_id: str = "w") -> list[tuple[str, str]]:
    """The agent's lifecycle transitions since it was RUNNABLE first (its start-up left out)."""
    found = [
        (e.details["from"], e.details["to"])
        for e in await h.events("agent.lifecycle")
        if e.agent_id == agent_id
    ]
    return found[found.index(("INITIALIZING", "RUNNABLE")) + 1 :]


@pytest.mark.conformance("lifecycle.running.execute", "lifecycle.completed.cleanup-report")
async def test_back_to_back_tasks_step_the_agent_once_each_way(h: EngineHarness) -> None:
    await _agent(h, "w")
    for n in range(N):
        await _submit(h, f"t{n}", "w")
    assert _state(h) == "SCHEDULED"  # t0 handed out, not read yet
    for n in range(N):
        await _ack(h, f"t{n}", AckStage.READ)
        assert _state(h) == "RUNNING"
        await _ack(h, f"t{n}", AckStage.FULFILLED)
        assert (await _task(h, f"t{n}")).state == "COMPLETED"
        if n < N - 1:  # the next one was handed to it in the same turn
            assert [t.task_id for t in _sched(h).holding("w")] == [f"t{n + 1}"]
            assert _state(h) == "RUNNING"
    assert (_sched(h).holding("w"), _state(h)) == ([], "RUNNABLE")
    # N tasks, one round: 4 events where a round per task made 4 * N.
    assert await _moves(h) == _ROUND
    assert len(await h.events("task.completed")) == N


async def test_an_agent_with_nothing_waiting_is_idle_before_the_turn_goes_on() -> None:
    """With no task waiting for it, the agent's window empties at once, not at the end of
    the Scheduler's turn: its way back to RUNNABLE is logged right after its task's end,
    before the dispatches that end made possible (here: another agent's task that waited
    behind it for a scope conflict), so whoever sees the end sees the agent idle."""
    async with _serializing_agents() as h:
        await _submit(h, "a", "w", scope=ONE_FILE)
        await _ack(h, "a", AckStage.READ)
        await _submit(h, "c", "x", scope=ONE_FILE)
        assert (await _task(h, "c")).note.startswith("SERIALIZE behind a")
        await _ack(h, "a", AckStage.FULFILLED)
        assert (_state(h, "w"), _state(h, "x")) == ("RUNNABLE", "SCHEDULED")
        log = [
            (e.event_type, e.agent_id or e.details.get("task_id"), e.details.get("to", ""))
            for e in await h.events()
            if e.event_type in ("task.completed", "task.dispatched", "agent.lifecycle")
        ]
        ended = log.index(("task.completed", "w", ""))
        assert log[ended : ended + 4] == [
            ("task.completed", "w", ""),
            ("agent.lifecycle", "w", "COMPLETED"),
            ("agent.lifecycle", "w", "RUNNABLE"),
            ("task.dispatched", "x", ""),
        ]


async def test_an_agent_idle_between_tasks_steps_for_each(h: EngineHarness) -> None:
    await _agent(h, "w")
    for n in range(3):
        await _submit(h, f"t{n}", "w")
        assert _state(h) == "SCHEDULED"
        await _ack(h, f"t{n}", AckStage.READ)
        assert _state(h) == "RUNNING"
        await _ack(h, f"t{n}", AckStage.FULFILLED)
        assert _state(h) == "RUNNABLE"
    assert await _moves(h) == _ROUND * 3


async def test_a_failed_task_with_the_next_waiting_keeps_the_agent_running(
    h: EngineHarness,
) -> None:
    await _agent(h, "w")
    for n in range(3):
        await _submit(h, f"t{n}", "w")
    await _ack(h, "t0", AckStage.READ)
    await _ack(h, "t0", AckStage.FAILED)
    assert ((await _task(h, "t0")).state, _state(h)) == ("FAILED", "RUNNING")
    for n in (1, 2):
        await _ack(h, f"t{n}", AckStage.READ)
        await _ack(h, f"t{n}", AckStage.FULFILLED)
    assert (_state(h), await _moves(h)) == ("RUNNABLE", _ROUND)


async def test_an_agent_whose_next_task_must_wait_goes_back_to_runnable() -> None:
    """The window emptied and the next task could not be handed out in the turn (its scope
    conflicts with a task another agent runs): RUNNABLE at the end of the turn."""
    async with _serializing_agents() as h:
        await _submit(h, "a", "w", scope="repo:a")
        await _ack(h, "a", AckStage.READ)
        await _submit(h, "c", "x", scope=ONE_FILE)
        await _ack(h, "c", AckStage.READ)
        await _submit(h, "b", "w", scope=ONE_FILE)
        await _ack(h, "a", AckStage.FULFILLED)
        assert (await _task(h, "b")).note.startswith("SERIALIZE behind c")
        assert (_sched(h).holding("w"), _state(h)) == ([], "RUNNABLE")
        await _ack(h, "c", AckStage.FULFILLED)  # b may go now: an idle agent's round again
        assert [t.task_id for t in _sched(h).holding("w")] == ["b"]
        assert _state(h) == "SCHEDULED"
        assert await _moves(h) == [*_ROUND, ("RUNNABLE", "SCHEDULED")]


async def test_a_yield_hands_the_agent_the_higher_task_without_leaving_running(
    h: EngineHarness,
) -> None:
    await _agent(h, "w")
    await _submit(h, "low", "w", priority=10)
    await _ack(h, "low", AckStage.READ)
    result = await _submit(h, "high", "w", priority=-5)
    assert result.reason == "queued: preempting task low (priority 10)"
    await _ack(h, "low", AckStage.FULFILLED, note="yielded")
    assert [t.task_id for t in _sched(h).holding("w")] == ["high"]
    assert ((await _task(h, "low")).state, _state(h)) == ("QUEUED", "RUNNING")
    await _ack(h, "high", AckStage.READ)
    await _ack(h, "high", AckStage.FULFILLED)
    assert [t.task_id for t in _sched(h).holding("w")] == ["low"]  # low resumes
    assert _state(h) == "RUNNING"
    await _ack(h, "low", AckStage.READ)
    await _ack(h, "low", AckStage.FULFILLED)
    assert (_state(h), await _moves(h)) == ("RUNNABLE", _ROUND)


async def test_a_termination_with_the_higher_task_waiting_keeps_the_agent_running() -> None:
    policy = PreemptionPolicy(safe_point_timeout_s=1, grace_s=3)
    async with open_test_engine(scheduler=SchedulerSettings(preemption=policy)) as h:
        await _agent(h, "w")
        await _submit(h, "low", "w", priority=10)
        await _ack(h, "low", AckStage.READ)
        await _submit(h, "high", "w", priority=-5)
        h.clock.advance(1)  # no yield by the safe-point timeout: terminate
        await _sched(h).fire_due()
        assert _state(h) == "RUNNING"
        await _ack(h, "low", AckStage.FULFILLED, note="terminated")
        low = await _task(h, "low")
        assert (low.state, low.error_code) == ("FAILED", "forced_preemption")
        assert ([t.task_id for t in _sched(h).holding("w")], _state(h)) == (["high"], "RUNNING")
        await _ack(h, "high", AckStage.READ)
        await _ack(h, "high", AckStage.FULFILLED)
        assert (_state(h), await _moves(h)) == ("RUNNABLE", _ROUND)


async def test_a_suspended_agent_steps_as_before(h: EngineHarness) -> None:
    """Suspension is the agent's, not its window's: SUSPENDED keeps its task and takes no
    other; resumed, its task's end brings it back to RUNNABLE at once (RESTORED, COMPLETE,
    REPORTED) and the waiting task is assigned to it anew."""
    await _agent(h, "w")
    await _submit(h, "t0", "w")
    await _submit(h, "t1", "w")
    await _ack(h, "t0", AckStage.READ)
    await _sched(h).suspend_agent("w")
    assert (_state(h), [t.task_id for t in _sched(h).holding("w")]) == ("SUSPENDED", ["t0"])
    await _sched(h).resume_agent("w")
    assert _state(h) == "RESUMED"
    await _ack(h, "t0", AckStage.FULFILLED)
    assert ([t.task_id for t in _sched(h).holding("w")], _state(h)) == (["t1"], "SCHEDULED")
    await _ack(h, "t1", AckStage.READ)
    await _ack(h, "t1", AckStage.FULFILLED)
    assert await _moves(h) == [
        *_ROUND[:2], ("RUNNING", "SUSPENDED"), ("SUSPENDED", "RESUMED"), ("RESUMED", "RUNNING"),
        ("RUNNING", "COMPLETED"), ("COMPLETED", "RUNNABLE"), *_ROUND,
    ]  # fmt: skip
    assert _state(h) == "RUNNABLE"


async def test_a_window_of_several_steps_only_when_it_empties_or_fills() -> None:
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1)) as h:
        await _agent(h, "w", task_concurrency=2)
        for n in range(N):
            await _submit(h, f"t{n}", "w")
        assert len(_sched(h).holding("w")) == 3  # 2 + 1 prefetched
        order = list(range(N))
        for n in order:
            await _ack(h, f"t{n}", AckStage.READ)
            assert _state(h) == "RUNNING"
            await _ack(h, f"t{n}", AckStage.FULFILLED)
            assert _state(h) == ("RUNNING" if n < N - 1 else "RUNNABLE")
        assert await _moves(h) == _ROUND


@pytest.mark.conformance("lifecycle.runnable.accept-assignments")
async def test_the_agent_state_matches_its_window_after_every_call() -> None:
    """Random submissions, READs, results and failures over agents of windows 1 to 3 and a
    shared queue: whenever a Scheduler call has returned, an agent that holds nothing is not
    SCHEDULED or RUNNING, one that runs a task is RUNNING, and one that holds only tasks not
    yet started is SCHEDULED or RUNNING; each agent's transitions alternate between idle and
    busy (no round within a busy stretch)."""
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1)) as h:
        agents = ("a", "b", "c")
        for n, agent in enumerate(agents, start=1):
            await _agent(h, agent, "review", task_concurrency=n)
        rng = random.Random(11)
        scheduler = _sched(h)
        for step in range(300):
            roll = rng.random()
            held = [t for a in agents for t in scheduler.holding(a)]
            if roll < 0.35 or not held:
                target = rng.choice(["", *agents])
                capability = "review" if not target else ""
                await _submit(h, f"t{step}", target, capability=capability)
            else:
                task = rng.choice(held)
                if task.state == "DISPATCHED":
                    await _ack(h, task.task_id, AckStage.READ)
                else:
                    stage = AckStage.FULFILLED if rng.random() < 0.8 else AckStage.FAILED
                    await _ack(h, task.task_id, stage)
            for agent in agents:
                _check_window(scheduler, agent)
        for agent in agents:
            moves = await _moves(h, agent)
            assert all(move in _ROUND for move in moves), moves


def _check_window(scheduler: Scheduler, agent: str) -> None:
    held = scheduler.holding(agent)
    state = scheduler.lifecycles.state(agent)
    assert state is not None
    if not held:
        assert state.value == "RUNNABLE", (agent, state)
    elif any(t.state == "RUNNING" for t in held):
        assert state.value == "RUNNING", (agent, state, held)
    else:
        assert state.value in ("SCHEDULED", "RUNNING"), (agent, state, held)
