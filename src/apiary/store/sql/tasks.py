"""The task store: the `tasks` table, one row per Scheduler task; params is a BLOB/BYTEA,
result the agent's JSON value as text (schema version 18), queue the shared queue a task
waits in and lost_attempts its attempts lost with their agent (schema version 19).

A put whose seq belongs to another task fails with StoreError (the unique index on seq)
and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain
from typing import Any, Final, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.records import TaskRecord, TaskState
from apiary.store.errors import TaskExistsError
from apiary.store.sql.bulk import chunks, rows_per_statement
from apiary.store.sql.checks import check_limit, checked_int64
from apiary.store.sql.columns import Columns
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.events import SqlEventLog, append_events
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class TaskRow(NamedTuple):
    """A row of `tasks`."""

    task_id: str
    agent_id: str
    priority: int
    submitted_at: float
    seq: int
    state: str
    updated_at: float
    scope: str
    job_key: str
    params: bytes
    content_type: str
    agent_type: str
    message_id: str
    attempts: int
    error_code: str
    note: str
    lane: str
    correlation_id: str
    submitter: str
    result: str
    queue: str
    lost_attempts: int


TASKS = Columns(TaskRow)


def task_row(record: TaskRecord) -> tuple[Any, ...]:
    """The values of the TASKS columns for `record`, in their order.

    Raises ValueError when state is not a TaskState value (every backend refuses it alike,
    rather than a scheduler reading back a state it cannot act on), or when priority, seq,
    attempts or lost_attempts does not fit the 64-bit integer both databases store.
    """
    return (
        record.task_id,
        record.agent_id,
        checked_int64("priority", record.priority),
        float(record.submitted_at),
        checked_int64("seq", record.seq),
        TaskState(record.state).value,
        float(record.updated_at),
        record.scope,
        record.job_key,
        bytes(record.params),
        record.content_type,
        record.agent_type,
        record.message_id,
        checked_int64("attempts", record.attempts),
        record.error_code,
        record.note,
        record.lane,
        record.correlation_id,
        record.submitter,
        record.result,
        record.queue,
        checked_int64("lost_attempts", record.lost_attempts),
    )


def task_from_row(fetched: Sequence[Any]) -> TaskRecord:
    """A record from its row; its state the stored text, a TaskState value (`task_row`
    refuses any other), as every backend returns it."""
    row = TASKS.of(fetched)
    return TaskRecord(
        task_id=row.task_id,
        agent_id=row.agent_id,
        priority=row.priority,
        submitted_at=row.submitted_at,
        seq=row.seq,
        state=row.state,  # type: ignore[arg-type]
        updated_at=row.updated_at,
        scope=row.scope,
        job_key=row.job_key,
        params=bytes(row.params),
        content_type=row.content_type,
        agent_type=row.agent_type,
        message_id=row.message_id,
        attempts=row.attempts,
        error_code=row.error_code,
        note=row.note,
        lane=row.lane,
        correlation_id=row.correlation_id,
        submitter=row.submitter,
        result=row.result,
        queue=row.queue,
        lost_attempts=row.lost_attempts,
    )


PUT_TASK = Execute(by_dialect(lambda d: d.upsert("tasks", TASKS, "task_id")))
"""Inserts or replaces one task (`task_row`)."""
_GET = QueryOne(f"SELECT {TASKS.sql} FROM tasks WHERE task_id = ?")
_MAX_SEQ = QueryOne("SELECT COALESCE(MAX(seq), -1) FROM tasks")
_KEPT: Final = ("seq", "agent_id")
"""Indexed columns that a task's writes after its first hardly ever change (seq never; the
agent when a shared queue's task is handed out or requeued)."""
_NARROWED: Final = frozenset({"sqlite"})
"""The dialects in which a task's write leaves `_KEPT` out of its update when they are
unchanged (`Dialect.upsert`'s `kept`: SQLite would rewrite their index entries, two of the
four B-trees a task's transition writes; PostgreSQL decides by the values)."""


@lru_cache(maxsize=64)
def _put_sql(d: Dialect, rows: int, narrowed: bool) -> str:
    kept = _KEPT if narrowed else ()
    return d.render(d.upsert("tasks", TASKS, "task_id", rows=rows, kept=kept))


def put_tasks(d: Dialect, rows: Sequence[tuple[Any, ...]]) -> Transaction[None]:
    """Insert or replace tasks (`task_row`); of several rows of one task, the last is its
    record. In SQLite, a chunk of rows whose `_KEPT` columns are as stored (or that are new)
    is one statement; one with a row that changes them, two."""
    if d.name not in _NARROWED:
        yield from ExecuteMany(PUT_TASK.sql, rows)
        return
    for count, params in chunks(d, _latest(rows), TASKS.count):
        if (yield from Execute(_put_sql(d, count, True), params)) < count:
            yield from Execute(_put_sql(d, count, False), params)


def _latest(rows: Sequence[tuple[Any, ...]]) -> Sequence[tuple[Any, ...]]:
    """The last of the rows of each task (`task_row`), in the order of their first."""
    return list({row[0]: row for row in rows}.values()) if len(rows) > 1 else rows


