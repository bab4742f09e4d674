"""The SQLite message inboxes: the `messages` table, offsets counted in `inbox_offsets`.

Every write is one job of the group-committing writer (`sqlite_writer`), however many
messages it touches: a batch of admissions or state changes is one transaction, and the
single writer makes check-then-write sequences race-free. Rows are encoded on the caller's
side, so the writer thread, which holds up every commit, does as little Python work as
possible.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from apiary.core.records import MessageState, StateChange, StoredMessage, at_offset, state_text
from apiary.store.errors import DuplicateMessageError
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
from apiary.store.sqlite.bulk import chunks, insert_rows, markers, values_rows
from apiary.store.sqlite.database import SqliteDatabase, placeholders

_INSERT = f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES"
_UPDATE = (
    "UPDATE messages SET state = ?, updated_at = ?, error_code = ?,"
    " acked_stage = COALESCE(NULLIF(?, ''), acked_stage),"
    " ack_deadline = CASE WHEN ? THEN 0 ELSE ack_deadline END,"
    " deliveries = MAX(deliveries, ?), last_delivered_at = MAX(last_delivered_at, ?)"
    " WHERE message_id = ?"
)
_UPDATE_RETURNING = f"{_UPDATE} RETURNING {MESSAGE_COLUMNS}"
_UPDATE_WIDTH = 8
_BULK_UPDATE = (
    "WITH c(new_state, new_at, new_code, new_stage, new_clear, new_deliveries, new_delivered_at,"
    " new_id) AS (VALUES {rows})"
    " UPDATE messages SET state = c.new_state, updated_at = c.new_at, error_code = c.new_code,"
    " acked_stage = COALESCE(NULLIF(c.new_stage, ''), messages.acked_stage),"
    " ack_deadline = CASE WHEN c.new_clear THEN 0 ELSE messages.ack_deadline END,"
    " deliveries = MAX(messages.deliveries, c.new_deliveries),"
    " last_delivered_at = MAX(messages.last_delivered_at, c.new_delivered_at)"
    f" FROM c WHERE messages.message_id = c.new_id RETURNING {MESSAGE_COLUMNS}"
)
"""`_UPDATE` for many distinct messages in one statement, each row's values in `_UPDATE`'s
parameter order; the changed rows come back (in no particular order)."""
_BULK_RECORD = _BULK_UPDATE[: _BULK_UPDATE.index(" RETURNING")]
"""`_BULK_UPDATE` without reading the rows back (their count tells unknown ids)."""
_FINISH_DELIVERED = (
    "UPDATE messages SET deliveries = deliveries + 1, last_delivered_at = ?1,"
    f" state = '{MessageState.FULFILLED.value}', updated_at = ?1, error_code = ''"
    " WHERE message_id IN ({ids})"
)
_DELIVERIES_WIDTH = 3
_RECORD_DELIVERIES = (
    "WITH c(new_deliveries, new_delivered_at, new_id) AS (VALUES {rows})"
    " UPDATE messages SET deliveries = MAX(messages.deliveries, c.new_deliveries),"
    " last_delivered_at = MAX(messages.last_delivered_at, c.new_delivered_at)"
    " FROM c WHERE messages.message_id = c.new_id"
)
_ID_CHUNK = 500
"""Message ids per `IN (...)` lookup, well under SQLite's limit on parameters."""


