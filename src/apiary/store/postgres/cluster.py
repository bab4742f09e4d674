"""The cluster's leases in PostgreSQL (`store.cluster.ClusterLeases`; docs/cluster.md).

Each operation is one transaction that row-locks the leases it decides about, reads the time
once, applies `core.cluster.leases.LeaseMachine` to each locked row and writes back what the
machine returned: the rules are written once, in core, and the row locks make the decision
and the write one step, so two replicas racing for a partition are serialized on its row
and exactly one wins a term.

- Locks are taken in partition order (`ORDER BY partition ... FOR UPDATE`), so that replicas
  acquiring overlapping sets never deadlock.
- Acquisitions and releases lock `FOR UPDATE`; renewals `FOR NO KEY UPDATE`; a fenced write
  (`fenced`) locks its partition's row `FOR KEY SHARE` for the rest of its transaction. KEY
  SHARE conflicts with FOR UPDATE only: a renewal never waits for writes, but a takeover
  waits until every write fenced under the old epoch has committed or rolled back, and a
  write that starts after the takeover sees the new epoch and is refused. So every write of
  a term commits before the next term begins.
- Time is the database server's clock (`clock_timestamp()`), one clock for every replica
  whatever their hosts' clocks say; a `clock` given to the constructor replaces it (tests
  drive leases in virtual time with a FakeClock).
- A release notifies the channel `CHANNEL` (payload: the schema) so that other replicas
  may look again before their next poll; the notification is a hint, polling the guarantee.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import psycopg
from psycopg import sql

from apiary.core.clock import Clock
from apiary.core.cluster.assignment import ClusterView, Replica
from apiary.core.cluster.leases import Lease, LeaseAction, LeaseMachine
from apiary.core.cluster.partitions import check_partitions
from apiary.store.cluster import (
    Beat,
    ClusterConfigError,
    FencedError,
    LeaseOutcome,
    Me,
    ReplicaEvictedError,
    ReplicaInUseError,
)
from apiary.store.errors import StoreError
from apiary.store.postgres.pool import Connection, PostgresPool, fetch_rows
from apiary.store.postgres.store import DEFAULT_SCHEMA, split_schema_parameter

CHANNEL: Final = "apiary_cluster"
_LEASE_COLUMNS: Final = "partition, owner, epoch, expires_at"
_REPLICA_COLUMNS: Final = "replica_id, address, started_at, heartbeat_at, expires_at"


def qualified(schema: str, table: str) -> str:
    """`table` of `schema`, quoted for SQL: the cluster's tables named from a transaction on
    another tenant's schema (its connections' search_path is that schema)."""
    quoted = schema.replace('"', '""')
    return f'"{quoted}".{table}'


class PostgresClusterLeases:
    """The lease table of one schema (module docstring): the cluster's, the default
    tenant's; the other tenants' message work is fenced by it too (`fenced`'s `pool`)."""

    def __init__(self, pool: PostgresPool, clock: Clock | None = None) -> None:
        self._pool = pool
        self._clock = clock

    @property
    def schema(self) -> str:
        """The schema of the cluster's tables."""
        return self._pool.schema

    async def join(self, me: Me, partitions: int, lease_s: float) -> ClusterView:
        check_partitions(partitions)
        async with self._pool.connection() as conn, conn.transaction():
            # Replicas starting together take turns: the first seeds, the others compare.
            await conn.execute("LOCK TABLE partition_leases IN SHARE ROW EXCLUSIVE MODE")
            rows = await fetch_rows(conn, "SELECT count(*) FROM partition_leases")
            found = int(rows[0][0])
            if found == 0:
                await conn.execute(
                    "INSERT INTO partition_leases (partition) SELECT generate_series(0, %s - 1)",
                    [partitions],
                )
            elif found != partitions:
                raise ClusterConfigError(
                    f"[cluster] partitions is {partitions}, but this cluster's lease table "
                    f"({self._pool.schema}.partition_leases) has {found}: every replica must "
                    f"use the same number (set partitions = {found})",
                    "cluster.partitions",
                )
            now = await self._now(conn)
            await self._take_id(conn, me, now, lease_s)
            # A predecessor under the same id has lapsed: its leases begin new terms.
            await conn.execute(
                "UPDATE partition_leases SET owner = NULL, expires_at = LEAST(expires_at, %s)"
                " WHERE owner = %s",
                [now, me.replica_id],
            )
            return await _read_view(conn, now)

    async def _take_id(self, conn: Connection, me: Me, now: float, lease_s: float) -> None:
        rows = await fetch_rows(
            conn,
            "SELECT incarnation, address, heartbeat_at, expires_at FROM cluster_replicas"
            " WHERE replica_id = %s FOR UPDATE",
            [me.replica_id],
        )
        if rows and rows[0][0] != me.incarnation and now < rows[0][3]:
            _, address, heartbeat_at, expires_at = rows[0]
            where = f" serving {address}" if address else ""
            raise ReplicaInUseError(
                f"[cluster] replica_id {me.replica_id!r} is in use by a live replica{where} "
                f"(its heartbeat expires in {expires_at - now:.1f} s): give each replica its "
                "own replica_id",
                expires_at - now,
                heartbeat_at,
            )
        await conn.execute(
            "INSERT INTO cluster_replicas"
            " (replica_id, incarnation, address, started_at, heartbeat_at, expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (replica_id) DO UPDATE SET incarnation = excluded.incarnation,"
            " address = excluded.address, started_at = excluded.started_at,"
            " heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
            [me.replica_id, me.incarnation, me.address, now, now, now + lease_s],
        )

    async def beat(self, me: Me, lease_s: float) -> Beat:
        async with self._pool.connection() as conn, conn.transaction():
            now = await self._now(conn)
            cursor = await conn.execute(
                "UPDATE cluster_replicas SET heartbeat_at = %s, expires_at = %s"
                " WHERE replica_id = %s AND incarnation = %s",
                [now, now + lease_s, me.replica_id, me.incarnation],
            )
            if cursor.rowcount != 1:
                raise _evicted(me)
            held = await _locked(conn, "owner = %s", [me.replica_id], "FOR NO KEY UPDATE")
            renewed = await _apply(conn, held, me, LeaseAction.RENEW, now, lease_s)
            return Beat(tuple(renewed), await _read_view(conn, now))

    async def acquire(
        self, me: Me, partitions: Sequence[int], lease_s: float
    ) -> list[LeaseOutcome]:
        if not partitions:
            return []
        async with self._pool.connection() as conn, conn.transaction():
            await _check_member(conn, me)
            leases = await _locked(conn, "partition = ANY(%s)", [list(partitions)], "FOR UPDATE")
            _check_found(leases, partitions)
            now = await self._now(conn)
            return await _apply(conn, leases, me, LeaseAction.ACQUIRE, now, lease_s)

    async def release(self, me: Me, partitions: Sequence[int]) -> list[LeaseOutcome]:
        if not partitions:
            return []
        async with self._pool.connection() as conn, conn.transaction():
            await _check_member(conn, me)
            leases = await _locked(conn, "partition = ANY(%s)", [list(partitions)], "FOR UPDATE")
            _check_found(leases, partitions)
            now = await self._now(conn)
            outcomes = await _apply(conn, leases, me, LeaseAction.RELEASE, now, 1.0)
            if any(o.verdict.granted for o in outcomes):
                await _notify(conn, self._pool.schema)
            return outcomes

    async def leave(self, me: Me) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            try:
                await _check_member(conn, me)
            except ReplicaEvictedError:
                return  # a newer start holds the id: its leases are not ours to release
            leases = await _locked(conn, "owner = %s", [me.replica_id], "FOR UPDATE")
            now = await self._now(conn)
            await _apply(conn, leases, me, LeaseAction.RELEASE, now, 1.0)
            await conn.execute(
                "DELETE FROM cluster_replicas WHERE replica_id = %s AND incarnation = %s",
                [me.replica_id, me.incarnation],
            )
            await _notify(conn, self._pool.schema)

    async def view(self) -> ClusterView:
        async with self._pool.connection() as conn:
            return await _read_view(conn, await self._now(conn))

    @asynccontextmanager
    async def fenced(
        self, me: Me, partition: int, epoch: int, pool: PostgresPool | None = None
    ) -> AsyncIterator[Connection]:
        """A transaction whose writes commit only under `me`'s term `epoch` of `partition`.

        The lease row is locked FOR KEY SHARE until the transaction ends (module docstring);
        FencedError, before anything is written, when the lease is another term or not
        `me`'s. The block's statements run on the yielded connection, of `pool` (another
        tenant's schema; None: this one's); leaving the block commits them, an exception
        rolls them back.
        """
        table = qualified(self._pool.schema, "partition_leases")
        async with (pool or self._pool).connection() as conn, conn.transaction():
            leases = await _locked(conn, "partition = %s", [partition], "FOR KEY SHARE", table)
            _check_found(leases, [partition])
            found = leases[0]
            if found.owner != me.replica_id or found.epoch != epoch:
                raise FencedError(partition, epoch, found)
            yield conn

    async def releases(self) -> AsyncIterator[None]:
        """Yield each time a replica of this schema releases leases: LISTEN on `CHANNEL`, on
        a connection of its own. A hint only: a notification sent while this connection was
        not listening is lost. StoreError when the server cannot be reached."""
        try:
            conn = await psycopg.AsyncConnection.connect(self._pool.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"cannot listen for lease releases: {exc}") from exc
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            async for note in conn.notifies():
                if note.payload == self._pool.schema:
                    yield
        except psycopg.Error as exc:
            raise StoreError(f"listening for lease releases: {exc}") from exc
        finally:
            await conn.close()

    async def _now(self, conn: Connection) -> float:
        if self._clock is not None:
            return self._clock.now()
        rows = await fetch_rows(conn, "SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(rows[0][0])


async def _check_member(conn: Connection, me: Me) -> None:
    """ReplicaEvictedError unless `me` is the incarnation the table knows under its id; the
    row is locked FOR SHARE so that a newer start cannot replace it mid-transaction."""
    rows = await fetch_rows(
        conn,
        "SELECT 1 FROM cluster_replicas WHERE replica_id = %s AND incarnation = %s FOR SHARE",
        [me.replica_id, me.incarnation],
    )
    if not rows:
        raise _evicted(me)


def _evicted(me: Me) -> ReplicaEvictedError:
    return ReplicaEvictedError(
        f"replica {me.replica_id!r} (incarnation {me.incarnation}) is no longer in the "
        "cluster's table: another start of the same replica_id replaced it"
    )


async def _locked(
    conn: Connection, where: str, params: list[object], lock: str,
    table: str = "partition_leases",
) -> list[Lease]:  # fmt: skip
    rows = await fetch_rows(
        conn, f"SELECT {_LEASE_COLUMNS} FROM {table} WHERE {where} ORDER BY partition {lock}",
        params,
    )  # fmt: skip
    return [Lease(int(p), owner, int(epoch), float(exp)) for p, owner, epoch, exp in rows]


def _check_found(leases: Sequence[Lease], partitions: Sequence[int]) -> None:
    missing = sorted(set(partitions) - {lease.partition for lease in leases})
    if missing:
        raise ValueError(f"no such partition(s) in the lease table: {missing}")


async def _apply(
    conn: Connection,
    leases: Sequence[Lease],
    me: Me,
    action: LeaseAction,
    now: float,
    lease_s: float,
) -> list[LeaseOutcome]:
    """The machine's step for each of `leases` (locked by the caller), the changed ones
    written back in one statement."""
    steps = [LeaseMachine.step(lease, me.replica_id, action, now, lease_s) for lease in leases]
    changed = [s for s in steps if s.verdict.granted]
    if changed:
        await conn.execute(
            "UPDATE partition_leases AS l SET owner = v.owner, epoch = v.epoch,"
            " expires_at = v.expires_at,"
            " acquired_at = CASE WHEN v.epoch <> l.epoch THEN %s ELSE l.acquired_at END"
            " FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::float8[])"
            " AS v(partition, owner, epoch, expires_at) WHERE l.partition = v.partition",
            [
                now,
                [s.lease.partition for s in changed],
                [s.lease.owner for s in changed],
                [s.lease.epoch for s in changed],
                [s.lease.expires_at for s in changed],
            ],
        )
    return [LeaseOutcome(s.lease, s.verdict) for s in steps]


async def _read_view(conn: Connection, now: float) -> ClusterView:
    replicas = await fetch_rows(
        conn, f"SELECT {_REPLICA_COLUMNS} FROM cluster_replicas ORDER BY replica_id"
    )
    leases = await fetch_rows(conn, f"SELECT {_LEASE_COLUMNS} FROM partition_leases ORDER BY 1")
    return ClusterView(
        now,
        tuple(Replica(r, a, float(s), float(h), float(e)) for r, a, s, h, e in replicas),
        tuple(Lease(int(p), o, int(ep), float(x)) for p, o, ep, x in leases),
    )


async def _notify(conn: Connection, schema: str) -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, schema])


async def read_cluster(dsn: str) -> ClusterView:
    """The cluster as it stands in the schema `dsn` names (`apiary_schema`, default
    `apiary`), on the database's clock, reading only: nothing is created or migrated
    (`apiary cluster status`). StoreError when the server cannot be reached or no replica
    has ever joined a cluster there."""
    conninfo, schema = split_schema_parameter(dsn)
    pool = PostgresPool(conninfo, schema or DEFAULT_SCHEMA, size=1)
    try:
        return await PostgresClusterLeases(pool).view()
    except StoreError as exc:
        if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
            raise StoreError(
                f"no cluster has run on the PostgreSQL schema {pool.schema}: it has no lease "
                "table (a replica in cluster mode creates it)"
            ) from None
        raise
    finally:
        await pool.close()
