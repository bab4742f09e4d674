"""CPython settings for a serving coordinator: the garbage collector and thread switching.

Collector. The router allocates several small container objects per message (records,
outcomes, event drafts, protobuf wrappers), and reference counting frees nearly all of them:
cycles are rare. With CPython's default thresholds (700, 10, 10) the cyclic collector still
runs a young collection every 700 allocations and, every hundred of those, a full one that
walks every live object, and the in-memory indexes of a busy coordinator (inboxes, live
messages, deadlines) hold tens of thousands. The route benchmark found about an eighth of
the event loop's time in the collector. So whatever exists once the coordinator has started
(modules, tables, settings: never garbage) is frozen out of collections, and young
collections are rarer. Cycles are still collected, in larger batches.

Switching. The SQLite writer thread (`?writer=thread`; the default writer runs on the event
loop and hands nothing over, store/sqlite/loop_writer.py) gives up the interpreter lock for
every statement it steps and must take it back afterwards; while the event loop is busy,
each retake waits for the loop's switch interval (5 ms by default), and a commit takes a
dozen or more. A shorter interval shortens every commit, and so every wait on a durable
write, for a few more lock hand-overs per second on the loop's side (measured: 16 ms commits
became 12 ms, and the route benchmark's streaming path gained about 8%).
"""

from __future__ import annotations

import gc
import sys

YOUNG_THRESHOLD = 50_000
"""Allocations between young collections (CPython's default is 700)."""
SWITCH_INTERVAL_S = 0.001
"""How long a thread may keep the interpreter lock when another wants it (default 5 ms)."""


def tune_for_serving() -> None:
    """Apply the serving settings to this process (call once, after start-up)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
