"""The cluster's leader in PostgreSQL (`store.cluster.ClusterLeader`; docs/cluster.md,
"The leader").

The leader's lease is the one row of `cluster_leader`, decided by the same machine as a
partition's (`core.cluster.leases.LeaseMachine`) under the same locks: an operation locks
the row FOR UPDATE, reads the database's clock once, applies the machine and writes back
what it returned; reads and deletions of the relay under a term lock it FOR KEY SHARE and
check the term first (as `PostgresClusterLeases.fenced` does for a partition), so a takeover
waits for the old term's reads to end and every one after it sees the new epoch. In the
machine's terms the row is the lease of partition LEADER_PARTITION.

Relayed items are rows of `cluster_relay`, read in `seq` order and deleted once applied: a
leader that dies between the two leaves them to its successor, which applies them again
(the components take a repeat as they take an agent's repeat). A relay and a change of
leader notify the channel `LEADER_CHANNEL` (payload: the schema, then a tab and `relay`
for a relay): a hint, polling the guarantee.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Final

import psycopg
from psycopg import sql

from apiary.core.clock import Clock
from apiary.core.cluster.leases import Lease, LeaseAction, LeaseMachine
from apiary.store.cluster import (
    LEADER,
    LEADER_PARTITION,
    Leadership,
    LeaseOutcome,
    Me,
    Relayed,
)
from apiary.store.errors import StoreError
from apiary.store.postgres.cluster import qualified
from apiary.store.postgres.pool import Connection, PostgresPool, fetch_rows
from apiary.store.postgres.store import DEFAULT_SCHEMA, split_schema_parameter
from apiary.store.sql.leader_writes import check_leader_term
from apiary.store.sql.postgres import run_transaction

LEADER_CHANNEL: Final = "apiary_cluster_leader"
LEADER_NOTE: Final = "leader"
"""A note that the leader's lease changed hands (a new term, a release)."""
RELAY_NOTE: Final = "relay"
"""A note that something was relayed to the leader."""


