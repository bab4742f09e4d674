"""The message inboxes: the `messages` table, each recipient's offsets counted in its
`inbox_offsets` row.

Admissions and state changes are the router's hot path (a group commit per frame in
SQLite): a batch is one transaction of a few multi-row statements (`bulk`), its rows
encoded on the caller's side, so that the SQLite writer, which holds up every commit, does
as little Python work as possible. A recipient's counter row is written in the admitting
transaction, so offsets are gap-free and commit in order: in SQLite because its one writer
runs one transaction at a time, in PostgreSQL because the counter stays row-locked until
the transaction ends. There, transactions that lock several rows (counters, messages) lock
them in key order (`Dialect.lock_rows`), so that two of them never wait for each other in a
cycle; SQLite needs no lock.

bench/store_rows.py replays these transactions as the router writes them (SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any, Final, NamedTuple

from apiary.core.dedup import advance
from apiary.core.events import EventDraft
from apiary.core.records import (
    AdmissionWrites,
    IdempotencyRecord,
    MessageState,
    StateChange,
    StoredMessage,
    TaskRecord,
    TokenProgress,
    at_offset,
    state_text,
)
from apiary.store.errors import (
    AdmissionRefusal,
    BoundExceededError,
    DuplicateMessageError,
    RequeuedError,
    StaleStateError,
    StoreError,
    TaskExistsError,
    TokenTakenError,
)
from apiary.store.sql.admission import (
    AdmissionRacedError,
    admission_extras,
    admit_new,
    admit_with,
    admitted_events,
)
from apiary.store.sql.bounds import Refusals
from apiary.store.sql.bulk import chunks, markers, rows_per_statement, values_rows
from apiary.store.sql.checks import check_limit, sequence_from_sql, sequence_to_sql
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.events import SqlEventLog, event_rows
from apiary.store.sql.idempotency import (
    IDEMPOTENCY,
    PUT_IDEMPOTENCY,
    TokenRacedError,
    idempotency_from_row,
    idempotency_row,
)
from apiary.store.sql.message_rows import (
    ID_CHUNK,
    MESSAGES,
    existing_ids,
    message_from_row,
    message_values,
)
from apiary.store.sql.purge import chunk_delete_sql, purge_in_chunks
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Row, Transaction
from apiary.store.sql.tasks import put_tasks_and_append, task_row
from apiary.store.sql.where import Where


class ChangeParams(NamedTuple):
    """The parameters of one state change, in the order of `_UPDATE`'s markers."""

    state: str
    at: float
    error_code: str
    acked_stage: str
    clear_ack_deadline: bool
    deliveries: int
    last_delivered_at: float
    expected: str
    message_id: str


_ADMIT_ATTEMPTS: Final = 5
"""How often a batch is retried when a concurrent admission took one of its ids."""
_OPTIMISTIC: Final = frozenset({"postgresql"})
"""The dialects whose admissions first try without looking for stored duplicates
(`admit_new`'s `optimistic`): a look is a round trip to PostgreSQL, and a message_id
stored already is rare (most ids are the coordinator's own, and a client's retry is mostly
answered by its token or sequence number first, engine/router/dedup_gate.py); it costs one
undone try. Not SQLite, where the look costs no round trip and a failed job makes the
writer run its batch again."""


def change_params(changes: Sequence[StateChange]) -> list[tuple[Any, ...]]:
    """Each change's `ChangeParams` (as plain tuples: built on the hot path)."""
    return [
        (
            state_text(c.state),
            float(c.at),
            c.error_code,
            c.acked_stage,
            bool(c.clear_ack_deadline),
            int(c.deliveries),
            float(c.last_delivered_at),
            c.expected,
            c.message_id,
        )
        for c in changes
    ]


def latest_deliveries(counts: Sequence[tuple[str, int, float]]) -> dict[str, tuple[int, float]]:
    """By message id, the larger count and the later time of `counts` (an id may repeat)."""
    latest: dict[str, tuple[int, float]] = {}
    for message_id, n, at in counts:
        seen = latest.get(message_id)
        latest[message_id] = (
            (int(n), float(at)) if seen is None else (max(seen[0], int(n)), max(seen[1], at))
        )
    return latest


