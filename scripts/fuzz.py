"""Fuzz a real coordinator for as long as asked: every gRPC method, every gateway method, the
read routes' parameters and any method on any path, in rounds, with the strategies and
checks of tests/fuzz (the suite `make test` runs a few examples of).

    .venv/bin/python scripts/fuzz.py --minutes 240 --examples 500 --report fuzz.json

Each round fuzzes every target with `--examples` examples (Hypothesis shrinks a fault to
its smallest input), then checks that health is SERVING and that the process's RSS grew by
less than `--rss-mb` since the first round. A fault is printed when found, with the
internal error the coordinator logged for it (exception and innermost frame); all of them
are written to `--report` as JSON. The exit status is 1 when a fault was found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fuzz holds the strategies and the checks

import aiohttp  # noqa: E402
import grpc  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import FlakyFailure, HypothesisWarning  # noqa: E402

from apiary.server.inprocess import open_test_coordinator  # noqa: E402
from tests.fuzz.cases import Fault, gateway_case, grpc_case, read_case, route_case  # noqa: E402
from tests.fuzz.inputs import (  # noqa: E402
    READ_QUERIES,
    VERBS,
    gateway_bodies,
    grpc_frames,
    paths,
)
from tests.fuzz.known import KNOWN_FAULTS, KNOWN_INPUTS  # noqa: E402
from tests.fuzz.target import CHANNEL_OPTIONS, METHODS, FuzzTarget, resident_bytes  # noqa: E402

T = TypeVar("T")
CASE_TIMEOUT_S = 60.0
"""One case's calls are bounded by their own windows; this only catches a wedged loop."""


@dataclass
class Found:
    """One fault: where, what, the smallest input found, what the coordinator logged."""

    transport: str
    target: str
    problem: str
    answer: str
    request: str
    logged: list[str] = field(default_factory=list)
    known: str = ""


