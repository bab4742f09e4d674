"""The PostgreSQL driver of transactions (`statements`), and `SqlDatabase` over a pool.

A transaction runs on one pooled connection inside `conn.transaction()`; a lone statement
runs on its own in autocommit mode, one round trip instead of three (BEGIN, it, COMMIT).
Either is run again whole when PostgreSQL aborts it for a deadlock or a serialization
failure (`store.postgres.rerun`): a description of statements keeps no state outside itself,
so its second run is its first run over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, TypeVarTuple

import psycopg

from apiary.store.errors import StoreUnavailableError
from apiary.store.postgres.pool import Connection, PostgresPool, store_error
from apiary.store.postgres.rerun import rerun_when_aborted
from apiary.store.sql.dialect import POSTGRESQL, Dialect
from apiary.store.sql.statements import (
    Execute,
    ExecuteMany,
    Query,
    QueryOne,
    Statement,
    Transaction,
)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def run_statement(
    conn: Connection, statement: Statement[T], params: Sequence[Any] | None = None
) -> T:
    """Run one statement on `conn` with `params` (None: its own); its result (psycopg
    errors as they come)."""
    text = POSTGRESQL.render(statement.sql)
    kind = statement.__class__
    if params is None:
        params = statement.params
    result: Any
    if kind is ExecuteMany:
        if len(params) == 1:  # one round trip; executemany would enter pipeline mode
            await conn.execute(text, params[0])
        elif params:
            async with conn.cursor() as cursor:
                await cursor.executemany(text, params)
        result = None
    else:
        cursor = await conn.execute(text, params)
        if kind is Execute:
            result = cursor.rowcount
        elif kind is Query:
            result = await cursor.fetchall()
        else:
            assert kind is QueryOne, kind  # InsertRowid is SQLite's alone
            result = await cursor.fetchone()
    return result  # type: ignore[no-any-return]


async def run_transaction(
    conn: Connection, function: Callable[..., Transaction[T]], args: tuple[Any, ...]
) -> T:
    """Run the transaction `function(POSTGRESQL, *args)` on `conn` (in a transaction the
    caller opened); its result. A psycopg error is thrown into it as a StoreError
    (StoreUnavailableError for a lost connection)."""
    transaction = function(POSTGRESQL, *args)
    try:
        statement = next(transaction)
        while True:
            try:
                result = await run_statement(conn, statement)
            except psycopg.Error as exc:
                statement = transaction.throw(store_error(exc))
            else:
                statement = transaction.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


class PostgresSqlDatabase:
    """`SqlDatabase` over a `PostgresPool`."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    @property
    def dialect(self) -> Dialect:
        """PostgreSQL's."""
        return POSTGRESQL

    @property
    def pool(self) -> PostgresPool:
        """The pool underneath."""
        return self._pool

    async def write(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> T:
        """Run `work` in a transaction of its own (a lone statement in autocommit), again
        when PostgreSQL aborts it for a deadlock or a serialization failure."""
        return await rerun_when_aborted(lambda: self._run(work, args))

    async def _run(
        self, work: Statement[T] | Callable[..., Transaction[T]], args: tuple[Any, ...]
    ) -> T:
        async with self._pool.connection() as conn:
            if isinstance(work, Statement):
                params = args[0] if args else None
                return await run_statement(conn, work, params)
            async with conn.transaction():
                return await run_transaction(conn, work, args)

    async def read(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> T:
        """Run `work` as `write` does (the two differ only for SQLite), once more on a new
        connection when the connection lent was found cut (the database restarted, or an
        administrator ended its session while it was idle in the pool): a read is safe to
        repeat, and the second connection tells whether the database is there."""
        try:
            return await self.write(work, *args)
        except StoreUnavailableError:
            return await self.write(work, *args)
