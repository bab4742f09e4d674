"""Where a running `apiary serve` listens, recorded in its data directory, so that the client
commands run with the same data directory (`APIARY_DATA_DIR`, else `./.apiary`) find it
when no address is given.

`apiary serve` writes `serving.json` once both ports serve (the addresses it bound, a port
the OS chose for port 0 included) and removes it when it stops cleanly. A record whose
process is gone (a crash, SIGKILL) is ignored, and the next `apiary serve` replaces it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from apiary.server.config.address import Address
from apiary.server.config.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR
from apiary.system import process_alive

SERVING_FILE: Final = "serving.json"
MAX_RECORD_BYTES: Final = 4096
_ANY_HOST: Final = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
"""A port bound on every interface is reached over loopback from the same machine."""


@dataclass(frozen=True, slots=True)
class Serving:
    """The addresses one `apiary serve` process answers on, as a client on the same
    machine reaches them (HOST:PORT; an IPv6 host in brackets)."""

    grpc: str
    http: str
    pid: int
    tls: bool = False

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.http}"

    @property
    def console_url(self) -> str:
        return f"{self.http_url}/console"


def reachable_address(host: str, port: int) -> str:
    """HOST:PORT to connect to a port bound on `host` (every interface: over loopback)."""
    return str(Address(_ANY_HOST.get(host, host), port))


def client_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The data directory a client command looks in: `APIARY_DATA_DIR`, else `./.apiary`,
    taken as `apiary serve` takes them without `--data-dir` (the path as written: no `~`
    expansion)."""
    env = os.environ if env is None else env
    named = env.get(DATA_DIR_ENV, "")
    return Path(named) if named else DEFAULT_DATA_DIR


def record(data_dir: Path, serving: Serving) -> Path:
    """Write the record (replacing any), whole or not at all; the file's path."""
    path = data_dir / SERVING_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{SERVING_FILE}.{serving.pid}")
    partial.write_text(json.dumps(asdict(serving)) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def forget(data_dir: Path, pid: int) -> None:
    """Remove the record when it is the one process `pid` wrote (another coordinator may
    have replaced it since)."""
    path = data_dir / SERVING_FILE
    found = _read(path)
    if found is not None and found.pid == pid:
        path.unlink(missing_ok=True)


def recorded(data_dir: Path) -> Serving | None:
    """The record of a coordinator serving `data_dir` now, or None: no record, one that
    cannot be read, or one whose process is gone."""
    found = _read(data_dir / SERVING_FILE)
    return found if found is not None and process_alive(found.pid) else None


def _read(path: Path) -> Serving | None:
    try:
        with path.open("rb") as source:
            data = source.read(MAX_RECORD_BYTES + 1)
        doc: Any = json.loads(data) if len(data) <= MAX_RECORD_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    grpc, http, pid, tls = (doc.get(k) for k in ("grpc", "http", "pid", "tls"))
    if not (isinstance(grpc, str) and isinstance(http, str) and isinstance(pid, int)):
        return None
    return Serving(grpc, http, pid, tls is True)
