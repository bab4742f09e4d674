"""Celery's side of bench/tasks.py, with the local Redis as broker and result backend; runs
in the benchmark's own virtual environment (bench/tasks.py makes it).

    bench/.venv/bin/python bench/tasks_celery.py --workers 4 --n 5000 [--unloaded 200]
        [--redis redis://127.0.0.1:6379/15]

One `celery worker` with the prefork pool and `--concurrency` = workers: that many worker
processes, each running one task at a time, with Celery's default prefetch (4 per process).
The submitter calls `apply_async` from 16 threads (Celery's client is synchronous) and waits
with `AsyncResult.get()`; completion times are the results' `date_done`. The run uses a
queue of its own and deletes its keys afterwards (the queue, its bindings and the results).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from celery import Celery
from celery.result import AsyncResult
from tasks_workload import IN_FLIGHT, Workload, report

HERE = Path(__file__).resolve().parent
REDIS_ENV = "BENCH_CELERY_REDIS"
DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
WAIT_TIMEOUT_S = 600.0

_redis = os.environ.get(REDIS_ENV, DEFAULT_REDIS)
app = Celery("bench_tasks", broker=_redis, backend=_redis)
app.conf.broker_connection_retry_on_startup = True


@app.task(name="bench.noop")
def noop(n: int) -> None:
    return None


def _start_worker(workers: int, queue: str) -> subprocess.Popen[bytes]:
    """The worker process, on the same Redis as this app (its module reads the URL from the
    environment)."""
    command = [
        sys.executable, "-m", "celery", "-A", "tasks_celery", "worker", "--pool", "prefork",
        "--concurrency", str(workers), "--queues", queue, "--hostname", f"{queue}@%h",
        "--loglevel", "WARNING",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HERE), REDIS_ENV: app.conf.broker_url}
    # Its output (a warning when run as root, errors) goes to this process's stderr.
    return subprocess.Popen(command, cwd=HERE, env=env, stdout=subprocess.DEVNULL)


def _await_ready(name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.control.ping(destination=[name], timeout=0.5):
            return
    raise TimeoutError(f"the Celery worker {name} did not answer a ping in {timeout_s:.0f} s")


def _collect(task_ids: Sequence[str]) -> dict[str, float]:
    done = {}
    for task_id in task_ids:
        result = AsyncResult(task_id, app=app)
        result.get(timeout=WAIT_TIMEOUT_S)
        done[task_id] = result.date_done.timestamp()
    return done


def _cleanup(queue: str, task_ids: Sequence[str]) -> None:
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        client.delete(*client.scan_iter(match=f"*{queue}*"))  # the queue and its bindings
        for first in range(0, len(task_ids), 1000):
            keys = [f"celery-task-meta-{t}" for t in task_ids[first : first + 1000]]
            client.delete(*keys)


async def bench(workers: int, n: int, unloaded: int) -> dict[str, float]:
    queue = f"bench-tasks-{uuid.uuid4().hex[:8]}"
    worker = _start_worker(workers, queue)
    submitted: list[str] = []
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(IN_FLIGHT))
    try:
        await asyncio.to_thread(_await_ready, f"{queue}@{os.uname().nodename}")

        async def submit(i: int) -> str:
            result = await asyncio.to_thread(noop.apply_async, (i,), queue=queue)
            submitted.append(result.id)
            return str(result.id)

        async def wait(task_ids: Sequence[str], poll_s: float) -> dict[str, float]:
            return await asyncio.to_thread(_collect, task_ids)

        return await Workload(submit, wait).measure(n, unloaded)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        _cleanup(queue, submitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--unloaded", type=int, default=200)
    parser.add_argument("--redis", default=DEFAULT_REDIS, help="broker and result backend")
    args = parser.parse_args()
    app.conf.update(broker_url=args.redis, result_backend=args.redis)
    figures = asyncio.run(bench(args.workers, args.n, args.unloaded))
    report("celery", args.workers, figures)


if __name__ == "__main__":
    main()
