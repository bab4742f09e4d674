"""The agent lifecycle in the engine: its event log, the hooks into the Scheduler and its loop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleState
from apiary.core.events import EventFilter
from apiary.engine.eventlog import EventRecorder
from apiary.engine.lifecycle import Lifecycles, LifecycleSettings
from apiary.errors import NotFoundError
from apiary.store.memory.store import MemoryStore
from apiary.testing.clock import FakeClock

S = AgentLifecycleState
I = AgentInput  # noqa: E741


@dataclass
class RecordingHooks:
    """The Scheduler's side, recorded call by call; `failing` hooks raise."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def _called(self, *call: Any) -> None:
        self.calls.append(call)
        if call[0] in self.failing:
            raise RuntimeError(f"{call[0]} is down")

    async def notify_agent(self, agent_id: str, command: str, body: dict[str, Any]) -> None:
        self._called("notify_agent", agent_id, command, body)

    async def stop_dispatch(self, agent_id: str) -> None:
        self._called("stop_dispatch", agent_id)

    async def abandon_task(self, agent_id: str, error_code: str) -> None:
        self._called("abandon_task", agent_id, error_code)

    async def release_resources(self, agent_id: str, reason: str) -> None:
        self._called("release_resources", agent_id, reason)

    async def deregister(self, agent_id: str, reason: str) -> None:
        self._called("deregister", agent_id, reason)

    async def escalate(self, agent_id: str, state: AgentLifecycleState, reason: str) -> None:
        self._called("escalate", agent_id, state, reason)

    def take(self) -> list[tuple[Any, ...]]:
        taken, self.calls = self.calls, []
        return taken


@dataclass
class Harness:
    clock: FakeClock
    events: EventRecorder
    hooks: RecordingHooks
    lifecycles: Lifecycles
    start: float

    async def transitions(self, agent_id: str = "a") -> list[dict[str, Any]]:
        where = EventFilter(agent_id=agent_id, event_types=frozenset({"agent.lifecycle"}))
        return [dict(e.details) for e in await self.events.read(limit=10_000, where=where)]

    async def events_of(self, event_type: str) -> list[dict[str, Any]]:
        where = EventFilter(event_types=frozenset({event_type}))
        return [dict(e.details) for e in await self.events.read(limit=10_000, where=where)]

    async def at(self, seconds: float) -> int:
        """Advance to `seconds` after the start and fire what is due."""
        self.clock.advance(self.start + seconds - self.clock.now())
        return await self.lifecycles.fire_due()

    async def running(self, agent_id: str = "a", agent_type: str = "worker") -> None:
        """Register the agent and bring it to RUNNING, then forget the calls and events."""
        await self.lifecycles.registered(agent_id, agent_type)
        await self.lifecycles.ready(agent_id)
        await self.lifecycles.apply(agent_id, I.SCHEDULE)
        await self.lifecycles.apply(agent_id, I.START)
        self.hooks.take()


def make(settings: LifecycleSettings | None = None) -> Harness:
    clock = FakeClock()
    events = EventRecorder(MemoryStore().events, clock)
    hooks = RecordingHooks()
    return Harness(clock, events, hooks, Lifecycles(events, clock, hooks, settings), clock.now())


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    yield make()


def moves(transitions: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(t["from"], t["input"], t["to"]) for t in transitions]


# --- the log, the hooks and the loop --------------------------------------------------------


