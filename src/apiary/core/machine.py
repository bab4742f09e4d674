"""The skeleton every lifecycle machine in core shares: a transition table keyed by (state,
input), the one error for an input the table has no row for, and the state diagram drawn
from the table.

A machine keeps its own rows, steps and effects (their shapes differ: a message's step is a
state and effects, a negotiation's carries records); what is written once here is how a row
is looked up, what refusing an input looks like, and how the docs' diagrams are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

S = TypeVar("S")
"""A machine's state type (an enum)."""
I = TypeVar("I")  # noqa: E741 - the conventional name for a machine's input type
"""A machine's input type (an enum)."""
R = TypeVar("R")
"""What a row holds: the machine's step (next state and effects)."""


class IllegalTransitionError(Exception):
    """The machine has no row for (state, input); nothing changed.

    `machine` names the lifecycle in the message ("no handoff transition from ...") where
    one module holds several machines' errors in its logs.
    """

    def __init__(self, state: object, event: object, machine: str = "") -> None:
        kind = f"{machine} " if machine else ""
        super().__init__(f"no {kind}transition from {state} on {event}")
        self.state = state
        self.event = event
        self.machine = machine


class TransitionTable(Generic[S, I, R]):
    """The rows of one machine: `step` looks a row up or refuses, `allows` and `get` ask
    without raising, `mermaid` draws the diagram."""

    __slots__ = ("machine", "rows")

    def __init__(self, rows: Mapping[S, Mapping[I, R]], machine: str = "") -> None:
        self.rows = rows
        self.machine = machine

    def step(self, state: S, event: I) -> R:
        """The row for (state, event); IllegalTransitionError when there is none."""
        row = self.get(state, event)
        if row is None:
            raise IllegalTransitionError(state, event, self.machine)
        return row

    def get(self, state: S, event: I) -> R | None:
        """The row for (state, event), or None: one lookup where a caller asks first."""
        inputs = self.rows.get(state)
        return None if inputs is None else inputs.get(event)

    def allows(self, state: S, event: I) -> bool:
        """Whether the table has a row for (state, event)."""
        return self.get(state, event) is not None

    def inputs(self, state: S) -> tuple[I, ...]:
        """The inputs `state` has rows for, in table order."""
        return tuple(self.rows.get(state, {}))

    def mermaid(
        self,
        initial: Iterable[S],
        terminal: Iterable[S],
        target: Callable[[R], S],
        label: Callable[[I], str] = str,
    ) -> str:
        """A mermaid state diagram: an arrow for each row that changes the state (rows that
        keep it are left out), `[*]` into each initial and out of each terminal state."""
        return mermaid(self.rows, initial, terminal, target, label)


def mermaid(
    rows: Mapping[S, Mapping[I, R]],
    initial: Iterable[S],
    terminal: Iterable[S],
    target: Callable[[R], S],
    label: Callable[[I], str] = str,
) -> str:
    """The diagram of `rows` (see TransitionTable.mermaid), for machines whose rows are not
    a TransitionTable."""
    lines = ["stateDiagram-v2"]
    lines.extend(f"    [*] --> {state}" for state in initial)
    for state, row in rows.items():
        for event, step in row.items():
            after = target(step)
            if after != state:
                lines.append(f"    {state} --> {after}: {label(event)}")
    lines.extend(f"    {state} --> [*]" for state in terminal)
    return "\n".join(lines) + "\n"
