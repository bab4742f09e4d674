"""Any benchmark of bench/, this tree against an earlier revision, side by side in one run.

    .venv/bin/python bench/against.py [--against REV] [--rounds 3] [--metric REGEX]
        SCRIPT [SCRIPT'S ARGUMENTS...]

    e.g.  bench/against.py --against 05b5640 route.py --unary 2000 --stream 20000
          bench/against.py --against 05b5640 scheduler.py --quick

The baseline is a git worktree of `--against` (default: the first parent of HEAD). Each
round runs the baseline's copy of SCRIPT on the baseline's `src`, then this tree's SCRIPT on
this tree's `src`, so both see the same machine at nearly the same time; a shared machine
moves absolute figures by tens of percent between minutes, which is why only a same-run
comparison says whether a change made something slower.

SCRIPT must print a JSON document as its last line of output (route.py, scheduler.py,
store_rows.py and workflow.py do). Every numeric leaf of it whose dotted name matches
`--metric` is printed with the median over rounds for each tree and the ratio this/baseline
(for rates, above 1 is faster; for times and costs, below 1 is cheaper). A list of objects
with a `size` or `mode` field is keyed by that field, other lists by position.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_METRIC = r"(per_s|_ms|_us)$"


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """The numeric leaves of a JSON document as (dotted name, value); booleans are not
    figures."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield prefix, float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            label = index
            if isinstance(item, dict):
                label = item.get("size", item.get("mode", index))
            yield from leaves(item, f"{prefix}[{label}]")


def last_json(output: str) -> Any:
    """The JSON document on the last non-empty line of `output`."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the benchmark printed nothing")
    return json.loads(lines[-1])


def compare(
    baseline: list[dict[str, float]], ours: list[dict[str, float]], metric: str
) -> list[tuple[str, float, float, float]]:
    """(name, baseline median, this tree's median, ratio) for every figure both trees printed
    in every round whose name matches `metric`."""
    pattern = re.compile(metric)
    names = [name for name in baseline[0] if pattern.search(name)]
    rows = []
    for name in names:
        if not all(name in run for run in (*baseline, *ours)):
            continue
        base = statistics.median(run[name] for run in baseline)
        mine = statistics.median(run[name] for run in ours)
        rows.append((name, base, mine, mine / base if base else float("nan")))
    return rows


def _run(tree: Path, script: str, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    proc = subprocess.run(
        [sys.executable, str(tree / "bench" / script), *args],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{script} in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(leaves(last_json(proc.stdout)))


def _worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True, capture_output=True,
    )  # fmt: skip
    return into


def _print(rows: list[tuple[str, float, float, float]], rev: str, rounds: int) -> None:
    width = max([len(name) for name, *_ in rows] + [6])
    print(f"median of {rounds} round(s); baseline {rev}, this tree {_head()}")
    print(f"{'figure':<{width}}  {'baseline':>12}  {'this tree':>12}  {'ratio':>6}")
    for name, base, mine, ratio in rows:
        print(f"{name:<{width}}  {base:>12.6g}  {mine:>12.6g}  {ratio:>6.2f}")


def _head() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "HEAD"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD^", help="the baseline revision")
    parser.add_argument("--rounds", type=int, default=3, help="baseline/this-tree turns")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help="figures to print (regex)")
    parser.add_argument("script", help="a benchmark in bench/, e.g. route.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's arguments")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not (ROOT / "bench" / args.script).is_file():
        parser.error(f"script: no bench/{args.script} in this tree")
    with tempfile.TemporaryDirectory(prefix="apiary-against-") as tmp:
        base = _worktree(args.against, Path(tmp) / "baseline")
        try:
            if not (base / "bench" / args.script).is_file():
                parser.error(f"script: revision {args.against} has no bench/{args.script}")
            baseline, ours = [], []
            for turn in range(args.rounds):
                print(f"round {turn + 1}/{args.rounds}", file=sys.stderr, flush=True)
                baseline.append(_run(base, args.script, args.args))
                ours.append(_run(ROOT, args.script, args.args))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False, capture_output=True,
            )  # fmt: skip
    rows = compare(baseline, ours, args.metric)
    if not rows:
        sys.exit(f"no figure matches --metric {args.metric!r}")
    _print(rows, args.against, args.rounds)
    print(json.dumps({"against": args.against, "figures": rows}))


if __name__ == "__main__":
    main()
