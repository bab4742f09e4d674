"""One SQLite database file: the writer, the readers, the checkpointer and the schema.

`open_sqlite_database` opens the file in WAL mode, applies pending migrations and hands out a
`SqliteDatabase`: `write(job)` runs a job on the single group-committing writer (on the
event loop, `sqlite_loop_writer`, by default; or `sqlite_writer`'s thread, or
`sqlite_writer_process`), `read(query)` runs a query on one of a few read-only connections, which
WAL lets run alongside the writer, each seeing the last committed state.

Durability (`synchronous`): with WAL, NORMAL does not fsync on commit; the commit is in the
WAL file, so it survives the process being killed at any instant, and the database is never
corrupted. What NORMAL gives up is durability against power loss or an OS crash: the last
commits before the last checkpoint may roll back then. FULL fsyncs the WAL at every commit and
closes that gap; with group commit the fsync is paid once per batch, not once per write.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import time
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from apiary.store.errors import StoreError
from apiary.store.migrations import load_migrations, pending_migrations
from apiary.store.sqlite.checkpoint import WalCheckpointer
from apiary.store.sqlite.loop_writer import SqliteLoopWriter
from apiary.store.sqlite.opening import diagnose, opening
from apiary.store.sqlite.writer import (
    SqliteWriter,
    WriterStats,
    as_store_error,
    execute_rowcount,
    write_job,
)
from apiary.store.sqlite.writer_process import SqliteWriterProcess

T = TypeVar("T")

Synchronous = Literal["NORMAL", "FULL"]
WriterKind = Literal["loop", "thread", "process"]


def default_writer(synchronous: Synchronous) -> WriterKind:
    """Where the group commits run unless told: on the event loop, except with FULL, whose
    every commit waits for the disk (on a thread, then: the loop must not wait)."""
    return "thread" if synchronous == "FULL" else "loop"


@dataclass(frozen=True, slots=True)
class SqliteOptions:
    """How a SQLite database is opened. The defaults suit the coordinator."""

    synchronous: Synchronous = "NORMAL"
    """NORMAL: durable against process crashes; FULL: also against power loss (module doc)."""
    readers: int = 2
    """Read connections, each on its own thread."""
    max_batch: int = 1000
    """Most jobs committed in one transaction; bounds the latency one batch adds."""
    checkpoint_every_changes: int = 4000
    """Rows written between background WAL checkpoints."""
    wal_restart_frames: int = 4096
    """WAL pages (4 KiB each) past which the writer makes the WAL start over (a RESTART
    checkpoint between two batches; `sqlite_checkpoint`): bounds the WAL under steady load."""
    journal_size_limit: int = 64 * 1024 * 1024
    """Bytes the WAL file is truncated to after a checkpoint lets it restart."""
    busy_timeout_ms: int = 5000
    """How long to wait for a lock held by another process before failing."""
    writer: WriterKind | None = None
    """Where the group commits run: on the event loop's own thread (`sqlite_loop_writer`:
    no interpreter lock handed over, the fastest), a thread of this process
    (`sqlite_writer`), or a process of their own (`sqlite_writer_process`: a moment more to
    open; every write job must then be picklable). None: `default_writer`'s choice, which
    it is once made."""

    def __post_init__(self) -> None:
        if self.synchronous not in get_args(Synchronous):
            raise ValueError(f"synchronous must be one of {get_args(Synchronous)}")
        if self.writer is None:
            object.__setattr__(self, "writer", default_writer(self.synchronous))
        if self.writer not in get_args(WriterKind):
            raise ValueError(f"writer must be one of {get_args(WriterKind)}")
        if self.readers < 1:
            raise ValueError(f"readers must be at least 1: {self.readers}")


@dataclass(frozen=True, slots=True)
class SqliteStats:
    """Counters of an open database (for metrics and tests)."""

    writer: WriterStats
    checkpoints: int
    wal_restarts: int
    """RESTART checkpoints that let the WAL start over."""
    writer_pid: int | None = None
    """The writer process's pid (writer="process"), None for a writer thread."""


