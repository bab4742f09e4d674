"""The [runtime] table of the configuration file: the runtime control plane's limits and
windows (docs/control-plane.md, "Configuration").

[runtime]
max_input_bytes = 1048576   # a turn's input (its JSON text) at most; the HTTP body holds 2 MiB
max_queued_turns = 100      # turns waiting in one thread's queue (buffer_full past it)
turns_shown = 20            # a snapshot's last turns per thread (open ones shown besides)
tasks_listed = 200          # list_tasks: the tasks of each thread's last turns
replay_limit = 500          # events one reconnect_channel answer replays (more: `more`)
channel_ttl_s = 86400.0     # a channel unused this long expires
text_bytes = 16384          # free text (reasons, titles) at most
max_job_items = 1000        # create_job: items (tasks) one job holds at most
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from apiary.controlplane.settings import RuntimeSettings
from apiary.core.limits import KIB, MIB
from apiary.errors import ValidationError
from apiary.server.config.values import typed_fields

_BOUNDS: Final[dict[str, tuple[type, float, float]]] = {
    "max_input_bytes": (int, 1, 1 * MIB),
    "max_queued_turns": (int, 1, 100_000),
    "turns_shown": (int, 1, 1000),
    "tasks_listed": (int, 1, 10_000),
    "replay_limit": (int, 1, 5000),
    "channel_ttl_s": (float, 60.0, 30 * 24 * 3600.0),
    "text_bytes": (int, 1, 64 * KIB),
    "max_job_items": (int, 1, 100_000),
}
"""Each setting's type and its least and greatest value."""


def runtime_settings(values: Mapping[str, Any], source: str) -> RuntimeSettings:
    """RuntimeSettings from the [runtime] table; errors name the setting and `source`."""
    types = {name: kind for name, (kind, _, _) in _BOUNDS.items()}
    given = typed_fields(values, types, "runtime.", source)
    for name, value in given.items():
        _, least, most = _BOUNDS[name]
        if not math.isfinite(value) or not least <= value <= most:
            raise ValidationError(
                f"{source}: runtime.{name} must be between {least:g} and {most:g}, not {value}",
                {"field": f"runtime.{name}"},
            )
    return RuntimeSettings(**given)
