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
    InsertRowid,
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


def _insert_rowid(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    rowid = conn.execute(sql, params).lastrowid
    if rowid is None:  # pragma: no cover - only for statements that insert nothing
        raise sqlite3.InterfaceError(f"no rowid from {sql[:60]!r}")
    return rowid


def _query(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _query_one(conn: sqlite3.Connection, sql: str, params: Any) -> Any:
    return conn.execute(sql, params).fetchone()


Perform: TypeAlias = Callable[[sqlite3.Connection, str, Any], Any]

_PERFORM: Final[dict[type[Statement[Any]], Perform]] = {
    Execute: _execute,
    ExecuteMany: _execute_many,
    InsertRowid: _insert_rowid,
    Query: _query,
    QueryOne: _query_one,
}


def plain_params(kind: type[Statement[Any]], params: Any) -> Any:
    """`params` as sqlite3 binds them fastest: a tuple subclass (a row type's NamedTuple)
    as a plain tuple, which sqlite3 binds much faster (an 18-column upsert: 46.0k
    instructions against 31.9k, the slice 0.9k) and pickles for the writer process without
    running Python code."""
    if kind is ExecuteMany:
        return [p[:] for p in params]
    if params.__class__ is not tuple and isinstance(params, tuple):
        return params[:]
    return params


def run_statement(conn: sqlite3.Connection, statement: Statement[T]) -> T:
    """Run one statement on `conn`; its result (sqlite3 errors as they come)."""
    sql, kind = statement.sql, statement.__class__
    text = sql if isinstance(sql, str) else sql.sqlite
    result: T = _PERFORM[kind](conn, text, plain_params(kind, statement.params))
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
    # write or read (writes of a busy coordinator pass here at thousands per second); a lone
    # statement is run without a transaction function around it.
    def write(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]:
        """Run `work` in the writer's next group commit; its result once committed."""
        kind = work.__class__
        perform = _PERFORM.get(kind)  # type: ignore[arg-type]
        if perform is None:
            return self._db.call(run_transaction, work, args)
        # No cast(): its Statement[T] would be subscripted at run time, at every write.
        sql, params = work.sql, args[0] if args else work.params  # type: ignore[union-attr]
        text = sql if isinstance(sql, str) else sql.sqlite
        if kind is ExecuteMany or (params.__class__ is not tuple and params.__class__ is not list):
            params = plain_params(kind, params)  # type: ignore[arg-type]
        return self._db.call(perform, text, params)

    def read(
        self, work: Statement[T] | Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]:
        """Run `work` on a read connection; it sees every write that has returned."""
        kind = work.__class__
        perform = _PERFORM.get(kind)  # type: ignore[arg-type]
        if perform is None:
            return self._db.read(lambda conn: read_transaction(conn, work, args))  # type: ignore[arg-type]
        sql, params = work.sql, args[0] if args else work.params  # type: ignore[union-attr]
        text = sql if isinstance(sql, str) else sql.sqlite
        if kind is ExecuteMany or (params.__class__ is not tuple and params.__class__ is not list):
            params = plain_params(kind, params)  # type: ignore[arg-type]
        return self._db.read(lambda conn: perform(conn, text, params))
