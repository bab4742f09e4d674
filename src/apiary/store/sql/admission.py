"""The admission of messages as one transaction (the router's hot path): the new members
inserted with the recipients' next inbox offsets (`admit_new`), and with them, in the same
transaction, their tokens claimed, the dead letters they requeue marked, their limits
counted, their task records and their events (`admit_with`). See store/sql/messages.py
for how offsets stay gap-free and in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from functools import lru_cache
from typing import Any

from apiary.core.admission_bounds import Member
from apiary.core.events import EventDraft
from apiary.core.records import AdmissionWrites, IdempotencyRecord, StoredMessage
from apiary.store.errors import StoreError
from apiary.store.sql.bounds import Refusals, held_to_bounds
from apiary.store.sql.bulk import chunks, markers, values_rows
from apiary.store.sql.dialect import Dialect
from apiary.store.sql.dlq import DlqMark, mark_requeued_once
from apiary.store.sql.events import event_rows
from apiary.store.sql.idempotency import TokenClaim, claim_tokens, idempotency_row
from apiary.store.sql.message_rows import ID, MESSAGES, RECIPIENT, existing_ids
from apiary.store.sql.statements import Execute, ExecuteMany, Query, Transaction
from apiary.store.sql.tasks import put_tasks_and_append, stored_task_ids, task_row


class AdmissionRacedError(StoreError):
    """Another transaction admitted one of the batch's ids after the duplicate check (only
    PostgreSQL's concurrent writers can); the batch is tried again."""


def admit_new(
    d: Dialect, values: list[tuple[Any, ...]], screen: Screen | None = None,
    optimistic: bool = False,
) -> Transaction[list[int]]:  # fmt: skip
    """Insert the members (`message_values`) that are new; their offsets in input order, 0
    for duplicates and for those `screen` refuses (given the indices of the new members,
    once the duplicates are known: a token's record is written for new members only).

    The recipients' counters are created and locked before the duplicate check, so
    admissions to the same recipients wait for this one and cannot slip in between (in
    PostgreSQL; SQLite runs one transaction at a time); the same statement moves each
    counter past the offsets of the members to it (set back to the last offset given out
    when some turn out duplicates or refused). Duplicates are found before anything is
    written, so a duplicate never consumes an offset. An admission of one of these ids to
    another recipient can still slip in (PostgreSQL): a row then turns out to exist after
    all, which would leave a gap in the offsets, so the transaction is undone and
    AdmissionRacedError raised, for the caller to try again.

    `optimistic` leaves out the look for duplicates among the stored messages (one round
    trip, on PostgreSQL): a member stored already is then met by the insert, which raises
    AdmissionRacedError too, and the caller tries again with the look (duplicates of an
    earlier member of the batch are found either way).
    """
    seen: set[str] = set()
    fresh: list[int] = []
    """The members that are not a duplicate of an earlier one, in input order."""
    for index, value in enumerate(values):
        if value[ID] not in seen:
            seen.add(value[ID])
            fresh.append(index)
    wanted = Counter(values[index][RECIPIENT] for index in fresh)
    recipients = sorted({v[RECIPIENT] for v in values})
    counters = yield from Query(
        _counters_sql(len(recipients)), [x for r in recipients for x in (r, wanted[r])]
    )
    first = {recipient: int(offset) - wanted[recipient] for recipient, offset in counters}
    last = dict(first)
    new = fresh
    if not optimistic:
        taken = yield from existing_ids(d, [values[index][ID] for index in fresh])
        if taken:
            new = [index for index in fresh if values[index][ID] not in taken]
    if screen is not None:
        refused = yield from screen(new)
        new = [index for index in new if index not in refused]
    rows: list[tuple[Any, ...]] = []
    offsets = [0] * len(values)
    for index in new:
        value = values[index]
        recipient = value[RECIPIENT]
        last[recipient] = offset = last[recipient] + 1
        offsets[index] = offset
        rows.append((*value, offset))
    inserted = 0
    for count, params in chunks(d, rows, MESSAGES.count):
        rows_sql = values_rows(count, _MESSAGE_MARKERS)
        inserted += yield from Execute(_INSERT.format(rows=rows_sql), params)
    if inserted != len(rows):
        raise AdmissionRacedError("a concurrent admission took one of the ids")
    short = [(n, r) for r, n in last.items() if n != first[r] + wanted[r]]
    if short:
        yield from ExecuteMany(_SET_COUNTER, short)
    return offsets


Screen = Callable[[list[int]], Transaction[Collection[int]]]
"""A step of `admit_new` that refuses some of the new members (by index)."""
AdmissionExtras = list[
    tuple[
        list[tuple[Any, ...]],
        TokenClaim | None,
        tuple[Any, ...] | None,
        DlqMark | None,
        Member | None,
        bool,
    ]
]
"""Per member of an admission: its events' rows (`event_rows`), its token's record to write,
its task row, the dead letter it requeues, the limits it is held to and whether its task is
new (`AdmissionWrites.task_new`)."""


