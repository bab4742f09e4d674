"""The SQLite writer in a process of its own (`SqliteOptions.writer = "process"`).

The same group commits as the writer thread (`sqlite_writer`), run by a child process
(`sqlite_writer_main`) that owns the write connection and the WAL checkpointer, so that
SQLite's work and its Python do not take turns with the coordinator's event loop for one
interpreter lock. On a busy coordinator that is the difference between the loop waiting for
the lock after every statement the writer steps and running on (docs/performance.md).

What it asks of the jobs: they cross a pipe, pickled, so a job is a module-level function of
the connection, or `sqlite_writer.write_job(function, *args)` binding plain arguments to one;
a job that cannot be pickled is refused at `submit` with a StoreError naming it. Its result
and its exception come back pickled too (an exception that does not survive that arrives as a
StoreError saying what it was). A job sees nothing of the coordinator's memory: whatever it
has to tell, it returns.

Two threads of the coordinator carry the traffic, each blocked on the pipe most of the time:
one sends the jobs pending (all of them in one message), one reads the outcomes and settles
the callers' futures on their event loops, once per loop per batch (`sqlite_writer.settle`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from apiary.store.errors import StoreError
from apiary.store.sqlite.writer import Waiter, WriterStats, settle

if TYPE_CHECKING:
    import sqlite3

    from apiary.store.sqlite.database import SqliteOptions

T = TypeVar("T")

_log = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 60.0
"""How long `start` waits for the process to open and migrate the file (it may first wait,
up to `sqlite_writer_main.LOCK_WAIT_S`, for the writer of a coordinator before it)."""

_STOP: Final = object()


class SqliteWriterProcess:
    """Runs write jobs in a child process that group-commits everything pending."""

    def __init__(self, path: Path, options: SqliteOptions) -> None:
        self._path = path
        self._options = options
        self._ids = itertools.count(1)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._pending: dict[int, Waiter] = {}
        # Guards `_closed` and `_pending` together: no job is admitted once the process is
        # gone or stopping, so every admitted job is answered or failed.
        self._lock = threading.Lock()
        self._closed = False
        self._stop_queued = False
        self._stats: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        self._process: subprocess.Popen[bytes] | None = None
        self._to_child: Connection | None = None
        self._from_child: Connection | None = None
        self._sender = threading.Thread(
            target=self._send_loop, name="apiary-sqlite-writer-sender", daemon=True
        )
        self._receiver = threading.Thread(
            target=self._receive_loop, name="apiary-sqlite-writer-receiver", daemon=True
        )

    def start(self) -> None:
        """Start the process and wait (blocking) until it has opened and migrated the file.

        Raises what opening raised there (SchemaVersionError, StoreError)."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "apiary.store.sqlite.writer_main",
                 str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        finally:
            if self._process is not None:
                os.close(to_child_r)
                os.close(from_child_w)
        self._to_child = Connection(to_child_w, readable=False)
        self._from_child = Connection(from_child_r, writable=False)
        try:
            self._to_child.send_bytes(pickle.dumps(("open", self._path, self._options)))
            answer = self._answer(START_TIMEOUT_S)
        except BaseException:
            self._abandon()
            raise
        if answer[0] != "ready":
            self._abandon()
            error = answer[1]
            raise error if isinstance(error, BaseException) else StoreError(repr(answer))
        self._sender.start()
        self._receiver.start()

    def _answer(self, timeout: float) -> tuple[Any, ...]:
        assert self._from_child is not None
        if not self._from_child.poll(timeout):
            raise StoreError(f"the SQLite writer process did not start within {timeout:g} s")
        try:
            message = pickle.loads(self._from_child.recv_bytes())
        except EOFError:
            raise StoreError(self._exit_reason("the SQLite writer process exited")) from None
        assert isinstance(message, tuple)
        return message

    def _abandon(self) -> None:
        """Close the pipes and reap the process (it ends at the end of its input)."""
        for channel in (self._to_child, self._from_child):
            if channel is not None:
                channel.close()
        if self._process is not None:
            try:
                self._process.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    @property
    def pid(self) -> int | None:
        """The writer process's pid (None before `start`)."""
        return None if self._process is None else self._process.pid

    @property
    def stats(self) -> WriterStats:
        """Counters as of the last answer from the process."""
        commits, jobs, largest, _, _ = self._stats
        return WriterStats(commits, jobs, largest)

    @property
    def checkpoints(self) -> tuple[int, int]:
        """Checkpoints and WAL restarts, as of the last answer from the process."""
        return self._stats[3], self._stats[4]

    async def submit(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run `job` in the next group transaction; return its result once committed.

        As `SqliteWriter.submit`; besides, a job that cannot be pickled raises StoreError
        here (nothing is sent), and one whose caller is cancelled before it is sent is not.
        """
        try:
            pickled = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            problem = f"a write job must be picklable for the writer process: {exc}"
            raise StoreError(problem) from exc
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job_id = next(self._ids)
        with self._lock:
            if self._closed:
                raise StoreError("the SQLite store is closed")
            self._pending[job_id] = Waiter(loop, future)
            self._queue.put((job_id, pickled))
        return await future

    async def close(self) -> None:
        """Commit everything already submitted, stop the process, close the pipes."""
        await asyncio.to_thread(self.stop_now)

    def stop_now(self) -> None:
        """`close`, blocking: for a caller without an event loop."""
        with self._lock:
            self._closed = True
            if not self._stop_queued:
                self._stop_queued = True
                self._queue.put(_STOP)
        for thread in (self._sender, self._receiver):
            if thread.is_alive():
                thread.join()
        self._abandon()

    def _send_loop(self) -> None:
        assert self._to_child is not None
        try:
            while True:
                item = self._queue.get()
                batch: list[tuple[int, bytes]] = []
                while item is not _STOP:
                    assert isinstance(item, tuple)
                    pending = self._pending.get(item[0])
                    if pending is not None and not pending.future.cancelled():
                        batch.append(item)
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    self._to_child.send_bytes(pickle.dumps(("jobs", batch)))
                if item is _STOP:
                    self._to_child.send_bytes(pickle.dumps(("stop",)))
                    return
        except OSError as exc:
            _log.error("the SQLite writer process cannot take jobs: %s", exc)

    def _receive_loop(self) -> None:
        assert self._from_child is not None
        error = StoreError("the SQLite writer process stopped")
        try:
            while True:
                message = pickle.loads(self._from_child.recv_bytes())
                if message[0] == "stopped":
                    self._stats = message[1]
                    break
                _, outcomes, self._stats = message
                self._settle(outcomes)
        except (EOFError, OSError):
            reason = self._exit_reason("the SQLite writer process exited")
            _log.error("%s; writes fail until the coordinator restarts", reason)
            error = StoreError(reason)
        except Exception as exc:  # an answer that does not load: nothing after it is known
            _log.exception("unreadable answer from the SQLite writer process")
            error = StoreError(f"unreadable answer from the SQLite writer process: {exc!r}")
            self._abandon_now()
        self._fail_pending(error)

    def _settle(self, outcomes: list[tuple[int, Any, BaseException | None]]) -> None:
        with self._lock:
            settled = [(self._pending.pop(i), result, error) for i, result, error in outcomes]
        settle(settled)

    def _fail_pending(self, error: StoreError) -> None:
        with self._lock:
            self._closed = True
            orphans, self._pending = self._pending, {}
        settle((waiter, None, error) for waiter in orphans.values())

    def _abandon_now(self) -> None:
        """Stop the process at once: after an answer that could not be read, which jobs
        committed is unknown, and the coordinator must not go on as if it knew."""
        if self._process is not None:
            self._process.kill()

    def _exit_reason(self, what: str) -> str:
        process = self._process
        if process is None:
            return what
        try:
            code = process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return what
        return f"{what} (exit code {code})"
