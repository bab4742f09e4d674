"""The workload of bench/tasks.py, the same for every system; standard library only, since
the peers' drivers import it from the benchmark's own virtual environment.

A driver gives two coroutines: `submit(i)` sends task number i and returns its id, and
`wait(ids, poll_s)` returns once every one of them has finished, with the completion time
each system recorded (seconds since the epoch). Times of submission are taken here, just
before each `submit` starts; the latency of a task runs from there to its recorded
completion, so a driver's way of learning of completions (polling, a result subscription)
moves no figure.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

IN_FLIGHT = 16
"""Submissions in flight during the burst."""
UNLOADED = 200
"""Tasks run one at a time for the unloaded latency."""
WARMUP = 20
"""Tasks run (one at a time per worker) before measuring: connections, caches, imports."""
BURST_POLL_S = 0.05
UNLOADED_POLL_S = 0.002

Submit = Callable[[int], Awaitable[str]]
Wait = Callable[[Sequence[str], float], Awaitable[dict[str, float]]]


def percentile_ms(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values` (seconds), in milliseconds."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return round(ordered[rank] * 1000, 2)


@dataclass
class Workload:
    submit: Submit
    wait: Wait
    next_index: int = 0

    def _index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    async def _timed(self, started: dict[str, float]) -> None:
        index = self._index()
        at = time.time()
        started[await self.submit(index)] = at

    async def warmup(self, n: int = WARMUP) -> None:
        for _ in range(n):
            started: dict[str, float] = {}
            await self._timed(started)
            await self.wait(list(started), UNLOADED_POLL_S)

    async def burst(self, n: int, in_flight: int = IN_FLIGHT) -> dict[str, float]:
        """`n` tasks submitted at once, `in_flight` submissions at a time: tasks/s from the
        first submission to the last recorded completion, and p50/p99 of each task's
        submission to completion."""
        started: dict[str, float] = {}
        remaining = iter(range(n))

        async def lane() -> None:
            for _ in remaining:
                await self._timed(started)

        await asyncio.gather(*(lane() for _ in range(in_flight)))
        submitted_s = time.time() - min(started.values())
        done = await self.wait(list(started), BURST_POLL_S)
        latencies = [done[task] - at for task, at in started.items()]
        span = max(done.values()) - min(started.values())
        return {
            "tasks": n, "tasks_per_s": round(n / span, 1),
            "submit_per_s": round(n / submitted_s, 1),
            "burst_p50_ms": percentile_ms(latencies, 0.50),
            "burst_p99_ms": percentile_ms(latencies, 0.99),
        }  # fmt: skip

    async def unloaded(self, n: int = UNLOADED) -> dict[str, float]:
        """`n` tasks one at a time, each submitted once the previous one finished."""
        latencies = []
        for _ in range(n):
            started: dict[str, float] = {}
            await self._timed(started)
            done = await self.wait(list(started), UNLOADED_POLL_S)
            latencies += [done[task] - at for task, at in started.items()]
        return {
            "unloaded": n,
            "unloaded_p50_ms": percentile_ms(latencies, 0.50),
            "unloaded_p99_ms": percentile_ms(latencies, 0.99),
        }

    async def measure(self, n: int, unloaded: int) -> dict[str, float]:
        await self.warmup()
        figures = await self.burst(n)
        figures.update(await self.unloaded(unloaded))
        return figures


def report(system: str, workers: int, figures: dict[str, float], **extra: object) -> None:
    """The driver's one line of output: what bench/tasks.py reads."""
    print(json.dumps({"system": system, "workers": workers, **figures, **extra}), flush=True)
