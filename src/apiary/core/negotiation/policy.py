"""Negotiation policy (RFC 17, 17.2): the base policy, intensity profiles, agent preferences
clamped to the Scheduler's guardrails, and the EffectivePolicy derived from them.

Decisions this module makes where the RFC is silent:
- `debate_intensity_factor` scales a base policy (`INTENSITY_SCALES`): rounds and time limits
  grow with the intensity, and so does the score threshold (a harder debate asks for more
  agreement). MEDIUM is the base policy itself. A profile named like an intensity
  (SetPolicyProfiles "HIGH") replaces the scaled policy for that intensity.
- Agent preferences can only tighten a policy: each preference is first clamped into the
  guardrails, then the stricter of policy and preference wins per field (fewer rounds, less
  time, smaller budgets, a higher threshold, a smaller diff tolerance, fewer oscillations).
- A budget of 0 means "no budget" for both token budgets (the proto says so for
  total_token_budget; token_budget_per_round follows it).
- The debate timeout defaults to `round_timeout_ms * max_rounds` and never exceeds the
  guardrails' `max_debate_timeout_s`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Final

from apiary.errors import ValidationError


class HitlGate(StrEnum):
    """`NegotiationPolicy.hitl.mode` (RFC 17.2), spelled as the RFC writes it."""

    NONE = "None"
    PAUSE_BETWEEN_ROUNDS = "PauseBetweenRounds"
    PAUSE_ON_FINAL_ACCEPT = "PauseOnFinalAccept"


class Intensity(StrEnum):
    """`sw4rm.common.DebateIntensity`, same names and order (1..5)."""

    LOWEST = "LOWEST"
    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"
    HIGHEST = "HIGHEST"


def parse_intensity(value: object, name: str = "intensity") -> Intensity:
    """An intensity by name in any case or by proto number 1..5; 0/unspecified is refused."""
    names = ", ".join(i.value for i in Intensity)
    if isinstance(value, int) and not isinstance(value, bool):
        if 1 <= value <= len(Intensity):
            return list(Intensity)[value - 1]
        if value == 0:
            raise ValidationError.for_field(name, f"is required: one of {names}")
    elif isinstance(value, str):
        found = Intensity._value2member_map_.get(value.strip().upper())
        if isinstance(found, Intensity):
            return found
    raise ValidationError.for_field(name, f"must be one of {names}, got {value!r}")


def parse_gate(value: object, name: str = "policy.hitl.mode") -> HitlGate:
    """A HITL gate in any case; "" means None (proto3 leaves the string empty)."""
    if value in ("", None):
        return HitlGate.NONE
    if isinstance(value, str):
        for gate in HitlGate:
            if gate.value.lower() == value.strip().lower():
                return gate
    names = ", ".join(g.value for g in HitlGate)
    raise ValidationError.for_field(name, f"must be one of {names}, got {value!r}")


@dataclass(frozen=True, slots=True)
class NegotiationPolicy:
    """`sw4rm.policy.NegotiationPolicy` as a domain value (validated on construction)."""

    max_rounds: int = 6
    score_threshold: float = 0.8
    diff_tolerance: float = 1.0
    round_timeout_ms: int = 60_000
    token_budget_per_round: int = 8192
    total_token_budget: int = 0
    oscillation_limit: int = 2
    hitl: HitlGate = HitlGate.NONE
    require_schema_valid: bool = True
    require_examples_pass: bool = False
    llm_weight: float = 0.0

    def __post_init__(self) -> None:
        self.check("policy")

    def check(self, prefix: str) -> None:
        """Raise ValidationError naming `prefix.<field>` for the first bad field."""
        _int_at_least(self.max_rounds, 1, f"{prefix}.max_rounds")
        _int_at_least(self.round_timeout_ms, 1, f"{prefix}.round_timeout_ms")
        for name in ("token_budget_per_round", "total_token_budget", "oscillation_limit"):
            _int_at_least(getattr(self, name), 0, f"{prefix}.{name}")
        for name in ("score_threshold", "diff_tolerance", "llm_weight"):
            _unit(getattr(self, name), f"{prefix}.{name}")
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("require_schema_valid", "require_examples_pass"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError.for_field(f"{prefix}.scoring.{name}", "must be a boolean")
        object.__setattr__(self, "hitl", parse_gate(self.hitl, f"{prefix}.hitl.mode"))

    def to_json(self) -> dict[str, Any]:
        """The policy as JSON, shaped like the proto (snake_case, nested hitl and scoring)."""
        return {
            "max_rounds": self.max_rounds,
            "score_threshold": self.score_threshold,
            "diff_tolerance": self.diff_tolerance,
            "round_timeout_ms": self.round_timeout_ms,
            "token_budget_per_round": self.token_budget_per_round,
            "total_token_budget": self.total_token_budget,
            "oscillation_limit": self.oscillation_limit,
            "hitl": {"mode": self.hitl.value},
            "scoring": {
                "require_schema_valid": self.require_schema_valid,
                "require_examples_pass": self.require_examples_pass,
                "llm_weight": self.llm_weight,
            },
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], prefix: str = "policy") -> NegotiationPolicy:
        """A policy from `to_json`'s shape; missing fields take the defaults, unknown ones
        are refused (naming them)."""
        if not isinstance(doc, Mapping):
            raise ValidationError.for_field(prefix, "must be a JSON object")
        flat = dict(doc)
        hitl = flat.pop("hitl", {})
        scoring = flat.pop("scoring", {})
        for nested, name in ((hitl, "hitl"), (scoring, "scoring")):
            if not isinstance(nested, Mapping):
                raise ValidationError.for_field(f"{prefix}.{name}", "must be a JSON object")
        if "mode" in hitl:
            flat["hitl"] = hitl["mode"]
        flat.update(scoring)
        known = {f.name for f in fields(cls)}
        for key in flat:
            if key not in known:
                raise ValidationError.for_field(f"{prefix}.{key}", "is not a policy field")
        try:
            policy = cls(**{**flat, "hitl": parse_gate(flat.get("hitl", ""), f"{prefix}.hitl")})
        except ValidationError as exc:
            raise _renamed(exc, prefix) from None
        return policy


def _renamed(exc: ValidationError, prefix: str) -> ValidationError:
    bad = exc.details.get("field", "")
    if not bad.startswith("policy.") or prefix == "policy":
        return exc
    name = prefix + bad.removeprefix("policy")
    return ValidationError.for_field(name, exc.message.split(": ", 1)[-1])


PREFERENCE_FIELDS: Final = (
    "max_rounds", "score_threshold", "diff_tolerance", "round_timeout_ms",
    "token_budget_per_round", "total_token_budget", "oscillation_limit",
)  # fmt: skip
"""The fields of `sw4rm.policy.AgentPreferences` (the policy's first seven)."""
BUDGETS: Final = frozenset({"token_budget_per_round", "total_token_budget"})
"""Token budgets, where 0 means "no budget"."""


@dataclass(frozen=True, slots=True)
class AgentPreferences:
    """An agent's advisory preferences (`sw4rm.policy.AgentPreferences`); None: no preference.

    proto3 cannot tell 0 from unset, so the wire converter maps 0 to None.
    """

    max_rounds: int | None = None
    score_threshold: float | None = None
    diff_tolerance: float | None = None
    round_timeout_ms: int | None = None
    token_budget_per_round: int | None = None
    total_token_budget: int | None = None
    oscillation_limit: int | None = None

    def check(self, prefix: str) -> None:
        for name in ("max_rounds", "round_timeout_ms"):
            if (value := getattr(self, name)) is not None:
                _int_at_least(value, 1, f"{prefix}.{name}")
        for name in ("token_budget_per_round", "total_token_budget", "oscillation_limit"):
            if (value := getattr(self, name)) is not None:
                _int_at_least(value, 0, f"{prefix}.{name}")
        for name in ("score_threshold", "diff_tolerance"):
            if (value := getattr(self, name)) is not None:
                _unit(value, f"{prefix}.{name}")

    def to_json(self) -> dict[str, Any]:
        """The set preferences only."""
        return {n: getattr(self, n) for n in PREFERENCE_FIELDS if getattr(self, n) is not None}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], prefix: str = "preferences") -> AgentPreferences:
        if not isinstance(doc, Mapping):
            raise ValidationError.for_field(prefix, "must be a JSON object")
        for key in doc:
            if key not in PREFERENCE_FIELDS:
                raise ValidationError.for_field(f"{prefix}.{key}", "is not a preference field")
        prefs = cls(**{k: v for k, v in doc.items() if v is not None})
        prefs.check(prefix)
        return prefs


