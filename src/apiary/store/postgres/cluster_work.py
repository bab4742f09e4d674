"""Message work handed between replicas through PostgreSQL (`store.cluster.ClusterWork`;
docs/cluster.md, "The message path").

- Wake-ups are NOTIFY on the channel `WORK_CHANNEL`, payload JSON naming the schema, the
  note's kind and its agent; a listener keeps the notes of its own schema. A hint: one sent
  while a replica was not listening is lost, and every replica polls the store anyway.
- ACK deadlines are the `ack_deadline` column of `messages` (its generated `due_at` indexes
  them with the TTLs): the replica that hands a message out stores it, the partition's
  owner fires it. Their writes lock the rows in key order first, as the store's other
  writers of several messages do (`store.sql.messages`), so they wait for an ACK to the
  same messages instead of deadlocking with it.
- The owner's claim on a due deadline runs in a transaction fenced by its lease's epoch
  (`PostgresClusterLeases.fenced`) that locks the message's row: of two replicas that both
  believe they own the partition, only the current term's claims, and of two claims of one
  deadline only the first finds it due.
- Both writes are run again whole when PostgreSQL aborts them for a deadlock or a
  serialization failure (`rerun`): each is one transaction that did nothing when aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Final

import psycopg
from psycopg import sql

from apiary.core.admission_bounds import NOTICE_PRODUCER, NOTICE_TYPES
from apiary.core.records import MessageState, StoredMessage
from apiary.store.cluster import NOTE_KINDS, Me, WorkNote
from apiary.store.errors import StoreError
from apiary.store.postgres.cluster import PostgresClusterLeases, qualified
from apiary.store.postgres.pool import PostgresPool, fetch_rows
from apiary.store.postgres.rerun import rerun_when_aborted
from apiary.store.sql.message_rows import MESSAGES, message_from_row

WORK_CHANNEL: Final = "apiary_cluster_work"
_AWAITING_FIRST_ACK: Final = [MessageState.RECEIVED.value, MessageState.RETRYING.value]
_LOCK_IN_KEY_ORDER: Final = (
    "SELECT message_id FROM messages WHERE message_id = ANY(%s::text[])"
    " ORDER BY message_id FOR UPDATE"
)
_SET_ACK_DEADLINES: Final = (
    "UPDATE messages SET ack_deadline = c.due"
    " FROM (SELECT unnest(%s::text[]) AS id, unnest(%s::float8[]) AS due) AS c"
    " WHERE messages.message_id = c.id AND (c.due = 0"
    " OR (messages.acked_stage = '' AND messages.state = ANY(%s::text[])))"
)
_DUE_ROW: Final = (
    f"SELECT {MESSAGES.sql} FROM messages WHERE message_id = %s AND due_at <= %s FOR UPDATE"
)


def streaming(agent: str, replicas: str) -> str:
    """SQL true when the agent (an SQL expression) has a live stream on some replica: its
    holder row (`cluster_streams`, in its tenant's schema) names a replica, that start of
    it, whose heartbeat in `replicas` (the cluster's `cluster_replicas`, qualified) has not
    expired."""
    return (
        f"EXISTS (SELECT 1 FROM stream_holders h JOIN {replicas} r"
        " ON r.replica_id = h.replica_id AND r.incarnation = h.incarnation"
        f" WHERE h.agent_id = {agent} AND r.expires_at > extract(epoch FROM clock_timestamp()))"
    )


def _aged(replicas: str) -> str:
    """SQL true for a message past the maximum age (`core.admission_bounds` tells notices):
    admitted at `born` or before, awaiting its first ACK, held by no stream (no ACK deadline
    stored) and its recipient streaming on no replica."""
    return (
        "acked_stage = '' AND state IN ('RECEIVED', 'RETRYING') AND ack_deadline = 0"
        " AND created_at <= %(born)s AND producer_id <> %(notices)s"
        " AND message_type <> ALL(%(notice_types)s)"
        f" AND NOT {streaming('messages.recipient', replicas)}"
    )


_MOVE_DUE: Final = (
    "UPDATE messages SET"
    " ack_deadline = CASE WHEN ack_deadline > 0 AND ack_deadline <= %(now)s"
    " THEN %(retry)s ELSE ack_deadline END,"
    " expires_at = CASE WHEN expires_at > 0 AND expires_at <= %(now)s"
    " THEN %(retry)s ELSE expires_at END"
    " WHERE message_id = %(id)s"
)


class PostgresClusterWork:
    """`ClusterWork` on one schema's pool (module docstring): the default tenant's, or
    another tenant's, fenced by the cluster's `leases` either way."""

    def __init__(self, pool: PostgresPool, leases: PostgresClusterLeases) -> None:
        self._pool = pool
        self._leases = leases
        aged = _aged(qualified(leases.schema, "cluster_replicas"))
        self._aged_page = (
            f"SELECT {MESSAGES.sql} FROM messages WHERE {aged}"
            " ORDER BY created_at, message_id LIMIT %(limit)s"
        )
        self._aged_row = (
            f"SELECT {MESSAGES.sql} FROM messages WHERE message_id = %(id)s AND {aged} FOR UPDATE"
        )

    async def notify(self, notes: Sequence[WorkNote]) -> None:
        if not notes:
            return
        schema = self._pool.schema
        payloads = [(WORK_CHANNEL, note_payload(schema, n)) for n in notes]
        try:
            async with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor() as cursor,
            ):
                await cursor.executemany("SELECT pg_notify(%s, %s)", payloads)
        except psycopg.Error as exc:
            raise StoreError(f"cannot notify the other replicas: {exc}") from exc

    async def notes(self) -> AsyncIterator[WorkNote]:
        try:
            conn = await psycopg.AsyncConnection.connect(self._pool.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"cannot listen for the other replicas' notes: {exc}") from exc
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(WORK_CHANNEL)))
            async for raw in conn.notifies():
                note = _parsed(raw.payload, self._pool.schema)
                if note is not None:
                    yield note
        except psycopg.Error as exc:
            raise StoreError(f"listening for the other replicas' notes: {exc}") from exc
        finally:
            await conn.close()

    async def set_ack_deadlines(self, deadlines: Sequence[tuple[str, float]]) -> None:
        if not deadlines:
            return
        ids = [message_id for message_id, _ in deadlines]
        dues = [float(due) for _, due in deadlines]
        try:
            await rerun_when_aborted(lambda: self._set_ack_deadlines(ids, dues))
        except psycopg.Error as exc:
            raise StoreError(f"cannot store ACK deadlines: {exc}") from exc

    async def _set_ack_deadlines(self, ids: list[str], dues: list[float]) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            # The rows locked first, in key order, as the store's other writers lock them
            # (`store.sql.messages`): the UPDATE alone locks them in whatever order its plan
            # meets them, and deadlocked with ACKs to the same messages.
            await conn.execute(_LOCK_IN_KEY_ORDER, [sorted(set(ids))])
            await conn.execute(_SET_ACK_DEADLINES, [ids, dues, _AWAITING_FIRST_ACK])

    async def aged(self, born_before: float, limit: int) -> list[StoredMessage]:
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    self._aged_page, {**_aged_params(born_before), "limit": limit}
                )
                rows = await cursor.fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read the messages past the maximum age: {exc}") from exc
        return [message_from_row(row) for row in rows]

    async def claim_aged(
        self, me: Me, partition: int, epoch: int, message_id: str, born_before: float
    ) -> StoredMessage | None:
        try:
            return await rerun_when_aborted(
                lambda: self._claim_aged(me, partition, epoch, message_id, born_before)
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot claim the maximum age of {message_id}: {exc}") from exc

    async def _claim_aged(
        self, me: Me, partition: int, epoch: int, message_id: str, born_before: float
    ) -> StoredMessage | None:
        async with self._leases.fenced(me, partition, epoch, self._pool) as conn:
            params = {**_aged_params(born_before), "id": message_id}
            rows = await (await conn.execute(self._aged_row, params)).fetchall()
            return message_from_row(rows[0]) if rows else None

    async def claim_due(
        self, me: Me, partition: int, epoch: int, message_id: str, now: float, retry_at: float
    ) -> StoredMessage | None:
        try:
            return await rerun_when_aborted(
                lambda: self._claim_due(me, partition, epoch, message_id, now, retry_at)
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot claim the deadline of {message_id}: {exc}") from exc

    async def _claim_due(
        self, me: Me, partition: int, epoch: int, message_id: str, now: float, retry_at: float
    ) -> StoredMessage | None:
        async with self._leases.fenced(me, partition, epoch, self._pool) as conn:
            rows = await fetch_rows(conn, _DUE_ROW, [message_id, now])
            if not rows:
                return None
            await conn.execute(_MOVE_DUE, {"now": now, "retry": retry_at, "id": message_id})
            return message_from_row(rows[0])


def _aged_params(born_before: float) -> dict[str, object]:
    return {
        "born": born_before, "notices": NOTICE_PRODUCER, "notice_types": list(NOTICE_TYPES),
    }  # fmt: skip


def note_payload(schema: str, note: WorkNote) -> str:
    """The NOTIFY payload of `note` for the replicas of `schema`."""
    return json.dumps({"s": schema, "k": note.kind, "a": note.agent_id})


def _parsed(payload: str, schema: str) -> WorkNote | None:
    """The note `payload` carries when it is one of `schema`'s, else None."""
    try:
        doc = json.loads(payload)
        if doc["s"] != schema or doc["k"] not in NOTE_KINDS:
            return None
        return WorkNote(str(doc["k"]), str(doc["a"]))
    except (ValueError, KeyError, TypeError):
        return None
