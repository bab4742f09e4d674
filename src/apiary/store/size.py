"""How many bytes a store holds (a tenant's `stored_bytes` quota, DESIGN.md section 9)."""

from __future__ import annotations

import os

from apiary.store.postgres.pool import fetch_all
from apiary.store.postgres.store import PostgresStore
from apiary.store.protocols import Store
from apiary.store.sqlite.store import SqliteStore

WAL_SUFFIXES = ("", "-wal")


async def stored_bytes(store: Store) -> int | None:
    """The bytes the store takes: a SQLite file with its write-ahead log, a PostgreSQL
    schema's tables and indexes; None for the memory store (not measured)."""
    if isinstance(store, SqliteStore):
        path = store.database.path
        total = 0
        for suffix in WAL_SUFFIXES:
            try:
                total += os.stat(f"{path}{suffix}").st_size
            except FileNotFoundError:
                continue
        return total
    if isinstance(store, PostgresStore):
        rows = await fetch_all(
            store.pool,
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'",
        )
        return int(rows[0][0])
    return None
