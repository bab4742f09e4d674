"""What only the PostgreSQL backend promises: schema isolation, migrations, and gap-free
numbering across several stores (replicas) sharing one schema."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import psycopg
import pytest
from psycopg import sql

from apiary.core.events import EventDraft
from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.store.errors import DuplicateMessageError, SchemaVersionError
from apiary.store.migrations import load_migrations
from apiary.store.postgres.store import (
    PostgresStore,
    open_postgres_store,
    split_schema_parameter,
)
from apiary.store.sql.bulk import MAX_ROWS

pytestmark = pytest.mark.postgres

WAIT_S = 60


def draft(n: int, replica: int = 0) -> EventDraft:
    return EventDraft("test.event", f"replica-{replica}", 1.0 + n, details={"n": n, "r": replica})


def message(message_id: str, recipient: str = "b") -> StoredMessage:
    return StoredMessage(
        message_id, recipient, "a", "c", 2, b"payload", MessageState.RECEIVED, 1.0, 1.0
    )


def _tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema]
        ).fetchall()
    return {name for (name,) in rows}


async def test_tables_live_in_the_chosen_schema_only(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        assert store.schema == postgres_schema
        await store.events.append([draft(1)])
    assert {"events", "agents", "messages", "schema_migrations"} <= _tables(
        postgres_dsn, postgres_schema
    )
    with psycopg.connect(postgres_dsn) as conn:
        (count,) = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.events").format(sql.Identifier(postgres_schema))
        ).fetchone() or (None,)
    assert count == 1


async def test_the_schema_can_be_named_in_the_url(postgres_dsn: str, postgres_schema: str) -> None:
    separator = "&" if "?" in postgres_dsn else "?"
    url = f"{postgres_dsn}{separator}apiary_schema={postgres_schema}&connect_timeout=5"
    async with open_postgres_store(url) as store:
        assert store.schema == postgres_schema
        await store.agents.list()
    assert "events" in _tables(postgres_dsn, postgres_schema)


def test_only_the_schema_parameter_is_removed_from_a_url() -> None:
    url = "postgresql://u:p%40ss@h:5/db?options=-c%20x%3Dy&apiary_schema=s%20one&sslmode=disable"
    assert split_schema_parameter(url) == (
        "postgresql://u:p%40ss@h:5/db?options=-c%20x%3Dy&sslmode=disable",
        "s one",
    )
    assert split_schema_parameter("postgresql://h/db?apiary_schema=s") == ("postgresql://h/db", "s")
    assert split_schema_parameter("postgresql://h/db") == ("postgresql://h/db", None)
    assert split_schema_parameter("host=h dbname=db") == ("host=h dbname=db", None)


async def test_migrations_are_recorded_once(postgres_dsn: str, postgres_schema: str) -> None:
    for _ in range(2):
        async with open_postgres_store(postgres_dsn, schema=postgres_schema):
            pass
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT version, name FROM {}.schema_migrations ORDER BY version").format(
                sql.Identifier(postgres_schema)
            )
        ).fetchall()
    assert rows == [(m.version, m.name) for m in load_migrations("postgres")]


async def test_replicas_opening_a_fresh_schema_together_migrate_once(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async def open_and_append(replica: int) -> None:
        async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
            await store.events.append([draft(replica, replica)])

    await asyncio.wait_for(asyncio.gather(*(open_and_append(r) for r in range(4))), WAIT_S)
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        assert [e.sequence for e in await store.events.read()] == [1, 2, 3, 4]


async def test_a_schema_newer_than_the_code_is_refused(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema):
        pass
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (9999, 'x')").format(
                sql.Identifier(postgres_schema)
            )
        )
    with pytest.raises(SchemaVersionError, match="9999"):
        async with open_postgres_store(postgres_dsn, schema=postgres_schema):
            pass


async def test_replicas_appending_together_get_gap_free_sequences(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with (
        open_postgres_store(postgres_dsn, schema=postgres_schema) as one,
        open_postgres_store(postgres_dsn, schema=postgres_schema) as two,
    ):
        appends = [
            store.events.append([draft(i, r), draft(i + 1000, r)])
            for i in range(60)
            for r, store in enumerate((one, two))
        ]
        batches = await asyncio.wait_for(asyncio.gather(*appends), WAIT_S)
        assert sorted(e.sequence for b in batches for e in b) == list(range(1, 241))
        for batch in batches:
            assert batch[1].sequence == batch[0].sequence + 1
        read = await two.events.read(limit=1000)
        assert [e.sequence for e in read] == list(range(1, 241))
        assert await one.events.last_sequence() == 240


async def test_a_burst_past_one_statement_keeps_its_sequences_consecutive_and_in_order(
    postgres_dsn: str, postgres_schema: str
) -> None:
    # The first MAX_ROWS events go in with the sequence claim, the rest after it: another
    # replica's appends meanwhile never land inside the burst.
    burst = MAX_ROWS * 2 + 7
    async with (
        open_postgres_store(postgres_dsn, schema=postgres_schema) as one,
        open_postgres_store(postgres_dsn, schema=postgres_schema) as two,
    ):
        big, *small = await asyncio.wait_for(
            asyncio.gather(
                one.events.append([draft(i) for i in range(burst)]),
                *(two.events.append([draft(i, 2)]) for i in range(20)),
            ),
            WAIT_S,
        )
        first = big[0].sequence
        assert [e.sequence for e in big] == list(range(first, first + burst))
        read = await two.events.read(after=first - 1, limit=burst)
        assert [(e.sequence, e.details["n"], e.ts) for e in read] == [
            (first + i, i, 1.0 + i) for i in range(burst)
        ]
        others = [e.sequence for b in small for e in b]
        assert not [n for n in others if first <= n < first + burst]
        assert sorted([*others, *range(first, first + burst)]) == list(range(1, burst + 21))
        assert await one.events.last_sequence() == burst + 20


async def test_replicas_admitting_together_get_gap_free_offsets(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with (
        open_postgres_store(postgres_dsn, schema=postgres_schema) as one,
        open_postgres_store(postgres_dsn, schema=postgres_schema) as two,
    ):
        admits = [(one, two)[i % 2].messages.admit(message(f"m-{i}")) for i in range(80)]
        admitted = await asyncio.wait_for(asyncio.gather(*admits), WAIT_S)
        assert sorted(m.offset for m in admitted) == list(range(1, 81))
        assert [m.offset for m in await one.messages.inbox("b", limit=100)] == list(range(1, 81))


async def test_replicas_admitting_overlapping_batches_admit_each_id_once(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with (
        open_postgres_store(postgres_dsn, schema=postgres_schema) as one,
        open_postgres_store(postgres_dsn, schema=postgres_schema) as two,
    ):
        # Batch b holds ids b*10 .. b*10+19: every id is offered by two batches at once,
        # half of them to the same recipient, half to another one.
        batches = [
            [
                message(f"m-{i:03}", "b" if (i + b * (i % 2)) % 2 else "c")
                for i in range(b * 10, b * 10 + 20)
            ]
            for b in range(20)
        ]
        admits = [(one, two)[b % 2].messages.admit_many(batch) for b, batch in enumerate(batches)]
        results = await asyncio.wait_for(asyncio.gather(*admits), WAIT_S)
        admitted = [o for outcomes in results for o in outcomes if isinstance(o, StoredMessage)]
        duplicates = [o for outcomes in results for o in outcomes if isinstance(o, Exception)]
        assert sorted(m.message_id for m in admitted) == [f"m-{i:03}" for i in range(210)]
        assert len(duplicates) == 400 - 210
        for recipient in ("b", "c"):
            inbox = await one.messages.inbox(recipient, limit=1000)
            assert [m.offset for m in inbox] == list(range(1, len(inbox) + 1))
            assert sorted(m.offset for m in admitted if m.recipient == recipient) == [
                m.offset for m in inbox
            ]


async def test_replicas_applying_crossing_batches_do_not_deadlock(
    postgres_dsn: str, postgres_schema: str
) -> None:
    ids = [f"m-{i:02}" for i in range(40)]
    async with (
        open_postgres_store(postgres_dsn, schema=postgres_schema) as one,
        open_postgres_store(postgres_dsn, schema=postgres_schema) as two,
    ):
        await one.messages.admit_many([message(i) for i in ids])

        def changes(order: list[str], at: float) -> list[StateChange]:
            return [StateChange(i, MessageState.READ, at) for i in order]

        # Opposite orders: without locking in key order these would wait for each other.
        work: list[Coroutine[Any, Any, object]] = []
        for round_ in range(10):
            work.append(one.messages.apply(changes(ids, float(round_))))
            work.append(two.messages.apply(changes(ids[::-1], float(round_))))
            counts = [(i, round_ + 1, float(round_)) for i in ids[::-1]]
            work.append(one.messages.record_deliveries(counts))
        await asyncio.wait_for(asyncio.gather(*work), WAIT_S)
        stored = await two.messages.get("m-00")
        assert stored is not None
        assert stored.deliveries == 10


@pytest.mark.parametrize(
    ("query", "index"),
    [
        (
            "SELECT message_id FROM messages WHERE due_at <= %s ORDER BY due_at, message_id"
            " LIMIT 10",
            "messages_due",
        ),
        ("SELECT min(due_at) FROM messages", "messages_due"),
        ("DELETE FROM messages WHERE finished_at < %s", "messages_finished"),
        (
            "SELECT invocation_id FROM hitl WHERE created_at > %s AND state IN ('PENDING')"
            " ORDER BY created_at, invocation_id LIMIT 10",
            "hitl_by_state",
        ),
        (
            "SELECT invocation_id FROM hitl WHERE created_at > %s"
            " ORDER BY created_at, invocation_id LIMIT 10",
            "hitl_by_created",
        ),
    ],
)
async def test_the_indexes_serve_their_queries(
    postgres_dsn: str, postgres_schema: str, query: str, index: str
) -> None:
    """The planner can use each query's index; for the partial ones, it can prove the queries
    imply their predicates (with the table empty it prefers a scan, hence enable_seqscan
    off)."""
    async with open_postgres_store(postgres_dsn, schema=postgres_schema):
        pass
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
        conn.execute("SET enable_seqscan = off")
        params = [1.0] if "%s" in query else []
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {query}", params))
        conn.rollback()
    assert index in plan, plan


async def _wait_for_a_blocked_insert(dsn: str) -> None:
    """Until some backend waits on a lock inside a batch INSERT INTO messages. PostgreSQL
    offers no notification of that, so pg_stat_activity is polled (bounded)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(WAIT_S * 100):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'INSERT INTO messages%%ON CONFLICT%%'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.01)
    raise TimeoutError("the batch INSERT never waited for the concurrent one")


