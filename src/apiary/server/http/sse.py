"""Server-sent events, as the console's event stream and the runtime control plane's
channel write them: one frame per event, and the wait between writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable


def frame(sequence: int | None, doc: object) -> bytes:
    """One event frame: its id, then its JSON on one `data:` line (json.dumps escapes every
    line break)."""
    data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"id: {sequence}\ndata: {data}\n\n".encode()


async def woken_before_close(
    woken: Awaitable[None], closing: asyncio.Event, keepalive_s: float
) -> bool:
    """Wait until `woken` (True), `closing` is set or `keepalive_s` passes (False: write a
    keep-alive, or end the stream when closing)."""
    wake = asyncio.ensure_future(woken)
    close = asyncio.ensure_future(closing.wait())
    try:
        done, _ = await asyncio.wait(
            {wake, close}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiter in (wake, close):
            waiter.cancel()
        await asyncio.gather(wake, close, return_exceptions=True)
    return wake in done and not closing.is_set()
