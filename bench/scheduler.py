"""Scheduler benchmark: SubmitTask and dispatch at 1k, 10k and 100k queued tasks.

    .venv/bin/python bench/scheduler.py [--sizes 1000,10000,100000] [--agents 10000]
        [--submits 2000] [--sequential 500] [--dispatches 1000] [--streams 1,32]
        [--store sqlite|memory] [--quick]

Each size runs in its own process (so that its peak RSS is its own) against the real engine
(`apiary.testing.open_test_engine`: router, delivery, event log, Scheduler) over a fresh
SQLite file in a temporary directory (durable task states), or the memory store with
`--store memory`. Per size:

1. Register `--agents` agents through the registry. None opens an inbound stream, so the
   Scheduler has not seen any of them ready (RFC 8.1): every task stays QUEUED.
2. Fill the queues with N tasks through `Scheduler.submit` (64 in flight), random priority
   -19..20, random agent, scope `repo:<agent>` (so the conflict gate finds every pair of
   running tasks PARALLEL) and distinct params (so no two are the same job).
3. SubmitTask at that depth: `--submits` more with 64 in flight (rate, p50, p99) and
   `--sequential` more one at a time (p50, p99). The depth grows by these.
4. Dispatch + complete at that depth, once per `--streams` value W: W agents at a time open
   their stream (`Delivery.open`: the Scheduler's readiness signal, which dispatches the
   agent's head task as a DATA envelope), take it (`Delivery.poll`), acknowledge READ and
   FULFILLED through the router as an agent does, and the Scheduler dispatches the agent's
   next task (`Scheduler.fire_due`, the body of `Scheduler.run`, is called right after the
   ACK instead of waiting for the loop task to be scheduled). A worker moves on to another
   agent with queued tasks when its agent's queue is empty. `--dispatches` tasks per W.
5. Baseline: the pure `core.tasks.queue.TaskQueue` with the same N tasks over the same agents,
   doing what the Scheduler does per submit (push) and per dispatch (peek, then remove).

The engine runs on the harness's FakeClock: every task has the same `submitted_at`, so the
order is priority then submission sequence, and no lifecycle, ACK or retry deadline can fire
in the middle of a measurement. Wall time is measured with `time.perf_counter`.
Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from apiary.core.envelope import AckStage
from apiary.core.tasks.queue import QueuedTask, TaskQueue
from apiary.engine.scheduler.scheduler import Scheduler, Submission
from apiary.engine.settings import SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine

IN_FLIGHT = 64
SEP = "\x1f"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def _commits(h: EngineHarness) -> int:
    stats = getattr(h.store, "stats", None)
    writer = getattr(stats, "writer", None)
    return int(getattr(writer, "commits", 0))


class Submitter:
    def __init__(self, scheduler: Scheduler, agents: list[str], seed: int) -> None:
        self.scheduler = scheduler
        self.agents = agents
        self.rng = random.Random(seed)
        self.next = 0

    async def one(self) -> float:
        i = self.next
        self.next += 1
        agent = self.rng.choice(self.agents)
        sub = Submission(
            agent_id=agent, task_id=f"t{i}", priority=self.rng.randint(-19, 20),
            params=b'{"n": %d}' % i, content_type="application/json", scope=f"repo:{agent}",
        )  # fmt: skip
        started = time.perf_counter()
        result = await self.scheduler.submit(sub)
        elapsed = time.perf_counter() - started
        if not result.accepted:
            raise RuntimeError(f"task t{i} refused: {result.reason}")
        return elapsed

    async def batch(self, n: int, in_flight: int) -> tuple[float, list[float]]:
        """n submissions, `in_flight` at a time; returns (seconds, latencies)."""
        latencies: list[float] = []
        started = time.perf_counter()
        for done in range(0, n, in_flight):
            size = min(in_flight, n - done)
            latencies += await asyncio.gather(*(self.one() for _ in range(size)))
        return time.perf_counter() - started, latencies


async def _dispatch(h: EngineHarness, n: int, streams: int, seed: int) -> dict[str, Any]:
    """Serve `n` tasks with `streams` agents connected at a time."""
    scheduler, delivery = h.engine.scheduler, h.engine.delivery
    waiting = sorted({key.partition(SEP)[0] for key in scheduler._queue.counts()})
    random.Random(seed).shuffle(waiting)
    done = opened = 0
    depth0, ops0 = scheduler.depth(), scheduler._queue.heap_ops

    async def worker() -> None:
        nonlocal done, opened
        while done < n and waiting:
            agent = waiting.pop()
            session = await delivery.open(agent)  # readiness: dispatches the head task
            opened += 1
            while batch := await delivery.poll(agent, session):
                for handout in batch:
                    message_id = handout.message.message_id
                    await h.ack(agent, message_id, AckStage.READ)
                    await h.ack(agent, message_id, AckStage.FULFILLED)
                    done += 1
                if done >= n:
                    break
                await scheduler.fire_due()  # dispatch the agent's next task

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed = time.perf_counter() - started
    dispatched = depth0 - scheduler.depth()
    return {
        "streams": streams, "completed": done, "per_s": done / elapsed,
        "opens_per_task": opened / max(done, 1),
        "heap_ops_per_op": (scheduler._queue.heap_ops - ops0) / max(dispatched, 1),
        "conflict_checks_per_task": 0,
    }  # fmt: skip


def _core(n: int, agents: list[str], ops: int, seed: int) -> dict[str, float]:
    """TaskQueue alone at depth n: push (submit) and peek + remove (dispatch)."""
    rng = random.Random(seed)
    queue = TaskQueue()
    for i in range(n):
        queue.push(QueuedTask(f"t{i}", rng.choice(agents), rng.randint(-19, 20), 0.0, i))
    ops0 = queue.heap_ops
    started = time.perf_counter()
    for i in range(n, n + ops // 2):
        agent = rng.choice(agents)
        queue.push(QueuedTask(f"t{i}", agent, rng.randint(-19, 20), 0.0, i))
        head = queue.peek(agent)
        assert head is not None
        queue.remove(head.task_id)
    elapsed = time.perf_counter() - started
    return {"ops_per_s": ops / elapsed, "heap_ops_per_op": (queue.heap_ops - ops0) / ops}


async def run_size(args: argparse.Namespace, n: int) -> dict[str, Any]:
    agents = [f"agent-{i:05d}" for i in range(args.agents)]
    out: dict[str, Any] = {"size": n, "agents": args.agents, "store": args.store}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/apiary.db" if args.store == "sqlite" else "memory://"
        settings = SchedulerSettings(duplicate_jobs="reject", max_queued=10_000_000)
        async with open_test_engine(store_url=url, data_dir=Path(tmp), scheduler=settings) as h:
            scheduler = h.engine.scheduler
            started = time.perf_counter()
            for first in range(0, len(agents), IN_FLIGHT):
                # registry.register, not EngineHarness.register: the latter also announces the
                # agent through Presence.joined, which notifies every registered agent.
                await asyncio.gather(*(
                    h.engine.registry.register({
                        "agent_id": a, "name": a, "reasoning_connectors": ["builtin://rules"],
                        "modalities_supported": ["application/json"],
                    }) for a in agents[first:first + IN_FLIGHT]
                ))  # fmt: skip
            out["register_s"] = time.perf_counter() - started
            out["rss_agents_mb"] = _rss_mb()
            submitter = Submitter(scheduler, agents, args.seed)
            fill_s, _ = await submitter.batch(n, IN_FLIGHT)
            out["fill_per_s"] = n / fill_s
            out["rss_filled_mb"] = _rss_mb()
            out["depth_before"] = scheduler.depth()
            ops0, commits0 = scheduler._queue.heap_ops, _commits(h)
            batch_s, latencies = await submitter.batch(args.submits, IN_FLIGHT)
            out["submit_per_s"] = args.submits / batch_s
            out["submit_p50_ms"] = _pct(latencies, 0.50)
            out["submit_p99_ms"] = _pct(latencies, 0.99)
            out["submit_commits_per_op"] = (_commits(h) - commits0) / args.submits
            out["submit_heap_ops_per_op"] = (scheduler._queue.heap_ops - ops0) / args.submits
            _, sequential = await submitter.batch(args.sequential, 1)
            out["seq_p50_ms"] = _pct(sequential, 0.50)
            out["seq_p99_ms"] = _pct(sequential, 0.99)
            out["seq_per_s"] = 1 / statistics.fmean(sequential)
            out["depth_after_submit"] = scheduler.depth()
            out["dispatch"] = []
            for streams in args.streams:
                checks0 = sum(h.engine.scheduler.gate.stats.values())
                row = await _dispatch(h, args.dispatches, streams, args.seed + streams)
                checks = sum(h.engine.scheduler.gate.stats.values()) - checks0
                row["conflict_checks_per_task"] = checks / max(row["completed"], 1)
                out["dispatch"].append(row)
            out["depth_after"] = scheduler.depth()
            out["rss_end_mb"] = _rss_mb()
    out["core"] = _core(n, agents, args.core_ops, args.seed)
    return out


def _table(results: list[dict[str, Any]], streams: list[int]) -> str:
    def fmt(value: float, digits: int = 0) -> str:
        return f"{value:,.{digits}f}"

    def core(r: dict[str, Any], name: str) -> float:
        return float(r["core"][name])

    rows: list[tuple[str, list[str]]] = [
        ("queued tasks (depth while measuring)",
         [f"{r['depth_before']:,} -> {r['depth_after_submit']:,}" for r in results]),
        ("fill: SubmitTask/s, 64 in flight, depth 0 -> N", [fmt(r["fill_per_s"]) for r in results]),
        ("SubmitTask/s, 64 in flight", [fmt(r["submit_per_s"]) for r in results]),
        ("  p50 ms", [fmt(r["submit_p50_ms"], 2) for r in results]),
        ("  p99 ms", [fmt(r["submit_p99_ms"], 2) for r in results]),
        ("  store commits per SubmitTask", [fmt(r["submit_commits_per_op"], 2) for r in results]),
        ("SubmitTask sequential: p50 ms", [fmt(r["seq_p50_ms"], 2) for r in results]),
        ("  p99 ms", [fmt(r["seq_p99_ms"], 2) for r in results]),
    ]  # fmt: skip
    for k, w in enumerate(streams):
        rows += [
            (f"dispatch+complete/s, {w} agent stream(s) at a time",
             [fmt(r["dispatch"][k]["per_s"]) for r in results]),
            ("  conflict-gate pair checks per task",
             [fmt(r["dispatch"][k]["conflict_checks_per_task"], 1) for r in results]),
            ("  stream opens per task",
             [fmt(r["dispatch"][k]["opens_per_task"], 2) for r in results]),
        ]  # fmt: skip
    rows += [
        ("core TaskQueue ops/s (push; peek+remove)", [fmt(core(r, "ops_per_s")) for r in results]),
        ("core ops/s / engine SubmitTask/s",
         [fmt(core(r, "ops_per_s") / r["submit_per_s"]) for r in results]),
        ("heap ops per op: core queue", [fmt(core(r, "heap_ops_per_op"), 2) for r in results]),
        ("heap ops per op: engine submit", [fmt(r["submit_heap_ops_per_op"], 2) for r in results]),
        ("heap ops per op: engine dispatch",
         [fmt(r["dispatch"][0]["heap_ops_per_op"], 2) for r in results]),
        ("peak RSS MB: agents registered", [fmt(r["rss_agents_mb"]) for r in results]),
        ("peak RSS MB: queues filled", [fmt(r["rss_filled_mb"]) for r in results]),
    ]  # fmt: skip
    head = "| | " + " | ".join(f"{r['size']:,} queued" for r in results) + " |"
    lines = [head, "|---|" + "---:|" * len(results)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="queued tasks, a,b,c")
    parser.add_argument("--agents", type=int, default=10000)
    parser.add_argument("--submits", type=int, default=2000, help="measured, 64 in flight")
    parser.add_argument("--sequential", type=int, default=500, help="measured, one at a time")
    parser.add_argument("--dispatches", type=int, default=1000, help="tasks served per --streams")
    parser.add_argument("--streams", default="1,32", help="agents connected at a time")
    parser.add_argument("--core-ops", type=int, default=200_000)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="sizes 1000,10000")
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.streams = [int(s) for s in str(args.streams).split(",")]
    if args.one:
        print(json.dumps(asyncio.run(run_size(args, args.one))))
        return
    sizes = [1000, 10000] if args.quick else [int(s) for s in args.sizes.split(",")]
    passthrough = [a for a in sys.argv[1:] if a != "--quick"]
    results = []
    for n in sizes:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, *passthrough, "--one", str(n)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"size {n:,}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(
        f"Scheduler, {args.store} store, {args.agents:,} agents registered, none streaming "
        "while the queues fill (tasks stay QUEUED); dispatch by agents opening streams."
    )
    print(_table(results, args.streams))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
