"""WAL checkpoints off the commit path.

In WAL mode SQLite appends commits to the -wal file and later copies them back into the
database file (a checkpoint). By default the committing connection does that itself once the
WAL passes 1000 pages, which stalls that commit, and every write queued behind it, for
10-15 ms on this class of machine (DESIGN.md section 12). So the writer's connection runs with
`wal_autocheckpoint = 0` and this `WalCheckpointer` does the copying on its own thread and
connection with PASSIVE checkpoints, which never wait for the writer or for readers.

It is also where durability against power loss lands when `synchronous = NORMAL`: a
checkpoint fsyncs the WAL and the database file.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

_log = logging.getLogger(__name__)


class WalCheckpointer:
    """Checkpoints the WAL after every `every_changes` rows written by the writer.

    The writer reports its connection's `total_changes` after each commit (`note_commit`,
    called on the writer thread, costs a subtraction); rows changed is a cheap proxy for WAL
    pages written.
    """

    def __init__(self, connection: sqlite3.Connection, *, every_changes: int = 1000) -> None:
        if every_changes < 1:
            raise ValueError(f"every_changes must be at least 1: {every_changes}")
        self._conn = connection
        self._every = every_changes
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

    def note_commit(self, total_changes: int) -> None:
        """Called by the writer after a commit with its connection's total_changes."""
        if total_changes - self._signalled_at >= self._every:
            self._signalled_at = total_changes
            self._wake.set()

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
                busy, wal_frames, copied = self._conn.execute(
                    "PRAGMA wal_checkpoint(PASSIVE)"
                ).fetchone()
            except sqlite3.Error as exc:
                _log.warning("WAL checkpoint failed: %s", exc)
                continue
            _log.debug("WAL checkpoint: busy=%s frames=%s copied=%s", busy, wal_frames, copied)
            with self._done:
                self._count += 1
                self._done.notify_all()
