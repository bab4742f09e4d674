"""The in-memory backend: tests, and `--store memory://` for throwaway runs.

Nothing survives the process. It keeps the same contract as the durable backends, down to
refusing what they refuse (details that are not JSON, sequence numbers that are not uint64:
it runs their row encoders), so that a test passing against it means something.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import (
    AgentRecord,
    DlqEntry,
    DlqFilter,
    HitlRecord,
    IdempotencyRecord,
    MessageState,
    StateChange,
    StoredMessage,
    TaskRecord,
    changed,
)
from apiary.core.tools.descriptor import ToolProviderRecord
from apiary.core.worktree_binding import WorktreeBinding
from apiary.store.errors import DuplicateMessageError, StoreError, VersionConflictError
from apiary.store.json_codec import dump_json, load_json_object
from apiary.store.memory.handoffs import MemoryHandoffStore
from apiary.store.memory.negotiations import MemoryArtifactStore, MemoryNegotiationStore
from apiary.store.memory.rooms import MemoryRoomStore
from apiary.store.memory.swarm import MemorySwarmStore
from apiary.store.memory.workflows import MemoryWorkflowStore
from apiary.store.sql_rows import (
    check_limit,
    dlq_insert_row,
    hitl_from_row,
    hitl_row,
    idempotency_row,
    message_values,
    task_from_row,
    task_row,
    worktree_from_row,
    worktree_row,
)
from apiary.store.tool_rows import provider_from_rows, provider_row, tool_rows


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


@dataclasses.dataclass(slots=True)
class _Inbox:
    """One recipient's retained messages in offset order, and the last offset handed out.

    The counter is kept apart from the lists so that purging finished messages never lets
    an offset be handed out twice (stream resumption relies on offsets only growing).
    """

    last_offset: int = 0
    offsets: list[int] = dataclasses.field(default_factory=list)
    message_ids: list[str] = dataclasses.field(default_factory=list)

    def append(self, message_id: str) -> int:
        self.last_offset += 1
        self.offsets.append(self.last_offset)
        self.message_ids.append(message_id)
        return self.last_offset

    def after(self, offset: int) -> list[str]:
        return self.message_ids[bisect.bisect_right(self.offsets, offset) :]

    def keep(self, retained: Callable[[str], bool]) -> None:
        kept = [(o, m) for o, m in zip(self.offsets, self.message_ids, strict=True) if retained(m)]
        self.offsets = [o for o, _ in kept]
        self.message_ids = [m for _, m in kept]


class MemoryMessageStore:
    """`MessageStore` over a dict of messages and one `_Inbox` per recipient."""

    def __init__(self) -> None:
        self._messages: dict[str, StoredMessage] = {}
        self._inboxes: dict[str, _Inbox] = {}

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Record a new message with the recipient's next inbox offset."""
        return self._admit(message)

    async def admit_many(
        self, messages: Sequence[StoredMessage]
    ) -> list[StoredMessage | DuplicateMessageError]:
        """Admit each message as `admit` does; a duplicate (of a stored message or of an
        earlier member) fails only its own member."""
        for message in messages:
            message_values(message)  # validate every member before admitting any
        outcomes: list[StoredMessage | DuplicateMessageError] = []
        for message in messages:
            try:
                outcomes.append(self._admit(message))
            except DuplicateMessageError as duplicate:
                outcomes.append(duplicate)
        return outcomes

    def _admit(self, message: StoredMessage) -> StoredMessage:
        if message.message_id in self._messages:
            raise DuplicateMessageError(message.message_id)
        message_values(message)  # refuse what the SQL backends refuse
        inbox = self._inboxes.setdefault(message.recipient, _Inbox())
        offset = inbox.append(message.message_id)
        admitted = dataclasses.replace(message, offset=offset, envelope=bytes(message.envelope))
        self._messages[message.message_id] = admitted
        return admitted

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        return self._messages.get(message_id)

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        return (await self.apply([StateChange(message_id, state, at, error_code)]))[0]

    async def apply(self, changes: Sequence[StateChange]) -> list[StoredMessage]:
        """Apply state changes in order; unknown ids raise LookupError and apply nothing."""
        for change in changes:
            if change.message_id not in self._messages:
                raise LookupError(f"no message {change.message_id!r}")
        applied: list[StoredMessage] = []
        for change in changes:
            current = self._messages[change.message_id]
            after = changed(current, change)
            self._messages[change.message_id] = after
            applied.append(after)
        return applied

    async def record(self, changes: Sequence[StateChange]) -> None:
        """Apply state changes as `apply` does, without the answer."""
        await self.apply(changes)

    async def finish_delivered(self, message_ids: Sequence[str], at: float) -> None:
        """One more delivery at `at`, then FULFILLED at `at` (unknown ids are ignored)."""
        for message_id in dict.fromkeys(message_ids):
            current = self._messages.get(message_id)
            if current is not None:
                self._messages[message_id] = dataclasses.replace(
                    current, deliveries=current.deliveries + 1, last_delivered_at=at
                )
        known = [m for m in dict.fromkeys(message_ids) if m in self._messages]
        await self.apply([StateChange(m, MessageState.FULFILLED, at) for m in known])

    async def record_deliveries(self, counts: Sequence[tuple[str, int, float]]) -> None:
        """Keep the larger delivery count and time of each (unknown ids are ignored)."""
        for message_id, deliveries, at in counts:
            current = self._messages.get(message_id)
            if current is not None:
                self._messages[message_id] = dataclasses.replace(
                    current, deliveries=max(current.deliveries, deliveries),
                    last_delivered_at=max(current.last_delivered_at, at),
                )  # fmt: skip

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        check_limit(limit)
        inbox = self._inboxes.get(recipient)
        found: list[StoredMessage] = []
        for message_id in [] if inbox is None else inbox.after(after_offset):
            if len(found) >= limit:
                break
            message = self._messages[message_id]
            if states is None or message.state in states:
                found.append(message)
        return found

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        inbox = self._inboxes.get(recipient)
        if inbox is None:
            return 0
        return sum(1 for m in inbox.message_ids if self._messages[m].state in states)

    async def due(self, now: float, limit: int = 500) -> list[StoredMessage]:
        """Unfinished messages whose ack_deadline or expires_at is set and <= now,
        ordered by the earlier of the two (then by message_id)."""
        check_limit(limit)
        due = [
            (at, m.message_id, m)
            for m in self._messages.values()
            if (at := _due_at(m)) and at <= now
        ]
        return [m for _, _, m in sorted(due)[:limit]]

    async def next_deadline(self) -> float | None:
        """The earliest set ack_deadline/expires_at of any unfinished message, or None."""
        return min((at for m in self._messages.values() if (at := _due_at(m))), default=None)

    async def by_sequence(self, producer_id: str, sequence_number: int) -> StoredMessage | None:
        """The newest (by created_at, then offset, then message_id) message of `producer_id`
        with that sequence number."""
        matches = [
            m
            for m in self._messages.values()
            if m.producer_id == producer_id and m.sequence_number == sequence_number
        ]
        return max(matches, key=lambda m: (m.created_at, m.offset, m.message_id), default=None)

    async def max_sequence(self, producer_id: str) -> int:
        """The highest sequence number `producer_id` has used (0 when none)."""
        numbers = [
            m.sequence_number for m in self._messages.values() if m.producer_id == producer_id
        ]
        return max(numbers, default=0)

    async def oldest_offset(self, recipient: str) -> int:
        """The lowest offset still retained in the recipient's inbox (0 when empty)."""
        inbox = self._inboxes.get(recipient)
        return inbox.offsets[0] if inbox is not None and inbox.offsets else 0

    async def purge_finished(self, before: float) -> int:
        """Delete terminal messages last updated before `before`; returns how many."""
        doomed = {
            m.message_id
            for m in self._messages.values()
            if m.state.terminal and m.updated_at < before
        }
        if not doomed:
            return 0
        recipients = {self._messages[m].recipient for m in doomed}
        for message_id in doomed:
            del self._messages[message_id]
        for recipient in recipients:
            self._inboxes[recipient].keep(lambda m: m not in doomed)
        return len(doomed)


