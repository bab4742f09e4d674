"""The storage protocols every backend implements (DESIGN.md section 6).

Each aggregate has a small async protocol; a `Store` bundles them. One conformance suite
(`apiary.testing.store_suite`) runs against every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import AgentRecord, MessageState, StoredMessage


class EventLog(Protocol):
    """Append-only event log with gap-free sequence numbers starting at 1."""

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        ...

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        ...

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        ...


class AgentStore(Protocol):
    async def put(self, agent: AgentRecord) -> None:
        """Insert or replace the agent with this agent_id."""
        ...

    async def get(self, agent_id: str) -> AgentRecord | None: ...

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        ...

    async def delete(self, agent_id: str) -> bool:
        """Remove the agent; False when it was not there."""
        ...


class MessageStore(Protocol):
    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message; returns it with its inbox offset assigned.

        The store assigns `offset` (the input's offset is ignored): strictly increasing per
        recipient from 1, with no gaps. Raises `apiary.store.errors.DuplicateMessageError` when
        a message with the same message_id exists; nothing changes then.
        """
        ...

    async def get(self, message_id: str) -> StoredMessage | None: ...

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        ...

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        ...

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        ...


class Store(Protocol):
    """One backend: every aggregate over one connection pool / file / process memory."""

    @property
    def events(self) -> EventLog: ...

    @property
    def agents(self) -> AgentStore: ...

    @property
    def messages(self) -> MessageStore: ...

    @property
    def backend(self) -> str:
        """'memory', 'sqlite' or 'postgresql'."""
        ...
