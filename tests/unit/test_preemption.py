"""Cooperative preemption (RFC 7.1, 7.2): the trigger rule, the table over every (state, input)
pair, the Appendix C.4 and C.5 sequences, timers, and invariants over random input sequences.

Requirements shown here (tests/conformance/manifest.toml): preemption.trigger.higher-priority,
preemption.trigger.not-equal-or-lower, preemption.cooperative.required,
preemption.cooperative.no-force-first, preemption.safepoint.respond,
preemption.nonpreemptible.max-duration, preemption.deferral.defer,
preemption.deferral.enforce-max-duration, preemption.forced.soft-signal-grace,
preemption.forced.hard-after-grace, preemption.forced.mark-failed.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.machine import IllegalTransitionError
from apiary.core.preemption import (
    DEFAULT_GRACE_S,
    DEFAULT_SAFE_POINT_TIMEOUT_S,
    FORCED_PREEMPTION,
    PreemptionEffect,
    PreemptionInput,
    PreemptionMachine,
    PreemptionPolicy,
    PreemptionRecord,
    PreemptionState,
    PreemptionStep,
    mermaid,
    should_preempt,
)
from apiary.errors import ValidationError

S = PreemptionState
I = PreemptionInput  # noqa: E741
F = PreemptionEffect
M = PreemptionMachine
POLICY = PreemptionPolicy()
T0 = 1_754_000_000.0

# The specification of the table, written out: (state, input) -> next state; absent: illegal.
EXPECTED: dict[tuple[S, I], S] = {
    (S.RUNNING, I.REQUEST_PREEMPT): S.PREEMPT_REQUESTED,
    (S.RUNNING, I.ENTER_SECTION): S.NON_PREEMPTIBLE,
    (S.NON_PREEMPTIBLE, I.REQUEST_PREEMPT): S.DEFERRED,
    (S.NON_PREEMPTIBLE, I.LEAVE_SECTION): S.RUNNING,
    (S.NON_PREEMPTIBLE, I.DEADLINE): S.RUNNING,
    (S.PREEMPT_REQUESTED, I.REQUEST_PREEMPT): S.PREEMPT_REQUESTED,
    (S.PREEMPT_REQUESTED, I.ENTER_SECTION): S.DEFERRED,
    (S.PREEMPT_REQUESTED, I.SAFE_POINT_YIELD): S.YIELDED,
    (S.PREEMPT_REQUESTED, I.DEADLINE): S.TERMINATING,
    (S.DEFERRED, I.REQUEST_PREEMPT): S.DEFERRED,
    (S.DEFERRED, I.LEAVE_SECTION): S.PREEMPT_REQUESTED,
    (S.DEFERRED, I.SAFE_POINT_YIELD): S.YIELDED,
    (S.DEFERRED, I.DEADLINE): S.TERMINATING,
    (S.TERMINATING, I.REQUEST_PREEMPT): S.TERMINATING,
    (S.TERMINATING, I.ENTER_SECTION): S.TERMINATING,
    (S.TERMINATING, I.LEAVE_SECTION): S.TERMINATING,
    (S.TERMINATING, I.SAFE_POINT_YIELD): S.YIELDED,
    (S.TERMINATING, I.TERMINATED): S.TERMINATED,
    (S.TERMINATING, I.DEADLINE): S.KILLED,
}

# A record in each state, reached through the machine itself, with its timer.
REACH: dict[S, list[tuple[I, float]]] = {
    S.RUNNING: [],
    S.NON_PREEMPTIBLE: [(I.ENTER_SECTION, 0)],
    S.PREEMPT_REQUESTED: [(I.REQUEST_PREEMPT, 0)],
    S.DEFERRED: [(I.ENTER_SECTION, 0), (I.REQUEST_PREEMPT, 1)],
    S.TERMINATING: [(I.REQUEST_PREEMPT, 0), (I.DEADLINE, 30)],
    S.YIELDED: [(I.REQUEST_PREEMPT, 0), (I.SAFE_POINT_YIELD, 1)],
    S.TERMINATED: [(I.REQUEST_PREEMPT, 0), (I.DEADLINE, 30), (I.TERMINATED, 31)],
    S.KILLED: [(I.REQUEST_PREEMPT, 0), (I.DEADLINE, 30), (I.DEADLINE, 33)],
}
SECTION_S = 10.0


def feed(record: PreemptionRecord, event: I, now: float) -> PreemptionStep:
    """Apply one input at `now` (a DEADLINE fires exactly at the record's timer if later)."""
    if event is I.REQUEST_PREEMPT:
        return M.request_preempt(record, now, POLICY)
    if event is I.ENTER_SECTION:
        return M.enter_section(record, SECTION_S, now)
    if event is I.LEAVE_SECTION:
        return M.leave_section(record, now, POLICY)
    if event is I.SAFE_POINT_YIELD:
        return M.safe_point_yield(record, now)
    if event is I.TERMINATED:
        return M.terminated(record, now)
    return M.deadline(record, max(now, record.deadline or now), POLICY)


def reach(state: S) -> PreemptionRecord:
    record = M.start("task-1", T0)
    for event, offset in REACH[state]:
        record = feed(record, event, T0 + offset).record
    assert record.state is state
    return record


# --- trigger rule -----------------------------------------------------------------------------


def test_only_a_strictly_higher_priority_preempts() -> None:
    assert should_preempt(0, -1)
    assert should_preempt(20, -19)
    assert should_preempt(-18, -19)
    assert not should_preempt(0, 0)
    assert not should_preempt(-19, -19)
    assert not should_preempt(-19, -18)
    assert not should_preempt(0, 20)


@given(st.integers(-19, 20), st.integers(-19, 20))
def test_preemption_follows_the_numeric_order(running: int, incoming: int) -> None:
    assert should_preempt(running, incoming) is (incoming < running)
    assert not (should_preempt(running, incoming) and should_preempt(incoming, running))


@pytest.mark.parametrize(("running", "incoming"), [(21, 0), (0, -20), (True, 0), (0, 1.5)])
def test_the_trigger_rule_validates_priorities(running: Any, incoming: Any) -> None:
    with pytest.raises(ValidationError) as info:
        should_preempt(running, incoming)
    assert info.value.details["field"] == "priority"


# --- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, I)))
def test_every_pair_matches_the_written_table(state: S, event: I) -> None:
    expected = EXPECTED.get((state, event))
    assert M.allows(state, event) is (expected is not None)
    record = reach(state)
    if expected is None:
        with pytest.raises(IllegalTransitionError) as caught:
            feed(record, event, T0 + 100)
        assert (caught.value.state, caught.value.event) == (state, event)
        return
    step = feed(record, event, T0 + 100)
    assert step.record.state is expected
    assert step.record.task_id == "task-1"
    assert (step.grace_ms is not None) is (F.SEND_TERMINATE in step.effects)
    assert (step.error_code is not None) is (F.MARK_FAILED in step.effects)
    if F.START_TIMER in step.effects:
        assert step.record.deadline is not None
    if expected.terminal:
        assert step.record.deadline is None


def test_end_states_accept_nothing() -> None:
    for state in (s for s in S if s.terminal):
        assert not any(M.allows(state, event) for event in I)


def test_only_forced_preemption_fails_the_task_and_only_a_yield_requeues_it() -> None:
    for (_state, _event), row in ((k, M.row(*k)) for k in EXPECTED):
        if F.MARK_FAILED in row.effects:
            assert row.state in (S.KILLED, S.TERMINATED)
        if F.REQUEUE_TASK in row.effects:
            assert row.state is S.YIELDED
        assert (F.DISPATCH_HIGHER in row.effects) is row.state.terminal


def test_mermaid_lists_every_state_change() -> None:
    diagram = mermaid()
    assert diagram.startswith("stateDiagram-v2\n    [*] --> RUNNING\n")
    for (state, event), target in EXPECTED.items():
        if target is not state:
            assert f"    {state} --> {target}: {event}\n" in diagram
    for state in (s for s in S if s.terminal):
        assert f"    {state} --> [*]\n" in diagram


# --- Appendix C.4 and C.5 ---------------------------------------------------------------------


def test_c4_cooperative_preemption_by_a_higher_priority_task() -> None:
    record = M.start("lowP", T0)
    assert should_preempt(5, -5)
    step = M.request_preempt(record, T0 + 1, POLICY)
    assert step.effects == (F.SEND_PREEMPT_REQUEST, F.START_TIMER)
    assert step.record.deadline == T0 + 1 + DEFAULT_SAFE_POINT_TIMEOUT_S
    step = M.safe_point_yield(step.record, T0 + 2)  # ACK FULFILLED (yielded)
    assert step.record.state is S.YIELDED
    assert step.effects == (F.CANCEL_TIMER, F.REQUEUE_TASK, F.DISPATCH_HIGHER)
    assert step.error_code is None


def c5_until_terminate() -> PreemptionStep:
    record = M.start("task-1", T0)
    record = M.enter_section(record, 10, T0).record
    step = M.request_preempt(record, T0 + 1, POLICY)
    assert step.effects == (F.SEND_PREEMPT_REQUEST,)
    assert step.record.state is S.DEFERRED
    # Still inside the declared section: deferred, nothing forced.
    early = M.deadline(step.record, T0 + 9.999, POLICY)
    assert early == PreemptionStep(step.record, ())
    # max_duration exceeded: soft termination with the default grace.
    step = M.deadline(step.record, T0 + 10, POLICY)
    assert step.record.state is S.TERMINATING
    assert step.effects == (F.SEND_TERMINATE, F.START_TIMER)
    assert step.grace_ms == 3000
    assert step.record.deadline == T0 + 10 + DEFAULT_GRACE_S
    return step


def test_c5_forced_preemption_agent_responds() -> None:
    step = M.terminated(c5_until_terminate().record, T0 + 11)  # ACK FULFILLED (terminated)
    assert step.record.state is S.TERMINATED
    assert step.effects == (F.CANCEL_TIMER, F.MARK_FAILED, F.DISPATCH_HIGHER)
    assert step.error_code == FORCED_PREEMPTION == "forced_preemption"


def test_c5_forced_preemption_agent_does_not_respond() -> None:
    record = c5_until_terminate().record
    assert M.deadline(record, T0 + 12.9, POLICY).effects == ()
    step = M.deadline(record, T0 + 13, POLICY)
    assert step.record.state is S.KILLED
    assert step.effects == (F.KILL, F.MARK_FAILED, F.DISPATCH_HIGHER)
    assert step.error_code == "forced_preemption"


# --- timers and windows -----------------------------------------------------------------------


def test_no_safe_point_within_the_window_forces_preemption() -> None:
    record = M.request_preempt(M.start("t", T0), T0, POLICY).record
    assert M.deadline(record, T0 + 29, POLICY).record == record
    step = M.deadline(record, T0 + 30, POLICY)
    assert step.record.state is S.TERMINATING and step.grace_ms == 3000


def test_a_request_inside_a_section_waits_a_full_window_after_it_ends() -> None:
    record = M.enter_section(M.start("t", T0), 5, T0).record
    record = M.request_preempt(record, T0 + 1, POLICY).record
    assert record.safe_point_due is None
    step = M.leave_section(record, T0 + 4, POLICY)
    assert step.record.state is S.PREEMPT_REQUESTED
    assert step.effects == (F.START_TIMER,)
    assert step.record.deadline == step.record.safe_point_due == T0 + 4 + 30


def test_a_section_after_a_request_defers_but_does_not_reopen_the_window() -> None:
    record = M.request_preempt(M.start("t", T0), T0, POLICY).record
    step = M.enter_section(record, 60, T0 + 20)
    assert step.record.state is S.DEFERRED
    assert step.record.deadline == T0 + 80  # the section is honoured past the window
    step = M.leave_section(step.record, T0 + 25, POLICY)
    assert step.record.deadline == T0 + 30  # what was left of the window
    record = M.enter_section(step.record, 60, T0 + 26).record
    step = M.leave_section(record, T0 + 50, POLICY)
    assert step.record.deadline == T0 + 50  # the window closed: forced at once
    assert M.deadline(step.record, T0 + 50, POLICY).record.state is S.TERMINATING


def test_a_lapsed_section_makes_the_task_preemptible_again() -> None:
    record = M.enter_section(M.start("t", T0), 5, T0).record
    assert record.deadline == T0 + 5
    step = M.deadline(record, T0 + 5, POLICY)
    assert step.record.state is S.RUNNING and step.record.deadline is None
    assert step.effects == ()


def test_leaving_a_section_cancels_its_timer() -> None:
    record = M.enter_section(M.start("t", T0), 5, T0).record
    step = M.leave_section(record, T0 + 1, POLICY)
    assert step.record.state is S.RUNNING and step.record.deadline is None
    assert step.effects == (F.CANCEL_TIMER,)


def test_repeated_requests_do_not_move_the_deadline() -> None:
    record = M.request_preempt(M.start("t", T0), T0, POLICY).record
    step = M.request_preempt(record, T0 + 10, POLICY)
    assert step.effects == () and step.record.deadline == record.deadline


def test_a_yield_racing_terminate_requeues_the_task() -> None:
    step = M.safe_point_yield(c5_until_terminate().record, T0 + 11)
    assert step.record.state is S.YIELDED
    assert F.MARK_FAILED not in step.effects and F.REQUEUE_TASK in step.effects


@pytest.mark.parametrize("event", [I.ENTER_SECTION, I.LEAVE_SECTION, I.REQUEST_PREEMPT])
def test_forced_preemption_is_not_deferred_once_started(event: I) -> None:
    record = c5_until_terminate().record
    step = feed(record, event, T0 + 11)
    assert step.effects == ()
    assert step.record.state is S.TERMINATING and step.record.deadline == record.deadline


def test_a_custom_policy_sets_window_and_grace() -> None:
    policy = PreemptionPolicy(safe_point_timeout_s=5, grace_s=0.25)
    record = M.request_preempt(M.start("t", T0), T0, policy).record
    assert record.deadline == T0 + 5
    step = M.deadline(record, T0 + 5, policy)
    assert step.grace_ms == 250 and step.record.deadline == T0 + 5.25


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, True, "10", None])
def test_a_section_needs_a_positive_maximum_duration(bad: Any) -> None:
    with pytest.raises(ValidationError) as info:
        M.enter_section(M.start("t", T0), bad, T0)
    assert info.value.details["field"] == "max_duration"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"safe_point_timeout_s": 0}, "preemption.safe_point_timeout_s"),
        ({"grace_s": -3}, "preemption.grace_s"),
        ({"grace_s": math.inf}, "preemption.grace_s"),
    ],
)
def test_bad_policies_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PreemptionPolicy(**kwargs)
    assert info.value.details["field"] == field


