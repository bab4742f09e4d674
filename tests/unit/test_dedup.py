"""Idempotency decisions (RFC 11.2) and late-ACK reconciliation of the cache (RFC 11.1)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.dedup import (
    DUPLICATE_DETECTED,
    DedupDecision,
    DedupKind,
    attempt,
    decide,
    duplicate_payload,
    iso_utc,
    progress,
    start,
    unchanged,
)
from apiary.core.records import IdempotencyRecord, MessageState

S = MessageState
TOKEN = "agent1:create:0123456789abcdef"
M1, M2, M3 = "m1", "m2", "m3"
T0 = 1_754_661_790.0  # 2025-08-08T14:03:10Z
NEW = DedupDecision(DedupKind.NEW)


def fresh(now: float = T0) -> IdempotencyRecord:
    return start(TOKEN, "agent1", M1, now)


def timed_out(record: IdempotencyRecord, now: float) -> IdempotencyRecord:
    return progress(record, record.current_message_id, S.TIMED_OUT, now)


# --- start / decide ---------------------------------------------------------------------------


def test_start_records_the_first_attempt_received() -> None:
    record = fresh()
    assert record == IdempotencyRecord(
        token=TOKEN,
        producer_id="agent1",
        original_message_id=M1,
        current_message_id=M1,
        status="RECEIVED",
        created_at=T0,
        updated_at=T0,
        attempts=(M1,),
    )


@pytest.mark.parametrize(
    ("token", "producer", "message_id"), [("", "p", "m"), ("t", "", "m"), ("t", "p", "")]
)
def test_start_needs_every_id(token: str, producer: str, message_id: str) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        start(token, producer, message_id, T0)


@pytest.mark.parametrize("now", [math.nan, math.inf, -1.0])
def test_times_must_be_finite(now: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        start(TOKEN, "agent1", M1, now)
    with pytest.raises(ValueError, match="finite"):
        progress(fresh(), M1, S.READ, now)


def test_no_record_is_new() -> None:
    assert decide(None, T0) == NEW


@pytest.mark.parametrize("status", [S.SENT, S.RECEIVED, S.READ, S.RETRYING])
def test_non_terminal_is_in_progress(status: MessageState) -> None:
    record = dataclasses.replace(fresh(), status=status.value)
    assert decide(record, T0 + 1) == DedupDecision(DedupKind.IN_PROGRESS)


def test_timed_out_without_outcome_is_retry() -> None:
    assert decide(timed_out(fresh(), T0 + 10), T0 + 11) == DedupDecision(DedupKind.RETRY)


@pytest.mark.parametrize("outcome", [S.FULFILLED, S.REJECTED, S.FAILED])
def test_cached_outcome_is_duplicate(outcome: MessageState) -> None:
    record = progress(fresh(), M1, outcome, T0 + 2, error_code="e", result='{"id":7}')
    assert decide(record, T0 + 3) == DedupDecision(
        DedupKind.DUPLICATE,
        original_message_id=M1,
        status=outcome.value,
        result='{"id":7}',
        error_code="e",
        cached_at=T0 + 2,
    )


def test_outcomes_are_kept_for_the_window_inclusive() -> None:
    record = progress(fresh(), M1, S.FULFILLED, T0 + 5)
    assert decide(record, T0 + 5 + 3600).kind is DedupKind.DUPLICATE
    assert decide(record, T0 + 5 + 3600.001) == NEW
    assert decide(record, T0 + 5 + 60, window_s=60).kind is DedupKind.DUPLICATE
    assert decide(record, T0 + 5 + 61, window_s=60) == NEW


def test_a_silent_operation_goes_stale_after_the_window() -> None:
    record = dataclasses.replace(fresh(), updated_at=T0 + 100)
    assert decide(record, T0 + 100 + 3600).kind is DedupKind.IN_PROGRESS
    assert decide(record, T0 + 100 + 3601) == NEW
    assert decide(timed_out(fresh(), T0 + 1), T0 + 3602) == NEW


def test_bad_window_raises() -> None:
    with pytest.raises(ValueError, match="window"):
        decide(fresh(), T0, window_s=0)


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "DONE"},
        {"status": "RECEIVED", "outcome_at": T0},
        {"status": "TIMED_OUT", "outcome_at": T0},
        {"status": "FULFILLED"},
    ],
)
def test_inconsistent_records_raise(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        decide(dataclasses.replace(fresh(), **changes), T0)  # type: ignore[arg-type]


# --- attempts ---------------------------------------------------------------------------------


def test_attempt_after_timeout() -> None:
    record = attempt(timed_out(fresh(), T0 + 10), M2, T0 + 11)
    assert record.attempts == (M1, M2)
    assert record.current_message_id == M2
    assert record.original_message_id == M1
    assert record.status == "RECEIVED"
    assert record.updated_at == T0 + 11
    assert decide(record, T0 + 12).kind is DedupKind.IN_PROGRESS


def test_attempt_while_retrying() -> None:
    record = progress(timed_out(fresh(), T0 + 10), M1, S.RETRYING, T0 + 10)
    assert record.status == "RETRYING"
    assert attempt(record, M2, T0 + 11).current_message_id == M2


@pytest.mark.parametrize("status", ["RECEIVED", "READ", "SENT"])
def test_no_attempt_while_in_progress(status: str) -> None:
    with pytest.raises(ValueError, match="no retry"):
        attempt(dataclasses.replace(fresh(), status=status), M2, T0)


def test_no_attempt_after_an_outcome() -> None:
    record = progress(fresh(), M1, S.FAILED, T0 + 1)
    with pytest.raises(ValueError, match="cached outcome"):
        attempt(record, M2, T0 + 2)


def test_attempt_ids_are_new_and_present() -> None:
    record = timed_out(fresh(), T0 + 10)
    with pytest.raises(ValueError, match="already an attempt"):
        attempt(record, M1, T0 + 11)
    with pytest.raises(ValueError, match="must not be empty"):
        attempt(record, "", T0 + 11)


# --- progress ---------------------------------------------------------------------------------


def test_progress_for_an_unknown_attempt_raises() -> None:
    with pytest.raises(ValueError, match="not an attempt"):
        progress(fresh(), M2, S.FULFILLED, T0)


def test_progress_moves_forward_only() -> None:
    record = progress(fresh(), M1, S.READ, T0 + 1)
    assert (record.status, record.updated_at) == ("READ", T0 + 1)
    assert progress(record, M1, S.RECEIVED, T0 + 2) is record
    assert progress(record, M1, S.SENT, T0 + 2) is record


def test_late_ack_does_not_revive_a_timed_out_attempt() -> None:
    # RFC 11.1 rule 1: recorded (by the caller) but the terminal state stays.
    record = timed_out(fresh(), T0 + 10)
    for state in (S.RECEIVED, S.READ, S.SENT):
        assert progress(record, M1, state, T0 + 12) is record
    assert decide(record, T0 + 13).kind is DedupKind.RETRY


def test_timeout_of_a_stale_attempt_changes_nothing() -> None:
    record = attempt(timed_out(fresh(), T0 + 10), M2, T0 + 11)
    assert progress(record, M1, S.TIMED_OUT, T0 + 20) is record
    assert progress(record, M1, S.READ, T0 + 20) is record


def test_nothing_but_a_better_outcome_changes_a_cached_one() -> None:
    record = progress(fresh(), M1, S.FULFILLED, T0 + 1, result="r")
    for state in (S.TIMED_OUT, S.RETRYING, S.READ, S.REJECTED, S.FAILED, S.FULFILLED):
        assert progress(record, M1, state, T0 + 2) is record


# --- RFC 11.1 rule 4: earliest successful completion ------------------------------------------


def two_attempts() -> IdempotencyRecord:
    return attempt(timed_out(fresh(), T0 + 10), M2, T0 + 11)


def test_fulfilled_replaces_an_error() -> None:
    record = progress(two_attempts(), M2, S.REJECTED, T0 + 12, error_code="validation_error")
    assert (record.original_message_id, record.status) == (M2, "REJECTED")
    record = progress(record, M1, S.FULFILLED, T0 + 13, result="ok")
    assert (record.original_message_id, record.status, record.result) == (M1, "FULFILLED", "ok")
    assert (record.error_code, record.outcome_at) == ("", T0 + 13)


def test_later_fulfilled_replaces_an_earlier_error() -> None:
    record = progress(two_attempts(), M1, S.FAILED, T0 + 12, error_code="internal_error")
    record = progress(record, M2, S.FULFILLED, T0 + 13)
    assert (record.original_message_id, record.status) == (M2, "FULFILLED")


def test_earlier_attempt_wins_between_two_fulfilled() -> None:
    record = progress(two_attempts(), M2, S.FULFILLED, T0 + 12, result="two")
    record = progress(record, M1, S.FULFILLED, T0 + 13, result="one")
    assert (record.original_message_id, record.result, record.outcome_at) == (M1, "one", T0 + 13)
    assert progress(record, M2, S.FULFILLED, T0 + 14) is record


def test_the_first_error_stays_against_later_errors() -> None:
    record = progress(two_attempts(), M2, S.REJECTED, T0 + 12, error_code="a")
    assert progress(record, M1, S.FAILED, T0 + 13, error_code="b") is record


outcome_states = st.sampled_from([S.FULFILLED, S.REJECTED, S.FAILED])


@given(
    n=st.integers(1, 5),
    events=st.lists(st.tuples(st.integers(0, 4), outcome_states), min_size=1, max_size=12),
)
def test_cache_reflects_the_earliest_success_else_the_first_outcome(
    n: int, events: list[tuple[int, MessageState]]
) -> None:
    ids = [f"m{i}" for i in range(n)]
    record = start(TOKEN, "agent1", ids[0], T0)
    for i, message_id in enumerate(ids[1:], start=1):
        record = attempt(timed_out(record, T0 + i), message_id, T0 + i)
    arrived = [(ids[i % n], state) for i, state in events]
    for k, (message_id, state) in enumerate(arrived):
        record = progress(record, message_id, state, T0 + 100 + k)
    successes = [ids.index(m) for m, s in arrived if s is S.FULFILLED]
    if successes:
        expected = (ids[min(successes)], "FULFILLED")
    else:
        expected = (arrived[0][0], arrived[0][1].value)
    assert (record.original_message_id, record.status) == expected
    assert decide(record, T0 + 200).kind is DedupKind.DUPLICATE


# --- the RFC's Appendix C.2 flow --------------------------------------------------------------


def test_appendix_c2_timeout_retry_late_ack_reconcile() -> None:
    # A->S DATA(m1, token T); no RECEIVED within 10 s: NACK ack_timeout.
    assert decide(None, T0) == NEW
    record = start(TOKEN, "agent1", M1, T0)
    record = timed_out(record, T0 + 10)
    # A->S DATA(m2, token T, retry_count=1): a new attempt of the same operation.
    assert decide(record, T0 + 11) == DedupDecision(DedupKind.RETRY)
    record = attempt(record, M2, T0 + 11)
    # B acknowledges m1 late (RECEIVED, then FULFILLED): the cache is reconciled to m1.
    record = progress(record, M1, S.RECEIVED, T0 + 11.5)
    assert decide(record, T0 + 11.6).kind is DedupKind.IN_PROGRESS
    record = progress(record, M1, S.FULFILLED, T0 + 12, result='{"user":"alice"}')
    # m2's own outcome (the agent deduplicated it) does not displace the earlier success.
    record = progress(record, M2, S.FULFILLED, T0 + 12.5)
    # A third arrival with token T: DUPLICATE_DETECTED naming m1.
    decision = decide(record, T0 + 13)
    assert decision == DedupDecision(
        DedupKind.DUPLICATE,
        original_message_id=M1,
        status="FULFILLED",
        result='{"user":"alice"}',
        cached_at=T0 + 12,
    )
    assert duplicate_payload(record) == {
        "status": DUPLICATE_DETECTED,
        "original_message_id": M1,
        "original_status": "FULFILLED",
        "cached_at": "2025-08-08T14:03:22Z",
        "result": '{"user":"alice"}',
        "error_code": "",
    }


# --- the DUPLICATE_DETECTED payload -----------------------------------------------------------


def test_duplicate_payload_carries_the_cached_error() -> None:
    record = progress(fresh(), M1, S.REJECTED, T0 + 12.25, error_code="permission_denied")
    payload = duplicate_payload(record)
    assert payload["original_status"] == "REJECTED"
    assert payload["error_code"] == "permission_denied"
    assert payload["cached_at"] == "2025-08-08T14:03:22.250Z"


def test_duplicate_payload_needs_an_outcome() -> None:
    with pytest.raises(ValueError, match="no cached outcome"):
        duplicate_payload(timed_out(fresh(), T0 + 10))


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "1970-01-01T00:00:00Z"),
        (1.001, "1970-01-01T00:00:01.001Z"),
        (1.9996, "1970-01-01T00:00:02Z"),
        (T0 + 12, "2025-08-08T14:03:22Z"),
    ],
)
def test_iso_utc(seconds: float, text: str) -> None:
    assert iso_utc(seconds) == text


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_iso_utc_refuses_bad_times(seconds: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        iso_utc(seconds)


# --- unchanged (the store's test before it writes an admission's record) ---------------------


def test_an_admission_writes_over_the_record_it_found_or_none() -> None:
    found = timed_out(fresh(), T0 + 1)
    assert unchanged(None, None) and unchanged(None, found)  # none stored (or purged)
    assert unchanged(found, found)
    assert not unchanged(fresh(), None)  # another admission inserted it first
    retried = attempt(found, M2, T0 + 2)  # another replica's retry came first
    assert not unchanged(retried, found)
    assert not unchanged(progress(found, M1, S.FULFILLED, T0 + 3), found)  # a late outcome
