"""A coordinator's stop always finishes (apiary/stopping.py): the tasks it cancels end on
their cancellation, whenever it arrives; one that does not end, or a step that never
finishes, is logged with where it waits and left behind, and the stop goes on; the runtime
control planes' watchers end when they close and none starts after.

The bounds are shortened here (the defaults are seconds); `asyncio.wait_for` around a stop
is only the tests' detector of a hang."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from apiary import stopping
from apiary.controlplane.following import TaskFollowers
from apiary.core.access.principal import DEFAULT_TENANT
from apiary.errors import UnavailableError
from apiary.server.control_plane import ControlPlanes
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.server.store_health import StoreHealth
from apiary.stopping import stack_lines, stop_step, stop_tasks

WAIT_S = 60.0
"""The detector's bound: a stop that takes this long hangs."""
STEPS = range(8)
"""How many loop iterations after an operation completes its task is cancelled: each of
them, so that a cancellation arriving as an awaited result does (which Python 3.11's
`asyncio.wait_for` swallows) is among them."""


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "STOP_TASKS_S", 0.5)
    monkeypatch.setattr(stopping, "STOP_STEP_S", 0.5)


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _steps(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def _stubborn(release: asyncio.Event) -> None:
    """A task that ignores its cancellation until `release` is set."""
    while not release.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await release.wait()


# --------------------------------------------------------------------------- the helpers


async def test_a_task_that_ignores_its_cancellation_is_left_behind_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    stubborn = asyncio.create_task(_stubborn(release), name="stubborn-task")
    obliging = asyncio.create_task(asyncio.Event().wait(), name="obliging-task")
    await _steps(2)
    late = await asyncio.wait_for(stop_tasks([stubborn, obliging], "the test", 0.2), WAIT_S)
    assert late == [stubborn] and obliging.cancelled()
    assert "the test: a task did not end within 0.2 s" in caplog.text
    assert "stubborn-task at " in caplog.text and "_stubborn" in caplog.text
    release.set()
    await stubborn


async def test_stopping_tasks_never_swallows_the_callers_own_cancellation() -> None:
    release = asyncio.Event()
    stubborn = asyncio.create_task(_stubborn(release))
    await _steps(2)
    stopper = asyncio.create_task(stop_tasks([stubborn], "the test", WAIT_S))
    await _until(lambda: stubborn.cancelling() > 0, "the task is cancelled")
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(stopper, WAIT_S)
    release.set()
    await stubborn


async def test_a_step_that_never_finishes_is_cancelled_and_the_stop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parked = asyncio.Event()
    finished = await asyncio.wait_for(stop_step(parked.wait(), "the parked step", 0.2), WAIT_S)
    assert not finished
    assert "stopping: the parked step did not finish within 0.2 s" in caplog.text
    assert "in wait" in caplog.text  # where it waited


async def test_a_step_that_fails_is_logged_and_the_stop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing() -> None:
        raise RuntimeError("the component broke")

    assert not await stop_step(failing(), "the failing step")
    assert "stopping: the failing step failed" in caplog.text
    assert "the component broke" in caplog.text


@pytest.mark.usefixtures("short_bounds")
def test_running_to_the_end_abandons_a_task_that_would_hold_the_process_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What `apiary serve` runs its coordinator with: asyncio.run would wait for this task.
    kept: list[asyncio.Task[None]] = []

    async def main() -> str:
        kept.append(asyncio.create_task(_stubborn(asyncio.Event()), name="stubborn-at-exit"))
        await asyncio.sleep(0)
        return "answered"

    assert stopping.run(main()) == "answered"
    assert "still running at exit: a task did not end" in caplog.text
    assert "stubborn-at-exit" in caplog.text


# --------------------------------------------------------------------------- loops cancelled


class _AnsweringStore:
    """A store whose ping is answered when the test says."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[None] | None = None

    async def ping(self) -> None:
        self.answer = asyncio.get_running_loop().create_future()
        await self.answer


@pytest.mark.parametrize("after", STEPS)
async def test_the_store_health_probe_ends_when_cancelled_as_a_ping_is_answered(
    after: int,
) -> None:
    store = _AnsweringStore()

    async def unchanged(_: bool) -> None:
        return None

    async def no_pause(_: float) -> None:
        await asyncio.sleep(0)

    health = StoreHealth(store, unchanged, no_pause)  # type: ignore[arg-type]
    probing = asyncio.create_task(health.run())
    await _until(lambda: store.answer is not None, "a ping")
    assert store.answer is not None
    store.answer.set_result(None)
    await _steps(after)
    probing.cancel()
    done, _ = await asyncio.wait({probing}, timeout=WAIT_S)
    assert done, "the probe went on after its cancellation"
    assert probing.cancelled()


# --------------------------------------------------------------------------- the coordinator


@pytest.mark.usefixtures("short_bounds")
async def test_a_coordinators_stop_finishes_when_one_of_its_tasks_ignores_its_cancellation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()

    async def stubborn_probe(self: StoreHealth) -> None:
        await _stubborn(release)

    monkeypatch.setattr(StoreHealth, "run", stubborn_probe)
    try:
        async with asyncio.timeout(WAIT_S):
            async with open_test_coordinator(tmp_path) as running:
                pass
        assert "the coordinator's tasks: a task did not end" in caplog.text
        assert "apiary-store-health" in caplog.text
        assert running.events.counts["coordinator.stopped"] == 1  # the steps after it ran
    finally:
        release.set()


@pytest.mark.usefixtures("short_bounds")
async def test_a_coordinators_stop_goes_on_past_a_step_that_never_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def never(self: ControlPlanes) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(ControlPlanes, "close", never)
    async with asyncio.timeout(WAIT_S):
        async with open_test_coordinator(tmp_path) as running:
            pass
    assert "the runtime control planes did not finish within 0.5 s" in caplog.text
    assert running.events.counts["coordinator.stopped"] == 1


# --------------------------------------------------------------------------- control planes


def _runtime_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("apiary-runtime-")]


@contextlib.asynccontextmanager
async def _coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with asyncio.timeout(WAIT_S), open_test_coordinator(tmp_path) as running:
        yield running


async def test_closing_the_control_planes_ends_their_watchers_and_none_opens_after(
    tmp_path: Path,
) -> None:
    async with _coordinator(tmp_path) as running:
        controls = running.control_planes
        assert controls is not None
        await controls.of(DEFAULT_TENANT)
        watcher = next(t for t in _runtime_tasks() if t.get_name() == "apiary-runtime-actions")
        # It waits for the HITL engine's next change (the Condition nobody notifies at a stop).
        await _until(lambda: "in wait" in stack_lines(watcher)[-2], "the watcher waits")
        watching = [t for t in _runtime_tasks() if not t.done()]

        await asyncio.wait_for(controls.close(), WAIT_S)

        assert all(t.done() for t in watching)
        with pytest.raises(UnavailableError, match="the coordinator is stopping"):
            await controls.of(DEFAULT_TENANT)
        await controls.lead()  # (cluster mode's late start of its work: nothing either)
        assert not [t for t in _runtime_tasks() if not t.done()]


async def test_task_followers_follow_nothing_once_closed() -> None:
    followers = TaskFollowers(object(), asyncio.Lock(), "turn")  # type: ignore[arg-type]
    await followers.close()

    async def changed(_: object) -> bool:
        return True

    async def lost() -> None:
        return None

    followers.follow("turn-1", "task-1", "submitter", changed, lost)
    assert len(followers) == 0
    assert not _runtime_tasks()
