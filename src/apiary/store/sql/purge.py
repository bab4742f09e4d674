"""Retention's deletes (engine/retention.py) in bounded chunks: a purge of a long retention
period is many short transactions, none holding the writer for long (on SQLite, the writer
is the event loop, store/sqlite/loop_writer.py; on PostgreSQL, fewer rows stay locked at
once)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from apiary.store.sql.dialect import Dialect

PURGE_CHUNK: Final = 1000
"""Rows one retention DELETE removes at most."""


def chunk_delete_sql(d: Dialect, table: str, key: str, where: str) -> str:
    """A DELETE of at most `?` rows of `table` that match `where` (its first parameter), by
    their `key`; PostgreSQL locks them in key order first, as every other writer of several
    rows locks them (a DELETE alone locks in its index's order, and may deadlock)."""
    limit = f" ORDER BY {key} LIMIT ?{d.lock_rows}" if d.lock_rows else " LIMIT ?"
    return f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {where}{limit})"


async def purge_in_chunks(delete: Callable[[int], Awaitable[int]]) -> int:
    """Run `delete(limit)` until it deletes fewer than PURGE_CHUNK rows; how many it deleted
    in all."""
    total = 0
    while True:
        deleted = await delete(PURGE_CHUNK)
        total += deleted
        if deleted < PURGE_CHUNK:
            return total
