"""Apiary's side of bench/tasks.py: `apiary serve`, worker agents built on the SDK, and a
submitter that holds each task's handle (`apiary.Client.submit_task`).

    .venv/bin/python bench/tasks_apiary.py --workers 4 --n 5000 [--unloaded 200]
        [--store postgresql://127.0.0.1:5432/test]
    .venv/bin/python bench/tasks_apiary.py worker AGENT_ID COORDINATOR   (one worker agent)

The coordinator runs with its default configuration on a fresh data directory (SQLite, the
default store) or, with `--store postgresql://...`, in a schema of its own that is dropped
afterwards. Each worker is an `apiary.Agent` process whose `on_task` returns at once; the
agents share one agent type (`bench-worker`) and each runs one task at a time. Tasks name an
agent, spread round-robin over the workers; each has a unique task_id and distinct params
(the same params, scope and agent type would be a duplicate job, held for HITL).

Completion times are the times the coordinator recorded each task's end (its record's
`updated_at`), which `wait_results` reads from the task handles (WaitTask): the submitter
learns of each end without polling anything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from tasks_workload import Workload, report

import apiary
from apiary.sdk.client import Client
from apiary.sdk.task_handle import TaskHandle

ROOT = Path(__file__).resolve().parent.parent
AGENT_TYPE = "bench-worker"
WAIT_TIMEOUT_S = 600.0
WAITS_IN_FLIGHT = 64
"""Waits open at once while waiting for a burst (each a task followed on the client's stream)."""


class BenchWorker(apiary.Agent):
    """A worker agent with a trivial handler."""

    name = AGENT_TYPE

    async def setup(self) -> None:
        print("ready", flush=True)

    async def on_task(self, task: apiary.TaskContext) -> None:
        return None


# ---------------------------------------------------------------- waiting for results


async def wait_results(
    handles: Sequence[TaskHandle], *, timeout_s: float = WAIT_TIMEOUT_S
) -> dict[str, float]:
    """The recorded completion time (seconds since the epoch) of each task, once all of
    them have ended (each handle's wait, over the client's one FollowTasks stream); a failed
    task raises RuntimeError, one not ended within `timeout_s` TimeoutError."""
    gate = asyncio.Semaphore(WAITS_IN_FLIGHT)

    async def one(handle: TaskHandle) -> tuple[str, float]:
        async with gate:
            status = await handle.wait(timeout_s)
        if status.state != "COMPLETED":
            if status.done:
                raise RuntimeError(f"task {handle.task_id} failed: {status.reason}")
            raise TimeoutError(f"task {handle.task_id} is still {status.state}")
        return handle.task_id, status.updated_at

    return dict(await asyncio.gather(*(one(h) for h in handles)))


# ---------------------------------------------------------------- processes


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )


async def _line(proc: asyncio.subprocess.Process, what: str) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line:
        raise RuntimeError(f"{what} exited ({await proc.wait()}) before it was ready")
    return line.decode().strip()


def _schema_url(store: str, schema: str) -> str:
    """`store` with its own schema (apiary_schema=...) for a PostgreSQL URL."""
    parts = urlsplit(store)
    query = [*parse_qsl(parts.query), ("apiary_schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def _drop_schema(store: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(store, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


@contextlib.asynccontextmanager
async def open_coordinator(
    data: Path, store: str | None, config: Path | None = None
) -> AsyncIterator[str]:
    """`apiary serve` on free ports (with the TOML file `config`, when given); its gRPC
    address."""
    port = _port()
    args = ["--data-dir", str(data), "--grpc", f"127.0.0.1:{port}",
            "--http", f"127.0.0.1:{_port()}", "--log-level", "WARNING"]  # fmt: skip
    if store:
        args += ["--store", store]
    if config is not None:
        args += ["--config", str(config)]
    proc = await _spawn("-m", "apiary.cli.main", "serve", *args)
    try:
        for _ in range(2):  # grpc=..., http=...
            await _line(proc, "apiary serve")
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


@contextlib.asynccontextmanager
async def open_workers(address: str, agents: Sequence[str]) -> AsyncIterator[None]:
    procs = [await _spawn(__file__, "worker", agent, address) for agent in agents]
    try:
        for agent, proc in zip(agents, procs, strict=True):
            await _line(proc, f"worker {agent}")
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in procs:
            await proc.wait()


async def _measure(address: str, agents: list[str], n: int, unloaded: int) -> dict[str, float]:
    run = uuid.uuid4().hex[:8]
    handles: dict[str, TaskHandle] = {}
    async with Client(address) as client:

        async def submit(i: int) -> str:
            agent = agents[i % len(agents)]
            handle = await client.submit_task(
                agent, {"n": i}, scope=f"repo:{agent}", task_id=f"bench-{run}-{i}"
            )
            handles[handle.task_id] = handle
            return handle.task_id

        async def wait(task_ids: Sequence[str], poll_s: float) -> dict[str, float]:
            del poll_s  # nothing is polled: each wait returns when its task ends
            return await wait_results([handles.pop(task_id) for task_id in task_ids])

        return await Workload(submit, wait).measure(n, unloaded)


async def bench(
    workers: int, n: int, unloaded: int, store: str | None, config: Path | None = None
) -> dict[str, float]:
    agents = [f"bench-worker-{k}" for k in range(workers)]
    schema = f"bench_tasks_{uuid.uuid4().hex[:12]}"
    url = _schema_url(store, schema) if store and store.startswith("postgresql://") else store
    try:
        with tempfile.TemporaryDirectory(prefix="apiary-bench-tasks-") as tmp:
            async with (
                open_coordinator(Path(tmp) / "state", url, config) as address,
                open_workers(address, agents),
            ):
                return await _measure(address, agents, n, unloaded)
    finally:
        if url != store and store is not None:
            await _drop_schema(store, schema)


async def _worker(agent_id: str, coordinator: str) -> None:
    await BenchWorker(agent_id, coordinator=coordinator).run()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(_worker(sys.argv[2], sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--unloaded", type=int, default=200)
    parser.add_argument("--store", default=None, help="store URL (default: SQLite)")
    parser.add_argument("--config", type=Path, default=None, help="the coordinator's TOML file")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.workers, args.n, args.unloaded, args.store, args.config))
    kind = "postgresql" if args.store and args.store.startswith("postgresql://") else "sqlite"
    report(f"apiary-{kind}", args.workers, figures)


if __name__ == "__main__":
    main()
