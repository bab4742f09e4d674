"""The [limits] table of the configuration file (docs/decisions.md, "Limits"): the limits on
what a client may send, each key a field of `core.limits.Limits`.

[limits]
agent_id_bytes = 256
correlation_id_bytes = 256
idempotency_token_bytes = 512
text_bytes = 16384          # reasons, notes, descriptions
document_bytes = 1048576    # JSON text fields
json_depth = 64
clock_skew_s = 3600.0       # how far ahead of the coordinator's clock a timestamp may lie
timestamp_age_s = 0.0       # how far behind it (0: back to the epoch)
max_duration_s = 31622400.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apiary.core.limits import Limits, settings
from apiary.server.config.values import built, typed_fields

_TYPES: dict[str, type] = {f.name: float if f.name.endswith("_s") else int for f in settings()}


def limits_settings(values: Mapping[str, Any], source: str) -> Limits:
    """Limits from the [limits] table; errors name the setting and `source`."""
    return built(Limits, source, **typed_fields(values, _TYPES, "limits.", source))
