"""The agent lifecycle engine with its Scheduler side recorded: the harness the lifecycle
tests share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleState
from apiary.core.events import EventFilter
from apiary.engine.eventlog import EventRecorder
from apiary.engine.lifecycle import Lifecycles, LifecycleSettings
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


def moves(transitions: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(t["from"], t["input"], t["to"]) for t in transitions]
