"""Join/leave notifications and coordinator-emitted heartbeats (RFC 14).

Every registration and deregistration is announced to all other registered agents, and a
new agent receives the current directory, so participants can keep local discovery state.
The coordinator sends each agent a HEARTBEAT notice every interval; an agent that has not
answered (RegistryService.Heartbeat) within the timeout for `debounce` consecutive checks
is marked UNAVAILABLE — never deregistered: deregistration is explicit only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from apiary.core.clock import Clock
from apiary.core.records import AgentRecord
from apiary.engine.admission import Outbound
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.registry import UNAVAILABLE, Registry
from apiary.engine.router import Router

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PresenceSettings:
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 15.0
    """An agent must answer a heartbeat within this long (RFC 14)."""
    debounce: int = 3
    """Consecutive missed checks before an agent is marked UNAVAILABLE."""


def _summary(agent: AgentRecord) -> dict[str, Any]:
    return {
        "agent_id": agent.agent_id,
        "name": agent.name,
        "capabilities": list(agent.descriptor.get("capabilities", [])),
        "state": agent.state,
    }


class Presence:
    def __init__(
        self,
        registry: Registry,
        router: Router,
        notices: NoticeFactory,
        events: EventRecorder,
        clock: Clock,
        settings: PresenceSettings | None = None,
    ) -> None:
        self.settings = settings or PresenceSettings()
        self._registry = registry
        self._router = router
        self._notices = notices
        self._events = events
        self._clock = clock
        self._misses: dict[str, int] = {}

    async def _broadcast(self, body: dict[str, Any], skip: str, *extra: Outbound) -> None:
        """`body` to every registered agent but `skip`, and `extra`: one admission (one
        durable write) for all of them, not one per agent."""
        notices = [
            Outbound(self._notices.notification(body), agent.agent_id)
            for agent in await self._registry.list()
            if agent.agent_id != skip
        ]
        await self._router.send_many([*notices, *extra])

    async def joined(self, agent: AgentRecord) -> None:
        self._misses.pop(agent.agent_id, None)
        agents = await self._registry.list()
        directory = self._notices.notification(
            {"event": "directory", "agents": [_summary(a) for a in agents]}
        )
        await self._broadcast(
            {"event": "agent_joined", "agent": _summary(agent)}, agent.agent_id,
            Outbound(directory, agent.agent_id),
        )  # fmt: skip

    async def left(self, agent_id: str, reason: str) -> None:
        self._misses.pop(agent_id, None)
        await self._broadcast(
            {"event": "agent_left", "agent_id": agent_id, "reason": reason}, agent_id
        )

    async def tick(self) -> None:
        """One heartbeat round: send heartbeats, then judge who has gone quiet."""
        now = self._clock.now()
        agents = await self._registry.list()
        await self._router.send_many(
            [Outbound(self._notices.heartbeat(a.agent_id), a.agent_id) for a in agents]
        )
        for agent in agents:
            quiet = now - agent.last_heartbeat_at > self.settings.heartbeat_timeout_s
            if not quiet:
                self._misses.pop(agent.agent_id, None)
                continue
            misses = self._misses[agent.agent_id] = self._misses.get(agent.agent_id, 0) + 1
            if misses >= self.settings.debounce and agent.state != UNAVAILABLE:
                await self._registry.set_state(
                    agent.agent_id, UNAVAILABLE, f"{misses} missed heartbeats"
                )
                await self._broadcast(
                    {"event": "agent_unavailable", "agent_id": agent.agent_id}, agent.agent_id
                )

    async def run(self, sleep: Sleep) -> None:
        while True:
            await sleep(self.settings.heartbeat_interval_s)
            await self.tick()
