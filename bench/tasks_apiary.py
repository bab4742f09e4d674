"""Apiary's side of bench/tasks.py: `apiary serve`, worker agents built on the SDK, and a
submitter over SchedulerService.SubmitTask.

    .venv/bin/python bench/tasks_apiary.py --workers 4 --n 5000 [--unloaded 200]
        [--store postgresql://127.0.0.1:5432/test]
    .venv/bin/python bench/tasks_apiary.py worker AGENT_ID COORDINATOR   (one worker agent)

The coordinator runs with its default configuration on a fresh data directory (SQLite, the
default store) or, with `--store postgresql://...`, in a schema of its own that is dropped
afterwards. Each worker is an `apiary.Agent` process whose `on_task` returns at once; the
agents share one agent type (`bench-worker`) and each runs one task at a time. Tasks name an
agent, spread round-robin over the workers; each has a unique task_id and distinct params
(the same params, scope and agent type would be a duplicate job, held for HITL).

Completion times are the `task.completed` events' timestamps, read from the event log by
`wait_results`: SubmitTask answers accepted/reason only, and today nothing else tells the
submitter that its task finished.
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
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from tasks_workload import Workload, report

import apiary
from apiary.sdk.client import Client
from apiary.sdk.scheduler import SchedulerClient
from apiary.wire import pb

ROOT = Path(__file__).resolve().parent.parent
AGENT_TYPE = "bench-worker"
COMPLETION_EVENTS = ("task.completed", "task.failed")
READ_LIMIT = 5000
"""Events per ReadEvents call (the server's maximum)."""
WAIT_TIMEOUT_S = 600.0


class BenchWorker(apiary.Agent):
    """A worker agent with a trivial handler."""

    name = AGENT_TYPE

    async def setup(self) -> None:
        print("ready", flush=True)

    async def on_task(self, task: apiary.TaskContext) -> None:
        return None


# ---------------------------------------------------------------- waiting for results


@dataclass
class EventCursor:
    """Where `wait_results` is in the event log, and completions read but not yet asked for."""

    after: int = 0
    seen: dict[str, float] = field(default_factory=dict)


async def wait_results(
    client: Client,
    task_ids: Sequence[str],
    cursor: EventCursor,
    *,
    poll_s: float,
    timeout_s: float = WAIT_TIMEOUT_S,
) -> dict[str, float]:
    """The recorded completion time (seconds since the epoch) of each task, once all of
    them have completed; a failed task raises RuntimeError.

    A stand-in: it polls ReadEvents for `task.completed`/`task.failed`. When SubmitTask gives
    the submitter a handle to wait on (`await handle.result()`, WaitTask), this function is
    what to replace; the workload and figures stay as they are.
    """
    wanted = set(task_ids)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not wanted <= cursor.seen.keys():
        reply = await client.events.ReadEvents(
            pb.apiary_pb2.ReadEventsRequest(
                after_sequence=cursor.after, limit=READ_LIMIT, event_types=COMPLETION_EVENTS
            )
        )
        for event in reply.events:
            cursor.after = max(cursor.after, event.sequence)
            if event.event_type != "task.completed":
                raise RuntimeError(f"task {event.correlation_id} failed: {event.details_json}")
            cursor.seen[event.correlation_id] = event.ts.seconds + event.ts.nanos / 1e9
        if len(reply.events) == READ_LIMIT:
            continue  # more to read at once
        if asyncio.get_running_loop().time() > deadline:
            missing = sorted(wanted - cursor.seen.keys())
            raise TimeoutError(f"{len(missing)} task(s) never completed, e.g. {missing[:3]}")
        if not wanted <= cursor.seen.keys():
            await asyncio.sleep(poll_s)
    return {task: cursor.seen.pop(task) for task in task_ids}


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
async def open_coordinator(data: Path, store: str | None) -> AsyncIterator[str]:
    """`apiary serve` on free ports; its gRPC address."""
    port = _port()
    args = ["--data-dir", str(data), "--grpc", f"127.0.0.1:{port}",
            "--http", f"127.0.0.1:{_port()}", "--log-level", "WARNING"]  # fmt: skip
    if store:
        args += ["--store", store]
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
    cursor = EventCursor()
    async with Client(address) as client, SchedulerClient(client.channel) as scheduler:

        async def submit(i: int) -> str:
            agent = agents[i % len(agents)]
            task_id = f"bench-{run}-{i}"
            outcome = await scheduler.submit_task(agent, task_id, {"n": i}, scope=f"repo:{agent}")
            if not outcome.accepted:
                raise RuntimeError(f"task {task_id} refused: {outcome.reason}")
            return task_id

        async def wait(task_ids: Sequence[str], poll_s: float) -> dict[str, float]:
            return await wait_results(client, task_ids, cursor, poll_s=poll_s)

        return await Workload(submit, wait).measure(n, unloaded)


async def bench(workers: int, n: int, unloaded: int, store: str | None) -> dict[str, float]:
    agents = [f"bench-worker-{k}" for k in range(workers)]
    schema = f"bench_tasks_{uuid.uuid4().hex[:12]}"
    url = _schema_url(store, schema) if store and store.startswith("postgresql://") else store
    try:
        with tempfile.TemporaryDirectory(prefix="apiary-bench-tasks-") as tmp:
            async with (
                open_coordinator(Path(tmp) / "state", url) as address,
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
    args = parser.parse_args()
    figures = asyncio.run(bench(args.workers, args.n, args.unloaded, args.store))
    kind = "postgresql" if args.store and args.store.startswith("postgresql://") else "sqlite"
    report(f"apiary-{kind}", args.workers, figures)


if __name__ == "__main__":
    main()
