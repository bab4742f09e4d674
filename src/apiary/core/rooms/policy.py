"""The negotiation-room policy (RFC 17.5): thresholds, versions, and the rule that turns a
complete set of votes into an outcome.

`evaluate(votes, policy)` applies, in this order:

1. Mandatory escalation (RFC: the Coordinator MUST escalate to HITL when ANY holds), with
   fixed limits that no configuration can loosen: a vote with confidence < 0.3
   (`low_confidence`), std_dev > 3.0 (`extreme_disagreement`), a critic requesting
   escalation through its recommendations (`critic_request`). The fourth condition, the
   policy timeout before enough votes (`vote_timeout`), is the machine's.
2. Auto-approval when ALL four configurable thresholds hold: weighted_mean >=
   min_score_threshold (7.0), average confidence >= min_confidence_threshold (0.7), the
   share of votes with passed=true >= min_pass_ratio (0.8), std_dev <= max_std_dev (2.0).
3. Otherwise REVISION_REQUESTED, naming every threshold that was missed.

Decisions Apiary makes where the RFC is silent:
- "Requests escalation via recommendations": a recommendation whose text, before an optional
  ":" and a reason, is ESCALATE, ESCALATE_TO_HITL or ESCALATE_TO_HUMAN, in any case and with
  spaces or hyphens for underscores ("Escalate to HITL: licence unclear"). Free text that
  merely contains the word ("escalate the log level") is an ordinary recommendation.
- A policy version names a fixed set of settings. `version` may be configured; otherwise it
  is derived from the settings ("auto-" and 12 hex digits of their SHA-256), so that the same
  settings always carry the same version and a rollback to earlier settings brings back the
  earlier version. Every proposal is decided under the version current at its submission.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any, Final, Self

from apiary.core.quorum import EVERY_VOTE, Quorum
from apiary.core.rooms.records import DecisionOutcome, PolicyVersionRecord, VoteRecord
from apiary.core.vote_aggregation import AggregatedScore, aggregate, average_confidence
from apiary.errors import ValidationError

ESCALATE_CONFIDENCE_BELOW: Final = 0.3
"""RFC 17.5: any vote with a confidence below this escalates (high uncertainty)."""
ESCALATE_STD_DEV_ABOVE: Final = 3.0
"""RFC 17.5: an aggregated std_dev above this escalates (extreme disagreement)."""
ESCALATION_REQUESTS: Final = frozenset({"ESCALATE", "ESCALATE_TO_HITL", "ESCALATE_TO_HUMAN"})
MAX_VERSION_CHARS: Final = 64
_BOUNDS: Final = (
    ("min_score_threshold", 0.0, 10.0, False),
    ("min_confidence_threshold", 0.0, 1.0, False),
    ("min_pass_ratio", 0.0, 1.0, False),
    ("max_std_dev", 0.0, 10.0, False),
    ("vote_timeout_s", 0.0, math.inf, True),
    ("hitl_timeout_s", 0.0, math.inf, False),
)
"""(setting, lower bound, upper bound, whether the lower bound is excluded)."""


class Trigger(StrEnum):
    """Why a room escalated to HITL (RFC 17.5 auto-escalation rules)."""

    LOW_CONFIDENCE = "low_confidence"
    EXTREME_DISAGREEMENT = "extreme_disagreement"
    CRITIC_REQUEST = "critic_request"
    VOTE_TIMEOUT = "vote_timeout"


class Shortfall(StrEnum):
    """A threshold of auto-approval that was not met."""

    SCORE = "min_score_threshold"
    CONFIDENCE = "min_confidence_threshold"
    PASS_RATIO = "min_pass_ratio"
    STD_DEV = "max_std_dev"


@dataclass(frozen=True, slots=True)
class RoomPolicy:
    """The room policy: auto-approval thresholds, the vote timeout and HITL options.

    Configuration: TOML table [rooms] (docs/negotiation-rooms.md).
    """

    min_score_threshold: float = 7.0
    """weighted_mean must reach this (0..10)."""
    min_confidence_threshold: float = 0.7
    """The average confidence must reach this (0..1)."""
    min_pass_ratio: float = 0.8
    """The share of votes with passed=true must reach this (0..1)."""
    max_std_dev: float = 2.0
    """std_dev must not exceed this (0..10)."""
    vote_timeout_s: float = 300.0
    """The policy timeout: without every requested vote by then, `quorum` decides."""
    quorum: Quorum = EVERY_VOTE
    """How many requested votes suffice at the policy timeout and what happens with fewer
    (core/quorum.py); the default requires all of them and escalates otherwise."""
    hitl_timeout_s: float = 0.0
    """The decision window of the HITL invocation; 0: the [hitl] default."""
    hitl_approver_roles: tuple[str, ...] = ()
    """Operator roles that may decide a room's escalation; empty: any operator."""
    version: str = ""
    """A name for these settings; empty: derived from them (module docstring)."""

    def __post_init__(self) -> None:
        # Numbers are kept as floats, so that 60 and 60.0 derive the same version.
        for name, low, high, low_open in _BOUNDS:
            amount = _bounded(getattr(self, name), name, low, high, low_open=low_open)
            object.__setattr__(self, name, amount)
        roles = self.hitl_approver_roles
        if isinstance(roles, str) or not all(isinstance(r, str) and r.strip() for r in roles):
            raise ValidationError.for_field(
                "rooms.hitl_approver_roles", "must be a list of role names"
            )
        object.__setattr__(self, "hitl_approver_roles", tuple(roles))
        if not isinstance(self.quorum, Quorum):
            raise ValidationError.for_field("rooms.quorum", "must be a quorum setting")
        if not isinstance(self.version, str) or len(self.version) > MAX_VERSION_CHARS:
            raise ValidationError.for_field(
                "rooms.version", f"must be a string of at most {MAX_VERSION_CHARS} characters"
            )
        if self.version != self.version.strip():
            raise ValidationError.for_field("rooms.version", "must not start or end with spaces")

    @property
    def policy_version(self) -> str:
        """The configured version, else the one derived from the settings."""
        if self.version:
            return self.version
        text = json.dumps(self.settings(), sort_keys=True, separators=(",", ":"))
        return "auto-" + hashlib.sha256(text.encode()).hexdigest()[:12]

    def settings(self) -> dict[str, Any]:
        """Every setting but the version, as JSON values."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"}
        values["hitl_approver_roles"] = list(self.hitl_approver_roles)
        values["quorum"] = self.quorum.as_dict()
        return values

    def record(self, now: float) -> PolicyVersionRecord:
        return PolicyVersionRecord(self.policy_version, self.settings(), now)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> Self:
        """A policy from configuration values by field name (unknown names are refused)."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValidationError.for_field(f"rooms.{key}", "is not a room policy setting")
        given = dict(values)
        if "hitl_approver_roles" in given:
            roles = given["hitl_approver_roles"]
            if isinstance(roles, str) or not isinstance(roles, list | tuple):
                raise ValidationError.for_field(
                    "rooms.hitl_approver_roles", "must be a list of role names"
                )
            given["hitl_approver_roles"] = tuple(roles)
        if "quorum" in given:
            given["quorum"] = Quorum.from_mapping(given["quorum"], "rooms.quorum")
        return cls(**given)

    @classmethod
    def from_record(cls, record: PolicyVersionRecord) -> Self:
        """The policy a stored version names."""
        return cls.from_settings({**record.settings, "version": record.version})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a complete set of votes decides under a policy."""

    outcome: DecisionOutcome
    triggers: tuple[str, ...]
    """Escalation triggers (ESCALATED_TO_HITL) or missed thresholds (REVISION_REQUESTED)."""
    aggregated: AggregatedScore
    average_confidence: float
    pass_ratio: float
    reason: str


def requests_escalation(recommendation: str) -> bool:
    """Whether a recommendation asks for HITL escalation (module docstring)."""
    head = recommendation.split(":", 1)[0].strip().upper()
    return head.replace("-", "_").replace(" ", "_") in ESCALATION_REQUESTS


def escalation_requesters(votes: Sequence[VoteRecord]) -> list[str]:
    """The critics whose recommendations ask for escalation, in vote order."""
    return [v.critic_id for v in votes if any(map(requests_escalation, v.recommendations))]


def evaluate(votes: Sequence[VoteRecord], policy: RoomPolicy, abstentions: int = 0) -> Verdict:
    """Decide a set of votes (at least one) the quorum accepted: escalate, approve or ask for
    revision. `abstentions` (quorum fail_with_abstain) count as votes that did not pass; the
    scores and confidences are the cast votes'."""
    scores = aggregate(votes)
    confidence = average_confidence(votes)
    ratio = sum(1 for v in votes if v.passed) / (len(votes) + abstentions)

    def verdict(outcome: DecisionOutcome, found: list[tuple[str, str]], head: str) -> Verdict:
        why = head + "; ".join(text for _, text in found)
        triggers = tuple(name for name, _ in found)
        return Verdict(outcome, triggers, scores, confidence, ratio, why)

    escalations = _escalations(votes, scores)
    if escalations:
        return verdict(DecisionOutcome.ESCALATED_TO_HITL, escalations, "escalated to HITL: ")
    checks = (
        (Shortfall.SCORE, scores.weighted_mean >= policy.min_score_threshold,
         f"weighted_mean {scores.weighted_mean:.2f}", ">=", policy.min_score_threshold),
        (Shortfall.CONFIDENCE, confidence >= policy.min_confidence_threshold,
         f"average confidence {confidence:.2f}", ">=", policy.min_confidence_threshold),
        (Shortfall.PASS_RATIO, ratio >= policy.min_pass_ratio,
         f"pass ratio {ratio:.2f}", ">=", policy.min_pass_ratio),
        (Shortfall.STD_DEV, scores.std_dev <= policy.max_std_dev,
         f"std_dev {scores.std_dev:.2f}", "<=", policy.max_std_dev),
    )  # fmt: skip
    missed = [(name.value, f"{what} not {op} {limit:g}") for name, ok, what, op, limit in checks
              if not ok]  # fmt: skip
    if missed:
        return verdict(DecisionOutcome.REVISION_REQUESTED, missed, "revision requested: ")
    met = [("", f"{what} {op} {limit:g}") for _, _, what, op, limit in checks]
    return replace(verdict(DecisionOutcome.APPROVED, met, "approved: "), triggers=())


