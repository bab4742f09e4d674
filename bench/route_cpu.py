"""The coordinator's CPU per routed message, in one process, against an earlier revision.

    .venv/bin/python bench/route_cpu.py [--messages 20000] [--frame 200] [--against REV]
        [--rounds 3] [--instructions]

The streaming pattern of `route.py` (a producer's frames of envelopes -> the consumer's
inbound batches -> its ACK frames -> the FULFILLED ACKs forwarded to the producer's inbound
stream), driven through the server's own stream handlers (`RouterStreamHandler.send_stream`
and `inbound`, protos in and out) over the real engine and a SQLite store in a temporary
directory, without sockets or other processes. So it prints what the coordinator's code
costs per message, the event loop's thread and all threads, without the transport and
without the neighbours that make `route.py`'s msgs/s vary from run to run on a shared
machine.

The baseline: the same script run from a git worktree of `--against` (default: the first
parent of HEAD; its `src` comes first on the child's path), alternating with this tree
`--rounds` times, so that both see the same machine; the ratio is this tree's CPU per
message over the baseline's (below 1: cheaper).

With `--instructions` it counts instructions instead of CPU time, under valgrind's
callgrind (which counts the same for the same code whatever else the machine does, where a
shared machine moves CPU times by tens of percent): each tree routes `--messages` and three
times as many, and the difference over the difference in messages is its instructions per
routed message (start-up and set-up cancel out). Valgrind runs the threads one at a time, so
the writer's commits group differently than in a real run; both trees alike. About a minute
and a half per 1,000 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from apiary.engine.settings import RouterSettings
from apiary.server.context import CallContext
from apiary.server.interpreter import tune_for_serving
from apiary.server.services.router import RouterStreamHandler
from apiary.testing.engine import open_test_engine
from apiary.wire import pb

ROOT = Path(__file__).resolve().parent.parent


def _envelope(producer: str, message_type: int, body: dict[str, Any]) -> Any:
    payload = json.dumps(body, separators=(",", ":")).encode()
    message_id = str(uuid.uuid4())
    return pb.common_pb2.Envelope(
        message_id=message_id, producer_id=producer, correlation_id=message_id,
        message_type=message_type, content_type="application/json",
        content_length=len(payload), payload=payload,
    )  # fmt: skip


async def _measure(n: int, frame: int, window: int) -> dict[str, float]:
    """Route `n` messages in frames of `frame`, `window` frames in flight; CPU seconds of
    the loop thread and of the process, and wall seconds."""
    a, c = pb.apiary_pb2, pb.common_pb2
    settings = RouterSettings(buffer_capacity=10 * n, ack_timeout_s=300.0)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/apiary.db"
        async with open_test_engine(settings, store_url=url, data_dir=Path(tmp)) as h:
            for agent in ("producer", "consumer"):
                await h.register(agent, modalities=("application/json",))
            handler = RouterStreamHandler(h.engine.router, h.engine.delivery)
            ctx = CallContext(transport="grpc", peer="bench")
            acks: asyncio.Queue[Any] = asyncio.Queue()
            fulfilled = 0
            done = asyncio.Event()

            async def frames(queue: asyncio.Queue[Any]) -> Any:
                while (item := await queue.get()) is not None:
                    yield item

            async def drain(stream: Any) -> None:
                async for _ in stream:
                    pass

            async def consume() -> None:
                inbound = handler.inbound(a.InboundRequest(agent_id="consumer", max_batch=256), ctx)
                async for batch in inbound:
                    items = [
                        ack_for[d.msg.message_id] for d in batch.deliveries
                        if d.msg.message_type == c.DATA
                    ]  # fmt: skip
                    if items:
                        acks.put_nowait(a.SendFrame(items=items))

            async def watch() -> None:
                nonlocal fulfilled
                inbound = handler.inbound(a.InboundRequest(agent_id="producer", max_batch=256), ctx)
                async for batch in inbound:
                    fulfilled += sum(
                        d.msg.message_type == c.ACKNOWLEDGEMENT for d in batch.deliveries
                    )
                    if fulfilled >= n:
                        done.set()

            sends: asyncio.Queue[Any] = asyncio.Queue()
            made = [
                a.SendFrame(items=[
                    a.OutboundEnvelope(msg=_envelope("producer", c.DATA, {"i": i}),
                                       recipient="consumer")
                    for i in range(start, min(start + frame, n))
                ])
                for start in range(0, n, frame)
            ]  # fmt: skip
            # The consumer's ACKs are built before the clock starts too: only the
            # coordinator's work is measured (the ACK of each message, by its id).
            ack_for = {
                item.msg.message_id: a.OutboundEnvelope(
                    msg=_envelope("consumer", c.ACKNOWLEDGEMENT, {
                        "ack_for_message_id": item.msg.message_id, "ack_stage": "FULFILLED",
                    })
                )
                for built in made for item in built.items
            }  # fmt: skip
            tasks = [
                asyncio.ensure_future(drain(handler.send_stream(frames(acks), ctx))),
                asyncio.ensure_future(consume()),
                asyncio.ensure_future(watch()),
            ]
            await asyncio.sleep(0.1)  # the inbound streams are open
            tune_for_serving()  # the collector and switch interval of `apiary serve`
            loop_cpu, all_cpu, wall = time.thread_time(), time.process_time(), time.perf_counter()
            slots = asyncio.Semaphore(window)

            async def answers() -> None:
                async for _ in handler.send_stream(frames(sends), ctx):
                    slots.release()

            sender = asyncio.ensure_future(answers())
            for built in made:
                await slots.acquire()
                sends.put_nowait(built)
            await asyncio.wait_for(done.wait(), 600)
            result = {
                "loop_cpu_s": time.thread_time() - loop_cpu,
                "all_cpu_s": time.process_time() - all_cpu,
                "wall_s": time.perf_counter() - wall,
            }
            sends.put_nowait(None)
            acks.put_nowait(None)
            await sender
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return result


def _run_tree(tree: Path, n: int, frame: int, window: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one", "--messages", str(n),
         "--frame", str(frame), "--window", str(window)],
        env=env, cwd=tree, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _instructions(tree: Path, n: int, frame: int, window: int) -> int:
    """Instructions counted by callgrind over `--one` runs of `n` messages in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out",
             sys.executable, str(Path(__file__).resolve()), "--one", "--messages", str(n),
             "--frame", str(frame), "--window", str(window)],
            env=env, cwd=tree, check=True, capture_output=True, text=True,
        )  # fmt: skip
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"route_cpu: no instruction count from callgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def _instructions_per_message(trees: dict[str, Path], n: int, frame: int, window: int) -> None:
    """Each tree's instructions per routed message (its runs of n and 3n messages, two at a
    time), printed with the ratio of this tree's to the baseline's."""
    runs = [(name, tree, count) for name, tree in trees.items() for count in (n, 3 * n)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda run: _instructions(run[1], run[2], frame, window), runs))
    per_message = {
        name: (counts[2 * i + 1] - counts[2 * i]) / (2 * n) for i, name in enumerate(trees)
    }
    print(f"instructions per routed message (callgrind, {n} and {3 * n} messages)")
    for name, value in per_message.items():
        print(f"{name:10} {value:12,.0f}")
    print(f"ratio (this tree / baseline): {per_message['this tree'] / per_message['baseline']:.3f}")