class PostgresClusterLeader:
    """The leader's row and the relay of one schema (module docstring): the default
    tenant's, or another tenant's relay under the leader's row of `cluster_schema` (None:
    the pool's schema is the cluster's), on whose lease every tenant's relay is read."""

    def __init__(
        self, pool: PostgresPool, clock: Clock | None = None, cluster_schema: str | None = None
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._leader = qualified(cluster_schema or pool.schema, "cluster_leader")
        self._row = f"SELECT owner, epoch, expires_at, address, forward_key FROM {self._leader}"

    async def seed(self, forward_key: str) -> Leadership:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                f"INSERT INTO {self._leader} (name, forward_key) VALUES (%s, %s)"
                " ON CONFLICT (name) DO NOTHING",
                [LEADER, forward_key],
            )
            return await self._read(conn, "")

    async def step(
        self, me: Me, action: LeaseAction, lease_s: float, address: str = ""
    ) -> LeaseOutcome:
        # A renewal keeps the term: it locks FOR NO KEY UPDATE, which the KEY SHARE locks of
        # the term's fenced writes do not hold up; a new term waits for them (FOR UPDATE).
        lock = " FOR NO KEY UPDATE" if action is LeaseAction.RENEW else " FOR UPDATE"
        async with self._pool.connection() as conn, conn.transaction():
            found = await self._read(conn, lock)
            step = LeaseMachine.step(found.lease, me.replica_id, action, found.now, lease_s)
            if step.verdict.granted:
                term_begins = step.lease.epoch != found.lease.epoch
                await conn.execute(
                    f"UPDATE {self._leader} SET owner = %s, epoch = %s, expires_at = %s,"
                    " acquired_at = CASE WHEN %s THEN %s ELSE acquired_at END,"
                    " address = CASE WHEN %s THEN %s ELSE address END WHERE name = %s",
                    [
                        step.lease.owner, step.lease.epoch, step.lease.expires_at,
                        term_begins, found.now, term_begins, address, LEADER,
                    ],
                )  # fmt: skip
                if term_begins or action is LeaseAction.RELEASE:
                    await _notify(conn, self._pool.schema)
            return LeaseOutcome(step.lease, step.verdict)

    async def read(self) -> Leadership:
        async with self._pool.connection() as conn:
            return await self._read(conn, "")

    async def relay(self, me: Me, items: Sequence[Relayed]) -> None:
        if not items:
            return
        async with self._pool.connection() as conn, conn.transaction():
            now = await self._now(conn)
            async with conn.cursor() as cursor:
                await cursor.executemany(
                    "INSERT INTO cluster_relay"
                    " (kind, agent_id, detail, envelope, replica_id, created_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    [
                        (i.kind, i.agent_id, i.detail, i.envelope or None, me.replica_id, now)
                        for i in items
                    ],
                )
            await _notify(conn, self._pool.schema, RELAY_NOTE)

    async def relayed(self, me: Me, epoch: int, limit: int) -> list[Relayed]:
        async with self._pool.connection() as conn, conn.transaction():
            await self._fence(conn, me, epoch)
            rows = await fetch_rows(
                conn,
                "SELECT seq, kind, agent_id, detail, envelope FROM cluster_relay"
                " ORDER BY seq LIMIT %s",
                [limit],
            )
        return [
            Relayed(kind, agent_id, detail, bytes(envelope or b""), int(seq))
            for seq, kind, agent_id, detail, envelope in rows
        ]

    async def applied(self, me: Me, epoch: int, through: Sequence[int]) -> None:
        if not through:
            return
        async with self._pool.connection() as conn, conn.transaction():
            await self._fence(conn, me, epoch)
            await conn.execute("DELETE FROM cluster_relay WHERE seq = ANY(%s)", [list(through)])

    async def wakes(self) -> AsyncIterator[str]:
        try:
            conn = await psycopg.AsyncConnection.connect(self._pool.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"cannot listen for the leader's relay: {exc}") from exc
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(LEADER_CHANNEL)))
            async for note in conn.notifies():
                schema, _, kind = note.payload.partition("\t")
                if schema == self._pool.schema:
                    yield kind or LEADER_NOTE
        except psycopg.Error as exc:
            raise StoreError(f"listening for the leader's relay: {exc}") from exc
        finally:
            await conn.close()

    async def _fence(self, conn: Connection, me: Me, epoch: int) -> None:
        await run_transaction(conn, check_leader_term, (me.replica_id, epoch, self._leader))

    async def _read(self, conn: Connection, lock: str) -> Leadership:
        rows = await fetch_rows(conn, f"{self._row} WHERE name = %s{lock}", [LEADER])
        if not rows:
            raise StoreError("the cluster has no leader row: a replica seeds it as it joins")
        owner, epoch, expires_at, address, key = rows[0]
        lease = Lease(LEADER_PARTITION, owner, int(epoch), float(expires_at))
        return Leadership(lease, address, key, await self._now(conn))

    async def _now(self, conn: Connection) -> float:
        if self._clock is not None:
            return self._clock.now()
        rows = await fetch_rows(conn, "SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(rows[0][0])


async def _notify(conn: Connection, schema: str, kind: str = LEADER_NOTE) -> None:
    payload = schema if kind == LEADER_NOTE else f"{schema}\t{kind}"
    await conn.execute("SELECT pg_notify(%s, %s)", [LEADER_CHANNEL, payload])


async def read_leader(dsn: str) -> tuple[Lease, str, float] | None:
    """The leader's lease, its address and the database's clock in the schema `dsn` names,
    reading those columns only (never the forwarding key: an operator's account may be
    granted these alone); None when no replica of this version has run there (`apiary
    cluster status`)."""
    conninfo, schema = split_schema_parameter(dsn)
    pool = PostgresPool(conninfo, schema or DEFAULT_SCHEMA, size=1)
    try:
        async with pool.connection() as conn:
            rows = await fetch_rows(
                conn,
                "SELECT owner, epoch, expires_at, address,"
                " extract(epoch FROM clock_timestamp())::float8 FROM cluster_leader"
                " WHERE name = %s",
                [LEADER],
            )
    except StoreError as exc:
        if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
            return None
        raise
    finally:
        await pool.close()
    if not rows:
        return None
    owner, epoch, expires_at, address, now = rows[0]
    return Lease(LEADER_PARTITION, owner, int(epoch), float(expires_at)), address, float(now)
