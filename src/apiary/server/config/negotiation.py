"""The [negotiation] table of the configuration file (docs/negotiation.md):

[negotiation]
deadlock = "escalate"              # or "tie_break"
hitl_timeout_s = 600.0             # 0: the [hitl] default
inference_timeout_s = 5.0
shorten_without_inference = true

[negotiation.base_policy]          # NegotiationPolicy fields (policy.proto names)
max_rounds = 6
score_threshold = 0.8
hitl = { mode = "PauseOnFinalAccept" }
scoring = { require_schema_valid = true, llm_weight = 0.2 }

[negotiation.guardrails]           # [low, high] per limit, and the debate timeout cap
max_rounds = [1, 20]
score_threshold = [0.6, 1.0]
max_debate_timeout_s = 3600.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from apiary.core.negotiation.policy import Bounds, Guardrails, NegotiationPolicy
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.errors import ValidationError

_SCALARS: dict[str, type] = {
    "deadlock": str,
    "hitl_timeout_s": float,
    "inference_timeout_s": float,
    "shorten_without_inference": bool,
}


def negotiation_settings(values: Mapping[str, Any], source: str) -> NegotiationSettings:
    """NegotiationSettings from the [negotiation] table; errors name the setting."""
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key == "base_policy":
            changes[key] = _policy(value, source)
        elif key == "guardrails":
            changes[key] = _guardrails(value, source)
        elif key in _SCALARS:
            changes[key] = _typed(value, _SCALARS[key], f"negotiation.{key}", source)
        else:
            known = ", ".join(sorted([*_SCALARS, "base_policy", "guardrails"]))
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": f"negotiation.{key}"}
            )
    try:
        return NegotiationSettings(**changes)
    except ValidationError as exc:
        raise ValidationError(f"{source}: {exc.message}", exc.details) from None


def _policy(value: Any, source: str) -> NegotiationPolicy:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{source}: base_policy must be a table", {"field": "base_policy"})
    try:
        return NegotiationPolicy.from_json(value, "negotiation.base_policy")
    except (ValidationError, TypeError) as exc:
        message = exc.message if isinstance(exc, ValidationError) else str(exc)
        raise ValidationError(
            f"{source}: {message}", {"field": "negotiation.base_policy"}
        ) from None


def _guardrails(value: Any, source: str) -> Guardrails:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{source}: guardrails must be a table", {"field": "guardrails"})
    names = {f.name for f in fields(Guardrails)}
    changes: dict[str, Any] = {}
    for key, item in value.items():
        name = f"negotiation.guardrails.{key}"
        if key not in names:
            raise ValidationError(f"{source}: unknown guardrail {key}", {"field": name})
        if key == "max_debate_timeout_s":
            changes[key] = _typed(item, float, name, source)
            continue
        if (not isinstance(item, list) or len(item) != 2
                or not all(_number(x) for x in item) or item[0] > item[1]):  # fmt: skip
            raise ValidationError(f"{source}: {key} must be [low, high]", {"field": name})
        changes[key] = Bounds(float(item[0]), float(item[1]))
    return Guardrails(**changes)


def _typed(value: Any, kind: type, name: str, source: str) -> Any:
    if kind is float and _number(value):
        return float(value)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ValidationError(f"{source}: {name} must be {kind.__name__}", {"field": name})
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
