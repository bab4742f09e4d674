"""Transactions as descriptions: generators of statements, run by a driver per database.

A transaction is a generator function `fn(dialect, *args)` that yields statements and
receives their results, and returns the transaction's result:

    def _put(d: Dialect, provider_id: str, tools: list[ToolRow]) -> Transaction[bool]:
        gone = yield from Execute("DELETE FROM tools WHERE provider_id = ?", (provider_id,))
        yield from ExecuteMany(_PUT_TOOL, tools)
        return gone > 0

(`yield from` gives the result its type; a plain `yield` works too.) It does no I/O and
keeps no state outside itself, so one description serves both databases: the SQLite driver
runs it on a `sqlite3.Connection`, in the writer thread or the writer process (it is pickled
there as the function's name and its arguments, so a write transaction is a module-level
function of plain values), the PostgreSQL driver on an async psycopg connection. A database
error reaches the generator as a StoreError thrown at the statement's `yield`; it may
catch it to raise a clearer error, but not go on (PostgreSQL has aborted the transaction).
Since it keeps no state outside itself (nor changes its arguments), a driver may run it
again from the start: PostgreSQL's does when the database aborted it for a deadlock or a
serialization failure (`store.postgres.rerun`).

A lone statement is a transaction of its own (`SqlDatabase.write(Execute(...))`): the
drivers run it without BEGIN and COMMIT around it where the database allows. One that runs
often is a module-level constant given its parameters where it runs
(`db.write(_PUT, row)`), which saves allocating it per call.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

from apiary.store.sql.dialect import Sql

T = TypeVar("T")
Row: TypeAlias = tuple[Any, ...]
"""A fetched row: map it with `Columns.of`."""


class Statement(Generic[T]):
    """One statement and its parameters; running it gives a `T`."""

    __slots__ = ("params", "sql")

    def __init__(self, sql: Sql, params: Sequence[Any] = ()) -> None:
        self.sql = sql
        self.params = params

    def __iter__(self) -> Generator[Statement[Any], Any, T]:
        """`result = yield from statement`: the statement's result, typed."""
        result: T = yield self
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sql!r}, {self.params!r})"


class Execute(Statement[int]):
    """A statement run for its effect; gives the number of rows it changed."""

    __slots__ = ()


class ExecuteMany(Statement[None]):
    """One statement run once per parameter row of `params` (none: not run)."""

    __slots__ = ()


class InsertRowid(Statement[int]):
    """An INSERT into a table whose integer key the database assigns (SQLite's rowid);
    gives the key of the last row it inserted. SQLite only: PostgreSQL's statements say
    what they return with RETURNING."""

    __slots__ = ()


class Query(Statement[list[Row]]):
    """A statement that returns rows (a SELECT, or a change with RETURNING): all of them."""

    __slots__ = ()


class QueryOne(Statement["Row | None"]):
    """A statement that returns at most one row: that row, or None."""

    __slots__ = ()


Transaction: TypeAlias = Generator[Statement[Any], Any, T]
"""What a transaction function returns (see the module docstring)."""