def _due_at(message: StoredMessage) -> float:
    """When the timer loop must look at `message` (0: never), as the SQL `due_at` column."""
    if message.state.terminal:
        return 0.0
    deadlines = [d for d in (message.ack_deadline, message.expires_at) if d > 0]
    return min(deadlines, default=0.0)


class MemoryIdempotencyStore:
    """`IdempotencyStore` over a dict keyed by token."""

    def __init__(self) -> None:
        self._records: dict[str, IdempotencyRecord] = {}

    async def get(self, token: str) -> IdempotencyRecord | None:
        """The record of `token`, or None."""
        return self._records.get(token)

    async def put(self, record: IdempotencyRecord) -> None:
        """Insert or replace the record for record.token."""
        idempotency_row(record)  # refuse what the SQL backends refuse
        self._records[record.token] = dataclasses.replace(record, attempts=tuple(record.attempts))

    async def purge(self, before: float) -> int:
        """Delete records last updated before `before`; returns how many."""
        doomed = [t for t, r in self._records.items() if r.updated_at < before]
        for token in doomed:
            del self._records[token]
        return len(doomed)


class MemoryDlqStore:
    """`DlqStore` over a dict in entry_id order, numbered by a counter."""

    def __init__(self) -> None:
        self._entries: dict[int, DlqEntry] = {}
        self._last_id = 0

    async def add(self, entry: DlqEntry) -> DlqEntry:
        """Record an entry; returns it with its entry_id assigned (the given one ignored)."""
        dlq_insert_row(entry)  # refuse what the SQL backends refuse
        attempts = tuple(_json_copy(a) for a in entry.attempts)
        self._last_id += 1
        added = dataclasses.replace(
            entry, entry_id=self._last_id, attempts=attempts, envelope=bytes(entry.envelope)
        )
        self._entries[added.entry_id] = added
        return self._copy(added)

    async def get(self, entry_id: int) -> DlqEntry | None:
        """The entry, or None."""
        entry = self._entries.get(entry_id)
        return None if entry is None else self._copy(entry)

    async def list(
        self, where: DlqFilter | None = None, after_id: int = 0, limit: int = 100
    ) -> list[DlqEntry]:
        """Entries with entry_id > after_id matching `where`, ascending, at most `limit`."""
        check_limit(limit)
        found: list[DlqEntry] = []
        for entry_id, entry in self._entries.items():  # insertion order is id order
            if len(found) >= limit:
                break
            if entry_id > after_id and (where is None or where.matches(entry)):
                found.append(self._copy(entry))
        return found

    async def mark_requeued(self, entry_id: int, at: float, new_message_id: str) -> DlqEntry:
        """Record that the entry was requeued; LookupError for an unknown id."""
        entry = self._entries.get(entry_id)
        if entry is None:
            raise LookupError(f"no DLQ entry {entry_id}")
        changed = dataclasses.replace(entry, requeued_at=at, requeued_as=new_message_id)
        self._entries[entry_id] = changed
        return self._copy(changed)

    async def purge(self, before: float) -> int:
        """Delete entries that failed before `before`; returns how many."""
        doomed = [i for i, e in self._entries.items() if e.failed_at < before]
        for entry_id in doomed:
            del self._entries[entry_id]
        return len(doomed)

    @staticmethod
    def _copy(entry: DlqEntry) -> DlqEntry:
        return dataclasses.replace(entry, attempts=tuple(_json_copy(a) for a in entry.attempts))


