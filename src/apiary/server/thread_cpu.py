"""CPU time of the coordinator's threads by name (Linux: /proc/self/task/<tid>/stat).

The event loop and the embedded store's writer share one interpreter; where a load's time
goes between them (and the WAL checkpointer) is the first thing to know about its
throughput (docs/performance.md). Exported at /metrics and read by bench/route.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_TASKS = Path("/proc/self/task")


def stat_cpu_ticks(stat: str) -> int:
    """User plus system clock ticks from a /proc/<pid>/task/<tid>/stat line. The command
    name (field 2) is in parentheses and may hold spaces and parentheses itself, so the
    fields are counted from the last ')': utime and stime are fields 14 and 15."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by each live Python thread, summed by thread name; empty
    where /proc has no per-thread stat (not Linux)."""
    if not _TASKS.is_dir():
        return {}
    per_second = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        try:
            stat = (_TASKS / str(thread.native_id) / "stat").read_text()
        except OSError:
            continue  # ended since it was listed
        seconds[thread.name] = seconds.get(thread.name, 0.0) + stat_cpu_ticks(stat) / per_second
    return seconds


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds used so far by the process `pid` (all its threads), None when /proc has
    no such process (it ended, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_cpu_ticks(stat) / os.sysconf("SC_CLK_TCK")
