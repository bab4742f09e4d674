"""Store writes and CPU per task on the task path: the SQLite writer's commits and write jobs
(`apiary_store_commits`, `apiary_store_jobs` on /metrics), the events recorded, and the CPU
time of each process (the coordinator, the worker agents, the submitter; from /proc), over
bench/tasks_apiary.py's workload, divided by the tasks run. Unlike tasks/s these figures
hardly depend on how loaded the machine is (the counts not at all, CPU time little), which
makes them the figures to compare revisions by on a busy machine (docs/performance.md,
"Tasks against Celery + Redis and Procrastinate").

    .venv/bin/python bench/tasks_commits.py --workers 1 --n 300 --unloaded 50
        [--store postgresql://127.0.0.1:5432/test]

With `--store postgresql://...` (the server on this machine) the coordinator's store is a
schema of its own, and the SQLite writer's counters give way to the CPU time of the
server's backends serving the coordinator's connections (`postgres_cpu_ms`, found by the
coordinator's TCP ports in pg_stat_activity, read from /proc; the server has to be on this
machine).
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
import uuid
from pathlib import Path
from typing import Any

import psycopg
import tasks_apiary
from psycopg import sql

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
    workers: int, n: int, unloaded: int, config: Path | None = None, store: str | None = None
) -> dict[str, float]:
    agents = [f"bench-worker-{k}" for k in range(workers)]
    schema = f"bench_commits_{uuid.uuid4().hex[:12]}"
    url = None if store is None else tasks_apiary._schema_url(store, schema)
    try:
        with tempfile.TemporaryDirectory(prefix="apiary-bench-commits-") as tmp:
            data = Path(tmp) / "state"
            async with tasks_apiary.open_coordinator(data, url, config) as address:
                http_port = _ports[-1]
                async with tasks_apiary.open_workers(address, agents):
                    postgres = None if store is None else Postgres(store)
                    before = await measure(http_port, postgres)
                    await tasks_apiary._measure(address, agents, n, unloaded)
                    after = await measure(http_port, postgres)
            kinds = (
                event_kinds(data) if store is None else await postgres_event_kinds(store, schema)
            )
    finally:
        if store is not None:
            await tasks_apiary._drop_schema(store, schema)
    tasks = n + unloaded
    per_task = {key: round((after[key] - before.get(key, 0.0)) / tasks, 2) for key in after}
    python_threads = sum(v for k, v in per_task.items() if k.startswith("thread_cpu_ms."))
    per_task["thread_cpu_ms.(not Python's)"] = round(
        per_task["coordinator_cpu_ms"] - python_threads, 2
    )
    for kind, count in kinds.items():
        per_task[f"event.{kind}"] = round(count / tasks, 2)
    return per_task


async def measure(http_port: int, postgres: Postgres | None) -> dict[str, float]:
    """The counters so far: /metrics, the processes' CPU, and PostgreSQL's when it is the
    store."""
    found = scrape(http_port) | cpu_now()
    if postgres is not None:
        found |= await postgres.counters(_spawned[0].pid)
    return found


class Postgres:
    """The local PostgreSQL server's side of the coordinator's store."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._cpu_s: dict[int, float] = {}

    async def counters(self, coordinator_pid: int) -> dict[str, float]:
        """The CPU so far of the backends that have served the coordinator (each one's as
        last read: one that has ended keeps it)."""
        async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)",
                [tcp_ports(coordinator_pid)],
            )
            for (pid,) in await cursor.fetchall():
                with contextlib.suppress(OSError):
                    self._cpu_s[int(pid)] = cpu_seconds(int(pid))
        return {"postgres_cpu_ms": 1000 * sum(self._cpu_s.values())}


def tcp_ports(pid: int) -> list[int]:
    """The local ports of process `pid`'s TCP sockets (its fds' inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.append(int(fields[1].rpartition(":")[2], 16))
    return ports


async def postgres_event_kinds(dsn: str, schema: str) -> dict[str, int]:
    """`event_kinds` of the coordinator's PostgreSQL schema."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            sql.SQL(
                "SELECT event_type, count(*) FROM {}.events GROUP BY event_type ORDER BY 2 DESC"
            ).format(sql.Identifier(schema))
        )
        return {str(kind): int(count) for kind, count in await cursor.fetchall()}


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
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    per_task = asyncio.run(bench(args.workers, args.n, args.unloaded, args.config, args.store))
    print(json.dumps({"workers": args.workers, "per_task": per_task}))


if __name__ == "__main__":
    main()
