"""Cluster mode's buffer capacity and credits, counted in the admitting transaction
(`core.admission_bounds`; docs/cluster.md, "Buffers and credits").

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
from apiary.store.sql.dialect import in_list
from apiary.store.sql.statements import Query, Transaction

Refusals = dict[int, tuple[str, int, int]]
"""The members refused, by index: the limit, the count, the bound."""
_STATES: Final = [s.value for s in UNFINISHED]
_BUFFERED: Final = frozenset(s.value for s in BUFFERED)


def _count_sql(recipients: int) -> str:
    return (
        "SELECT recipient, producer_id, state, count(*) FROM messages"
        f" WHERE {in_list('recipient', recipients)} AND {in_list('state', len(_STATES))}"
        f" AND producer_id <> ? AND NOT ({in_list('message_type', len(NOTICE_TYPES))})"
        " GROUP BY recipient, producer_id, state"
    )


def held_to_bounds(members: Sequence[Member]) -> Transaction[Refusals]:
    """The members (admitted in this order) past their recipients' buffer capacity or
    credits, counting what is stored (notices left out, as `core.admission_bounds.counts`
    leaves them: every row read holds a credit, those BUFFERED occupy buffer space)."""
    recipients = sorted({recipient for _, recipient, _, _ in members})
    rows = yield from Query(
        _count_sql(len(recipients)),
        [*recipients, *_STATES, NOTICE_PRODUCER, *NOTICE_TYPES],
    )
    buffered: dict[str, int] = {}
    in_flight: dict[tuple[str, str], int] = {}
    for recipient, producer, state, n in rows:
        if state in _BUFFERED:
            buffered[recipient] = buffered.get(recipient, 0) + int(n)
        in_flight[(recipient, producer)] = in_flight.get((recipient, producer), 0) + int(n)
    return exceeding(members, buffered, in_flight)