@pytest.mark.conformance("lifecycle.timeouts.log-transitions")
async def test_every_transition_is_logged_and_timeouts_say_so(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    await h.at(60)  # INIT_TIMEOUT, RECOVER
    await lc.ready("a")
    await lc.apply("a", I.SCHEDULE)
    await lc.apply("a", I.START)
    await lc.apply("a", I.RESOURCES_NEEDED)
    await h.at(360)  # RESOURCE_TIMEOUT, RECOVER
    await lc.shutdown("a", 1.0)
    await h.at(361)  # SHUTDOWN_TIMEOUT
    transitions = await h.transitions()
    assert [t["input"] for t in transitions] == [
        "", "INIT_TIMEOUT", "RECOVER", "RECOVERED", "SCHEDULE", "START", "RESOURCES_NEEDED",
        "RESOURCE_TIMEOUT", "RECOVER", "SHUTDOWN", "SHUTDOWN_TIMEOUT",
    ]  # fmt: skip
    for previous, current in itertools.pairwise(transitions):
        assert current["from"] == previous["to"]  # a chain: no transition unlogged
    timed = [t["input"] for t in transitions if t["timeout"]]
    assert timed == ["INIT_TIMEOUT", "RESOURCE_TIMEOUT", "SHUTDOWN_TIMEOUT"]
    assert all(t["error_code"] for t in transitions if t["to"] == "FAILED")


async def test_a_failing_hook_does_not_stop_the_others(h: Harness) -> None:
    h.hooks.failing = {"abandon_task", "notify_agent"}
    lc = h.lifecycles
    await h.running()
    await lc.report("a", S.FAILED, error_code="oom")
    calls = [c[0] for c in h.hooks.take()]
    assert calls == ["abandon_task", "release_resources", "notify_agent"]
    assert lc.state("a") is S.RECOVERING
    failures = await h.events_of("agent.lifecycle_effect_failed")
    assert [f["effect"] for f in failures] == ["ABANDON_TASK", "NOTIFY_AGENT"]
    assert "abandon_task is down" in failures[0]["error"]


async def test_reports_map_to_the_agents_own_inputs_and_ignore_the_rest(h: Harness) -> None:
    lc = h.lifecycles
    await lc.registered("a", "worker")
    assert await lc.report("a", S.SCHEDULED) is None  # Scheduler-driven: ignored
    assert await lc.report("a", S.INITIALIZING) is None  # a plain heartbeat
    assert lc.state("a") is S.INITIALIZING
    await lc.report("a", S.RUNNABLE)
    await lc.apply("a", I.SCHEDULE)
    await lc.apply("a", I.START)
    assert await lc.report("a", S.SHUTTING_DOWN) is None
    assert await lc.report("a", S.COMPLETED) is None
    step = await lc.report("a", S.WAITING)
    assert step is not None and step.input is I.WAIT
    await lc.report("a", S.RUNNING)
    await lc.report("a", S.FAILED, error_code="oom")
    transitions = await h.transitions()
    assert moves(transitions)[1:] == [
        ("INITIALIZING", "INITIALIZED", "RUNNABLE"),
        ("RUNNABLE", "SCHEDULE", "SCHEDULED"),
        ("SCHEDULED", "START", "RUNNING"),
        ("RUNNING", "WAIT", "WAITING"),
        ("WAITING", "INPUT_RECEIVED", "RUNNING"),
        ("RUNNING", "FAIL", "FAILED"),
        ("FAILED", "RECOVER", "RECOVERING"),
    ]
    assert transitions[6]["error_code"] == "oom"
    assert ("abandon_task", "a", "oom") in h.hooks.calls


async def test_an_unknown_agent_is_not_found(h: Harness) -> None:
    lc = h.lifecycles
    for call in (
        lc.apply("ghost", I.SCHEDULE), lc.ready("ghost"), lc.report("ghost", S.RUNNABLE),
        lc.shutdown("ghost", 5.0),
    ):  # fmt: skip
        with pytest.raises(NotFoundError):
            await call
    assert lc.state("ghost") is None and lc.entered_at("ghost") is None
    assert not lc.accepts_tasks("ghost")
    assert await lc.deregistered("ghost") is None


async def test_a_forgotten_agents_timer_never_fires(h: Harness) -> None:
    await h.lifecycles.registered("a", "worker")
    h.lifecycles.forget("a")
    assert h.lifecycles.next_deadline() is None
    assert await h.at(3600) == 0
    assert h.hooks.calls == []


async def test_the_loop_fires_deadlines_as_the_clock_reaches_them(h: Harness) -> None:
    lc = h.lifecycles
    runner = asyncio.create_task(lc.run(h.clock.sleep))
    try:
        await lc.registered("a", "worker")
        while h.clock.next_deadline is None:  # noqa: ASYNC110 - the loop waits on the fake clock
            await asyncio.sleep(0)
        h.clock.advance(60)

        async def recovering() -> None:
            while lc.state("a") is not S.RECOVERING:  # noqa: ASYNC110
                await asyncio.sleep(0)

        await asyncio.wait_for(recovering(), 5)
        assert lc.next_deadline() == h.start + 180
    finally:
        runner.cancel()
