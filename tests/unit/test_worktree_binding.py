"""The worktree binding machine (RFC 16): the table over every (state, input) pair, the ten
16.2 transitions, the BIND_FAILED handling of 16.3 (reasons, backoff, recovery timeout), the
TTL of a non-home binding, and invariants over random sequences."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.core.machine import IllegalTransitionError
from apiary.core.worktrees.machine import (
    DEFAULT_POLICY,
    FAILURE_REASONS,
    RFC_16_3_ROWS,
    BindingEffect,
    BindingInput,
    BindingMachine,
    BindingPolicy,
    BindingStep,
    mermaid,
)
from apiary.core.worktrees.records import (
    BindingState,
    BindingTimer,
    Location,
    WorktreeBinding,
    is_bound,
    valid_id,
    working_location,
)
from apiary.errors import ValidationError

S = BindingState
I = BindingInput  # noqa: E741
F = BindingEffect
M = BindingMachine
T0 = 1_754_000_000.0
LATE = T0 + 100_000.0
"""After every deadline a fixture record has."""
HOME = Location("repo", "home")
OTHER = Location("repo", "other")
PAIRS = list(itertools.product(S, I))

# The whole table, written out from RFC 16.2 and 16.3 independently of the module.
EXPECTED = {
    # 16.2, the ten rows
    (S.UNBOUND, I.BIND_OK): S.BOUND_HOME,
    (S.UNBOUND, I.BIND_ERROR): S.BIND_FAILED,
    (S.BIND_FAILED, I.UNBIND): S.UNBOUND,
    (S.BIND_FAILED, I.BIND_OK): S.BOUND_HOME,
    (S.BOUND_HOME, I.SWITCH_REQUEST): S.SWITCH_PENDING,
    (S.SWITCH_PENDING, I.SWITCH_APPROVE): S.BOUND_NON_HOME,
    (S.SWITCH_PENDING, I.SWITCH_REJECT): S.BOUND_HOME,
    (S.BOUND_NON_HOME, I.TTL_EXPIRED): S.BOUND_HOME,
    (S.BOUND_NON_HOME, I.SWITCH_REVOKE): S.BOUND_HOME,
    (S.BOUND_HOME, I.UNBIND): S.UNBOUND,
    (S.BOUND_NON_HOME, I.UNBIND): S.UNBOUND,
    # 16.3: automatic retries, a new failing BIND, the recovery timeout
    (S.BIND_FAILED, I.RETRY_OK): S.BOUND_HOME,
    (S.BIND_FAILED, I.RETRY_ERROR): S.BIND_FAILED,
    (S.BIND_FAILED, I.BIND_ERROR): S.BIND_FAILED,
    (S.BIND_FAILED, I.RECOVERY_TIMEOUT): S.BIND_FAILED,
}

# RFC 16.2 table, row by row: (from, to, the trigger's inputs), and the manifest id.
RFC_16_2 = [
    (S.UNBOUND, S.BOUND_HOME, {I.BIND_OK}, "unbound-to-bound-home"),
    (S.UNBOUND, S.BIND_FAILED, {I.BIND_ERROR}, "unbound-to-bind-failed"),
    (S.BIND_FAILED, S.UNBOUND, {I.UNBIND}, "bind-failed-to-unbound"),
    (S.BIND_FAILED, S.BOUND_HOME, {I.BIND_OK, I.RETRY_OK}, "bind-failed-to-bound-home"),
    (S.BOUND_HOME, S.SWITCH_PENDING, {I.SWITCH_REQUEST}, "bound-home-to-switch-pending"),
    (S.SWITCH_PENDING, S.BOUND_NON_HOME, {I.SWITCH_APPROVE}, "switch-pending-to-bound-non-home"),
    (S.SWITCH_PENDING, S.BOUND_HOME, {I.SWITCH_REJECT}, "switch-pending-to-bound-home"),
    (
        S.BOUND_NON_HOME,
        S.BOUND_HOME,
        {I.TTL_EXPIRED, I.SWITCH_REVOKE},
        "bound-non-home-to-bound-home",
    ),
    (S.BOUND_HOME, S.UNBOUND, {I.UNBIND}, "bound-home-to-unbound"),
    (S.BOUND_NON_HOME, S.UNBOUND, {I.UNBIND}, "bound-non-home-to-unbound"),
]


def record_in(state: S) -> WorktreeBinding:
    """A realistic record of an agent in `state` (entered at T0, version 3)."""
    base = WorktreeBinding("agent-a", entered_at=T0, updated_at=T0, version=3)
    home = {"repo_id": "repo", "worktree_id": "home", "branch": "home"}
    at_home = {**home, "current_repo_id": "repo", "current_worktree_id": "home"}
    return {
        S.UNBOUND: base,
        S.BOUND_HOME: replace(base, state=S.BOUND_HOME.value, **at_home),
        S.SWITCH_PENDING: replace(
            base, state=S.SWITCH_PENDING.value, target_repo_id="repo",
            target_worktree_id="other", invocation_id="inv-1", **at_home,
        ),
        S.BOUND_NON_HOME: replace(
            base, state=S.BOUND_NON_HOME.value, current_repo_id="repo",
            current_worktree_id="other", expires_at=T0 + 900, **home,
        ),
        S.BIND_FAILED: replace(
            base, state=S.BIND_FAILED.value, reason="worktree_locked", attempts=1,
            retry_at=T0 + 1, recovery_at=T0 + 60, **home,
        ),
    }[state]  # fmt: skip


ARGS: dict[I, dict[str, Any]] = {
    I.BIND_OK: {"location": HOME},
    I.BIND_ERROR: {"location": HOME, "reason": "filesystem_error"},
    I.RETRY_ERROR: {"reason": "worktree_locked"},
    I.SWITCH_REQUEST: {"location": OTHER},
}


def step(record: WorktreeBinding, event: I, now: float = LATE, **kw: Any) -> BindingStep:
    return M.step(record, event, now, **{**ARGS.get(event, {}), **kw})


# --- the table ------------------------------------------------------------------------------


@pytest.mark.conformance("worktree.machine.five-states")
def test_the_five_states_with_unbound_initial() -> None:
    assert [s.value for s in S] == [
        "UNBOUND", "BOUND_HOME", "SWITCH_PENDING", "BOUND_NON_HOME", "BIND_FAILED",
    ]  # fmt: skip
    fresh = WorktreeBinding("agent-a")
    assert fresh.state == "UNBOUND"
    assert (fresh.home, fresh.current, fresh.target, fresh.version) == (None, None, None, 0)
    assert mermaid().startswith("stateDiagram-v2\n    [*] --> UNBOUND\n")


def test_the_table_is_exactly_16_2_plus_16_3() -> None:
    found = {(s, e): row.state for s, rows in M.TABLE.items() for e, row in rows.items()}
    assert found == EXPECTED
    assert set(EXPECTED) >= RFC_16_3_ROWS


@pytest.mark.parametrize(("state", "event"), PAIRS)
def test_every_pair_has_a_row_or_is_illegal_and_changes_nothing(state: S, event: I) -> None:
    record = record_in(state)
    if (state, event) in EXPECTED:
        result = step(record, event)
        assert result.record.state == EXPECTED[state, event]
        assert result.before == record
        assert result.input is event
        assert M.allows(state, event)
        assert result.record.version == record.version + 1
        assert result.record.updated_at == LATE
        # RFC 16: every transition is persisted and logged.
        assert F.PERSIST in result.effects and F.EMIT_EVENT in result.effects
    else:
        assert not M.allows(state, event)
        with pytest.raises(IllegalTransitionError) as caught:
            step(record, event)
        assert (caught.value.state, caught.value.event) == (state, event)
    assert record == record_in(state)


@pytest.mark.conformance(
    "worktree.machine.states",
    "worktree.transition.unbound-to-bound-home",
    "worktree.transition.unbound-to-bind-failed",
    "worktree.transition.bind-failed-to-unbound",
    "worktree.transition.bind-failed-to-bound-home",
    "worktree.transition.bound-home-to-switch-pending",
    "worktree.transition.switch-pending-to-bound-non-home",
    "worktree.transition.switch-pending-to-bound-home",
    "worktree.transition.bound-non-home-to-bound-home",
    "worktree.transition.bound-home-to-unbound",
    "worktree.transition.bound-non-home-to-unbound",
)
@pytest.mark.parametrize(("source", "target", "inputs", "name"), RFC_16_2)
def test_every_16_2_transition_is_a_row(source: S, target: S, inputs: set[I], name: str) -> None:
    for event in inputs:
        result = step(record_in(source), event)
        assert result.record.state == target, (name, event)
        assert result.record.entered_at == LATE  # a change of state: entered now
    other = {e for e, row in M.TABLE[source].items() if row.state is target} - inputs
    assert not other, f"{source} --> {target} has triggers the RFC does not name: {other}"


def test_the_cited_transition_ids_are_the_16_2_rows() -> None:
    marker = test_every_16_2_transition_is_a_row.pytestmark  # type: ignore[attr-defined]
    cited = {i for m in marker if m.name == "conformance" for i in m.args}
    assert {f"worktree.transition.{name}" for *_, name in RFC_16_2} < cited


def test_a_step_on_its_own_state_keeps_when_it_was_entered() -> None:
    failed = record_in(S.BIND_FAILED)
    again = step(failed, I.BIND_ERROR).record
    assert again.entered_at == T0
    assert again.updated_at == LATE


@pytest.mark.conformance("worktree.machine.log-transitions")
def test_every_row_persists_logs_and_the_changes_tell_the_agent() -> None:
    for state, rows in M.TABLE.items():
        for event, row in rows.items():
            assert row.effects.index(F.PERSIST) < row.effects.index(F.EMIT_EVENT), (state, event)
            # The record and its timers land before anyone is told of the change.
            landed = {F.PERSIST, F.CANCEL_TIMER, F.START_TIMER}
            last = max(i for i, e in enumerate(row.effects) if e in landed)
            told = [i for i, e in enumerate(row.effects) if e in (F.EMIT_EVENT, F.NOTIFY_AGENT)]
            assert last < min(told), (state, event)
            if event is not I.RECOVERY_TIMEOUT:
                assert F.NOTIFY_AGENT in row.effects, (state, event)


def test_effects_of_the_special_rows() -> None:
    request = M.row(S.BOUND_HOME, I.SWITCH_REQUEST).effects
    assert request[0] is F.REQUEST_APPROVAL  # the invocation id lands in the persisted record
    assert F.START_TIMER in M.row(S.SWITCH_PENDING, I.SWITCH_APPROVE).effects
    assert F.START_TIMER in M.row(S.UNBOUND, I.BIND_ERROR).effects
    assert M.row(S.BIND_FAILED, I.RECOVERY_TIMEOUT).effects[0] is F.ESCALATE_TO_HITL
    for state, event in [
        (S.SWITCH_PENDING, I.SWITCH_APPROVE),
        (S.SWITCH_PENDING, I.SWITCH_REJECT),
        (S.BIND_FAILED, I.UNBIND),
        (S.BIND_FAILED, I.BIND_OK),
    ]:
        assert M.row(state, event).effects[0] is F.CLOSE_INVOCATION


# --- binds and failures (16.3) ----------------------------------------------------------------


@pytest.mark.conformance("worktree.binding.single-home")
def test_bind_makes_the_home_and_a_second_bind_is_illegal() -> None:
    bound = step(WorktreeBinding("a"), I.BIND_OK, location=HOME, branch="feat/x").record
    assert bound.home == HOME and bound.current == HOME
    assert (bound.branch, bound.state) == ("feat/x", "BOUND_HOME")
    for state in (S.BOUND_HOME, S.SWITCH_PENDING, S.BOUND_NON_HOME):
        assert not M.allows(state, I.BIND_OK)
        with pytest.raises(IllegalTransitionError):
            step(record_in(state), I.BIND_OK, location=OTHER)
    assert step(WorktreeBinding("a"), I.BIND_OK, location=HOME).record.branch == "home"


@pytest.mark.conformance("worktree.bind-failed.record-reason")
@pytest.mark.parametrize("reason", sorted(FAILURE_REASONS))
def test_bind_failed_records_its_reason(reason: str) -> None:
    failed = step(WorktreeBinding("a"), I.BIND_ERROR, reason=reason, note="git said no").record
    assert (failed.state, failed.reason, failed.note) == ("BIND_FAILED", reason, "git said no")
    assert failed.home == HOME and failed.current is None
    assert working_location(failed) is None
    assert {
        "worktree_not_found", "permission_denied", "filesystem_error", "worktree_locked",
    } == FAILURE_REASONS  # fmt: skip


@pytest.mark.parametrize("reason", ["", "internal_error", "WORKTREE_LOCKED", "locked"])
def test_a_failure_without_a_16_3_reason_is_refused(reason: str) -> None:
    with pytest.raises(ValidationError) as caught:
        step(WorktreeBinding("a"), I.BIND_ERROR, reason=reason)
    assert caught.value.details["field"] == "reason"


@pytest.mark.conformance("worktree.bind-failed.retry-backoff")
def test_retries_back_off_exponentially_three_times() -> None:
    assert [DEFAULT_POLICY.retry_delay(n) for n in range(0, 6)] == [None, 1.0, 2.0, 4.0, None, None]
    record = step(WorktreeBinding("a"), I.BIND_ERROR, now=T0).record
    assert (record.attempts, record.retry_at) == (1, T0 + 1)
    now = T0
    gaps = []
    while record.retry_at:
        gaps.append(record.retry_at - now)
        now = record.retry_at
        with pytest.raises(IllegalTransitionError, match="not due"):
            step(record, I.RETRY_ERROR, now=now - 0.001)
        record = step(record, I.RETRY_ERROR, now=now).record
    assert gaps == [1.0, 2.0, 4.0]
    assert (record.attempts, record.retry_at, record.state) == (4, 0.0, "BIND_FAILED")
    # No retry is due any more: RETRY_* is illegal now.
    with pytest.raises(IllegalTransitionError):
        step(record, I.RETRY_OK, now=LATE)
    # An operator's new BIND starts the count again.
    again = step(record, I.BIND_ERROR, now=LATE).record
    assert (again.attempts, again.retry_at) == (1, LATE + 1)


def test_a_successful_retry_binds_the_home_asked_for() -> None:
    failed = record_in(S.BIND_FAILED)
    bound = step(failed, I.RETRY_OK, now=T0 + 1).record
    assert (bound.state, bound.home, bound.current) == ("BOUND_HOME", HOME, HOME)
    assert (bound.reason, bound.attempts, bound.retry_at, bound.recovery_at) == ("", 0, 0.0, 0.0)


@pytest.mark.conformance("worktree.bind-failed.recovery-timeout-60s")
def test_the_recovery_timeout_defaults_to_60_s_and_escalates_once() -> None:
    assert DEFAULT_POLICY.recovery_timeout_s == 60.0
    failed = step(WorktreeBinding("a"), I.BIND_ERROR, now=T0).record
    assert failed.recovery_at == T0 + 60
    # Failing again in BIND_FAILED does not restart it: the agent remains in the state.
    assert step(failed, I.RETRY_ERROR, now=T0 + 1).record.recovery_at == T0 + 60
    assert step(failed, I.BIND_ERROR, now=T0 + 30).record.recovery_at == T0 + 60
    with pytest.raises(IllegalTransitionError):
        step(failed, I.RECOVERY_TIMEOUT, now=T0 + 59.999)
    escalated = step(failed, I.RECOVERY_TIMEOUT, now=T0 + 60)
    assert escalated.record.state == "BIND_FAILED"
    assert escalated.record.recovery_at == 0.0
    assert F.ESCALATE_TO_HITL in escalated.effects
    assert BindingTimer.RECOVERY not in M.due(escalated.record, LATE)
    custom = BindingPolicy(recovery_timeout_s=5)
    assert step(WorktreeBinding("a"), I.BIND_ERROR, now=T0, policy=custom).record.recovery_at == (
        T0 + 5
    )


def test_bind_failed_counts_as_unbound() -> None:
    assert [s for s in S if is_bound(s)] == [S.BOUND_HOME, S.SWITCH_PENDING, S.BOUND_NON_HOME]
    assert working_location(record_in(S.BIND_FAILED)) is None
    assert working_location(record_in(S.UNBOUND)) is None
    # A pending switch has not happened: the agent still works at home.
    assert working_location(record_in(S.SWITCH_PENDING)) == HOME
    assert working_location(record_in(S.BOUND_NON_HOME)) == OTHER


def test_unbind_clears_everything_but_the_agent() -> None:
    for state in (S.BOUND_HOME, S.BOUND_NON_HOME, S.BIND_FAILED):
        cleared = step(record_in(state), I.UNBIND, note="bye").record
        assert cleared == replace(
            WorktreeBinding("agent-a"), note="bye", entered_at=LATE, updated_at=LATE, version=4
        )


# --- switches and the TTL --------------------------------------------------------------------


@pytest.mark.conformance("worktree.binding.non-home-forbidden")
def test_non_home_work_needs_a_request_and_an_approval() -> None:
    home = record_in(S.BOUND_HOME)
    # No input moves a home-bound agent to a non-home worktree directly.
    assert {row.state for row in M.TABLE[S.BOUND_HOME].values()} == {S.SWITCH_PENDING, S.UNBOUND}
    pending = step(home, I.SWITCH_REQUEST, location=OTHER, ttl_s=60)
    assert pending.effects[0] is F.REQUEST_APPROVAL
    assert pending.record.target == OTHER
    assert working_location(pending.record) == HOME
    switched = step(pending.record, I.SWITCH_APPROVE)
    assert working_location(switched.record) == OTHER
    assert switched.record.home == HOME


def test_a_switch_to_the_home_or_to_a_bad_id_is_refused() -> None:
    home = record_in(S.BOUND_HOME)
    with pytest.raises(ValidationError) as caught:
        step(home, I.SWITCH_REQUEST, location=HOME)
    assert caught.value.details["field"] == "target_worktree_id"
    for bad, field in [(Location("repo", "../etc"), "worktree_id"), (Location("", "x"), "repo_id")]:
        with pytest.raises(ValidationError) as caught:
            step(home, I.SWITCH_REQUEST, location=bad)
        assert caught.value.details["field"] == field
    with pytest.raises(ValidationError) as caught:
        step(home, I.SWITCH_REQUEST, location=None)
    assert caught.value.details["field"] == "target_worktree_id"


@pytest.mark.parametrize(
    ("requested", "approved", "ttl"), [(0, 0, 900.0), (60, 0, 60.0), (60, 30, 30.0), (0, 5, 5.0)]
)
def test_the_ttl_is_the_approvals_else_the_requests_else_900_s(
    requested: float, approved: float, ttl: float
) -> None:
    pending = step(record_in(S.BOUND_HOME), I.SWITCH_REQUEST, now=T0, ttl_s=requested).record
    switched = step(pending, I.SWITCH_APPROVE, now=T0 + 1, ttl_s=approved).record
    assert switched.expires_at == T0 + 1 + ttl
    assert (switched.target, switched.ttl_s, switched.invocation_id) == (None, 0.0, "")


@pytest.mark.parametrize("ttl", [-1.0, DEFAULT_POLICY.max_ttl_s + 1, float("nan"), float("inf")])
def test_a_ttl_out_of_range_is_refused(ttl: float) -> None:
    with pytest.raises(ValidationError) as caught:
        step(record_in(S.BOUND_HOME), I.SWITCH_REQUEST, ttl_s=ttl)
    assert caught.value.details["field"] == "ttl_ms"
    with pytest.raises(ValidationError) as caught:
        step(record_in(S.SWITCH_PENDING), I.SWITCH_APPROVE, ttl_s=ttl)
    assert caught.value.details["field"] == "ttl_ms"


def test_an_approval_of_another_target_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        step(record_in(S.SWITCH_PENDING), I.SWITCH_APPROVE, location=Location("repo", "third"))
    assert caught.value.details["field"] == "target_worktree_id"
    assert step(record_in(S.SWITCH_PENDING), I.SWITCH_APPROVE, location=OTHER).record.current == (
        OTHER
    )


def test_the_ttl_expires_exactly_at_its_deadline_and_returns_home() -> None:
    away = record_in(S.BOUND_NON_HOME)
    assert M.due(away, T0 + 899.999) == ()
    with pytest.raises(IllegalTransitionError, match="not due"):
        step(away, I.TTL_EXPIRED, now=T0 + 899.999)
    assert M.due(away, T0 + 900) == (BindingTimer.TTL,)
    back = step(away, I.TTL_EXPIRED, now=T0 + 900).record
    assert (back.state, back.current, back.expires_at) == ("BOUND_HOME", HOME, 0.0)
    revoked = step(away, I.SWITCH_REVOKE, now=T0 + 1).record
    assert (revoked.state, revoked.current, revoked.expires_at) == ("BOUND_HOME", HOME, 0.0)


def test_a_rejected_switch_stays_home() -> None:
    back = step(record_in(S.SWITCH_PENDING), I.SWITCH_REJECT, note="no").record
    assert (back.state, back.current, back.target, back.note) == ("BOUND_HOME", HOME, None, "no")


# --- ids, policy, diagram ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("frontend", True), ("feat-1.2_x", True), ("A", True), ("x" * 128, True),
        ("", False), ("x" * 129, False), ("../etc", False), ("a/b", False), (".hidden", False),
        ("-flag", False), ("a..b", False), ("trailing.", False), ("name.lock", False),
        ("sp ace", False), ("é", False), ("a\x00b", False),
    ],
)  # fmt: skip
def test_valid_ids_cannot_escape_the_worktrees_directory(value: str, ok: bool) -> None:
    assert valid_id(value) is ok


def test_a_failed_bind_records_even_an_unusable_id() -> None:
    failed = step(WorktreeBinding("a"), I.BIND_ERROR, location=Location("repo", "../x"),
                  reason="worktree_not_found").record  # fmt: skip
    assert failed.worktree_id == "../x"
    with pytest.raises(ValidationError) as caught:
        step(WorktreeBinding("a"), I.BIND_OK, location=Location("repo", "../x"))
    assert caught.value.details["field"] == "worktree_id"
    with pytest.raises(ValidationError):
        step(WorktreeBinding("a"), I.BIND_ERROR, location=Location("repo", "x" * 257),
             reason="worktree_not_found")  # fmt: skip


@pytest.mark.parametrize(
    "fields",
    [{"retry_base_s": 0}, {"max_retries": -1}, {"max_retries": True}, {"recovery_timeout_s": -5},
     {"default_ttl_s": float("inf")}, {"default_ttl_s": 10, "max_ttl_s": 5}],
)  # fmt: skip
def test_a_bad_policy_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BindingPolicy(**fields)


def test_mermaid_draws_every_row() -> None:
    text = mermaid()
    assert "UNBOUND --> BOUND_HOME: BIND_OK\n" in text
    assert "BIND_FAILED --> BIND_FAILED: RECOVERY_TIMEOUT (16.3)\n" in text
    assert "BOUND_NON_HOME --> BOUND_HOME: TTL_EXPIRED\n" in text
    assert text.count(" --> ") == len(EXPECTED) + 1


# --- invariants over random sequences ---------------------------------------------------------


_EVENT_ARGS = st.sampled_from(
    [
        (I.BIND_OK, {"location": HOME}),
        (I.BIND_ERROR, {"location": HOME, "reason": "worktree_locked"}),
        (I.RETRY_OK, {}),
        (I.RETRY_ERROR, {"reason": "filesystem_error"}),
        (I.UNBIND, {}),
        (I.SWITCH_REQUEST, {"location": OTHER, "ttl_s": 30.0}),
        (I.SWITCH_APPROVE, {}),
        (I.SWITCH_REJECT, {}),
        (I.SWITCH_REVOKE, {}),
        (I.TTL_EXPIRED, {}),
        (I.RECOVERY_TIMEOUT, {}),
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_EVENT_ARGS, st.floats(0, 100)), max_size=40))
def test_invariants_hold_over_any_sequence(
    events: list[tuple[tuple[I, dict[str, Any]], float]],
) -> None:
    record, now = WorktreeBinding("a"), T0
    for (event, args), gap in events:
        now += gap
        try:
            result = M.step(record, event, now, **args)
        except IllegalTransitionError:
            continue
        new = result.record
        assert new.version == record.version + 1
        state = S(new.state)
        assert (new.home is not None) == (state is not S.UNBOUND)
        assert (new.current is not None) == is_bound(state)
        assert (new.target is not None) == (state is S.SWITCH_PENDING)
        assert (new.reason in FAILURE_REASONS) == (state is S.BIND_FAILED)
        assert new.expires_at == 0.0 or state is S.BOUND_NON_HOME
        assert (new.retry_at, new.recovery_at) == (0.0, 0.0) or state is S.BIND_FAILED
        assert new.attempts == 0 or state is S.BIND_FAILED
        if state is S.BOUND_HOME:
            assert new.current == new.home
        if state is S.BOUND_NON_HOME:
            assert new.current != new.home and new.expires_at > now
        record = new
