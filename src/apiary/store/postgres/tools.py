"""The PostgreSQL tool store: `tool_providers` and `tools`, one row per provider and per tool."""

from __future__ import annotations

from apiary.core.tools.descriptor import ToolProviderRecord
from apiary.store.postgres.pool import PostgresPool, fetch_rows
from apiary.store.tool_rows import (
    PROVIDER_COLUMNS,
    TOOL_COLUMN_COUNT,
    TOOL_COLUMNS,
    group_tools,
    provider_from_rows,
    provider_row,
    tool_rows,
)

_NAMES = PROVIDER_COLUMNS.split(", ")
_PUT_PROVIDER = (
    f"INSERT INTO tool_providers ({PROVIDER_COLUMNS})"
    f" VALUES ({', '.join('%s::jsonb' if c == 'config' else '%s' for c in _NAMES)})"
    " ON CONFLICT (provider_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _NAMES if c != "provider_id")
)
_PUT_TOOL = f"INSERT INTO tools ({TOOL_COLUMNS}) VALUES ({', '.join(['%s'] * TOOL_COLUMN_COUNT)})"
_TOOLS_OF = f"SELECT {TOOL_COLUMNS} FROM tools WHERE provider_id = %s ORDER BY position"


class PostgresToolStore:
    """`ToolStore` in two tables; a put or delete is one transaction."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider and all of its tools."""
        provider, tools = provider_row(record), tool_rows(record)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM tools WHERE provider_id = %s", [record.provider_id])
            await conn.execute(_PUT_PROVIDER, provider)
            if tools:
                async with conn.cursor() as cursor:
                    await cursor.executemany(_PUT_TOOL, tools)

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        """The provider with its tools in registration order, or None."""
        async with self._pool.connection() as conn, conn.transaction():
            rows = await fetch_rows(
                conn,
                f"SELECT {PROVIDER_COLUMNS} FROM tool_providers WHERE provider_id = %s",
                [provider_id],
            )
            if not rows:
                return None
            return provider_from_rows(rows[0], await fetch_rows(conn, _TOOLS_OF, [provider_id]))

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""
        async with self._pool.connection() as conn, conn.transaction():
            providers = await fetch_rows(
                conn, f"SELECT {PROVIDER_COLUMNS} FROM tool_providers ORDER BY provider_id"
            )
            tools = await fetch_rows(
                conn, f"SELECT {TOOL_COLUMNS} FROM tools ORDER BY provider_id, position"
            )
        grouped = group_tools(tools)
        return [provider_from_rows(p, grouped.get(p[0], [])) for p in providers]

    async def delete(self, provider_id: str) -> bool:
        """Remove the provider and its tools; False when it was not there."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM tools WHERE provider_id = %s", [provider_id])
            cursor = await conn.execute(
                "DELETE FROM tool_providers WHERE provider_id = %s", [provider_id]
            )
            return cursor.rowcount > 0
