"""The in-memory agent registry (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses

from apiary.core.records import AgentRecord
from apiary.store.memory.copies import json_copy


class MemoryAgentStore:
    """`AgentStore` over a dict."""

    def __init__(self) -> None:
        self._agents: dict[str, AgentRecord] = {}

    async def put(self, agent: AgentRecord) -> None:
        """Insert or replace the agent with this agent_id."""
        self._agents[agent.agent_id] = dataclasses.replace(
            agent, descriptor=json_copy(agent.descriptor)
        )

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        agent = self._agents.get(agent_id)
        return None if agent is None else self._copy(agent)

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        return [self._copy(self._agents[key]) for key in sorted(self._agents)]

    async def delete(self, agent_id: str) -> bool:
        """Remove the agent; False when it was not there."""
        return self._agents.pop(agent_id, None) is not None

    @staticmethod
    def _copy(agent: AgentRecord) -> AgentRecord:
        return dataclasses.replace(agent, descriptor=json_copy(agent.descriptor))
