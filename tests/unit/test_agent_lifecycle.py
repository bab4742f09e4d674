"""The agent lifecycle machine (RFC 8): the table over every (state, input) pair, the 8.3
timeouts at their boundaries, task acceptance, shutdown grace (8.4), the proto enum."""

from __future__ import annotations

import ast
import copy
import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core import agent_lifecycle
from apiary.core.agent_lifecycle import (
    DEFAULT_TIMEOUTS,
    DERIVED_ROWS,
    PROTO_NAMES,
    REPORTED_FAILURES,
    TIMEOUT_ERRORS,
    TIMEOUT_INPUTS,
    AgentInput,
    AgentLifecycleMachine,
    AgentLifecycleState,
    LifecycleEffect,
    LifecycleStep,
    LifecycleTimeouts,
    accepts_tasks,
    auto_recovery_allowed,
    deadline_for,
    from_proto,
    grace_remaining,
    mermaid,
    parse_state,
    shutdown_deadline,
    to_proto,
)
from apiary.core.machine import IllegalTransitionError
from apiary.errors import ValidationError
from apiary.wire import pb

S = AgentLifecycleState
I = AgentInput  # noqa: E741
F = LifecycleEffect
M = AgentLifecycleMachine
T0 = 1_754_000_000.0
PAIRS = list(itertools.product(S, I))

# The whole table, written out independently of the module: (state, input) -> next state.
EXPECTED = {
    (S.INITIALIZING, I.INITIALIZED): S.RUNNABLE,
    (S.INITIALIZING, I.INIT_FAILED): S.FAILED,
    (S.INITIALIZING, I.INIT_TIMEOUT): S.FAILED,
    (S.RUNNABLE, I.SCHEDULE): S.SCHEDULED,
    (S.RUNNABLE, I.SHUTDOWN): S.SHUTTING_DOWN,
    (S.SCHEDULED, I.SHUTDOWN): S.SHUTTING_DOWN,
    (S.SCHEDULED, I.START): S.RUNNING,
    (S.RUNNING, I.WAIT): S.WAITING,
    (S.RUNNING, I.RESOURCES_NEEDED): S.WAITING_RESOURCES,
    (S.RUNNING, I.SUSPEND): S.SUSPENDED,
    (S.RUNNING, I.COMPLETE): S.COMPLETED,
    (S.RUNNING, I.FAIL): S.FAILED,
    (S.RUNNING, I.SHUTDOWN): S.SHUTTING_DOWN,
    (S.WAITING, I.INPUT_RECEIVED): S.RUNNING,
    (S.WAITING, I.WAITING_TIMEOUT): S.WAITING,
    (S.WAITING_RESOURCES, I.RESOURCES_AVAILABLE): S.RUNNING,
    (S.WAITING_RESOURCES, I.RESOURCE_TIMEOUT): S.FAILED,
    (S.SUSPENDED, I.RESUME): S.RESUMED,
    (S.SUSPENDED, I.SUSPEND_TIMEOUT): S.FAILED,
    (S.RESUMED, I.RESTORED): S.RUNNING,
    (S.COMPLETED, I.REPORTED): S.RUNNABLE,
    (S.FAILED, I.RECOVER): S.RECOVERING,
    (S.RECOVERING, I.RECOVERED): S.RUNNABLE,
    (S.RECOVERING, I.RECOVERY_FAILED): S.FAILED,
    (S.RECOVERING, I.RECOVERY_TIMEOUT): S.FAILED,
    (S.RECOVERING, I.SHUTDOWN): S.SHUTTING_DOWN,
    (S.SHUTTING_DOWN, I.COMPLETE): S.SHUTTING_DOWN,
    (S.SHUTTING_DOWN, I.SHUTDOWN_COMPLETE): S.SHUTTING_DOWN,
    (S.SHUTTING_DOWN, I.SHUTDOWN_TIMEOUT): S.FAILED,
    # The coordinator lost the agent (missed heartbeats): from every state that holds or
    # may take a task.
    **{
        (state, I.LOST): S.FAILED
        for state in (
            S.RUNNABLE,
            S.SCHEDULED,
            S.RUNNING,
            S.WAITING,
            S.WAITING_RESOURCES,
            S.SUSPENDED,
            S.RESUMED,
            S.COMPLETED,
        )
    },
}

