"""The SQLite backend, the default: one file, WAL, one group-committing writer.

The aggregates are the SQL stores of `store.sql`, written once for both databases over
`store.sql.sqlite.SqliteSqlDatabase`; they only say what to read and write. `database` owns
the connections, the writer (a thread, `writer`, or a process of its own, `writer_process`),
the checkpointer (`checkpoint`) and the schema migrations. Values are encoded on the
caller's side, so the writer, which holds up every commit, does as little Python work as
possible; a write transaction is a module-level function with plain arguments, which a
writer process can unpickle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from apiary.store.sql.sqlite import SqliteSqlDatabase
from apiary.store.sql.store import SqlStore
from apiary.store.sqlite.database import (
    SqliteDatabase,
    SqliteOptions,
    SqliteStats,
    open_sqlite_database,
)


class SqliteStore(SqlStore):
    """Every aggregate in one SQLite file (see `open_sqlite_store`)."""

    backend = "sqlite"

    def __init__(self, database: SqliteDatabase) -> None:
        self._database = database
        super().__init__(SqliteSqlDatabase(database))

    @property
    def database(self) -> SqliteDatabase:
        """The underlying database: further aggregates are built on its `write`/`read`."""
        return self._database

    @property
    def stats(self) -> SqliteStats:
        """Group-commit and checkpoint counters."""
        return self._database.stats


@asynccontextmanager
async def open_sqlite_store(
    path: Path, options: SqliteOptions | None = None
) -> AsyncIterator[SqliteStore]:
    """Open (creating and migrating if needed) the SQLite store at `path`.

    On exit, everything submitted is committed before the file is closed. Raises
    SchemaVersionError when the file was written by a newer Apiary.
    """
    async with open_sqlite_database(path, options) as database:
        yield SqliteStore(database)