def admission_extras(
    d: Dialect, messages: Sequence[StoredMessage], writes: Sequence[AdmissionWrites]
) -> AdmissionExtras:
    return [
        (event_rows(d, w.events) if w.events else [],
         None if w.idempotency is None else (
             i, idempotency_row(w.idempotency), w.idempotency_found, w.idempotency_forced),
         None if w.task is None else task_row(w.task),
         (i, m.created_at, m.message_id, w.requeues) if w.requeues else None,
         None if w.bound is None else (i, m.recipient, m.producer_id, w.bound),
         w.task_new and w.task is not None)
        for i, (m, w) in enumerate(zip(messages, writes, strict=True))
    ]  # fmt: skip


def admitted_events(writes: Sequence[AdmissionWrites], offsets: list[int]) -> list[EventDraft]:
    """The members' events `admit_with` appended: those of the members admitted, in order."""
    if not writes:
        return []
    return [e for w, o in zip(writes, offsets, strict=True) if o for e in w.events]


Admitted = tuple[list[int], int, dict[int, IdempotencyRecord], set[int], Refusals, set[int]]
"""What `admit_with` returns (its docstring)."""


def admit_with(
    d: Dialect, values: list[tuple[Any, ...]], lead: list[tuple[Any, ...]],
    extras: AdmissionExtras, optimistic: bool = False,
) -> Transaction[Admitted]:  # fmt: skip
    """`admit_new`, its new members' tokens claimed first (`claim_tokens`: a member whose
    token another admission took is refused) and the dead letters they requeue marked
    (`mark_requeued_once`: one another requeue marked refuses its member), then the events'
    rows `lead` and, for each member admitted (`extras`: none, or one per member), its task
    record and events. Returns the offsets, the first event's sequence (0 when there were
    none), the members refused for their tokens, with the records that refused them, and
    those refused for their dead letters, and those past their limits (`held_to_bounds`,
    counted first: a member refused later, for its token or dead letter, counts there as
    admitted, so a batch may be refused a little early, never admitted past a limit), and
    those whose new task's id is stored already (`AdmissionWrites.task_new`; looked for
    before any token is claimed). The Scheduler that creates tasks runs on one coordinator
    (the cluster's leader): nothing else inserts one between that look and the write.
    `optimistic` as for `admit_new`."""
    taken: dict[int, IdempotencyRecord] = {}
    requeued: set[int] = set()
    bounded: Refusals = {}
    existing: set[int] = set()

    def claim(new: list[int]) -> Transaction[Collection[int]]:
        # The limits first: a member past one must not claim its token or mark its entry.
        held = [b for i in new if (b := extras[i][4]) is not None] if extras else []
        if held:
            bounded.update((yield from held_to_bounds(held)))
        left = [i for i in new if i not in bounded]
        created = (
            {i: row[0] for i in left if extras[i][5] and (row := extras[i][2])} if extras else {}
        )
        if created:
            taken_ids = yield from stored_task_ids(d, list(created.values()))
            for i, task_id in created.items():  # (an earlier member's new task takes its id)
                if task_id in taken_ids:
                    existing.add(i)
                taken_ids.add(task_id)
            left = [i for i in left if i not in existing]
        claims = [c for i in left if (c := extras[i][1]) is not None] if extras else []
        if claims:
            taken.update((yield from claim_tokens(d, claims)))
        marks = [m for i in left if (m := extras[i][3]) is not None and i not in taken]
        if marks:
            requeued.update((yield from mark_requeued_once(marks)))
        return {*bounded, *existing, *taken, *requeued}

    offsets = yield from admit_new(d, values, claim, optimistic)
    admitted = [e for e, offset in zip(extras, offsets, strict=True) if offset] if extras else []
    tasks = [extra[2] for extra in admitted if extra[2] is not None]
    rows = lead + [row for extra in admitted for row in extra[0]]
    first = yield from put_tasks_and_append(d, tasks, rows)
    return offsets, first, taken, requeued, bounded, existing


@lru_cache(maxsize=64)
def _counters_sql(count: int) -> str:
    """Moves the counters of `count` recipients (given in key order, each with how many
    offsets to take), created when missing, and returns every one's last offset after it;
    the update is what row-locks an existing counter in PostgreSQL (when it takes none,
    too)."""
    return (
        "INSERT INTO inbox_offsets (recipient, last_offset)"
        f" VALUES {values_rows(count, '?, ?')} ON CONFLICT (recipient)"
        " DO UPDATE SET last_offset = inbox_offsets.last_offset + excluded.last_offset"
        " RETURNING recipient, last_offset"
    )


_INSERT = (
    f"INSERT INTO messages ({MESSAGES.sql}) VALUES {{rows}} ON CONFLICT (message_id) DO NOTHING"
)
_MESSAGE_MARKERS = markers(MESSAGES.count)
_SET_COUNTER = "UPDATE inbox_offsets SET last_offset = ? WHERE recipient = ?"
