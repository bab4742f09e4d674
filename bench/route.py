"""Route benchmark: producer -> coordinator -> consumer agent -> FULFILLED ACK -> producer.

    .venv/bin/python bench/route.py [--unary N] [--stream N] [--frame 200] [--window 8]
        [--rounds 1]

Runs the same message pattern twice, side by side: through `apiary serve` (durable SQLite
state, full validation, event log) and through a bare grpc.aio relay that only moves bytes
(the ceiling). Prints msgs/s and send-to-FULFILLED latency (p50/p99) for the canonical unary
SendMessage (64 in flight) and for the streaming sender (envelopes batched per frame, batched
delivery, batched ACKs), and the ratio of Apiary to the ceiling; then where the coordinator's
CPU went per message, by thread (its /metrics), and how many write jobs shared a commit;
and the CPU budget of each run: what the producer and consumer processes (the same in both
runs) and each server spent per message, against what the machine's cores allow per message
at the targets (25,000 msgs/s, and half the ceiling's rate).
With `--rounds N` the two servers run in turns N times and the median runs are printed, with
the ratio of each round: on a shared machine a neighbour's burst moves one run a lot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from apiary.server.thread_cpu import process_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bare_relay import serve as serve_bare  # noqa: E402
from route_clients import consumer, producer  # noqa: E402


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _spawn(
    *args: str, stderr: Any = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=ROOT
    )


async def _start_server(
    kind: str, port: int, data: Path, http_port: int, store: str | None = None
) -> asyncio.subprocess.Process:
    if kind == "bare":
        proc = await _spawn(__file__, "bare-server", str(port))
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 30)
        return proc
    config = data / "bench.toml"
    config.write_text("[router]\nbuffer_capacity = 1000000\nack_timeout_s = 300\n")
    proc = await _spawn(
        "-m", "apiary.cli.main", "serve", "--data-dir", str(data / "state"), "--grpc",
        f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http_port}", "--config", str(config),
        "--log-level", "WARNING", *(("--store", store) if store else ()),
    )  # fmt: skip
    assert proc.stdout is not None
    for _ in range(2):
        await asyncio.wait_for(proc.stdout.readline(), 30)
    return proc


def _metrics(http_port: int) -> dict[str, float]:
    """The coordinator's thread CPU seconds (by thread) and store writer counters."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("apiary_thread_cpu_seconds_total{"):
            found[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith(("apiary_store_commits_total ", "apiary_store_jobs_total ")):
            found[line.split()[0]] = float(line.split()[1])
        elif line.startswith("apiary_store_writer_process_cpu_seconds_total "):
            found["writer-process"] = float(line.split()[1])
    return found


TARGET_MSGS_PER_S = 25_000
"""The streaming target of the route (docs/performance.md)."""


def _process_cpu(pid: int) -> float:
    """CPU seconds of a running process so far, all its threads (Linux /proc)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"no CPU time for process {pid}: it ended, or this is not Linux")
    return seconds


def _costs(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """Per message: each thread's CPU (us) over the phase; and the writer's jobs per commit."""
    costs = {
        f"{name}_us": round((after[name] - before.get(name, 0.0)) / n * 1e6, 1)
        for name in after
        if not name.startswith("apiary_store_")
    }
    commits = after.get("apiary_store_commits_total", 0) - before.get(
        "apiary_store_commits_total", 0
    )
    jobs = after.get("apiary_store_jobs_total", 0) - before.get("apiary_store_jobs_total", 0)
    if commits:
        costs["writer_jobs_per_commit"] = round(jobs / commits, 2)
    return {k: v for k, v in costs.items() if v}


async def _run(kind: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        port, http_port = _port(), _port()
        server = await _start_server(kind, port, Path(tmp), http_port, args.store)
        address = f"127.0.0.1:{port}"
        consumer_proc = await _spawn(__file__, "consumer", address, "consumer")
        assert consumer_proc.stdout is not None
        await asyncio.wait_for(consumer_proc.stdout.readline(), 30)
        for mode, n in (("unary", args.unary), ("stream", args.stream)):
            if n <= 0:
                continue
            window = str(64 if mode == "unary" else args.window)
            before = await asyncio.to_thread(_metrics, http_port) if kind == "apiary" else {}
            cpu_before = [_process_cpu(p.pid) for p in (server, consumer_proc)]
            proc = await _spawn(__file__, "producer", address, f"producer-{mode}", "consumer",
                                str(n), mode, window, str(args.frame))  # fmt: skip
            out, _ = await proc.communicate()
            results[mode] = row = json.loads(out.decode().strip().splitlines()[-1])
            server_cpu, consumer_cpu = (
                _process_cpu(p.pid) - b
                for p, b in zip((server, consumer_proc), cpu_before, strict=True)
            )
            if kind == "apiary":
                after = await asyncio.to_thread(_metrics, http_port)
                row["coordinator"] = _costs(before, after, n)
                server_cpu += after.get("writer-process", 0.0) - before.get("writer-process", 0.0)
            row["cpu_us"] = {
                "producer": round(row.pop("cpu_s") / n * 1e6, 1),
                "consumer": round(consumer_cpu / n * 1e6, 1),
                "server": round(server_cpu / n * 1e6, 1),
            }
        consumer_proc.kill()
        server.terminate()
        await server.wait()
        await consumer_proc.wait()
    return results


def _print(bare: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'path':<8}{'server':<8}{'messages':>9}{'msgs/s':>9}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'ratio':>7}"
    )
    for mode, mine in ours.items():
        for label, row in (("bare", bare[mode]), ("apiary", mine)):
            ratio = row["msgs_per_s"] / max(bare[mode]["msgs_per_s"], 1)
            print(f"{mode:<8}{label:<8}{row['messages']:>9}{row['msgs_per_s']:>9}"
                  f"{row['p50_ms']:>9}{row['p99_ms']:>9}{ratio:>7.2f}")  # fmt: skip
    for mode, mine in ours.items():
        costs = mine.get("coordinator") or {}
        threads = ", ".join(f"{k[:-3]} {v:g}" for k, v in costs.items() if k.endswith("_us"))
        jobs = costs.get("writer_jobs_per_commit")
        print(f"apiary {mode}: coordinator CPU per message (us, by thread): {threads or 'n/a'}"
              + (f"; store writer: {jobs:g} jobs per commit" if jobs else ""))  # fmt: skip
    for mode, mine in ours.items():
        print(_budget(mode, bare[mode], mine))
    print(json.dumps({"bare": bare, "apiary": ours}))


def _budget(mode: str, bare: dict[str, Any], ours: dict[str, Any]) -> str:
    """Each run's CPU per message by process, and what the cores allow the coordinator per
    message at the targets once the clients (the same processes in both runs) have theirs."""
    cores = os.cpu_count() or 1
    lines = [f"{mode}: CPU per message (us) on {cores} cores:"]
    for label, row in (("bare", bare), ("apiary", ours)):
        cpu = row["cpu_us"]
        lines.append(
            f"  {label:<7}producer {cpu['producer']:g}, consumer {cpu['consumer']:g},"
            f" server {cpu['server']:g} (all threads and processes) at {row['msgs_per_s']} msgs/s"
        )
    # The clients' share in the run where it was smaller (they batch better at a high rate):
    # the budget this leaves the coordinator is the most it could be.
    clients = min(run["cpu_us"]["producer"] + run["cpu_us"]["consumer"] for run in (bare, ours))
    targets = [("0.5x this run's ceiling", max(bare["msgs_per_s"] // 2, 1))]
    if mode == "stream":  # the absolute target is the streaming path's
        targets.insert(0, (f"{TARGET_MSGS_PER_S:,} msgs/s", TARGET_MSGS_PER_S))
    for name, rate in targets:
        per_message = cores / rate * 1e6
        lines.append(
            f"  at {name} ({rate}): {per_message:.0f} us per message in all, the clients' "
            f"{clients:.0f} leave {per_message - clients:.0f} for the coordinator, which spent "
            f"{ours['cpu_us']['server']:g}"
        )
    return "\n".join(lines)


async def _consumer_main(address: str, agent_id: str) -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(consumer(address, agent_id, ready))
    await ready.wait()
    print("ready", flush=True)
    await task


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "bare-server":
        asyncio.run(serve_bare(int(sys.argv[2])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "consumer":
        asyncio.run(_consumer_main(sys.argv[2], sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        address, me, to, n, mode, window, frame = sys.argv[2:9]
        stats = asyncio.run(producer(address, me, to, int(n), mode, int(window), int(frame)))
        print(json.dumps(stats))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unary", type=int, default=5000, help="messages on the unary path")
    parser.add_argument("--stream", type=int, default=50000, help="messages on the streaming path")
    parser.add_argument("--frame", type=int, default=200, help="envelopes per SendStream frame")
    parser.add_argument("--window", type=int, default=8, help="frames in flight")
    parser.add_argument(
        "--store", default=None,
        help="the coordinator's store URL (default: its own, SQLite in its data directory)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run the ceiling and Apiary in turns this many times; print the median runs",
    )  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rounds = []
    for _ in range(args.rounds):
        rounds.append((asyncio.run(_run("bare", args)), asyncio.run(_run("apiary", args))))
    bare, ours = _median_runs(rounds)
    _print(bare, ours)
    if len(rounds) > 1:
        for mode in ours:
            ratios = [
                mine[mode]["msgs_per_s"] / max(b[mode]["msgs_per_s"], 1) for b, mine in rounds
            ]
            print(f"{mode}: ratio by round {', '.join(f'{r:.2f}' for r in ratios)}"
                  f" (median {statistics.median(ratios):.2f})")  # fmt: skip


def _median_runs(
    rounds: list[tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per server and path, the run with the median msgs/s (the lower middle one of an even
    count): what a neighbour's burst on a shared machine moves least."""
    picked: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] = ({}, {})
    for side in (0, 1):
        for mode in rounds[0][side]:
            runs = sorted((r[side][mode] for r in rounds), key=lambda run: run["msgs_per_s"])
            picked[side][mode] = runs[(len(runs) - 1) // 2]
    return picked


if __name__ == "__main__":
    main()