# RFC Appendix B, edge by edge, with the error code its label names ("" for none).
APPENDIX_B = [
    (S.INITIALIZING, S.RUNNABLE, ""),
    (S.INITIALIZING, S.FAILED, "init_timeout"),
    (S.RUNNABLE, S.SCHEDULED, ""),
    (S.SCHEDULED, S.RUNNING, ""),
    (S.RUNNING, S.WAITING, ""),
    (S.WAITING, S.RUNNING, ""),
    (S.RUNNING, S.WAITING_RESOURCES, ""),
    (S.WAITING_RESOURCES, S.RUNNING, ""),
    (S.WAITING_RESOURCES, S.FAILED, "resource_timeout"),
    (S.RUNNING, S.SUSPENDED, ""),
    (S.SUSPENDED, S.RESUMED, ""),
    (S.SUSPENDED, S.FAILED, "suspend_timeout"),
    (S.RESUMED, S.RUNNING, ""),
    (S.RUNNING, S.COMPLETED, ""),
    (S.RUNNING, S.FAILED, ""),
    (S.RUNNING, S.SHUTTING_DOWN, ""),
    (S.SHUTTING_DOWN, S.FAILED, "agent_shutdown_timeout"),
    (S.FAILED, S.RECOVERING, ""),
    (S.RECOVERING, S.RUNNABLE, ""),
    (S.RECOVERING, S.FAILED, "recovery_timeout"),
    (S.RECOVERING, S.SHUTTING_DOWN, ""),
]

# RFC 8.3: (state, default seconds, error code).
TIMED_FAILURES = [
    (S.INITIALIZING, 60.0, "init_timeout"),
    (S.WAITING_RESOURCES, 300.0, "resource_timeout"),
    (S.SUSPENDED, 3600.0, "suspend_timeout"),
    (S.RECOVERING, 120.0, "recovery_timeout"),
    (S.SHUTTING_DOWN, 30.0, "agent_shutdown_timeout"),
]


def step(state: S, event: I, now: float = T0 + 1, **kw: object) -> LifecycleStep:
    return M.step(state, event, now, entered_at=T0, **kw)  # type: ignore[arg-type]


# --- the table ------------------------------------------------------------------------------


@pytest.mark.conformance("lifecycle.machine.required", "lifecycle.states.all-supported")
def test_the_table_is_exactly_the_derived_table() -> None:
    found = {(s, e): row.state for s, rows in M.TABLE.items() for e, row in rows.items()}
    assert found == EXPECTED
    assert {s.value for s in S} == {
        "INITIALIZING", "RUNNABLE", "SCHEDULED", "RUNNING", "WAITING", "WAITING_RESOURCES",
        "SUSPENDED", "RESUMED", "COMPLETED", "FAILED", "SHUTTING_DOWN", "RECOVERING",
    }  # fmt: skip
    reachable = {row.state for rows in M.TABLE.values() for row in rows.values()}
    assert reachable | {S.INITIALIZING} == set(S)  # every state is entered by some row


@pytest.mark.parametrize(("state", "event"), PAIRS)
@pytest.mark.conformance("lifecycle.machine.predictable-transitions")
def test_every_pair_has_a_row_or_is_illegal(state: S, event: I) -> None:
    before = copy.deepcopy(M.TABLE)
    if (state, event) in EXPECTED:
        result = step(state, event, now=T0 + 10_000)
        assert result.state is EXPECTED[state, event]
        assert all(isinstance(e, F) for e in result.effects)
        assert result.input is event
        assert M.allows(state, event)
    else:
        assert not M.allows(state, event)
        with pytest.raises(IllegalTransitionError) as caught:
            step(state, event, now=T0 + 10_000)
        assert (caught.value.state, caught.value.event) == (state, event)
    assert before == M.TABLE


