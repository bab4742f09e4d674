"""The in-memory backend: tests, and `--store memory://` for throwaway runs.

Nothing survives the process. It keeps the same contract as the durable backends, down to
refusing details that are not JSON, so that a test passing against it means something.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import AgentRecord, MessageState, StoredMessage
from apiary.store.errors import DuplicateMessageError
from apiary.store.json_codec import dump_json, load_json_object


def _json_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    # A round trip through JSON both validates like the SQL backends and detaches the stored
    # value from the caller's (mutable) dict.
    return load_json_object(dump_json(value))


class MemoryEventLog:
    """`EventLog` over a list: the event with sequence N is at index N - 1."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        details = [_json_copy(d.details) for d in drafts]  # validate all before changing any
        first = len(self._events) + 1
        appended = [
            dataclasses.replace(Event.from_draft(first + i, draft), details=details[i])
            for i, draft in enumerate(drafts)
        ]
        self._events.extend(appended)
        return [dataclasses.replace(e, details=_json_copy(e.details)) for e in appended]

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative: {limit}")
        found: list[Event] = []
        for event in self._events[max(after, 0) :]:
            if len(found) >= limit:
                break
            if where is None or where.matches(event):
                found.append(dataclasses.replace(event, details=_json_copy(event.details)))
        return found

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        return len(self._events)


class MemoryAgentStore:
    """`AgentStore` over a dict."""

    def __init__(self) -> None:
        self._agents: dict[str, AgentRecord] = {}

    async def put(self, agent: AgentRecord) -> None:
        """Insert or replace the agent with this agent_id."""
        self._agents[agent.agent_id] = dataclasses.replace(
            agent, descriptor=_json_copy(agent.descriptor)
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
        return dataclasses.replace(agent, descriptor=_json_copy(agent.descriptor))


class MemoryMessageStore:
    """`MessageStore` over a dict of messages and one list of message ids per inbox."""

    def __init__(self) -> None:
        self._messages: dict[str, StoredMessage] = {}
        self._inboxes: dict[str, list[str]] = {}

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Record a new message with the recipient's next inbox offset."""
        if message.message_id in self._messages:
            raise DuplicateMessageError(message.message_id)
        inbox = self._inboxes.setdefault(message.recipient, [])
        admitted = dataclasses.replace(message, offset=len(inbox) + 1)
        inbox.append(message.message_id)
        self._messages[message.message_id] = admitted
        return admitted

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        return self._messages.get(message_id)

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        current = self._messages.get(message_id)
        if current is None:
            raise LookupError(f"no message {message_id!r}")
        changed = dataclasses.replace(current, state=state, updated_at=at, error_code=error_code)
        self._messages[message_id] = changed
        return changed

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative: {limit}")
        found: list[StoredMessage] = []
        for message_id in self._inboxes.get(recipient, [])[max(after_offset, 0) :]:
            if len(found) >= limit:
                break
            message = self._messages[message_id]
            if states is None or message.state in states:
                found.append(message)
        return found

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        return sum(
            1
            for message_id in self._inboxes.get(recipient, [])
            if self._messages[message_id].state in states
        )


class MemoryStore:
    """Every aggregate in process memory. Needs no closing; `open_memory_store` exists so
    that every backend is opened the same way."""

    backend = "memory"

    def __init__(self) -> None:
        self.events = MemoryEventLog()
        self.agents = MemoryAgentStore()
        self.messages = MemoryMessageStore()


@asynccontextmanager
async def open_memory_store() -> AsyncIterator[MemoryStore]:
    """A fresh, empty in-memory store."""
    yield MemoryStore()
