"""Task benchmark: Apiary, Celery + Redis and Procrastinate (PostgreSQL) on one workload,
side by side in one run.

    .venv/bin/python bench/tasks.py [--n 5000] [--unloaded 200] [--workers 1,4]
        [--systems apiary,celery,procrastinate] [--store sqlite]
        [--store postgresql://127.0.0.1:5432/test] [--rounds 1] [--quick]

The workload (bench/tasks_workload.py), the same for every system and worker count: 20
warm-up tasks, then N tasks submitted at once with 16 submissions in flight (tasks/s from the
first submission to the last recorded completion; burst p50/p99 from each task's submission
to its completion), then `--unloaded` tasks one at a time (unloaded p50/p99). The handler
does nothing. Completion times are the ones each system records: Apiary's `task.completed`
event, Celery's result `date_done`, Procrastinate's `succeeded` event.

- Apiary (`tasks_apiary.py`): `apiary serve` with its default configuration and store (or
  each `--store`); worker agents are SDK processes running one task at a time each; the
  submitter calls SubmitTask.
- Celery (`tasks_celery.py`): the local Redis (`--redis`, db 15) as broker and result
  backend; one prefork `celery worker` with `--concurrency` = workers, default prefetch.
- Procrastinate (`tasks_procrastinate.py`): the local PostgreSQL (`--postgres`) in a schema of
  its own; worker processes with concurrency 1 each.

Celery and Procrastinate run from the benchmark's own virtual environment (`--venv`, default
bench/.venv), made and filled on first use with the pinned releases of PEERS; nothing is
installed into the project's. Each run starts its systems afresh and removes what it made
(Redis keys, PostgreSQL schemas, data directories).

With `--rounds R` the whole sequence runs R times (the systems in turns, so a neighbour's burst
on a shared machine falls on all of them alike) and each row is the run with the median
tasks/s. Prints one row per system and worker count with the ratios against Apiary (same worker
count), then the targets with whether this run met them, then a JSON document (for
bench/against.py). A shared machine moves absolute figures between minutes; the ratios of
one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from against import last_json

HERE = Path(__file__).resolve().parent
SYSTEMS = ("apiary", "celery", "procrastinate")
PEERS = ("celery==5.7.0", "redis==8.1.0", "procrastinate==3.10.0", "psycopg[binary]==3.3.9")
"""What the peers' drivers need, installed into the benchmark's own virtual environment."""
QUICK_N = 300
DRIVER_TIMEOUT_S = 1800.0
"""How long one driver run may take before it is killed and counts as failed."""


def peer_python(venv: Path) -> Path:
    """The interpreter of the benchmark's own virtual environment, made and filled with PEERS
    when it is missing or was filled with other releases."""
    python = venv / "bin" / "python"
    stamp = venv / "bench-requirements.txt"
    wanted = "".join(f"{p}\n" for p in PEERS)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing {', '.join(PEERS)} into {venv}", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--quiet", *PEERS], check=True)
    stamp.write_text(wanted)
    return python


@dataclass(frozen=True)
class Run:
    """One driver invocation: a system (an Apiary store) at a worker count."""

    system: str
    workers: int
    store: str | None = None

    @property
    def label(self) -> str:
        if self.system != "apiary":
            return self.system
        return "apiary-postgresql" if _is_postgres(self.store) else "apiary-sqlite"

    def command(self, args: argparse.Namespace, peers: Path | None) -> list[str]:
        common = ["--workers", str(self.workers), "--n", str(args.n),
                  "--unloaded", str(args.unloaded)]  # fmt: skip
        if self.system == "apiary":
            store = ["--store", self.store] if self.store else []
            return [sys.executable, str(HERE / "tasks_apiary.py"), *common, *store]
        assert peers is not None
        if self.system == "celery":
            return [str(peers), str(HERE / "tasks_celery.py"), *common, "--redis", args.redis]
        return [str(peers), str(HERE / "tasks_procrastinate.py"), *common,
                "--dsn", args.postgres]  # fmt: skip


def _is_postgres(store: str | None) -> bool:
    return store is not None and store.startswith("postgresql://")


def _run(run: Run, args: argparse.Namespace, peers: Path | None) -> dict[str, Any] | None:
    started = time.perf_counter()
    what = f"{run.label}, {run.workers} worker(s)"
    try:
        proc = subprocess.run(
            run.command(args, peers), cwd=HERE, capture_output=True, text=True, check=False,
            timeout=DRIVER_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        print(f"{what}: killed after {DRIVER_TIMEOUT_S:g} s:\n{text}", file=sys.stderr,
              flush=True)  # fmt: skip
        return None
    took = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"{what}: failed ({proc.returncode}) after {took:.0f} s:\n{proc.stderr[-3000:]}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    try:
        row = last_json(proc.stdout)
        if not isinstance(row, dict):
            raise ValueError("its last line is not a JSON object")
    except ValueError as exc:  # nothing printed, or not JSON (json.JSONDecodeError)
        print(f"{what}: no result after {took:.0f} s ({exc}):\n{proc.stderr[-3000:]}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    row["system"] = run.label
    row["mode"] = f"{run.label}/{run.workers}"
    print(f"{what}: {took:.0f} s", file=sys.stderr, flush=True)
    return row


# ---------------------------------------------------------------- report


def _median(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median tasks/s (the lower middle one of an even count)."""
    ordered = sorted(found, key=lambda row: float(row["tasks_per_s"]))
    return {**ordered[(len(ordered) - 1) // 2], "rounds": len(found)}


def _ratio(mine: float, theirs: float) -> float:
    return mine / theirs if theirs else math.nan


def _table(rows: list[dict[str, Any]], apiaries: list[str]) -> str:
    head = ["system", "workers", "tasks/s", "burst p50 ms", "burst p99 ms",
            "unloaded p50 ms", "unloaded p99 ms"]  # fmt: skip
    for name in apiaries:
        head += [f"{name} tasks/s ÷ this", f"{name} unloaded p50 ÷ this"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        cells = [row["system"], str(row["workers"]), f"{row['tasks_per_s']:,.0f}",
                 f"{row['burst_p50_ms']:,.0f}", f"{row['burst_p99_ms']:,.0f}",
                 f"{row['unloaded_p50_ms']:.1f}", f"{row['unloaded_p99_ms']:.1f}"]  # fmt: skip
        for name in apiaries:
            ours = _find(rows, name, row["workers"])
            if ours is None:
                cells += ["", ""]
                continue
            cells += [f"{_ratio(ours['tasks_per_s'], row['tasks_per_s']):.2f}",
                      f"{_ratio(ours['unloaded_p50_ms'], row['unloaded_p50_ms']):.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _find(rows: list[dict[str, Any]], system: str, workers: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["system"] == system and r["workers"] == workers), None)


def targets(rows: list[dict[str, Any]], worker_counts: list[int]) -> list[dict[str, Any]]:
    """The targets this run's rows let us check: each with its figure and whether it was met.
    Throughput targets are ratios of tasks/s (Apiary ÷ peer, same worker count)."""
    found: list[dict[str, Any]] = []
    throughput = (("apiary-sqlite", "celery", 1.0), ("apiary-sqlite", "procrastinate", 2.0),
                  ("apiary-postgresql", "procrastinate", 1.0))  # fmt: skip
    for workers in worker_counts:
        for ours, theirs, at_least in throughput:
            mine, peer = _find(rows, ours, workers), _find(rows, theirs, workers)
            if mine is None or peer is None:
                continue
            ratio = _ratio(mine["tasks_per_s"], peer["tasks_per_s"])
            times = "" if at_least == 1.0 else f"{at_least:g}x "
            found.append({
                "mode": f"{ours}/{workers}:{theirs}",
                "target": f"{ours} tasks/s >= {times}{theirs}'s, {workers} worker(s)",
                "ratio": round(ratio, 2), "at_least": at_least, "met": ratio >= at_least,
            })  # fmt: skip
        mine = _find(rows, "apiary-sqlite", workers)
        if mine is not None:
            p50 = mine["unloaded_p50_ms"]
            found.append({
                "mode": f"apiary-sqlite/{workers}:unloaded_p50",
                "target": f"apiary-sqlite unloaded p50 <= 3 ms, {workers} worker(s)",
                "value_ms": p50, "at_most": 3.0, "met": p50 <= 3.0,
            })  # fmt: skip
    return found


def _print_targets(found: list[dict[str, Any]]) -> None:
    if not found:
        return
    print("\ntargets (this run):")
    width = max(len(t["target"]) for t in found)
    for t in found:
        if "ratio" in t:
            figure = f"ratio {t['ratio']:.2f} (want >= {t['at_least']:.2f})"
        else:
            figure = f"{t['value_ms']:.1f} ms (want <= {t['at_most']:g} ms)"
        print(f"  {t['target']:<{width}}  {figure:<28}  {'met' if t['met'] else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="tasks in the burst (5000)")
    parser.add_argument("--unloaded", type=int, default=200, help="tasks run one at a time")
    parser.add_argument("--workers", default="1,4", help="worker process counts, a,b")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="any of " + ",".join(SYSTEMS))
    parser.add_argument(
        "--store", action="append", default=None,
        help="Apiary's store, repeatable: sqlite (its default) or a postgresql:// URL",
    )  # fmt: skip
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="for Celery")
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test",
                        help="for Procrastinate")  # fmt: skip
    parser.add_argument("--venv", type=Path, default=HERE / ".venv",
                        help="the benchmark's own virtual environment (peers)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="runs of it all; median rows")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: --n {QUICK_N}")
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        parser.error(f"--systems: unknown {', '.join(unknown) or '(none given)'}; "
                     f"choose from {','.join(SYSTEMS)}")  # fmt: skip
    try:
        worker_counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers: {args.workers!r} is not a list of integers like 1,4")
    if any(w < 1 for w in worker_counts):
        parser.error("--workers: each count must be at least 1")
    if args.n is None:
        args.n = QUICK_N if args.quick else 5000
    if args.n < 1 or args.unloaded < 1 or args.rounds < 1:
        parser.error("--n, --unloaded and --rounds must be at least 1")
    stores = [None if s == "sqlite" else s for s in (args.store or ["sqlite"])]
    for store in stores:
        if store is not None and not _is_postgres(store):
            parser.error(f"--store: {store!r} is neither sqlite nor a postgresql:// URL")
    peers = peer_python(args.venv) if set(systems) - {"apiary"} else None

    runs = [
        Run(system, workers, store)
        for workers in worker_counts
        for system in systems
        for store in (stores if system == "apiary" else [None])
    ]
    results: dict[Run, list[dict[str, Any]]] = {run: [] for run in runs}
    for turn in range(args.rounds):
        if args.rounds > 1:
            print(f"round {turn + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for run in runs:
            row = _run(run, args, peers)
            if row is not None:
                results[run].append(row)
    rows = [_median(found) for found in results.values() if found]
    failed = [f"{run.label}/{run.workers}" for run, found in results.items() if not found]
    present = {row["system"] for row in rows}
    apiaries = [name for name in dict.fromkeys(run.label for run in runs)
                if name.startswith("apiary") and name in present]  # fmt: skip
    print(
        f"Tasks: {args.n:,} submitted at once (16 in flight), a handler that does nothing; "
        f"unloaded: {args.unloaded} one at a time. Latency: submission to the completion each "
        f"system records. Ratios: Apiary ÷ this row at the same worker count."
    )
    print(_table(rows, apiaries))
    found = targets(rows, worker_counts)
    _print_targets(found)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    print(json.dumps({"n": args.n, "unloaded": args.unloaded, "rows": rows, "targets": found}))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