@pytest.mark.parametrize(("source", "target", "code"), APPENDIX_B)
def test_every_appendix_b_edge_is_a_row(source: S, target: S, code: str) -> None:
    rows = [row for row in M.TABLE[source].values() if row.state is target]
    assert rows, f"{source} --> {target} missing"
    if code:
        assert code in {row.error_code for row in rows}


def test_rows_beyond_appendix_b_are_rfc_text_or_marked_derived() -> None:
    drawn = {(a, b) for a, b, _ in APPENDIX_B}
    undrawn = {(s, e) for (s, e), t in EXPECTED.items() if (s, t) not in drawn}
    # 8.1 COMPLETED: "before transitioning to RUNNABLE"; 8.3 WAITING: "MAY escalate to HITL".
    from_text = {(S.COMPLETED, I.REPORTED), (S.WAITING, I.WAITING_TIMEOUT)}
    # INIT_FAILED shares the drawn INITIALIZING --> FAILED edge of init_timeout; LOST the
    # drawn RUNNING, WAITING_RESOURCES and SUSPENDED --> FAILED edges.
    on_drawn_edges = {(S.INITIALIZING, I.INIT_FAILED)} | {
        (s, I.LOST) for s in (S.RUNNING, S.WAITING_RESOURCES, S.SUSPENDED)
    }
    assert undrawn == from_text | (DERIVED_ROWS - on_drawn_edges)
    assert all(row in EXPECTED for row in DERIVED_ROWS)


def test_only_failures_carry_error_codes() -> None:
    for state, rows in M.TABLE.items():
        for event, row in rows.items():
            assert bool(row.error_code) == (
                event in TIMEOUT_INPUTS.values() and row.state is S.FAILED
            ), (state, event)


@pytest.mark.parametrize(("state", "event"), list(EXPECTED))
def test_timer_effects_follow_the_timed_states(state: S, event: I) -> None:
    timeouts = LifecycleTimeouts(waiting=30.0)
    result = step(state, event, now=T0 + 10_000, timeouts=timeouts)
    timed = set(TIMEOUT_INPUTS)
    moved = result.state is not state
    fired = event in TIMEOUT_INPUTS.values()
    assert (F.START_TIMER in result.effects) == (moved and result.state in timed)
    assert (F.CANCEL_TIMER in result.effects) == (
        state in timed and not fired and (moved or F.DEREGISTER in result.effects)
    )
    assert (F.PERSIST in result.effects) == moved
    assert F.EMIT_EVENT in result.effects


@pytest.mark.parametrize(("state", "event"), [k for k, v in EXPECTED.items() if v is S.FAILED])
def test_every_failure_releases_the_agents_resources(state: S, event: I) -> None:
    result = step(state, event, now=T0 + 10_000)
    assert F.RELEASE_RESOURCES in result.effects
    assert result.error_code


HOLDING_A_TASK = [
    (S.RUNNING, I.FAIL),
    (S.WAITING_RESOURCES, I.RESOURCE_TIMEOUT),
    (S.SUSPENDED, I.SUSPEND_TIMEOUT),
    (S.SHUTTING_DOWN, I.SHUTDOWN_TIMEOUT),
]


@pytest.mark.parametrize(("state", "event"), HOLDING_A_TASK)
def test_a_task_held_at_failure_is_abandoned(state: S, event: I) -> None:
    assert F.ABANDON_TASK in step(state, event, now=T0 + 10_000).effects


@pytest.mark.parametrize("event", sorted(REPORTED_FAILURES))
def test_reported_failures_carry_the_reported_code_or_internal_error(event: I) -> None:
    state = next(s for s, e in EXPECTED if e is event)
    assert step(state, event).error_code == "internal_error"
    assert step(state, event, error_code="tool_timeout").error_code == "tool_timeout"


