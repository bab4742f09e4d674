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
    one module holds several machines' errors in its logs; `why` says more when the row
    exists but the input is refused all the same (a timer input before its deadline).
    """

    def __init__(self, state: object, event: object, machine: str = "", why: str = "") -> None:
        kind = f"{machine} " if machine else ""
        text = f"no {kind}transition from {state} on {event}"
        super().__init__(f"{text}: {why}" if why else text)
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
        target: Callable[[R], object],
        label: Callable[[I], str] = str,
        *,
        loops: bool = False,
        entry: str = "",
        mark: Callable[[S, I, R], str] | None = None,
    ) -> str:
        """A mermaid state diagram: an arrow for each row that changes the state (rows that
        keep it are left out), `[*]` into each initial and out of each terminal state.

        `loops` draws the rows that keep the state too; `entry` labels the arrows into the
        initial states (the input that creates a record); `mark(state, input, row)` is
        appended to a row's label (e.g. " *" for a row the spec implies without drawing).
        `target` may return "[*]" for a row that ends the lifecycle without a state.
        """
        return mermaid(
            self.rows, initial, terminal, target, label, loops=loops, entry=entry, mark=mark
        )


def mermaid(
    rows: Mapping[S, Mapping[I, R]],
    initial: Iterable[S],
    terminal: Iterable[S],
    target: Callable[[R], object],
    label: Callable[[I], str] = str,
    *,
    loops: bool = False,
    entry: str = "",
    mark: Callable[[S, I, R], str] | None = None,
) -> str:
    """The diagram of `rows` (see TransitionTable.mermaid), for machines whose rows are not
    a TransitionTable."""
    lines = ["stateDiagram-v2"]
    into = f": {entry}" if entry else ""
    lines.extend(f"    [*] --> {state}{into}" for state in initial)
    for state, row in rows.items():
        for event, step in row.items():
            after = target(step)
            if loops or after != state:
                note = mark(state, event, step) if mark else ""
                lines.append(f"    {state} --> {after}: {label(event)}{note}")
    lines.extend(f"    {state} --> [*]" for state in terminal)
    return "\n".join(lines) + "\n"
