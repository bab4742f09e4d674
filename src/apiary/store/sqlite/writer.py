"""The one SQLite writer: a thread that owns the write connection and commits in groups.

Every write of a `SqliteDatabase` goes through one `SqliteWriter` (DESIGN.md sections 5 and
12). A caller enqueues a job, a function of the write connection, and awaits its outcome. The
writer thread takes the first pending job, drains whatever else is pending (up to
`max_batch`), runs the jobs in one transaction and commits once. A failing job does not
undo its neighbours: the batch is then run again with each job in a savepoint of its own
(`GroupCommit`), so a job may run twice, the first run rolled back, and must be a function
of the connection alone. Only after the commit are the
callers resolved: a write that returned is a committed write.

There is no timer. Committing whenever anything is pending costs a lone caller a single
commit (sub-millisecond), while under load the jobs that arrive during one commit form the
next batch: the batch window grows by itself to the time a commit takes. A fixed window
would instead cap a sequential caller at one write per window.

`GroupCommit` is that transaction logic alone, a function of a connection and a batch of
jobs; `SqliteWriter` runs it on a thread of the coordinator, `sqlite_writer_process` in a
process of its own (jobs then cross a pipe, so they must be picklable: a module-level
function, or `functools.partial` of one, see `write_job`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from apiary.store.errors import StoreError

T = TypeVar("T")

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters of a writer since it started (for metrics and tests)."""

    commits: int
    """Transactions committed: one per batch."""
    jobs: int
    """Jobs that ran in a committed transaction (including jobs that raised)."""
    largest_batch: int


@dataclass(frozen=True, slots=True)
class Waiter:
    """A caller awaiting a write job's outcome, on its event loop."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass(frozen=True, slots=True)
class WriteJob(Waiter):
    """A write job and its caller."""

    run: Callable[[sqlite3.Connection], Any]


Outcome = tuple[Any, BaseException | None]
"""(result, error) of one job: error is None when the job succeeded."""

Settled = tuple[Waiter, Any, BaseException | None]
"""(waiter, result, error)."""


def settle(outcomes: Iterable[Settled]) -> None:
    """Hand each outcome to its waiter, from any thread: one wake-up per event loop, not
    one per job. A closed loop is skipped: nobody is waiting there any more."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Settled]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].loop, []).append(outcome)
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle_here, settled)


def write_job(function: Callable[..., T], *args: Any) -> Callable[[sqlite3.Connection], T]:
    """The job `function(connection, *args)`: picklable when `function` is a module-level
    function and `args` are plain values, as a writer in its own process needs."""
    return functools.partial(_call, function, args)


def _call(function: Callable[..., T], args: tuple[Any, ...], conn: sqlite3.Connection) -> T:
    return function(conn, *args)