@dataclass(frozen=True, slots=True)
class Bounds:
    low: float
    high: float

    def clamp(self, value: float) -> float:
        return min(max(value, self.low), self.high)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True, slots=True)
class Guardrails:
    """The Scheduler's hard limits (`[negotiation.guardrails]`): every policy it accepts lies
    within them and every preference is clamped into them. Budgets of 0 ("none") are always
    allowed for the token budgets."""

    max_rounds: Bounds = Bounds(1, 50)
    score_threshold: Bounds = Bounds(0.5, 1.0)
    diff_tolerance: Bounds = Bounds(0.0, 1.0)
    round_timeout_ms: Bounds = Bounds(1_000, 3_600_000)
    token_budget_per_round: Bounds = Bounds(1, 10_000_000)
    total_token_budget: Bounds = Bounds(1, 1_000_000_000)
    oscillation_limit: Bounds = Bounds(0, 20)
    max_debate_timeout_s: float = 86_400.0

    def violation(self, policy: NegotiationPolicy, prefix: str = "policy") -> str:
        """'' when `policy` lies within the guardrails, else why not (naming the field)."""
        for name in PREFERENCE_FIELDS:
            value = getattr(policy, name)
            bounds: Bounds = getattr(self, name)
            if name in BUDGETS and value == 0:
                continue
            if not bounds.contains(value):
                return (
                    f"{prefix}.{name}: {_num(value)} is outside the guardrails "
                    f"[{_num(bounds.low)}, {_num(bounds.high)}]"
                )
        return ""

    def clamp(self, prefs: AgentPreferences) -> AgentPreferences:
        """`prefs` with every set field clamped into the guardrails (0 budgets stay 0)."""
        changes: dict[str, Any] = {}
        for name in PREFERENCE_FIELDS:
            value = getattr(prefs, name)
            if value is None or (name in BUDGETS and value == 0):
                continue
            clamped = getattr(self, name).clamp(value)
            changes[name] = type(value)(clamped) if isinstance(value, int) else float(clamped)
        return replace(prefs, **changes)

    def clamp_policy(self, policy: NegotiationPolicy) -> NegotiationPolicy:
        """`policy` with its limits clamped into the guardrails (scaled profiles)."""
        clamped = self.clamp(AgentPreferences(**{n: getattr(policy, n) for n in PREFERENCE_FIELDS}))
        return replace(policy, **clamped.to_json())


