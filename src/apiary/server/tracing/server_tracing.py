"""What the coordinator asks of its tracing (docs/tracing.md)."""

from __future__ import annotations

from typing import Protocol

from apiary.engine.tracing import Tracing
from apiary.server.dispatch import CallTracing


class ServerTracing(Tracing, CallTracing, Protocol):
    """The engine's part (contexts and its own spans) and a span per unary call (the
    dispatcher's part)."""

    async def close(self) -> None:
        """Export what is left and stop (a tracing the coordinator made, not one given)."""
        ...
