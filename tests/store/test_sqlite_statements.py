"""The statements the SQLite writer runs for the task path's writes: each one costs the
writer thread a hand-over of the interpreter lock, and every index entry it rewrites a page
written to the WAL at the commit (docs/performance.md, issue 23's "The SQLite writer's
statements per task"). What is stored is the store conformance suite's to check."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from apiary.core.events import EventDraft
from apiary.core.records import MessageState, StateChange, StoredMessage, TaskState
from apiary.store.sqlite.database import SqliteDatabase, SqliteOptions
from apiary.store.sqlite.store import SqliteStore, open_sqlite_store
from apiary.testing.store_suite.tasks import task_record
from tests.store.test_sqlite import WAIT_S, pending, writer_held

_TRANSACTION = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@pytest.fixture(params=["loop", "thread"])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[SqliteStore]:
    options = SqliteOptions(writer=request.param)
    async with open_sqlite_store(tmp_path / "apiary.db", options) as opened:
        yield opened


@asynccontextmanager
async def statements_run(database: SqliteDatabase) -> AsyncIterator[list[str]]:
    """The statements the writer runs inside the block, as SQLite traces them (with their
    values), but those that open and end transactions and savepoints."""
    traced: list[str] = []

    def trace(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(traced.append)

    def untrace(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(None)

    await database.write(trace)
    try:
        yield traced
    finally:
        await database.write(untrace)
        kept = [s for s in traced if not s.startswith(_TRANSACTION)]
        traced[:] = kept


def draft(n: int) -> EventDraft:
    return EventDraft(event_type="test.event", actor="test", ts=1.0 + n, details={"n": n})


def message(message_id: str) -> StoredMessage:
    return StoredMessage(
        message_id=message_id, recipient="b", producer_id="a", correlation_id="c",
        message_type=2, envelope=b"payload", state=MessageState.RECEIVED, created_at=1.0,
        updated_at=1.0,
    )  # fmt: skip


def _updated_columns(statement: str) -> set[str]:
    """The columns an upsert's DO UPDATE sets."""
    sets = statement.split(" DO UPDATE SET ", 1)[1].split(" WHERE ", 1)[0]
    return {assignment.split(" = ", 1)[0].strip() for assignment in sets.split(",")}


async def test_an_append_is_its_inserts_alone(store: SqliteStore) -> None:
    """No statement reads the next sequence first: the inserts' rowids tell it, one
    statement per chunk of 250 events."""
    async with statements_run(store.database) as ran:
        (one,) = await store.events.append([draft(0)])
        burst = await store.events.append([draft(n) for n in range(1, 601)])
    assert len(ran) == 4
    assert all(s.startswith("INSERT INTO events ") for s in ran)
    assert [one.sequence, *(e.sequence for e in burst)] == list(range(1, 602))
    (after,) = await store.events.append([draft(601)])
    assert after.sequence == 602


async def test_a_task_transition_leaves_its_seq_and_agent_out_of_the_update(
    store: SqliteStore,
) -> None:
    """A stored task's next record is one statement that sets neither seq nor agent_id
    (whose index entries SQLite would rewrite); a record that changes either is put again
    with every column."""
    queued = task_record("t-1", 1)
    async with statements_run(store.database) as ran:
        await store.tasks.put(queued)
        await store.tasks.put(replace(queued, state=TaskState.RUNNING, attempts=1))
    assert len(ran) == 2
    assert _updated_columns(ran[1]).isdisjoint({"seq", "agent_id", "task_id"})
    assert "state" in _updated_columns(ran[1])
    handed = replace(queued, state=TaskState.DISPATCHED, agent_id="agent-z")
    async with statements_run(store.database) as ran:
        await store.tasks.put(handed, [draft(1)])
    assert [s.split(" ", 3)[2] for s in ran] == ["tasks", "tasks", "events"]
    assert {"seq", "agent_id"} <= _updated_columns(ran[1])
    assert await store.tasks.get("t-1") == handed


async def test_a_task_s_records_of_one_write_are_one_statement(store: SqliteStore) -> None:
    await store.messages.admit(message("m-1"))
    await store.tasks.put(task_record("t-1", 1, state="DISPATCHED"))
    running = task_record("t-1", 1, state="RUNNING")
    done = replace(running, state=TaskState.COMPLETED)
    async with statements_run(store.database) as ran:
        await store.messages.apply(
            [StateChange("m-1", MessageState.FULFILLED, 2.0)], tasks=[running, done]
        )
    assert [s.split(" ", 3)[:3] for s in ran] == [
        ["UPDATE", "messages", "SET"],
        ["INSERT", "INTO", "tasks"],
    ]
    assert await store.tasks.get("t-1") == done


async def test_one_message_s_state_change_needs_no_table_of_values(
    store: SqliteStore,
) -> None:
    """SQLite builds a temporary B-tree for `UPDATE ... FROM (VALUES ...)` at every run: one
    change goes without it, several in one statement with it."""
    await store.messages.admit_many([message("m-1"), message("m-2"), message("m-3")])
    async with statements_run(store.database) as ran:
        (one,) = await store.messages.apply([StateChange("m-1", MessageState.READ, 2.0)])
        two = await store.messages.apply(
            [StateChange(m, MessageState.READ, 3.0) for m in ("m-2", "m-3")]
        )
    assert len(ran) == 2
    assert "FROM (VALUES" not in ran[0] and "FROM (VALUES" in ran[1]
    assert (one.state, one.updated_at) == (MessageState.READ, 2.0)
    assert [(m.message_id, m.state) for m in two] == [
        ("m-2", MessageState.READ),
        ("m-3", MessageState.READ),
    ]


async def test_a_batch_runs_without_savepoints_until_a_job_fails(store: SqliteStore) -> None:
    """Jobs that all succeed share their transaction without a savepoint each; when one
    fails, the batch runs again with a savepoint per job, and the others commit once."""
    seen: list[str] = []

    def trace(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(seen.append)

    await store.database.write(trace)
    async with writer_held(store.database):
        tasks = await pending([store.events.append([draft(n)]) for n in range(3)])
    await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    assert not any(s.startswith(("SAVEPOINT", "RELEASE")) for s in seen)
    seen.clear()
    async with writer_held(store.database):
        tasks = await pending([
            store.events.append([draft(3)]),
            store.messages.apply([StateChange("nope", MessageState.READ, 2.0)]),
            store.events.append([draft(4)]),
        ])  # fmt: skip
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
    assert isinstance(outcomes[1], LookupError)
    assert [e.sequence for e in outcomes[0]] == [4]  # type: ignore[union-attr]
    assert [e.sequence for e in outcomes[2]] == [5]  # type: ignore[union-attr]
    assert await store.events.last_sequence() == 5
    assert sum(s.startswith("SAVEPOINT") for s in seen) == 3
    assert sum(s.startswith("ROLLBACK TO") for s in seen) == 1