class SqliteReaders:
    """A fixed set of read-only connections, one per thread of a private executor."""

    def __init__(self, connections: list[sqlite3.Connection]) -> None:
        self._idle: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        for connection in connections:
            self._idle.put(connection)
        self._connections = connections
        # As many threads as connections: a thread never waits for a connection.
        self._executor = ThreadPoolExecutor(
            max_workers=len(connections), thread_name_prefix="apiary-sqlite-reader"
        )
        self._closed = False

    async def run(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run `query` on a free read connection."""
        if self._closed:
            raise StoreError("the SQLite store is closed")
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(self._executor, self._run, query)
        except RuntimeError as exc:  # shut down by close() on another thread meanwhile
            raise StoreError("the SQLite store is closed") from exc
        return await pending

    def _run(self, query: Callable[[sqlite3.Connection], T]) -> T:
        connection = self._idle.get()
        try:
            return query(connection)
        except sqlite3.Error as exc:
            raise as_store_error(exc) from exc
        finally:
            self._idle.put(connection)

    def close(self) -> None:
        """Wait for running queries, then close every connection."""
        self._closed = True
        self._executor.shutdown(wait=True)
        for connection in self._connections:
            connection.close()


class SqliteDatabase:
    """An open SQLite database: one group-committing writer, a few readers.

    Aggregate stores are written against `write` and `read`. Jobs and queries run on other
    threads and must not touch the event loop; a query must fetch its rows completely
    (`fetchall`, or `fetchone` on a single-row query) so that no read snapshot stays open.
    """

    def __init__(
        self,
        path: Path,
        options: SqliteOptions,
        writer: SqliteLoopWriter | SqliteWriter | SqliteWriterProcess,
        readers: SqliteReaders,
        checkpointer: WalCheckpointer | None,
    ) -> None:
        self._path = path
        self._options = options
        self._writer = writer
        self._readers = readers
        self._checkpointer = checkpointer

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def options(self) -> SqliteOptions:
        """The options it was opened with."""
        return self._options

    @property
    def stats(self) -> SqliteStats:
        """Commits, jobs, largest batch, checkpoints and WAL restarts so far."""
        writer, checkpointer = self._writer, self._checkpointer
        if isinstance(writer, SqliteWriterProcess):
            return SqliteStats(writer.stats, *writer.checkpoints, writer_pid=writer.pid)
        assert checkpointer is not None  # a writer thread's, opened with it
        return SqliteStats(writer.stats, checkpointer.checkpoints, checkpointer.restarts)

    @property
    def checkpointer(self) -> WalCheckpointer:
        """The background WAL checkpointer (of a writer thread; a writer process has its own,
        and this raises StoreError)."""
        if self._checkpointer is None:
            raise StoreError("the WAL checkpointer runs in the SQLite writer process")
        return self._checkpointer

    @property
    def writer_pid(self) -> int | None:
        """The pid of the writer process, None for a writer thread."""
        writer = self._writer
        return writer.pid if isinstance(writer, SqliteWriterProcess) else None

    async def write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run `job` on the write connection in the next group commit; return its result
        once that transaction committed. See `SqliteWriter.submit`."""
        return await self._writer.submit(job)

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """`write` of the job `function(connection, *args)`, picklable for a writer process
        when `function` is a module-level function and `args` plain values."""
        return await self._writer.submit(write_job(function, *args))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """`write` of one statement; the number of rows it changed."""
        return await self._writer.submit(write_job(execute_rowcount, sql, params))

    async def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run `query` on a read connection; it sees every write that has returned."""
        return await self._readers.run(query)

    async def close(self) -> None:
        """Commit what was submitted, then stop every thread and close every connection."""
        await self._writer.close()
        await asyncio.to_thread(self._close_rest)

    def _close_rest(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        # The last connection to close checkpoints the WAL completely and removes it.
        self._readers.close()


@asynccontextmanager
async def open_sqlite_database(
    path: Path, options: SqliteOptions | None = None
) -> AsyncIterator[SqliteDatabase]:
    """Open (creating if needed) and migrate the database at `path`; close it on exit.

    Raises SchemaVersionError when the file's schema is newer than this code.
    """
    database = await asyncio.to_thread(_open, path, options or SqliteOptions())
    try:
        yield database
    finally:
        await database.close()


def _open(path: Path, options: SqliteOptions) -> SqliteDatabase:
    if options.writer == "process":
        with opening(path):
            return _open_with_process(path, options)
    with opening(path), ExitStack() as cleanup:
        write_conn = connect_sqlite(path, options)
        cleanup.callback(write_conn.close)
        enable_wal(write_conn, options)
        migrate_sqlite(write_conn)
        read_conns = [connect_sqlite(path, options, read_only=True) for _ in range(options.readers)]
        for conn in read_conns:
            cleanup.callback(conn.close)
        checkpoint_conn = connect_sqlite(path, options)
        cleanup.callback(checkpoint_conn.close)
        cleanup.pop_all()
    checkpointer = WalCheckpointer(
        checkpoint_conn,
        every_changes=options.checkpoint_every_changes,
        restart_frames=options.wal_restart_frames,
    )
    writer: SqliteLoopWriter | SqliteWriter
    if options.writer == "loop":
        writer = SqliteLoopWriter(
            write_conn, max_batch=options.max_batch, checkpointer=checkpointer,
            busy_timeout_ms=options.busy_timeout_ms,
        )  # fmt: skip
    else:
        writer = SqliteWriter(
            write_conn, max_batch=options.max_batch, on_commit=checkpointer.note_commit
        )
    checkpointer.start()
    writer.start()
    return SqliteDatabase(path, options, writer, SqliteReaders(read_conns), checkpointer)


def _open_with_process(path: Path, options: SqliteOptions) -> SqliteDatabase:
    # The process opens and migrates the file first: the readers come after, and after the
    # writer of any coordinator before this one has gone (`sqlite_writer_main`).
    writer = SqliteWriterProcess(path, options)
    writer.start()
    try:
        read_conns = [connect_sqlite(path, options, read_only=True) for _ in range(options.readers)]
    except BaseException:
        writer.stop_now()
        raise
    return SqliteDatabase(path, options, writer, SqliteReaders(read_conns), None)


STATEMENT_CACHE = 1024
"""Prepared statements kept per connection (sqlite3's default is 128). The writer's
multi-row statements differ in their row counts (`store.sql.bulk`), so a steady load cycles
through a few hundred texts; preparing one again costs the writer a statement's worth of
interpreter-lock hand-overs."""


def connect_sqlite(
    path: Path, options: SqliteOptions, *, read_only: bool = False
) -> sqlite3.Connection:
    """A connection to `path` with the options' pragmas (the writer process's too)."""
    # isolation_level=None: the sqlite3 module must not open transactions behind our back;
    # the writer issues BEGIN/COMMIT itself. check_same_thread=False: connections are made
    # here and then used by the thread that owns them.
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False,
            cached_statements=STATEMENT_CACHE,
        )  # fmt: skip
    except sqlite3.Error as exc:
        raise diagnose(path, exc) from exc
    conn.execute(f"PRAGMA busy_timeout = {int(options.busy_timeout_ms)}")
    conn.execute(f"PRAGMA synchronous = {options.synchronous}")
    # Checkpoints belong to the checkpointer thread only (sqlite_checkpoint).
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    if read_only:
        conn.execute("PRAGMA query_only = ON")
    return conn


def enable_wal(conn: sqlite3.Connection, options: SqliteOptions) -> None:
    (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise StoreError(f"SQLite refused WAL mode (got {mode!r}); is the file on a network fs?")
    conn.execute(f"PRAGMA journal_size_limit = {int(options.journal_size_limit)}")


def correlation_key(correlation_id: str) -> int:
    """What `events.correlation_key` holds (migration 16): the CRC-32 of the id's UTF-8.

    The event log's correlation index is on this (after the sequence's bucket, migration 17)
    instead of the id: 36-character keys made that index three times the size of one on an
    integer (more pages touched, written to the WAL and checkpointed per commit;
    docs/performance.md). A read by correlation_id narrows by the key through the index and
    compares the id itself."""
    return zlib.crc32(correlation_id.encode("utf-8", "surrogatepass"))


CORRELATION_BUCKET_BITS = 12
"""The event log's correlation index (migration 17) leads with `sequence >> 12`: the
bucket of 4,096 events an event belongs to. New events' entries all land in the newest
bucket's pages however random their correlation keys; a read by correlation looks the key up
in each bucket it needs (`SqliteEventLog.read`)."""


def migrate_sqlite(conn: sqlite3.Connection, *, target: int | None = None) -> list[int]:
    """Apply the pending SQLite migrations in one transaction; return their versions.

    `target` stops at that version (tests build databases of older versions with it).
    Raises SchemaVersionError (and changes nothing) when the file is newer than this code.
    Migrations may call `apiary_correlation_key(text)` (`correlation_key`).
    """
    conn.create_function("apiary_correlation_key", 1, correlation_key, deterministic=True)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied = [row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
        todo = pending_migrations(load_migrations("sqlite"), applied, target=target)
        for migration in todo:
            for statement in split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time()),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return [m.version for m in todo]


def split_statements(script: str) -> list[str]:
    """The complete SQL statements of a script, in order.

    `executescript` would do this too, but it commits any open transaction first, and a
    migration must run inside the transaction that records it.
    """
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip() and not _only_comments(pending):
        raise ValueError(f"incomplete SQL statement at the end of a migration: {pending!r}")
    return statements


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())
