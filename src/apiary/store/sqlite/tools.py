"""The SQLite tool store: `tool_providers` and `tools`, one row per provider and per tool."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from apiary.core.tools.descriptor import ToolProviderRecord
from apiary.store.sqlite.database import SqliteDatabase, placeholders
from apiary.store.tool_rows import (
    PROVIDER_COLUMN_COUNT,
    PROVIDER_COLUMNS,
    TOOL_COLUMN_COUNT,
    TOOL_COLUMNS,
    group_tools,
    provider_from_rows,
    provider_row,
    tool_rows,
)

_PUT_PROVIDER = (
    f"INSERT OR REPLACE INTO tool_providers ({PROVIDER_COLUMNS})"
    f" VALUES ({placeholders(PROVIDER_COLUMN_COUNT)})"
)
_PUT_TOOL = f"INSERT INTO tools ({TOOL_COLUMNS}) VALUES ({placeholders(TOOL_COLUMN_COUNT)})"
_TOOLS_OF = f"SELECT {TOOL_COLUMNS} FROM tools WHERE provider_id = ? ORDER BY position"


class SqliteToolStore:
    """`ToolStore` in two tables; a put or delete is one transaction (one writer job)."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider and all of its tools."""
        provider, tools = provider_row(record), tool_rows(record)
        await self._db.call(_put, record.provider_id, provider, tools)

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        """The provider with its tools in registration order, or None."""

        def query(conn: sqlite3.Connection) -> ToolProviderRecord | None:
            row = conn.execute(
                f"SELECT {PROVIDER_COLUMNS} FROM tool_providers WHERE provider_id = ?",
                (provider_id,),
            ).fetchone()
            if row is None:
                return None
            return provider_from_rows(row, conn.execute(_TOOLS_OF, (provider_id,)).fetchall())

        return await self._db.read(query)

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""

        def query(conn: sqlite3.Connection) -> list[ToolProviderRecord]:
            # One snapshot for both reads: a read connection's statements see one state only
            # inside a transaction.
            conn.execute("BEGIN")
            try:
                providers = conn.execute(
                    f"SELECT {PROVIDER_COLUMNS} FROM tool_providers ORDER BY provider_id"
                ).fetchall()
                tools = conn.execute(
                    f"SELECT {TOOL_COLUMNS} FROM tools ORDER BY provider_id, position"
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            grouped = group_tools(tools)
            return [provider_from_rows(p, grouped.get(p[0], [])) for p in providers]

        return await self._db.read(query)

    async def delete(self, provider_id: str) -> bool:
        """Remove the provider and its tools; False when it was not there."""
        return await self._db.call(_delete, provider_id)


def _put(
    conn: sqlite3.Connection, provider_id: str, provider: Sequence[Any], tools: list[Any]
) -> None:
    conn.execute("DELETE FROM tools WHERE provider_id = ?", (provider_id,))
    conn.execute(_PUT_PROVIDER, provider)
    conn.executemany(_PUT_TOOL, tools)


def _delete(conn: sqlite3.Connection, provider_id: str) -> bool:
    conn.execute("DELETE FROM tools WHERE provider_id = ?", (provider_id,))
    cursor = conn.execute("DELETE FROM tool_providers WHERE provider_id = ?", (provider_id,))
    return cursor.rowcount > 0
