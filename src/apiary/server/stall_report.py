"""What a coordinator is doing, printed when it is asked (SIGUSR1) or when stopping takes
longer than it should (`report_if_stopping_slowly`): every thread's Python stack (faulthandler,
which prints even while the event loop is blocked) and every asyncio task's stack (printed
by the loop, so only while it runs). Written to stderr, which is the operator's terminal or
the service manager's log."""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from functools import partial
from typing import Final, TextIO

from apiary.stopping import stack_lines

STOP_REPORT_S: Final = 15.0
"""Stopping for longer than this prints the report once (the gRPC server's grace period and
the HTTP server's are 5 s each; everything after them is quick)."""
STACK_DEPTH: Final = 12
"""The innermost frames printed of each asyncio task."""


def print_report(reason: str, out: TextIO | None = None, *, threads: bool = True) -> None:
    """Every thread's stack (unless not `threads`), then every asyncio task's (run on the
    event loop)."""
    out = out or sys.stderr
    print(f"apiary: {reason}; its stacks follow", file=out, flush=True)
    if threads:
        faulthandler.dump_traceback(file=out, all_threads=True)
    tasks = asyncio.all_tasks()
    print(f"apiary: {len(tasks)} asyncio tasks", file=out, flush=True)
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"task {task.get_name()} (most recent call last):", file=out)
        for line in stack_lines(task, STACK_DEPTH):  # oldest first
            print(f"  {line}", file=out)
    out.flush()


def report_on_signal(loop: asyncio.AbstractEventLoop, signum: int = signal.SIGUSR1) -> None:
    """`kill -USR1 PID` prints the report."""
    loop.add_signal_handler(signum, print_report, "report asked for by SIGUSR1")


def report_if_stopping_slowly(
    after_s: float = STOP_REPORT_S, out: TextIO | None = None
) -> asyncio.TimerHandle:
    """Print the report once if the coordinator has not stopped `after_s` seconds from now:
    the threads' stacks from faulthandler's own thread (so also while the event loop is
    blocked, or once it has ended and the process waits for a thread), the tasks' from the
    loop (the returned timer). `stopped()` once the process is about to exit."""
    out = out or sys.stderr
    faulthandler.dump_traceback_later(after_s, repeat=False, file=out)
    return asyncio.get_running_loop().call_later(
        after_s, partial(print_report, threads=False),
        f"still stopping after {after_s:g} s", out,
    )  # fmt: skip


def stopped() -> None:
    """The process stopped in time: no report."""
    faulthandler.cancel_dump_traceback_later()
