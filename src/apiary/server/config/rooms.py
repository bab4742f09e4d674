"""The [rooms] table (RoomSettings; docs/negotiation-rooms.md, "Configuration")."""

from __future__ import annotations

from typing import Any

from apiary.engine.negotiation.rooms import RoomSettings
from apiary.errors import ValidationError
from apiary.server.config.values import built


def room_settings(values: Any, source: str) -> RoomSettings:
    """RoomSettings from the [rooms] table; errors name the setting and `source`."""
    if not isinstance(values, dict):
        raise ValidationError(f"{source}: [rooms] must be a table", {"field": "rooms"})
    return built(RoomSettings.from_settings, source, values)
