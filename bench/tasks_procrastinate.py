"""Procrastinate's side of bench/tasks.py, on the local PostgreSQL; runs in the benchmark's
own virtual environment (bench/tasks.py makes it).

    bench/.venv/bin/python bench/tasks_procrastinate.py --workers 4 --n 5000
        [--unloaded 200] [--dsn postgresql://127.0.0.1:5432/test]
    bench/.venv/bin/python bench/tasks_procrastinate.py worker DSN SCHEMA QUEUE

Procrastinate's tables live in a schema of their own (search_path), made for the run and
dropped afterwards. Each worker is a `procrastinate` worker process with concurrency 1 (it
fetches a job when it has none: no prefetch), woken by LISTEN/NOTIFY. The submitter defers
with `defer_async`, 16 at a time; completion times are the jobs' `succeeded` events
(`procrastinate_events.at`, written in the transaction that finishes the job).

A worker that is fetching when a new job's notification arrives can lose the wake-up (it
clears its new-job flag after the fetch) and finds the job at its next poll, up to
`fetch_job_polling_interval` (5 s) later; one at a time, this shows in the unloaded p99.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import procrastinate
import psycopg
from psycopg import sql
from tasks_workload import Workload, report

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://127.0.0.1:5432/test"
WAIT_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 60.0

# Procrastinate warns of an App made in a script's own module: its workers import tasks by
# path. Here the workers run this same file and register the one task by name.
logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)


def make_app(dsn: str, schema: str) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=dsn, kwargs={"options": f"-c search_path={schema}"}
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="bench.noop")
    async def noop(n: int) -> None:
        return None

    return app


async def _worker(dsn: str, schema: str, queue: str) -> None:
    app = make_app(dsn, schema)
    async with app.open_async():
        await app.run_worker_async(queues=[queue], concurrency=1, name=f"{queue}-worker")


async def _start_worker(dsn: str, schema: str, queue: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, "worker", dsn, schema, queue,
        cwd=HERE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def _connect(dsn: str, schema: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options=f"-c search_path={schema}"
    )


async def _await_workers(db: psycopg.AsyncConnection[tuple[object, ...]], workers: int) -> None:
    """Until `workers` workers registered themselves."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    while loop.time() < deadline:
        row = await (await db.execute("SELECT count(*) FROM procrastinate_workers")).fetchone()
        if row is not None and row[0] == workers:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{workers} Procrastinate worker(s) not up in {READY_TIMEOUT_S:.0f} s")


async def _completions(
    db: psycopg.AsyncConnection[tuple[object, ...]], job_ids: Sequence[str], poll_s: float
) -> dict[str, float]:
    ids = [int(j) for j in job_ids]
    done: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_TIMEOUT_S
    while len(done) < len(ids):
        rows = await (
            await db.execute(
                "SELECT job_id, type::text, extract(epoch FROM at)::float8"
                " FROM procrastinate_events"
                " WHERE job_id = ANY(%s) AND type IN ('succeeded', 'failed')",
                [ids],
            )
        ).fetchall()
        for job_id, kind, at in rows:
            if kind != "succeeded":
                raise RuntimeError(f"job {job_id} {kind}")
            done[str(job_id)] = float(at)  # type: ignore[arg-type]
        if len(done) < len(ids):
            if loop.time() > deadline:
                raise TimeoutError(f"{len(ids) - len(done)} job(s) never finished")
            await asyncio.sleep(poll_s)
    return done


async def bench(workers: int, n: int, unloaded: int, dsn: str) -> dict[str, float]:
    run = uuid.uuid4().hex[:12]
    schema, queue = f"bench_procrastinate_{run}", f"bench-{run}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        procs: list[asyncio.subprocess.Process] = []
        try:
            app = make_app(dsn, schema)
            async with app.open_async(), await _connect(dsn, schema) as db:
                await app.schema_manager.apply_schema_async()
                for _ in range(workers):
                    procs.append(await _start_worker(dsn, schema, queue))
                await _await_workers(db, workers)
                noop = app.tasks["bench.noop"].configure(queue=queue)

                async def submit(i: int) -> str:
                    return str(await noop.defer_async(n=i))

                async def wait(job_ids: Sequence[str], poll_s: float) -> dict[str, float]:
                    return await _completions(db, job_ids, poll_s)

                return await Workload(submit, wait).measure(n, unloaded)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                await proc.wait()
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            await admin.execute(drop)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(_worker(*sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--unloaded", type=int, default=200)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="the PostgreSQL database")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.workers, args.n, args.unloaded, args.dsn))
    report("procrastinate", args.workers, figures)


if __name__ == "__main__":
    main()
