"""The SQLite writer process: `python -m apiary.store.sqlite.writer_main IN_FD OUT_FD`.

Started by `sqlite_writer_process.SqliteWriterProcess`, never by hand. It owns the write
connection and the WAL checkpointer of one database file and runs the coordinator's write
jobs in group commits (`sqlite_writer.GroupCommit`), so that SQLite's statements and the
Python around them run beside the coordinator's event loop instead of taking turns with it
for one interpreter lock (docs/performance.md).

The conversation, each message a pickled tuple framed by `multiprocessing.connection`:

| from | message | meaning |
|---|---|---|
| parent | `("open", path, options)` | the first message: open and migrate the file |
| child | `("ready", pid)` / `("failed", error)` | the answer to it |
| parent | `("jobs", [(job_id, pickled_job), ...])` | jobs to commit |
| child | `("done", [(job_id, result, error), ...], stats)` | their outcomes, once committed |
| parent | `("stop",)` | commit what came before, close, answer `("stopped", stats)` |

Jobs that arrive while a transaction commits wait in the pipe and form the next batch, as
they wait in the queue of the writer thread.

The process ends with its coordinator: end of input (the coordinator exited, SIGKILL
included) stops it without committing what it has read and not yet begun, and a commit under
way then finds no one to answer and ends it. Before it opens the file it takes an exclusive
lock on `PATH.writer-lock`, which it holds until it exits: a coordinator restarted on the same
file waits there until the writer of the one before has gone, so nothing that one still
commits lands behind the new one's recovery (`take_lock`: a holder whose coordinator is
alive is another user of the file, not a leftover, and is not waited for).
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from apiary.store.errors import StoreError
from apiary.store.sqlite.checkpoint import WalCheckpointer
from apiary.store.sqlite.database import (
    SqliteOptions,
    connect_sqlite,
    enable_wal,
    migrate_sqlite,
)
from apiary.store.sqlite.writer import GroupCommit, Outcome
from apiary.system import process_alive

_log = logging.getLogger("apiary.store.sqlite.writer_process")

LOCK_WAIT_S: Final = 30.0
"""How long a new writer waits for the writer of a coordinator before it to exit."""

Stats = tuple[int, int, int, int, int]
"""commits, jobs, largest batch, checkpoints, WAL restarts."""


def lock_path(path: Path) -> Path:
    """The lock file a writer process holds for the database at `path`."""
    return path.with_name(path.name + ".writer-lock")


def take_lock(path: Path, wait_s: float = LOCK_WAIT_S) -> int | None:
    """The writer's hold on `lock_path(path)`: an open descriptor holding its exclusive lock,
    or None when the holder serves a coordinator that is alive.

    The lock is there for a restarted coordinator: the writer of the one before, whose
    coordinator is gone, may still be committing, and the new one waits up to `wait_s` for
    it to exit (StoreError naming it after that). A writer whose coordinator is alive is
    not going away: another process using the same file (a second coordinator, a command
    reading and writing a running swarm peer's store). Then the file is shared, the two
    writers taking turns through SQLite's own locking, as two writer threads would."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder, coordinator = _holder(fd)
            # pid 1 is alive too: a coordinator that is a container's first process (a writer
            # adopted by init before it took the lock has had no job yet: sharing with it
            # costs nothing).
            if coordinator is not None and process_alive(coordinator):
                os.close(fd)
                return None
            if time.monotonic() >= deadline:
                os.close(fd)
                raise StoreError(
                    f"the SQLite database {path} has a writer process (pid {holder}) left "
                    f"by a coordinator that has gone; it did not exit within {wait_s:g} s"
                ) from None
            time.sleep(0.02)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {os.getppid()}".encode(), 0)
    return fd


def _holder(fd: int) -> tuple[str, int | None]:
    """The holder's pid (as written) and its coordinator's, from the lock file."""
    fields = os.pread(fd, 64, 0).decode(errors="replace").split()
    coordinator = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return (fields[0] if fields else "unknown"), coordinator


def portable_error(error: BaseException) -> BaseException:
    """`error` if it survives pickling, else a StoreError that says what it was."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return StoreError(f"{type(error).__name__}: {error}")
    return error


class _Session:
    def __init__(self, inbox: Connection, outbox: Connection, path: Path, options: SqliteOptions):
        self._inbox = inbox
        self._outbox = outbox
        self._options = options
        conn = connect_sqlite(path, options)
        try:
            enable_wal(conn, options)
            migrate_sqlite(conn)
            checkpoint_conn = connect_sqlite(path, options)
        except BaseException:
            conn.close()
            raise
        self._group = GroupCommit(conn)
        self._checkpointer = WalCheckpointer(
            checkpoint_conn,
            every_changes=options.checkpoint_every_changes,
            restart_frames=options.wal_restart_frames,
        )
        self._checkpointer.start()

    def stats(self) -> Stats:
        writer, checkpointer = self._group.stats, self._checkpointer
        return (
            writer.commits,
            writer.jobs,
            writer.largest_batch,
            checkpointer.checkpoints,
            checkpointer.restarts,
        )

    def serve(self) -> bool:
        """Commit batches until asked to stop (True) or the input ends (False)."""
        try:
            while True:
                batch, stopping = self._next_batch()
                if batch:
                    self._commit(batch)
                if stopping:
                    return True
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return False

    def _next_batch(self) -> tuple[list[tuple[int, bytes]], bool]:
        batch: list[tuple[int, bytes]] = []
        message = self._recv()
        while True:
            if message[0] == "stop":
                return batch, True
            batch.extend(message[1])
            if len(batch) >= self._options.max_batch or not self._inbox.poll():
                return batch, False
            message = self._recv()

    def _recv(self) -> tuple[Any, ...]:
        message = pickle.loads(self._inbox.recv_bytes())
        assert isinstance(message, tuple)
        return message

    def _commit(self, batch: list[tuple[int, bytes]]) -> None:
        ids: list[int] = []
        jobs: list[Callable[[sqlite3.Connection], Any]] = []
        refused: list[tuple[int, Any, BaseException]] = []
        for job_id, pickled in batch:
            try:
                jobs.append(pickle.loads(pickled))
                ids.append(job_id)
            except Exception as exc:
                refused.append((job_id, None, StoreError(f"cannot load a write job: {exc!r}")))
        outcomes, committed = self._group.run(jobs)
        self._send(("done", [*refused, *_with_ids(ids, outcomes)], self.stats()))
        if committed:
            self._checkpointer.note_commit(self._group.connection)

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            data = pickle.dumps(message)
        except Exception:
            data = pickle.dumps(_portable(message))
        self._outbox.send_bytes(data)

    def close(self, answer: bool) -> None:
        self._checkpointer.stop()
        self._group.close()
        if answer:
            self._send(("stopped", self.stats()))


def _with_ids(ids: list[int], outcomes: list[Outcome]) -> list[tuple[int, Any, Any]]:
    # An exception pickles whatever its class, but may not load again (a constructor with
    # other arguments than it gives Exception): each is tried here, where one that fails
    # costs only its own answer.
    return [
        (job_id, result, None if error is None else portable_error(error))
        for job_id, (result, error) in zip(ids, outcomes, strict=True)
    ]


def _portable(message: tuple[Any, ...]) -> tuple[Any, ...]:
    """A `done` message whose unpicklable results and errors became StoreErrors (the job
    committed; only its answer could not cross)."""
    kind, outcomes, stats = message
    portable: list[tuple[int, Any, Any]] = []
    for job_id, result, error in outcomes:
        if error is not None:
            portable.append((job_id, None, portable_error(error)))
            continue
        try:
            pickle.dumps(result)
            portable.append((job_id, result, None))
        except Exception as exc:
            problem = StoreError(f"a committed write job's result cannot be returned: {exc!r}")
            portable.append((job_id, None, problem))
    return (kind, portable, stats)


def main(argv: list[str]) -> int:
    # Ctrl-C at a terminal reaches the whole process group: the coordinator decides when
    # its writer stops (it asks, or it exits and the input ends).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    try:
        kind, path, options = pickle.loads(inbox.recv_bytes())
    except EOFError:
        return 0
    assert kind == "open"
    try:
        lock = take_lock(path)
        session = _Session(inbox, outbox, path, options)
    except Exception as exc:
        outbox.send_bytes(pickle.dumps(("failed", portable_error(exc))))
        return 1
    try:
        outbox.send_bytes(pickle.dumps(("ready", os.getpid())))
        answer = session.serve()
        session.close(answer)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the coordinator is gone: nobody to answer
    finally:
        if lock is not None:
            os.close(lock)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the writer process
    sys.exit(main(sys.argv[1:]))
