"""One serving coordinator per store: the claim `apiary serve` holds on its store.

Two coordinators serving one store without cluster mode split the brain: each routes only
what it admitted and knows only the agents registered through it. So a coordinator claims
its store before it recovers or serves anything, holds the claim while it runs, and a second
one is refused with `StoreClaimedError` naming the holder. The claim is released by the
operating system or the database when its holder ends, however it ends (SIGKILL included),
so a restarted coordinator never waits for a claim nobody holds.

- SQLite: an exclusive `flock` on `<database>.serving` beside the database file, which holds
  the holder's description (JSON: pid, host, addresses, since).
- PostgreSQL: a session advisory lock keyed on the schema, held by a connection of its own
  whose `application_name` describes the holder (read back through `pg_locks` and
  `pg_stat_activity` to name it). The connection is watched: when the database drops it (a
  restart, a cut), the claim is taken again on a new one; if another coordinator took it
  meanwhile, the claim is lost for good: `taken` is set and an error is logged, and the
  coordinator stops serving (`apiary serve` exits 2), since the other one may already have
  served the store.
- memory: nothing to share, nothing to claim.

Commands that open a store briefly (the CLI's local reads) do not claim it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import psycopg

from apiary.stopping import stop_tasks
from apiary.store.errors import StoreError
from apiary.store.postgres.store import PostgresStore
from apiary.store.protocols import Store
from apiary.store.sqlite.store import SqliteStore

log = logging.getLogger("apiary.store.claim")

LOCK_NAMESPACE: Final = 0x41504959
"""The first key of the PostgreSQL advisory lock ('APIY'); the second is the schema's hash."""
WATCH_EVERY_S: Final = 2.0
"""How often the PostgreSQL claim's connection is checked."""
APPLICATION_NAME_BYTES: Final = 63


class StoreClaimedError(StoreError):
    """Another live coordinator serves this store (and cluster mode is off)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a claim: enough for an operator to find it."""

    pid: int
    host: str
    since: str
    addresses: str = ""

    @classmethod
    def here(cls, since: str) -> Holder:
        return cls(os.getpid(), socket.gethostname(), since)

    def text(self) -> str:
        where = f", serving {self.addresses}" if self.addresses else ""
        return f"pid {self.pid} on {self.host}{where}, since {self.since}"

    def tag(self) -> str:
        """The holder in PostgreSQL's application_name (at most 63 bytes)."""
        tag = f"apiary pid={self.pid} {self.addresses} host={self.host}".replace("  ", " ")
        return tag.encode()[:APPLICATION_NAME_BYTES].decode(errors="ignore")


