"""The SQLite backend, the default: one file, WAL, one group-committing writer.

The aggregates (here and in `sqlite_messages`, `sqlite_idempotency`, `sqlite_dlq`,
`sqlite_hitl`, `sqlite_tasks`, `sqlite_swarm`, `sqlite_tools`, ...) only say what to read
and write; `sqlite_database` owns the connections, the writer (a thread, `sqlite_writer`, or
a process of its own, `sqlite_writer_process`), the checkpointer (`sqlite_checkpoint`) and
the schema migrations. Values are encoded on the caller's side, so the writer, which holds
up every commit, does as little Python work as possible; a write job is a module-level
function with plain arguments (`SqliteDatabase.call`), which a writer process can unpickle.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.core.records import AgentRecord
from apiary.store.json_codec import dump_json
from apiary.store.sql_rows import (
    AGENT_COLUMNS,
    EVENT_COLUMNS,
    agent_from_row,
    agent_row,
    check_limit,
    event_filter_clauses,
    event_from_row,
)
from apiary.store.sqlite.bulk import insert_rows
from apiary.store.sqlite.database import (
    CORRELATION_BUCKET_BITS,
    SqliteDatabase,
    SqliteOptions,
    SqliteStats,
    correlation_key,
    open_sqlite_database,
    placeholders,
)
from apiary.store.sqlite.dlq import SqliteDlqStore
from apiary.store.sqlite.handoffs import SqliteHandoffStore
from apiary.store.sqlite.hitl import SqliteHitlStore
from apiary.store.sqlite.idempotency import SqliteIdempotencyStore
from apiary.store.sqlite.messages import SqliteMessageStore
from apiary.store.sqlite.negotiations import SqliteArtifactStore, SqliteNegotiationStore
from apiary.store.sqlite.rooms import SqliteRoomStore
from apiary.store.sqlite.swarm import SqliteSwarmStore
from apiary.store.sqlite.tasks import SqliteTaskStore
from apiary.store.sqlite.tools import SqliteToolStore
from apiary.store.sqlite.workflows import SqliteWorkflowStore
from apiary.store.sqlite.worktrees import SqliteWorktreeStore

_INSERT_EVENTS = (
    "INSERT INTO events"
    " (event_type, actor, ts, correlation_id, agent_id, details, hlc, correlation_key) VALUES"
)


class SqliteEventLog:
    """`EventLog` in the `events` table; sequences are its AUTOINCREMENT rowids."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        if not drafts:
            return []
        sequences = await self._db.call(_insert_events, event_rows(drafts))
        return [Event.from_draft(seq, draft) for seq, draft in zip(sequences, drafts, strict=True)]

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        check_limit(limit)
        terms = event_filter_clauses(where, after, "?", correlation_key)
        if terms is None:
            return []
        clauses, params = terms
        if where is not None and where.correlation_id is not None:
            rows = await self._db.read(
                lambda conn: _by_correlation(conn, clauses, params, after, limit)
            )
            return [event_from_row(row) for row in rows]
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)}"
            " ORDER BY sequence LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [event_from_row(row) for row in rows]

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""

        def query(conn: sqlite3.Connection) -> int:
            (last,) = conn.execute("SELECT COALESCE(MAX(sequence), 0) FROM events").fetchone()
            return int(last)

        return await self._db.read(query)


def event_rows(drafts: Sequence[EventDraft]) -> list[tuple[Any, ...]]:
    """The `events` rows of `drafts`, in `_INSERT_EVENTS`' column order (encoded on the
    caller's side, so that the writer does as little as possible)."""
    return [
        (d.event_type, d.actor, d.ts, d.correlation_id, d.agent_id, dump_json(d.details), d.hlc,
         correlation_key(d.correlation_id))
        for d in drafts
    ]  # fmt: skip


