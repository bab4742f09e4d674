"""The [hitl] table and its [[hitl.operators]] (HitlSettings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apiary.core.hitl.policy import HitlPolicy
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import ValidationError

_HITL_POLICY = {
    "timeout_s": ("default_timeout_s", float),
    "timeout_action": ("timeout_action", str),
    "unavailable_policy": ("unavailable_policy", str),
    "auto_decide_threshold": ("auto_decide_threshold", float),
    "max_extensions": ("max_extensions", int),
    "enabled": ("enabled", bool),
}


def _operator_entries(values: Any, source: str) -> tuple[OperatorEntry, ...]:
    if not isinstance(values, list):
        raise ValidationError(
            f"{source}: operators must be [[hitl.operators]] tables", {"field": "operators"}
        )
    entries = []
    for i, entry in enumerate(values):
        where = f"{source} operators[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValidationError(f"{where}: needs a name", {"field": "operators.name"})
        token, digest = entry.get("token"), entry.get("token_sha256")
        if not isinstance(token, str) and not isinstance(digest, str):
            raise ValidationError(
                f"{where}: needs token or token_sha256", {"field": "operators.token"}
            )
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ValidationError(
                f"{where}: roles must be a list of strings", {"field": "operators.roles"}
            )
        entries.append(
            OperatorEntry(
                entry["name"],
                digest if isinstance(digest, str) else token_digest(str(token)),
                tuple(roles),
            )
        )
    return tuple(entries)


def hitl_settings(values: Mapping[str, Any], source: str) -> HitlSettings:
    """HitlSettings from the [hitl] table (policy keys, presence keys, operators)."""
    policy: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in values.items():
        if key == "operators":
            settings["operators"] = _operator_entries(value, source)
        elif key in ("presence_required", "presence_window_s"):
            settings[key] = value
        elif key in _HITL_POLICY:
            name, kind = _HITL_POLICY[key]
            number = kind is float and isinstance(value, int) and not isinstance(value, bool)
            if not (number or isinstance(value, kind)):
                raise ValidationError(f"{source}: {key} must be {kind.__name__}", {"field": key})
            policy[name] = float(value) if number else value
        else:
            known = ", ".join(
                sorted([*_HITL_POLICY, "operators", "presence_required", "presence_window_s"])
            )
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": key}
            )
    try:
        built = HitlPolicy.from_settings(policy)
    except ValueError as exc:
        raise ValidationError(f"{source}: {exc}", {"field": "hitl"}) from None
    return HitlSettings(policy=built, **settings)
