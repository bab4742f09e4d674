"""What only the SQLite backend promises: WAL, one group-committing writer, migrations,
durability of every write that returned, checkpoints off the commit path."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apiary.core.events import EventDraft, EventFilter
from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.store.errors import DuplicateMessageError, SchemaVersionError, StoreError
from apiary.store.migrations import load_migrations
from apiary.store.sql.hitl import HITL
from apiary.store.sql.message_rows import MESSAGES
from apiary.store.sqlite.checkpoint import RESTART_RETRY_COMMITS
from apiary.store.sqlite.database import (
    SqliteDatabase,
    SqliteOptions,
    WriterKind,
    correlation_key,
    split_statements,
)
from apiary.store.sqlite.store import SqliteStore, open_sqlite_store

WAIT_S = 30


def draft(n: int) -> EventDraft:
    return EventDraft(event_type="test.event", actor="test", ts=1.0 + n, details={"n": n})


def message(message_id: str, recipient: str = "b") -> StoredMessage:
    return StoredMessage(
        message_id=message_id,
        recipient=recipient,
        producer_id="a",
        correlation_id="c",
        message_type=2,
        envelope=b"payload",
        state=MessageState.RECEIVED,
        created_at=1.0,
        updated_at=1.0,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """A store with its writer on a thread: the writer's tests hold that thread in a job
    (`writer_held`); the loop's writer has tests of its own (test_sqlite_loop_writer.py)."""
    async with open_sqlite_store(tmp_path / "apiary.db", SqliteOptions(writer="thread")) as opened:
        yield opened


@asynccontextmanager
async def writer_held(database: SqliteDatabase) -> AsyncIterator[None]:
    """Keep the writer thread inside one job until the block ends, so that writes submitted
    meanwhile are all pending when it is released. The loop's writer needs no holding: what
    is submitted in one turn of the loop is pending together when its commit runs."""
    if database.options.writer == "loop":
        yield
        return
    started, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        started.set()
        if not release.wait(WAIT_S):
            raise TimeoutError("writer_held was never released")

    holder = asyncio.create_task(database.write(hold))
    assert await asyncio.to_thread(started.wait, WAIT_S)
    try:
        yield
    finally:
        release.set()
        await asyncio.wait_for(holder, WAIT_S)


async def pending(coroutines: list[Any]) -> list[asyncio.Task[Any]]:
    """Start the coroutines; one yield lets each run up to its first await (the enqueue)."""
    tasks = [asyncio.create_task(c) for c in coroutines]
    await asyncio.sleep(0)
    return tasks


# --- WAL and pragmas ------------------------------------------------------------------


