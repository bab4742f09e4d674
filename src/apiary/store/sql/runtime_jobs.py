"""The runtime's jobs in SQL (schema version 25): `runtime_jobs` and their items
`runtime_job_items` (core/runtime/jobs.py). Rows, statements and the reads of
`RuntimeStore`'s job methods (`SqlJobReads`, part of the SQL runtime store); the rows are
written in the runtime store's one transaction (store/sql/runtime.py). The memory backend
runs the same rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.runtime.jobs import OPEN_JOB_STATES, JobItemRecord, JobRecord, JobStatus
from apiary.core.runtime.records import RuntimeWrite
from apiary.core.runtime.task_records import RuntimeTaskRecord
from apiary.store.sql import runtime_tasks as t
from apiary.store.sql.checks import check_limit, checked_int64
from apiary.store.sql.columns import Columns
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.statements import ExecuteMany, Query, QueryOne, Transaction

Row = tuple[Any, ...]


class JobRow(NamedTuple):
    job_id: str
    session_id: str
    owner: str
    state: str
    created_at: float
    updated_at: float
    item_count: int
    counts_json: str
    meta_json: str
    intent: str
    intent_reason: str
    parent_task_id: str
    started_at: float
    ended_at: float


class ItemRow(NamedTuple):
    job_id: str
    ordinal: int
    task_id: str
    created_at: float


JOBS = Columns(JobRow)
ITEMS = Columns(ItemRow)


def job_row(r: JobRecord) -> Row:
    """ValueError for a state that is not a JobStatus, a number outside int64."""
    return (
        r.job_id, r.session_id, r.owner, JobStatus(r.state).value, float(r.created_at),
        float(r.updated_at), checked_int64("item_count", r.item_count), r.counts_json,
        r.meta_json, r.intent, r.intent_reason, r.parent_task_id, float(r.started_at),
        float(r.ended_at),
    )  # fmt: skip


def job_from_row(fetched: Sequence[Any]) -> JobRecord:
    return JobRecord(*JOBS.of(fetched))


def item_row(r: JobItemRecord) -> Row:
    return (r.job_id, checked_int64("ordinal", r.ordinal), r.task_id, float(r.created_at))


def item_from_row(fetched: Sequence[Any]) -> JobItemRecord:
    return JobItemRecord(*ITEMS.of(fetched))


class JobRows(NamedTuple):
    jobs: list[Row]
    items: list[Row]


def job_rows(write: RuntimeWrite) -> JobRows:
    """The job rows of a write, checked (ValueError) before anything is written."""
    return JobRows([job_row(r) for r in write.jobs], [item_row(r) for r in write.job_items])


_PUT_JOB = by_dialect(lambda d: d.upsert("runtime_jobs", JOBS, "job_id"))
_ADD_ITEM = by_dialect(lambda d: d.insert("runtime_job_items", ITEMS))
_JOB = QueryOne(f"SELECT {JOBS.sql} FROM runtime_jobs WHERE job_id = ?")
_SESSION_JOBS = Query(
    f"SELECT {JOBS.sql} FROM runtime_jobs WHERE session_id = ? "
    "ORDER BY created_at DESC, job_id LIMIT ?"
)
_OPEN = sorted(OPEN_JOB_STATES)
_CHILD_JOBS = Query(
    f"SELECT {JOBS.sql} FROM runtime_jobs WHERE parent_task_id = ? "
    f"AND {in_list('state', len(_OPEN))} ORDER BY job_id"
)
_ITEM_OF_TASK = QueryOne(f"SELECT {ITEMS.sql} FROM runtime_job_items WHERE task_id = ?")
_ITEM_TASKS = Query(
    f"SELECT {ITEMS.prefixed('i')}, {t.TASKS.prefixed('t')} "
    "FROM runtime_job_items i JOIN runtime_tasks t ON t.task_id = i.task_id "
    "WHERE i.job_id = ? ORDER BY i.ordinal"
)


def save_jobs(d: Dialect, rows: JobRows) -> Transaction[None]:
    """Insert or replace the jobs, insert the items (an item's place or task stored
    already raises StoreError)."""
    yield from ExecuteMany(_PUT_JOB, rows.jobs)
    yield from ExecuteMany(_ADD_ITEM, rows.items)


class SqlJobReads:
    """The job reads of the SQL runtime store."""

    _db: SqlDatabase

    async def job(self, job_id: str) -> JobRecord | None:
        row = await self._db.read(_JOB, (job_id,))
        return None if row is None else job_from_row(row)

    async def session_jobs(self, session_id: str, last: int = 100) -> list[JobRecord]:
        """The session's last `last` jobs, oldest first."""
        check_limit(last)
        rows = await self._db.read(_SESSION_JOBS, (session_id, last))
        return [job_from_row(row) for row in reversed(rows)]

    async def child_jobs(self, task_id: str) -> list[JobRecord]:
        """The jobs not ended whose parent task is `task_id`, by job_id."""
        rows = await self._db.read(_CHILD_JOBS, (task_id, *_OPEN))
        return [job_from_row(row) for row in rows]

    async def job_item_of(self, task_id: str) -> JobItemRecord | None:
        row = await self._db.read(_ITEM_OF_TASK, (task_id,))
        return None if row is None else item_from_row(row)

    async def job_items(self, job_id: str) -> list[tuple[JobItemRecord, RuntimeTaskRecord]]:
        """The job's items in order, each with its task."""
        rows = await self._db.read(_ITEM_TASKS, (job_id,))
        width = ITEMS.count
        return [(item_from_row(row[:width]), t.task_from_row(row[width:])) for row in rows]
