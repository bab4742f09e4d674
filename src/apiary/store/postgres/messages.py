"""The PostgreSQL message inboxes: the `messages` table, offsets counted in `inbox_offsets`.

Offsets come from the recipient's counter row, incremented by a statement that row-locks it
until the transaction ends, so a recipient's offsets are gap-free and commit in order across
replicas. Transactions that lock several rows (counters, messages) lock them in key order,
so that two of them never wait for each other in a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from apiary.core.records import MessageState, StateChange, StoredMessage, state_text
from apiary.store.errors import DuplicateMessageError, StoreError
from apiary.store.postgres.pool import Connection, PostgresPool, fetch_all, fetch_rows, scalar
from apiary.store.sql_rows import (
    MAX_SEQUENCE_SQL,
    MESSAGE_COLUMN_COUNT,
    MESSAGE_COLUMNS,
    check_limit,
    inbox_clauses,
    latest_deliveries,
    max_sequence_from_row,
    message_from_row,
    message_values,
    sequence_to_sql,
)

_COLUMN_TYPES = (
    "text",  # message_id
    "text",  # recipient
    "text",  # producer_id
    "text",  # correlation_id
    "int4",  # message_type
    "bytea",  # envelope
    "text",  # state
    "float8",  # created_at
    "float8",  # updated_at
    "text",  # error_code
    "text",  # idempotency_token
    "int8",  # sequence_number
    "text",  # lane
    "float8",  # ack_deadline
    "float8",  # expires_at
    "int8",  # deliveries
    "float8",  # last_delivered_at
    "text",  # acked_stage
    "bytea",  # signature
    "int8",  # inbox_offset
)
assert len(_COLUMN_TYPES) == MESSAGE_COLUMN_COUNT

# One statement for a whole batch: one array parameter per column.
_INSERT_MANY = (
    f"INSERT INTO messages ({MESSAGE_COLUMNS})"
    f" SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in _COLUMN_TYPES)})"
    " ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
)
_INSERT_ONE = (
    f"INSERT INTO messages ({MESSAGE_COLUMNS})"
    f" VALUES ({', '.join(['%s'] * MESSAGE_COLUMN_COUNT)})"
    " ON CONFLICT (message_id) DO NOTHING RETURNING inbox_offset"
)
# Creates missing counters and locks every counter of the batch, in recipient order (the
# no-op update is what takes the row lock); returns the last offset handed out of each.
_LOCK_COUNTERS = (
    "INSERT INTO inbox_offsets AS o (recipient, last_offset)"
    " SELECT r, 0 FROM unnest(%s::text[]) AS r ORDER BY r"
    " ON CONFLICT (recipient) DO UPDATE SET last_offset = o.last_offset"
    " RETURNING recipient, last_offset"
)
_SET_COUNTERS = (
    "UPDATE inbox_offsets AS o SET last_offset = t.n"
    " FROM unnest(%s::text[], %s::int8[]) AS t(r, n) WHERE o.recipient = t.r"
)
_APPLY = (
    "UPDATE messages SET state = %s, updated_at = %s, error_code = %s,"
    " acked_stage = COALESCE(NULLIF(%s, ''), acked_stage),"
    " ack_deadline = CASE WHEN %s THEN 0 ELSE ack_deadline END,"
    " deliveries = GREATEST(deliveries, %s), last_delivered_at = GREATEST(last_delivered_at, %s)"
    f" WHERE message_id = %s RETURNING {MESSAGE_COLUMNS}"
)
_APPLY_DISTINCT = (
    "UPDATE messages AS m SET state = t.state, updated_at = t.at, error_code = t.error_code,"
    " acked_stage = COALESCE(NULLIF(t.acked_stage, ''), m.acked_stage),"
    " ack_deadline = CASE WHEN t.clear THEN 0 ELSE m.ack_deadline END,"
    " deliveries = GREATEST(m.deliveries, t.deliveries),"
    " last_delivered_at = GREATEST(m.last_delivered_at, t.delivered_at)"
    " FROM unnest(%s::text[], %s::float8[], %s::text[], %s::text[], %s::bool[], %s::int8[],"
    " %s::float8[], %s::text[])"
    " AS t(state, at, error_code, acked_stage, clear, deliveries, delivered_at, message_id)"
    " WHERE m.message_id = t.message_id"
    f" RETURNING {', '.join(f'm.{c}' for c in MESSAGE_COLUMNS.split(', '))}"
)
_ADMIT_ATTEMPTS = 5
"""How often a batch is retried when a concurrent admission took one of its ids."""


class _AdmissionRaced(Exception):  # noqa: N818 - private control flow, never escapes
    """Another transaction admitted one of the batch's ids after the duplicate check."""


