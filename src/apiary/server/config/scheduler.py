"""The [scheduler] table and its sub-tables (SchedulerSettings; docs/scheduler.md,
"Configuration"): instance limits, conflicts, preemption, lanes, lifecycle, inference."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

from apiary.core.agent_lifecycle import LifecycleTimeouts
from apiary.core.conflicts import ConflictPolicy
from apiary.core.preemption import PreemptionPolicy
from apiary.engine.inference import InferenceSettings
from apiary.engine.lifecycle import LifecycleSettings
from apiary.engine.settings import SchedulerSettings
from apiary.errors import ValidationError
from apiary.server.config.router import lane_policy
from apiary.server.config.values import as_table, built, check_known, typed, typed_fields

_SCHEDULER_TYPES: dict[str, type] = {
    "default_max_parallel": int,
    "max_queued": int,
    "duplicate_jobs": str,
    "dispatch_attempts": int,
    "max_attempts": int,
    "prefetch": int,
    "retry_after_s": float,
    "inference_timeout_s": float,
    "hitl_timeout_s": float,
}
_SCHEDULER_TABLES = (
    "max_parallel_instances", "conflicts", "preemption", "lanes", "lifecycle", "inference",
)  # fmt: skip
_POSITIVE = ("retry_after_s", "inference_timeout_s")
_TIMEOUT_KEYS = tuple(f.name for f in fields(LifecycleTimeouts))
_INFERENCE_TYPES: dict[str, type] = {
    "kind": str,
    "url": str,
    "model": str,
    "api_key_env": str,
    "timeout_s": float,
}


def _instance_limits(values: Any, source: str) -> dict[str, int]:
    table = as_table(values, "max_parallel_instances", source)
    return {k: typed(v, int, f"max_parallel_instances.{k}", source) for k, v in table.items()}


def _conflict_policy(values: Any, source: str) -> ConflictPolicy:
    table = as_table(values, "conflicts", source)
    known = {"threshold": float, "serialize_below": float, "overrides": dict}
    scalars = {k: v for k, v in table.items() if k != "overrides"}
    changes: dict[str, Any] = typed_fields(scalars, known, "conflicts.", source)
    if "overrides" in table:
        overrides = as_table(table["overrides"], "conflicts.overrides", source)
        changes["overrides"] = {
            k: typed(v, str, f"conflicts.overrides.{k}", source) for k, v in overrides.items()
        }
    return built(ConflictPolicy, source, **changes)


def _timeouts(
    values: Mapping[str, Any], base: LifecycleTimeouts, prefix: str, source: str
) -> LifecycleTimeouts:
    """`base` with the timeouts of `values` (seconds; `waiting = 0` means no timeout)."""
    changes = typed_fields(values, dict.fromkeys(_TIMEOUT_KEYS, float), prefix, source)
    if changes.get("waiting") == 0.0:
        changes["waiting"] = None

    def build(**kwargs: Any) -> LifecycleTimeouts:
        return replace(base, **kwargs)

    return built(build, source, **changes)


def _lifecycle(values: Any, source: str) -> LifecycleSettings:
    table = as_table(values, "lifecycle", source)
    known = {"auto_recover": bool, "max_auto_recoveries": int, "timeouts": dict, "per_type": dict}
    scalars = {k: v for k, v in table.items() if k not in ("timeouts", "per_type")}
    changes: dict[str, Any] = typed_fields(scalars, known, "lifecycle.", source)
    base = LifecycleSettings().timeouts
    if "timeouts" in table:
        timeouts = as_table(table["timeouts"], "lifecycle.timeouts", source)
        base = _timeouts(timeouts, base, "lifecycle.timeouts.", source)
        changes["timeouts"] = base
    if "per_type" in table:
        per_type = as_table(table["per_type"], "lifecycle.per_type", source)
        changes["per_type"] = {
            name: _timeouts(
                as_table(entry, f"lifecycle.per_type.{name}", source),
                base,
                f"lifecycle.per_type.{name}.",
                source,
            )
            for name, entry in per_type.items()
        }
    return built(LifecycleSettings, source, **changes)


def _inference(values: Any, source: str) -> InferenceSettings:
    table = as_table(values, "inference", source)
    if "api_key" in table:
        raise ValidationError(
            f"{source}: inference.api_key is not read from the file; put the key in an "
            "environment variable and name it in inference.api_key_env",
            {"field": "inference.api_key"},
        )
    changes = typed_fields(table, _INFERENCE_TYPES, "inference.", source)
    return built(InferenceSettings, source, **changes)


_SCHEDULER_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "max_parallel_instances": _instance_limits,
    "conflicts": _conflict_policy,
    "preemption": lambda v, s: built(
        PreemptionPolicy,
        s,
        **typed_fields(
            as_table(v, "preemption", s),
            {"safe_point_timeout_s": float, "grace_s": float, "max_section_s": float},
            "preemption.",
            s,
        ),
    ),
    "lanes": lambda v, s: lane_policy(as_table(v, "lanes", s), s),
    "lifecycle": _lifecycle,
    "inference": _inference,
}


def scheduler_settings(values: Mapping[str, Any], source: str) -> SchedulerSettings:
    """SchedulerSettings from the [scheduler] table and its sub-tables (docs/scheduler.md).

    Errors name the setting, dotted below [scheduler] (`conflicts.threshold`), and `source`.
    """
    scalars = {k: v for k, v in values.items() if k not in _SCHEDULER_TABLES}
    check_known(scalars, {*_SCHEDULER_TYPES, *_SCHEDULER_TABLES}, "", source)
    changes: dict[str, Any] = {
        k: typed(v, _SCHEDULER_TYPES[k], k, source) for k, v in scalars.items()
    }
    for name in _POSITIVE:
        if name in changes and changes[name] <= 0:
            raise ValidationError(f"{source}: {name} must be > 0", {"field": name})
    if changes.get("hitl_timeout_s", 0.0) < 0:
        raise ValidationError(
            f"{source}: hitl_timeout_s must be >= 0 (0: the [hitl] default)",
            {"field": "hitl_timeout_s"},
        )
    for name in _SCHEDULER_TABLES:
        if name in values:
            changes[name] = _SCHEDULER_PARSERS[name](values[name], source)
    return built(SchedulerSettings, source, **changes)
