"""The [presence] table of the configuration file (docs/scheduler.md, "Agent lifecycle"): how often
the coordinator asks each connected agent for a heartbeat, how long an answer may take, and
how many missed checks in a row mark the agent UNAVAILABLE (its tasks then taken back).

[presence]
heartbeat_interval_s = 5.0   # a heartbeat request to each agent this often
heartbeat_timeout_s = 15.0   # an agent must answer within this (RFC 14)
debounce = 3                 # missed checks in a row before UNAVAILABLE

A killed agent is noticed after about heartbeat_timeout_s + debounce x heartbeat_interval_s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from apiary.engine.presence import PresenceSettings
from apiary.errors import ValidationError
from apiary.server.config.values import typed_fields

_TYPES: Final[dict[str, type]] = {
    "heartbeat_interval_s": float,
    "heartbeat_timeout_s": float,
    "debounce": int,
}
MIN_INTERVAL_S: Final = 0.1
MAX_SECONDS: Final = 3600.0
MAX_DEBOUNCE: Final = 100


def presence_settings(values: Mapping[str, Any], source: str) -> PresenceSettings:
    """PresenceSettings from the [presence] table; errors name the setting and `source`."""
    settings = PresenceSettings(**typed_fields(values, _TYPES, "presence.", source))
    for name in ("heartbeat_interval_s", "heartbeat_timeout_s"):
        seconds = getattr(settings, name)
        if not math.isfinite(seconds) or not MIN_INTERVAL_S <= seconds <= MAX_SECONDS:
            raise ValidationError(
                f"{source}: presence.{name} must be between {MIN_INTERVAL_S} and "
                f"{MAX_SECONDS:g} seconds, not {seconds}",
                {"field": f"presence.{name}"},
            )
    if settings.heartbeat_timeout_s < settings.heartbeat_interval_s:
        raise ValidationError(
            f"{source}: presence.heartbeat_timeout_s ({settings.heartbeat_timeout_s:g} s) must "
            f"be at least presence.heartbeat_interval_s ({settings.heartbeat_interval_s:g} s): "
            "an agent cannot answer a request before it is asked",
            {"field": "presence.heartbeat_timeout_s"},
        )
    if not 1 <= settings.debounce <= MAX_DEBOUNCE:
        raise ValidationError(
            f"{source}: presence.debounce must be between 1 and {MAX_DEBOUNCE}, "
            f"not {settings.debounce}",
            {"field": "presence.debounce"},
        )
    return settings
