"""Buffer capacity and credits counted by the store (docs/cluster.md, "Buffers and
credits"): in cluster mode each replica's memory holds only some of a recipient's
messages, so the admitting transaction counts them in the shared table, with the
recipient's offset counter locked (admissions to one recipient, on any replica, commit one
after another), and refuses the members past a limit (`AdmissionBound`).

What counts, as on one coordinator (`engine.router.inbox`, `engine.router.credit_control`):
a message occupies its recipient's buffer from admission until it is READ (RECEIVED or
RETRYING), and holds a credit from admission until it finishes (any state but a terminal
one); notices (ACKs, heartbeats, the coordinator's own messages) do neither.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

from apiary.core.envelope import MessageType
from apiary.core.quota import QUEUED_MESSAGES
from apiary.core.records import AdmissionBound, MessageState

NOTICE_PRODUCER: Final = "coordinator"
"""The producer of the coordinator's own messages: notices, counted by no limit."""
NOTICE_TYPES: Final = (int(MessageType.ACKNOWLEDGEMENT), int(MessageType.HEARTBEAT))
BUFFERED: Final = (MessageState.RECEIVED, MessageState.RETRYING)
UNFINISHED: Final = tuple(s for s in MessageState if not s.terminal)

CAPACITY: Final = "capacity"
WINDOW: Final = "window_exhausted"
PRODUCER_CAP: Final = "producer_cap"

Member = tuple[int, str, str, AdmissionBound]
"""A member of an admission held to limits: its index, recipient, producer and bound."""


def counts(producer_id: str, message_type: int, state: MessageState) -> tuple[bool, bool]:
    """Whether a stored message occupies buffer space, and whether it holds a credit."""
    if producer_id == NOTICE_PRODUCER or message_type in NOTICE_TYPES:
        return False, False
    return state in BUFFERED, not state.terminal


def exceeding(
    members: Sequence[Member],
    buffered: Mapping[str, int],
    in_flight: Mapping[tuple[str, str], int],
    tenant_queued: int = 0,
) -> dict[int, tuple[str, int, int]]:
    """The members past a limit, by index: (the limit's name, the count, the limit), given
    what is stored: `buffered` by recipient, `in_flight` by (recipient, producer), and
    `tenant_queued` buffered to any recipient (the tenant's `queued_messages` quota, checked
    first: on one coordinator it refuses the call before routing). Members are taken in
    order, each one admitted counting for the next."""
    queued: Counter[str] = Counter(buffered)
    held: Counter[tuple[str, str]] = Counter(in_flight)
    total: Counter[str] = Counter()
    for (recipient, _), n in in_flight.items():
        total[recipient] += n
    refused: dict[int, tuple[str, int, int]] = {}
    for index, recipient, producer, bound in members:
        pair = (recipient, producer)
        if bound.queued and tenant_queued >= bound.queued:
            refused[index] = (QUEUED_MESSAGES, tenant_queued, bound.queued)
        elif bound.capacity and queued[recipient] >= bound.capacity:
            refused[index] = (CAPACITY, queued[recipient], bound.capacity)
        elif bound.window and total[recipient] >= bound.window:
            refused[index] = (WINDOW, total[recipient], bound.window)
        elif bound.cap and held[pair] >= bound.cap:
            refused[index] = (PRODUCER_CAP, held[pair], bound.cap)
        else:
            queued[recipient] += 1
            tenant_queued += 1
            total[recipient] += 1
            held[pair] += 1
    return refused
