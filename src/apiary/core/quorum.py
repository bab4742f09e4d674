"""Quorum over a set of requested voters (INTEROP.md, vectors/quorum_vectors.json,
contract "quorum-v1").

`QuorumRule` says how many of the requested voters must have voted: at least `value` votes
(`minimum_votes`), at least the fraction `value` of the requested ones, rounded up
(`minimum_fraction`: half of three is two), or every one of them (`require_all`; false asks
for none). `decide` counts the distinct requested voters that voted (a second vote of the
same voter, or one from a voter nobody asked, does not count) against the threshold, and
says what to do when it is not met, by `OnFailure`:

- `fail_closed`: escalate to a human (`escalate_hitl`);
- `fail_with_abstain`: decide, counting every requested voter that did not vote as an
  abstention, appended to the votes in roster order (`decided_with_abstains`);
- `fail_with_available`: decide on the votes there are (`decided_with_available`).

The caller owns the deadline (when to ask) and the voters' authority (whose votes are
votes); this module only counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any, Final, Self

from apiary.errors import ValidationError


class RuleKind(StrEnum):
    MINIMUM_VOTES = "minimum_votes"
    MINIMUM_FRACTION = "minimum_fraction"
    REQUIRE_ALL = "require_all"


class OnFailure(StrEnum):
    FAIL_CLOSED = "fail_closed"
    FAIL_WITH_ABSTAIN = "fail_with_abstain"
    FAIL_WITH_AVAILABLE = "fail_with_available"


class Action(StrEnum):
    NONE = "none"
    ESCALATE_HITL = "escalate_hitl"
    DECIDED_WITH_ABSTAINS = "decided_with_abstains"
    DECIDED_WITH_AVAILABLE = "decided_with_available"


_ACTIONS = {
    OnFailure.FAIL_CLOSED: Action.ESCALATE_HITL,
    OnFailure.FAIL_WITH_ABSTAIN: Action.DECIDED_WITH_ABSTAINS,
    OnFailure.FAIL_WITH_AVAILABLE: Action.DECIDED_WITH_AVAILABLE,
}


@dataclass(frozen=True, slots=True)
class QuorumRule:
    """One of the three rules with its value (checked: a rule that cannot be met by
    construction, such as a fraction above 1, is refused naming `field`)."""

    kind: RuleKind
    value: float | bool

    @classmethod
    def parse(cls, kind: object, value: object, field: str = "quorum") -> Self:
        try:
            rule_kind = RuleKind(kind) if isinstance(kind, str) else None
        except ValueError:
            rule_kind = None
        if rule_kind is None:
            names = ", ".join(k.value for k in RuleKind)
            raise ValidationError.for_field(f"{field}.kind", f"must be one of {names}")
        where = f"{field}.value"
        if rule_kind is RuleKind.REQUIRE_ALL:
            if not isinstance(value, bool):
                raise ValidationError.for_field(where, "must be true or false for require_all")
            return cls(rule_kind, value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError.for_field(where, f"must be a number for {rule_kind.value}")
        if rule_kind is RuleKind.MINIMUM_VOTES:
            if not (float(value).is_integer() and 0 <= value <= 1_000_000):
                raise ValidationError.for_field(where, "must be a whole number from 0 to 1000000")
            return cls(rule_kind, int(value))
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ValidationError.for_field(where, "must be a fraction from 0 to 1")
        return cls(rule_kind, float(value))

    def threshold(self, expected: int) -> int:
        """How many counted votes meet the rule when `expected` voters were requested."""
        if self.kind is RuleKind.MINIMUM_VOTES:
            return int(self.value)
        if self.kind is RuleKind.REQUIRE_ALL:
            return expected if self.value else 0
        # Exact decimal arithmetic: 0.1 of 30 is 3, not the float product's 3.0000000000000004.
        return math.ceil(Fraction(repr(float(self.value))) * expected)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "value": self.value}


@dataclass(frozen=True, slots=True)
class QuorumOutcome:
    met: bool
    received: int
    """Distinct requested voters that voted."""
    expected: int
    """Voters requested (as listed)."""
    threshold: int
    action: Action
    abstained: tuple[str, ...]
    """Requested voters without a vote, appended as abstentions (fail_with_abstain only)."""
    all_votes: tuple[str, ...]
    """The voters of every vote given, in order, then the abstentions."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "met": self.met,
            "received": self.received,
            "expected": self.expected,
            "threshold": self.threshold,
            "action": self.action.value,
            "abstained": list(self.abstained),
        }


def decide(
    requested: Sequence[str],
    voters: Sequence[str],
    rule: QuorumRule,
    on_failure: OnFailure,
) -> QuorumOutcome:
    """Whether the votes of `voters` (one entry per vote, in order) meet `rule` over the
    `requested` voters, and what to do (module docstring)."""
    roster = dict.fromkeys(requested)
    counted = {voter for voter in voters if voter in roster}
    expected = len(requested)
    threshold = rule.threshold(expected)
    met = len(counted) >= threshold
    action = Action.NONE if met else _ACTIONS[on_failure]
    abstained: tuple[str, ...] = ()
    if action is Action.DECIDED_WITH_ABSTAINS:
        abstained = tuple(voter for voter in roster if voter not in counted)
    return QuorumOutcome(
        met, len(counted), expected, threshold, action, abstained, (*voters, *abstained)
    )


def parse_on_failure(value: object, field: str = "quorum.on_failure") -> OnFailure:
    try:
        if isinstance(value, str):
            return OnFailure(value)
    except ValueError:
        pass
    names = ", ".join(f.value for f in OnFailure)
    raise ValidationError.for_field(field, f"must be one of {names}")


def rule_from(values: Mapping[str, Any], field: str = "quorum") -> QuorumRule:
    """A rule from a mapping {"kind": ..., "value": ...} (configuration, vectors)."""
    return QuorumRule.parse(values.get("kind"), values.get("value"), field)


@dataclass(frozen=True, slots=True)
class Quorum:
    """A rule and what to do when it is not met: a policy setting (`[rooms.quorum]`)."""

    rule: QuorumRule = QuorumRule(RuleKind.REQUIRE_ALL, True)
    on_failure: OnFailure = OnFailure.FAIL_CLOSED

    @classmethod
    def from_mapping(cls, values: object, field: str = "quorum") -> Self:
        """From {"kind", "value", "on_failure"} (configuration, a stored policy version)."""
        if not isinstance(values, Mapping):
            raise ValidationError.for_field(field, "must be a table with kind and value")
        unknown = sorted(str(key) for key in values if key not in {"kind", "value", "on_failure"})
        if unknown:
            raise ValidationError.for_field(f"{field}.{unknown[0]}", "is not a quorum setting")
        on_failure = values.get("on_failure", OnFailure.FAIL_CLOSED.value)
        return cls(rule_from(values, field), parse_on_failure(on_failure, f"{field}.on_failure"))

    def as_dict(self) -> dict[str, Any]:
        return {**self.rule.as_dict(), "on_failure": self.on_failure.value}

    def decide(self, requested: Sequence[str], voters: Sequence[str]) -> QuorumOutcome:
        return decide(requested, voters, self.rule, self.on_failure)


EVERY_VOTE: Final = Quorum()
"""The default: every requested voter, escalating otherwise."""
