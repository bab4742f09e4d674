"""The event log: the `events` table, sequences gap-free and committed in order.

An append's sequences are assigned in the transaction that inserts the events: in
PostgreSQL by incrementing the single `event_sequence` row, which stays row-locked until the
transaction ends, so that concurrent appenders (any replica) take turns and a reader that
sees N has seen everything before N (the claim and the insert are one statement, the last
of the transaction but its commit, so that the lock is held as briefly as it can be:
measured on a loaded machine, concurrent one-event appends went from 136-194 to 202-493 a
second); in SQLite by AUTOINCREMENT, which numbers a statement's rows consecutively since
its one writer runs one transaction at a time (numbering the rows here instead measured
1.3% more instructions per routed message in bench/store_rows.py): the insert's last rowid
tells the append its sequences, with no statement to read the next one first (that read
was about 4 of the writer's 28 statements per task, docs/performance.md). Appends are on
the router's hot path (two events per routed message): a burst is one multi-row statement
per chunk (`bulk`), its rows built on the caller's side.

SQLite keys its correlation index by `correlation_key` (a CRC-32 of the id) after the
sequence's bucket (migrations 16 and 17), because its B-tree inserts run on the
coordinator's own interpreter; PostgreSQL indexes (correlation_id, sequence) itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Final, NamedTuple, TypeVar, TypeVarTuple

from apiary.core.events import Event, EventDraft, EventFilter
from apiary.store.json_codec import dump_json, json_object_of
from apiary.store.sql.bulk import chunks, values_rows
from apiary.store.sql.checks import check_limit
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.statements import (
    Execute,
    InsertRowid,
    Query,
    QueryOne,
    Row,
    Transaction,
)
from apiary.store.sql.where import Where
from apiary.store.sqlite.database import CORRELATION_BUCKET_BITS, correlation_key

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class EventRow(NamedTuple):
    """A row of `events` (SQLite's `correlation_key` is written, never read)."""

    sequence: int
    event_type: str
    actor: str
    ts: float
    correlation_id: str
    agent_id: str
    details: Json
    hlc: str


EVENTS = Columns(EventRow, json=("details",))
_KEYED: Final = frozenset({"sqlite"})
"""The dialects whose schema has `correlation_key` (see the module docstring)."""
_AUTOINCREMENT: Final = frozenset({"sqlite"})
"""The dialects whose `events.sequence` numbers the inserted rows itself."""
_LAST_SEQUENCE: Final = {
    "sqlite": "SELECT COALESCE(MAX(sequence), 0) FROM events",
    "postgresql": "SELECT last_sequence FROM event_sequence",
}
_LAST = by_dialect(lambda d: _LAST_SEQUENCE[d.name])
_BUCKETS_PER_READ: Final = 256
"""Correlation buckets (of 4,096 events) one statement of `_by_correlation` looks in."""


def event_from_row(fetched: Row) -> Event:
    """An `Event` from a fetched row of `EVENTS`."""
    row = EVENTS.of(fetched)
    return Event(
        sequence=row.sequence,
        event_type=row.event_type,
        actor=row.actor,
        ts=row.ts,
        correlation_id=row.correlation_id,
        agent_id=row.agent_id,
        details=json_object_of(row.details),
        hlc=row.hlc,
    )


def event_rows(d: Dialect, drafts: Sequence[EventDraft]) -> list[tuple[Any, ...]]:
    """The drafts' rows in `EventRow`'s order but the sequence (the append assigns it),
    then, in SQLite, the correlation key: plain tuples, built on the caller's side so that
    the writer does as little as possible. ValueError when details are not JSON."""
    if d.name in _KEYED:
        return [
            (e.event_type, e.actor, e.ts, e.correlation_id, e.agent_id, dump_json(e.details),
             e.hlc, correlation_key(e.correlation_id))
            for e in drafts
        ]  # fmt: skip
    return [
        (e.event_type, e.actor, e.ts, e.correlation_id, e.agent_id, dump_json(e.details), e.hlc)
        for e in drafts
    ]


@lru_cache(maxsize=512)
def _insert_sql(d: Dialect, count: int) -> str:
    names = EVENTS.names[1:] if d.name in _AUTOINCREMENT else EVENTS.names
    if d.name in _KEYED:
        names = (*names, "correlation_key")
    row = d.markers(names, EVENTS.json)
    return f"INSERT INTO events ({', '.join(names)}) VALUES {values_rows(count, row)}"


_TYPED: Final = {"ts": "?::double precision"}
"""The first VALUES row's markers that name their type (the others follow it)."""


@lru_cache(maxsize=512)
def _claim_and_insert_sql(d: Dialect, count: int) -> str:
    """PostgreSQL: the claim of N sequences (the first parameter) and the insert of the
    first `count` events, each numbered by its place (`ord`, 1-based) from the first
    sequence claimed (N again), as one statement: one round trip, and the `event_sequence`
    row's lock held one statement less."""
    names = EVENTS.names[1:]
    first_row = ", ".join(
        ["?::bigint"] + [_TYPED.get(name, d.json_marker if name in EVENTS.json else "?")
                         for name in names]
    )  # fmt: skip
    rows = ", ".join([f"({first_row})"] + [f"({d.markers(('ord', *names), EVENTS.json)})"]
                     * (count - 1))  # fmt: skip
    return (
        "WITH claimed AS (UPDATE event_sequence SET last_sequence = last_sequence + ?"
        " RETURNING last_sequence), appended AS ("
        f"INSERT INTO events ({', '.join(EVENTS.names)}) SELECT"
        f" claimed.last_sequence - ? + v.ord, {', '.join(f'v.{n}' for n in names)}"
        f" FROM claimed, (VALUES {rows}) AS v(ord, {', '.join(names)}))"
        " SELECT last_sequence FROM claimed"
    )


Ahead = tuple[str, list[Any]]
"""A write (canonical SQL, its parameters) that `append_events` runs before the events."""


def append_events(
    d: Dialect, rows: list[tuple[Any, ...]], ahead: Ahead | None = None
) -> Transaction[int]:
    """Append the rows of `event_rows` with consecutive sequences; the first of them. A
    write `ahead` runs first: on PostgreSQL in the statement of the claim (a data-modifying
    WITH: one round trip for both), in SQLite as a statement of its own."""
    if ahead is not None and d.name in _AUTOINCREMENT:
        yield from Execute(*ahead)
        ahead = None
    if d.name in _AUTOINCREMENT:
        # AUTOINCREMENT numbers a statement's rows consecutively, and the one writer's
        # statements follow one another: the first row's is the first chunk's last less its
        # other rows.
        first = 0
        for count, params in chunks(d, rows, len(rows[0])):
            last = yield from InsertRowid(_insert_sql(d, count), params)
            first = first or last - count + 1
        return first
    # The first chunk's rows go in with the claim; the others (a burst past a statement's
    # rows) after it, numbered from the first sequence.
    numbered = [(place, *row) for place, row in enumerate(rows, 1)]
    head_count, head = next(iter(chunks(d, numbered, len(numbered[0]))))
    if ahead is None:
        claimed = yield from QueryOne(
            _claim_and_insert_sql(d, head_count), (len(rows), len(rows), *head)
        )
    else:
        sql, params = ahead
        claimed = yield from QueryOne(
            f"WITH ahead AS ({sql}), {_claim_and_insert_sql(d, head_count)[len('WITH ') :]}",
            (*params, len(rows), len(rows), *head),
        )
    assert claimed is not None  # the statement returns one row
    first = int(claimed[0]) - len(rows) + 1
    rest = [(first + place - 1, *row) for place, *row in numbered[head_count:]]
    if rest:
        for count, params in chunks(d, rest, len(rest[0])):
            yield from Execute(_insert_sql(d, count), params)
    return first


def with_events(
    d: Dialect,
    rows: list[tuple[Any, ...]],
    work: Callable[[Dialect, *Ts], Transaction[T]],
    args: tuple[*Ts],
) -> Transaction[tuple[T, int]]:
    """`work(d, *args)`, then the append of the events' `rows` (`event_rows`), in one
    transaction: the state change and its events commit together or not at all. Returns
    `work`'s result and the first event's sequence."""
    result = yield from work(d, *args)
    first = yield from append_events(d, rows)
    return result, first


class SqlEventLog:
    """`EventLog` in the `events` table; the other aggregates' stores append through
    `write_with` events that commit with their state changes."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database
        self._listeners: list[Callable[[Sequence[Event]], None]] = []

    def over(self, database: SqlDatabase) -> SqlEventLog:
        """This log writing through `database` (the leader's writes, `leader_writes`), its
        listeners shared."""
        log = SqlEventLog(database)
        log._listeners = self._listeners
        return log

    def listen(self, listener: Callable[[Sequence[Event]], None]) -> None:
        """Call `listener` with every append's events once committed (see EventLog)."""
        self._listeners.append(listener)

    async def append(self, drafts: Sequence[EventDraft]) -> list[Event]:
        """Append the drafts atomically, in order; return them with their sequences."""
        if not drafts:
            return []
        first = await self._db.write(append_events, event_rows(self._db.dialect, drafts))
        return self.committed(first, drafts)

    async def write_with(
        self,
        drafts: Sequence[EventDraft],
        work: Callable[[Dialect, *Ts], Transaction[T]],
        *args: *Ts,
    ) -> T:
        """Run the write transaction `work(d, *args)` with the drafts appended in it (just
        `work` when there are none); its result once committed."""
        if not drafts:
            return await self._db.write(work, *args)
        rows = event_rows(self._db.dialect, drafts)
        result, first = await self._db.write(with_events, rows, work, args)
        self.committed(first, drafts)
        return result

    def committed(self, first: int, drafts: Sequence[EventDraft]) -> list[Event]:
        """The drafts as committed from sequence `first` on, told to the listeners: for a
        store whose own transaction appended them (`append_events`)."""
        events = [Event.from_draft(first + i, draft) for i, draft in enumerate(drafts)]
        for listener in self._listeners:
            listener(events)
        return events

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        """Events with sequence > `after` that match `where`, ascending, at most `limit`."""
        check_limit(limit)
        keyed = self._db.dialect.name in _KEYED
        terms = event_filter(where, after, correlation_key if keyed else None)
        if terms.impossible:
            return []
        if keyed and where is not None and where.correlation_id is not None:
            rows = await self._db.read(_by_correlation, terms.sql, terms.params, after, limit)
        else:
            sql = f"SELECT {EVENTS.sql} FROM events WHERE {terms.sql} ORDER BY sequence LIMIT ?"
            rows = await self._db.read(Query(sql, [*terms.params, limit]))
        return [event_from_row(row) for row in rows]

    async def last_sequence(self) -> int:
        """The highest sequence appended so far (0 for an empty log)."""
        row = await self._db.read(QueryOne(_LAST))
        return 0 if row is None else int(row[0])


def event_filter(
    where: EventFilter | None, after: int, correlation_key: Callable[[str], int] | None = None
) -> Where:
    """The WHERE clause of an event-log read (impossible for an empty set of event types).
    `correlation_key`: the function a `correlation_key` column holds of correlation_id, for
    a schema that indexes that instead of the id."""
    terms = Where().term("sequence > ?", after)
    if where is None:
        return terms
    if correlation_key is not None and where.correlation_id is not None:
        terms.term("correlation_key = ?", correlation_key(where.correlation_id))
    terms.compare("correlation_id =", where.correlation_id).compare("agent_id =", where.agent_id)
    terms.compare("sequence <", where.before)
    if where.event_types is not None and not where.event_types:
        terms.impossible = True
    elif where.event_types is not None:
        exact = sorted(t for t in where.event_types if not t.endswith("."))
        families = sorted(t for t in where.event_types if t.endswith("."))
        alternatives = [in_list("event_type", len(exact))] if exact else []
        alternatives += ["event_type LIKE ? ESCAPE '!'" for _ in families]
        terms.term(f"({' OR '.join(alternatives)})", *exact, *map(_like_prefix, families))
    return terms


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for names starting with `prefix` (its own wildcards escaped)."""
    escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"{escaped}%"


def correlation_read_sql(clauses: list[str] | str) -> str:
    """The statement `_by_correlation` runs (SQLite): the events matching `clauses` (ANDed;
    and at most the sequence of the next parameter) in the buckets from the first parameter
    to the second, ascending, at most the last parameter of them."""
    where = clauses if isinstance(clauses, str) else " AND ".join(clauses)
    return (
        "WITH RECURSIVE b(x) AS (SELECT ? UNION ALL SELECT x + 1 FROM b WHERE x < ?)"
        f" SELECT {EVENTS.sql} FROM b CROSS JOIN events"
        f" ON (events.sequence >> {CORRELATION_BUCKET_BITS}) = b.x"
        f" WHERE {where} AND sequence <= ? ORDER BY sequence LIMIT ?"
    )


def _by_correlation(
    d: Dialect, clauses: str, params: list[Any], after: int, limit: int
) -> Transaction[list[Row]]:
    """An event-log read by correlation (`clauses` and `params` name the correlation key):
    the key looked up through the index in each bucket of events from `after`'s on
    (migration 17), a window of buckets per statement until `limit` rows are found.
    Bounded by the last sequence when the read began, so that a later window never shows
    events past ones an earlier window could not see yet."""
    found = yield from QueryOne(_LAST)
    last = 0 if found is None else int(found[0])
    sql = correlation_read_sql(clauses)
    rows: list[Row] = []
    bits = CORRELATION_BUCKET_BITS
    bucket, end = after >> bits, last >> bits
    while bucket <= end and len(rows) < limit:
        upto = min(end, bucket + _BUCKETS_PER_READ - 1)
        rows += yield from Query(sql, [bucket, upto, *params, last, limit - len(rows)])
        bucket = upto + 1
    return rows
