"""Open the backend a `--store` URL names (DESIGN.md sections 1 and 6).

| URL | backend |
|---|---|
| none, "" or `sqlite` | SQLite file `DATA_DIR/apiary.db` (the directory is created, mode 0700) |
| `sqlite:///ABSOLUTE/PATH.db` | SQLite file at that path |
| `memory://` | process memory, gone on exit |
| `postgresql://...` or `postgres://...` | PostgreSQL; `apiary_schema=NAME` picks the schema |

SQLite URLs take `?synchronous=NORMAL|FULL` (default NORMAL: durable against process crashes;
FULL: also against power loss, see `apiary.store.sqlite.database`) and
`?writer=loop|thread|process`: where the group commits run. `loop` (the default with NORMAL)
runs them on the coordinator's event loop between its callbacks
(`apiary.store.sqlite.loop_writer`); `thread` (the default with FULL, whose every commit
waits for the disk) on a thread of the coordinator; `process` in a process of their own
(`apiary.store.sqlite.writer_process`). Both together: `sqlite:?synchronous=FULL&writer=process`
for the default file.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, cast, get_args
from urllib.parse import parse_qsl, unquote, urlsplit

from apiary.core.access.principal import DEFAULT_TENANT
from apiary.store.memory.store import open_memory_store
from apiary.store.postgres.store import (
    DEFAULT_SCHEMA,
    open_postgres_store,
    split_schema_parameter,
)
from apiary.store.protocols import Store
from apiary.store.sqlite.database import (
    SqliteOptions,
    Synchronous,
    WriterKind,
    default_writer,
)
from apiary.store.sqlite.opening import opening
from apiary.store.sqlite.store import open_sqlite_store

DEFAULT_SQLITE_FILE = "apiary.db"
POSTGRES_IDENTIFIER_BYTES = 63

ACCEPTED_FORMS = (
    "nothing or 'sqlite' (DATA_DIR/apiary.db), 'sqlite:///ABSOLUTE/PATH.db', 'memory://', "
    "'postgresql://...' or 'postgres://...'"
)


@asynccontextmanager
async def open_store(url: str | None, data_dir: Path, tenant: str = "") -> AsyncIterator[Store]:
    """Open the store `url` names (see the module doc), closing it on exit.

    A `tenant` other than the default ('' or 'default') gets a store of its own beside the
    default one (DESIGN.md section 9: another tenant's objects are never within reach): the
    SQLite file of `tenant_data_dir`, a PostgreSQL schema of its own (`tenant_schema`), a
    memory store of its own.

    Raises ValueError for a URL of an unknown form, naming the accepted forms.
    """
    backend = _backend(url or "")
    if tenant in ("", DEFAULT_TENANT):
        tenant = ""
    if backend == "postgresql":
        assert url is not None
        _, schema = split_schema_parameter(url)
        named = tenant_schema(schema or DEFAULT_SCHEMA, tenant) if tenant else None
        async with open_postgres_store(url, schema=named) as postgres:
            yield postgres
    elif backend == "memory":
        async with open_memory_store() as memory:
            yield memory
    else:
        path, options = sqlite_location(url or "", data_dir)
        if tenant:
            path = (
                default_sqlite_path(tenant_data_dir(data_dir, tenant))
                if path == data_dir / DEFAULT_SQLITE_FILE
                else path.with_name(f"{path.stem}.tenant-{tenant}{path.suffix}")
            )
        async with open_sqlite_store(path, options) as sqlite:
            yield sqlite


def tenant_data_dir(data_dir: Path, tenant: str) -> Path:
    """Where a tenant other than the default keeps its files: DATA_DIR/tenants/TENANT."""
    if tenant in ("", DEFAULT_TENANT):
        return data_dir
    return data_dir / "tenants" / tenant


def tenant_schema(schema: str, tenant: str) -> str:
    """The PostgreSQL schema of a tenant other than the default (at most 63 bytes: a long
    tenant name is replaced by its digest)."""
    name = f"{schema}_t_{tenant}"
    if len(name.encode()) <= POSTGRES_IDENTIFIER_BYTES:
        return name
    return f"{schema}_t_{hashlib.sha256(tenant.encode()).hexdigest()[:24]}"


def check_store_url(url: str | None) -> None:
    """Raise the ValueError `open_store` would raise for the form of `url`, opening and
    creating nothing (a PostgreSQL URL is checked when it connects)."""
    if _backend(url or "") == "sqlite":
        _parse_sqlite(url or "")


def _backend(url: str) -> Literal["postgresql", "memory", "sqlite"]:
    """Which backend `url` names by its scheme; ValueError naming the accepted forms."""
    scheme = url.partition(":")[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme == "memory" and url in ("memory", "memory://"):
        return "memory"
    if scheme in ("", "sqlite"):
        return "sqlite"
    raise _unsupported(url)


def sqlite_location(url: str, data_dir: Path) -> tuple[Path, SqliteOptions]:
    """The file and options a SQLite store URL names; creates `data_dir` for the default."""
    path, options = _parse_sqlite(url)
    return (default_sqlite_path(data_dir) if path is None else path), options


def _parse_sqlite(url: str) -> tuple[Path | None, SqliteOptions]:
    """The file (None: the data directory's) and options of a SQLite store URL."""
    if url in ("", "sqlite"):
        return None, SqliteOptions()
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise _unsupported(url)
    if parts.netloc or parts.fragment:
        raise ValueError(f"a SQLite store URL is sqlite:///ABSOLUTE/PATH.db, not {url!r}")
    options = _sqlite_options(url, parts.query)
    if not parts.path:
        return None, options
    path = Path(unquote(parts.path))
    if not path.is_absolute() or parts.path.endswith("/"):
        raise ValueError(f"a SQLite store URL is sqlite:///ABSOLUTE/PATH.db, not {url!r}")
    return path, options


def default_sqlite_path(data_dir: Path) -> Path:
    """DATA_DIR/apiary.db, creating DATA_DIR (mode 0700: it holds every message) if needed."""
    path = data_dir / DEFAULT_SQLITE_FILE
    with opening(path):
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


_SQLITE_OPTIONS: dict[str, tuple[str, ...]] = {
    "synchronous": get_args(Synchronous),
    "writer": get_args(WriterKind),
}
"""The options a SQLite store URL takes and their values (any letter case)."""


def _sqlite_options(url: str, query: str) -> SqliteOptions:
    chosen: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        values = _SQLITE_OPTIONS.get(key)
        if values is None:
            known = ", ".join(_SQLITE_OPTIONS)
            raise ValueError(f"unknown SQLite store option {key!r} in {url!r} (known: {known})")
        match = [v for v in values if v.lower() == value.lower()]
        if not match:
            raise ValueError(f"{key} must be {' or '.join(values)}, not {value!r}")
        chosen[key] = match[0]
    synchronous = cast(Synchronous, chosen.get("synchronous", "NORMAL"))
    return SqliteOptions(
        synchronous=synchronous,
        writer=cast(WriterKind, chosen.get("writer", default_writer(synchronous))),
    )


def _unsupported(url: str) -> ValueError:
    # Only the scheme is echoed: the rest of a URL may hold a password.
    scheme = url.partition(":")[0][:40]
    return ValueError(f"unsupported store URL (scheme {scheme!r}); accepted: {ACCEPTED_FORMS}")
