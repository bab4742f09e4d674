"""The tool call lifecycle table (RFC 18.2, 18.6), over every (state, input) pair."""

from __future__ import annotations

import itertools

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.tools.calls import (
    ToolCallEffect,
    ToolCallInput,
    ToolCallMachine,
    ToolCallState,
    cancel_answer,
    mermaid,
)

S, In, F = ToolCallState, ToolCallInput, ToolCallEffect

EXPECTED = {
    (S.ACCEPTED, In.ESCALATE): (S.AWAITING_APPROVAL, ()),
    (S.ACCEPTED, In.START): (S.RUNNING, ()),
    (S.ACCEPTED, In.FAIL): (S.FAILED, ()),
    (S.ACCEPTED, In.CANCEL): (S.CANCELLED, ()),
    (S.AWAITING_APPROVAL, In.START): (S.RUNNING, ()),
    (S.AWAITING_APPROVAL, In.DENY): (S.FAILED, ()),
    (S.AWAITING_APPROVAL, In.FAIL): (S.FAILED, ()),
    (S.AWAITING_APPROVAL, In.CANCEL): (S.CANCELLED, (F.WITHDRAW_APPROVAL,)),
    (S.RUNNING, In.FRAME): (S.RUNNING, ()),
    (S.RUNNING, In.RETRY): (S.RUNNING, ()),
    (S.RUNNING, In.FINISH): (S.COMPLETED, ()),
    (S.RUNNING, In.FAIL): (S.FAILED, ()),
    (S.RUNNING, In.CANCEL): (S.CANCELLING, (F.SIGNAL_PROVIDER,)),
    (S.CANCELLING, In.FRAME): (S.CANCELLING, ()),
    (S.CANCELLING, In.FINISH): (S.COMPLETED, ()),
    (S.CANCELLING, In.FAIL): (S.CANCELLED, ()),
    (S.CANCELLING, In.STOPPED): (S.CANCELLED, ()),
    (S.CANCELLING, In.CANCEL): (S.CANCELLING, ()),
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, In)))
def test_every_pair_is_in_the_table_or_refused(state: ToolCallState, event: ToolCallInput) -> None:
    expected = EXPECTED.get((state, event))
    if expected is None:
        assert not ToolCallMachine.allows(state, event)
        with pytest.raises(IllegalTransitionError):
            ToolCallMachine.step(state, event)
        return
    row = ToolCallMachine.step(state, event)
    assert (row.state, row.effects) == expected


def test_terminal_states_take_no_input() -> None:
    for state in S:
        assert state.terminal == (not ToolCallMachine.TABLE[state])


@pytest.mark.conformance("tool.cancel.error-cancelled", "tool.cancel.error-not-found")
def test_cancel_answers() -> None:
    assert cancel_answer(None) == "NOT_FOUND"
    for state in S:
        assert cancel_answer(state) == ("ALREADY_COMPLETED" if state.terminal else "CANCELLED")


def test_the_diagram_shows_every_state_change() -> None:
    diagram = mermaid()
    assert diagram.startswith("stateDiagram-v2\n    [*] --> ACCEPTED\n")
    assert "    RUNNING --> CANCELLING: CANCEL" in diagram
    assert "    CANCELLING --> COMPLETED: FINISH" in diagram
    assert "RUNNING --> RUNNING" not in diagram
    assert all(f"    {s} --> [*]" in diagram for s in S if s.terminal)
