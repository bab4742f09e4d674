"""The in-memory agent registry (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.records import AgentRecord
from apiary.store.memory.copies import json_copy
from apiary.store.memory.events import MemoryEventLog


class MemoryAgentStore:
    """`AgentStore` over a dict; events that commit with a change go to `log`."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._agents: dict[str, AgentRecord] = {}
        self._log = log

    async def put(self, agent: AgentRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the agent with this agent_id, appending `events` with it."""
        stored = self._copy(agent)
        drafts = self._log.checked(events)
        self._agents[agent.agent_id] = stored
        self._log.append_now(drafts)

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        agent = self._agents.get(agent_id)
        return None if agent is None else self._copy(agent)

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        return [self._copy(self._agents[key]) for key in sorted(self._agents)]

    async def delete(self, agent_id: str, events: Sequence[EventDraft] = ()) -> bool:
        """Remove the agent; False when it was not there. `events` are appended with the
        removal: with events, an agent that is not there raises LookupError instead."""
        drafts = self._log.checked(events)
        if agent_id not in self._agents:
            if drafts:
                raise LookupError(f"no agent {agent_id!r}")
            return False
        del self._agents[agent_id]
        self._log.append_now(drafts)
        return True

    @staticmethod
    def _copy(agent: AgentRecord) -> AgentRecord:
        return dataclasses.replace(agent, descriptor=json_copy(agent.descriptor))
