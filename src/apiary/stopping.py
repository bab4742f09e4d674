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
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, Final, TypeVar

T = TypeVar("T")

log = logging.getLogger("apiary.stopping")

STOP_TASKS_S: Final = 5.0
"""How long cancelled tasks have to end (their `finally` blocks to run)."""
STOP_STEP_S: Final = 15.0
"""How long one step of a stop (a component's `close`) may take; the gRPC and HTTP
servers' grace periods are 5 s each."""
STACK_DEPTH: Final = 12
"""The innermost frames shown of a task's stack."""


async def stop_tasks(
    tasks: Iterable[asyncio.Future[Any]], what: str, within_s: float | None = None, *,
    expected: tuple[type[BaseException], ...] = (),
) -> list[asyncio.Future[Any]]:  # fmt: skip
    """Cancel `tasks` and wait until they end, for at most `within_s` (None: STOP_TASKS_S):
    those still running then are logged with their stacks and returned (left behind,
    cancelled). A task that ended with an error other than its cancellation is logged too
    (the stop goes on), unless the error is `expected` of a task stopping."""
    within_s = STOP_TASKS_S if within_s is None else within_s
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


async def stop_step(step: Awaitable[Any], what: str, within_s: float | None = None) -> bool:
    """Await one step of a stop for at most `within_s` (None: STOP_STEP_S): False when it
    failed or did not finish in time (logged, with where it waits; it is cancelled and left
    behind), so that the steps after it still run. The caller's cancellation cancels the
    step too."""
    within_s = STOP_STEP_S if within_s is None else within_s
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


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` with a bounded cleanup: the tasks still running when `main` ends
    are cancelled and waited for at most STOP_TASKS_S, the async generators and the default
    executor's threads closed within STOP_STEP_S each; what does not end is logged and
    abandoned with the loop, where asyncio.run would wait for it forever."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(_the_rest_stopped())
            loop.run_until_complete(stop_step(loop.shutdown_asyncgens(), "async generators"))
            loop.run_until_complete(
                stop_step(loop.shutdown_default_executor(), "the default executor's threads")
            )
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def _the_rest_stopped() -> None:
    rest = asyncio.all_tasks() - {asyncio.current_task()}
    await stop_tasks(rest, "still running at exit")


def stack_lines(task: asyncio.Future[Any], depth: int = STACK_DEPTH) -> list[str]:
    """Where `task` waits: the innermost `depth` frames of its chain of awaits, oldest first
    (`FILE:LINE in NAME`), then what the innermost awaits when that is no coroutine (a
    future, a compiled coroutine, an async generator's step). `Task.get_stack` shows only
    the task's outermost coroutine; a stop that hangs needs the innermost."""
    if not isinstance(task, asyncio.Task):
        return []
    lines: list[str] = []
    awaited: Any = task.get_coro()
    for _ in range(_MOST_AWAITS):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        frame = frame or getattr(awaited, "gi_frame", None)
        if frame is None:
            if awaited is not None and lines:
                lines.append(f"awaiting {type(awaited).__name__}")
            break
        # (frame.f_lineno is None in a frame without line numbers: a compiled coroutine's)
        lines.append(
            f"{frame.f_code.co_filename}:{frame.f_lineno or '?'} in {frame.f_code.co_name}"
        )
        awaited = (
            getattr(awaited, "cr_await", None)
            or getattr(awaited, "ag_await", None)
            or getattr(awaited, "gi_yieldfrom", None)
        )
    return lines[-depth:]


_MOST_AWAITS: Final = 200


def describe(task: asyncio.Future[Any]) -> str:
    """A task's name and where it waits, on one line."""
    name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
    return f"{name} at {' <- '.join(reversed(stack_lines(task))) or 'an unknown place'}"
