"""The [handoff] table (HandoffPolicy; docs/handoff.md)."""

from __future__ import annotations

from typing import Any

from apiary.core.handoff_request import HandoffPolicy
from apiary.errors import ValidationError
from apiary.server.config.values import as_table


def handoff_policy(values: Any, path: str) -> HandoffPolicy:
    """The [handoff] table (HandoffPolicy fields; see docs/handoff.md)."""
    table = as_table(values, "handoff", path)
    try:
        return HandoffPolicy.from_settings(table)
    except ValidationError as exc:
        raise ValidationError(f"{path} [handoff]: {exc.message}", exc.details) from None
    except TypeError as exc:  # a value of the wrong type reaching the dataclass
        raise ValidationError(f"{path} [handoff]: {exc}", {"field": "handoff"}) from None
