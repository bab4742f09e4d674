"""Write transactions committed together on PostgreSQL, as the SQLite writer does
(`store.sqlite.writer.GroupCommit`).

Every transaction that appends events updates the one `event_sequence` row (store/postgres/
store.py) and holds its lock until it commits, so such transactions commit one after
another, each paying its own commit (a WAL flush) with the lock held: a burst of submissions
queued behind one another that way, each waiting for all the flushes before it. Here the
writes submitted while one is running wait for it and then run together: one PostgreSQL
transaction, each in a savepoint of its own (a job that fails undoes only itself), one
commit. A write submitted while none runs goes at once, alone, as before.

One group runs at a time. Two at once could deadlock: a group holding `event_sequence`
(taken at the end of its first job) while a later job of it waits for a row the other group
locked before it asked for `event_sequence`. For the same reason, replicas of a cluster do
not group their writes (`PostgresSqlDatabase(group_commit=False)`): another replica's
transaction is such an other group.

A transaction PostgreSQL aborts for a deadlock or a serialization failure is run again whole
(`rerun_when_aborted`); a group is, with all its jobs. A group that fails as a whole (its
connection lost, its commit refused) fails every job with that error: none of them is
durable, or, for a commit lost on the way, none is known to be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from apiary.store.errors import StoreUnavailableError
from apiary.store.postgres.pool import Connection, PostgresPool, store_error
from apiary.store.postgres.rerun import aborted_by_conflict, rerun_when_aborted

MAX_GROUP: Final = 256
"""The most jobs one transaction runs."""

Grouped = Callable[[Connection], Awaitable[Any]]
"""A job's statements, run on the group's connection inside its transaction."""
Alone = Callable[[], Awaitable[Any]]
"""The same job as a transaction of its own (or a lone statement in autocommit)."""
Outcome = tuple[Any, BaseException | None]


@dataclass(frozen=True, slots=True)
class _Job:
    grouped: Grouped
    alone: Alone
    future: asyncio.Future[Any]


class GroupCommit:
    """Runs the writes submitted to it on `pool`, those that waited for the one running
    together in one transaction."""

    def __init__(self, pool: PostgresPool, *, max_group: int = MAX_GROUP) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be at least 1: {max_group}")
        self._pool = pool
        self._max = max_group
        self._queue: list[_Job] = []
        self._flusher: asyncio.Task[None] | None = None
        self.commits = 0
        """Transactions committed (a group, or a job alone)."""
        self.jobs = 0
        """Jobs run in them."""

    async def submit(self, grouped: Grouped, alone: Alone) -> Any:
        """Run the job in the next group (`alone` when it is the only one); its result once
        committed. A caller cancelled before its job started skips the job; cancelled
        later, the write may still commit."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Job(grouped, alone, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        while self._queue:
            group = [job for job in self._queue[: self._max] if not job.future.cancelled()]
            del self._queue[: self._max]
            if len(group) == 1:
                await self._run_alone(group[0])
            elif group:
                await self._run_group(group)

    async def _run_alone(self, job: _Job) -> None:
        try:
            result = await rerun_when_aborted(job.alone)
        except Exception as exc:
            _settle(job, None, exc)
        else:
            self._count(1)
            _settle(job, result, None)

    async def _run_group(self, group: list[_Job]) -> None:
        try:
            outcomes = await rerun_when_aborted(lambda: self._group_once(group))
        except Exception as exc:
            for job in group:
                _settle(job, None, exc)
            return
        self._count(len(group))
        for job, (result, error) in zip(group, outcomes, strict=True):
            _settle(job, result, error)

    async def _group_once(self, group: list[_Job]) -> list[Outcome]:
        """One run of the group's transaction: each job's outcome, in order. A job that
        fails is rolled back to its savepoint and the others go on, unless PostgreSQL
        aborted the transaction for a conflict (the group runs again) or the connection
        went (the group fails)."""
        outcomes: list[Outcome] = []
        async with self._pool.connection() as conn, conn.transaction():
            for job in group:
                try:
                    async with conn.transaction():  # a savepoint
                        outcomes.append((await job.grouped(conn), None))
                except psycopg.Error as exc:  # (its savepoint's end, say)
                    outcomes.append((None, _job_error(store_error(exc))))
                except Exception as exc:
                    outcomes.append((None, _job_error(exc)))
        return outcomes

    def _count(self, jobs: int) -> None:
        self.commits += 1
        self.jobs += jobs


def _job_error(error: Exception) -> Exception:
    """A job's error, kept as its outcome; raised instead when the whole group must run
    again (PostgreSQL aborted it for a conflict) or fails (the connection went)."""
    if aborted_by_conflict(error) or isinstance(error, StoreUnavailableError):
        raise error
    return error


def _settle(job: _Job, result: Any, error: BaseException | None) -> None:
    if job.future.done():
        return  # its caller was cancelled meanwhile
    if error is None:
        job.future.set_result(result)
    else:
        job.future.set_exception(error)