async def test_an_id_admitted_elsewhere_meanwhile_is_a_duplicate_and_leaves_no_gap(
    postgres_dsn: str, postgres_schema: str
) -> None:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit(message("first", "b"))
        with psycopg.connect(postgres_dsn) as other:
            # Another replica admits "x" to another recipient and has not committed yet:
            # the batch's duplicate check cannot see it, its INSERT has to wait for it.
            other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
            other.execute(
                "INSERT INTO messages (message_id, recipient, inbox_offset, producer_id,"
                " correlation_id, message_type, envelope, state, created_at, updated_at)"
                " VALUES ('x', 'z', 1, 'a', 'c', 2, '', 'RECEIVED', 1, 1)"
            )
            batch = store.messages.admit_many([message("x", "b"), message("y", "b")])
            admitting = asyncio.create_task(batch)
            await _wait_for_a_blocked_insert(postgres_dsn)
            other.commit()
        duplicate, admitted = await asyncio.wait_for(admitting, WAIT_S)
        assert isinstance(duplicate, DuplicateMessageError)
        assert isinstance(admitted, StoredMessage)
        assert admitted.offset == 2
        assert [m.message_id for m in await store.messages.inbox("b")] == ["first", "y"]
        assert (await store.messages.admit(message("z", "b"))).offset == 3