class Claim:
    """A held claim; `describe` updates what others are told about its holder."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        self.taken = asyncio.Event()
        """Set when the database dropped the claim and another coordinator took it
        (PostgreSQL): this one must stop serving. Never cleared: the claim is not taken
        again, since the other coordinator may have served the store meanwhile."""

    @property
    def lost(self) -> bool:
        """Whether another coordinator took the claim (`taken`)."""
        return self.taken.is_set()

    def check_now(self) -> None:
        """Check that the claim is still held without waiting for the next check (a claim
        the operating system holds cannot be lost: nothing to do)."""

    async def describe(self, addresses: str) -> None:
        self.holder = Holder(self.holder.pid, self.holder.host, self.holder.since, addresses)


def refusal(store_name: str, other: str) -> StoreClaimedError:
    return StoreClaimedError(
        f"{store_name} is served by another coordinator ({other}); stop it first, give this "
        "one a store of its own (--store, --data-dir), or run both as replicas in cluster mode"
    )


@asynccontextmanager
async def claim_store(store: Store, holder: Holder) -> AsyncIterator[Claim]:
    """Claim `store` for the duration of the block (module docstring); StoreClaimedError
    naming the holder when another coordinator holds it."""
    if isinstance(store, SqliteStore):
        async with _claim_file(store.database.path, holder) as claim:
            yield claim
    elif isinstance(store, PostgresStore):
        async with _claim_schema(store, holder) as claim:
            yield claim
    else:
        yield Claim(holder)


# --- SQLite -------------------------------------------------------------------------------


def claim_path(database: Path) -> Path:
    return database.with_name(database.name + ".serving")


class _FileClaim(Claim):
    def __init__(self, holder: Holder, fd: int) -> None:
        super().__init__(holder)
        self._fd = fd

    async def describe(self, addresses: str) -> None:
        await super().describe(addresses)
        _write_holder(self._fd, self.holder)


@asynccontextmanager
async def _claim_file(database: Path, holder: Holder) -> AsyncIterator[Claim]:
    path = claim_path(database)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise refusal(f"the SQLite database {database}", _read_holder(fd)) from None
        _write_holder(fd, holder)
        yield _FileClaim(holder, fd)
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _write_holder(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)


def _read_holder(fd: int) -> str:
    raw = os.pread(fd, 4096, 0)
    try:
        found: Any = json.loads(raw)
        return Holder(**found).text()
    except (ValueError, TypeError):
        return "its holder did not say who it is"


# --- PostgreSQL ---------------------------------------------------------------------------


class _SchemaClaim(Claim):
    def __init__(self, holder: Holder, conn: psycopg.AsyncConnection[Any]) -> None:
        super().__init__(holder)
        self.conn = conn
        self.due = asyncio.Event()
        """Set: check the connection now instead of at the next WATCH_EVERY_S."""

    def check_now(self) -> None:
        self.due.set()

    async def describe(self, addresses: str) -> None:
        await super().describe(addresses)
        with contextlib.suppress(psycopg.Error):
            await self.conn.execute("SELECT set_config('application_name', %s, false)",
                                    [self.holder.tag()])  # fmt: skip


@asynccontextmanager
async def _claim_schema(store: PostgresStore, holder: Holder) -> AsyncIterator[Claim]:
    conninfo, schema = store.pool.conninfo, store.schema
    claim = _SchemaClaim(holder, await _take(conninfo, schema, holder))
    watcher = asyncio.create_task(_watch(claim, conninfo, schema), name="apiary-store-claim")
    try:
        yield claim
    finally:
        await stop_tasks([watcher], "the store claim's watcher")
        with contextlib.suppress(psycopg.Error):
            await claim.conn.close()


async def _take(conninfo: str, schema: str, holder: Holder) -> psycopg.AsyncConnection[Any]:
    """A connection holding the schema's advisory lock; StoreClaimedError naming the holder
    when another session holds it."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, application_name=holder.tag()
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot claim the PostgreSQL schema {schema}: {exc}") from exc
    try:
        cursor = await conn.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", [LOCK_NAMESPACE, schema]
        )
        row = await cursor.fetchone()
        if row is not None and row[0]:
            return conn
        cursor = await conn.execute(
            "SELECT a.application_name, host(a.client_addr), a.backend_start"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
            " AND l.classid = %s::bigint::oid"
            " AND l.objid = (hashtext(%s)::bigint & 4294967295)::oid",
            [LOCK_NAMESPACE, schema],
        )
        found = await cursor.fetchone()
    except psycopg.Error as exc:
        await conn.close()
        raise StoreError(f"cannot claim the PostgreSQL schema {schema}: {exc}") from exc
    await conn.close()
    other = "a session that has since ended"
    if found is not None:
        name, address, since = found
        where = f" from {address}" if address else ""
        other = f"{name or 'an unnamed session'}{where}, connected since {since:%Y-%m-%d %H:%M:%S}"
    raise refusal(f"the PostgreSQL schema {schema}", other)


async def _watch(claim: _SchemaClaim, conninfo: str, schema: str) -> None:
    """Keep the claim: check its connection; take the claim again on a new one when the
    database dropped it; stop, with `taken` set, when another coordinator holds it now."""
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WATCH_EVERY_S):
                await claim.due.wait()
        claim.due.clear()
        try:
            await claim.conn.execute("SELECT 1")
            continue
        except psycopg.Error:
            pass
        with contextlib.suppress(psycopg.Error):
            await claim.conn.close()
        try:
            claim.conn = await _take(conninfo, schema, claim.holder)
        except StoreClaimedError as exc:
            log.error(
                "lost the claim on the PostgreSQL schema %s: %s; this coordinator stops "
                "serving it", schema, exc,
            )  # fmt: skip
            claim.taken.set()
            return
        except StoreError as exc:
            log.warning("the claim on the PostgreSQL schema %s cannot be checked: %s", schema, exc)