def test_an_error_code_on_any_other_input_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        step(S.RUNNING, I.COMPLETE, error_code="internal_error")
    assert caught.value.details["field"] == "error_code"
    with pytest.raises(ValidationError):
        step(S.INITIALIZING, I.INIT_TIMEOUT, now=T0 + 60, error_code="internal_error")


def test_scheduler_decisions_notify_the_agent() -> None:
    for state, event in ((S.RUNNING, I.SUSPEND), (S.SUSPENDED, I.RESUME),
                         (S.RUNNING, I.SHUTDOWN), (S.RECOVERING, I.SHUTDOWN),
                         (S.FAILED, I.RECOVER)):  # fmt: skip
        assert F.NOTIFY_AGENT in step(state, event).effects


def test_a_change_records_when_the_state_was_entered() -> None:
    moved = step(S.RUNNABLE, I.SCHEDULE, now=T0 + 5)
    assert moved.entered_at == T0 + 5
    stayed = step(S.SHUTTING_DOWN, I.COMPLETE, now=T0 + 5)
    assert stayed.entered_at == T0


# --- timeouts (RFC 8.2, 8.3) ---------------------------------------------------------------


def test_default_timeouts_are_the_rfc_8_3_values() -> None:
    assert [DEFAULT_TIMEOUTS.for_state(s) for s, _, _ in TIMED_FAILURES] == [
        seconds for _, seconds, _ in TIMED_FAILURES
    ]
    assert DEFAULT_TIMEOUTS.for_state(S.WAITING) is None
    assert {s: e.code for s, e in TIMEOUT_ERRORS.items()} == {
        s: code for s, _, code in TIMED_FAILURES
    }
    untimed = set(S) - set(TIMEOUT_INPUTS)
    assert all(DEFAULT_TIMEOUTS.for_state(s) is None for s in untimed)


@pytest.mark.parametrize(("state", "seconds", "code"), TIMED_FAILURES)
def test_each_timeout_fires_exactly_at_its_deadline(state: S, seconds: float, code: str) -> None:
    deadline = T0 + seconds
    assert deadline_for(state, T0) == deadline
    assert M.timeout(state, math.nextafter(deadline, -math.inf), T0) is None
    for now in (deadline, deadline + 0.001, deadline + 86_400):
        result = M.timeout(state, now, T0)
        assert result is not None
        assert (result.state, result.error_code) == (S.FAILED, code)
        assert result.input is TIMEOUT_INPUTS[state]
        assert F.EMIT_EVENT in result.effects  # RFC 8.3: timeout transitions MUST be logged
        assert F.CANCEL_TIMER not in result.effects  # the timer is the one that fired


@pytest.mark.parametrize(("state", "seconds", "code"), TIMED_FAILURES)
def test_custom_timeouts_move_the_deadline(state: S, seconds: float, code: str) -> None:
    field = {S.INITIALIZING: "initializing", S.WAITING_RESOURCES: "waiting_resources",
             S.SUSPENDED: "suspended", S.RECOVERING: "recovering",
             S.SHUTTING_DOWN: "shutting_down"}[state]  # fmt: skip
    timeouts = LifecycleTimeouts(**{field: 5.0})
    assert M.timeout(state, T0 + 4.999, T0, timeouts) is None
    result = M.timeout(state, T0 + 5, T0, timeouts)
    assert result is not None and result.error_code == code


@pytest.mark.parametrize(("state", "seconds", "code"), TIMED_FAILURES)
def test_a_stale_timer_changes_nothing_and_rearms(state: S, seconds: float, code: str) -> None:
    result = step(state, TIMEOUT_INPUTS[state], now=T0 + seconds - 1)
    assert result == LifecycleStep(state, (F.START_TIMER,), "", T0 + seconds, T0, result.input)


@pytest.mark.parametrize("state", [s for s in S if s not in TIMEOUT_INPUTS])
def test_untimed_states_never_time_out(state: S) -> None:
    assert deadline_for(state, T0) is None
    assert M.timeout(state, T0 + 1e9, T0) is None


