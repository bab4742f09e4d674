"""Workflow benchmark: CreateWorkflow validation at 1k, 10k and 100k nodes, and the execution
rate of a wide DAG on real agent processes.

    .venv/bin/python bench/workflow.py [--sizes 1000,10000,100000] [--width 200]
        [--agents 4] [--store sqlite|memory] [--quick]

1. Validation: a random layered DAG of N nodes (each node depends on 1-3 nodes of earlier
   layers, so E is about 2N) goes through `validate_workflow` (ids, agents, mapping paths,
   node options, then the DAG: Kahn's algorithm with cycle reporting), and through
   `validate_dag` alone; the baseline is the standard library's
   `graphlib.TopologicalSorter(graph).static_order()` on the same graph. Best of 3 runs,
   garbage collector off while timing.
   Printed per size with the time per node: linear growth shows as a flat column.
2. Execution: a coordinator in this process (real gRPC on loopback, `--store` in a temporary
   directory) and `--agents` SDK agent processes (`bench/workflow.py --agent`), each of which
   returns `{"ok": true}` at once. A wide DAG (root -> `--width` independent nodes spread
   over the agents -> join) runs from StartWorkflow to `workflow.completed`; the baseline is
   the same number of plain Scheduler tasks submitted at once to the same agents (no
   workflow engine), until the last one completed. Nodes (tasks) per second for each.

Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import graphlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apiary.core.workflow.dag import validate_dag
from apiary.core.workflow.definition import NodeSpec, WorkflowSpec, validate_workflow
from apiary.engine.scheduler.scheduler import Submission
from apiary.sdk.agent import Agent
from apiary.sdk.tasks import TaskContext
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

ROOT = Path(__file__).resolve().parent.parent


def layered_dag(n: int, seed: int = 7) -> dict[str, list[str]]:
    rng = random.Random(seed)
    width = max(1, int(n**0.5))
    graph: dict[str, list[str]] = {}
    for i in range(n):
        layer = i // width
        if layer == 0:
            graph[f"n{i}"] = []
            continue
        low, high = max(0, (layer - 3) * width), layer * width - 1
        graph[f"n{i}"] = [f"n{rng.randint(low, high)}" for _ in range(rng.randint(1, 3))]
    return graph


def best_of(runs: int, fn: Callable[[], object]) -> float:
    """The best wall time of `runs` calls, with the cyclic GC off while timing (as timeit
    does: a collection that happens to fall inside one size's run is not the algorithm)."""
    times = []
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return min(times)


def validation(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        graph = layered_dag(n)
        edges = sum(len(set(d)) for d in graph.values())
        spec = WorkflowSpec(
            "bench", {k: NodeSpec(k, f"agent-{i % 16}", tuple(d), input_mapping={"x": "data.x"})
                      for i, (k, d) in enumerate(graph.items())},
        )  # fmt: skip
        full = best_of(3, lambda spec=spec: validate_workflow(spec))  # type: ignore[misc]
        dag = best_of(3, lambda graph=graph: validate_dag(graph))  # type: ignore[misc]
        stdlib = best_of(
            3,
            lambda graph=graph: list(graphlib.TopologicalSorter(graph).static_order()),  # type: ignore[misc]
        )
        rows.append({"nodes": n, "edges": edges, "validate_workflow_s": full,
                     "validate_dag_s": dag, "graphlib_s": stdlib})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------- execution


class Quick(Agent):
    """The benchmark's agent: every node returns at once."""

    async def setup(self) -> None:
        print("ready", flush=True)

    async def on_task(self, task: TaskContext) -> object:
        return {"ok": True}


async def agent_main(agent_id: str, address: str) -> None:
    await Quick(agent_id, coordinator=address).run()


async def _start_agents(address: str, count: int) -> list[asyncio.subprocess.Process]:
    procs = []
    for i in range(count):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "bench" / "workflow.py"), "--agent", f"w{i}", address,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 60)
    return procs


async def _wait_event(coordinator: Coordinator, kind: str, count: int = 1) -> None:
    seen, found = 0, 0
    while True:
        batch = await coordinator.events.read(after=seen, limit=5000)
        found += sum(1 for e in batch if e.event_type == kind)
        if found >= count:
            return
        if batch:
            seen = batch[-1].sequence
        else:
            await coordinator.events.wait_after(seen)


async def execution(width: int, agents: int, store: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db" if store == "sqlite" else "memory://"
        async with open_test_coordinator(Path(tmp), url) as coordinator:
            procs = await _start_agents(str(coordinator.grpc_address), agents)
            try:
                assert coordinator.workflows is not None and coordinator.scheduler is not None
                nodes = {"root": NodeSpec("root", "w0")}
                for i in range(width):
                    nodes[f"n{i}"] = NodeSpec(f"n{i}", f"w{i % agents}", ("root",))
                nodes["join"] = NodeSpec("join", "w0", tuple(f"n{i}" for i in range(width)))
                await coordinator.workflows.create(WorkflowSpec("wide", nodes))
                started = time.perf_counter()
                await coordinator.workflows.start("wide")
                await _wait_event(coordinator, "workflow.completed")
                workflow_s = time.perf_counter() - started

                started = time.perf_counter()
                for i in range(width + 2):
                    await coordinator.scheduler.submit(Submission(
                        f"w{i % agents}", f"plain-{i}", params=json.dumps({"i": i}).encode(),
                        scope=f"resource:plain.t{i}",
                    ))  # fmt: skip
                await _wait_event(coordinator, "task.completed", 2 * (width + 2))
                plain_s = time.perf_counter() - started
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    await proc.wait()
    return {"nodes": width + 2, "agents": agents, "store": store,
            "workflow_s": workflow_s, "plain_tasks_s": plain_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--width", type=int, default=200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--quick", action="store_true", help="1k and 10k nodes, width 50")
    parser.add_argument("--agent", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agent:
        asyncio.run(agent_main(*args.agent))
        return
    sizes = [1000, 10000] if args.quick else [int(s) for s in args.sizes.split(",")]
    width = 50 if args.quick else args.width

    rows = validation(sizes)
    print("CreateWorkflow validation (best of 3), time per node in microseconds:")
    print(f"{'nodes':>8} {'edges':>8} | {'validate_workflow':>18} {'us/node':>8} | "
          f"{'validate_dag':>12} {'us/node':>8} | {'graphlib':>9} {'us/node':>8}")  # fmt: skip
    for r in rows:
        n = r["nodes"]
        print(
            f"{n:>8,} {r['edges']:>8,} | {r['validate_workflow_s'] * 1e3:>15.1f} ms "
            f"{r['validate_workflow_s'] / n * 1e6:>8.2f} | {r['validate_dag_s'] * 1e3:>9.1f} ms "
            f"{r['validate_dag_s'] / n * 1e6:>8.2f} | {r['graphlib_s'] * 1e3:>6.1f} ms "
            f"{r['graphlib_s'] / n * 1e6:>8.2f}"
        )
    run = asyncio.run(execution(width, args.agents, args.store))
    print(f"\nWide DAG on {run['agents']} agent processes ({run['store']} store), "
          f"{run['nodes']} nodes:")  # fmt: skip
    for name, key in (("workflow", "workflow_s"), ("plain tasks", "plain_tasks_s")):
        print(f"  {name:<12} {run[key]:6.2f} s  {run['nodes'] / run[key]:8.1f} nodes/s")
    print(f"  workflow / plain: {run['plain_tasks_s'] / run['workflow_s']:.2f}x the task rate")
    print(json.dumps({"validation": rows, "execution": run}))


if __name__ == "__main__":
    main()
