"""The handoff machine (RFC 17.6): the table over every (state, input) pair, each transition's
record and effects, context access, refusals, proto numbers and the diagram."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.handoff import (
    COORDINATOR,
    OPEN_ROW,
    PROTO_NUMBERS,
    HandoffEffect,
    HandoffInput,
    HandoffMachine,
    HandoffState,
    HandoffStep,
    check_read,
    from_proto,
    may_read,
    mermaid,
    parse_state,
    refusal,
    to_proto,
)
from apiary.core.handoff_request import HandoffDraft, HandoffPolicy, validate_draft
from apiary.core.machine import IllegalTransitionError
from apiary.core.records import HandoffRecord
from apiary.errors import (
    AlreadyCompletedError,
    ApiaryError,
    DeadlineExceededError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.wire import pb

T0 = 1_754_000_000.0
F = HandoffEffect
S = HandoffState
I = HandoffInput  # noqa: E741 - the table's own letter
DRAFT = HandoffDraft(
    request_id="h-1",
    from_agent="alice",
    to_agent="bob",
    reason="needs a security review",
    context_snapshot=b'{"files": ["a.py"], "done": 2}',
    snapshot_content_type="application/json",
    capabilities_required=("security-review",),
    priority=-2,
    timeout_s=30.0,
)


def opened(**changes: object) -> HandoffRecord:
    draft = validate_draft(replace(DRAFT, **changes), HandoffPolicy())  # type: ignore[arg-type]
    return HandoffMachine.open(draft, to_agent=draft.to_agent or "bob", now=T0).record


APPLY: dict[HandoffInput, Callable[[HandoffRecord], HandoffStep]] = {
    I.ACCEPT: lambda r: HandoffMachine.accept(r, by=r.to_agent, now=T0 + 1),
    I.REJECT: lambda r: HandoffMachine.reject(r, by=r.to_agent, reason="busy", now=T0 + 1),
    I.EXPIRE: lambda r: HandoffMachine.expire(r, now=max(r.deadline, T0 + 30)),
    I.REROUTE: lambda r: HandoffMachine.reroute(r, to_agent="carol", now=T0 + 40, max_attempts=3),
    I.COMPLETE: lambda r: HandoffMachine.complete(r, by=r.from_agent, now=T0 + 2),
}
INTO: dict[HandoffState, Callable[[], HandoffRecord]] = {
    S.PENDING: opened,
    S.ACCEPTED: lambda: APPLY[I.ACCEPT](opened()).record,
    S.REJECTED: lambda: APPLY[I.REJECT](opened()).record,
    S.EXPIRED: lambda: APPLY[I.EXPIRE](opened()).record,
    S.COMPLETED: lambda: APPLY[I.COMPLETE](INTO[S.ACCEPTED]()).record,
}


# --- the table -------------------------------------------------------------------------------


@pytest.mark.conformance("handoff.states")
@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, I)))
def test_every_pair_applies_its_row_or_is_illegal(state: HandoffState, event: I) -> None:
    record = INTO[state]()
    assert record.state == state
    if HandoffMachine.allows(state, event):
        step = APPLY[event](record)
        row = HandoffMachine.row(state, event)
        assert step.record.state == row.state
        assert step.effects == row.effects
        assert step.event is not None
        assert step.event[0] == row.event_type
        assert (step.event[1]["from_state"], step.event[1]["to_state"]) == (state, row.state)
    else:
        before = replace(record)
        with pytest.raises(IllegalTransitionError) as caught:
            APPLY[event](record)
        assert (caught.value.state, caught.value.event) == (state, event)
        assert record == before


def test_the_table_has_exactly_the_rows_of_the_lifecycle() -> None:
    rows = {
        (state, event): row.state
        for state, by_input in HandoffMachine.TABLE.items()
        for event, row in by_input.items()
    }
    assert rows == {
        (S.PENDING, I.ACCEPT): S.ACCEPTED,
        (S.PENDING, I.REJECT): S.REJECTED,
        (S.PENDING, I.EXPIRE): S.EXPIRED,
        (S.ACCEPTED, I.COMPLETE): S.COMPLETED,
        (S.REJECTED, I.REROUTE): S.PENDING,
        (S.EXPIRED, I.REROUTE): S.PENDING,
    }
    assert set(HandoffMachine.TABLE) == set(S)
    assert HandoffMachine.TABLE[S.COMPLETED] == {}


def test_every_row_persists_and_emits_and_timers_follow_pending() -> None:
    for state, by_input in HandoffMachine.TABLE.items():
        for event, row in by_input.items():
            assert row.effects[0] is F.PERSIST, (state, event)
            assert F.EMIT_EVENT in row.effects
            entering = row.state is S.PENDING
            assert (F.START_TIMER in row.effects) is entering
            # Leaving PENDING by an answer cancels the timer; expiry is the timer itself.
            assert (F.CANCEL_TIMER in row.effects) is (event in (I.ACCEPT, I.REJECT))
            # Whoever leaves the context loses access to it; rerouting is offered from the
            # two outcomes that leave the work without an owner.
            assert (F.REVOKE_CONTEXT in row.effects) is (event in (I.REJECT, I.EXPIRE, I.COMPLETE))
            assert (F.REROUTE in row.effects) is (event in (I.REJECT, I.EXPIRE))


def test_the_origin_hears_every_outcome_and_the_target_every_offer() -> None:
    assert F.NOTIFY_TARGET in OPEN_ROW.effects and F.NOTIFY_ORIGIN in OPEN_ROW.effects
    for by_input in HandoffMachine.TABLE.values():
        for event, row in by_input.items():
            assert F.NOTIFY_ORIGIN in row.effects, event
            told_target = event in (I.EXPIRE, I.REROUTE, I.COMPLETE)
            assert (F.NOTIFY_TARGET in row.effects) is told_target, event


def test_open_and_final_states() -> None:
    assert {s for s in S if s.open} == {S.PENDING, S.ACCEPTED}
    assert OPEN_ROW.state is S.PENDING


# --- transitions ------------------------------------------------------------------------------


def test_a_request_opens_pending_for_its_target_with_the_origin_and_target_as_holders() -> None:
    draft = validate_draft(DRAFT, HandoffPolicy())
    step = HandoffMachine.open(draft, to_agent="bob", now=T0)
    record = step.record
    assert record.state == S.PENDING
    assert (record.from_agent, record.to_agent, record.requested_to) == ("alice", "bob", "bob")
    assert (record.deadline, record.timeout_s) == (T0 + 30, 30.0)
    assert (record.attempt, record.tried) == (1, ("bob",))
    assert record.context_holders == ("alice", "bob")
    assert record.capabilities_required == ("security-review",)
    # No actor: the origin gets its confirmation (C.11: "request_id (PENDING)").
    assert (step.effects, step.target, step.actor) == (OPEN_ROW.effects, "bob", "")
    assert step.event is not None
    kind, details = step.event
    assert kind == "handoff.requested"
    assert details["from_state"] is None and details["to_state"] == "PENDING"
    assert details["snapshot_size"] == len(DRAFT.context_snapshot)
    assert details["snapshot_content_type"] == "application/json"
    assert details["deadline"] == T0 + 30


def test_capability_routed_requests_remember_they_named_no_target() -> None:
    draft = validate_draft(replace(DRAFT, to_agent=""), HandoffPolicy())
    record = HandoffMachine.open(draft, to_agent="carol", now=T0).record
    assert (record.requested_to, record.to_agent) == ("", "carol")
    with pytest.raises(ValidationError) as caught:
        HandoffMachine.open(draft, to_agent="alice", now=T0)
    assert caught.value.details["field"] == "to_agent"


def test_accept_records_the_accepting_agent_and_keeps_both_holders() -> None:
    step = HandoffMachine.accept(opened(), by="bob", now=T0 + 5)
    assert step.record.state == S.ACCEPTED
    assert step.record.accepting_agent == "bob"
    assert step.record.context_holders == ("alice", "bob")
    assert step.revoked == ()


def test_reject_needs_a_reason_and_revokes_the_rejecting_target() -> None:
    with pytest.raises(ValidationError) as caught:
        HandoffMachine.reject(opened(), by="bob", reason="  ", now=T0 + 1)
    assert caught.value.details["field"] == "rejection_reason"
    step = HandoffMachine.reject(opened(), by="bob", reason="no capacity", now=T0 + 1)
    assert step.record.rejection_reason == "no capacity"
    assert step.record.context_holders == ("alice",)
    assert step.revoked == ("bob",)
    assert step.event is not None and step.event[1]["why"] == "no capacity"


@pytest.mark.parametrize("event", [I.ACCEPT, I.REJECT])
def test_only_the_target_answers(event: HandoffInput) -> None:
    record = opened()
    with pytest.raises(PermissionDeniedError) as caught:
        if event is I.ACCEPT:
            HandoffMachine.accept(record, by="mallory", now=T0 + 1)
        else:
            HandoffMachine.reject(record, by="alice", reason="mine", now=T0 + 1)
    assert caught.value.details["field"] == "accepting_agent"


@pytest.mark.parametrize("event", [I.ACCEPT, I.REJECT])
def test_an_answer_at_the_deadline_is_refused_even_before_the_timer_fires(
    event: HandoffInput,
) -> None:
    record = opened()
    with pytest.raises(DeadlineExceededError):
        if event is I.ACCEPT:
            HandoffMachine.accept(record, by="bob", now=record.deadline)
        else:
            HandoffMachine.reject(record, by="bob", reason="late", now=record.deadline)


def test_an_early_expiry_timer_changes_nothing_and_rearms() -> None:
    record = opened()
    step = HandoffMachine.expire(record, now=record.deadline - 0.001)
    assert step.record == record
    assert step.effects == (F.START_TIMER,)
    assert step.event is None


def test_expiry_revokes_the_silent_target_and_tells_it() -> None:
    record = opened()
    step = HandoffMachine.expire(record, now=record.deadline)
    assert step.record.state == S.EXPIRED
    assert step.revoked == ("bob",)
    assert step.target == "bob"
    assert step.actor == ""
    assert step.event is not None and step.event[1]["by"] == COORDINATOR


def test_reroute_is_the_next_attempt_of_the_same_handoff() -> None:
    rejected = HandoffMachine.reject(opened(), by="bob", reason="busy", now=T0 + 1).record
    step = HandoffMachine.reroute(rejected, to_agent="carol", now=T0 + 2, max_attempts=3)
    record = step.record
    assert record.request_id == "h-1"
    assert record.state == S.PENDING
    assert (record.to_agent, record.attempt, record.tried) == ("carol", 2, ("bob", "carol"))
    assert record.deadline == T0 + 2 + 30
    assert record.context_holders == ("alice", "carol")
    assert record.rejection_reason == ""
    assert step.target == "carol"
    assert step.event is not None and step.event[1]["previous_agent"] == "bob"


def test_reroute_never_offers_twice_nor_past_the_attempt_budget() -> None:
    rejected = HandoffMachine.reject(opened(), by="bob", reason="busy", now=T0 + 1).record
    for again in ("bob", "alice", ""):
        with pytest.raises(ValidationError):
            HandoffMachine.reroute(rejected, to_agent=again, now=T0 + 2, max_attempts=3)
    with pytest.raises(ValidationError, match="no attempts left"):
        HandoffMachine.reroute(rejected, to_agent="carol", now=T0 + 2, max_attempts=1)


@pytest.mark.conformance("handoff.context.no-continue-after", "patterns.handoff.no-continue-after")
def test_completion_leaves_the_context_to_the_receiving_agent_alone() -> None:
    accepted = INTO[S.ACCEPTED]()
    assert may_read(accepted, "alice") and may_read(accepted, "bob")
    step = HandoffMachine.complete(accepted, by="alice", now=T0 + 3)
    record = step.record
    assert record.state == S.COMPLETED
    assert record.context_holders == ("bob",)
    assert step.revoked == ("alice",)
    assert F.REVOKE_CONTEXT in step.effects
    assert not may_read(record, "alice")
    with pytest.raises(PermissionDeniedError, match="transferred to bob"):
        check_read(record, "alice")
    check_read(record, "bob")


def test_the_receiving_agent_may_complete_but_nobody_else() -> None:
    accepted = INTO[S.ACCEPTED]()
    assert HandoffMachine.complete(accepted, by="bob", now=T0 + 3).record.state == S.COMPLETED
    with pytest.raises(PermissionDeniedError):
        HandoffMachine.complete(accepted, by="carol", now=T0 + 3)


def test_reading_needs_a_named_holder() -> None:
    record = opened()
    for reader in ("", "carol"):
        assert not may_read(record, reader)
        with pytest.raises(PermissionDeniedError):
            check_read(record, reader)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, I)))
def test_every_illegal_pair_has_a_specific_refusal(state: HandoffState, event: I) -> None:
    if HandoffMachine.allows(state, event):
        return
    record = INTO[state]()
    with pytest.raises(IllegalTransitionError) as caught:
        APPLY[event](record)
    error = refusal(caught.value, record)
    assert isinstance(error, ApiaryError)
    assert error.details["request_id"] == "h-1"
    expected: type[ApiaryError] = AlreadyCompletedError
    if state is S.EXPIRED:
        expected = DeadlineExceededError
    elif state is S.PENDING:
        expected = ValidationError
    assert type(error) is expected, (state, event, error)
    assert state.value in error.details["state"]


# --- names and numbers -------------------------------------------------------------------------


def test_states_carry_the_handoff_status_numbers() -> None:
    enum = pb.handoff_pb2.HandoffStatus
    for state in S:
        assert to_proto(state) == enum.Value(state.value) == PROTO_NUMBERS[state]
        assert from_proto(enum.Value(state.value)) is state
    with pytest.raises(ValidationError):
        from_proto(0)
    with pytest.raises(ValidationError):
        from_proto(6)


@given(st.sampled_from(list(S)), st.sampled_from([str.lower, str.upper, str.title]))
def test_states_parse_in_any_case_or_by_number(
    state: HandoffState, fold: Callable[[str], str]
) -> None:
    assert parse_state(fold(state.value)) is state
    assert parse_state(f"  {state.value} ") is state
    assert parse_state(to_proto(state)) is state


@pytest.mark.parametrize("bad", ["", "DONE", True, None, 9])
def test_unknown_states_name_the_field(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_state(bad, "statuses")
    assert caught.value.details["field"] == "statuses"


def test_mermaid_lists_every_row_and_the_final_states() -> None:
    text = mermaid()
    assert text.startswith("stateDiagram-v2\n    [*] --> PENDING: REQUEST\n")
    for state, by_input in HandoffMachine.TABLE.items():
        for event, row in by_input.items():
            assert f"    {state} --> {row.state}: {event}\n" in text
    for state in (S.REJECTED, S.EXPIRED, S.COMPLETED):
        assert f"    {state} --> [*]\n" in text
    assert "PENDING --> [*]" not in text and "ACCEPTED --> [*]" not in text
