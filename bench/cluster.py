"""Cluster benchmark: the route and the Scheduler's tasks with 1, 2 and 3 `apiary serve
--cluster` replicas on one PostgreSQL schema, side by side in one run.

    .venv/bin/python bench/cluster.py [--unary 2000] [--stream 20000] [--tasks 1000]
        [--task-workers 2] [--replicas 1,2,3]
        [--store postgresql://postgres@127.0.0.1:5432/test] [--rounds 1] [--stall-s 120]
        [--keep-stalled] [--log-dir DIR]

Each row starts its replicas afresh on a schema of its own (dropped afterwards), puts the
consumer agent on the first replica and the producer on the last (so with more than one,
every message crosses replicas: admitted on one, followed from the store by the other), and
runs bench/route.py's producer and consumer: the canonical unary SendMessage (64 in flight)
and the streaming sender. Prints msgs/s and send-to-FULFILLED latency (p50/p99) per replica
count and mode, and the ratio to one replica; a row whose messages were not all FULFILLED
within `--stall-s` says STALLED. To look into one: `--keep-stalled` keeps the row's schema
(the messages table says which messages are stuck and in what state) and `--log-dir` keeps
each process's stderr (a consumer whose stream failed says why there; it does not
reconnect, so its row stalls).

Tasks (`tasks` rows; the msgs/s column is tasks/s): `--task-workers` worker agents
(bench/tasks_apiary.py's) stream on the first replica; the tasks are submitted through the
last replica and waited for (WaitTask) through the middle one, 64 in flight, each timed from
its submission to the answer of its WaitTask. With more than one replica, the Scheduler runs
on one of them (the leader, docs/cluster.md): calls made on the others are forwarded to it,
and the agents' ACKs reach it through the store's relay when they stream elsewhere.

On two cores, more replicas are not faster: they share the cores and the database server,
and a message crossing replicas waits for the recipient's replica to read it from the store
(its LISTEN/NOTIFY wake-up, else its 0.5 s poll). The table shows what a replica costs;
docs/cluster.md says how the cluster scales where cores are not the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
ROUTE = ROOT / "bench" / "route.py"
TASK_WORKER = ROOT / "bench" / "tasks_apiary.py"
TASKS_IN_FLIGHT = 64
DEFAULT_STORE = "postgresql://postgres@127.0.0.1:5432/test"
CONFIG = "[router]\nbuffer_capacity = 1000000\nack_timeout_s = 300\n"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _spawn(*args: str, log: IO[bytes] | None = None) -> asyncio.subprocess.Process:
    """A Python process of ours; its stderr to `log` (else dropped)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL if log is None else log, cwd=ROOT,
    )  # fmt: skip