def test_waiting_has_no_default_timeout_and_escalates_when_configured() -> None:
    assert M.timeout(S.WAITING, T0 + 1e9, T0) is None
    assert step(S.WAITING, I.WAITING_TIMEOUT, now=T0 + 1e9) == LifecycleStep(
        S.WAITING, (), "", None, T0, I.WAITING_TIMEOUT
    )
    timeouts = LifecycleTimeouts(waiting=30.0)
    assert M.timeout(S.WAITING, T0 + 29.5, T0, timeouts) is None
    result = M.timeout(S.WAITING, T0 + 30, T0, timeouts)
    assert result is not None
    assert (result.state, result.error_code) == (S.WAITING, "")
    assert F.ESCALATE_TO_HITL in result.effects
    assert F.START_TIMER not in result.effects  # escalates once


def test_entering_a_timed_state_arms_its_deadline() -> None:
    result = step(S.RUNNING, I.RESOURCES_NEEDED, now=T0 + 7)
    assert result.deadline == T0 + 7 + 300
    assert step(S.RUNNING, I.WAIT, now=T0 + 7).deadline is None
    waiting = step(S.RUNNING, I.WAIT, now=T0 + 7, timeouts=LifecycleTimeouts(waiting=9.0))
    assert waiting.deadline == T0 + 16 and F.START_TIMER in waiting.effects
    assert F.CANCEL_TIMER not in step(S.WAITING, I.INPUT_RECEIVED).effects