async def test_the_file_is_in_wal_mode(store: SqliteStore) -> None:
    with sqlite3.connect(store.database.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_writer_runs_synchronous_normal_without_autocheckpoint(store: SqliteStore) -> None:
    def pragmas(conn: sqlite3.Connection) -> tuple[int, int]:
        (sync,) = conn.execute("PRAGMA synchronous").fetchone()
        (auto,) = conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        return sync, auto

    assert await store.database.write(pragmas) == (1, 0)  # 1 = NORMAL


async def test_synchronous_full_can_be_chosen(tmp_path: Path) -> None:
    options = SqliteOptions(synchronous="FULL")
    async with open_sqlite_store(tmp_path / "full.db", options) as store:
        await store.events.append([draft(1)])
        (sync,) = await store.database.write(
            lambda conn: conn.execute("PRAGMA synchronous").fetchone()
        )
        assert sync == 2  # 2 = FULL
        assert store.database.options.synchronous == "FULL"


def test_unknown_synchronous_levels_are_refused() -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteOptions(synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="readers"):
        SqliteOptions(readers=0)


async def test_read_connections_cannot_write(store: SqliteStore) -> None:
    with pytest.raises(StoreError, match="readonly"):
        await store.database.read(lambda conn: conn.execute("DELETE FROM events").rowcount)


# --- group commit ---------------------------------------------------------------------


async def test_everything_pending_is_committed_in_one_transaction(store: SqliteStore) -> None:
    before = store.stats.writer
    async with writer_held(store.database):
        tasks = await pending([store.events.append([draft(i)]) for i in range(200)])
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    after = store.stats.writer
    assert after.commits - before.commits == 2  # the holding job's, then all 200 at once
    assert after.jobs - before.jobs == 201
    assert after.largest_batch == 200
    assert sorted(e.sequence for batch in results for e in batch) == list(range(1, 201))


async def test_concurrent_writers_share_far_fewer_commits(store: SqliteStore) -> None:
    before = store.stats.writer.commits
    await asyncio.wait_for(
        asyncio.gather(*(store.events.append([draft(i)]) for i in range(200))), WAIT_S
    )
    commits = store.stats.writer.commits - before
    assert 1 <= commits < 100
    assert await store.events.last_sequence() == 200


async def test_a_lone_writer_is_committed_without_waiting_for_company(store: SqliteStore) -> None:
    before = store.stats.writer.commits
    for i in range(20):
        await store.events.append([draft(i)])
    assert store.stats.writer.commits - before == 20


async def test_a_failing_job_does_not_undo_the_rest_of_its_batch(store: SqliteStore) -> None:
    before = store.stats.writer.commits
    async with writer_held(store.database):
        tasks = await pending(
            [
                store.messages.admit(message("m-1")),
                store.messages.admit(message("m-1")),
                store.events.append([draft(1)]),
                store.messages.admit(message("m-2")),
            ]
        )
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
    assert store.stats.writer.commits - before == 2
    assert isinstance(outcomes[1], DuplicateMessageError)
    assert [m.offset for m in await store.messages.inbox("b")] == [1, 2]
    assert await store.events.last_sequence() == 1


async def test_sqlite_errors_arrive_as_store_errors_and_the_writer_goes_on(
    store: SqliteStore,
) -> None:
    with pytest.raises(StoreError) as raised:
        await store.database.write(lambda conn: conn.execute("INSERT INTO nowhere VALUES (1)"))
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    with pytest.raises(StoreError):
        await store.database.read(lambda conn: conn.execute("SELECT * FROM nowhere").fetchall())
    assert [e.sequence for e in await store.events.append([draft(1)])] == [1]


async def test_closing_commits_everything_already_submitted(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path) as store:
        tasks = await pending([store.events.append([draft(i)]) for i in range(50)])
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    assert len(results) == 50
    async with open_sqlite_store(path) as store:
        assert await store.events.last_sequence() == 50


async def test_writes_after_closing_are_refused(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "apiary.db") as store:
        pass
    with pytest.raises(StoreError, match="closed"):
        await store.events.append([draft(1)])
    with pytest.raises(StoreError, match="closed"):
        await store.events.read()


def _store_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("apiary-sqlite")}


@pytest.mark.parametrize("writer", ["loop", "thread"])
async def test_closing_stops_every_thread(tmp_path: Path, writer: WriterKind) -> None:
    assert not _store_threads()
    async with open_sqlite_store(tmp_path / "apiary.db", SqliteOptions(writer=writer)) as store:
        await store.events.append([draft(1)])
        await store.events.read()
        running = _store_threads()
        assert "apiary-sqlite-checkpointer" in running
        assert ("apiary-sqlite-writer" in running) is (writer == "thread")
        assert any(name.startswith("apiary-sqlite-reader") for name in running)
    assert not _store_threads()


async def test_a_batch_of_a_thousand_admissions_is_one_job_and_one_commit(
    store: SqliteStore,
) -> None:
    await store.messages.admit(message("dup-7"))
    batch = [message(f"m-{i}", f"r-{i % 5}") for i in range(1000)] + [message("dup-7")]
    before = store.stats.writer
    outcomes = await store.messages.admit_many(batch)
    after = store.stats.writer
    assert (after.commits - before.commits, after.jobs - before.jobs) == (1, 1)
    assert isinstance(outcomes[-1], DuplicateMessageError)
    assert sum(isinstance(o, StoredMessage) for o in outcomes) == 1000


async def test_apply_and_record_deliveries_are_one_job_each(store: SqliteStore) -> None:
    await store.messages.admit_many([message(f"m-{i}") for i in range(500)])
    before = store.stats.writer.jobs
    changes = [StateChange(f"m-{i}", MessageState.READ, 2.0) for i in range(500)]
    assert len(await store.messages.apply(changes)) == 500
    await store.messages.record_deliveries([(f"m-{i}", 1, 3.0) for i in range(500)])
    assert store.stats.writer.jobs - before == 2
    stored = await store.messages.get("m-499")
    assert stored is not None and (stored.deliveries, stored.last_delivered_at) == (1, 3.0)


