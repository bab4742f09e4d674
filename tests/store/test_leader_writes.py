"""The leader's components' writes fenced by its term, on the real PostgreSQL
(`store.sql.leader_writes`; docs/cluster.md, "The leader"): outside cluster mode a task's
write runs no statement more than before; with a fence, a write under the current term
commits, one under a term another replica took over is refused with nothing written (its
events neither, nor the task carried by a dispatch's admission), the fence is told, and a
takeover waits for a write of the old term still open; a renewal of the term does not wait
for one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import apiary.store.sql.postgres as sql_postgres
from apiary.core.cluster.leases import LeaseAction, Verdict
from apiary.core.events import EventDraft
from apiary.core.records import AdmissionWrites, MessageState, StoredMessage, TaskRecord
from apiary.store.cluster import FencedError, Me
from apiary.store.open import tenant_schema
from apiary.store.postgres.cluster import qualified
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.pool import Connection
from apiary.store.postgres.store import PostgresStore, open_postgres_store
from apiary.store.sql.dialect import POSTGRESQL
from apiary.store.sql.statements import Statement
from apiary.testing.clock import FakeClock
from tests.security.tenant_harness import drop_schemas

pytestmark = pytest.mark.postgres

L = 5.0
A, B = Me("replica-a", "inc-a", "10.0.0.1:50051"), Me("replica-b", "inc-b", "10.0.0.2:50051")


class Term:
    """A replica's leader term as the fence reads it, and the refusals it was told of."""

    def __init__(self, me: Me) -> None:
        self.me = me
        self.epoch = 0
        self.refusals: list[FencedError] = []

    def term(self) -> tuple[str, int]:
        return self.me.replica_id, self.epoch

    def refused(self, error: FencedError) -> None:
        self.refusals.append(error)