class SqlMessageStore:
    """`MessageStore` in the `messages` table, offsets counted in `inbox_offsets`; events
    that commit with a change go through `log`. A write that carries task records (a
    dispatch's admission, an ACK's task transition) goes through `leader`, the database of
    the cluster leader's writes (`leader_writes`: fenced by its term in cluster mode)."""

    def __init__(
        self, database: SqlDatabase, log: SqlEventLog, leader: SqlDatabase | None = None
    ) -> None:
        self._db = database
        self._log = log
        self._leader = database if leader is None else leader

    async def admit(self, message: StoredMessage) -> StoredMessage:
        """Durably record a new message with the recipient's next inbox offset."""
        (outcome,) = await self.admit_many([message])
        if not isinstance(outcome, StoredMessage):  # (no token is written: never taken)
            raise outcome
        return outcome

    async def admit_many(
        self,
        messages: Sequence[StoredMessage],
        writes: Sequence[AdmissionWrites] = (),
        events: Sequence[EventDraft] = (),
    ) -> list[StoredMessage | AdmissionRefusal]:
        """Admit each message as `admit` does, in one transaction; a duplicate (of a stored
        message or of an earlier member), or a member whose token another admission took
        (`claim_tokens`) or whose dead letter another requeue marked, fails only its own
        member. `writes` (one per
        message, or none) commit in the same transaction for the members admitted, after
        `events`, which are appended in any case."""
        if not messages:
            await self._log.append(events)
            return []
        values = [message_values(m) for m in messages]
        d = self._db.dialect
        lead = event_rows(d, events) if events else []
        extras = admission_extras(d, messages, writes) if writes or lead else None
        taken: dict[int, IdempotencyRecord] = {}
        requeued: set[int] = set()
        bounded: Refusals = {}
        existing: set[int] = set()
        db = self._leader if any(w.task is not None for w in writes) else self._db
        for attempt in range(_ADMIT_ATTEMPTS):
            # The first try leaves the look for stored duplicates to the insert where that
            # saves a round trip; a duplicate met so is looked for on the next (`admit_new`).
            optimistic = attempt == 0 and d.name in _OPTIMISTIC
            try:
                if extras is None:
                    offsets = await self._db.write(admit_new, values, None, optimistic)
                else:
                    offsets, first, taken, requeued, bounded, existing = await db.write(
                        admit_with, values, lead, extras, optimistic
                    )
                    self._log.committed(first, [*events, *admitted_events(writes, offsets)])
            except (AdmissionRacedError, TokenRacedError):
                continue
            return [
                at_offset(m, o) if o else
                TokenTakenError(m.message_id, taken[i]) if i in taken else
                RequeuedError(m.message_id, writes[i].requeues) if i in requeued else
                BoundExceededError(m.message_id, *bounded[i]) if i in bounded else
                TaskExistsError(_new_task_id(writes[i])) if i in existing else
                DuplicateMessageError(m.message_id)
                for i, (m, o) in enumerate(zip(messages, offsets, strict=True))
            ]  # fmt: skip
        raise StoreError(
            f"admitting {len(messages)} messages kept racing with concurrent admissions"
        )

    async def get(self, message_id: str) -> StoredMessage | None:
        """The message, or None."""
        row = await self._db.read(QueryOne(_GET, (message_id,)))
        return None if row is None else message_from_row(row)

    async def set_state(
        self, message_id: str, state: MessageState, at: float, error_code: str = ""
    ) -> StoredMessage:
        """Record a state change; raises LookupError for an unknown message_id."""
        (after,) = await self.apply([StateChange(message_id, state, at, error_code)])
        return after

    async def apply(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> list[StoredMessage]:
        """Apply state changes in order, in one transaction with the append of `events`, the
        idempotency records' progress `tokens` and the task records `tasks`; an unknown id
        raises LookupError and nothing is applied."""
        if tokens or tasks:
            rows = await self._with_tokens(changes, events, tokens, tasks, True)
        elif not changes:
            return []
        else:
            params = change_params(changes)
            rows = await self._log.write_with(events, apply_changes, params, True)
        return [message_from_row(row) for row in rows]

    async def record(
        self,
        changes: Sequence[StateChange],
        events: Sequence[EventDraft] = (),
        tokens: Sequence[TokenProgress] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> None:
        """Apply state changes as `apply` does, without reading the messages back: about a
        third of the statement's cost, and no rows to decode on the event loop."""
        if tokens or tasks:
            await self._with_tokens(changes, events, tokens, tasks, False)
        elif changes:
            await self._log.write_with(events, apply_changes, change_params(changes), False)

    async def _with_tokens(
        self, changes: Sequence[StateChange], events: Sequence[EventDraft],
        tokens: Sequence[TokenProgress], tasks: Sequence[TaskRecord], returning: bool,
    ) -> list[Row]:  # fmt: skip
        """`apply_with_tokens`, the events it appended told to the log's listeners."""
        d = self._db.dialect
        steps = [
            (replace(t, cached=None), None if t.cached is None else event_rows(d, [t.cached])[0])
            for t in tokens
        ]
        db = self._leader if tasks else self._db
        rows, taken, first = await db.write(
            apply_with_tokens, change_params(changes), returning, event_rows(d, events), steps,
            [task_row(t) for t in tasks],
        )  # fmt: skip
        cached = [t.cached for t, took in zip(tokens, taken, strict=True) if took]
        appended = [*events, *(c for c in cached if c is not None)]
        if appended:
            self._log.committed(first, appended)
        return rows

    async def finish_delivered(self, message_ids: Sequence[str], at: float) -> None:
        """One more delivery, then FULFILLED at `at`, one row update per message (unknown
        ids are ignored; an id given twice counts once)."""
        unique = list(dict.fromkeys(message_ids))
        if len(unique) <= ID_CHUNK:  # one statement: PostgreSQL runs it in one round trip
            if unique:
                d = self._db.dialect
                params = [float(at), float(at), *unique]
                await self._db.write(Execute(_finish_sql(d, len(unique)), params))
            return
        await self._db.write(_finish_delivered, unique, float(at))

    async def record_deliveries(self, counts: Sequence[tuple[str, int, float]]) -> None:
        """Keep the larger delivery count and time of each (unknown ids are ignored), a chunk
        of messages per statement."""
        if counts:
            latest = latest_deliveries(counts)
            await self._db.write(_record_deliveries, [(n, at, i) for i, (n, at) in latest.items()])

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
        where = (
            Where()
            .term("recipient = ?", recipient)
            .term("inbox_offset > ?", after_offset)
            .among("state", None if states is None else {s.value for s in states})
        )
        if where.impossible:
            return []
        sql = f"SELECT {MESSAGES.sql} FROM messages WHERE {where.sql} ORDER BY inbox_offset LIMIT ?"
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [message_from_row(row) for row in rows]

    async def count(self, recipient: str, states: frozenset[MessageState]) -> int:
        """How many of the recipient's messages are in one of `states`."""
        where = Where().term("recipient = ?", recipient).among("state", {s.value for s in states})
        if where.impossible:
            return 0
        return await self._scalar(f"SELECT COUNT(*) FROM messages WHERE {where.sql}", where.params)

    async def due(self, now: float, limit: int = 500) -> list[StoredMessage]:
        """Unfinished messages whose ack_deadline or expires_at is set and <= now,
        ordered by the earlier of the two (then by message_id)."""
        check_limit(limit)
        rows = await self._db.read(Query(_DUE, (float(now), limit)))
        return [message_from_row(row) for row in rows]

    async def next_deadline(self) -> float | None:
        """The earliest set ack_deadline/expires_at of any unfinished message, or None."""
        row = await self._db.read(QueryOne(_NEXT_DEADLINE))
        return None if row is None else float(row[0])

    async def by_sequence(self, producer_id: str, sequence_number: int) -> StoredMessage | None:
        """The newest (by created_at, then offset, then message_id) message of `producer_id`
        with that sequence number."""
        try:
            stored_number = sequence_to_sql(sequence_number)
        except ValueError:
            return None  # no message can have it
        row = await self._db.read(QueryOne(_BY_SEQUENCE, (producer_id, stored_number)))
        return None if row is None else message_from_row(row)

    async def max_sequence(self, producer_id: str) -> int:
        """The highest sequence number `producer_id` has used (0 when none)."""
        row = await self._db.read(QueryOne(_MAX_SEQUENCE, (producer_id,)))
        if row is None:
            return 0
        negative, positive = row
        if negative is not None:
            return sequence_from_sql(int(negative))
        return int(positive or 0)

    async def oldest_offset(self, recipient: str) -> int:
        """The lowest offset still retained in the recipient's inbox (0 when empty)."""
        sql = "SELECT COALESCE(MIN(inbox_offset), 0) FROM messages WHERE recipient = ?"
        return await self._scalar(sql, [recipient])

    async def purge_finished(self, before: float) -> int:
        """Delete terminal messages last updated before `before`; returns how many.

        Offsets come from `inbox_offsets`, which this leaves alone: no offset is reused.
        """
        # finished_at: the generated column of migration 0002, indexed where not NULL.
        return await purge_in_chunks(lambda limit: self._db.write(_PURGE, (float(before), limit)))

    async def _scalar(self, sql: str, params: Sequence[Any]) -> int:
        row = await self._db.read(QueryOne(sql, params))
        return 0 if row is None else int(row[0])


_GET = f"SELECT {MESSAGES.sql} FROM messages WHERE message_id = ?"
# due_at and finished_at: the generated columns of migration 0002, each with a partial
# index; comparing them lets the database use it (the comparison implies NOT NULL), and
# next_deadline's ORDER BY ... LIMIT 1 does where MIN(due_at) would not (SQLite).
_DUE = f"SELECT {MESSAGES.sql} FROM messages WHERE due_at <= ? ORDER BY due_at, message_id LIMIT ?"
_NEXT_DEADLINE = "SELECT due_at FROM messages WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1"
_BY_SEQUENCE = (
    f"SELECT {MESSAGES.sql} FROM messages WHERE producer_id = ? AND sequence_number = ?"
    " ORDER BY created_at DESC, inbox_offset DESC, message_id DESC LIMIT 1"
)
# Sequence numbers at or above 2**63 are stored negative (sequence_to_sql), so the largest
# one is the largest negative value if any is stored, else the largest non-negative value.
_MAX_SEQUENCE = (
    "SELECT MAX(CASE WHEN sequence_number < 0 THEN sequence_number END),"
    " MAX(CASE WHEN sequence_number >= 0 THEN sequence_number END)"
    " FROM messages WHERE producer_id = ?"
)
_UPDATE_WIDTH = len(ChangeParams._fields)


@lru_cache(maxsize=1024)
def _update_sql(d: Dialect, count: int, returning: bool, locking: bool = False) -> str:
    """One statement applying `count` changes to distinct messages, each change's
    `ChangeParams` a row of VALUES (named column1... in both dialects). `locking`
    (PostgreSQL): the rows are first locked in key order by a sub-select of their ids (the
    `count` parameters after the changes'), as `_lock` would in a statement of its own."""
    big = d.greatest
    sql = (
        "UPDATE messages SET state = c.column1, updated_at = c.column2,"
        " error_code = c.column3, acked_stage = COALESCE(NULLIF(c.column4, ''), acked_stage),"
        " ack_deadline = CASE WHEN c.column5 THEN 0 ELSE ack_deadline END,"
        f" deliveries = {big}(deliveries, c.column6),"
        f" last_delivered_at = {big}(last_delivered_at, c.column7)"
        f" FROM (VALUES {values_rows(count, markers(_UPDATE_WIDTH))}) AS c"
        " WHERE messages.message_id = c.column9"
        " AND messages.state = COALESCE(NULLIF(c.column8, ''), messages.state)"
    )
    if locking:
        sql += f" AND messages.message_id IN ({_lock_sql(d, count)})"
    return f"{sql} RETURNING {MESSAGES.sql}" if returning else sql


@lru_cache(maxsize=16)
def _update_one_sql(d: Dialect, returning: bool) -> str:
    """`_update_sql` for one change."""
    big = d.greatest
    sql = (
        "UPDATE messages SET state = ?, updated_at = ?, error_code = ?,"
        " acked_stage = COALESCE(NULLIF(?, ''), acked_stage),"
        " ack_deadline = CASE WHEN ? THEN 0 ELSE ack_deadline END,"
        f" deliveries = {big}(deliveries, ?), last_delivered_at = {big}(last_delivered_at, ?)"
        " WHERE state = COALESCE(NULLIF(?, ''), state) AND message_id = ?"
    )
    return f"{sql} RETURNING {MESSAGES.sql}" if returning else sql


@lru_cache(maxsize=64)
def _finish_sql(d: Dialect, count: int) -> str:
    """Finishes `count` delivered messages (parameters: the time twice, then the ids); in
    PostgreSQL the ids' rows are locked in key order first, as `_lock` does."""
    ids = in_list("message_id", count)
    if d.lock_rows:
        ids = f"message_id IN ({_lock_sql(d, count)})"
    return (
        "UPDATE messages SET deliveries = deliveries + 1, last_delivered_at = ?,"
        f" state = '{MessageState.FULFILLED.value}', updated_at = ?, error_code = ''"
        f" WHERE {ids}"
    )


_PURGE = Execute(
    by_dialect(lambda d: chunk_delete_sql(d, "messages", "message_id", "finished_at < ?"))
)
"""Deletes the messages finished before the first parameter, at most the second of them."""


def _lock_sql(d: Dialect, count: int) -> str:
    return (
        f"SELECT message_id FROM messages WHERE {in_list('message_id', count)}"
        f" ORDER BY message_id{d.lock_rows}"
    )


@lru_cache(maxsize=256)
def _deliveries_sql(d: Dialect, count: int) -> str:
    big = d.greatest
    return (
        f"UPDATE messages SET deliveries = {big}(deliveries, c.column1),"
        f" last_delivered_at = {big}(last_delivered_at, c.column2)"
        f" FROM (VALUES {values_rows(count, '?, ?, ?')}) AS c"
        " WHERE messages.message_id = c.column3"
    )


def apply_changes(
    d: Dialect, params: list[tuple[Any, ...]], returning: bool
) -> Transaction[list[Row]]:
    """Apply state changes (`ChangeParams`) in order; the messages after, when `returning`.
    An unknown id raises LookupError; the transaction's rollback undoes what was changed.

    Changes to distinct messages go a chunk per statement; a message changed twice is
    changed one change at a time, each returning the message as that change left it."""
    ids = [p[-1] for p in params]
    unique = list(dict.fromkeys(ids))
    # PostgreSQL: every row locked first, in key order (by the update itself when one
    # statement takes every change: a round trip less), which also finds unknown ids.
    one_statement = len(ids) <= min(ID_CHUNK, rows_per_statement(d, _UPDATE_WIDTH))
    locking = bool(d.lock_rows) and one_statement and len(unique) == len(ids)
    if d.lock_rows and not locking and (yield from _lock(d, unique)) != len(unique):
        yield from _missing(d, ids)
    if len(unique) != len(ids):
        return (yield from _apply_in_turn(d, params, returning))
    rows: dict[str, Row] = {}
    changed = 0
    lock_ids = ids if locking else []
    for count, values in chunks(d, params, _UPDATE_WIDTH):
        # One change (a task's READ or end, say) without the VALUES table: SQLite builds a
        # temporary B-tree for it at every run, two thirds of the statement's time.
        one = count == 1 and not locking
        sql = _update_one_sql(d, returning) if one else _update_sql(d, count, returning, locking)
        flat = [*values, *lock_ids]
        if returning:
            found = yield from Query(sql, flat)
            rows.update((row[0], row) for row in found)
        else:
            changed += yield from Execute(sql, flat)
    if (len(rows) if returning else changed) != len(ids):
        yield from _missing(d, ids)
        raise StaleStateError([i for i in ids if i not in rows] if returning else ids)
    return [rows[i] for i in ids] if returning else []


TokenStep = tuple[TokenProgress, "tuple[Any, ...] | None"]
"""A token's progress (its event left out) and the row of that event (`event_rows`)."""


@lru_cache(maxsize=2)
def _token_sql(d: Dialect) -> str:
    return f"SELECT {IDEMPOTENCY.sql} FROM idempotency WHERE token = ?{d.lock_rows}"


def apply_with_tokens(
    d: Dialect, params: list[tuple[Any, ...]], returning: bool, events: list[tuple[Any, ...]],
    steps: list[TokenStep], tasks: list[tuple[Any, ...]],
) -> Transaction[tuple[list[Row], list[bool], int]]:  # fmt: skip
    """`apply_changes`, then each token's progress (`steps`, in order) on its record as
    this transaction reads it (locked in PostgreSQL: no other write of the token comes
    between), the task records `tasks` (`task_row`: the Scheduler's transitions of the
    tasks the changed messages carry), then the append of `events` and of the event of
    each step that changed its record's cached outcome. Returns the changed messages (when
    `returning`), whether each step's event was appended, and the first event's sequence
    (0: none)."""
    rows = (yield from apply_changes(d, params, returning)) if params else []
    taken: list[bool] = []
    for step, cached_row in steps:
        found = yield from QueryOne(_token_sql(d), (step.key,))
        updated, outcome = advance(None if found is None else idempotency_from_row(found), step)
        if updated is not None:
            yield from Execute(PUT_IDEMPOTENCY.sql, idempotency_row(updated))
        if outcome and cached_row is not None:
            events = [*events, cached_row]
        taken.append(outcome and cached_row is not None)
    first = yield from put_tasks_and_append(d, tasks, events)
    return rows, taken, first


def _apply_in_turn(
    d: Dialect, params: list[tuple[Any, ...]], returning: bool
) -> Transaction[list[Row]]:
    """Apply the changes one at a time: a message changed twice is returned as each change
    left it."""
    if d.lock_rows and not returning and not any(p[-2] for p in params):
        # Every row is locked and known, and no change is conditional: the changes go
        # pipelined (PostgreSQL).
        yield from ExecuteMany(_update_one_sql(d, False), params)
        return []
    rows: list[Row] = []
    for change in params:
        if returning:
            row = yield from QueryOne(_update_one_sql(d, True), change)
            found = row is not None
            rows.extend([] if row is None else [row])
        else:
            found = (yield from Execute(_update_one_sql(d, False), change)) == 1
        if not found:
            yield from _missing(d, [change[-1]])
            raise StaleStateError([change[-1]])
    return rows


def _missing(d: Dialect, ids: list[str]) -> Transaction[None]:
    """Raise LookupError naming the first of `ids` that is not stored; return when every
    one is (a change left one alone: its message was no longer in the state it expected)."""
    known = yield from existing_ids(d, ids)
    missing = next((i for i in ids if i not in known), None)
    if missing is not None:
        raise LookupError(f"no message {missing!r}")


def _lock(d: Dialect, message_ids: list[str]) -> Transaction[int]:
    """Row-lock the messages in key order (PostgreSQL); how many of them exist."""
    ordered = sorted(set(message_ids))
    found = 0
    for start in range(0, len(ordered), ID_CHUNK):
        chunk = ordered[start : start + ID_CHUNK]
        found += len((yield from Query(_lock_sql(d, len(chunk)), chunk)))
    return found


def _finish_delivered(d: Dialect, unique: list[str], at: float) -> Transaction[None]:
    for start in range(0, len(unique), ID_CHUNK):
        chunk = unique[start : start + ID_CHUNK]
        yield from Execute(_finish_sql(d, len(chunk)), [at, at, *chunk])


def _record_deliveries(d: Dialect, params: list[tuple[Any, ...]]) -> Transaction[None]:
    if d.lock_rows:
        yield from _lock(d, [p[-1] for p in params])
    for count, flat in chunks(d, params, 3):
        yield from Execute(_deliveries_sql(d, count), flat)


def _new_task_id(writes: AdmissionWrites) -> str:
    """The id of the new task a member was refused for (`AdmissionWrites.task_new`)."""
    assert writes.task is not None  # (only a member with a new task is refused for it)
    return writes.task.task_id