async def test_a_failed_apply_leaves_the_rest_of_its_group_commit_alone(
    store: SqliteStore,
) -> None:
    await store.messages.admit_many([message("m-1"), message("m-2")])
    async with writer_held(store.database):
        tasks = await pending(
            [
                store.messages.apply([StateChange("m-1", MessageState.READ, 2.0)]),
                store.messages.apply(
                    [
                        StateChange("m-2", MessageState.FAILED, 2.0),
                        StateChange("nope", MessageState.FAILED, 2.0),
                    ]
                ),
                store.messages.admit(message("m-3")),
            ]
        )
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
    assert isinstance(outcomes[1], LookupError)
    states = [(await store.messages.get(m)) for m in ("m-1", "m-2", "m-3")]
    assert [s.state if s else None for s in states] == [
        MessageState.READ,
        MessageState.RECEIVED,
        MessageState.RECEIVED,
    ]


@pytest.mark.parametrize(
    ("query", "params", "index"),
    [
        (
            f"SELECT {MESSAGES.sql} FROM messages WHERE due_at <= ?"
            " ORDER BY due_at, message_id LIMIT ?",
            (1.0, 10),
            "messages_due",
        ),
        (
            "SELECT due_at FROM messages WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1",
            (),
            "messages_due",
        ),
        ("DELETE FROM messages WHERE finished_at < ?", (1.0,), "messages_finished"),
        (
            f"SELECT {MESSAGES.sql} FROM messages WHERE producer_id = ?"
            " AND sequence_number = ?"
            " ORDER BY created_at DESC, inbox_offset DESC, message_id DESC LIMIT 1",
            ("a", 1),
            "messages_by_producer_sequence",
        ),
        ("DELETE FROM dlq WHERE failed_at < ?", (1.0,), "dlq_by_failed"),
        (
            "SELECT entry_id FROM dlq WHERE entry_id > ? AND error_code = ?"
            " ORDER BY entry_id LIMIT ?",
            (0, "x", 10),
            "dlq_by_error_code",
        ),
        (
            "SELECT entry_id FROM dlq WHERE entry_id > ? AND recipient = ?"
            " ORDER BY entry_id LIMIT ?",
            (0, "x", 10),
            "dlq_by_recipient",
        ),
        (
            "SELECT entry_id FROM dlq WHERE entry_id > ? AND producer_id = ?"
            " ORDER BY entry_id LIMIT ?",
            (0, "x", 10),
            "dlq_by_producer",
        ),
        ("DELETE FROM idempotency WHERE updated_at < ?", (1.0,), "idempotency_by_updated"),
        (
            f"SELECT {HITL.sql} FROM hitl WHERE created_at > ? AND state IN (?)"
            " ORDER BY created_at, invocation_id LIMIT ?",
            (0.0, "PENDING", 10),
            "hitl_by_state",
        ),
        (
            f"SELECT {HITL.sql} FROM hitl WHERE created_at > ? AND state IN (?, ?)"
            " ORDER BY created_at, invocation_id LIMIT ?",
            (0.0, "DECIDED", "PENDING", 10),
            "hitl_by_state",
        ),
        (
            f"SELECT {HITL.sql} FROM hitl WHERE created_at > ?"
            " ORDER BY created_at, invocation_id LIMIT ?",
            (0.0, 10),
            "hitl_by_created",
        ),
    ],
)
async def test_polled_and_retention_queries_use_their_index(
    store: SqliteStore, query: str, params: tuple[Any, ...], index: str
) -> None:
    """The queries of the store (copied here) search an index rather than scan the table;
    the partial indexes are only used when the query's WHERE implies theirs."""
    plan = await store.database.read(
        lambda conn: conn.execute(f"EXPLAIN QUERY PLAN {query}", params).fetchall()
    )
    details = " | ".join(row[3] for row in plan)
    assert f"INDEX {index}" in details, details
    assert "SCAN" not in details, details


# --- checkpoints ----------------------------------------------------------------------


async def test_the_checkpointer_copies_the_wal_back_in_the_background(tmp_path: Path) -> None:
    options = SqliteOptions(checkpoint_every_changes=100)
    async with open_sqlite_store(tmp_path / "apiary.db", options) as store:
        for start in range(0, 300, 50):
            await store.events.append([draft(i) for i in range(start, start + 50)])
        checkpointer = store.database.checkpointer
        assert await asyncio.to_thread(checkpointer.wait_for, 1, WAIT_S)
        assert store.stats.checkpoints >= 1
        assert await store.events.last_sequence() == 300