class SqliteMessageStore:
    """`MessageStore` in the `messages` table, offsets counted in `inbox_offsets`."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message with the recipient's next inbox offset."""
        (outcome,) = await self.admit_many([message])
        if isinstance(outcome, DuplicateMessageError):
            raise outcome
        return outcome

    async def admit_many(
        self, messages: Sequence[StoredMessage]
    ) -> list[StoredMessage | DuplicateMessageError]:
        """Admit each message as `admit` does, all in one writer job (one transaction); a
        duplicate (of a stored message or of an earlier member) fails only its own member."""
        if not messages:
            return []
        values = [message_values(m) for m in messages]
        offsets = await self._db.call(_insert_new, values)
        return [
            at_offset(m, o) if o else DuplicateMessageError(m.message_id)
            for m, o in zip(messages, offsets, strict=True)
        ]

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        sql = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (message_id,)).fetchone())
        return None if row is None else message_from_row(row)

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        (changed,) = await self.apply([StateChange(message_id, state, at, error_code)])
        return changed

    async def apply(self, changes: Sequence[StateChange]) -> list[StoredMessage]:
        """Apply state changes in order, in one writer job; an unknown id raises LookupError
        and the job's savepoint undoes the changes already made."""
        if not changes:
            return []
        params = _change_params(changes)
        ids = [c.message_id for c in changes]
        if len(set(ids)) == len(ids):
            rows = await self._db.call(_apply_unique, params, ids)
        else:
            rows = await self._db.call(_apply_in_turn, params)
        return [message_from_row(row) for row in rows]

    async def record(self, changes: Sequence[StateChange]) -> None:
        """Apply state changes as `apply` does, without reading the messages back: about a
        third of the statement's cost, and no rows to decode on the event loop."""
        if not changes:
            return
        params = _change_params(changes)
        ids = [c.message_id for c in changes]
        if len(set(ids)) == len(ids):
            await self._db.call(_record_unique, params, ids)
        else:
            await self._db.call(_apply_in_turn, params)

    async def finish_delivered(self, message_ids: Sequence[str], at: float) -> None:
        """One more delivery, then FULFILLED at `at`, in one statement per chunk: one row
        update per notice instead of two (unknown ids are ignored; an id given twice counts
        once)."""
        await self._update_each(_FINISH_DELIVERED, message_ids, at)

    async def record_deliveries(self, counts: Sequence[tuple[str, int, float]]) -> None:
        """Keep the larger delivery count and time of each (unknown ids are ignored), a chunk
        of messages per statement."""
        if not counts:
            return
        params = [(n, at, message_id) for message_id, (n, at) in latest_deliveries(counts).items()]
        await self._db.call(_record_deliveries, params)

    async def _update_each(self, sql: str, message_ids: Sequence[str], at: float) -> None:
        """Run `sql` (parameters: `at`, then the ids) over each message once, one write."""
        if not message_ids:
            return
        unique = list(dict.fromkeys(message_ids))
        await self._db.call(_update_chunks, sql, unique, float(at))

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
        terms = inbox_clauses(recipient, after_offset, states, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {' AND '.join(clauses)}"
            " ORDER BY inbox_offset LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [message_from_row(row) for row in rows]

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        if not states:
            return 0
        sql = (
            "SELECT COUNT(*) FROM messages WHERE recipient = ?"
            f" AND state IN ({placeholders(len(states))})"
        )
        return await self._scalar(sql, [recipient, *sorted(s.value for s in states)])

    async def due(self, now: float, limit: int = 500) -> list[StoredMessage]:
        """Unfinished messages whose ack_deadline or expires_at is set and <= now,
        ordered by the earlier of the two (then by message_id)."""
        check_limit(limit)
        # `due_at` is the generated column of migration 0002; the comparison lets SQLite use
        # the partial index messages_due (it implies due_at IS NOT NULL).
        sql = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE due_at <= ?"
            " ORDER BY due_at, message_id LIMIT ?"
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, (now, limit)).fetchall())
        return [message_from_row(row) for row in rows]

    async def next_deadline(self) -> float | None:
        """The earliest set ack_deadline/expires_at of any unfinished message, or None."""
        # Not MIN(due_at): its WHERE-less form would not use the partial index.
        sql = "SELECT due_at FROM messages WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
        row = await self._db.read(lambda conn: conn.execute(sql).fetchone())
        return None if row is None else float(row[0])

    async def by_sequence(self, producer_id: str, sequence_number: int) -> StoredMessage | None:
        """The newest (by created_at, then offset, then message_id) message of `producer_id`
        with that sequence number."""
        try:
            stored_number = sequence_to_sql(sequence_number)
        except ValueError:
            return None  # no message can have it
        sql = (
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE producer_id = ?"
            " AND sequence_number = ?"
            " ORDER BY created_at DESC, inbox_offset DESC, message_id DESC LIMIT 1"
        )
        params = (producer_id, stored_number)
        row = await self._db.read(lambda conn: conn.execute(sql, params).fetchone())
        return None if row is None else message_from_row(row)

    async def max_sequence(self, producer_id: str) -> int:
        """The highest sequence number `producer_id` has used (0 when none)."""
        sql = MAX_SEQUENCE_SQL.format(p="?")
        row = await self._db.read(lambda conn: conn.execute(sql, (producer_id,)).fetchone())
        return max_sequence_from_row(row)

    async def oldest_offset(self, recipient: str) -> int:
        """The lowest offset still retained in the recipient's inbox (0 when empty)."""
        sql = "SELECT COALESCE(MIN(inbox_offset), 0) FROM messages WHERE recipient = ?"
        return await self._scalar(sql, [recipient])

    async def purge_finished(self, before: float) -> int:
        """Delete terminal messages last updated before `before`; returns how many.

        Offsets come from `inbox_offsets`, which this leaves alone: no offset is reused.
        """
        # finished_at: the generated column of migration 0002, indexed where not NULL.
        sql = "DELETE FROM messages WHERE finished_at < ?"
        return await self._db.execute(sql, (before,))

    async def _scalar(self, sql: str, params: Sequence[Any]) -> int:
        def query(conn: sqlite3.Connection) -> int:
            (value,) = conn.execute(sql, params).fetchone()
            return int(value)

        return await self._db.read(query)


