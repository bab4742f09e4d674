"""Join/leave notifications and coordinator-emitted heartbeats (RFC 14).

Participants keep local discovery state from what they are sent: every agent receives the
current directory each time its delivery stream opens, and, while the stream is open, every
registration, deregistration and loss of availability as it happens. An agent that is not
connected is sent nothing: it could not read the notices, which would pile up in its inbox
(one per other agent's join, O(agents^2) rows for a fleet starting up) and expire after
`notice_ttl_s` anyway; the directory it gets on connecting replaces them all, however long
it was away (docs/decisions.md, "Presence").

The coordinator sends each connected agent a HEARTBEAT notice every interval; an agent that
has not answered (RegistryService.Heartbeat) within the timeout for `debounce` consecutive
checks is marked UNAVAILABLE (connected or not) and never deregistered: deregistration is
explicit only. The listeners `on_lost` names hear of it (the Scheduler fails the agent's
lifecycle and requeues its shared tasks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from apiary.core.agent_state import UNAVAILABLE
from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.core.records import AgentRecord
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router

Sleep = Callable[[float], Awaitable[None]]
LostListener = Callable[[str, str], Awaitable[None]]
"""Called with an agent's id and why when it is marked UNAVAILABLE."""


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
        self._lost_listeners: list[LostListener] = []
        self._order = asyncio.Lock()
        """Held while an announcement or a directory is admitted (see `connected`)."""
        self.judges: Callable[[str], bool] | None = None
        """Cluster mode only: whether this replica judges an agent's heartbeats (its
        partition's owner does); None, the default: every agent's."""

    async def _broadcast(self, body: dict[str, Any], skip: str, directory_to: str = "") -> None:
        """`body` to every connected agent but `skip`, and the directory to `directory_to`
        if given: one admission (one durable write) for all of them, not one per agent."""
        async with self._order:
            notices = [
                Outbound(self._notices.notification(body), agent.agent_id)
                for agent in await self._registry.list()
                if agent.agent_id != skip and self._router.streaming(agent.agent_id)
            ]
            if directory_to:
                notices.append(Outbound(await self._directory(), directory_to))
            if notices:
                await self._router.send_many(notices)

    async def _directory(self) -> Envelope:
        agents = await self._registry.list()
        return self._notices.notification(
            {"event": "directory", "agents": [_summary(a) for a in agents]}
        )

    def on_lost(self, listener: LostListener) -> None:
        """Call `listener(agent_id, reason)` whenever an agent is marked UNAVAILABLE."""
        self._lost_listeners.append(listener)

    async def connected(self, agent_id: str) -> None:
        """`agent_id`'s stream has opened: send it the current directory. Under the same
        lock as the announcements, so that one made after this directory was read reaches
        its stream after it (and one made before is in it)."""
        async with self._order:
            await self._router.send_many([Outbound(await self._directory(), agent_id)])

    async def joined(self, agent: AgentRecord) -> None:
        """Announce `agent` to the connected agents; it gets the directory itself when its
        stream opens (now, if it re-registered while connected)."""
        self._misses.pop(agent.agent_id, None)
        connected = self._router.streaming(agent.agent_id)
        await self._broadcast(
            {"event": "agent_joined", "agent": _summary(agent)}, agent.agent_id,
            agent.agent_id if connected else "",
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
        beats = [
            Outbound(self._notices.heartbeat(a.agent_id), a.agent_id)
            for a in agents
            if self._router.streaming(a.agent_id)
        ]
        if beats:
            await self._router.send_many(beats)
        judges = self.judges
        for agent in agents:
            if judges is not None and not judges(agent.agent_id):
                self._misses.pop(agent.agent_id, None)
                continue
            quiet = now - agent.last_heartbeat_at > self.settings.heartbeat_timeout_s
            if not quiet:
                self._misses.pop(agent.agent_id, None)
                continue
            misses = self._misses[agent.agent_id] = self._misses.get(agent.agent_id, 0) + 1
            if misses >= self.settings.debounce and agent.state != UNAVAILABLE:
                reason = f"{misses} missed heartbeats"
                await self._registry.set_state(agent.agent_id, UNAVAILABLE, reason)
                await self._broadcast(
                    {"event": "agent_unavailable", "agent_id": agent.agent_id}, agent.agent_id
                )
                for listener in self._lost_listeners:
                    await listener(agent.agent_id, reason)

    async def run(self, sleep: Sleep) -> None:
        while True:
            await sleep(self.settings.heartbeat_interval_s)
            await self.tick()