async def _write_steadily(store: SqliteStore, rounds: int, writers: int = 8) -> None:
    """Keep the writer busy: `writers` appending 4 KiB events, so a job is always pending."""
    body = "x" * 4096

    async def writer(w: int) -> None:
        for n in range(rounds):
            await store.events.append(
                [EventDraft(event_type="test.bulk", actor=f"w{w}", ts=1.0 + n, details={"b": body})]
                * 4
            )

    await asyncio.gather(*(writer(w) for w in range(writers)))


async def test_the_wal_starts_over_under_a_steady_load(tmp_path: Path) -> None:
    # PASSIVE checkpoints alone cannot let the WAL start over while the writer keeps
    # appending (it would hold every page written); the writer's RESTART checkpoints do.
    path = tmp_path / "apiary.db"
    options = SqliteOptions(
        checkpoint_every_changes=8, wal_restart_frames=64, journal_size_limit=64 * 4096
    )
    async with open_sqlite_store(path, options) as store:
        await _write_steadily(store, rounds=150)
        restarts = store.stats.wal_restarts
        assert await store.events.last_sequence() == 8 * 150 * 4
        # Once the load eases, the next commits start it over again: the file is bounded.
        await _write_steadily(store, rounds=RESTART_RETRY_COMMITS + 2, writers=1)
        wal_bytes = await asyncio.to_thread(os.path.getsize, f"{path}-wal")
    written = 8 * 150 * 4 * 4096
    # Under the load it started over at least once (how often depends on how busy the
    # machine keeps the writer: a RESTART gives way to readers for RESTART_RETRY_COMMITS).
    assert restarts >= 1
    assert wal_bytes < written / 4, (wal_bytes, written)


async def test_a_long_read_does_not_cost_every_commit_a_restart_attempt(tmp_path: Path) -> None:
    # While a reader holds an old snapshot the WAL cannot start over; the writer tries again
    # only every RESTART_RETRY_COMMITS commits instead of waiting for it after each one.
    path = tmp_path / "apiary.db"
    options = SqliteOptions(checkpoint_every_changes=8, wal_restart_frames=64)
    async with open_sqlite_store(path, options) as store:
        await store.events.append([draft(0)])
        reader = sqlite3.connect(path, check_same_thread=False)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM events").fetchone()  # holds its snapshot
            checkpointer = store.database.checkpointer
            commits = store.stats.writer.commits
            await _write_steadily(store, rounds=60)
            commits = store.stats.writer.commits - commits
            attempts = checkpointer.restart_attempts
            assert store.stats.wal_restarts == 0  # the snapshot pins the WAL
            assert 1 <= attempts <= commits // RESTART_RETRY_COMMITS + 2, (attempts, commits)
        finally:
            reader.close()
        await _write_steadily(store, rounds=60)
        assert store.stats.wal_restarts >= 1  # once the reader is gone


# --- migrations -----------------------------------------------------------------------


def _migration_rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as raw:
        return raw.execute(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()


async def test_migrations_are_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path):
        pass
    rows = _migration_rows(path)
    shipped = load_migrations("sqlite")
    assert [(v, n) for v, n, _ in rows] == [(m.version, m.name) for m in shipped]
    assert all(isinstance(at, float) and at > 0 for _, _, at in rows)
    async with open_sqlite_store(path):
        pass
    assert _migration_rows(path) == rows


async def test_a_schema_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path) as store:
        await store.events.append([draft(1)])
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO schema_migrations VALUES (9999, 'from_the_future', 0)")
    with pytest.raises(SchemaVersionError, match="9999"):
        async with open_sqlite_store(path):
            pass
    assert not _store_threads()
    assert len(_migration_rows(path)) == len(load_migrations("sqlite")) + 1


def test_migration_scripts_split_into_whole_statements() -> None:
    script = (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE t (a TEXT DEFAULT 'x;y'); -- trailing\n"
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN\n"
        "  UPDATE t SET a = 'z;'; \n"
        "END;\n"
        "-- only a comment at the end\n"
    )
    statements = split_statements(script)
    assert len(statements) == 2
    assert "CREATE TABLE t (a TEXT DEFAULT 'x;y');" in statements[0]
    assert statements[1].startswith("CREATE TRIGGER") and statements[1].endswith("END;")
    with sqlite3.connect(":memory:") as raw:
        for statement in statements:
            raw.execute(statement)
    with pytest.raises(ValueError, match="incomplete"):
        split_statements("CREATE TABLE t (a TEXT")


