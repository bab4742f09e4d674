"""PostgreSQL's writes committed together (`apiary.store.postgres.group_commit`): the writes
that wait for the one running go in one transaction, one commit; a job that fails undoes
only itself; a group PostgreSQL aborts for a deadlock runs again whole, each job applied
once; a group whose connection is cut fails every job and keeps none; a caller gone before
its job started leaves nothing. All on the local PostgreSQL server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from apiary.core.events import EventDraft
from apiary.store.errors import StoreError, StoreUnavailableError
from apiary.store.postgres.store import PostgresStore, open_postgres_store
from apiary.store.sql.dialect import Dialect
from apiary.store.sql.postgres import PostgresSqlDatabase
from apiary.store.sql.statements import Execute, Query, Transaction
from tests.store.pg_waits import blocked_by

pytestmark = pytest.mark.postgres

WAIT_S = 30


@pytest.fixture
async def store(postgres_dsn: str, postgres_schema: str) -> AsyncIterator[PostgresStore]:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as opened:
        async with opened.pool.connection() as conn:
            await conn.execute("CREATE TABLE scratch (name TEXT PRIMARY KEY, n INTEGER)")
        yield opened


def _database(store: PostgresStore) -> PostgresSqlDatabase:
    """A database over the store's pool, group-committed as the store's own is."""
    return PostgresSqlDatabase(store.pool)


def _insert(d: Dialect, name: str) -> Transaction[int]:
    return (yield from Execute("INSERT INTO scratch (name, n) VALUES (?, 1)", (name,)))


def _insert_then_repeat(d: Dialect, name: str, taken: str) -> Transaction[int]:
    """Inserts `name`, then `taken` (a row that exists: a unique violation)."""
    yield from Execute("INSERT INTO scratch (name, n) VALUES (?, 1)", (name,))
    return (yield from Execute("INSERT INTO scratch (name, n) VALUES (?, 1)", (taken,)))


def _bump(d: Dialect, name: str) -> Transaction[int]:
    return (yield from Execute("UPDATE scratch SET n = n + 1 WHERE name = ?", (name,)))


def _slow_bump(d: Dialect, name: str) -> Transaction[int]:
    yield from Execute("SELECT pg_sleep(0.2)", ())
    return (yield from _bump(d, name))


async def _taken_alone() -> None:
    """Until a job just submitted was taken, alone, by the group commit (its submission,
    then its flusher, ran): jobs submitted from now on wait for it."""
    for _ in range(3):
        await asyncio.sleep(0)


async def _rows(store: PostgresStore) -> dict[str, int]:
    def read(d: Dialect) -> Transaction[list[tuple[str, int]]]:
        return (yield from Query("SELECT name, n FROM scratch", ()))

    return dict(await _database(store).read(read))


async def test_writes_that_wait_commit_together_all_durable(store: PostgresStore) -> None:
    database = _database(store)
    group = database.group
    assert group is not None
    before_commits, before_jobs = group.commits, group.jobs
    names = [f"w{i}" for i in range(20)]
    counts = await asyncio.gather(*(database.write(_insert, name) for name in names))
    assert counts == [1] * 20
    assert await _rows(store) == dict.fromkeys(names, 1)
    jobs, commits = group.jobs - before_jobs, group.commits - before_commits
    assert jobs == 20
    assert commits < jobs  # (the first alone, the 19 that waited for it in one)


async def test_events_appended_together_keep_gap_free_sequences(store: PostgresStore) -> None:
    drafts = [[EventDraft(f"t.{i}", "tester", 1.0 + i, details={"i": i})] for i in range(12)]
    appended = await asyncio.gather(*(store.events.append(d) for d in drafts))
    sequences = sorted(events[0].sequence for events in appended)
    assert sequences == list(range(sequences[0], sequences[0] + 12))
    read = await store.events.read(after=0, limit=100)
    assert [e.event_type for e in read] == [f"t.{i}" for i in range(12)]


async def test_a_failing_job_undoes_only_itself(store: PostgresStore) -> None:
    database = _database(store)
    await database.write(_insert, "taken")
    outcomes = await asyncio.gather(
        database.write(_insert, "before"),
        database.write(_insert_then_repeat, "half", "taken"),
        database.write(_insert, "after"),
        return_exceptions=True,
    )
    assert outcomes[0] == 1 and outcomes[2] == 1
    assert isinstance(outcomes[1], StoreError)
    assert "taken" in str(outcomes[1]) or "duplicate key" in str(outcomes[1])
    assert await _rows(store) == {"taken": 1, "before": 1, "after": 1}  # no "half"


async def test_a_group_aborted_by_a_deadlock_runs_again_each_job_once(
    store: PostgresStore, postgres_dsn: str, postgres_schema: str
) -> None:
    database = _database(store)
    for name in ("a", "z", "solo"):
        await database.write(_insert, name)
    async with (
        await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
        await psycopg.AsyncConnection.connect(postgres_dsn) as other,
    ):
        await other.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema))
        )
        await other.execute("SET deadlock_timeout = '60s'")  # the group's side is aborted
        await other.execute("SELECT 1 FROM scratch WHERE name = 'z' FOR UPDATE")
        # A job alone first; the three that wait for it go as one group, whose second job
        # waits for the row the other side holds.
        first = asyncio.create_task(database.write(_slow_bump, "solo"))
        await _taken_alone()
        grouped = [asyncio.create_task(database.write(_bump, name)) for name in ("a", "z", "solo")]
        await first
        await blocked_by(watcher, other.info.backend_pid)
        # The other side asks for "a", which the group holds: a deadlock; the group's
        # transaction is aborted, which lets this lock be granted, and runs again.
        await asyncio.wait_for(
            other.execute("SELECT 1 FROM scratch WHERE name = 'a' FOR UPDATE"), WAIT_S
        )
        await other.commit()
        assert await asyncio.wait_for(asyncio.gather(*grouped), WAIT_S) == [1, 1, 1]
    # Each job applied once: the aborted run's bumps were undone with it.
    assert await _rows(store) == {"a": 2, "z": 2, "solo": 3}


async def test_a_group_whose_connection_is_cut_fails_every_job_and_keeps_none(
    store: PostgresStore, postgres_dsn: str
) -> None:
    database = _database(store)

    def slow(d: Dialect) -> Transaction[int]:
        yield from Execute("SELECT pg_sleep(0.3)", ())
        return 0

    first = asyncio.create_task(database.write(slow))  # alone; the rest wait for it
    await _taken_alone()
    grouped = [
        asyncio.create_task(database.write(_insert, "x1")),
        asyncio.create_task(database.write(slow)),
        asyncio.create_task(database.write(_insert, "x2")),
    ]
    await first
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as killer:
        for _ in range(WAIT_S * 100):
            cursor = await killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'SELECT pg_sleep(0.3)%%' AND pid <> pg_backend_pid()"
            )
            if await cursor.fetchall():
                break
            await asyncio.sleep(0.01)
    outcomes = await asyncio.gather(*grouped, return_exceptions=True)
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
    assert await _rows(store) == {}


async def test_a_caller_gone_before_its_job_started_leaves_nothing(store: PostgresStore) -> None:
    database = _database(store)

    def slow(d: Dialect) -> Transaction[int]:
        yield from Execute("SELECT pg_sleep(0.2)", ())
        return 0

    first = asyncio.create_task(database.write(slow))
    await _taken_alone()
    gone = asyncio.create_task(database.write(_insert, "gone"))
    kept = asyncio.create_task(database.write(_insert, "kept"))
    await asyncio.sleep(0.05)
    gone.cancel()
    await first
    assert await kept == 1
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await _rows(store) == {"kept": 1}


async def test_without_group_commit_each_write_is_its_own(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(
        postgres_dsn, schema=postgres_schema, group_commit=False
    ) as store:
        database = PostgresSqlDatabase(store.pool, group_commit=False)
        assert database.group is None
        async with store.pool.connection() as conn:
            await conn.execute("CREATE TABLE scratch (name TEXT PRIMARY KEY, n INTEGER)")
        await asyncio.gather(*(database.write(_insert, f"s{i}") for i in range(5)))
        assert len(await _rows(store)) == 5