@dataclass(frozen=True, slots=True)
class Scale:
    """How an intensity scales the base policy (see the module docstring)."""

    rounds: float
    time: float
    threshold: float


INTENSITY_SCALES: Final[Mapping[Intensity, Scale]] = {
    Intensity.LOWEST: Scale(rounds=0.25, time=0.25, threshold=-0.15),
    Intensity.LOW: Scale(rounds=0.5, time=0.5, threshold=-0.05),
    Intensity.MEDIUM: Scale(rounds=1.0, time=1.0, threshold=0.0),
    Intensity.HIGH: Scale(rounds=1.5, time=2.0, threshold=0.05),
    Intensity.HIGHEST: Scale(rounds=2.0, time=4.0, threshold=0.1),
}
"""The guardrails each debate_intensity_factor maps to, relative to the base policy."""


def intensity_policy(
    base: NegotiationPolicy, intensity: Intensity, guardrails: Guardrails
) -> NegotiationPolicy:
    """The base policy scaled for `intensity` (round limit, time limit, score threshold)."""
    scale = INTENSITY_SCALES[intensity]
    scaled = replace(
        base,
        max_rounds=max(1, round(base.max_rounds * scale.rounds)),
        round_timeout_ms=max(1, round(base.round_timeout_ms * scale.time)),
        score_threshold=round(min(1.0, max(0.0, base.score_threshold + scale.threshold)), 6),
    )
    return guardrails.clamp_policy(scaled)


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """`sw4rm.policy.EffectivePolicy`: the authoritative policy of one negotiation and the
    clamped preferences of each agent that gave some."""

    policy: NegotiationPolicy
    applied: Mapping[str, AgentPreferences] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_json(),
            "applied": {agent: p.to_json() for agent, p in sorted(self.applied.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EffectivePolicy:
        applied = doc.get("applied") or {}
        return cls(
            NegotiationPolicy.from_json(doc.get("policy") or {}),
            {a: AgentPreferences.from_json(p, f"applied.{a}") for a, p in applied.items()},
        )


_Strict = Callable[[Any, Any], Any]


def _smaller_budget(a: int, b: int) -> int:
    """The stricter of two budgets where 0 means none."""
    if a == 0 or b == 0:
        return a or b
    return min(a, b)


_STRICTER: Final[Mapping[str, _Strict]] = {
    "max_rounds": min,
    "score_threshold": max,
    "diff_tolerance": min,
    "round_timeout_ms": min,
    "token_budget_per_round": _smaller_budget,
    "total_token_budget": _smaller_budget,
    "oscillation_limit": min,
}


def derive_effective(
    policy: NegotiationPolicy,
    preferences: Mapping[str, AgentPreferences],
    guardrails: Guardrails,
) -> EffectivePolicy:
    """RFC 17.2: the EffectivePolicy from a base policy and clamped agent preferences."""
    applied = {agent: guardrails.clamp(prefs) for agent, prefs in preferences.items()}
    values = {n: getattr(policy, n) for n in PREFERENCE_FIELDS}
    for prefs in applied.values():
        for name, value in prefs.to_json().items():
            values[name] = _STRICTER[name](values[name], value)
    return EffectivePolicy(replace(policy, **values), applied)


def debate_timeout_s(
    policy: NegotiationPolicy, requested_s: float, guardrails: Guardrails
) -> float:
    """The debate timeout: the one requested at Open (0: `round_timeout * max_rounds`), which
    must not exceed the guardrails."""
    if not (_number(requested_s) and math.isfinite(requested_s) and requested_s >= 0):
        raise ValidationError.for_field("debate_timeout", "must be a non-negative duration")
    if requested_s > guardrails.max_debate_timeout_s:
        raise ValidationError.for_field(
            "debate_timeout",
            f"{requested_s:g} s exceeds the guardrail of {guardrails.max_debate_timeout_s:g} s",
        )
    if requested_s:
        return float(requested_s)
    natural = policy.round_timeout_ms * policy.max_rounds / 1000
    return min(natural, guardrails.max_debate_timeout_s)


def _int_at_least(value: object, low: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError.for_field(name, "must be an integer")
    if value < low:
        raise ValidationError.for_field(name, f"must be >= {low}, got {value}")


def _unit(value: object, name: str) -> None:
    if not (_number(value) and 0.0 <= value <= 1.0):  # type: ignore[operator]
        raise ValidationError.for_field(name, f"must be a number in [0, 1], got {value!r}")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(value: float) -> str:
    return f"{value:g}"