class InternalErrors(logging.Handler):
    """Keeps the summary of each internal error the coordinator logs (it logs one per
    internal error, with the exception): its type, message, and innermost frames (Apiary's
    own, and the library's where it was raised)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if "/apiary/" in f.filename]
            shown = [*ours[-1:], *[f for f in frames[-1:] if not ours or f is not ours[-1]]]
            where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in shown)
            self.lines.append(
                f"{record.getMessage()}: {type(exc).__name__}: {str(exc)[:300]} at {where}"
            )
        else:
            self.lines.append(record.getMessage()[:500])


class Fuzzer:
    """Runs Hypothesis in a worker thread; each example's calls run on the coordinator's
    event loop (which keeps running its own tasks in between)."""

    def __init__(
        self, target: FuzzTarget, loop: asyncio.AbstractEventLoop, examples: int, only: str = ""
    ) -> None:
        self.target = target
        self.loop = loop
        self.settings = settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            database=None,
        )
        self.errors = InternalErrors()
        self.found: list[Found] = []
        self.only = only

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CASE_TIMEOUT_S)

    def search(
        self,
        transport: str,
        name: str,
        inputs: st.SearchStrategy[Any],
        case: Callable[[Any], Coroutine[Any, Any, list[Fault]]],
        known: str = "",
    ) -> None:
        """Fuzz one target; the last failing input Hypothesis tried is its smallest."""
        if self.only not in name:
            return
        last: list[Found] = []

        @given(inputs)
        @self.settings
        def check(value: Any) -> None:
            before = len(self.errors.lines)
            faults = self.run(case(value))
            if faults:
                problem, answer = faults[0]
                last[:] = [
                    Found(
                        transport, name, problem, str(answer), repr(value)[:2000],
                        self.errors.lines[before:][:5], known,
                    )
                ]  # fmt: skip
                raise AssertionError(problem)

        try:
            check()
        except AssertionError:
            pass
        except FlakyFailure:  # a fault that its replay did not repeat: still a fault
            if last:
                last[0].problem += " (did not happen again on replay)"
        except Exception as exc:  # a client-side failure is a finding too
            last[:] = [Found(transport, name, f"{type(exc).__name__}: {str(exc)[:300]}", "", "")]
        if last:
            self.found.append(last[0])
            print(f"FAULT {transport} {name}: {last[0].problem}\n  {last[0].answer[:300]}\n"
                  f"  input: {last[0].request[:300]}", flush=True)  # fmt: skip
            for line in last[0].logged:
                print(f"  logged: {line}", flush=True)

    def round(self) -> None:
        target = self.target
        for method in METHODS:
            for transport in ("grpc", "http"):
                known = KNOWN_FAULTS.get((transport, method.path), "")
                known = known or KNOWN_INPUTS.get((transport, method.path), ("", None))[0]
                if transport == "grpc":
                    inputs: st.SearchStrategy[Any] = grpc_frames(method)
                    case = partial(grpc_case, target, method)
                else:
                    inputs, case = gateway_bodies(method), partial(gateway_case, target, method)
                self.search(transport, method.path, inputs, case, known)
        self.search("http", "read routes", READ_QUERIES, partial(read_case, target))

        async def any_route(value: tuple[str, str, bytes]) -> list[Fault]:
            return await route_case(target, *value)

        routes = st.tuples(st.sampled_from(VERBS), paths(), st.binary(max_size=64))
        self.search("http", "any route", routes, any_route)


async def fuzz(args: argparse.Namespace) -> list[Found]:
    with tempfile.TemporaryDirectory(prefix="apiary-fuzz-") as data:
        data_dir = Path(data)
        store = "memory://" if args.store == "memory" else f"sqlite:///{data_dir / 'apiary.db'}"
        async with (
            open_test_coordinator(data_dir, store) as coordinator,
            grpc.aio.insecure_channel(str(coordinator.grpc_address), CHANNEL_OPTIONS) as channel,
            aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
        ):
            target = FuzzTarget(coordinator, channel, http)
            await target.register_known_agents()
            fuzzer = Fuzzer(target, asyncio.get_running_loop(), args.examples, args.only)
            for name in ("apiary", "aiohttp"):  # summarized, not printed
                logger = logging.getLogger(name)
                logger.setLevel(logging.ERROR)
                logger.propagate = False
                logger.addHandler(fuzzer.errors)
            deadline = time.monotonic() + args.minutes * 60
            baseline, number = 0, 0
            while True:
                number += 1
                started = time.monotonic()
                await asyncio.to_thread(fuzzer.round)
                serving = await target.serving()
                rss = resident_bytes()
                baseline = baseline or rss
                growth_mb = (rss - baseline) / 2**20
                print(
                    f"round {number}: {time.monotonic() - started:.0f} s, "
                    f"{len(fuzzer.found)} faults, serving={serving}, RSS {rss / 2**20:.0f} MiB "
                    f"(+{growth_mb:.0f} since round 1)",
                    flush=True,
                )
                if not serving:
                    fuzzer.found.append(Found("grpc", "health", "not SERVING", "", ""))
                if growth_mb > args.rss_mb:
                    problem = f"RSS grew by {growth_mb:.0f} MiB (limit {args.rss_mb})"
                    fuzzer.found.append(Found("process", "memory", problem, "", ""))
                if not serving or growth_mb > args.rss_mb or time.monotonic() >= deadline:
                    return fuzzer.found


def main() -> int:
    warnings.filterwarnings("ignore", category=HypothesisWarning)  # reprs of 70 KB inputs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="run rounds until then")
    parser.add_argument("--examples", type=int, default=200, help="per target and round")
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--rss-mb", type=float, default=512.0, help="growth allowed")
    parser.add_argument("--report", type=Path, help="write every fault here as JSON")
    parser.add_argument("--only", default="", help="fuzz the targets whose name has this")
    args = parser.parse_args()
    found = asyncio.run(fuzz(args))
    if args.report is not None:
        args.report.write_text(json.dumps([asdict(f) for f in found], indent=2) + "\n")
    unknown = [f for f in found if not f.known]
    print(f"{len(found)} faults ({len(found) - len(unknown)} already known)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
