"""The HITL invocation machine (RFC 15): the table over every (state, input) pair, each
decision, authorization, deadlines, the unavailable and absent policies, cancel."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.hitl import machine as hitl
from apiary.core.hitl.machine import (
    DECISION_KEYS,
    OPEN_ROW,
    HitlMachine,
    HitlStep,
    mermaid,
    original_window,
)
from apiary.core.hitl.payloads import decision_payload
from apiary.core.hitl.policy import HitlPolicy
from apiary.core.hitl.vocabulary import (
    HitlInput,
    HitlState,
    TimeoutAction,
    UnavailablePolicy,
)
from apiary.core.machine import IllegalTransitionError
from apiary.core.records import HitlRecord
from apiary.errors import (
    ApiaryError,
    DeadlineExceededError,
    ValidationError,
)
from tests.unit.hitl_fixtures import APPLY, EXTEND, INTO, POLICY, THRESHOLD, F, decide, opened

T0 = 1_754_000_000.0  # 2025-07-31T22:13:20Z

# --- the table -------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "event"), list(itertools.product(HitlState, HitlInput)))
def test_every_pair_applies_its_row_or_is_illegal(state: HitlState, event: HitlInput) -> None:
    record = INTO[state]()
    assert record.state == state
    if HitlMachine.allows(state, event):
        step = APPLY[event](record)
        row = HitlMachine.row(state, event)
        assert step.record.state == row.state
        assert step.effects == row.effects
        assert step.event is not None and step.event[0] == row.event_type
    else:
        before = replace(record)
        with pytest.raises(IllegalTransitionError) as caught:
            APPLY[event](record)
        assert (caught.value.state, caught.value.event) == (state, event)
        assert record == before


def test_pending_takes_every_input_and_terminal_states_none() -> None:
    assert all(HitlMachine.allows(HitlState.PENDING, e) for e in HitlInput)
    for state in HitlState:
        assert state.terminal is (state is not HitlState.PENDING)
        if state.terminal:
            assert HitlMachine.TABLE[state] == {}


def test_every_row_persists_and_emits_and_terminal_rows_resolve() -> None:
    for event, row in HitlMachine.TABLE[HitlState.PENDING].items():
        assert row.effects[0] is F.PERSIST and F.EMIT_EVENT in row.effects, event
        assert (F.RESOLVE in row.effects) is row.state.terminal
        assert (F.START_TIMER in row.effects) is (row.state is HitlState.PENDING)


def test_mermaid_lists_every_row() -> None:
    text = mermaid()
    assert text.startswith("stateDiagram-v2\n    [*] --> PENDING: OPEN\n")
    for event, row in HitlMachine.TABLE[HitlState.PENDING].items():
        assert f"    PENDING --> {row.state}: {event}\n" in text
    for state in HitlState:
        assert (f"    {state} --> [*]" in text) is state.terminal


# --- opening ---------------------------------------------------------------------------------


def test_open_validates_and_fills_defaults() -> None:
    step = HitlMachine.open(
        invocation_id="hitl-9",
        reason_type="debate_deadlock",
        requested_by="negotiation",
        now=T0,
        policy=POLICY,
        suggested_action="APPROVE",
        proposed_actions=["approve", "deny", "approve"],
    )
    record = step.record
    assert record.state == HitlState.PENDING
    assert record.reason_type == "DEBATE_DEADLOCK"
    assert record.deadline == T0 + 300
    assert record.suggested_action == "approve"
    assert record.proposed_actions == ("approve", "deny")
    assert record.timeout_action == "DENY"
    assert step.effects == OPEN_ROW.effects
    assert step.event is not None
    event_type, details = step.event
    assert event_type == "hitl.opened"
    assert (details["by"], details["at"], details["why"]) == ("negotiation", T0, "DEBATE_DEADLOCK")
    assert (details["invocation_id"], details["to_state"]) == ("hitl-9", "PENDING")
    assert "correlation_id" not in details


def test_open_takes_an_explicit_deadline_and_timeout_action() -> None:
    record = opened(deadline=T0 + 5, timeout_action="auto-resolve")
    assert (record.deadline, record.timeout_action) == (T0 + 5, "AUTO_RESOLVE")
    assert original_window(record) == 5
    assert opened(timeout_s=30).deadline == T0 + 30


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"reason_type": "PANIC"}, "reason_type"),
        ({"deadline": T0}, "deadline"),
        ({"deadline": T0 - 1}, "deadline"),
        ({"deadline": math.nan}, "deadline"),
        ({"timeout_s": 0}, "deadline"),
        ({"timeout_s": 5, "deadline": T0 + 5}, "deadline"),
        ({"invocation_id": ""}, "invocation_id"),
        ({"requested_by": " "}, "requested_by"),
        ({"suggested_action": "defer"}, "suggested_action"),
        ({"suggested_action": "maybe"}, "suggested_action"),
        ({"proposed_actions": ["ok", 3]}, "proposed_actions"),
        ({"proposed_actions": "approve"}, "proposed_actions"),
        ({"approver_roles": [""]}, "approver_roles"),
        ({"context": {"x": object()}}, "context"),
        ({"context": {"x": math.inf}}, "context"),
        ({"subject": ["not", "an", "object"]}, "subject"),
        ({"priority": "high"}, "priority"),
        ({"timeout_action": "APPROVE"}, "timeout_action"),
    ],
)
def test_open_rejects_bad_fields(fields: dict[str, Any], bad: str) -> None:
    args: dict[str, Any] = {
        "invocation_id": "hitl-1",
        "reason_type": "CONFLICT",
        "requested_by": "agent-a",
        "now": T0,
        "policy": POLICY,
        **fields,
    }
    with pytest.raises(ValidationError) as caught:
        HitlMachine.open(**args)
    assert caught.value.details["field"] == bad


# --- operator decisions ----------------------------------------------------------------------


@pytest.mark.parametrize("action", ["approve", "deny"])
def test_approve_and_deny_decide(action: str) -> None:
    record = opened()
    step = decide(record, action)
    new = step.record
    assert new.state == HitlState.DECIDED
    assert new.updated_at == T0 + 10
    assert set(DECISION_KEYS) <= set(new.decision)
    assert new.decision["action"] == action
    assert new.decision["rationale"] == "Policy thresholds met; low risk"
    assert new.decision["decided_by"] == "alice"
    assert new.decision["decided_at"] == T0 + 10
    assert (new.decision["via"], new.decision["fallback"], new.decision["patch"]) == (
        "operator",
        False,
        None,
    )
    assert F.RESOLVE in step.effects and F.CANCEL_TIMER in step.effects
    assert step.event is not None
    event_type, details = step.event
    assert (event_type, details["by"], details["at"]) == ("hitl.decided", "alice", T0 + 10)
    assert details["invocation_id"] == "hitl-001"
    assert details["why"] == "Policy thresholds met; low risk"
    assert details["changes"]["decision"] == {"from": {}, "to": new.decision}
    assert (details["from_state"], details["to_state"]) == ("PENDING", "DECIDED")
    json.dumps(details)


def test_modify_carries_the_patch() -> None:
    patch = {"affected_files": ["/data/financial.xlsx"]}
    new = decide(opened(), "MODIFY", patch=patch).record
    assert new.decision["action"] == "modify"
    assert new.decision["patch"] == patch


@pytest.mark.parametrize(
    ("action", "patch"),
    [("modify", None), ("modify", ["not", "an", "object"]), ("modify", {"x": {1, 2}}),
     ("approve", {"x": 1}), ("defer", {"x": 1})],
)  # fmt: skip
def test_patch_rules(action: str, patch: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        decide(opened(), action, patch=patch)
    assert caught.value.details["field"] == "patch"


@pytest.mark.parametrize("rationale", ["", "   "])
def test_a_rationale_is_required(rationale: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decide(opened(), "approve", rationale=rationale)
    assert caught.value.details["field"] == "rationale"


def test_an_unknown_action_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as caught:
        decide(opened(), "escalate")
    assert caught.value.details["field"] == "action"


def test_no_decision_at_or_after_the_deadline() -> None:
    record = opened()
    with pytest.raises(DeadlineExceededError):
        decide(record, "approve", now=record.deadline)


# --- deferral --------------------------------------------------------------------------------


def test_defer_extends_by_the_original_window_and_stays_pending() -> None:
    record = opened()
    step = decide(record, "defer", rationale="need the DPO's view")
    new = step.record
    assert new.state == HitlState.PENDING
    assert (new.deadline, new.extensions, new.decision) == (T0 + 600, 1, {})
    assert step.effects == (F.PERSIST, F.START_TIMER, F.EMIT_EVENT)
    assert step.event is not None
    event_type, details = step.event
    assert (event_type, details["by"], details["why"]) == (
        "hitl.deferred",
        "alice",
        "need the DPO's view",
    )
    assert details["changes"] == {
        "deadline": {"from": T0 + 300, "to": T0 + 600},
        "extensions": {"from": 0, "to": 1},
    }
    again = decide(new, "defer", now=T0 + 400).record
    assert (again.deadline, original_window(again)) == (T0 + 900, 300)


def test_defer_uses_defer_s_and_stops_at_the_budget() -> None:
    policy = HitlPolicy(defer_s=60, max_extensions=2)
    record = opened()
    for n in (1, 2):
        record = decide(record, "defer", policy=policy).record
        assert (record.deadline, record.extensions) == (T0 + 300 + 60 * n, n)
    with pytest.raises(ValidationError) as caught:
        decide(record, "defer", policy=policy)
    assert caught.value.details["field"] == "action"


# --- deadline --------------------------------------------------------------------------------


def test_deadline_denies_by_default() -> None:
    record = opened(suggested_action="approve")
    step = HitlMachine.deadline_passed(record, POLICY, record.deadline)
    d = step.record.decision
    assert step.record.state == HitlState.TIMED_OUT
    assert (d["action"], d["via"], d["policy"], d["fallback"]) == ("deny", "deadline", "DENY", True)
    assert d["error_code"] == "deadline_exceeded"
    assert d["decided_by"] == hitl.SYSTEM_ACTOR and d["rationale"]
    assert F.NOTIFY_OPERATORS in step.effects and F.RESOLVE in step.effects


@pytest.mark.parametrize(
    ("suggested", "expected"), [("approve", "approve"), ("deny", "deny"), ("", "deny"),
                                ("modify", "deny")],
)  # fmt: skip
def test_auto_resolve_applies_the_suggestion(suggested: str, expected: str) -> None:
    policy = HitlPolicy(timeout_action=TimeoutAction.AUTO_RESOLVE)
    record = opened(policy, suggested_action=suggested)
    d = HitlMachine.deadline_passed(record, policy, record.deadline + 1).record.decision
    assert (d["action"], d["policy"], d["via"]) == (expected, "AUTO_RESOLVE", "deadline")
    assert d["error_code"] == (None if expected == "approve" else "deadline_exceeded")


def test_the_records_timeout_action_wins_over_the_policy() -> None:
    record = opened(suggested_action="approve", timeout_action=TimeoutAction.AUTO_RESOLVE)
    d = HitlMachine.deadline_passed(record, POLICY, record.deadline).record.decision
    assert (d["action"], d["policy"]) == ("approve", "AUTO_RESOLVE")
    legacy = replace(record, timeout_action="")
    d = HitlMachine.deadline_passed(legacy, POLICY, record.deadline).record.decision
    assert (d["action"], d["policy"]) == ("deny", "DENY")


def test_an_early_timer_rearms_and_changes_nothing() -> None:
    record = decide(opened(), "defer").record
    step = HitlMachine.deadline_passed(record, POLICY, T0 + 300)
    assert step == HitlStep(record, (F.START_TIMER,))


# --- HITL unavailable (RFC 15.4) -------------------------------------------------------------


def test_unavailable_denies_by_default() -> None:
    step = HitlMachine.unavailable(opened(), POLICY, T0 + 3)
    d = step.record.decision
    assert step.record.state == HitlState.FALLBACK_APPLIED
    assert (d["action"], d["error_code"], d["via"]) == ("deny", "hitl_unavailable", "unavailable")
    assert (d["policy"], d["applied"], d["fallback"], d["decided_at"]) == (
        "DENY_BY_DEFAULT",
        "DENY_BY_DEFAULT",
        True,
        T0 + 3,
    )
    assert F.NOTIFY_OPERATORS in step.effects
    assert step.event is not None and step.event[0] == "hitl.fallback"
    assert step.event[1]["by"] == hitl.SYSTEM_ACTOR


@pytest.mark.parametrize(
    ("score", "context_score", "suggested", "expected"),
    [
        (0.9, None, "", "approve"),
        (0.8, None, "approve", "approve"),
        (0.79, None, "approve", "deny"),
        (None, 0.95, "approve", "approve"),
        (None, "0.95", "approve", "deny"),
        (None, None, "approve", "deny"),
        (0.99, None, "deny", "deny"),
        (0.99, None, "modify", "deny"),
    ],
)
def test_auto_decide_threshold(
    score: float | None, context_score: Any, suggested: str, expected: str
) -> None:
    context = {} if context_score is None else {"score": context_score}
    record = opened(suggested_action=suggested, context=context)
    d = HitlMachine.unavailable(record, THRESHOLD, T0 + 3, score=score).record.decision
    assert (d["action"], d["policy"], d["via"], d["fallback"]) == (
        expected,
        "AUTO_DECIDE_THRESHOLD",
        "unavailable",
        True,
    )
    assert d["threshold"] == 0.8
    assert d["error_code"] == (None if expected == "approve" else "hitl_unavailable")


def test_a_bad_score_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as caught:
        HitlMachine.unavailable(opened(), THRESHOLD, T0, score=math.nan)
    assert caught.value.details["field"] == "score"


def test_extend_timeout_until_max_extensions_then_deny() -> None:
    record = opened()
    for n in (1, 2, 3):
        step = HitlMachine.unavailable(record, EXTEND, T0 + n)
        record = step.record
        assert record.state == HitlState.PENDING
        assert (record.deadline, record.extensions) == (T0 + 300 * (n + 1), n)
        assert F.START_TIMER in step.effects and F.NOTIFY_OPERATORS in step.effects
        assert step.event is not None and step.event[0] == "hitl.extended"
    step = HitlMachine.unavailable(record, EXTEND, T0 + 4)
    d = step.record.decision
    assert step.record.state == HitlState.FALLBACK_APPLIED
    assert (d["action"], d["policy"], d["applied"], d["error_code"]) == (
        "deny",
        "EXTEND_TIMEOUT",
        "DENY_BY_DEFAULT",
        "hitl_unavailable",
    )


def test_extend_timeout_uses_extend_s() -> None:
    policy = HitlPolicy(unavailable_policy=UnavailablePolicy.EXTEND_TIMEOUT, extend_s=5)
    assert HitlMachine.unavailable(opened(), policy, T0).record.deadline == T0 + 305


def test_deferrals_and_extensions_share_the_budget() -> None:
    record = opened()
    for _ in range(3):
        record = decide(record, "defer").record
    assert HitlMachine.unavailable(record, EXTEND, T0).record.state == HitlState.FALLBACK_APPLIED


# --- no HITL component (RFC 15.3) ------------------------------------------------------------


def test_absent_hitl_decides_right_after_open() -> None:
    policy = HitlPolicy(enabled=False)
    opening = HitlMachine.open(
        invocation_id="hitl-2", reason_type="TASK_ESCALATION", requested_by="s", now=T0,
        policy=policy,
    )  # fmt: skip
    assert opening.record.state == HitlState.PENDING
    step = HitlMachine.absent(opening.record, policy, T0)
    assert step.record.state == HitlState.FALLBACK_APPLIED
    assert step.event is not None and step.event[0] == "hitl.fallback"
    assert F.RESOLVE in step.effects and F.CANCEL_TIMER in step.effects
    d = step.record.decision
    assert (d["action"], d["via"], d["policy"], d["error_code"], d["decided_at"]) == (
        "deny",
        "absent",
        "DENY_BY_DEFAULT",
        "hitl_unavailable",
        T0,
    )
    assert "DENY_BY_DEFAULT" in d["rationale"]


@pytest.mark.parametrize(
    ("policy", "score", "expected"),
    [
        (UnavailablePolicy.EXTEND_TIMEOUT, None, ("deny", "DENY_BY_DEFAULT")),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.9, ("approve", "AUTO_DECIDE_THRESHOLD")),
        (UnavailablePolicy.AUTO_DECIDE_THRESHOLD, 0.1, ("deny", "AUTO_DECIDE_THRESHOLD")),
    ],
)
def test_absent_uses_the_unavailable_policy_without_waiting(
    policy: UnavailablePolicy, score: float | None, expected: tuple[str, str]
) -> None:
    chosen = HitlPolicy(unavailable_policy=policy, enabled=False)
    step = HitlMachine.absent(opened(), chosen, T0 + 1, score=score)
    d = step.record.decision
    assert step.record.state == HitlState.FALLBACK_APPLIED
    assert (d["action"], d["applied"], d["policy"], d["via"]) == (*expected, policy, "absent")


# --- cancel ----------------------------------------------------------------------------------


def test_cancel_fails_closed() -> None:
    step = HitlMachine.cancel(opened(), by="scheduler", reason="task cancelled", now=T0 + 2)
    d = step.record.decision
    assert step.record.state == HitlState.CANCELLED
    assert (d["action"], d["via"], d["decided_by"], d["rationale"], d["fallback"]) == (
        "deny",
        "cancelled",
        "scheduler",
        "task cancelled",
        False,
    )
    assert step.event is not None and step.event[1]["by"] == "scheduler"


@pytest.mark.parametrize(("by", "reason", "bad"), [("", "r", "by"), ("s", " ", "reason")])
def test_cancel_needs_who_and_why(by: str, reason: str, bad: str) -> None:
    with pytest.raises(ValidationError) as caught:
        HitlMachine.cancel(opened(), by=by, reason=reason, now=T0)
    assert caught.value.details["field"] == bad


# --- properties ------------------------------------------------------------------------------

OPERATIONS = st.sampled_from(
    ["approve", "deny", "modify", "defer", "intruder", "deadline", "unavailable", "absent",
     "cancel"]
)  # fmt: skip


def _apply(op: str, record: HitlRecord, policy: HitlPolicy, now: float) -> HitlStep:
    if op in {"approve", "deny", "defer"}:
        return decide(record, op, now=now, policy=policy)
    if op == "modify":
        return decide(record, op, now=now, policy=policy, patch={"x": 1})
    if op == "intruder":
        return decide(record, "approve", now=now, policy=policy, operator_roles={"guest"})
    if op == "deadline":
        return HitlMachine.deadline_passed(record, policy, now)
    if op == "unavailable":
        return HitlMachine.unavailable(record, policy, now, score=0.9)
    if op == "absent":
        return HitlMachine.absent(record, policy, now)
    return HitlMachine.cancel(record, by="s", reason="r", now=now)


@given(
    ops=st.lists(st.tuples(OPERATIONS, st.floats(0, 400)), max_size=25),
    unavailable=st.sampled_from(UnavailablePolicy),
    max_extensions=st.integers(0, 4),
    defer_s=st.one_of(st.none(), st.floats(1, 600)),
)
def test_terminal_records_never_change_and_extensions_stay_bounded(
    ops: list[tuple[str, float]],
    unavailable: UnavailablePolicy,
    max_extensions: int,
    defer_s: float | None,
) -> None:
    policy = HitlPolicy(
        unavailable_policy=unavailable, max_extensions=max_extensions, defer_s=defer_s
    )
    record, now = opened(policy), T0
    for op, dt in ops:
        now += dt
        before = record
        try:
            step = _apply(op, record, policy, now)
        except (IllegalTransitionError, ApiaryError):
            assert record == before
            continue
        if before.state != HitlState.PENDING:
            pytest.fail(f"{op} changed terminal record {before.state}")
        record = step.record
        assert record.extensions <= policy.max_extensions
        assert record.deadline >= before.deadline
        assert record.updated_at >= before.updated_at
        assert (record.state == HitlState.PENDING) is not bool(record.decision)
        if record.decision:
            assert set(DECISION_KEYS) <= set(record.decision)
            json.dumps(decision_payload(record))
