"""Garbage-collector settings for a serving coordinator.

The router allocates several small container objects per message (records, outcomes, event
drafts, protobuf wrappers), and reference counting frees nearly all of them: cycles are rare.
With CPython's default thresholds (700, 10, 10) the cyclic collector still runs a young
collection every 700 allocations and, every hundred of those, a full one that walks every
live object, and the in-memory indexes of a busy coordinator (inboxes, live messages,
deadlines) hold tens of thousands. The route benchmark found about an eighth of the event
loop's time in the collector.

`tune_for_serving` freezes whatever exists once the coordinator has started (modules,
tables, settings: never garbage, so never worth scanning again) and makes young collections
rarer. Cycles are still collected, in larger batches.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Allocations between young collections (CPython's default is 700)."""


def tune_for_serving() -> None:
    """Apply the serving settings to this process (call once, after start-up)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
