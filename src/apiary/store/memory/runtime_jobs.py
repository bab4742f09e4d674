"""The in-memory runtime store's jobs (part of `MemoryRuntimeStore`), with the SQL backends'
unique indexes on an item's place and task."""

from __future__ import annotations

from apiary.core.runtime.jobs import OPEN_JOB_STATES, JobItemRecord, JobRecord
from apiary.core.runtime.task_records import RuntimeTaskRecord
from apiary.store.errors import StoreError
from apiary.store.sql import runtime_jobs as j
from apiary.store.sql.checks import check_limit


class MemoryJobs:
    """Jobs and their items over dicts; `check_jobs` before a save writes anything,
    `put_jobs` with it."""

    _tasks: dict[str, RuntimeTaskRecord]

    def __init__(self) -> None:
        self._jobs: dict[str, JobRecord] = {}
        self._items: dict[tuple[str, int], JobItemRecord] = {}
        self._item_of: dict[str, JobItemRecord] = {}

    def check_jobs(self, rows: j.JobRows) -> tuple[list[JobRecord], list[JobItemRecord]]:
        """The records of the rows; StoreError when an item's place or task is taken."""
        items = [j.item_from_row(row) for row in rows.items]
        places = {(i.job_id, i.ordinal) for i in items}
        tasks = {i.task_id for i in items}
        if len(places) != len(items) or len(tasks) != len(items):
            raise StoreError("two items share a place or a task")
        if places & self._items.keys() or tasks & self._item_of.keys():
            raise StoreError("a job item's place or task is stored already")
        return [j.job_from_row(row) for row in rows.jobs], items

    def put_jobs(self, jobs: list[JobRecord], items: list[JobItemRecord]) -> None:
        for job in jobs:
            self._jobs[job.job_id] = job
        for item in items:
            self._items[(item.job_id, item.ordinal)] = item
            self._item_of[item.task_id] = item

    async def job(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    async def session_jobs(self, session_id: str, last: int = 100) -> list[JobRecord]:
        check_limit(last)
        found = sorted(
            (x for x in self._jobs.values() if x.session_id == session_id),
            key=lambda x: (-x.created_at, x.job_id),
        )[:last]
        return list(reversed(found))

    async def child_jobs(self, task_id: str) -> list[JobRecord]:
        found = [
            x for x in self._jobs.values()
            if x.parent_task_id == task_id and x.state in OPEN_JOB_STATES
        ]  # fmt: skip
        return sorted(found, key=lambda x: x.job_id)

    async def job_item_of(self, task_id: str) -> JobItemRecord | None:
        return self._item_of.get(task_id)

    async def job_items(self, job_id: str) -> list[tuple[JobItemRecord, RuntimeTaskRecord]]:
        found = sorted(
            (x for x in self._items.values() if x.job_id == job_id), key=lambda x: x.ordinal
        )
        return [(x, self._tasks[x.task_id]) for x in found if x.task_id in self._tasks]