def _record_deliveries(conn: sqlite3.Connection, params: list[tuple[Any, ...]]) -> None:
    for count, flat in chunks(conn, params, _DELIVERIES_WIDTH):
        conn.execute(_RECORD_DELIVERIES.format(rows=values_rows(count, _DELIVERIES_WIDTH)), flat)


def _update_chunks(conn: sqlite3.Connection, sql: str, unique: list[str], at: float) -> None:
    for start in range(0, len(unique), _ID_CHUNK):
        chunk = unique[start : start + _ID_CHUNK]
        conn.execute(sql.format(ids=markers(len(chunk))), [at, *chunk])


def _insert_new(conn: sqlite3.Connection, values: list[tuple[Any, ...]]) -> list[int]:
    """Insert the members that are new; their offsets in input order, 0 for duplicates.

    Duplicates are found before anything is written, so a duplicate never has a write to
    undo and never consumes an offset; the rest go in with one executemany.
    """
    taken = _existing_ids(conn, [v[0] for v in values])
    last: dict[str, int] = {}
    rows: list[tuple[Any, ...]] = []
    offsets: list[int] = []
    for value in values:
        message_id, recipient = value[0], value[1]
        if message_id in taken:
            offsets.append(0)
            continue
        taken.add(message_id)
        offset = last.get(recipient)
        if offset is None:
            offset = _last_offset(conn, recipient)
        last[recipient] = offset = offset + 1
        offsets.append(offset)
        rows.append((*value, offset))
    insert_rows(conn, _INSERT, rows, MESSAGE_COLUMN_COUNT)
    conn.executemany(
        "INSERT OR REPLACE INTO inbox_offsets (recipient, last_offset) VALUES (?, ?)",
        last.items(),
    )
    return offsets


def _apply_unique(
    conn: sqlite3.Connection, params: list[tuple[Any, ...]], ids: list[str]
) -> list[tuple[Any, ...]]:
    """Apply changes to distinct messages, a chunk per statement, the rows coming back."""
    rows: dict[str, tuple[Any, ...]] = {}
    for count, flat in chunks(conn, params, _UPDATE_WIDTH):
        sql = _BULK_UPDATE.format(rows=values_rows(count, _UPDATE_WIDTH))
        rows.update((row[0], tuple(row)) for row in conn.execute(sql, flat).fetchall())
    if len(rows) != len(ids):
        missing = next(i for i in ids if i not in rows)
        raise LookupError(f"no message {missing!r}")  # the job's savepoint undoes the rest
    return [rows[i] for i in ids]


def _change_params(changes: Sequence[StateChange]) -> list[tuple[Any, ...]]:
    """Each change's values in `_UPDATE`'s parameter order."""
    return [
        (
            state_text(c.state),
            float(c.at),
            c.error_code,
            c.acked_stage,
            int(c.clear_ack_deadline),
            int(c.deliveries),
            float(c.last_delivered_at),
            c.message_id,
        )
        for c in changes
    ]


def _record_unique(conn: sqlite3.Connection, params: list[tuple[Any, ...]], ids: list[str]) -> None:
    """`_apply_unique` without the rows: a chunk per statement, its row count checked."""
    for count, flat in chunks(conn, params, _UPDATE_WIDTH):
        sql = _BULK_RECORD.format(rows=values_rows(count, _UPDATE_WIDTH))
        # Not the cursor's rowcount: sqlite3 reports none for a statement led by WITH.
        before = conn.total_changes
        conn.execute(sql, flat)
        if conn.total_changes - before != count:
            known = _existing_ids(conn, ids)
            missing = next(i for i in ids if i not in known)
            raise LookupError(f"no message {missing!r}")  # the job's savepoint undoes the rest


def _apply_in_turn(
    conn: sqlite3.Connection, params: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Apply changes one by one: a message changed twice is returned as each change left it."""
    rows: list[tuple[Any, ...]] = []
    for row_params in params:
        # fetchall: the statement must run to completion before the next one.
        found = conn.execute(_UPDATE_RETURNING, row_params).fetchall()
        if not found:
            raise LookupError(f"no message {row_params[-1]!r}")
        rows.append(tuple(found[0]))
    return rows


def _existing_ids(conn: sqlite3.Connection, message_ids: list[str]) -> set[str]:
    unique = list(dict.fromkeys(message_ids))
    found: set[str] = set()
    for start in range(0, len(unique), _ID_CHUNK):
        chunk = unique[start : start + _ID_CHUNK]
        sql = f"SELECT message_id FROM messages WHERE message_id IN ({placeholders(len(chunk))})"
        found.update(row[0] for row in conn.execute(sql, chunk))
    return found


def _last_offset(conn: sqlite3.Connection, recipient: str) -> int:
    row = conn.execute(
        "SELECT last_offset FROM inbox_offsets WHERE recipient = ?", (recipient,)
    ).fetchone()
    return 0 if row is None else int(row[0])