class MemoryHitlStore:
    """`HitlStore` over a dict keyed by invocation_id."""

    def __init__(self) -> None:
        self._records: dict[str, HitlRecord] = {}

    async def put(self, record: HitlRecord) -> None:
        """Insert or replace the record with this invocation_id."""
        # Through the SQL row and back: refuses what the SQL backends refuse, coerces as
        # they do, and detaches the stored record from the caller's (mutable) mappings.
        self._records[record.invocation_id] = hitl_from_row(hitl_row(record))

    async def get(self, invocation_id: str) -> HitlRecord | None:
        """The record, or None."""
        record = self._records.get(invocation_id)
        return None if record is None else self._copy(record)

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[HitlRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then invocation_id), at most `limit`."""
        check_limit(limit)
        found = sorted(
            (r.created_at, r.invocation_id, r)
            for r in self._records.values()
            if r.created_at > after_created and (states is None or r.state in states)
        )
        return [self._copy(r) for _, _, r in found[:limit]]

    @staticmethod
    def _copy(record: HitlRecord) -> HitlRecord:
        return dataclasses.replace(
            record,
            subject=_json_copy(record.subject),
            context=_json_copy(record.context),
            decision=_json_copy(record.decision),
        )


class MemoryTaskStore:
    """`TaskStore` over a dict keyed by task_id, and one keyed by seq (the unique index)."""

    def __init__(self) -> None:
        self._records: dict[str, TaskRecord] = {}
        self._task_by_seq: dict[int, str] = {}

    async def put(self, record: TaskRecord) -> None:
        """Insert or replace the record with this task_id; StoreError when its seq belongs
        to another task (as the SQL backends' unique index refuses it)."""
        # Through the SQL row and back: refuses what the SQL backends refuse and coerces as
        # they do (bytearray params become bytes, an int submitted_at a float).
        stored = task_from_row(task_row(record))
        holder = self._task_by_seq.get(stored.seq)
        if holder is not None and holder != stored.task_id:
            raise StoreError(f"seq {stored.seq} already belongs to task {holder!r}")
        previous = self._records.get(stored.task_id)
        if previous is not None:
            del self._task_by_seq[previous.seq]
        self._records[stored.task_id] = stored
        self._task_by_seq[stored.seq] = stored.task_id

    async def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None (records hold immutable values only: no copy needed)."""
        return self._records.get(task_id)

    async def list(
        self,
        states: frozenset[str] | None = None,
        agent_id: str | None = None,
        after_seq: int = -1,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Records in `states` (all when None) for `agent_id` (all when None) with seq above
        `after_seq`, in seq order, at most `limit`."""
        check_limit(limit)
        found: list[TaskRecord] = []
        for seq in sorted(s for s in self._task_by_seq if s > after_seq):
            if len(found) >= limit:
                break
            record = self._records[self._task_by_seq[seq]]
            if (states is None or record.state in states) and (
                agent_id is None or record.agent_id == agent_id
            ):
                found.append(record)
        return found

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""
        return max(self._task_by_seq, default=-1)


class MemoryWorktreeStore:
    """`WorktreeStore` over a dict keyed by agent_id."""

    def __init__(self) -> None:
        self._records: dict[str, WorktreeBinding] = {}

    async def put(self, binding: WorktreeBinding) -> None:
        """Store `binding` when its version follows the stored one; VersionConflictError
        otherwise (nothing changes)."""
        # Through the SQL row and back: refuses and coerces as the SQL backends do.
        stored = worktree_from_row(worktree_row(binding))
        previous = self._records.get(stored.agent_id)
        expected = 1 if previous is None else previous.version + 1
        if stored.version != expected:
            held = "none" if previous is None else previous.version
            raise VersionConflictError(
                f"binding of {stored.agent_id!r} is at version {held}; "
                f"cannot write version {stored.version}"
            )
        self._records[stored.agent_id] = stored

    async def get(self, agent_id: str) -> WorktreeBinding | None:
        """The record, or None (records hold immutable values only: no copy needed)."""
        return self._records.get(agent_id)

    async def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent_id."""
        return [
            self._records[agent_id]
            for agent_id in sorted(self._records)
            if (states is None or self._records[agent_id].state in states)
            and (repo_id is None or repo_id in _repos(self._records[agent_id]))
        ]


def _repos(binding: WorktreeBinding) -> tuple[str, str]:
    return (binding.repo_id, binding.current_repo_id)


class MemoryToolStore:
    """`ToolStore` over a dict keyed by provider_id."""

    def __init__(self) -> None:
        self._records: dict[str, ToolProviderRecord] = {}

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider and all of its tools."""
        # Through the SQL rows and back: refuses and coerces as the SQL backends do.
        stored = provider_from_rows(provider_row(record), tool_rows(record))
        self._records[stored.provider_id] = stored

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        found = self._records.get(provider_id)
        return None if found is None else self._copy(found)

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""
        return [self._copy(self._records[k]) for k in sorted(self._records)]

    async def delete(self, provider_id: str) -> bool:
        return self._records.pop(provider_id, None) is not None

    @staticmethod
    def _copy(record: ToolProviderRecord) -> ToolProviderRecord:
        return dataclasses.replace(record, config=_json_copy(record.config))


class MemoryStore:
    """Every aggregate in process memory. Needs no closing; `open_memory_store` exists so
    that every backend is opened the same way."""

    backend = "memory"

    def __init__(self) -> None:
        self.events = MemoryEventLog()
        self.agents = MemoryAgentStore()
        self.messages = MemoryMessageStore()
        self.idempotency = MemoryIdempotencyStore()
        self.dlq = MemoryDlqStore()
        self.hitl = MemoryHitlStore()
        self.tasks = MemoryTaskStore()
        self.workflows = MemoryWorkflowStore()
        self.handoffs = MemoryHandoffStore()
        self.worktrees = MemoryWorktreeStore()
        self.rooms = MemoryRoomStore()
        self.tools = MemoryToolStore()
        self.artifacts = MemoryArtifactStore()
        self.negotiations = MemoryNegotiationStore(self.artifacts)
        self.swarm = MemorySwarmStore()


@asynccontextmanager
async def open_memory_store() -> AsyncIterator[MemoryStore]:
    """A fresh, empty in-memory store."""
    yield MemoryStore()