class PostgresMessageStore:
    """`MessageStore` in the `messages` table, offsets counted in `inbox_offsets`."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message with the recipient's next inbox offset."""
        values = message_values(message)
        async with self._pool.connection() as conn, conn.transaction():
            offset = await _next_offset(conn, message.recipient)
            cursor = await conn.execute(_INSERT_ONE, (*values, offset))
            if await cursor.fetchone() is None:
                # Raising inside the transaction rolls back the offset increment too.
                raise DuplicateMessageError(message.message_id)
        return dataclasses.replace(message, offset=offset)

    async def admit_many(
        self, messages: Sequence[StoredMessage]
    ) -> list[StoredMessage | DuplicateMessageError]:
        """Admit each message as `admit` does, in one transaction; a duplicate (of a stored
        message or of an earlier member) fails only its own member."""
        values = [message_values(m) for m in messages]
        first: dict[str, int] = {}
        for index, message in enumerate(messages):
            first.setdefault(message.message_id, index)
        candidates = list(first.values())  # first occurrences, in input order
        for _ in range(_ADMIT_ATTEMPTS):
            try:
                offsets = await self._admit_new(values, candidates)
            except _AdmissionRaced:
                continue
            return [
                dataclasses.replace(m, offset=offsets[i])
                if i in offsets
                else DuplicateMessageError(m.message_id)
                for i, m in enumerate(messages)
            ]
        raise StoreError(
            f"admitting {len(messages)} messages kept racing with concurrent admissions"
        )

    async def _admit_new(
        self, values: list[tuple[Any, ...]], candidates: list[int]
    ) -> dict[int, int]:
        """Insert the candidates that are not stored yet; their offsets by input index.

        The recipients' counters are locked before the duplicate check, so admissions to the
        same recipients wait for this one and cannot slip in between. An admission of one of
        these ids to another recipient still can: then a row turns out to exist after all,
        which would leave a gap in the offsets, so the whole transaction is undone and
        `_AdmissionRaced` raised, for the caller to try again.
        """
        if not candidates:
            return {}
        recipients = sorted({values[i][1] for i in candidates})
        async with self._pool.connection() as conn, conn.transaction():
            last = dict(await fetch_rows(conn, _LOCK_COUNTERS, [recipients]))
            rows = await fetch_rows(
                conn,
                "SELECT message_id FROM messages WHERE message_id = ANY(%s)",
                [[values[i][0] for i in candidates]],
            )
            stored = {row[0] for row in rows}
            offsets: dict[int, int] = {}
            for i in candidates:
                message_id, recipient = values[i][0], values[i][1]
                if message_id not in stored:
                    last[recipient] = offsets[i] = int(last[recipient]) + 1
            if not offsets:
                return {}
            new_rows = [(*values[i], offset) for i, offset in offsets.items()]
            columns = [list(column) for column in zip(*new_rows, strict=True)]
            inserted = await fetch_rows(conn, _INSERT_MANY, columns)
            if len(inserted) != len(new_rows):
                raise _AdmissionRaced
            await conn.execute(_SET_COUNTERS, [list(last), [int(n) for n in last.values()]])
        return offsets

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        query = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id = %s"
        rows = await fetch_all(self._pool, query, [message_id])
        return message_from_row(rows[0]) if rows else None

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        params = [state_text(state), float(at), error_code, "", False, 0, 0.0, message_id]
        rows = await fetch_all(self._pool, _APPLY, params)
        if not rows:
            raise LookupError(f"no message {message_id!r}")
        return message_from_row(rows[0])

    async def apply(self, changes: Sequence[StateChange]) -> list[StoredMessage]:
        """Apply state changes in order, in one transaction; an unknown id raises LookupError
        and nothing is applied."""
        if not changes:
            return []
        params = [
            (
                state_text(c.state),
                float(c.at),
                c.error_code,
                c.acked_stage,
                bool(c.clear_ack_deadline),
                int(c.deliveries),
                float(c.last_delivered_at),
                c.message_id,
            )
            for c in changes
        ]
        ids = sorted({c.message_id for c in changes})
        async with self._pool.connection() as conn, conn.transaction():
            # Lock every row first, in key order (no deadlock with another batch), which
            # also finds unknown ids before anything is changed.
            locked = await fetch_rows(
                conn,
                "SELECT message_id FROM messages WHERE message_id = ANY(%s)"
                " ORDER BY message_id FOR UPDATE",
                [ids],
            )
            if len(locked) != len(ids):
                found = {row[0] for row in locked}
                missing = next(c.message_id for c in changes if c.message_id not in found)
                raise LookupError(f"no message {missing!r}")
            if len(ids) == len(changes):
                # Distinct messages: one statement for the whole batch.
                columns = [list(column) for column in zip(*params, strict=True)]
                rows = await fetch_rows(conn, _APPLY_DISTINCT, columns)
                by_id = {row[0]: row for row in rows}
                return [message_from_row(by_id[c.message_id]) for c in changes]
            # A message changed twice: one statement per change, each returning the message
            # as that change left it (pipelined by executemany).
            applied: list[StoredMessage] = []
            async with conn.cursor() as cursor:
                await cursor.executemany(_APPLY, params, returning=True)
                async for result in cursor.results():
                    row = await result.fetchone()
                    if row is None:  # pragma: no cover - the rows are locked
                        raise LookupError("a locked message disappeared")
                    applied.append(message_from_row(row))
        return applied

    async def record(self, changes: Sequence[StateChange]) -> None:
        """Apply state changes as `apply` does, without the answer (reading the rows back
        costs little here, next to the round trip)."""
        await self.apply(changes)

    async def finish_delivered(self, message_ids: Sequence[str], at: float) -> None:
        """One more delivery, then FULFILLED at `at`, in one statement (unknown ids are
        ignored)."""
        if not message_ids:
            return
        async with self._pool.connection() as conn:
            # The CTE locks the rows in key order, as `apply` does.
            await conn.execute(
                "WITH locked AS (SELECT message_id FROM messages WHERE message_id = ANY(%s)"
                " ORDER BY message_id FOR UPDATE)"
                " UPDATE messages AS m SET deliveries = m.deliveries + 1,"
                " last_delivered_at = %s, state = %s, updated_at = %s, error_code = ''"
                " FROM locked WHERE m.message_id = locked.message_id",
                [sorted(set(message_ids)), float(at), MessageState.FULFILLED.value, float(at)],
            )

    async def record_deliveries(self, counts: Sequence[tuple[str, int, float]]) -> None:
        """Keep the larger delivery count and time of each (unknown ids are ignored), in one
        statement."""
        if not counts:
            return
        latest = latest_deliveries(counts)
        ids = sorted(latest)
        async with self._pool.connection() as conn:
            # The CTE locks the rows in key order, as `apply` does.
            await conn.execute(
                "WITH locked AS (SELECT message_id FROM messages WHERE message_id = ANY(%s)"
                " ORDER BY message_id FOR UPDATE)"
                " UPDATE messages AS m SET deliveries = GREATEST(m.deliveries, t.deliveries),"
                " last_delivered_at = GREATEST(m.last_delivered_at, t.at)"
                " FROM locked, unnest(%s::text[], %s::int8[], %s::float8[])"
                " AS t(message_id, deliveries, at)"
                " WHERE m.message_id = locked.message_id AND t.message_id = locked.message_id",
                [ids, ids, [latest[i][0] for i in ids], [latest[i][1] for i in ids]],
            )

    async def inbox(
        self,
        recipient: str,
        after_offset: int = 0,
        limit: int = 100,
        states: frozenset[MessageState] | None = None,
    ) -> list[StoredMessage]:
        """The recipient's messages with offset > after_offset (ascending), optionally
        only those in `states`."""
        check_limit(limit)
        terms = inbox_clauses(recipient, after_offset, states, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {' AND '.join(clauses)}"
            " ORDER BY inbox_offset LIMIT %s"
        )
        params.append(limit)
        return [message_from_row(row) for row in await fetch_all(self._pool, query, params)]

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        if not states:
            return 0
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM messages WHERE recipient = %s AND state = ANY(%s)",
                [recipient, sorted(s.value for s in states)],
            )
            return await scalar(cursor)

    async def due(self, now: float, limit: int = 500) -> list[StoredMessage]:
        """Unfinished messages whose ack_deadline or expires_at is set and <= now,
        ordered by the earlier of the two (then by message_id)."""
        check_limit(limit)
        # due_at: the generated column of migration 0002, with a partial index.
        query = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE due_at <= %s"
            " ORDER BY due_at, message_id LIMIT %s"
        )
        rows = await fetch_all(self._pool, query, [float(now), limit])
        return [message_from_row(row) for row in rows]

    async def next_deadline(self) -> float | None:
        """The earliest set ack_deadline/expires_at of any unfinished message, or None."""
        rows = await fetch_all(self._pool, "SELECT min(due_at) FROM messages")
        return None if rows[0][0] is None else float(rows[0][0])

    async def by_sequence(self, producer_id: str, sequence_number: int) -> StoredMessage | None:
        """The newest (by created_at, then offset, then message_id) message of `producer_id`
        with that sequence number."""
        try:
            stored_number = sequence_to_sql(sequence_number)
        except ValueError:
            return None  # no message can have it
        query = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages"
            " WHERE producer_id = %s AND sequence_number = %s"
            " ORDER BY created_at DESC, inbox_offset DESC, message_id DESC LIMIT 1"
        )
        rows = await fetch_all(self._pool, query, [producer_id, stored_number])
        return message_from_row(rows[0]) if rows else None

    async def max_sequence(self, producer_id: str) -> int:
        """The highest sequence number `producer_id` has used (0 when none)."""
        rows = await fetch_all(self._pool, MAX_SEQUENCE_SQL.format(p="%s"), [producer_id])
        return max_sequence_from_row(rows[0] if rows else None)

    async def oldest_offset(self, recipient: str) -> int:
        """The lowest offset still retained in the recipient's inbox (0 when empty)."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT COALESCE(min(inbox_offset), 0) FROM messages WHERE recipient = %s",
                [recipient],
            )
            return await scalar(cursor)

    async def purge_finished(self, before: float) -> int:
        """Delete terminal messages last updated before `before`; returns how many.

        Offsets come from `inbox_offsets`, which this leaves alone: no offset is reused.
        """
        async with self._pool.connection() as conn:
            # finished_at: the generated column of migration 0002, indexed where not NULL.
            cursor = await conn.execute(
                "DELETE FROM messages WHERE finished_at < %s", [float(before)]
            )
            return cursor.rowcount


async def _next_offset(conn: Connection, recipient: str) -> int:
    cursor = await conn.execute(
        "INSERT INTO inbox_offsets AS o (recipient, last_offset) VALUES (%s, 1)"
        " ON CONFLICT (recipient) DO UPDATE SET last_offset = o.last_offset + 1"
        " RETURNING last_offset",
        [recipient],
    )
    return await scalar(cursor)
