"""Processes as /proc shows them: descendants, their CPU time, killing a whole tree.

No /proc/PID/task/TID/children here (CONFIG_PROC_CHILDREN is often off), so a tree is found by
reading every /proc/PID/stat once and linking parents to children. Reading ~100 small files
takes about a millisecond, cheap enough for the CPU-budget monitor's ticks.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Final

_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class _Stat:
    ppid: int
    zombie: bool
    """Exited already (Z or X): nothing left to kill."""
    own_ticks: int
    """utime + stime (every thread)."""
    reaped_ticks: int
    """cutime + cstime: children this process has waited for."""


def _read_stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read()
    except OSError:  # gone, or not ours to read
        return None
    rest = text[text.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state) of proc(5): ppid 4, utime 14, stime 15, cutime 16, cstime 17
    return _Stat(
        ppid=int(rest[1]),
        zombie=rest[0] in (b"Z", b"X"),  # exited: a zombie, or dead and being released
        own_ticks=int(rest[11]) + int(rest[12]),
        reaped_ticks=int(rest[13]) + int(rest[14]),
    )


def _snapshot() -> dict[int, _Stat]:
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None:
                table[int(entry.name)] = stat
    return table


def _tree(root: int, table: dict[int, _Stat]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    out: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            out.append(child)
            frontier.append(child)
    return out


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of `pid`, parents before their children."""
    table = _snapshot()
    return [p for p in _tree(pid, table) if not table[p].zombie]


def _ms(ticks: int) -> int:
    return ticks * 1000 // _TICKS_PER_S


def process_cpu_ms(pid: int) -> int:
    """User + system CPU time of `pid` and its live descendants, including the children each
    of them has already reaped, in milliseconds (10 ms resolution); 0 when `pid` is gone.

    Measure a per-call budget against a long-lived process as the difference of two readings.
    """
    table = _snapshot()
    if pid not in table:
        return 0
    return _ms(sum(table[p].own_ticks + table[p].reaped_ticks for p in [pid, *_tree(pid, table)]))


class TreeCpuMeter:
    """CPU time of everything below a launcher, leaving out the launcher's own time.

    A tick reads the stat files of the processes already known; every `rescan` ticks it reads
    all of /proc to find new ones. Between rescans nothing is lost for good: a new process is
    counted once found, or through its parent's cutime once reaped.
    """

    def __init__(self, root: int, *, rescan: int = 5) -> None:
        self._root = root
        self._rescan = rescan
        self._ticks = 0
        self._members: list[int] = []

    def sample(self) -> int:
        if self._ticks % self._rescan == 0:
            table = _snapshot()
            self._members = _tree(self._root, table)
        else:
            table = {}
            for pid in [self._root, *self._members]:
                stat = _read_stat(pid)
                if stat is not None:
                    table[pid] = stat
            self._members = [p for p in self._members if p in table]
        self._ticks += 1
        root = table.get(self._root)
        if root is None:
            return 0
        below = sum(table[p].own_ticks + table[p].reaped_ticks for p in self._members)
        return _ms(root.reaped_ticks + below)


def kill_tree(pid: int) -> list[int]:
    """SIGKILL every descendant of `pid` (until none is left), then `pid` itself; returns
    every pid it signalled (they may still be exiting).

    Descendants go first while `pid` is alive: as a child subreaper (the launcher is one) it
    keeps any orphan inside its tree, where the next pass finds it.
    """
    killed: list[int] = []
    while True:
        fresh = [p for p in descendants(pid) if p not in killed]
        if not fresh:  # whatever is left is already dying and cannot fork any more
            break
        for child in fresh:
            send_signal(child, signal.SIGKILL)
        killed.extend(fresh)
    send_signal(pid, signal.SIGKILL)
    return [pid, *killed]


def send_signal(pid: int, signum: int) -> None:
    """os.kill that treats a process already gone as done."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
