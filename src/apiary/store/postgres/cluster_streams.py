"""Which replica's stream of an agent is its live one, in PostgreSQL
(`store.cluster.StreamHolders`; docs/cluster.md, "One stream per agent").

A claim is one transaction: the agent's row is inserted if absent (`ON CONFLICT DO
NOTHING` waits for a concurrent insert of the same agent to commit), locked `FOR UPDATE`,
its holder's liveness read from `cluster_replicas` on the database's clock, and the verdict
of `core.cluster.streams.claim_stream` written back. Two streams of one agent opening at
once on two replicas are serialized on the row: the later claim sees the earlier's holder.
A claim that supersedes another replica's stream sends that replica a note (NOTIFY on the
work channel, kind STREAM) in the same transaction, so it is delivered when the claim
commits; the note is a hint, the holder's poll of the rows (`holders`) the guarantee.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg

from apiary.core.cluster.streams import StreamClaim, StreamHolder, StreamVerdict, claim_stream
from apiary.store.cluster import STREAM, Me, WorkNote
from apiary.store.errors import StoreError
from apiary.store.postgres.cluster import qualified
from apiary.store.postgres.cluster_work import WORK_CHANNEL, note_payload, streaming
from apiary.store.postgres.pool import Connection, PostgresPool, fetch_rows
from apiary.store.postgres.rerun import rerun_when_aborted

_COLUMNS: Final = "agent_id, replica_id, incarnation, generation"


class PostgresStreamHolders:
    """`StreamHolders` on one schema's pool (module docstring): the default tenant's, or
    another tenant's, whose holders' liveness is read in the cluster's `cluster_replicas`
    (of `cluster_schema`; None: the pool's schema is the cluster's)."""

    def __init__(self, pool: PostgresPool, cluster_schema: str | None = None) -> None:
        self._pool = pool
        replicas = qualified(cluster_schema or pool.schema, "cluster_replicas")
        self._live = f"SELECT {streaming('%s', replicas)}"

    async def claim(self, me: Me, agent_id: str, take_over: bool) -> StreamClaim:
        try:
            return await rerun_when_aborted(lambda: self._claim(me, agent_id, take_over))
        except psycopg.Error as exc:
            raise StoreError(f"cannot claim the stream of {agent_id}: {exc}") from exc

    async def _claim(self, me: Me, agent_id: str, take_over: bool) -> StreamClaim:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO stream_holders (agent_id) VALUES (%s) ON CONFLICT DO NOTHING",
                [agent_id],
            )
            rows = await fetch_rows(
                conn, f"SELECT {_COLUMNS} FROM stream_holders WHERE agent_id = %s FOR UPDATE",
                [agent_id],
            )  # fmt: skip
            found = _holder(rows[0])
            live = await self._holder_live(conn, found)
            claim = claim_stream(found, me.replica_id, me.incarnation, live, take_over)
            if not claim.granted:
                return claim
            holder = claim.holder
            await conn.execute(
                "UPDATE stream_holders SET replica_id = %s, incarnation = %s, generation = %s,"
                " opened_at = extract(epoch FROM clock_timestamp())::float8"
                " WHERE agent_id = %s",
                [holder.replica_id, holder.incarnation, holder.generation, agent_id],
            )
            if claim.verdict is StreamVerdict.SUPERSEDES:
                payload = note_payload(self._pool.schema, WorkNote(STREAM, agent_id))
                await conn.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, payload])
            return claim

    async def _holder_live(self, conn: Connection, found: StreamHolder) -> bool:
        """Whether `found`'s holder beats (its heartbeat, on the database's clock, not
        expired)."""
        if not found.replica_id:
            return False
        rows = await fetch_rows(conn, self._live, [found.agent_id])
        return bool(rows and rows[0][0])

    async def release(self, me: Me, agent_id: str, generation: int) -> bool:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cursor = await conn.execute(
                    "UPDATE stream_holders SET replica_id = '', incarnation = ''"
                    " WHERE agent_id = %s AND replica_id = %s AND incarnation = %s"
                    " AND generation = %s",
                    [agent_id, me.replica_id, me.incarnation, generation],
                )
                return cursor.rowcount == 1
        except psycopg.Error as exc:
            raise StoreError(f"cannot release the stream of {agent_id}: {exc}") from exc

    async def holders(self, agent_ids: Sequence[str]) -> dict[str, StreamHolder]:
        if not agent_ids:
            return {}
        try:
            async with self._pool.connection() as conn:
                rows = await fetch_rows(
                    conn, f"SELECT {_COLUMNS} FROM stream_holders WHERE agent_id = ANY(%s)",
                    [list(agent_ids)],
                )  # fmt: skip
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the agents' stream holders: {exc}") from exc
        return {str(row[0]): _holder(row) for row in rows}


def _holder(row: tuple[Any, ...]) -> StreamHolder:
    agent_id, replica_id, incarnation, generation = row
    return StreamHolder(agent_id, replica_id, incarnation, int(generation))
