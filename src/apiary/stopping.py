"""Stopping background work with bounded waits: what does not stop in time is logged with
its stack and left behind, so that a stop always finishes.

A coordinator's stop cancels its tasks and awaits its components' `close` in turn. Awaiting
a cancelled task without a bound hangs the whole stop when that task does not end: one that
swallowed its cancellation (Python 3.11's `asyncio.wait_for` returns the awaited result
instead of raising when the cancellation arrives as the awaited operation completes: a loop
around it then goes on), or one that awaits something nobody will wake. `stop_tasks` and
`stop_step` wait a bounded time instead, log what did not end (and where it waits), and go
on; they never swallow the caller's own cancellation (`contextlib.suppress(CancelledError)`
around `await task` does)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, Final

log = logging.getLogger("apiary.stopping")

STOP_TASKS_S: Final = 5.0
"""How long cancelled tasks have to end (their `finally` blocks to run)."""
STOP_STEP_S: Final = 15.0
"""How long one step of a stop (a component's `close`) may take; the gRPC and HTTP
servers' grace periods are 5 s each."""
STACK_DEPTH: Final = 12
"""The innermost frames shown of a task's stack."""


async def stop_tasks(
    tasks: Iterable[asyncio.Future[Any]], what: str, within_s: float = STOP_TASKS_S, *,
    expected: tuple[type[BaseException], ...] = (),
) -> list[asyncio.Future[Any]]:  # fmt: skip
    """Cancel `tasks` and wait until they end, for at most `within_s`: those still running
    then are logged with their stacks and returned (left behind, cancelled). A task that
    ended with an error other than its cancellation is logged too (the stop goes on), unless
    the error is `expected` of a task stopping."""
    running = [task for task in tasks if not task.done()]
    for task in running:
        task.cancel()
    late: set[asyncio.Future[Any]] = set()
    if running:
        _, late = await asyncio.wait(running, timeout=within_s)
    for task in running:
        if task in late:
            log.error(
                "%s: a task did not end within %g s of its cancellation; left behind: %s",
                what, within_s, describe(task),
            )  # fmt: skip
        elif not task.cancelled() and not isinstance(task.exception(), (*expected, type(None))):
            log.error("%s: a task ended with an error", what, exc_info=task.exception())
    return [task for task in running if task in late]


async def stop_step(step: Awaitable[Any], what: str, within_s: float = STOP_STEP_S) -> bool:
    """Await one step of a stop for at most `within_s`: False when it failed or did not
    finish in time (logged, with where it waits; it is cancelled and left behind), so that
    the steps after it still run. The caller's cancellation cancels the step too."""
    work = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({work}, timeout=within_s)
    except BaseException:
        work.cancel()
        raise
    if not done:
        log.error(
            "stopping: %s did not finish within %g s; going on without it: %s",
            what, within_s, describe(work),
        )  # fmt: skip
        work.cancel()
        return False
    if work.cancelled():
        log.error("stopping: %s was cancelled", what)
        return False
    if work.exception() is not None:
        log.error("stopping: %s failed", what, exc_info=work.exception())
        return False
    return True


def stack_lines(task: asyncio.Future[Any], depth: int = STACK_DEPTH) -> list[str]:
    """Where `task` is, its innermost `depth` frames oldest first (`FILE:LINE in NAME`)."""
    if not isinstance(task, asyncio.Task):
        return []
    # Written out here: asyncio's own print_stack fails on a frame without a line number
    # (a compiled coroutine's, gRPC's).
    return [
        f"{frame.f_code.co_filename}:{frame.f_lineno or '?'} in {frame.f_code.co_name}"
        for frame in task.get_stack(limit=depth)
    ]


def describe(task: asyncio.Future[Any]) -> str:
    """A task's name and where it waits, on one line."""
    name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
    return f"{name} at {' <- '.join(reversed(stack_lines(task))) or 'an unknown place'}"
