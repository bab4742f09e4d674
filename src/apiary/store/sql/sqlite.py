"""The SQLite driver of transactions (`statements`), and `SqlDatabase` over a `SqliteDatabase`.

The driver is synchronous: it runs inside a write job (the writer thread or the writer
process, in the writer's transaction) or a read query (a reader thread). A write goes to the
writer as the job `run_transaction(conn, function, args)` (`SqliteDatabase.call`), which the
writer process unpickles as the names of two module-level functions and the arguments.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeAlias, TypeVar, TypeVarTuple

from apiary.store.sql.dialect import SQLITE, Dialect
from apiary.store.sql.statements import (
    Execute,
    ExecuteMany,
    Query,
    QueryOne,
    Statement,
    Transaction,
)
from apiary.store.sqlite.database import SqliteDatabase
from apiary.store.sqlite.writer import as_store_error

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def _execute(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    return conn.execute(sql, params).rowcount


def _execute_many(conn: sqlite3.Connection, sql: str, params: Any) -> None:
    if params:
        conn.executemany(sql, params)


def _query(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _query_one(conn: sqlite3.Connection, sql: str, params: Any) -> Any:
    return conn.execute(sql, params).fetchone()


Perform: TypeAlias = Callable[[sqlite3.Connection, str, Any], Any]

_PERFORM: Final[dict[type[Statement[Any]], Perform]] = {
    Execute: _execute,
    ExecuteMany: _execute_many,
    Query: _query,
    QueryOne: _query_one,
}


def plain(statement: Statement[Any]) -> tuple[Perform, str, Any]:
    """What runs `statement` on a connection: (a module-level function, SQLite's text, the
    parameters as plain tuples).

    A row type's NamedTuple becomes a plain tuple (a slice): sqlite3 binds a tuple subclass
    much slower (an 18-column upsert: 46.0k instructions against 31.9k, the slice 0.9k),
    and pickling one for the writer process goes through Python code."""
    sql, params, kind = statement.sql, statement.params, statement.__class__
    if kind is ExecuteMany:
        params = [p[:] for p in params]
    elif params.__class__ is not tuple and isinstance(params, tuple):
        params = params[:]
    return _PERFORM[kind], (sql if isinstance(sql, str) else sql.sqlite), params


def run_statement(conn: sqlite3.Connection, statement: Statement[T]) -> T:
    """Run one statement on `conn`; its result (sqlite3 errors as they come)."""
    perform, text, params = plain(statement)
    result: T = perform(conn, text, params)
    return result


def run_transaction(
    conn: sqlite3.Connection, function: Callable[..., Transaction[T]], args: tuple[Any, ...]
) -> T:
    """Run the transaction `function(SQLITE, *args)` on `conn`, inside whatever transaction
    the caller holds; its result. A sqlite3 error is thrown into it as a StoreError."""
    transaction = function(SQLITE, *args)
    try:
        statement = next(transaction)
        while True:
            try:
                result = run_statement(conn, statement)
            except sqlite3.Error as exc:
                statement = transaction.throw(as_store_error(exc))
            else:
                statement = transaction.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


def read_transaction(
    conn: sqlite3.Connection, function: Callable[..., Transaction[T]], args: tuple[Any, ...]
) -> T:
    """`run_transaction` in a read transaction of its own on a read connection: every
    statement sees the same committed state."""
    conn.execute("BEGIN")
    try:
        return run_transaction(conn, function, args)
    finally:
        conn.execute("COMMIT")


class SqliteSqlDatabase:
    """`SqlDatabase` over an open SQLite database: writes go to its group-committing writer,
    reads to its read connections."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    @property
    def dialect(self) -> Dialect:
        """SQLite's."""
        return SQLITE

    @property
    def database(self) -> SqliteDatabase:
        """The SQLite database underneath."""
        return self._db

    # Not coroutines themselves: each returns the database's awaitable, one frame less per
    # write or read (writes of a busy coordinator pass here at thousands per second).
    def write(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]:
        """Run `work` in the writer's next group commit; its result once committed."""
        if isinstance(work, Statement):
            return self._db.call(*plain(work))
        return self._db.call(run_transaction, work, args)

    def read(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]:
        """Run `work` on a read connection; it sees every write that has returned."""
        if isinstance(work, Statement):
            perform, text, params = plain(work)
            return self._db.read(lambda conn: perform(conn, text, params))
        return self._db.read(lambda conn: read_transaction(conn, work, args))