async def _replica(
    data: Path, store: str, n: int, log: IO[bytes] | None
) -> tuple[asyncio.subprocess.Process, str]:
    """`apiary serve --cluster` as replica `n`; its gRPC address once it serves."""
    port = _port()
    config = data / "bench.toml"
    config.write_text(CONFIG + f'[cluster]\nreplica_id = "bench-{n}"\n')
    proc = await _spawn(
        "-m", "apiary.cli.main", "serve", "--cluster", "--store", store, "--config", str(config),
        "--data-dir", str(data / f"replica-{n}"), "--grpc", f"127.0.0.1:{port}",
        "--http", f"127.0.0.1:{_port()}", "--log-level", "WARNING", log=log,
    )  # fmt: skip
    assert proc.stdout is not None
    for _ in range(2):  # grpc=..., http=...
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            raise RuntimeError(f"replica {n} exited ({await proc.wait()}) before it served")
    return proc, f"127.0.0.1:{port}"


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def _run(replicas: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    schema = f"bench_cluster_{uuid.uuid4().hex[:10]}"
    store = f"{args.store}?apiary_schema={schema}"
    procs: list[asyncio.subprocess.Process] = []
    results: dict[str, dict[str, Any]] = {}
    logs = contextlib.ExitStack()

    def log(name: str) -> IO[bytes] | None:
        """The file `--log-dir` keeps `name`'s stderr in, for this row."""
        if args.log_dir is None:
            return None
        return logs.enter_context((args.log_dir / f"{replicas}-{name}.log").open("ab"))

    try:
        with logs, tempfile.TemporaryDirectory() as tmp:
            addresses = []
            for n in range(replicas):  # one at a time: the first migrates the schema
                proc, address = await _replica(Path(tmp), store, n, log(f"replica-{n}"))
                procs.append(proc)
                addresses.append(address)
            consumer = await _spawn(
                str(ROUTE), "consumer", addresses[0], "consumer", log=log("consumer")
            )
            procs.append(consumer)
            assert consumer.stdout is not None
            await asyncio.wait_for(consumer.stdout.readline(), 60)
            for mode, n in (("unary", args.unary), ("stream", args.stream)):
                if n <= 0:
                    continue
                window = str(64 if mode == "unary" else args.window)
                producer = await _spawn(
                    str(ROUTE), "producer", addresses[-1], f"producer-{mode}", "consumer",
                    str(n), mode, window, str(args.frame),
                )  # fmt: skip
                try:
                    out, _ = await asyncio.wait_for(producer.communicate(), args.stall_s)
                except TimeoutError:
                    producer.kill()
                    await producer.wait()
                    results[mode] = {"stalled": True, "messages": n, "msgs_per_s": 0,
                                     "p50_ms": "-", "p99_ms": "-"}  # fmt: skip
                    if consumer.returncode is not None:  # (its stream failed: see its log)
                        results[mode]["consumer_exit"] = consumer.returncode
                    continue
                results[mode] = json.loads(out.decode().strip().splitlines()[-1])
            if args.tasks > 0:
                results["tasks"] = await _tasks(addresses, args, log)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await proc.wait()
        if args.keep_stalled and any(r.get("stalled") for r in results.values()):
            print(f"{replicas} replicas stalled: schema {schema} kept", file=sys.stderr)
        else:
            _drop(args.store, schema)
    return results


async def _tasks(addresses: list[str], args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """`args.tasks` tasks for worker agents on the first replica, submitted through the last
    and waited for through the middle one (module docstring)."""
    # Imported here: the route rows need none of the SDK in this process.
    from apiary.sdk.client import Client  # noqa: PLC0415

    agents = [f"bench-worker-{k}" for k in range(args.task_workers)]
    workers = [
        await _spawn(str(TASK_WORKER), "worker", agent, addresses[0], log=log(agent))
        for agent in agents
    ]
    run = uuid.uuid4().hex[:8]
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    try:
        for worker in workers:
            assert worker.stdout is not None
            await asyncio.wait_for(worker.stdout.readline(), 60)  # "ready"
        async with (
            Client(addresses[-1]) as submitter,
            Client(addresses[len(addresses) // 2]) as waiter,
        ):
            gate = asyncio.Semaphore(TASKS_IN_FLIGHT)

            async def one(i: int) -> None:
                agent = agents[i % len(agents)]
                async with gate:
                    start = loop.time()
                    handle = await submitter.submit_task(
                        agent, {"n": i}, scope=f"repo:{agent}", task_id=f"bench-{run}-{i}"
                    )
                    status = await waiter.task(handle.task_id).wait(args.stall_s)
                    if status.state != "COMPLETED":
                        raise RuntimeError(f"task {handle.task_id}: {status.state}")
                    latencies.append(loop.time() - start)

            began = loop.time()
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(one(i) for i in range(args.tasks))), args.stall_s
                )
            except (TimeoutError, RuntimeError):
                return {"stalled": True, "messages": args.tasks, "msgs_per_s": 0,
                        "p50_ms": "-", "p99_ms": "-"}  # fmt: skip
            elapsed = loop.time() - began
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
    ranked = sorted(latencies)
    return {
        "messages": args.tasks, "msgs_per_s": int(args.tasks / elapsed),
        "p50_ms": round(ranked[len(ranked) // 2] * 1000, 1),
        "p99_ms": round(ranked[min(len(ranked) - 1, int(len(ranked) * 0.99))] * 1000, 1),
    }  # fmt: skip


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median msgs/s."""
    ranked = sorted(rows, key=lambda row: row["msgs_per_s"])
    return ranked[len(ranked) // 2]


def _print(table: dict[int, dict[str, dict[str, Any]]]) -> None:
    print(f"{'replicas':>8} {'mode':>6} {'msgs/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'vs 1':>7}")
    for replicas, modes in table.items():
        for mode, row in modes.items():
            base = table.get(1, {}).get(mode)
            ratio = f"{row['msgs_per_s'] / base['msgs_per_s']:.2f}x" if base and base[
                "msgs_per_s"] else "-"  # fmt: skip
            if row.get("stalled"):
                ratio = "STALLED"  # not every message FULFILLED within --stall-s
            print(
                f"{replicas:>8} {mode:>6} {row['msgs_per_s']:>9} {row['p50_ms']:>9} "
                f"{row['p99_ms']:>9} {ratio:>7}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unary", type=int, default=2000, help="messages on the unary path")
    parser.add_argument("--stream", type=int, default=20000, help="messages on the streaming path")
    parser.add_argument("--frame", type=int, default=200, help="envelopes per SendStream frame")
    parser.add_argument("--tasks", type=int, default=1000, help="Scheduler tasks (0: none)")
    parser.add_argument("--task-workers", type=int, default=2, help="worker agents for them")
    parser.add_argument("--window", type=int, default=8, help="frames in flight")
    parser.add_argument("--replicas", default="1,2,3", help="replica counts to run, in turns")
    parser.add_argument("--store", default=DEFAULT_STORE, help="the PostgreSQL server (a DSN)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each row (median shown)")
    parser.add_argument(
        "--stall-s", type=float, default=120.0,
        help="a producer whose messages are not all FULFILLED by then is reported STALLED",
    )  # fmt: skip
    parser.add_argument(
        "--keep-stalled", action="store_true",
        help="keep the schema of a row that stalled (its name on stderr), to look into it",
    )  # fmt: skip
    parser.add_argument(
        "--log-dir", type=Path,
        help="keep each process's stderr in DIR (R-replica-N.log, R-consumer.log for R replicas)",
    )  # fmt: skip
    args = parser.parse_args()
    counts = [int(c) for c in args.replicas.split(",")]
    runs: dict[int, list[dict[str, dict[str, Any]]]] = {c: [] for c in counts}
    for _ in range(args.rounds):
        for count in counts:  # in turns: a neighbour's burst falls on every row alike
            runs[count].append(asyncio.run(_run(count, args)))
    table = {
        count: {mode: _median([r[mode] for r in rows]) for mode in rows[0]}
        for count, rows in runs.items()
    }
    _print(table)
    print(json.dumps({"cluster": {str(k): v for k, v in table.items()}}))


if __name__ == "__main__":
    main()
