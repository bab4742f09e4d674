"""Retention (RFC 21.1: bound DLQ storage; RFC 5.5: time windows for resume).

Finished messages, idempotency records and DLQ entries older than the retention period are
purged periodically. Idempotency records are always kept for at least the deduplication
window (RFC 11.2). A stream position inside purged history then fails with resume_expired.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from apiary.core.clock import Clock
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.settings import RouterSettings
from apiary.store.protocols import Store

Sleep = Callable[[float], Awaitable[None]]


async def purge_expired(
    store: Store, clock: Clock, settings: RouterSettings, events: EventRecorder
) -> dict[str, int]:
    """One retention pass; returns how many of each kind were purged."""
    now = clock.now()
    keep_tokens = max(settings.retention_s, settings.dedup_window_s)
    purged = {
        "messages": await store.messages.purge_finished(now - settings.retention_s),
        "idempotency": await store.idempotency.purge(now - keep_tokens),
        "dlq": await store.dlq.purge(now - settings.retention_s),
    }
    if any(purged.values()):
        await events.record(
            "retention.purged", COORDINATOR,
            messages=purged["messages"], idempotency=purged["idempotency"], dlq=purged["dlq"],
        )  # fmt: skip
    return purged


async def run_retention(
    store: Store, clock: Clock, settings: RouterSettings, events: EventRecorder, sleep: Sleep
) -> None:
    """Forever: a pass every tenth of the retention period (at most hourly)."""
    interval = min(settings.retention_s / 10, 3600.0)
    while True:
        await sleep(interval)
        await purge_expired(store, clock, settings, events)
