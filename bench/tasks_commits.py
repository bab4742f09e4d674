"""Store writes and CPU per task on the task path: the SQLite writer's commits and write jobs
(`apiary_store_commits`, `apiary_store_jobs` on /metrics), the events recorded, and the CPU
time of each process (the coordinator, the worker agents, the submitter; from /proc), over
bench/tasks_apiary.py's workload, divided by the tasks run. Unlike tasks/s these figures
hardly depend on how loaded the machine is (the counts not at all, CPU time little), which
makes them the figures to compare revisions by on a busy machine (docs/performance.md,
"Tasks against Celery + Redis and Procrastinate").

    .venv/bin/python bench/tasks_commits.py --workers 1 --n 300 --unloaded 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sqlite3
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import tasks_apiary

_COUNTERS = {
    "apiary_store_commits_total": "commits",
    "apiary_store_jobs_total": "write_jobs",
}
_ports: list[int] = []


def _recording_port() -> int:
    """A free port, remembered: `open_coordinator` takes the gRPC port, then the HTTP one."""
    port = _free_port()
    _ports.append(port)
    return port


_free_port = tasks_apiary._port
tasks_apiary._port = _recording_port
_spawned: list[Any] = []


async def _recording_spawn(*args: str) -> Any:
    """`tasks_apiary._spawn`, remembering each process (the coordinator first, then the
    workers) to read its CPU time."""
    proc = await _spawn(*args)
    _spawned.append(proc)
    return proc


_spawn = tasks_apiary._spawn
tasks_apiary._spawn = _recording_spawn
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def cpu_now() -> dict[str, float]:
    """CPU seconds so far: the coordinator, the workers together, this process (the
    submitter)."""
    coordinator, *workers = _spawned
    return {
        "coordinator_cpu_ms": 1000 * cpu_seconds(coordinator.pid),
        "workers_cpu_ms": 1000 * sum(cpu_seconds(w.pid) for w in workers),
        "submitter_cpu_ms": 1000 * time.process_time(),
    }


def scrape(http_port: int) -> dict[str, float]:
    """The counters of /metrics this benchmark reads (events summed over their types)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics") as answer:
        text = answer.read().decode()
    found: dict[str, float] = {"events": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in _COUNTERS:
            found[_COUNTERS[name]] = float(value)
        elif name.startswith("apiary_events_total{"):
            found["events"] += float(value)
        elif name.startswith("apiary_thread_cpu_seconds_total{"):
            # The coordinator's CPU by thread (the event loop is MainThread; a pool's
            # threads are summed under its prefix); the rest of the process's CPU is the
            # threads Python does not know (gRPC's).
            thread = re.sub(r"_\d+$", "", name.split('"')[1])
            key = f"thread_cpu_ms.{thread}"
            found[key] = found.get(key, 0.0) + 1000 * float(value)
    return found


async def bench(
    workers: int, n: int, unloaded: int, config: Path | None = None
) -> dict[str, float]:
    agents = [f"bench-worker-{k}" for k in range(workers)]
    with tempfile.TemporaryDirectory(prefix="apiary-bench-commits-") as tmp:
        async with tasks_apiary.open_coordinator(Path(tmp) / "state", None, config) as address:
            http_port = _ports[-1]
            async with tasks_apiary.open_workers(address, agents):
                before = scrape(http_port) | cpu_now()
                await tasks_apiary._measure(address, agents, n, unloaded)
                after = scrape(http_port) | cpu_now()
        kinds = event_kinds(Path(tmp) / "state")
    tasks = n + unloaded
    per_task = {key: round((after[key] - before.get(key, 0.0)) / tasks, 2) for key in after}
    python_threads = sum(v for k, v in per_task.items() if k.startswith("thread_cpu_ms."))
    per_task["thread_cpu_ms.(not Python's)"] = round(
        per_task["coordinator_cpu_ms"] - python_threads, 2
    )
    for kind, count in kinds.items():
        per_task[f"event.{kind}"] = round(count / tasks, 2)
    return per_task


def event_kinds(data: Path) -> dict[str, int]:
    """How many events of each type the coordinator's store holds (start-up included), the
    most frequent first."""
    with contextlib.closing(sqlite3.connect(data / "apiary.db")) as db:
        rows = db.execute(
            "SELECT event_type, count(*) FROM events GROUP BY event_type ORDER BY 2 DESC"
        ).fetchall()
    return {str(kind): int(count) for kind, count in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--unloaded", type=int, default=50)
    parser.add_argument("--config", type=Path, default=None, help="the coordinator's TOML file")
    args = parser.parse_args()
    per_task = asyncio.run(bench(args.workers, args.n, args.unloaded, args.config))
    print(json.dumps({"workers": args.workers, "per_task": per_task}))


if __name__ == "__main__":
    main()