@lru_cache(maxsize=64)
def _upsert_sql(d: Dialect, rows: int) -> str:
    return d.upsert("tasks", TASKS, "task_id", rows=rows)


def put_tasks_and_append(
    d: Dialect, tasks: Sequence[tuple[Any, ...]], events: list[tuple[Any, ...]]
) -> Transaction[int]:
    """`put_tasks`, then `append_events` (the first event's sequence; 0 when there are no
    events): on PostgreSQL one statement when the tasks fit one (their latest rows, as
    `put_tasks` stores them), one round trip instead of two."""
    if not events:
        if tasks:
            yield from put_tasks(d, tasks)
        return 0
    if not tasks:
        return (yield from append_events(d, events))
    latest = _latest(tasks)
    if d.name in _NARROWED or len(latest) > rows_per_statement(d, TASKS.count) // 2:
        yield from put_tasks(d, tasks)
        return (yield from append_events(d, events))
    ahead = (_upsert_sql(d, len(latest)), list(chain.from_iterable(latest)))
    return (yield from append_events(d, events, ahead))


def stored_task_ids(d: Dialect, task_ids: Sequence[str]) -> Transaction[set[str]]:
    """Which of `task_ids` are stored (a handful at a time: the new tasks of one
    admission)."""
    found: set[str] = set()
    unique = list(dict.fromkeys(task_ids))
    for start in range(0, len(unique), _IDS_CHUNK):
        chunk = unique[start : start + _IDS_CHUNK]
        sql = f"SELECT task_id FROM tasks WHERE {in_list('task_id', len(chunk))}"
        found.update(row[0] for row in (yield from Query(sql, chunk)))
    return found


_IDS_CHUNK: Final = 500


@lru_cache(maxsize=64)
def _create_sql(d: Dialect, rows: int) -> str:
    return d.insert("tasks", TASKS, " ON CONFLICT (task_id) DO NOTHING", rows=rows)


def create_tasks(d: Dialect, rows: Sequence[tuple[Any, ...]]) -> Transaction[None]:
    """Insert new tasks (`task_row`, distinct task_ids), all or none: TaskExistsError
    naming the first whose task_id is taken. A chunk of rows is one statement; the rows it
    did not insert are looked for only when there are some."""
    inserted = 0
    for count, params in chunks(d, rows, TASKS.count):
        inserted += yield from Execute(_create_sql(d, count), params)
    if inserted == len(rows):
        return
    # The rows stored under these ids now are ours or were there before: a different seq
    # tells the second (each seq belongs to one task).
    ours = {row[0]: row[_SEQ_AT] for row in rows}
    taken: set[str] = set()
    ids = list(ours)
    for start in range(0, len(ids), _IDS_CHUNK):
        chunk = ids[start : start + _IDS_CHUNK]
        sql = f"SELECT task_id, seq FROM tasks WHERE {in_list('task_id', len(chunk))}"
        taken.update(row[0] for row in (yield from Query(sql, chunk)) if row[1] != ours[row[0]])
    raise TaskExistsError(next((task_id for task_id in ids if task_id in taken), ids[0]))


_SEQ_AT: Final = TASKS.names.index("seq")


class SqlTaskStore:
    """`TaskStore` in the `tasks` table; events that commit with a record go through
    `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the record with this task_id, with `events` appended in the
        same transaction."""
        row = task_row(record)
        if events:
            await self._log.write_with(events, put_tasks, [row])
        elif self._db.dialect.name in _NARROWED:
            await self._db.write(put_tasks, [row])
        else:  # a lone statement (PostgreSQL: no transaction around it)
            await self._db.write(PUT_TASK, row)

    async def create(self, record: TaskRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert a new task, with `events` appended in the same transaction;
        TaskExistsError (nothing stored) when its task_id is taken."""
        await self.create_many([record], events)

    async def create_many(
        self, records: Sequence[TaskRecord], events: Sequence[EventDraft] = ()
    ) -> None:
        """Insert new tasks (distinct task_ids), all or none, with `events` appended in the
        same transaction; TaskExistsError (nothing stored) naming the first whose task_id is
        taken."""
        if records:
            await self._log.write_with(events, create_tasks, [task_row(r) for r in records])
        elif events:
            await self._log.append(events)

    async def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None."""
        row = await self._db.read(_GET, (task_id,))
        return None if row is None else task_from_row(row)

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
        where = (
            Where()
            .term("seq > ?", int(after_seq))
            .compare("agent_id =", agent_id)
            .compare("queue =", queue)
            .compare("submitter =", submitter)
            .among("state", states)
        )
        if where.impossible:
            return []
        sql = f"SELECT {TASKS.sql} FROM tasks WHERE {where.sql} ORDER BY seq LIMIT ?"
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [task_from_row(row) for row in rows]

    async def max_seq(self) -> int:
        """The highest seq stored, -1 when there are no tasks."""
        row = await self._db.read(_MAX_SEQ)
        assert row is not None  # an aggregate without GROUP BY has one row
        return int(row[0])