async def _cut_one_idle(store: PostgresStore, dsn: str) -> int:
    """End, from the database side, the session of a connection the pool holds idle; its
    backend's pid."""
    async with store.pool.connection() as conn:  # it goes back to the pool, idle
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    with psycopg.connect(dsn, autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(%s, 5000)", [row[0]]).fetchone()
    assert ended == (True,)
    return int(row[0])


async def test_a_read_on_a_pooled_connection_cut_while_idle_is_answered(
    postgres_dsn: str, postgres_schema: str
) -> None:
    """The database ended the session of a connection idle in the pool (a restart, an
    administrator): the next read finds it cut and is answered from a new connection, not
    `unavailable`, since a read is safe to repeat. Writes are not repeated (their outcome is
    the caller's to learn)."""
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit(message("m-1", "bob"))
        await _cut_one_idle(store, postgres_dsn)
        inbox = await store.messages.inbox("bob", 0, 10)
        assert [m.message_id for m in inbox] == ["m-1"]


async def test_a_read_after_every_idle_connection_was_cut_is_answered(
    postgres_dsn: str, postgres_schema: str
) -> None:
    """A database restart cuts every idle connection at once: the read that finds the first
    cut tries again on a new connection, not on the next cut one."""
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit(message("m-1", "bob"))
        pids = []
        async with store.pool.connection() as a, store.pool.connection() as b:
            for conn in (a, b):  # both go back to the pool, idle
                row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
                assert row is not None
                pids.append(row[0])
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            for pid in pids:
                ended = admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone()
                assert ended == (True,)
        inbox = await store.messages.inbox("bob", 0, 10)
        assert [m.message_id for m in inbox] == ["m-1"]


async def test_a_write_after_its_pooled_connection_was_cut_while_idle_is_made(
    postgres_dsn: str, postgres_schema: str
) -> None:
    """A write is not repeated when its connection is cut (its outcome is the caller's to
    learn), so the pool lends none that the database ended while it sat idle: the write
    after the cut (an agent's deregistration once an outage is over, say) is made on a new
    connection, not answered `unavailable`."""
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as store:
        await store.messages.admit(message("m-1", "bob"))
        cut = await _cut_one_idle(store, postgres_dsn)
        admitted = await store.messages.admit(message("m-2", "bob"))
        assert isinstance(admitted, StoredMessage) and admitted.offset == 2
        async with store.pool.connection() as conn:
            again = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert again is not None and again[0] != cut
