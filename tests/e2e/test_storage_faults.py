"""A store that cannot be used as it is stops `apiary serve` with one line naming the file,
the cause and the fix, and exit status 2 (no traceback): a corrupted database file, a data
directory on a read-only file system (an existing store, or one to be made). File modes that
forbid writing are diagnosed in tests/unit/test_store_opening.py.

Permissions do not hold root back, so the read-only cases run the coordinator in a mount
namespace of its own where the directory is bind-mounted read-only (`unshare -m`, as root)."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.getuid() == 0


def _serve(data_dir: Path, *, read_only: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`apiary serve` on `data_dir`; with `read_only`, that directory mounted read-only."""
    command = [sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(data_dir),
               "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]  # fmt: skip
    if read_only is not None:
        assert ROOT and shutil.which("unshare"), "read-only mounts need root and unshare(1)"
        where = shlex.quote(str(read_only))
        script = (
            f"mount --bind {where} {where} && mount -o remount,ro,bind {where} && "
            f"exec {shlex.join(command)}"
        )
        command = ["unshare", "-m", "sh", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _one_line(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("apiary serve: cannot open the store ")
    for part in parts:
        assert part in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


def _store(data: Path) -> None:
    """A store that was served once (its file exists)."""
    data.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(data / "apiary.db") as conn:
        conn.execute("CREATE TABLE t (x)")


def test_a_corrupted_database_file(tmp_path: Path) -> None:
    (tmp_path / "apiary.db").write_bytes(os.urandom(20_000))
    _one_line(_serve(tmp_path), str(tmp_path / "apiary.db"), "corrupted", "restore it")


@pytest.mark.skipif(not ROOT, reason="a read-only bind mount needs root")
def test_a_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    done = _serve(data, read_only=data)
    _one_line(done, str(data / "apiary.db"), f"{data} is mounted read-only", "read-write")


@pytest.mark.skipif(not ROOT, reason="a read-only bind mount needs root")
def test_a_data_directory_that_cannot_be_made_on_a_read_only_file_system(tmp_path: Path) -> None:
    done = _serve(tmp_path / "data", read_only=tmp_path)
    _one_line(done, str(tmp_path / "data" / "apiary.db"), "mounted read-only")
