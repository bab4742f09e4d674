"""The machine skeleton every core lifecycle shares (core/machine.py): a table lookup that
refuses with the one IllegalTransitionError and changes nothing, asking without raising, and
the state diagram drawn from the rows."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import StrEnum

import pytest

from apiary.core.machine import IllegalTransitionError, TransitionTable, mermaid


class Light(StrEnum):
    OFF = "OFF"
    ON = "ON"
    BROKEN = "BROKEN"


class Press(StrEnum):
    FLIP = "FLIP"
    TAP = "TAP"
    SMASH = "SMASH"


@dataclass(frozen=True, slots=True)
class Row:
    state: Light
    effects: tuple[str, ...] = ()


ROWS = {
    Light.OFF: {Press.FLIP: Row(Light.ON, ("GLOW",)), Press.TAP: Row(Light.OFF)},
    Light.ON: {Press.FLIP: Row(Light.OFF), Press.SMASH: Row(Light.BROKEN, ("SWEEP",))},
    Light.BROKEN: {},
}
TABLE: TransitionTable[Light, Press, Row] = TransitionTable(ROWS, "light")


def test_step_returns_the_row() -> None:
    assert TABLE.step(Light.OFF, Press.FLIP) == Row(Light.ON, ("GLOW",))
    assert TABLE.step(Light.ON, Press.SMASH).state is Light.BROKEN


def test_step_refuses_a_missing_row_with_the_shared_error_and_changes_nothing() -> None:
    before = copy.deepcopy(ROWS)
    with pytest.raises(IllegalTransitionError) as caught:
        TABLE.step(Light.BROKEN, Press.FLIP)
    assert (caught.value.state, caught.value.event) == (Light.BROKEN, Press.FLIP)
    assert caught.value.machine == "light"
    assert str(caught.value) == "no light transition from BROKEN on FLIP"
    assert before == ROWS


def test_the_error_text_without_a_machine_name_and_with_a_reason() -> None:
    assert str(IllegalTransitionError("SENT", "ACK")) == "no transition from SENT on ACK"
    error = IllegalTransitionError("A", "TICK", "clock", "the timer is not due")
    assert str(error) == "no clock transition from A on TICK: the timer is not due"


def test_every_pair_agrees_between_step_allows_and_get() -> None:
    for state in Light:
        for event in Press:
            row = ROWS[state].get(event)
            assert TABLE.get(state, event) == row
            assert TABLE.allows(state, event) is (row is not None)
            if row is None:
                with pytest.raises(IllegalTransitionError):
                    TABLE.step(state, event)
            else:
                assert TABLE.step(state, event) is row


def test_a_state_without_rows_refuses_everything() -> None:
    empty: TransitionTable[Light, Press, Row] = TransitionTable({Light.OFF: {}})
    assert empty.get(Light.ON, Press.FLIP) is None
    assert not empty.allows(Light.OFF, Press.FLIP)
    assert empty.inputs(Light.ON) == ()


def test_inputs_are_in_table_order() -> None:
    assert TABLE.inputs(Light.OFF) == (Press.FLIP, Press.TAP)
    assert TABLE.inputs(Light.BROKEN) == ()


def test_the_diagram_leaves_loops_out_by_default() -> None:
    text = TABLE.mermaid((Light.OFF,), (Light.BROKEN,), lambda row: row.state)
    assert text == (
        "stateDiagram-v2\n"
        "    [*] --> OFF\n"
        "    OFF --> ON: FLIP\n"
        "    ON --> OFF: FLIP\n"
        "    ON --> BROKEN: SMASH\n"
        "    BROKEN --> [*]\n"
    )


def test_the_diagram_with_loops_an_entry_label_and_marks() -> None:
    text = TABLE.mermaid(
        (Light.OFF,),
        (),
        lambda row: "[*]" if row.state is Light.BROKEN else row.state,
        str.lower,
        loops=True,
        entry="INSTALL",
        mark=lambda state, event, row: " *" if row.effects else "",
    )
    assert text == (
        "stateDiagram-v2\n"
        "    [*] --> OFF: INSTALL\n"
        "    OFF --> ON: flip *\n"
        "    OFF --> OFF: tap\n"
        "    ON --> OFF: flip\n"
        "    ON --> [*]: smash *\n"
    )


def test_the_module_function_draws_plain_rows_as_the_table_does() -> None:
    drawn = mermaid(ROWS, (Light.OFF,), (Light.BROKEN,), lambda row: row.state)
    assert drawn == TABLE.mermaid((Light.OFF,), (Light.BROKEN,), lambda row: row.state)