@pytest.fixture
async def store(postgres_dsn: str, postgres_schema: str) -> AsyncIterator[PostgresStore]:
    async with open_postgres_store(postgres_dsn, schema=postgres_schema) as opened:
        yield opened


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every statement the transactions run from now on."""
    seen: list[str] = []
    run = sql_postgres.run_statement

    async def counted(
        conn: Connection, statement: Statement[Any], params: Sequence[Any] | None = None
    ) -> Any:
        seen.append(POSTGRESQL.render(statement.sql))
        return await run(conn, statement, params)

    monkeypatch.setattr(sql_postgres, "run_statement", counted)
    return seen


def _task(task_id: str, state: str = "QUEUED", message_id: str = "") -> TaskRecord:
    return TaskRecord(
        task_id=task_id, agent_id="w", priority=0, submitted_at=1.0, seq=int(task_id[-1]),
        state=state, updated_at=1.0, message_id=message_id,  # type: ignore[arg-type]
    )  # fmt: skip


def _event(task_id: str) -> EventDraft:
    return EventDraft("task.submitted", "scheduler", 1.0, correlation_id=task_id)


async def _leading(store: PostgresStore, clock: FakeClock) -> tuple[PostgresClusterLeader, Term]:
    leader = PostgresClusterLeader(store.pool, clock)
    await leader.seed("key")
    term = Term(A)
    term.epoch = (await leader.step(A, LeaseAction.ACQUIRE, L, A.address)).lease.epoch
    store.leader_writes.fence = term
    return leader, term


async def test_outside_cluster_mode_a_task_write_runs_no_statement_more(
    store: PostgresStore, statements: list[str]
) -> None:
    await store.tasks.put(_task("t-1"), [_event("t-1")])
    assert not [s for s in statements if "cluster_leader" in s]
    alone = len(statements)
    assert (await store.tasks.get("t-1")) is not None
    # With a fence, the same write runs one statement more: the check of the term.
    await _leading(store, FakeClock())
    statements.clear()
    await store.tasks.put(_task("t-2"), [_event("t-2")])
    assert len(statements) == alone + 1
    assert "cluster_leader" in statements[0]


async def test_a_write_under_a_term_taken_over_is_refused_with_nothing_written(
    store: PostgresStore,
) -> None:
    clock = FakeClock()
    leader, term = await _leading(store, clock)
    await store.tasks.put(_task("t-1"), [_event("t-1")])
    assert term.refusals == []
    # The leader pauses past its lease; another replica takes the term over.
    clock.advance(L)
    took = await leader.step(B, LeaseAction.ACQUIRE, L, B.address)
    assert took.verdict is Verdict.TOOK_OVER
    last = await store.events.last_sequence()
    with pytest.raises(FencedError):
        await store.tasks.put(_task("t-1", "COMPLETED"), [_event("t-1")])
    with pytest.raises(FencedError):
        await store.tasks.put(_task("t-2"))
    assert (await store.tasks.get("t-1")).state == "QUEUED"  # type: ignore[union-attr]
    assert await store.tasks.get("t-2") is None
    assert await store.events.last_sequence() == last
    assert [e.found.owner for e in term.refusals] == [B.replica_id, B.replica_id]
    # A dispatch (a message admitted with its task's change) is refused whole.
    dispatch = StoredMessage(
        "m-1", "w", "scheduler", "t-1", 1, b"x", MessageState.RECEIVED, 1.0, 1.0
    )
    with pytest.raises(FencedError):
        await store.messages.admit_many(
            [dispatch], [AdmissionWrites(task=_task("t-1", "DISPATCHED", "m-1"))]
        )
    assert await store.messages.get("m-1") is None
    # Messages that carry no task are not the leader's: any replica admits them.
    assert (await store.messages.admit_many([dispatch]))[0].offset == 1  # type: ignore[union-attr]


async def test_a_takeover_waits_for_a_write_of_the_old_term_and_a_renewal_does_not(
    store: PostgresStore,
) -> None:
    clock = FakeClock()
    leader, term = await _leading(store, clock)
    # A write of the term holds the leader's row FOR KEY SHARE until it ends.
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM cluster_leader WHERE owner = %s AND epoch = %s FOR KEY SHARE",
            [A.replica_id, term.epoch],
        )
        renewed = await asyncio.wait_for(leader.step(A, LeaseAction.RENEW, L), 10)
        assert renewed.verdict is Verdict.RENEWED
        clock.advance(L)
        takeover = asyncio.ensure_future(leader.step(B, LeaseAction.ACQUIRE, L, B.address))
        await _waiting_for_a_lock(store, takeover)
        assert not takeover.done()
    assert (await asyncio.wait_for(takeover, 10)).verdict is Verdict.TOOK_OVER


async def _waiting_for_a_lock(store: PostgresStore, step: asyncio.Future[Any]) -> None:
    """Until a session of the schema's database waits for a row lock on cluster_leader."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 10
    while True:
        async with store.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%cluster_leader%%FOR UPDATE%%'"
            )
            row = await cursor.fetchone()
        if row is not None and row[0] > 0:
            return
        assert not step.done(), "the takeover did not wait for the write of the old term"
        assert loop.time() < until, "the takeover never waited for a lock"
        await asyncio.sleep(0.02)


async def test_a_tenants_writes_are_fenced_by_the_clusters_leader_row(
    postgres_dsn: str, postgres_schema: str, store: PostgresStore
) -> None:
    """Another tenant's store (its own schema) checks the term in the leader's row of the
    cluster's schema (`LeaderWrites.table`; docs/cluster.md, "Tenants"): its writes commit
    under the cluster's current term and are refused once another replica took it over."""
    clock = FakeClock()
    leader, term = await _leading(store, clock)
    schema = tenant_schema(postgres_schema, "acme")
    try:
        async with open_postgres_store(postgres_dsn, schema=schema) as acme:
            acme.leader_writes.fence = term
            acme.leader_writes.table = qualified(postgres_schema, "cluster_leader")
            await acme.tasks.put(_task("t-1"), [_event("t-1")])
            assert (await acme.tasks.get("t-1")) is not None and term.refusals == []
            clock.advance(L)
            assert (await leader.step(B, LeaseAction.ACQUIRE, L, B.address)).lease.epoch == 2
            with pytest.raises(FencedError):
                await acme.tasks.put(_task("t-2"))
            assert await acme.tasks.get("t-2") is None
            assert [e.found.owner for e in term.refusals] == [B.replica_id]
    finally:
        drop_schemas(postgres_dsn, [schema])
