"""The limits the store holds cluster mode's admissions to (`apiary.core.admission_bounds`):
what counts, and the walk over a batch's members in order."""

from __future__ import annotations

from apiary.core.admission_bounds import (
    NOTICE_PRODUCER,
    NOTICE_TYPES,
    counts,
    exceeding,
)
from apiary.core.envelope import MessageType
from apiary.core.records import AdmissionBound, MessageState
from apiary.engine.notices import COORDINATOR
from apiary.engine.router.admission import NOTICE_TYPES as ROUTER_NOTICE_TYPES


def test_notices_are_what_the_router_calls_notices() -> None:
    assert NOTICE_PRODUCER == COORDINATOR
    assert set(NOTICE_TYPES) == {int(t) for t in ROUTER_NOTICE_TYPES}


def test_a_message_occupies_until_read_and_holds_a_credit_until_it_finishes() -> None:
    data = int(MessageType.DATA)
    assert counts("alice", data, MessageState.RECEIVED) == (True, True)
    assert counts("alice", data, MessageState.RETRYING) == (True, True)
    assert counts("alice", data, MessageState.READ) == (False, True)
    assert counts("alice", data, MessageState.FULFILLED) == (False, False)
    assert counts(COORDINATOR, data, MessageState.RECEIVED) == (False, False)
    assert counts("alice", int(MessageType.ACKNOWLEDGEMENT), MessageState.RECEIVED) == (
        False, False,
    )  # fmt: skip


def test_members_count_for_the_members_after_them() -> None:
    bound = AdmissionBound(capacity=3, window=4, cap=2)
    members = [
        (0, "bob", "alice", bound),
        (1, "bob", "alice", bound),  # alice's cap: 1 stored + member 0
        (2, "bob", "carol", bound),
        (3, "bob", "dave", bound),  # capacity: 1 stored + members 0 and 2
        (4, "erin", "alice", AdmissionBound()),  # no limits
    ]
    refused = exceeding(members, {"bob": 1}, {("bob", "alice"): 1})
    assert refused == {1: ("producer_cap", 2, 2), 3: ("capacity", 3, 3)}


def test_the_window_counts_every_producer_in_flight() -> None:
    bound = AdmissionBound(window=3)
    in_flight = {("bob", "alice"): 2, ("bob", "carol"): 1}
    assert exceeding([(0, "bob", "dave", bound)], {}, in_flight) == {0: ("window_exhausted", 3, 3)}


def test_the_tenants_queued_quota_counts_every_recipient_and_comes_first() -> None:
    quota = AdmissionBound(capacity=1, queued=3)
    members = [
        (0, "bob", "alice", quota),  # 2 stored elsewhere + this: 3
        (1, "erin", "alice", AdmissionBound()),  # held to nothing, admitted: it counts
        (2, "carol", "alice", quota),  # the quota (4 of 3) before carol's capacity
    ]
    refused = exceeding(members, {"carol": 1}, {}, tenant_queued=2)
    assert refused == {2: ("queued_messages", 4, 3)}