@pytest.mark.parametrize(
    "values",
    [{"initializing": 0}, {"suspended": -1.0}, {"recovering": math.inf},
     {"waiting_resources": math.nan}, {"shutting_down": True}, {"waiting": 0.0},
     {"initializing": None}, {"shutting_down": "30"}],
)  # fmt: skip
def test_timeouts_must_be_positive_durations(values: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as caught:
        LifecycleTimeouts(**values)  # type: ignore[arg-type]
    assert caught.value.details["field"] == f"timeouts.{next(iter(values))}"


# --- task acceptance ----------------------------------------------------------------------


@pytest.mark.parametrize("state", list(S))
def test_only_a_runnable_agent_accepts_tasks(state: S) -> None:
    assert accepts_tasks(state) == (state is S.RUNNABLE)
    assert accepts_tasks(state) == M.allows(state, I.SCHEDULE)


# --- shutdown and grace (RFC 8.4) -----------------------------------------------------------


def test_shutdown_stops_dispatch_and_arms_the_grace_period() -> None:
    grace = DEFAULT_TIMEOUTS.with_grace(5.0)
    result = step(S.RUNNING, I.SHUTDOWN, now=T0 + 10, timeouts=grace)
    assert result.state is S.SHUTTING_DOWN
    assert {F.STOP_DISPATCH, F.START_TIMER, F.NOTIFY_AGENT} <= set(result.effects)
    assert result.deadline == shutdown_deadline(T0 + 10, 5.0) == T0 + 15
    assert not accepts_tasks(result.state)
    assert M.timeout(S.SHUTTING_DOWN, T0 + 14.999, T0 + 10, grace) is None
    expired = M.timeout(S.SHUTTING_DOWN, T0 + 15, T0 + 10, grace)
    assert expired is not None
    assert (expired.state, expired.error_code) == (S.FAILED, "agent_shutdown_timeout")
    assert {F.ABANDON_TASK, F.RELEASE_RESOURCES} <= set(expired.effects)


def test_grace_remaining_counts_down_to_zero() -> None:
    assert grace_remaining(T0, T0) == 30.0
    assert grace_remaining(T0 + 20, T0) == 10.0
    assert grace_remaining(T0 + 30, T0) == 0.0
    assert grace_remaining(T0 + 99, T0, DEFAULT_TIMEOUTS.with_grace(120)) == 21.0


def test_with_grace_none_keeps_the_configured_grace() -> None:
    assert DEFAULT_TIMEOUTS.with_grace(None) is DEFAULT_TIMEOUTS
    with pytest.raises(ValidationError):
        DEFAULT_TIMEOUTS.with_grace(0)


@pytest.mark.parametrize("grace", [0, -1.0, math.inf, math.nan, True])
def test_shutdown_deadline_needs_a_positive_grace(grace: float) -> None:
    with pytest.raises(ValidationError) as caught:
        shutdown_deadline(T0, grace)
    assert caught.value.details["field"] == "grace_period"


def test_a_task_may_complete_within_the_grace_period() -> None:
    result = step(S.SHUTTING_DOWN, I.COMPLETE)
    assert result.state is S.SHUTTING_DOWN
    assert F.PERSIST not in result.effects and F.EMIT_EVENT in result.effects


def test_a_completed_shutdown_cleans_up_and_deregisters() -> None:
    result = step(S.SHUTTING_DOWN, I.SHUTDOWN_COMPLETE)
    assert result.effects == (
        F.CANCEL_TIMER, F.ABANDON_TASK, F.RELEASE_RESOURCES, F.DEREGISTER, F.EMIT_EVENT,
    )  # fmt: skip
    assert result.error_code == ""


def test_recovery_abort_cancels_the_recovery_timer_then_arms_the_grace() -> None:
    result = step(S.RECOVERING, I.SHUTDOWN, now=T0 + 3)
    assert result.effects.index(F.CANCEL_TIMER) < result.effects.index(F.START_TIMER)
    assert result.deadline == T0 + 3 + 30


def test_shutting_down_is_left_only_for_failed_or_deregistration() -> None:
    assert {e for e in I if M.allows(S.SHUTTING_DOWN, e)} == {
        I.COMPLETE, I.SHUTDOWN_COMPLETE, I.SHUTDOWN_TIMEOUT,
    }  # fmt: skip


def test_failed_leaves_only_by_recovery() -> None:
    assert {e for e in I if M.allows(S.FAILED, e)} == {I.RECOVER}


def test_a_shutdown_timeout_is_not_recovered_automatically() -> None:
    assert not auto_recovery_allowed("agent_shutdown_timeout")
    for code in ("init_timeout", "resource_timeout", "suspend_timeout", "recovery_timeout",
                 "internal_error"):  # fmt: skip
        assert auto_recovery_allowed(code)


# --- the proto enum -------------------------------------------------------------------------


def test_proto_numbers_and_names_match_the_generated_enum() -> None:
    enum = pb.common_pb2.AgentState
    for state in S:
        number = to_proto(state)
        assert enum.Name(number) == PROTO_NAMES[state]  # type: ignore[arg-type]
        assert from_proto(number) is state
        assert parse_state(enum.Name(number)) is state  # type: ignore[arg-type]
    assert len(enum.values()) == len(S) + 1  # AGENT_STATE_UNSPECIFIED has no state
    assert PROTO_NAMES[S.FAILED] == "FAILED_STATE"


def test_parse_state_by_either_failed_name_any_case_or_number() -> None:
    assert parse_state("FAILED") is parse_state("failed_state") is parse_state(10) is S.FAILED
    assert parse_state(" running ") is S.RUNNING
    for bad in (0, 13, True, "AGENT_STATE_UNSPECIFIED", "", None, 4.0):
        with pytest.raises(ValidationError) as caught:
            parse_state(bad)
        assert caught.value.details["field"] == "state"


# --- the diagram and purity -----------------------------------------------------------------


def test_mermaid_draws_every_row() -> None:
    text = mermaid()
    assert text.startswith("stateDiagram-v2\n    [*] --> INITIALIZING\n")
    assert "INITIALIZING --> FAILED: INIT_TIMEOUT (init_timeout)" in text
    assert "RUNNABLE --> SHUTTING_DOWN: SHUTDOWN *" in text
    assert "SHUTTING_DOWN --> [*]: SHUTDOWN_COMPLETE *" in text
    assert text.count(" --> ") == len(EXPECTED) + 1


def test_the_module_is_pure() -> None:
    tree = ast.parse(Path(agent_lifecycle.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    forbidden = {"asyncio", "time", "os", "random", "grpc", "sqlite3", "psycopg", "datetime"}
    assert not {name.split(".")[0] for name in imported} & forbidden
    assert not any(name.startswith("apiary._proto") for name in imported)


# --- properties ---------------------------------------------------------------------------


@given(
    start=st.sampled_from(list(S)),
    moves=st.lists(
        st.tuples(st.sampled_from(list(I)), st.floats(0, 4000, allow_nan=False)), max_size=40
    ),
    waiting=st.one_of(st.none(), st.floats(1, 100)),
)
def test_any_sequence_stays_in_known_states(
    start: S, moves: list[tuple[I, float]], waiting: float | None
) -> None:
    timeouts = LifecycleTimeouts(waiting=waiting)
    state, entered_at, now = start, T0, T0
    for event, elapsed in moves:
        now += elapsed
        if not M.allows(state, event):
            with pytest.raises(IllegalTransitionError):
                M.step(state, event, now, entered_at=entered_at, timeouts=timeouts)
            continue
        result = M.step(state, event, now, entered_at=entered_at, timeouts=timeouts)
        assert result.state in S
        assert (result.state is S.FAILED) == bool(result.error_code)
        if state is S.FAILED:
            assert result.state is S.RECOVERING
        if state is S.SHUTTING_DOWN:
            assert result.state in {S.SHUTTING_DOWN, S.FAILED}
        if result.state is not state:
            assert F.PERSIST in result.effects and result.entered_at == now
        timed_out = M.timeout(result.state, now, result.entered_at, timeouts)
        if result.deadline is not None:
            assert result.deadline > now or timed_out is not None
        state, entered_at = result.state, result.entered_at
        if F.DEREGISTER in result.effects:
            break
    for s in (S.FAILED, S.SHUTTING_DOWN):
        assert not accepts_tasks(s)


@given(
    state=st.sampled_from(list(TIMEOUT_INPUTS)),
    offset=st.floats(-1e5, 1e5, allow_nan=False),
)
def test_timeout_fires_iff_the_deadline_is_reached(state: S, offset: float) -> None:
    timeouts = LifecycleTimeouts(waiting=50.0)
    due = deadline_for(state, T0, timeouts)
    assert due is not None
    now = due + offset
    assert (M.timeout(state, now, T0, timeouts) is not None) == (now >= due)


# --- state reports (heartbeats) -----------------------------------------------------------

# What an agent's own report means, written out independently of the module.
REPORTS = {
    (S.INITIALIZING, S.RUNNABLE): I.INITIALIZED,
    (S.INITIALIZING, S.FAILED): I.INIT_FAILED,
    (S.RUNNING, S.WAITING): I.WAIT,
    (S.WAITING, S.RUNNING): I.INPUT_RECEIVED,
    (S.RUNNING, S.WAITING_RESOURCES): I.RESOURCES_NEEDED,
    (S.WAITING_RESOURCES, S.RUNNING): I.RESOURCES_AVAILABLE,
    (S.RESUMED, S.RUNNING): I.RESTORED,
    (S.RECOVERING, S.RUNNABLE): I.RECOVERED,
    (S.RECOVERING, S.FAILED): I.RECOVERY_FAILED,
    (S.RUNNING, S.FAILED): I.FAIL,
    (S.COMPLETED, S.RUNNABLE): I.REPORTED,
}


@pytest.mark.parametrize(("current", "reported"), list(itertools.product(S, S)))
def test_a_state_report_means_exactly_the_agents_own_inputs(current: S, reported: S) -> None:
    found = agent_lifecycle.input_for_report(current, reported)
    assert found is REPORTS.get((current, reported))
    if found is not None:
        assert M.allows(current, found)
        assert M.row(current, found).state is reported


@pytest.mark.parametrize(
    "reported", [S.SCHEDULED, S.SUSPENDED, S.RESUMED, S.SHUTTING_DOWN, S.RECOVERING]
)
def test_scheduler_driven_states_cannot_be_self_reported(reported: S) -> None:
    assert all(agent_lifecycle.input_for_report(current, reported) is None for current in S)
