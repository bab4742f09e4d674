"""Agent registry: registration, heartbeats, deregistration, discovery reads.

Foundation scope: descriptors are stored and events recorded; the descriptor validation
rules and heartbeat timeouts of RFC section 14 arrive with the registry area (issue 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apiary.core.clock import Clock
from apiary.core.records import AgentRecord
from apiary.engine.eventlog import EventRecorder
from apiary.errors import NotFoundError, ValidationError
from apiary.store.protocols import AgentStore


class Registry:
    def __init__(self, agents: AgentStore, events: EventRecorder, clock: Clock) -> None:
        self._agents = agents
        self._events = events
        self._clock = clock

    async def register(self, descriptor: Mapping[str, Any]) -> AgentRecord:
        """Register (or re-register) the agent the descriptor describes."""
        agent_id = str(descriptor.get("agent_id") or "")
        if not agent_id:
            raise ValidationError("agent.agent_id is required", {"field": "agent.agent_id"})
        now = self._clock.now()
        previous = await self._agents.get(agent_id)
        record = AgentRecord(
            agent_id=agent_id,
            name=str(descriptor.get("name") or agent_id),
            state="RUNNABLE",
            registered_at=previous.registered_at if previous else now,
            last_heartbeat_at=now,
            descriptor=dict(descriptor),
        )
        await self._agents.put(record)
        await self._events.record(
            "agent.registered",
            agent_id,
            agent_id=agent_id,
            name=record.name,
            reregistered=previous is not None,
        )
        return record

    async def heartbeat(self, agent_id: str, state: str, health: Mapping[str, str]) -> None:
        record = await self.get(agent_id)
        await self._agents.put(
            AgentRecord(
                agent_id=record.agent_id,
                name=record.name,
                state=state or record.state,
                registered_at=record.registered_at,
                last_heartbeat_at=self._clock.now(),
                descriptor=record.descriptor,
            )
        )

    async def deregister(self, agent_id: str, reason: str) -> bool:
        removed = await self._agents.delete(agent_id)
        if removed:
            await self._events.record(
                "agent.deregistered", agent_id, agent_id=agent_id, reason=reason
            )
        return removed

    async def get(self, agent_id: str) -> AgentRecord:
        record = await self._agents.get(agent_id)
        if record is None:
            raise NotFoundError(f"agent {agent_id!r} is not registered", {"agent_id": agent_id})
        return record

    async def find(self, agent_id: str) -> AgentRecord | None:
        return await self._agents.get(agent_id)

    async def list(self) -> list[AgentRecord]:
        return await self._agents.list()
