"""The one thing an aggregate's SQL store needs of a database: `SqlDatabase`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, TypeVarTuple, overload

from apiary.store.sql.dialect import Dialect
from apiary.store.sql.statements import Statement, Transaction

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SqlDatabase(Protocol):
    """Runs transactions (`statements`) on one database; SQLite or PostgreSQL behind it.

    Both return an awaitable (`await db.write(...)`), a coroutine or the database's own.
    `write` runs a transaction that changes something, atomically: all of its statements
    commit or none; it returns once committed. `read` runs one that only reads, its
    statements seeing one committed state in SQLite (a read transaction; PostgreSQL's READ
    COMMITTED gives each statement its own). Either takes a lone statement instead, run
    without a transaction around it where the database allows. Write transactions must be
    module-level functions of plain, picklable arguments (the SQLite writer process).
    """

    @property
    def dialect(self) -> Dialect:
        """The database's dialect."""
        ...

    @overload
    def write(self, work: Statement[T], /, *params: Sequence[Any]) -> Awaitable[T]: ...
    @overload
    def write(
        self, work: Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]: ...

    @overload
    def read(self, work: Statement[T], /, *params: Sequence[Any]) -> Awaitable[T]: ...
    @overload
    def read(
        self, work: Callable[[Dialect, *Ts], Transaction[T]], /, *args: *Ts
    ) -> Awaitable[T]: ...