def _escalations(votes: Sequence[VoteRecord], scores: AggregatedScore) -> list[tuple[str, str]]:
    """The mandatory escalation conditions that hold, as (trigger, explanation)."""
    found: list[tuple[str, str]] = []
    unsure = [v for v in votes if v.confidence < ESCALATE_CONFIDENCE_BELOW]
    if unsure:
        who = ", ".join(f"{v.critic_id} {v.confidence:g}" for v in unsure)
        found.append(
            (
                Trigger.LOW_CONFIDENCE.value,
                f"confidence below {ESCALATE_CONFIDENCE_BELOW:g} ({who})",
            )
        )
    if scores.std_dev > ESCALATE_STD_DEV_ABOVE:
        found.append(
            (Trigger.EXTREME_DISAGREEMENT.value,
             f"std_dev {scores.std_dev:.2f} > {ESCALATE_STD_DEV_ABOVE:g}")
        )  # fmt: skip
    requesters = escalation_requesters(votes)
    if requesters:
        who = ", ".join(requesters)
        found.append((Trigger.CRITIC_REQUEST.value, f"escalation requested by {who}"))
    return found


def _bounded(value: object, name: str, low: float, high: float, *, low_open: bool = False) -> float:
    """`value` as a float when it is a finite number within the bounds; else ValidationError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError.for_field(f"rooms.{name}", f"must be a number, got {value!r}")
    amount = float(value)
    above = amount > low if low_open else amount >= low
    if not (math.isfinite(amount) and above and amount <= high):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        limit = f"{bound} and <= {high:g}" if math.isfinite(high) else f"finite and {bound}"
        raise ValidationError.for_field(f"rooms.{name}", f"must be {limit}, got {value!r}")
    return amount