def execute_rowcount(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    """A job's body: run one statement, return the rows it changed."""
    return conn.execute(sql, params).rowcount


def execute_fetchall(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    """A job's body: run one statement (an UPDATE ... RETURNING, say), return its rows."""
    return conn.execute(sql, params).fetchall()


def execute_lastrowid(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    """A job's body: run one INSERT, return the rowid it produced."""
    rowid = conn.execute(sql, params).lastrowid
    if rowid is None:  # pragma: no cover - only for statements that insert nothing
        raise RuntimeError("INSERT did not produce a rowid")
    return rowid


class GroupCommit:
    """Runs a batch of jobs in one transaction on `connection` and commits once; a failing
    job does not undo its neighbours (the batch runs again, each job in its own savepoint)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._conn = connection
        self._commits = 0
        self._jobs = 0
        self._largest_batch = 0

    @property
    def connection(self) -> sqlite3.Connection:
        """The write connection."""
        return self._conn

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return WriterStats(self._commits, self._jobs, self._largest_batch)

    def run(
        self, jobs: list[Callable[[sqlite3.Connection], Any]], *, begun: bool = False
    ) -> tuple[list[Outcome], bool]:
        """Each job's outcome, in order, and whether the transaction committed (`begun`: the
        caller began it). When it failed as a whole, no job of the batch is durable and
        every outcome is that error; an exception that is not an Exception (SystemExit in a
        job) propagates after that rollback."""
        conn = self._conn
        outcomes: list[Outcome] = []
        try:
            if not begun:
                conn.execute("BEGIN IMMEDIATE")
            if len(jobs) == 1:
                outcomes.append(self._run_alone(jobs[0]))
            else:
                outcomes.extend(self._run_together(jobs))
            if conn.in_transaction:
                conn.execute("COMMIT")
        except BaseException as exc:
            self._roll_back()
            _log.error("SQLite group commit of %d jobs failed: %s", len(jobs), exc)
            if not isinstance(exc, Exception):
                raise
            error = as_store_error(exc)
            return [(None, error)] * len(jobs), False
        self._commits += 1
        self._jobs += len(outcomes)
        self._largest_batch = max(self._largest_batch, len(outcomes))
        return outcomes, True

    def _run_together(self, jobs: list[Callable[[sqlite3.Connection], Any]]) -> list[Outcome]:
        """The jobs' outcomes, run one after another without savepoints (two statements per
        job fewer, each a hand-over of the interpreter lock); when one fails, the
        transaction is rolled back and begun again, and every job run again in a savepoint
        of its own. A job is a function of the connection (a transaction description,
        store.sql.statements), so its second run is its first over."""
        conn = self._conn
        results: list[Outcome] = []
        for job in jobs:
            try:
                results.append((job(conn), None))
            except Exception:
                if not conn.in_transaction:
                    raise  # SQLite rolled back the whole transaction (e.g. disk full)
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                return [self._run_job(job) for job in jobs]
        return results

    def _run_job(self, job: Callable[[sqlite3.Connection], Any]) -> Outcome:
        conn = self._conn
        conn.execute("SAVEPOINT job")
        try:
            result = job(conn)
        except Exception as exc:
            if not conn.in_transaction:
                raise  # SQLite rolled back the whole transaction (e.g. disk full)
            conn.execute("ROLLBACK TO job")
            conn.execute("RELEASE job")
            return (None, as_store_error(exc))
        conn.execute("RELEASE job")
        return (result, None)

    def _run_alone(self, job: Callable[[sqlite3.Connection], Any]) -> Outcome:
        """`_run_job` for the only job of a transaction, without a savepoint: undoing the
        transaction undoes just this job. Each statement here costs a writer thread a wait
        for the interpreter lock, which the busy event loop may hold for a switch interval."""
        try:
            result = job(self._conn)
        except Exception as exc:
            if not self._conn.in_transaction:
                raise  # SQLite rolled back the whole transaction (e.g. disk full)
            # The transaction ends empty, as a savepoint's rollback and a commit would end it.
            self._conn.execute("ROLLBACK")
            return (None, as_store_error(exc))
        return (result, None)

    def _roll_back(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                _log.error("SQLite rollback failed: %s", exc)

    def close(self) -> None:
        """`PRAGMA optimize`, then close the connection."""
        try:
            self._conn.execute("PRAGMA optimize")
        except sqlite3.Error as exc:
            _log.warning("PRAGMA optimize failed on close: %s", exc)
        self._conn.close()


_STOP: Final = object()


def as_store_error(exc: BaseException) -> BaseException:
    """Driver errors become StoreError (cause kept); the store's own errors pass through."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"SQLite: {exc}")
        error.__cause__ = exc
        return error
    return exc


class SqliteWriter:
    """Runs write jobs on a dedicated thread, group-committing everything pending.

    `on_commit` is called on the writer thread after every commit, once its callers are
    resolved, with the write connection (see `GroupCommit`).
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        *,
        max_batch: int = 1000,
        on_commit: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1: {max_batch}")
        self._group = GroupCommit(connection)
        self._max_batch = max_batch
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Guards `_closed` together with the queue so that no job can be enqueued behind
        # _STOP, where nobody would ever resolve it.
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="apiary-sqlite-writer", daemon=True)

    def start(self) -> None:
        """Start the writer thread; it owns the connection from now on."""
        self._thread.start()

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return self._group.stats

    async def submit(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run `job` in the next group transaction; return its result once committed.

        The job's exception is raised here (its savepoint rolled back, the rest of the batch
        unaffected); sqlite3 errors arrive as StoreError. A caller cancelled before its job
        started skips the job; cancelled later, the write may still commit.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise StoreError("the SQLite store is closed")
            self._queue.put(WriteJob(loop, future, job))
        return await future

    async def close(self) -> None:
        """Commit everything already submitted, stop the thread, close the connection."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                self._commit(batch)
        finally:
            self._shut_down()

    def _next_batch(self) -> list[WriteJob] | None:
        if self._stopping:
            return None
        item = self._queue.get()
        batch: list[WriteJob] = []
        while item is not _STOP:
            assert isinstance(item, WriteJob)
            batch.append(item)
            if len(batch) >= self._max_batch:
                return batch
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch
        self._stopping = True
        return batch or None

    def _commit(self, batch: list[WriteJob]) -> None:
        # Benign race: cancellation is read from another thread; the worst case is running a
        # job whose caller has just gone away.
        live = [job for job in batch if not job.future.cancelled()]
        try:
            outcomes, committed = self._group.run([job.run for job in live])
        except BaseException as exc:
            # e.g. SystemExit in a job: the thread ends, _shut_down fails the rest.
            settle([(job, None, batch_error(exc)) for job in batch])
            raise
        settle([(job, *outcome) for job, outcome in zip(live, outcomes, strict=True)])
        if committed and self._on_commit is not None:
            self._on_commit(self._group.connection)

    def _shut_down(self) -> None:
        with self._lock:
            self._closed = True
        orphans: list[Settled] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, WriteJob):
                orphans.append((item, None, StoreError("the SQLite writer stopped")))
        settle(orphans)
        self._group.close()


def batch_error(exc: BaseException) -> BaseException:
    if isinstance(exc, Exception):
        return as_store_error(exc)
    error = StoreError(f"the SQLite writer stopped: {exc!r}")
    error.__cause__ = exc
    return error


def settle_here(outcomes: list[Settled]) -> None:
    """Hand each outcome to its waiter, on the waiters' own loop."""
    for job, result, error in outcomes:
        if job.future.done():
            continue  # cancelled while the batch ran
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)
