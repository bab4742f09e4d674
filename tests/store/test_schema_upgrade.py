"""Databases written at older schema versions upgrade in place when opened by this code.

Each test builds a database with the real migration runner stopped at an older version,
writes rows with that version's columns only, then opens the store normally.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from apiary.core.events import EventFilter
from apiary.core.records import (
    DlqEntry,
    IdempotencyRecord,
    MessageState,
    StateChange,
    StoredMessage,
)
from apiary.store.migrations import load_migrations
from apiary.store.postgres.store import migrate_postgres, open_postgres_store
from apiary.store.protocols import Store
from apiary.store.sql.events import correlation_read_sql
from apiary.store.sqlite.database import correlation_key, migrate_sqlite
from apiary.store.sqlite.store import open_sqlite_store
from apiary.testing.store_suite.base import dlq_entry, hitl_record

V1_COLUMNS = (
    "message_id, recipient, inbox_offset, producer_id, correlation_id, message_type, envelope,"
    " state, created_at, updated_at, error_code"
)
V1_ROW = ("m-1", "b", 1, "a", "c-1", 2, b"\x00envelope\xff", "RECEIVED", 1.5, 2.5, "")
VERSIONS = [m.version for m in load_migrations("sqlite")]


@contextmanager
def _sqlite_at(path: Path, version: int) -> Iterator[sqlite3.Connection]:
    """A raw connection to a new SQLite database migrated up to `version` (every version up
    to it applied), closed after the block."""
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate_sqlite(raw, target=version) == [v for v in VERSIONS if v <= version]
        yield raw
    finally:
        raw.close()


def expected_message() -> StoredMessage:
    """The version-1 row as read by this code: every newer field at its default."""
    return StoredMessage(
        message_id="m-1",
        recipient="b",
        producer_id="a",
        correlation_id="c-1",
        message_type=2,
        envelope=b"\x00envelope\xff",
        state=MessageState.RECEIVED,
        created_at=1.5,
        updated_at=2.5,
        offset=1,
    )


async def check_upgraded(store: Store) -> None:
    """The version-1 message reads back with defaults, and the new columns work."""
    old = expected_message()
    assert await store.messages.get("m-1") == old
    assert await store.messages.by_sequence("a", 0) == old
    assert await store.messages.next_deadline() is None
    assert await store.messages.oldest_offset("b") == 1
    new = replace(old, message_id="m-2", sequence_number=2**64 - 1, ack_deadline=10.0)
    assert await store.messages.admit(new) == replace(new, offset=2)
    assert await store.messages.due(10.0) == [replace(new, offset=2)]
    (finished,) = await store.messages.apply([StateChange("m-1", MessageState.FULFILLED, 3.0)])
    assert finished == replace(old, state=MessageState.FULFILLED, updated_at=3.0)
    assert await store.messages.purge_finished(4.0) == 1
    assert await store.messages.oldest_offset("b") == 2
    await store.idempotency.put(IdempotencyRecord("t", "a", "m-2", "m-2", "RECEIVED", 1.0, 1.0))
    assert (await store.dlq.add(dlq_entry("m-3"))).entry_id == 1


async def test_a_version_1_sqlite_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 1) as raw:
        raw.execute(f"INSERT INTO messages ({V1_COLUMNS}) VALUES ({', '.join('?' * 11)})", V1_ROW)
        raw.execute("INSERT INTO inbox_offsets (recipient, last_offset) VALUES ('b', 1)")

    async with open_sqlite_store(path) as store:
        await check_upgraded(store)
    with sqlite3.connect(path) as raw:
        versions = [v for (v,) in raw.execute("SELECT version FROM schema_migrations")]
    assert versions == VERSIONS


@pytest.mark.postgres
async def test_a_version_1_postgres_schema_is_upgraded_in_place(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert await migrate_postgres(conn, postgres_schema, target=1) == [1]
        await conn.execute(
            f"INSERT INTO messages ({V1_COLUMNS}) VALUES ({', '.join(['%s'] * 11)})", V1_ROW
        )
        await conn.execute("INSERT INTO inbox_offsets (recipient, last_offset) VALUES ('b', 1)")

    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await check_upgraded(store)
    with psycopg.connect(postgres_dsn) as raw:
        rows = raw.execute(
            sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY version").format(
                sql.Identifier(postgres_schema)
            )
        ).fetchall()
    assert [v for (v,) in rows] == VERSIONS


# --- version 2 -> 3 (the hitl table) ----------------------------------------------------

V2_MESSAGE_COLUMNS = f"{V1_COLUMNS}, sequence_number, ack_deadline, deliveries"
V2_MESSAGE_ROW = (*V1_ROW, 7, 10.0, 1)
V2_IDEMPOTENCY_COLUMNS = (
    "token, producer_id, original_message_id, current_message_id, status, created_at,"
    " updated_at, attempts"
)
V2_IDEMPOTENCY_ROW = ("t", "a", "m-1", "m-1", "RECEIVED", 1.0, 2.0, '["m-1"]')
V2_DLQ_COLUMNS = (
    "message_id, producer_id, recipient, correlation_id, message_type, error_code, reason,"
    " created_at, failed_at, content_type, payload_size, envelope, attempts"
)
V2_DLQ_ROW = (
    "m-0", "a", "b", "c-0", 2, "ack_timeout", "gave up", 1.0, 3.0, "text/plain", 1, b"\x01",
    '[{"at": 1.0, "what": "sent"}]',
)  # fmt: skip
V2_INSERTS = (
    ("messages", V2_MESSAGE_COLUMNS, V2_MESSAGE_ROW),
    ("inbox_offsets", "recipient, last_offset", ("b", 1)),
    ("idempotency", V2_IDEMPOTENCY_COLUMNS, V2_IDEMPOTENCY_ROW),
    ("dlq", V2_DLQ_COLUMNS, V2_DLQ_ROW),
)


async def check_upgraded_from_2(store: Store) -> None:
    """The version-2 rows read back unchanged, and the hitl table works."""
    message = replace(expected_message(), sequence_number=7, ack_deadline=10.0, deliveries=1)
    assert await store.messages.get("m-1") == message
    assert await store.messages.due(10.0) == [message]
    assert await store.idempotency.get("t") == IdempotencyRecord(
        "t", "a", "m-1", "m-1", "RECEIVED", 1.0, 2.0, attempts=("m-1",)
    )
    assert await store.dlq.get(1) == DlqEntry(
        1, "m-0", "a", "b", "c-0", 2, "ack_timeout", "gave up", 1.0, 3.0, "text/plain", 1,
        b"\x01", attempts=({"at": 1.0, "what": "sent"},),
    )  # fmt: skip
    assert (await store.dlq.add(dlq_entry("m-2"))).entry_id == 2
    assert await store.hitl.list() == []
    record = hitl_record("inv-1")
    await store.hitl.put(record)
    assert await store.hitl.get("inv-1") == record
    assert await store.hitl.list(frozenset({"PENDING"})) == [record]


async def test_a_version_2_sqlite_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 2) as raw:
        for table, columns, row in V2_INSERTS:
            marks = ", ".join("?" * len(row))
            raw.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", row)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master")}
        assert "dlq" in tables
        assert "hitl" not in tables

    async with open_sqlite_store(path) as store:
        await check_upgraded_from_2(store)
    async with open_sqlite_store(path) as store:
        assert await store.hitl.get("inv-1") == hitl_record("inv-1")
    with sqlite3.connect(path) as raw:
        versions = [v for (v,) in raw.execute("SELECT version FROM schema_migrations")]
    assert versions == VERSIONS


@pytest.mark.postgres
async def test_a_version_2_postgres_schema_is_upgraded_in_place(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert await migrate_postgres(conn, postgres_schema, target=2) == [1, 2]
        for table, columns, row in V2_INSERTS:
            marks = ", ".join(["%s"] * len(row))
            await conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", row)
        cursor = await conn.execute("SELECT to_regclass('hitl') IS NULL")
        assert await cursor.fetchone() == (True,)

    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await check_upgraded_from_2(store)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        assert await store.hitl.get("inv-1") == hitl_record("inv-1")
    with psycopg.connect(postgres_dsn) as raw:
        rows = raw.execute(
            sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY version").format(
                sql.Identifier(postgres_schema)
            )
        ).fetchall()
    assert [v for (v,) in rows] == VERSIONS


V12_OUTBOX = (
    "message_id, swarm_id, sender_id, recipient_id, message_type, content, destination,"
    " created_at, status, attempts, updated_at, error"
)
V12_OUTBOX_ROWS = [
    ("m-1", "s-1", "me", "beta", "message", "hello", "beta", 1.5, "failed", 3, 2.5, "HTTP 503"),
    ("m-2", "s-1", "me", "broadcast", "message", "all", "gamma", 3.5, "sent", 0, 3.5, ""),
]


async def check_outbox_upgraded(store: Store) -> None:
    """Version-12 outbox rows survive the rebuild of version 13, due at once."""
    (failed,) = await store.swarm.outbox_get("m-1")
    assert (failed.destination, failed.status, failed.attempts, failed.error) == (
        "beta", "failed", 3, "HTTP 503",
    )  # fmt: skip
    assert failed.next_attempt_at == 0.0
    (pending,) = await store.swarm.outbox_pending()
    assert (pending.mail.message_id, pending.status) == ("m-2", "sent")
    await store.swarm.outbox_put(replace(pending, status="retrying", next_attempt_at=9.0))
    (retrying,) = await store.swarm.outbox_pending()
    assert (retrying.status, retrying.next_attempt_at) == ("retrying", 9.0)


async def test_a_version_12_sqlite_outbox_is_rebuilt_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 12) as raw:
        for row in V12_OUTBOX_ROWS:
            raw.execute(
                f"INSERT INTO swarm_outbox ({V12_OUTBOX}) VALUES ({', '.join('?' * 12)})", row
            )
    async with open_sqlite_store(path) as store:
        await check_outbox_upgraded(store)
    with sqlite3.connect(path) as raw:
        indexes = {n for (n,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"swarm_outbox_by_time", "swarm_outbox_by_swarm", "swarm_outbox_pending"} <= indexes


@pytest.mark.postgres
async def test_a_version_12_postgres_outbox_is_upgraded_with_its_rows(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert (await migrate_postgres(conn, postgres_schema, target=12))[-1] == 12
        marks = ", ".join(["%s"] * 12)
        for row in V12_OUTBOX_ROWS:
            await conn.execute(f"INSERT INTO swarm_outbox ({V12_OUTBOX}) VALUES ({marks})", row)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await check_outbox_upgraded(store)


V14_DLQ = (
    "message_id, producer_id, recipient, correlation_id, message_type, error_code, reason,"
    " created_at, failed_at, content_type, payload_size, envelope, attempts, route"
)
V14_DLQ_ROW = ("m-1", "alice", "bob", "c-1", 2, "internal_error", "crash", 1.0, 2.0,
               "application/json", 2, b"{}", "[]", "alice -> coordinator -> bob")  # fmt: skip


async def _check_dlq_upgraded(store: Store) -> None:
    (entry,) = await store.dlq.list()
    assert (entry.message_id, entry.envelope, entry.signature) == ("m-1", b"{}", b"")


async def test_a_version_14_sqlite_dlq_keeps_its_entries(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 14) as raw:
        raw.execute(f"INSERT INTO dlq ({V14_DLQ}) VALUES ({', '.join('?' * 14)})", V14_DLQ_ROW)
    async with open_sqlite_store(path) as store:
        await _check_dlq_upgraded(store)


@pytest.mark.postgres
async def test_a_version_14_postgres_dlq_keeps_its_entries(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert (await migrate_postgres(conn, postgres_schema, target=14))[-1] == 14
        marks = ", ".join(["%s"] * 12 + ["%s::jsonb", "%s"])  # attempts is JSONB
        await conn.execute(f"INSERT INTO dlq ({V14_DLQ}) VALUES ({marks})", V14_DLQ_ROW)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await _check_dlq_upgraded(store)


async def test_a_version_15_sqlite_event_log_is_keyed_by_correlation_on_upgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 15) as raw:
        for n, correlation in enumerate(["plumless", "buckeroo", "plumless", ""], start=1):
            raw.execute(
                "INSERT INTO events (event_type, actor, ts, correlation_id) VALUES (?, ?, ?, ?)",
                (f"e.{n}", "a", float(n), correlation),
            )
    async with open_sqlite_store(path) as store:
        # The existing events were given their keys: reads by correlation find them.
        plumless = await store.events.read(where=EventFilter(correlation_id="plumless"))
        assert [e.event_type for e in plumless] == ["e.1", "e.3"]
        (buckeroo,) = await store.events.read(where=EventFilter(correlation_id="buckeroo"))
        assert buckeroo.event_type == "e.2"


async def test_a_version_16_sqlite_event_log_buckets_its_correlation_index_on_upgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 16) as raw:
        raw.create_function("apiary_correlation_key", 1, correlation_key)
        for sequence, correlation in ((1, "plumless"), (2, "buckeroo"), (9000, "plumless")):
            raw.execute(
                "INSERT INTO events (sequence, event_type, actor, ts, correlation_id,"
                " correlation_key) VALUES (?, 'e', 'a', 1.0, ?, apiary_correlation_key(?))",
                (sequence, correlation, correlation),
            )
    async with open_sqlite_store(path) as store:
        plumless = await store.events.read(where=EventFilter(correlation_id="plumless"))
        assert [e.sequence for e in plumless] == [1, 9000]
    with sqlite3.connect(path) as raw:
        indexes = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        plan = " ".join(
            str(row[-1]) for row in raw.execute(
                "EXPLAIN QUERY PLAN " + correlation_read_sql(
                    ["sequence > ?", "correlation_key = ?", "correlation_id = ?"]
                ), [0, 2, 0, 1, "x", 9000, 10],
            )
        )  # fmt: skip
    assert "events_by_correlation_bucket" in indexes
    assert "events_by_correlation_key" not in indexes
    assert "USING INDEX events_by_correlation_bucket" in plan


V17_TASKS = (
    "task_id, agent_id, priority, submitted_at, seq, state, updated_at, scope, job_key, params,"
    " content_type, agent_type, message_id, attempts, error_code, note, lane, correlation_id"
)
V17_TASK_ROW = ("t-1", "agent-b", 0, 1.0, 0, "COMPLETED", 2.0, "repo:a", "job", b"{}",
                "application/json", "coder", "m-1", 1, "", "done", "STANDARD", "")  # fmt: skip


async def _check_tasks_upgraded(store: Store) -> None:
    """A task stored before results has none and no submitter; one stored now keeps both."""
    task = await store.tasks.get("t-1")
    assert task is not None and (task.state, task.note) == ("COMPLETED", "done")
    assert (task.submitter, task.result) == ("", "")
    await store.tasks.put(replace(task, task_id="t-2", seq=1, submitter="app", result="[1]"))
    again = await store.tasks.get("t-2")
    assert again is not None and (again.submitter, again.result) == ("app", "[1]")


async def test_a_version_17_sqlite_task_gets_an_empty_result_and_submitter(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 17) as raw:
        marks = ", ".join("?" * len(V17_TASK_ROW))
        raw.execute(f"INSERT INTO tasks ({V17_TASKS}) VALUES ({marks})", V17_TASK_ROW)
    async with open_sqlite_store(path) as store:
        await _check_tasks_upgraded(store)


@pytest.mark.postgres
async def test_a_version_17_postgres_task_gets_an_empty_result_and_submitter(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert (await migrate_postgres(conn, postgres_schema, target=17))[-1] == 17
        marks = ", ".join(["%s"] * len(V17_TASK_ROW))
        await conn.execute(f"INSERT INTO tasks ({V17_TASKS}) VALUES ({marks})", V17_TASK_ROW)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await _check_tasks_upgraded(store)


V18_TASKS = f"{V17_TASKS}, submitter, result"
V18_TASK_ROW = (*V17_TASK_ROW, "app", "[1]")


async def _check_tasks_have_no_queue(store: Store) -> None:
    """A task stored before shared queues was submitted to its agent, with no attempt lost;
    one stored now keeps its queue and lost attempts."""
    task = await store.tasks.get("t-1")
    assert task is not None and (task.submitter, task.result) == ("app", "[1]")
    assert (task.agent_id, task.queue, task.lost_attempts) == ("agent-b", "", 0)
    shared = replace(task, task_id="t-2", seq=1, agent_id="", queue="capability:x", lost_attempts=1)
    await store.tasks.put(shared)
    assert await store.tasks.get("t-2") == shared
    assert [t.task_id for t in await store.tasks.list(queue="")] == ["t-1"]


async def test_a_version_18_sqlite_task_is_one_agents_with_no_attempt_lost(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    with _sqlite_at(path, 18) as raw:
        marks = ", ".join("?" * len(V18_TASK_ROW))
        raw.execute(f"INSERT INTO tasks ({V18_TASKS}) VALUES ({marks})", V18_TASK_ROW)
    async with open_sqlite_store(path) as store:
        await _check_tasks_have_no_queue(store)


@pytest.mark.postgres
async def test_a_version_18_postgres_task_is_one_agents_with_no_attempt_lost(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        assert (await migrate_postgres(conn, postgres_schema, target=18))[-1] == 18
        marks = ", ".join(["%s"] * len(V18_TASK_ROW))
        await conn.execute(f"INSERT INTO tasks ({V18_TASKS}) VALUES ({marks})", V18_TASK_ROW)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await _check_tasks_have_no_queue(store)


async def test_a_version_34_sqlite_file_keeps_its_deadlines_and_finish_times(
    tmp_path: Path,
) -> None:
    """Version 35 adds due_at and finished_at again as CASEs on the state: every stored
    message keeps the values it had, and the timer's and retention's queries their
    indexes."""
    path = tmp_path / "apiary.db"
    columns = "message_id, recipient, inbox_offset, producer_id, correlation_id, message_type,"
    columns += " envelope, state, created_at, updated_at, ack_deadline, expires_at"
    rows = [
        ("m-both", 1, "RECEIVED", 5.0, 7.0, 4.0),
        ("m-ack", 2, "READ", 6.0, 0.0, 4.0),
        ("m-expiry", 3, "RECEIVED", 0.0, 8.0, 4.0),
        ("m-none", 4, "RECEIVED", 0.0, 0.0, 4.0),
        *((f"m-{s.lower()}", 5 + i, s, 9.0, 9.0, 3.0 + i)
          for i, s in enumerate(("FULFILLED", "REJECTED", "FAILED", "TIMED_OUT"))),
    ]  # fmt: skip
    with _sqlite_at(path, 34) as raw:
        for message_id, offset, state, ack, expires, updated in rows:
            raw.execute(
                f"INSERT INTO messages ({columns}) VALUES (?, 'b', ?, 'a', 'c', 2, x'00', ?,"
                " 1.0, ?, ?, ?)",
                (message_id, offset, state, updated, ack, expires),
            )
        before = raw.execute(
            "SELECT message_id, due_at, finished_at FROM messages ORDER BY message_id"
        ).fetchall()
    async with open_sqlite_store(path) as store:
        assert [m.message_id for m in await store.messages.due(7.0)] == ["m-both", "m-ack"]
        assert await store.messages.next_deadline() == 5.0
        assert await store.messages.purge_finished(5.5) == 3
    with sqlite3.connect(path) as raw:
        after = raw.execute(
            "SELECT message_id, due_at, finished_at FROM messages ORDER BY message_id"
        ).fetchall()
        plans = [
            " ".join(str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {query}", params))
            for query, params in (
                ("SELECT message_id FROM messages WHERE due_at <= ? ORDER BY due_at", (1.0,)),
                ("DELETE FROM messages WHERE finished_at < ?", (1.0,)),
            )
        ]
        versions = [v for (v,) in raw.execute("SELECT version FROM schema_migrations")]
    assert [(m, due, finished) for m, due, finished in before if m in {"m-both", "m-ack",
            "m-expiry", "m-none", "m-timed_out"}] == after  # fmt: skip
    assert after[0] == ("m-ack", 6.0, None)
    assert ("m-timed_out", None, 6.0) in after
    assert "messages_due" in plans[0] and "messages_finished" in plans[1]
    assert versions == VERSIONS
