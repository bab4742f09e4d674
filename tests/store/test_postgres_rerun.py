"""Transactions PostgreSQL aborts to resolve a conflict are run again by the store
(`apiary.store.postgres.rerun`), and the retention delete locks in key order.

A deadlock is made on purpose: a second connection (another writer, another replica) holds
one message the store's transaction wants and then asks for one the store holds. The other
connection waits longer before PostgreSQL's deadlock check (`deadlock_timeout`), so the
store's transaction is the one aborted, as it would be about half the time in production.
Before, that abort reached the caller as `unavailable` (an agent's ACK frame ended its
SendStream); now the store runs the transaction again once the other side has gone on.
"""

from __future__ import annotations

import asyncio

import psycopg
import psycopg.errors
import pytest
from psycopg import sql

from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.store.errors import StoreError, StoreUnavailableError
from apiary.store.postgres.rerun import ATTEMPTS, aborted_by_conflict, rerun_when_aborted
from apiary.store.postgres.store import open_postgres_store
from tests.store.pg_waits import blocked_by

WAIT_S = 30
LOCK = "SELECT message_id FROM messages WHERE message_id = %s FOR UPDATE"


def _message(message_id: str) -> StoredMessage:
    return StoredMessage(
        message_id, "bob", "alice", "c", 2, b"payload", MessageState.RECEIVED, 1.0, 1.0
    )


async def _other_writer(dsn: str, schema: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A connection in `schema` that waits long before checking for a deadlock, so that in
    one the store's side is aborted."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    await conn.execute("SET deadlock_timeout = '60s'")
    await conn.commit()
    return conn


@pytest.mark.postgres
async def test_an_ack_aborted_by_a_deadlock_is_run_again_and_applies(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit_many([_message("m-a"), _message("m-z")])
        async with (
            await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
            await _other_writer(postgres_dsn, postgres_schema) as other,
        ):
            await other.execute(LOCK, ["m-z"])
            changes = [
                StateChange("m-a", MessageState.FULFILLED, 5.0, acked_stage="FULFILLED"),
                StateChange("m-z", MessageState.FULFILLED, 5.0, acked_stage="FULFILLED"),
            ]
            # The ACK locks m-a (key order), then waits for m-z.
            acking = asyncio.create_task(store.messages.apply(changes))
            await blocked_by(watcher, other.info.backend_pid)
            # The other side asks for m-a: a deadlock, and the store's side is aborted
            # (which is what lets this lock be granted at all).
            await asyncio.wait_for(other.execute(LOCK, ["m-a"]), WAIT_S)
            await other.commit()
        after = await asyncio.wait_for(acking, WAIT_S)
        assert [(m.message_id, m.state) for m in after] == [
            ("m-a", MessageState.FULFILLED),
            ("m-z", MessageState.FULFILLED),
        ]
        stored = await store.messages.get("m-z")
        assert stored is not None and stored.state is MessageState.FULFILLED


@pytest.mark.postgres
async def test_a_lone_statement_aborted_by_a_deadlock_is_run_again(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit_many([_message("m-a"), _message("m-z")])
        async with (
            await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
            await _other_writer(postgres_dsn, postgres_schema) as other,
        ):
            await other.execute(LOCK, ["m-z"])
            # One statement, run without a transaction around it: it locks m-a, waits for
            # m-z; the other side's ask for m-a closes the cycle.
            finishing = asyncio.create_task(store.messages.finish_delivered(["m-a", "m-z"], 7.0))
            await blocked_by(watcher, other.info.backend_pid)
            await asyncio.wait_for(other.execute(LOCK, ["m-a"]), WAIT_S)
            await other.commit()
        await asyncio.wait_for(finishing, WAIT_S)
        for message_id in ("m-a", "m-z"):
            stored = await store.messages.get(message_id)
            assert stored is not None and stored.state is MessageState.FULFILLED


@pytest.mark.postgres
async def test_the_retention_delete_waits_for_an_ack_writer_without_holding_what_it_wants_next(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        # m-z finished first and is stored first: the finished_at index and a scan of the
        # table both meet it before m-a.
        await store.messages.admit_many([_message("m-z"), _message("m-a")])
        await store.messages.set_state("m-z", MessageState.FULFILLED, 2.0)
        await store.messages.set_state("m-a", MessageState.FULFILLED, 3.0)
        async with (
            await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
            await _other_writer(postgres_dsn, postgres_schema) as other,
        ):
            # A writer of both messages (a late ACK, a delivery count) locks them in key
            # order: it holds m-a when retention runs.
            await other.execute(LOCK, ["m-a"])
            purging = asyncio.create_task(store.messages.purge_finished(10.0))
            await blocked_by(watcher, other.info.backend_pid)
            # Retention waits for m-a holding nothing after it: m-z is free at once.
            await other.execute(LOCK.replace("FOR UPDATE", "FOR UPDATE NOWAIT"), ["m-z"])
            await other.commit()
        assert await asyncio.wait_for(purging, WAIT_S) == 2
        assert await store.messages.get("m-a") is None


def _deadlock() -> StoreUnavailableError:
    error = StoreUnavailableError("PostgreSQL: deadlock detected")
    error.__cause__ = psycopg.errors.DeadlockDetected("deadlock detected")
    return error


async def test_a_conflict_that_outlasts_the_attempts_reaches_the_caller() -> None:
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        raise _deadlock()

    with pytest.raises(StoreUnavailableError, match="deadlock"):
        await rerun_when_aborted(run)
    assert runs == ATTEMPTS


async def test_other_errors_are_not_run_again() -> None:
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        error = StoreUnavailableError("PostgreSQL: server closed the connection")
        error.__cause__ = psycopg.OperationalError("server closed the connection")
        raise error

    with pytest.raises(StoreUnavailableError):
        await rerun_when_aborted(run)
    assert runs == 1


async def test_a_run_aborted_once_is_run_again_and_its_result_returned() -> None:
    results = iter([_deadlock(), "done"])

    async def run() -> str:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    assert await rerun_when_aborted(run) == "done"


def test_serialization_failures_and_deadlocks_are_conflicts_and_nothing_else() -> None:
    serialization = StoreError("PostgreSQL: could not serialize access")
    serialization.__cause__ = psycopg.errors.SerializationFailure("could not serialize")
    assert aborted_by_conflict(serialization)
    assert aborted_by_conflict(_deadlock())
    assert aborted_by_conflict(psycopg.errors.DeadlockDetected("deadlock detected"))
    assert not aborted_by_conflict(StoreUnavailableError("cannot connect"))
    unique = StoreError("PostgreSQL: duplicate key")
    unique.__cause__ = psycopg.errors.UniqueViolation("duplicate key")
    assert not aborted_by_conflict(unique)
