"""The SQLite writer on the event loop's own thread, the default (`SqliteOptions.writer =
"loop"`): the write jobs submitted during one turn of the loop run together at its end, in
one transaction (`GroupCommit`, sqlite/writer.py), and their callers are answered there.

A writer thread (`SqliteWriter`) gives up the interpreter lock for every statement it steps
and takes it back after, and wakes the loop once per commit; while the loop is busy, each
retake waits for the loop's switch interval (server/interpreter.py), so a commit under load
took one to two milliseconds, most of it waiting, and every caller of a durable write waited
that long (the Scheduler holding its lock meanwhile). Here a commit costs its statements
alone: no lock to hand over, no thread to wake. The loop is busy with them meanwhile, tens to
hundreds of microseconds a job; with synchronous=NORMAL a commit does not wait for the disk
(the checkpointer thread's checkpoints do the flushing, sqlite/checkpoint.py).

What may wait is not done on the loop, and the jobs submitted meanwhile wait for it, as they
would behind a writer thread's batch:
- a lock another process holds on the file (a second coordinator opening it, say): the loop's
  connection never waits for one (busy_timeout 0), and a batch that finds the file locked
  runs on a thread instead, with the configured busy timeout;
- the RESTART checkpoint the checkpointer asks for (it waits for readers): on a thread.

Retention deletes in bounded chunks (engine/retention.py), so that no one job holds the loop
for long.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from apiary.store.errors import StoreError
from apiary.store.sqlite.checkpoint import WalCheckpointer
from apiary.store.sqlite.writer import (
    GroupCommit,
    Outcome,
    WriteJob,
    WriterStats,
    batch_error,
    settle_here,
)

T = TypeVar("T")

_log = logging.getLogger(__name__)


class SqliteLoopWriter:
    """Group commits between the event loop's callbacks (see the module docstring)."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        *,
        max_batch: int = 1000,
        checkpointer: WalCheckpointer | None = None,
        busy_timeout_ms: int = 5000,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1: {max_batch}")
        self._group = GroupCommit(connection)
        self._max_batch = max_batch
        self._checkpointer = checkpointer
        self._busy_timeout_ms = busy_timeout_ms
        self._pending: list[WriteJob] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the pending jobs were submitted on (None while none is)."""
        self._flush_due = False
        self._aside: asyncio.Task[None] | None = None
        """Work on a thread under way (a batch that found the file locked, a RESTART
        checkpoint): the jobs submitted meanwhile wait for it."""
        self._closed = False

    def start(self) -> None:
        """The connection stops waiting for locks: the loop must not (module docstring)."""
        self._group.connection.execute("PRAGMA busy_timeout = 0")

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return self._group.stats

    async def submit(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run `job` in the transaction that commits at the end of this turn of the loop (or
        after the work on a thread under way); return its result once committed.

        The job's exception is raised here (the rest of the batch unaffected, see
        `GroupCommit`); sqlite3 errors arrive as StoreError. A caller cancelled before its
        job ran skips the job."""
        if self._closed:
            raise StoreError("the SQLite store is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise StoreError("the SQLite store is writing for another event loop")
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append(WriteJob(loop, future, job))
        self._schedule()
        return await future

    async def close(self) -> None:
        """Commit everything already submitted, then close the connection."""
        self._closed = True
        while self._aside is not None or self._pending:
            if self._aside is not None:
                await asyncio.wait({self._aside})
            else:
                self._flush()
        await asyncio.to_thread(self._group.close)

    # ------------------------------------------------------------------ the loop's side

    def _schedule(self) -> None:
        if not self._flush_due and self._aside is None and self._loop is not None:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._aside is not None:
            return  # (it schedules the next flush when it ends)
        batch = [job for job in self._pending[: self._max_batch] if not job.future.cancelled()]
        del self._pending[: self._max_batch]
        if not batch:
            self._idle()
            return
        conn = self._group.connection
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:  # the file is locked (another process): wait on a thread
            self._set_aside(self._commit_waiting(batch))
            return
        try:
            outcomes, committed = self._group.run([job.run for job in batch], begun=True)
        except BaseException as exc:  # (SystemExit in a job: rolled back)
            _settle(batch, [(None, batch_error(exc))] * len(batch))
            raise
        _settle(batch, outcomes)
        checkpointer = self._checkpointer
        if committed and checkpointer is not None and checkpointer.noted(conn):
            self._set_aside(asyncio.to_thread(checkpointer.restart, conn))
            return
        self._idle()

    def _idle(self) -> None:
        """The next flush, for jobs submitted since; else no loop is bound any more."""
        if self._pending:
            self._schedule()
        else:
            self._loop = None

    def _set_aside(self, work: Awaitable[Any]) -> None:
        self._aside = asyncio.ensure_future(self._run_aside(work))

    async def _run_aside(self, work: Awaitable[Any]) -> None:
        try:
            await work
        except Exception:  # (a batch's outcomes are set; a checkpoint logs its own)
            _log.exception("SQLite writer work on a thread failed")
        finally:
            self._aside = None
            self._idle()

    async def _commit_waiting(self, batch: list[WriteJob]) -> None:
        """A batch that found the file locked, run on a thread with the busy timeout (the
        loop goes on meanwhile), its outcomes handed to its callers here."""
        try:
            outcomes = await asyncio.to_thread(self._run_waiting, [job.run for job in batch])
        except BaseException as exc:
            _settle(batch, [(None, batch_error(exc))] * len(batch))
            raise
        _settle(batch, outcomes)

    def _run_waiting(self, jobs: list[Callable[[sqlite3.Connection], Any]]) -> list[Outcome]:
        conn = self._group.connection
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        try:
            return self._group.run(jobs)[0]
        finally:
            conn.execute("PRAGMA busy_timeout = 0")


def _settle(batch: list[WriteJob], outcomes: list[Outcome]) -> None:
    settle_here([(job, *outcome) for job, outcome in zip(batch, outcomes, strict=True)])
