"""What the Scheduler does when two tasks may touch the same things (RFC 9.2, 9.3; C.6).

Before a task starts, the Scheduler compares its scope with the scope of every task running
on another agent. For each such pair `decide` returns one of three outcomes:

- PARALLEL: run both.
- SERIALIZE: the new task waits until the running one ends.
- ESCALATE: ask HITL (reason CONFLICT); the new task waits for the decision, and
  `hitl_outcome` turns the decision into PARALLEL (approved) or SERIALIZE (anything else).

Rules, in order:
1. Policy overrides per operation type (the scopes' `op:`; RFC 9.3 "policy mechanisms to
   configure parallelism behaviour per operation type"): SERIALIZE wins over ESCALATE, which
   wins over PARALLEL; PARALLEL applies only when every operation of the pair permits it
   ("unless policy explicitly permits unconditional parallelism for the operation type").
2. No verdict (the Inference Engine is unavailable or failed): ESCALATE. The task waits
   meanwhile, so the fallback is conservative either way (RFC 9.3: serialize or escalate when
   uncertain), and HITL's own unavailability policy (RFC 15.4) denies by default.
3. Confidence at or above the threshold: PARALLEL.
4. Confidence below `serialize_below` (an administrator's override, off by default): SERIALIZE
   without asking: for certain conflicts such as a shared resource (confidence 0.0).
5. Otherwise (below the threshold): ESCALATE (RFC 9.3 MUST).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from apiary.errors import ValidationError

DEFAULT_THRESHOLD: Final = 0.7
"""Appendix C.6 escalates a 0.58; the built-in engine scores disjoint scopes 0.95."""


class ParallelMode(StrEnum):
    """A policy override for one operation type."""

    AUTO = "auto"
    """Consult the Inference Engine (the default)."""
    PARALLEL = "parallel"
    """Unconditional parallelism for this operation type."""
    SERIALIZE = "serialize"
    """Never run alongside a running task it is compared with."""
    ESCALATE = "escalate"
    """Always ask HITL."""


class ConflictOutcome(StrEnum):
    PARALLEL = "PARALLEL"
    SERIALIZE = "SERIALIZE"
    ESCALATE = "ESCALATE"


@dataclass(frozen=True, slots=True)
class ConflictPolicy:
    """The Scheduler's concurrency policy (configurable: `[scheduler.conflicts]`)."""

    threshold: float = DEFAULT_THRESHOLD
    serialize_below: float = 0.0
    overrides: Mapping[str, ParallelMode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("threshold", "serialize_below"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError.for_field(f"conflicts.{name}", "must be a number")
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValidationError.for_field(f"conflicts.{name}", "must be between 0 and 1")
        if self.serialize_below > self.threshold:
            raise ValidationError.for_field(
                "conflicts.serialize_below", "must not exceed conflicts.threshold"
            )
        checked: dict[str, ParallelMode] = {}
        for operation, mode in self.overrides.items():
            if not isinstance(operation, str) or not operation:
                raise ValidationError.for_field("conflicts.overrides", "keys must be names")
            try:
                checked[operation] = ParallelMode(mode)
            except ValueError:
                modes = ", ".join(m.value for m in ParallelMode)
                raise ValidationError.for_field(
                    f"conflicts.overrides.{operation}", f"must be one of {modes}"
                ) from None
        object.__setattr__(self, "overrides", checked)

    def mode(self, *operations: str) -> ParallelMode:
        """The combined override of a pair's operation types (rule 1)."""
        modes = [self.overrides.get(op, ParallelMode.AUTO) for op in operations]
        for strongest in (ParallelMode.SERIALIZE, ParallelMode.ESCALATE):
            if strongest in modes:
                return strongest
        if modes and all(m is ParallelMode.PARALLEL for m in modes):
            return ParallelMode.PARALLEL
        return ParallelMode.AUTO


@dataclass(frozen=True, slots=True)
class ConflictDecision:
    outcome: ConflictOutcome
    reason: str


def decide(
    policy: ConflictPolicy, operations: tuple[str, str], confidence: float | None
) -> ConflictDecision:
    """The outcome for one pair (rules 1-5); `confidence` None means no verdict."""
    mode = policy.mode(*operations)
    named = " / ".join(op or "-" for op in operations)
    if mode is ParallelMode.PARALLEL:
        return ConflictDecision(ConflictOutcome.PARALLEL, f"policy: parallel for {named}")
    if mode is ParallelMode.SERIALIZE:
        return ConflictDecision(ConflictOutcome.SERIALIZE, f"policy: serialize for {named}")
    if mode is ParallelMode.ESCALATE:
        return ConflictDecision(ConflictOutcome.ESCALATE, f"policy: escalate for {named}")
    if confidence is None:
        return ConflictDecision(
            ConflictOutcome.ESCALATE, "inference engine unavailable: conservative fallback"
        )
    if confidence >= policy.threshold:
        return ConflictDecision(
            ConflictOutcome.PARALLEL, f"confidence {confidence:.2f} >= {policy.threshold:.2f}"
        )
    if confidence < policy.serialize_below:
        return ConflictDecision(
            ConflictOutcome.SERIALIZE,
            f"confidence {confidence:.2f} < {policy.serialize_below:.2f}: certain conflict",
        )
    return ConflictDecision(
        ConflictOutcome.ESCALATE, f"confidence {confidence:.2f} < {policy.threshold:.2f}"
    )


APPROVING_ACTIONS: Final = frozenset({"APPROVE", "MODIFY", "AUTO_RESOLVE"})


def hitl_outcome(action: str) -> ConflictOutcome:
    """A CONFLICT decision's effect: approval runs both; anything else (deny, reject,
    QUEUE_TASKS, a timeout's deny) serializes (C.6: QUEUE_TASKS runs X, defers Y)."""
    return (
        ConflictOutcome.PARALLEL
        if action.upper() in APPROVING_ACTIONS
        else (ConflictOutcome.SERIALIZE)
    )
