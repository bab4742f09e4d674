"""The [router] table (RouterSettings), and the lanes tables of [router] and [scheduler]."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from apiary.core.acl import acl_policy
from apiary.core.lanes import DEFAULT_WEIGHTS, LanePolicy
from apiary.engine.settings import RouterSettings, adaptive_policy
from apiary.errors import ValidationError
from apiary.server.config.values import as_table, built, typed, typed_fields

_ROUTER_TYPES: dict[str, type] = {
    "ack_timeout_s": float,
    "max_age_s": float,
    "buffer_capacity": int,
    "dedup_window_s": float,
    "hlc_required": bool,
    "strict_correlation_ids": bool,
    "credit_window": int,
    "per_producer_cap": int,
    "credit_adaptive": bool,
    "credit_min_window": int,
    "credit_target_latency_s": float,
    "max_batch": int,
    "max_deliveries": int,
    "max_frame_items": int,
    "max_frame_bytes": int,
    "hand_over_wait_s": float,
    "signing_required": bool,
    "notice_ttl_s": float,
    "retention_s": float,
}


def router_settings(values: Mapping[str, Any], source: str) -> RouterSettings:
    """RouterSettings from a TOML table; `limits` is a table of per-type payload limits."""
    settings = RouterSettings()
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key == "limits":
            if not isinstance(value, dict):
                raise ValidationError(f"{source}: limits must be a table", {"field": "limits"})
            changes["limits"] = settings.limits.with_overrides(value)
            continue
        if key == "lanes":
            changes["lanes"] = lane_policy(as_table(value, "lanes", source), source)
            continue
        if key == "acl":
            changes["acl"] = built(acl_policy, source, as_table(value, "acl", source))
            continue
        kind = _ROUTER_TYPES.get(key)
        if kind is None:
            known = ", ".join(sorted([*_ROUTER_TYPES, "acl", "lanes", "limits"]))
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": key}
            )
        numeric = (
            kind is not bool and isinstance(value, int | float) and not isinstance(value, bool)
        )
        if not (isinstance(value, kind) or (kind is float and numeric)):
            raise ValidationError(f"{source}: {key} must be {kind.__name__}", {"field": key})
        if kind is not bool and value < _ROUTER_MINIMUMS.get(key, 0):
            raise ValidationError(f"{source}: {key} must not be below its minimum", {"field": key})
        changes[key] = kind(value)
    settings = replace(settings, **changes)
    if settings.credit_adaptive:
        try:
            adaptive_policy(settings)
        except ValidationError as exc:
            raise ValidationError(f"{source}: {exc.message}", exc.details) from None
    return settings


_ROUTER_MINIMUMS = {"buffer_capacity": 1, "max_batch": 1, "credit_min_window": 1}


def lane_policy(values: Mapping[str, Any], source: str, prefix: str = "lanes.") -> LanePolicy:
    """LanePolicy from a lanes table: `weights` (a table of lane = integer, merged over the
    defaults 4/2/1), `privileged_rate` (per second), `privileged_burst`."""
    changes = typed_fields(
        {k: v for k, v in values.items() if k != "weights"},
        {"privileged_rate": float, "privileged_burst": int, "weights": dict},
        prefix,
        source,
    )
    if "weights" in values:
        weights = as_table(values["weights"], f"{prefix}weights", source)
        changes["weights"] = {
            **DEFAULT_WEIGHTS,
            **{k: typed(v, int, f"{prefix}weights.{k}", source) for k, v in weights.items()},
        }
    return built(LanePolicy, source, **changes)
