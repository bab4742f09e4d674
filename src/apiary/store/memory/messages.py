"""The in-memory message inboxes (part of `MemoryStore`)."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence

from apiary.core.admission_bounds import counts, exceeding
from apiary.core.dedup import advance, unchanged
from apiary.core.events import EventDraft
from apiary.core.records import (
    AdmissionWrites,
    MessageState,
    StateChange,
    StoredMessage,
    TaskRecord,
    TokenProgress,
    changed,
)
from apiary.store.errors import (
    AdmissionRefusal,
    BoundExceededError,
    DuplicateMessageError,
    RequeuedError,
    StaleStateError,
    TaskExistsError,
    TokenTakenError,
)
from apiary.store.memory.dlq import MemoryDlqStore
from apiary.store.memory.events import MemoryEventLog
from apiary.store.memory.idempotency import MemoryIdempotencyStore
from apiary.store.memory.tasks import MemoryTaskStore
from apiary.store.sql.checks import check_limit
from apiary.store.sql.message_rows import message_values


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
    """`MessageStore` over a dict of messages and one `_Inbox` per recipient; what commits
    with a change goes to `log` and `tokens` in the same step."""

    def __init__(
        self, log: MemoryEventLog, tokens: MemoryIdempotencyStore, tasks: MemoryTaskStore,
        dlq: MemoryDlqStore,
    ) -> None:  # fmt: skip
        self._messages: dict[str, StoredMessage] = {}
        self._inboxes: dict[str, _Inbox] = {}
        self._log = log
        self._tokens = tokens
        self._tasks = tasks
        self._dlq = dlq

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Record a new message with the recipient's next inbox offset."""
        return self._admit(message)

    async def admit_many(
        self,
        messages: Sequence[StoredMessage],
        writes: Sequence[AdmissionWrites] = (),
        events: Sequence[EventDraft] = (),
    ) -> list[StoredMessage | AdmissionRefusal]:
        """Admit each message as `admit` does; a duplicate (of a stored message or of an
        earlier member), or a member whose token was taken or whose dead letter was
        requeued, fails only its own member.
        `writes` go in with the members admitted, after `events`, which go in any case."""
        for message in messages:
            message_values(message)  # validate every member before admitting any
        lead = self._log.checked(events)
        extras = [  # (every write checked too)
            (
                self._log.checked(w.events),
                None if w.idempotency is None else self._tokens.checked(w.idempotency),
                None if w.task is None else self._tasks.checked(w.task),
            )
            for w in writes
        ]
        outcomes: list[StoredMessage | AdmissionRefusal]
        outcomes = []
        appended: list[EventDraft] = lead
        for i, message in enumerate(messages):
            if writes and message.message_id not in self._messages:
                refused = self._refused(message, writes[i])
                if refused is not None:
                    outcomes.append(refused)
                    continue
            try:
                outcomes.append(self._admit(message))
            except DuplicateMessageError as duplicate:
                outcomes.append(duplicate)
                continue
            if extras:
                drafts, token, task = extras[i]
                appended.extend(drafts)
                if token is not None:
                    self._tokens.put_now(token)
                if task is not None:
                    self._tasks.put_now(task)
        self._log.append_now(appended)
        return outcomes

    def _refused(
        self, message: StoredMessage, writes: AdmissionWrites
    ) -> TokenTakenError | RequeuedError | BoundExceededError | TaskExistsError | None:
        """The refusal of `message` (new) when its token's record is not the one its
        admission found (`core.dedup.unchanged`) or the dead letter it requeues was requeued
        before, or it is past a limit it is held to (`AdmissionWrites.bound`), or its new
        task's id is stored already (`AdmissionWrites.task_new`); None when it may be
        admitted (its dead letter is marked then)."""
        bound = writes.bound
        if bound is not None:
            member = (0, message.recipient, message.producer_id, bound)
            over = exceeding([member], *self._held(message.recipient, bound.queued > 0))
            if over:
                return BoundExceededError(message.message_id, *over[0])
        task = writes.task
        if writes.task_new and task is not None and self._tasks.has(task.task_id):
            return TaskExistsError(task.task_id)
        token = writes.idempotency
        if token is not None and not writes.idempotency_forced:
            stored = self._tokens.get_now(token.token)
            if not unchanged(stored, writes.idempotency_found):
                assert stored is not None
                return TokenTakenError(message.message_id, stored)
        entry = writes.requeues
        if entry and not self._dlq.requeue_now(entry, message.created_at, message.message_id):
            return RequeuedError(message.message_id, entry)
        return None

    def _held(
        self, recipient: str, every: bool
    ) -> tuple[dict[str, int], dict[tuple[str, str], int], int]:
        """What `recipient`'s stored messages occupy and hold, and (`every`) how many of
        every recipient's occupy buffer space (`core.admission_bounds`)."""
        buffered: dict[str, int] = {}
        in_flight: dict[tuple[str, str], int] = {}
        queued = 0
        for m in self._messages.values():
            if m.recipient != recipient:
                if every:
                    queued += counts(m.producer_id, m.message_type, m.state)[0]
                continue
            occupies, holds = counts(m.producer_id, m.message_type, m.state)
            queued += occupies
            if occupies:
                buffered[recipient] = buffered.get(recipient, 0) + 1
            if holds:
                pair = (recipient, m.producer_id)
                in_flight[pair] = in_flight.get(pair, 0) + 1
        return buffered, in_flight, queued

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

    async def apply(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> list[StoredMessage]:
        """Apply state changes in order, appending `events`, the idempotency records'
        progress `tokens` (core/dedup.py `advance`, each step's event appended when it
        changed the cached outcome) and the task records `tasks` with them; unknown ids raise
        LookupError and apply nothing."""
        for change in changes:
            if change.message_id not in self._messages:
                raise LookupError(f"no message {change.message_id!r}")
        self._check_expected(changes)
        drafts = self._log.checked(events)
        steps = [(t, self._log.checked([t.cached])[0] if t.cached else None) for t in tokens]
        records = [self._tasks.checked(task) for task in tasks]
        applied: list[StoredMessage] = []
        for change in changes:
            current = self._messages[change.message_id]
            after = changed(current, change)
            self._messages[change.message_id] = after
            applied.append(after)
        for step, cached in steps:
            updated, outcome = advance(self._tokens.get_now(step.key), step)
            if updated is not None:
                self._tokens.put_now(self._tokens.checked(updated))
            if outcome and cached is not None:
                drafts.append(cached)
        for record in records:
            self._tasks.put_now(record)
        self._log.append_now(drafts)
        return applied

    def _check_expected(self, changes: Sequence[StateChange]) -> None:
        """StaleStateError when a change's message will not be in the state the change
        expects when its turn comes (`StateChange.expected`)."""
        states = {c.message_id: self._messages[c.message_id].state for c in changes}
        stale = []
        for change in changes:
            if change.expected and states[change.message_id] != change.expected:
                stale.append(change.message_id)
            states[change.message_id] = change.state
        if stale:
            raise StaleStateError(stale)

    async def record(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> None:
        """Apply state changes as `apply` does, without the answer."""
        await self.apply(changes, events, tokens, tasks)

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