def _insert_events(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> range:
    # One writer, so the AUTOINCREMENT rowids of one job are consecutive and nobody
    # interleaves: the last one tells them all (one statement for the whole burst).
    last = insert_rows(conn, _INSERT_EVENTS, rows, 8)
    return range(last - len(rows) + 1, last + 1)


_BUCKETS_PER_READ = 256
"""Correlation buckets (of 4,096 events) one statement of `_by_correlation` looks in."""


def correlation_read_sql(clauses: list[str]) -> str:
    """The statement `_by_correlation` runs: the events matching `clauses` (and at most the
    sequence of the next parameter) in the buckets from the first parameter to the second,
    ascending, at most the last parameter of them."""
    return (
        "WITH RECURSIVE b(x) AS (SELECT ? UNION ALL SELECT x + 1 FROM b WHERE x < ?)"
        f" SELECT {EVENT_COLUMNS} FROM b CROSS JOIN events"
        f" ON (events.sequence >> {CORRELATION_BUCKET_BITS}) = b.x"
        f" WHERE {' AND '.join(clauses)} AND sequence <= ? ORDER BY sequence LIMIT ?"
    )


def _by_correlation(
    conn: sqlite3.Connection, clauses: list[str], params: list[Any], after: int, limit: int
) -> list[tuple[Any, ...]]:
    """An event-log read by correlation (`clauses` and `params` name the correlation key):
    the key looked up through the index in each bucket of
    events from `after`'s on (migration 17), a window of buckets per statement until `limit`
    rows are found. Bounded by the last sequence when the read began, so that a later
    window never shows events past ones an earlier window could not see yet."""
    (last,) = conn.execute("SELECT COALESCE(MAX(sequence), 0) FROM events").fetchone()
    sql = correlation_read_sql(clauses)
    rows: list[tuple[Any, ...]] = []
    bits = CORRELATION_BUCKET_BITS
    bucket, end = after >> bits, int(last) >> bits
    while bucket <= end and len(rows) < limit:
        upto = min(end, bucket + _BUCKETS_PER_READ - 1)
        rows += conn.execute(sql, [bucket, upto, *params, last, limit - len(rows)]).fetchall()
        bucket = upto + 1
    return rows


class SqliteAgentStore:
    """`AgentStore` in the `agents` table."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put(self, agent: AgentRecord) -> None:
        """Insert or replace the agent with this agent_id."""
        row = agent_row(agent)
        sql = f"INSERT OR REPLACE INTO agents ({AGENT_COLUMNS}) VALUES ({placeholders(6)})"
        await self._db.execute(sql, row)

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        sql = f"SELECT {AGENT_COLUMNS} FROM agents WHERE agent_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (agent_id,)).fetchone())
        return None if row is None else agent_from_row(row)

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        sql = f"SELECT {AGENT_COLUMNS} FROM agents ORDER BY agent_id"
        rows = await self._db.read(lambda conn: conn.execute(sql).fetchall())
        return [agent_from_row(row) for row in rows]

    async def delete(self, agent_id: str) -> bool:
        """Remove the agent; False when it was not there."""
        sql = "DELETE FROM agents WHERE agent_id = ?"
        deleted = await self._db.execute(sql, (agent_id,))
        return deleted > 0


class SqliteStore:
    """Every aggregate in one SQLite file (see `open_sqlite_store`)."""

    backend = "sqlite"

    def __init__(self, database: SqliteDatabase) -> None:
        self._database = database
        self.events = SqliteEventLog(database)
        self.agents = SqliteAgentStore(database)
        self.messages = SqliteMessageStore(database)
        self.idempotency = SqliteIdempotencyStore(database)
        self.dlq = SqliteDlqStore(database)
        self.hitl = SqliteHitlStore(database)
        self.tasks = SqliteTaskStore(database)
        self.workflows = SqliteWorkflowStore(database)
        self.handoffs = SqliteHandoffStore(database)
        self.worktrees = SqliteWorktreeStore(database)
        self.rooms = SqliteRoomStore(database)
        self.tools = SqliteToolStore(database)
        self.negotiations = SqliteNegotiationStore(database)
        self.artifacts = SqliteArtifactStore(database)
        self.swarm = SqliteSwarmStore(database)

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
