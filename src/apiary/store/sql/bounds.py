"""Cluster mode's buffer capacity, credits and `queued_messages` quota, counted in the
admitting transaction (`core.admission_bounds`; docs/cluster.md, "Buffers and credits").

The recipients' offset counters are locked before this runs (`admit_new`), so admissions
to them, on any replica, wait for this transaction: what it counts is what is stored, and
no other admission to the same recipient commits between the count and the insert. State
changes only lower the counts meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from apiary.core.admission_bounds import (
    BUFFERED,
    NOTICE_PRODUCER,
    NOTICE_TYPES,
    UNFINISHED,
    Member,
    exceeding,
)
from apiary.core.quota import QUEUED_MESSAGES
from apiary.store.sql.dialect import in_list
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction

Refusals = dict[int, tuple[str, int, int]]
"""The members refused, by index: the limit, the count, the bound."""
_STATES: Final = [s.value for s in UNFINISHED]
_BUFFERED: Final = frozenset(s.value for s in BUFFERED)
_BUFFERED_ORDER: Final = [s.value for s in BUFFERED]


def _count_sql(recipients: int) -> str:
    return (
        "SELECT recipient, producer_id, state, count(*) FROM messages"
        f" WHERE {in_list('recipient', recipients)} AND {in_list('state', len(_STATES))}"
        f" AND producer_id <> ? AND NOT ({in_list('message_type', len(NOTICE_TYPES))})"
        " GROUP BY recipient, producer_id, state"
    )


_LOCK_QUOTA = (
    "INSERT INTO quota_locks (quota) VALUES (?) ON CONFLICT (quota)"
    " DO UPDATE SET quota = quota_locks.quota"
)
"""Creates and row-locks (in PostgreSQL, the no-op update) a quota's lock row."""
_QUEUED_SQL = (
    f"SELECT count(*) FROM messages WHERE {in_list('state', len(BUFFERED))}"
    f" AND producer_id <> ? AND NOT ({in_list('message_type', len(NOTICE_TYPES))})"
)


def held_to_bounds(members: Sequence[Member]) -> Transaction[Refusals]:
    """The members (admitted in this order) past their recipients' buffer capacity or
    credits, or the tenant's `queued_messages` quota, counting what is stored (notices left
    out, as `core.admission_bounds.counts` leaves them: every row read holds a credit, those
    BUFFERED occupy buffer space).

    The quota counts every recipient's messages, whose counters this transaction has not
    locked: with a member held to it, the quota's row in `quota_locks` is locked first, so
    admissions held to the quota, on any replica, commit one after another (this lock is
    taken after the recipients' counters, and no admission takes a counter after it: no
    deadlock)."""
    recipients = sorted({recipient for _, recipient, _, _ in members})
    rows = yield from Query(
        _count_sql(len(recipients)),
        [*recipients, *_STATES, NOTICE_PRODUCER, *NOTICE_TYPES],
    )
    tenant_queued = 0
    if any(bound.queued for _, _, _, bound in members):
        yield from Execute(_LOCK_QUOTA, [QUEUED_MESSAGES])
        params = [*_BUFFERED_ORDER, NOTICE_PRODUCER, *NOTICE_TYPES]
        counted = yield from QueryOne(_QUEUED_SQL, params)
        tenant_queued = int(counted[0]) if counted is not None else 0
    buffered: dict[str, int] = {}
    in_flight: dict[tuple[str, str], int] = {}
    for recipient, producer, state, n in rows:
        if state in _BUFFERED:
            buffered[recipient] = buffered.get(recipient, 0) + int(n)
        in_flight[(recipient, producer)] = in_flight.get((recipient, producer), 0) + int(n)
    return exceeding(members, buffered, in_flight, tenant_queued)
