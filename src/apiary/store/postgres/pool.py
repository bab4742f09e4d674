"""A small pool of psycopg async connections, each pinned to one schema, and the few
helpers the PostgreSQL aggregates query it with.

psycopg_pool is not a dependency; the store needs little: at most `size` connections, made
on demand, reused while healthy, dropped when broken (or found, when lent, ended by the
server while idle) or left inside a transaction. Every
connection runs in autocommit mode (a read is one statement) and opens transactions
explicitly, with `search_path` set to the store's schema so SQL and migrations use
unqualified names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import psycopg
from psycopg import pq, sql
from psycopg.rows import TupleRow

from apiary.store.errors import StoreError, StoreUnavailableError

RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0


class Backoff:
    """When the next connection attempt may be made, after consecutive failures."""

    def __init__(self) -> None:
        self._next = 0.0
        self._delay = 0.0
        self.last_error = ""

    def remaining(self, now: float) -> float:
        return max(0.0, self._next - now)

    def failed(self, now: float, error: str) -> None:
        self._delay = min(RECONNECT_MAX_S, max(RECONNECT_FIRST_S, self._delay * 2))
        self._next = now + self._delay
        self.last_error = error

    def succeeded(self) -> None:
        self._delay = self._next = 0.0
        self.last_error = ""


Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]


class PostgresPool:
    """Up to `size` connections to `conninfo`, with search_path set to `schema`.

    psycopg errors raised while a connection is lent out arrive as StoreError (the driver's
    error kept as the cause): StoreUnavailableError when the server could not be reached or
    the connection was lost (retry), other exceptions pass through unchanged. After a failed
    connect, the next attempts wait out a backoff that doubles up to RECONNECT_MAX_S (each
    refused at once with StoreUnavailableError until then), so that an outage is not met
    with a connection attempt per request.
    """

    def __init__(self, conninfo: str, schema: str, *, size: int = 4) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1: {size}")
        self._conninfo = conninfo
        self._schema = schema
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._closed = False
        self._backoff = Backoff()

    @property
    def schema(self) -> str:
        """The schema every connection works in."""
        return self._schema

    @property
    def conninfo(self) -> str:
        """What the connections connect to (a libpq string or URL)."""
        return self._conninfo

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Lend a connection for the duration of the block."""
        if self._closed:
            raise StoreError("the PostgreSQL store is closed")
        async with self._slots:
            conn = await self._borrow()
            try:
                yield conn
            except psycopg.Error as exc:
                raise store_error(exc) from exc
            finally:
                await self._give_back(conn)

    async def close(self) -> None:
        """Close the idle connections; lent ones are closed when given back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    async def _borrow(self) -> Connection:
        """An idle connection the server has not ended while it sat idle, else a new one.
        A session ended by the server (an administrator's pg_terminate_backend, a restart,
        idle_session_timeout) is only learnt of by reading it: lent unchecked, it would
        fail its borrower's first statement, a write that cannot be tried again (a
        deregistration, say) answered `unavailable` long after the cause is gone."""
        while self._idle:
            conn = self._idle.pop()
            if not ended_while_idle(conn):
                return conn
            await conn.close()
        return await self._connect()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        wait = self._backoff.remaining(loop.time())
        if wait > 0:
            raise StoreUnavailableError(
                f"PostgreSQL cannot be reached; the next attempt in {wait:.1f} s "
                f"(last error: {self._backoff.last_error})"
            )
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            self._backoff.failed(loop.time(), str(exc).strip().splitlines()[0][:200])
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        self._backoff.succeeded()
        try:
            await set_search_path(conn, self._schema)
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, psycopg.OperationalError):  # lost as soon as it was made
                raise StoreUnavailableError(f"PostgreSQL: {exc}") from exc
            raise
        return conn

    async def _give_back(self, conn: Connection) -> None:
        # A connection still in a transaction (e.g. its task was cancelled mid-query) or
        # broken must not be reused: the next borrower would inherit its state.
        healthy = not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE
        if healthy and not self._closed:
            self._idle.append(conn)
            return
        lost = conn.closed or conn.info.transaction_status == pq.TransactionStatus.UNKNOWN
        await conn.close()
        if lost:
            # What cut this one (a restart, an administrator ending the sessions) may have
            # cut the idle ones too: the next borrower gets a new connection, so that a
            # read tried again (`PostgresSqlDatabase.read`) does not meet another cut one.
            idle, self._idle = self._idle, []
            for other in idle:
                await other.close()


def ended_while_idle(conn: Connection) -> bool:
    """Whether the server ended `conn`, idle (no statement in flight), since its last
    statement: what arrived meanwhile is read without waiting. A backend ends a session by
    sending its FATAL error and closing the socket; the first read takes the message, the
    second meets the closed stream (a healthy connection has nothing to read: two reads
    that find nothing, no round trip)."""
    if conn.closed:
        return True
    try:
        conn.pgconn.consume_input()
        conn.pgconn.consume_input()
    except psycopg.OperationalError:
        return True
    return conn.pgconn.status != pq.ConnStatus.OK


def store_error(exc: psycopg.Error) -> StoreError:
    """A psycopg error as the store's: StoreUnavailableError for a connection that could not
    be made or was lost (retry), StoreError otherwise; the driver's error kept as the
    cause."""
    lost = isinstance(exc, psycopg.OperationalError)
    error = (StoreUnavailableError if lost else StoreError)(f"PostgreSQL: {exc}")
    error.__cause__ = exc
    return error


async def set_search_path(conn: Connection, schema: str) -> None:
    """Make `schema` the only schema unqualified names resolve to (besides pg_catalog)."""
    path = sql.Identifier(schema).as_string(conn)
    await conn.execute("SELECT set_config('search_path', %s, false)", [path])


async def fetch_rows(
    conn: Connection, query: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    """Every row `query` returns on `conn`."""
    cursor = await conn.execute(query, params)
    return await cursor.fetchall()


async def fetch_all(
    pool: PostgresPool, query: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    """Every row `query` returns, on a connection of `pool`."""
    async with pool.connection() as conn:
        return await fetch_rows(conn, query, params)


async def scalar(cursor: psycopg.AsyncCursor[TupleRow]) -> int:
    """The first column of the first row of `cursor`, as an int."""
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError("query returned no row")
    return int(row[0])
