"""The SQLite writer on the event loop (the default, store/sqlite/loop_writer.py): what one
turn of the loop submits commits together, nothing that may wait runs on the loop (another
process's lock, the WAL's RESTART checkpoint), and closing commits what was submitted."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.records import DlqFilter
from apiary.store.errors import StoreError
from apiary.store.sql import purge
from apiary.store.sqlite.database import SqliteOptions
from apiary.store.sqlite.store import SqliteStore, open_sqlite_store
from apiary.testing.store_suite.base import T0, dlq_entry, idempotency_record
from tests.store.test_sqlite import WAIT_S, draft, pending


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with open_sqlite_store(tmp_path / "apiary.db") as opened:
        assert opened.database.options.writer == "loop"  # (the default)
        yield opened


async def test_what_one_turn_submits_commits_in_one_transaction(store: SqliteStore) -> None:
    before = store.stats.writer
    tasks = await pending([store.events.append([draft(i)]) for i in range(50)])
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    after = store.stats.writer
    assert (after.commits - before.commits, after.jobs - before.jobs) == (1, 50)
    assert sorted(e.sequence for batch in results for e in batch) == list(range(1, 51))
    for i in range(5):  # one at a time: each commits at once, alone
        await store.events.append([draft(100 + i)])
    assert store.stats.writer.commits - after.commits == 5


async def test_a_job_cancelled_before_its_turn_is_not_run(store: SqliteStore) -> None:
    kept, dropped = await pending(
        [store.events.append([draft(1)]), store.events.append([draft(2)])]
    )
    dropped.cancel()
    (event,) = await asyncio.wait_for(kept, WAIT_S)
    assert event.sequence == 1
    assert [e.sequence for e in await store.events.read()] == [1]


async def test_another_process_lock_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    """A write lock held elsewhere (another process's connection) does not stop the loop:
    the batch waits for it on a thread, and commits once it is released."""
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path) as store:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            write = asyncio.ensure_future(store.events.append([draft(1)]))
            for _ in range(5):  # the loop goes on turning meanwhile
                await asyncio.sleep(0.02)
            assert not write.done()
            other.execute("COMMIT")
            (event,) = await asyncio.wait_for(write, WAIT_S)
            assert event.sequence == 1
            (again,) = await store.events.append([draft(2)])  # back on the loop
            assert again.sequence == 2
        finally:
            other.close()


async def test_a_lock_held_past_the_busy_timeout_fails_the_batch_with_a_store_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path, SqliteOptions(busy_timeout_ms=50)) as store:
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError, match="locked"):
                await asyncio.wait_for(store.events.append([draft(1)]), WAIT_S)
        finally:
            other.execute("ROLLBACK")
            other.close()
        (event,) = await store.events.append([draft(2)])  # nothing was kept of the first
        assert event.sequence == 1


async def test_the_wal_still_starts_over(tmp_path: Path) -> None:
    """The RESTART checkpoint the checkpointer asks for runs (on a thread) between two
    batches, and the writes go on after it."""
    options = SqliteOptions(checkpoint_every_changes=1, wal_restart_frames=1)
    async with open_sqlite_store(tmp_path / "apiary.db", options) as store:
        for i in range(60):
            await store.events.append([draft(i)])
            if store.stats.wal_restarts:
                break
            await asyncio.sleep(0.01)  # (the checkpointer's thread runs its PASSIVE pass)
        assert store.stats.wal_restarts >= 1
        (event,) = await store.events.append([draft(99)])
        assert event.sequence == i + 2


async def test_closing_commits_what_was_submitted(tmp_path: Path) -> None:
    path = tmp_path / "apiary.db"
    async with open_sqlite_store(path) as store:
        tasks = await pending([store.events.append([draft(i)]) for i in range(10)])
    assert all(task.done() and not task.exception() for task in tasks)
    async with open_sqlite_store(path) as reopened:
        assert await reopened.events.last_sequence() == 10
        with pytest.raises(StoreError, match="closed"):
            await store.events.append([draft(11)])


async def test_retention_deletes_in_chunks_of_its_own(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge removes everything before its time, a bounded chunk per transaction, so that
    no one job holds the loop for long (store/sql/purge.py)."""
    monkeypatch.setattr(purge, "PURGE_CHUNK", 3)
    for i in range(8):
        await store.dlq.add(dlq_entry(f"m-{i}", failed_at=T0 + i))
        await store.idempotency.put(idempotency_record(f"tok-{i}", updated_at=T0 + i))
    await store.dlq.add(dlq_entry("m-late", failed_at=T0 + 100))
    before = store.stats.writer.commits
    assert await store.dlq.purge(T0 + 50) == 8
    assert store.stats.writer.commits - before == 3  # 3 + 3 + 2 rows
    assert await store.idempotency.purge(T0 + 6) == 6  # 3 + 3, then one deleting none
    assert store.stats.writer.commits - before == 6
    assert [e.message_id for e in await store.dlq.list(DlqFilter())] == ["m-late"]
    assert await store.idempotency.get("tok-6") is not None
