"""What went wrong opening a SQLite store, said once: the file, the cause and the fix (a
read-only or corrupted data directory is a one-line error, not a traceback)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from apiary.store.errors import StoreOpenError

_CORRUPT = ("file is not a database", "database disk image is malformed", "malformed")
_READ_ONLY = ("readonly database", "read-only", "attempt to write a readonly")


def diagnose(path: Path, error: BaseException) -> StoreOpenError:
    """The StoreOpenError `error` (sqlite3 or OS) means for the store at `path`."""
    text = str(error)
    lowered = text.lower()
    directory = path.parent
    if any(mark in lowered for mark in _CORRUPT):
        return StoreOpenError(
            path, f"it is not an SQLite database or is corrupted ({text})",
            "restore it from a backup, or move it aside to start with an empty store "
            "(what it held is then lost)",
        )  # fmt: skip
    mounted = _read_only_mount(directory)
    if mounted is not None:
        return StoreOpenError(
            path, f"the file system holding {mounted} is mounted read-only",
            "mount it read-write, or choose another --data-dir",
        )  # fmt: skip
    if any(mark in lowered for mark in _READ_ONLY) or (
        path.exists() and not os.access(path, os.W_OK)
    ):
        return StoreOpenError(
            path, "the file is read-only",
            f"make it writable by the coordinator's user (chmod u+w {path}), or choose "
            "another --data-dir",
        )  # fmt: skip
    if not directory.exists():
        ancestor = next((p for p in directory.parents if p.exists()), Path("/"))
        return StoreOpenError(
            path, f"its directory {directory} does not exist and cannot be made ({ancestor} "
            "is not writable)" if not os.access(ancestor, os.W_OK | os.X_OK) else
            f"its directory {directory} does not exist",
            f"create {directory} for the coordinator's user, or choose another --data-dir",
        )  # fmt: skip
    if not os.access(directory, os.W_OK | os.X_OK):
        return StoreOpenError(
            path, f"its directory {directory} is not writable (SQLite keeps its journal "
            "beside the file)",
            f"give the coordinator's user write access to {directory}, or choose another "
            "--data-dir",
        )  # fmt: skip
    return StoreOpenError(
        path, text, "check the file and its directory, or choose another --data-dir"
    )


def _read_only_mount(directory: Path) -> Path | None:
    """The nearest existing directory at or above `directory` when it is on a read-only
    file system, else None."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is None:
        return None
    try:
        flags = os.statvfs(existing).f_flag
    except OSError:
        return None
    return existing if flags & os.ST_RDONLY else None


@contextmanager
def opening(path: Path) -> Iterator[None]:
    """Turn what fails while the store at `path` opens into one StoreOpenError."""
    try:
        yield
    except StoreOpenError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise diagnose(path, exc) from exc
