"""What `apiary serve` says when its SQLite store cannot be opened (store/sqlite/opening.py):
the file, the cause and the fix, for each cause.

File modes do not hold root back, and the tests run as root here: where a case turns on
what the process may write, `os.access` is replaced to answer as for an unprivileged user
(the one mock of this file; the read-only mounts of tests/e2e/test_storage_faults.py are
the real thing)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from apiary.store.sqlite import opening
from apiary.store.sqlite.opening import diagnose


def _denied(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    refused = {str(p) for p in paths}
    real = os.access

    def access(path: object, mode: int, **kwargs: object) -> bool:
        if str(path) in refused and mode & os.W_OK:
            return False
        return real(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(opening.os, "access", access)


def test_a_corrupted_file() -> None:
    error = diagnose(Path("/data/apiary.db"), sqlite3.DatabaseError("file is not a database"))
    assert (error.cause, str(error.path)) == (
        "it is not an SQLite database or is corrupted (file is not a database)",
        "/data/apiary.db",
    )
    assert "restore it from a backup" in error.fix


def test_a_directory_that_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _denied(monkeypatch, tmp_path)
    error = diagnose(tmp_path / "apiary.db", sqlite3.OperationalError("unable to open"))
    assert error.cause.startswith(f"its directory {tmp_path} is not writable")
    assert f"write access to {tmp_path}" in error.fix


def test_a_read_only_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "apiary.db").write_bytes(b"")
    _denied(monkeypatch, tmp_path / "apiary.db")
    error = diagnose(tmp_path / "apiary.db", sqlite3.OperationalError("unable to open"))
    assert error.cause == "the file is read-only"
    assert f"chmod u+w {tmp_path / 'apiary.db'}" in error.fix


def test_a_directory_that_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _denied(monkeypatch, tmp_path)
    error = diagnose(tmp_path / "a" / "b" / "apiary.db", PermissionError("denied"))
    assert error.cause == (
        f"its directory {tmp_path / 'a' / 'b'} does not exist and cannot be made "
        f"({tmp_path} is not writable)"
    )


def test_the_message_is_one_line_naming_file_cause_and_fix() -> None:
    error = diagnose(
        Path("/d/apiary.db"), sqlite3.DatabaseError("database disk image is malformed")
    )
    text = str(error)
    assert "\n" not in text
    assert text.startswith("cannot open the store /d/apiary.db: it is not an SQLite database")