# --- durability across a hard kill ----------------------------------------------------

CHILD = """
import asyncio, os, signal, sys
from pathlib import Path
from apiary.core.events import EventDraft
from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.store.sqlite.store import open_sqlite_store

async def main(path):
    async with open_sqlite_store(Path(path)) as store:
        batches = await asyncio.gather(*(
            store.events.append([EventDraft("crash.test", "child", float(i), details={"i": i})])
            for i in range(100)
        ))
        admitted = await store.messages.admit(StoredMessage(
            "m-1", "b", "a", "c", 2, b"payload", MessageState.RECEIVED, 1.0, 1.0))
        last = max(e.sequence for batch in batches for e in batch)
        print("committed", last, admitted.offset, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1]))
"""


async def test_what_was_committed_survives_a_hard_kill(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, err.decode()
    word, last, offset = out.decode().split()
    assert (word, last, offset) == ("committed", "100", "1")
    assert (tmp_path / "apiary.db-wal").exists()  # killed before any clean close

    async with open_sqlite_store(path) as store:
        events = await store.events.read(limit=1000)
        assert [e.sequence for e in events] == list(range(1, 101))
        assert sorted(e.details["i"] for e in events) == list(range(100))
        stored = await store.messages.get("m-1")
        assert stored is not None
        assert stored.offset == 1


async def _events_at(store: SqliteStore, rows: list[tuple[int, str, str]]) -> None:
    """Events at the given sequences (with gaps: buckets far apart without millions of
    rows), each (sequence, correlation_id, agent_id)."""

    def insert(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "INSERT INTO events (sequence, event_type, actor, ts, correlation_id, agent_id,"
            " correlation_key) VALUES (?, 'e', 'a', 1.0, ?, ?, ?)",
            [(seq, corr, agent, correlation_key(corr)) for seq, corr, agent in rows],
        )

    await store.database.write(insert)


@pytest.mark.parametrize("window", [1, 2, 256])
async def test_reads_by_correlation_look_in_every_bucket_in_order(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    # Buckets of 4,096 events: 0, 1, 3 and 600 (past one window of 256 buckets); "plumless"
    # and "buckeroo" share a CRC-32, so they share index keys and only the id tells them apart.
    monkeypatch.setattr("apiary.store.sql.events._BUCKETS_PER_READ", window)
    await _events_at(store, [
        (1, "plumless", "x"), (2, "buckeroo", "x"), (4095, "plumless", "y"),
        (4096, "other", "x"), (5000, "plumless", "x"), (13000, "buckeroo", "y"),
        (13001, "plumless", "y"), (600 * 4096 + 7, "plumless", "x"),
    ])  # fmt: skip
    mine = EventFilter(correlation_id="plumless")

    async def sequences(after: int = 0, limit: int = 500, where: EventFilter = mine) -> list[int]:
        return [e.sequence for e in await store.events.read(after, limit, where)]

    assert await sequences() == [1, 4095, 5000, 13001, 2457607]
    assert await sequences(where=EventFilter(correlation_id="buckeroo")) == [2, 13000]
    assert await sequences(limit=2) == [1, 4095]
    assert await sequences(after=4095, limit=2) == [5000, 13001]
    assert await sequences(after=13001) == [2457607]
    assert await sequences(after=2457607) == []
    assert await sequences(where=EventFilter(correlation_id="plumless", agent_id="y")) == [
        4095, 13001,
    ]  # fmt: skip
    assert await sequences(where=EventFilter(correlation_id="nobody")) == []


async def test_a_read_by_correlation_of_an_empty_log_finds_nothing(store: SqliteStore) -> None:
    assert await store.events.read(where=EventFilter(correlation_id="c")) == []


async def test_appended_events_are_found_by_correlation_in_the_newest_bucket(
    store: SqliteStore,
) -> None:
    await _events_at(store, [(3 * 4096 - 1, "c", "a")])
    appended = await store.events.append([replace(draft(1), correlation_id="c")])
    found = await store.events.read(where=EventFilter(correlation_id="c"))
    assert [e.sequence for e in found] == [3 * 4096 - 1, appended[0].sequence]
    assert appended[0].sequence == 3 * 4096
