"""WAL checkpoints off the commit path.

In WAL mode SQLite appends commits to the -wal file and later copies them back into the
database file (a checkpoint). By default the committing connection does that itself once the
WAL passes 1000 pages, which stalls that commit, and every write queued behind it, for
10-15 ms on this class of machine (DESIGN.md section 12). So the writer's connection runs with
`wal_autocheckpoint = 0` and this `WalCheckpointer` does the copying on its own thread and
connection with PASSIVE checkpoints, which never wait for the writer or for readers.

It is also where durability against power loss lands when `synchronous = NORMAL`: a
checkpoint fsyncs the WAL and the database file.

A PASSIVE checkpoint never lets the WAL start over under a steady load: the file can only be
rewritten from its beginning once every frame is copied back, and the writer appends new ones
while the copy runs. Left alone the WAL grows by every page written (about 12 KB per routed
message, 1.3 GB after 100,000), and each page lookup probes one more wal-index table per
4,096 frames, so every write gets slower the longer the load lasts. So once the WAL passes
`restart_frames`, the writer runs one RESTART checkpoint between two of its batches
(`restart`): only the frames not yet copied remain, it waits for readers to move to the
database file, and the next transaction writes the WAL from its beginning again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

_log = logging.getLogger(__name__)

RESTART_WAIT_MS = 20
"""How long the writer's RESTART checkpoint waits for readers before trying again later."""
RESTART_RETRY_COMMITS = 32
"""Commits the writer lets pass after a RESTART that gave way before it tries again: a long
read (an export, say) must not cost every commit the wait."""


class WalCheckpointer:
    """Checkpoints the WAL after every `every_changes` rows written by the writer, and has
    the writer restart it once it holds `restart_frames` pages.

    The writer reports each commit (`note_commit`, called on the writer thread, costs a
    subtraction unless a restart is due); rows changed is a cheap proxy for WAL pages written.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        *,
        every_changes: int = 1000,
        restart_frames: int = 16384,
    ) -> None:
        if every_changes < 1:
            raise ValueError(f"every_changes must be at least 1: {every_changes}")
        if restart_frames < 1:
            raise ValueError(f"restart_frames must be at least 1: {restart_frames}")
        self._conn = connection
        self._every = every_changes
        self._restart_frames = restart_frames
        self._restart_due = False
        self._restarts = 0
        self._restart_attempts = 0
        self._restart_skip = 0
        self._checkpointing = threading.Lock()
        """Held by a PASSIVE run: the writer's RESTART never collides with one."""
        self._signalled_at = 0
        self._wake = threading.Event()
        self._stopping = False
        self._done = threading.Condition()
        self._count = 0
        self._thread = threading.Thread(
            target=self._run, name="apiary-sqlite-checkpointer", daemon=True
        )

    @property
    def checkpoints(self) -> int:
        """How many checkpoints have run."""
        return self._count

    def start(self) -> None:
        """Start the checkpointer thread; it owns the connection from now on."""
        self._thread.start()

    @property
    def restarts(self) -> int:
        """How many times the WAL was made to start over (`restart`)."""
        return self._restarts

    @property
    def restart_attempts(self) -> int:
        """RESTART checkpoints tried, the ones that gave way to readers included."""
        return self._restart_attempts

    def note_commit(self, writer: sqlite3.Connection) -> None:
        """Called on the writer thread after each commit, with the writer's connection: the
        RESTART checkpoint runs there when one is due (`noted`, then `restart`)."""
        if self.noted(writer):
            self.restart(writer)

    def noted(self, writer: sqlite3.Connection) -> bool:
        """Count a commit of the writer's: the checkpointer thread is woken every
        `every_changes` rows. True when the writer is to run the RESTART checkpoint now
        (`restart`, between two of its batches); it is not woken then."""
        if self._restart_due:
            if not self._restart_skip:
                return True
            self._restart_skip -= 1
        total_changes = writer.total_changes
        if total_changes - self._signalled_at >= self._every:
            self._signalled_at = total_changes
            self._wake.set()
        return False

    def restart(self, writer: sqlite3.Connection) -> None:
        """A RESTART checkpoint on the writer's own connection, between two of its batches
        (so no write is under way): copies what PASSIVE runs left and waits for readers to
        leave the WAL, so that the next transaction writes it from its beginning.

        It waits at most `RESTART_WAIT_MS` for a PASSIVE run of the checkpointer thread to end
        (else it tries after the next commit), and as long for readers; when it gives way to
        them, the writer tries again `RESTART_RETRY_COMMITS` commits later (a long read must
        not cost every commit the wait). It may wait: a writer on the event loop runs it on
        a thread (sqlite/loop_writer.py)."""
        if not self._checkpointing.acquire(timeout=RESTART_WAIT_MS / 1000):
            return
        self._restart_attempts += 1
        try:
            self._restart_checkpoint(writer)
        finally:
            self._checkpointing.release()

    def _restart_checkpoint(self, writer: sqlite3.Connection) -> None:
        try:
            (saved,) = writer.execute("PRAGMA busy_timeout").fetchone()
            writer.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")
            try:
                busy, frames, copied = writer.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                writer.execute(f"PRAGMA busy_timeout = {int(saved)}")
        except sqlite3.Error as exc:
            self._restart_due = False
            _log.warning("WAL restart checkpoint failed: %s", exc)
            return
        if busy:
            self._restart_skip = RESTART_RETRY_COMMITS
            return
        self._restart_due = False
        self._restarts += 1
        _log.debug("WAL restarted after %s frames (%s copied)", frames, copied)

    def request(self) -> None:
        """Run a checkpoint soon, whatever has been written."""
        self._wake.set()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until `count` checkpoints have run or `timeout` seconds passed."""
        with self._done:
            return self._done.wait_for(lambda: self._count >= count, timeout)

    def stop(self) -> None:
        """Stop the thread (after the checkpoint under way, if any) and close the connection."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                with self._checkpointing:
                    busy, wal_frames, copied = self._conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)"
                    ).fetchone()
            except sqlite3.Error as exc:
                _log.warning("WAL checkpoint failed: %s", exc)
                continue
            _log.debug("WAL checkpoint: busy=%s frames=%s copied=%s", busy, wal_frames, copied)
            if wal_frames >= self._restart_frames:
                self._restart_due = True
            with self._done:
                self._count += 1
                self._done.notify_all()
