"""The message work replicas hand each other through PostgreSQL
(`apiary.store.postgres.cluster_work`; docs/cluster.md, "The message path" and "Timers").

Every writer of `messages` rows locks them in key order (`store.sql.messages`), so that
transactions touching the same messages wait for each other instead of deadlocking; the ACK
deadlines a replica writes behind are one of those writers. A deadlock here aborted the
ACK frame it met: the agent's SendStream ended `unavailable` under a burst, and its
messages stayed RECEIVED (the delivery stall `bench/cluster.py` reported)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

from apiary.core.records import MessageState, StoredMessage
from apiary.store.postgres.cluster import PostgresClusterLeases
from apiary.store.postgres.cluster_work import PostgresClusterWork
from apiary.store.postgres.store import open_postgres_store
from tests.store.pg_waits import blocked_by

pytestmark = pytest.mark.postgres

WAIT_S = 30


def _message(message_id: str) -> StoredMessage:
    return StoredMessage(
        message_id, "bob", "alice", "c", 2, b"payload", MessageState.RECEIVED, 1.0, 1.0
    )


async def test_ack_deadlines_written_while_an_ack_holds_their_messages_wait_without_deadlock(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        work = PostgresClusterWork(store.pool, PostgresClusterLeases(store.pool))
        await store.messages.admit_many([_message("m-z"), _message("m-a")])
        path = sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema))
        lock = "SELECT message_id FROM messages WHERE message_id = %s FOR UPDATE"
        async with (
            await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as watcher,
            await psycopg.AsyncConnection.connect(postgres_dsn) as ack,
        ):
            await ack.execute(path)
            # An ACK frame for both messages (another replica's): it locks them in key
            # order, and holds m-a when the deadlines of the two are written here.
            await ack.execute(lock, ["m-a"])
            writing = asyncio.create_task(work.set_ack_deadlines([("m-z", 50.0), ("m-a", 60.0)]))
            await blocked_by(watcher, ack.info.backend_pid)
            # The ACK goes on to m-z: the deadline writer must not be holding it.
            await asyncio.wait_for(ack.execute(lock, ["m-z"]), WAIT_S)
            await ack.commit()
        await asyncio.wait_for(writing, WAIT_S)
        async with store.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT message_id, ack_deadline FROM messages ORDER BY message_id"
            )
            assert await cursor.fetchall() == [("m-a", 60.0), ("m-z", 50.0)]