def _worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


def _remove_worktree(tree: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
        check=False,
        capture_output=True,
    )


def _per_message(runs: list[dict[str, float]], key: str, n: int) -> float:
    return statistics.median(r[key] for r in runs) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--frame", type=int, default=200, help="envelopes per SendStream frame")
    parser.add_argument("--window", type=int, default=8, help="frames in flight")
    parser.add_argument("--against", default="HEAD^", help="the baseline revision")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, alternating")
    parser.add_argument(
        "--instructions", action="store_true",
        help="count instructions under valgrind instead of timing (steady on a busy machine)",
    )  # fmt: skip
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_measure(args.messages, args.frame, args.window))))
        return
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
    n = args.messages
    with tempfile.TemporaryDirectory() as tmp:
        base = _worktree(args.against, Path(tmp) / "baseline")
        if args.instructions:
            try:
                _instructions_per_message(
                    {"baseline": base, "this tree": ROOT}, n, args.frame, args.window
                )
            finally:
                _remove_worktree(base)
            return
        try:
            runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this tree": []}
            for _ in range(args.rounds):
                runs["baseline"].append(_run_tree(base, n, args.frame, args.window))
                runs["this tree"].append(_run_tree(ROOT, n, args.frame, args.window))
        finally:
            _remove_worktree(base)
    print(f"{n} messages in frames of {args.frame}, median of {args.rounds} runs each;"
          f" baseline {args.against}")  # fmt: skip
    print(f"{'tree':10} {'loop us/msg':>12} {'all us/msg':>11} {'msgs/s':>8}")
    figures = {}
    for name, found in runs.items():
        loop, total = _per_message(found, "loop_cpu_s", n), _per_message(found, "all_cpu_s", n)
        rate = n / statistics.median(r["wall_s"] for r in found)
        figures[name] = (loop, total)
        print(f"{name:10} {loop:12.1f} {total:11.1f} {rate:8.0f}")
    (base_loop, base_all), (ours_loop, ours_all) = figures["baseline"], figures["this tree"]
    print(f"ratio (this tree / baseline): loop {ours_loop / base_loop:.2f},"
          f" all threads {ours_all / base_all:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