@pytest.mark.parametrize("now", [math.nan, math.inf, "now", None])
def test_time_must_be_a_finite_number(now: Any) -> None:
    with pytest.raises(ValidationError) as info:
        M.request_preempt(M.start("t", T0), now, POLICY)
    assert info.value.details["field"] == "now"


def test_a_record_needs_a_task_id() -> None:
    with pytest.raises(ValidationError) as info:
        M.start("", T0)
    assert info.value.details["field"] == "task_id"


def test_an_illegal_input_changes_nothing() -> None:
    record = M.start("t", T0)
    with pytest.raises(IllegalTransitionError, match="RUNNING on SAFE_POINT_YIELD"):
        M.safe_point_yield(record, T0)
    assert record.state is S.RUNNING


# --- invariants over sequences ----------------------------------------------------------------


@given(st.lists(st.tuples(st.sampled_from(list(I)), st.floats(0, 40)), max_size=30))
def test_force_only_after_asking_and_kill_only_after_terminate(
    inputs: list[tuple[I, float]],
) -> None:
    record, now = M.start("t", T0), T0
    sent: list[F] = []
    for event, gap in inputs:
        now += gap
        if not M.allows(record.state, event):
            continue
        before = record
        # Timers may fire early here (a stale timer): the machine must ignore them.
        step = M.deadline(record, now, POLICY) if event is I.DEADLINE else feed(record, event, now)
        record = step.record
        sent.extend(step.effects)
        if F.SEND_TERMINATE in step.effects:
            # Cooperation first; never forced inside a section before its maximum duration.
            assert F.SEND_PREEMPT_REQUEST in sent
            assert before.deadline is not None and now >= before.deadline
        if F.KILL in step.effects:
            assert sent.count(F.SEND_TERMINATE) == 1
            assert before.state is S.TERMINATING
        if F.MARK_FAILED in step.effects:
            assert step.error_code == "forced_preemption"
            assert F.SEND_TERMINATE in sent
        if record.state in (S.NON_PREEMPTIBLE, S.DEFERRED, S.PREEMPT_REQUESTED, S.TERMINATING):
            assert record.deadline is not None
        if record.state.terminal:
            assert sent.count(F.DISPATCH_HIGHER) == 1
            break
