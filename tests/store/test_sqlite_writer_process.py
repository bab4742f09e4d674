"""The SQLite writer in a process of its own (`SqliteOptions(writer="process")`).

The store conformance suite runs against it too (`sqlite-process` in conftest); here is what
is particular to the process: what crosses the pipe, what happens when either side dies, and
that two coordinators' writers never write the same file at once."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from apiary.store.errors import SchemaVersionError, StoreError, VersionConflictError
from apiary.store.open import sqlite_location
from apiary.store.sqlite.database import SqliteOptions, migrate_sqlite
from apiary.store.sqlite.store import open_sqlite_store
from apiary.store.sqlite.writer_main import lock_path, take_lock

PROCESS = SqliteOptions(writer="process")
WAIT_S = 30.0


def _insert(conn: sqlite3.Connection, name: str) -> int:
    return conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
        (10_000 + zlib.crc32(name.encode()), name),
    ).rowcount


def _conflict(conn: sqlite3.Connection, name: str) -> None:
    _insert(conn, name)
    raise VersionConflictError(f"someone else changed {name} first")


class _UnpicklableError(Exception):
    def __init__(self, what: str, extra: int) -> None:  # two arguments: pickling fails
        super().__init__(f"{what} {extra}")


def _raise_unpicklable(conn: sqlite3.Connection) -> None:
    raise _UnpicklableError("odd", 1)


def _names(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM schema_migrations WHERE version >= 10000")
        return {name for (name,) in rows}


def _gone(pid: int, within: float = WAIT_S) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie child of this process still answers kill(0): reap it if it is ours.
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.02)
    return False


async def test_jobs_commit_in_the_process_and_their_errors_come_back_as_their_types(
    tmp_path: Path,
) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path, PROCESS) as store:
        db = store.database
        pid = db.writer_pid
        assert pid is not None and pid != os.getpid()
        assert await db.call(_insert, "first") == 1
        with pytest.raises(VersionConflictError, match="someone else changed second first"):
            await db.call(_conflict, "second")
        with pytest.raises(StoreError, match="_UnpicklableError: odd 1"):
            await db.call(_raise_unpicklable)
        with pytest.raises(StoreError, match="UNIQUE constraint failed"):
            await db.call(_insert, "first")
        # Concurrent writers share commits, as with the thread.
        await asyncio.gather(*(db.call(_insert, f"n{i:03d}") for i in range(200)))
        assert store.stats.writer.jobs == 204
        assert store.stats.writer.commits < 204
        assert store.stats.writer_pid == pid
    # The refused jobs' rows were rolled back, the rest committed; the process is gone.
    assert _names(path) == {"first"} | {f"n{i:03d}" for i in range(200)}
    assert _gone(pid)


async def test_a_job_that_cannot_cross_the_pipe_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path, PROCESS) as store:
        db = store.database
        with pytest.raises(StoreError, match="must be picklable for the writer process"):
            await db.write(lambda conn: _insert(conn, "closure"))
        assert await db.call(_insert, "after") == 1
    assert _names(path) == {"after"}


async def test_a_dead_writer_process_fails_writes_instead_of_hanging(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "apiary.db", PROCESS) as store:
        db = store.database
        await db.call(_insert, "before")
        assert db.writer_pid is not None
        os.kill(db.writer_pid, signal.SIGKILL)
        with pytest.raises(StoreError, match="writer process"):
            await asyncio.wait_for(db.call(_insert, "after"), WAIT_S)
        with pytest.raises(StoreError, match=r"writer process|closed"):
            await asyncio.wait_for(db.call(_insert, "later"), WAIT_S)
        # Reads go on: they do not need the writer.
        assert [e.sequence for e in await store.events.read()] == []


async def test_ctrl_c_at_the_terminal_does_not_stop_the_writer(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "apiary.db", PROCESS) as store:
        assert store.database.writer_pid is not None
        os.kill(store.database.writer_pid, signal.SIGINT)
        await asyncio.sleep(0.2)
        assert await store.database.call(_insert, "still") == 1


async def test_two_live_users_of_one_file_share_it(tmp_path: Path) -> None:
    # A second coordinator, or a command on a running swarm peer's store: both write.
    path = tmp_path / "apiary.db"
    async with (
        open_sqlite_store(path, PROCESS) as first,
        open_sqlite_store(path, PROCESS) as second,
    ):
        assert first.database.writer_pid != second.database.writer_pid
        await asyncio.gather(
            first.database.call(_insert, "one"), second.database.call(_insert, "two")
        )
    assert _names(path) == {"one", "two"}


async def test_a_writer_left_by_a_gone_coordinator_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    gone = _a_dead_pid()
    held = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a writer still committing after its coordinator
        os.pwrite(held, f"4242 {gone}".encode(), 0)
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"writer process \(pid 4242\) left by a coordinator"):
            await asyncio.to_thread(take_lock, path, 0.3)
        assert time.monotonic() - started >= 0.3  # it waited before giving up
        waiting = asyncio.ensure_future(asyncio.to_thread(take_lock, path, WAIT_S))
        await asyncio.sleep(0.1)
        assert not waiting.done()
    finally:
        os.close(held)  # the leftover exits: the lock is free
    fd = await asyncio.wait_for(waiting, WAIT_S)
    assert fd is not None
    assert os.pread(fd, 64, 0).decode() == f"{os.getpid()} {os.getppid()}"
    os.close(fd)


def _a_dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def test_opening_a_newer_file_raises_schema_version_error(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with sqlite3.connect(path, isolation_level=None) as conn:
        migrate_sqlite(conn)
        conn.execute("INSERT INTO schema_migrations VALUES (9999, 'from the future', 0)")
    conn.close()
    with pytest.raises(SchemaVersionError):
        async with open_sqlite_store(path, PROCESS):
            pass
    # The failed open left no writer holding the file.
    fd = await asyncio.to_thread(take_lock, path, 0.2)
    assert fd is not None
    os.close(fd)


_COORDINATOR = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from apiary.store.sqlite.store import open_sqlite_store
    from apiary.store.sqlite.database import SqliteOptions

    async def main() -> None:
        options = SqliteOptions(writer="process")
        async with open_sqlite_store(Path(sys.argv[1]), options) as store:
            print(store.database.writer_pid, flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_the_writer_process_ends_with_a_killed_coordinator(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    parent = subprocess.Popen(
        [sys.executable, "-c", _COORDINATOR, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        writer = int(parent.stdout.readline())
        os.kill(writer, 0)  # alive while its coordinator is
        parent.send_signal(signal.SIGKILL)
        parent.wait(WAIT_S)
        assert _gone(writer), "the writer process outlived its coordinator"
        fd = take_lock(path, 0.2)
        assert fd is not None
        os.close(fd)
    finally:
        parent.kill()
        parent.wait()


def test_the_store_url_names_the_writer(tmp_path: Path) -> None:
    assert sqlite_location("sqlite:?writer=process", tmp_path)[1].writer == "process"
    url = "sqlite:///tmp/x.db?synchronous=FULL&writer=thread"
    assert sqlite_location(url, Path("/unused"))[1] == SqliteOptions("FULL", writer="thread")
    assert sqlite_location("sqlite:///tmp/x.db", Path("/unused"))[1].writer == "loop"
    full = sqlite_location("sqlite:///tmp/x.db?synchronous=FULL", Path("/unused"))[1]
    assert full.writer == "thread"  # (every commit waits for the disk: not on the loop)
    assert sqlite_location("sqlite:?writer=LOOP&synchronous=full", tmp_path)[1].writer == "loop"
    with pytest.raises(ValueError, match="writer must be loop or thread or process, not 'fork'"):
        sqlite_location("sqlite:///tmp/x.db?writer=fork", Path("/unused"))
    with pytest.raises(ValueError, match="known: synchronous, writer"):
        sqlite_location("sqlite:///tmp/x.db?writers=process", Path("/unused"))
    with pytest.raises(ValueError, match="writer must be one of"):
        SqliteOptions(writer="fork")  # type: ignore[arg-type]
