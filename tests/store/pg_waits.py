"""Waiting, in tests on the local PostgreSQL server, until a backend waits for a lock."""

from __future__ import annotations

import asyncio

import psycopg

WAIT_S = 30


async def blocked_by(conn: psycopg.AsyncConnection[tuple[object, ...]], pid: int) -> None:
    """Until some backend waits for a lock that backend `pid` holds (polled, bounded:
    PostgreSQL offers no notification of it)."""
    for _ in range(WAIT_S * 100):
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
        )
        row = await cursor.fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"nothing ever waited for backend {pid}")
