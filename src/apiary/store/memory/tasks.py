"""The in-memory task records (part of `MemoryStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.records import TaskRecord
from apiary.store.errors import StoreError, TaskExistsError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.tasks import task_from_row, task_row


class MemoryTaskStore:
    """`TaskStore` over a dict keyed by task_id, and one keyed by seq (the unique index)."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._records: dict[str, TaskRecord] = {}
        self._task_by_seq: dict[int, str] = {}
        self._log = log

    async def put(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this task_id, appending `events` with it;
        StoreError when its seq belongs to another task (as the SQL backends' unique index
        refuses it)."""
        stored = self.checked(record)
        drafts = self._log.checked(events)
        self.put_now(stored)
        self._log.append_now(drafts)

    async def create(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert a new task, appending `events` with it; TaskExistsError (nothing stored)
        when its task_id is taken."""
        await self.create_many([record], events)

    async def create_many(
        self, records: Sequence[TaskRecord], events: Sequence[EventDraft] = ()
    ) -> None:
        """Insert new tasks (distinct task_ids), all or none, appending `events` with them;
        TaskExistsError (nothing stored) naming the first whose task_id is taken."""
        for record in records:
            if record.task_id in self._records:
                raise TaskExistsError(record.task_id)
        stored = [self.checked(record) for record in records]
        seqs = [record.seq for record in stored]
        if len(set(seqs)) < len(seqs):
            raise StoreError(f"two of the tasks share a seq: {sorted(seqs)}")
        drafts = self._log.checked(events)
        for record in stored:
            self.put_now(record)
        self._log.append_now(drafts)

    def has(self, task_id: str) -> bool:
        """Whether a task with this id is stored."""
        return task_id in self._records

    def checked(self, record: TaskRecord) -> TaskRecord:
        """`record` as stored; what the SQL backends refuse raises (ValueError, StoreError
        when its seq belongs to another task, as their unique index refuses it)."""
        # Through the SQL row and back: refuses what the SQL backends refuse and coerces as
        # they do (bytearray params become bytes, an int submitted_at a float).
        stored = task_from_row(task_row(record))
        holder = self._task_by_seq.get(stored.seq)
        if holder is not None and holder != stored.task_id:
            raise StoreError(f"seq {stored.seq} already belongs to task {holder!r}")
        return stored

    def put_now(self, stored: TaskRecord) -> None:
        """Store a `checked` record (another aggregate's write stores it this way, in the
        same step as its own change)."""
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
        queue: str | None = None,
        submitter: str | None = None,
    ) -> list[TaskRecord]:
        """Records in `states` (all when None) for `agent_id` (all when None) in `queue`
        (all when None) submitted by `submitter` (all when None) with seq above
        `after_seq`, in seq order, at most `limit`."""
        check_limit(limit)
        found: list[TaskRecord] = []
        for seq in sorted(s for s in self._task_by_seq if s > after_seq):
            if len(found) >= limit:
                break
            record = self._records[self._task_by_seq[seq]]
            if (
                (states is None or record.state in states)
                and (agent_id is None or record.agent_id == agent_id)
                and (queue is None or record.queue == queue)
                and (submitter is None or record.submitter == submitter)
            ):
                found.append(record)
        return found

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""
        return max(self._task_by_seq, default=-1)
