"""The dispatches of one pass of the Scheduler go out in one commit (docs/scheduler.md,
"Dispatching"): an agent whose window takes several tasks gets them in one admission, and
the outcome of that admission is taken for each task as a lone dispatch's is: a commit that
fails leaves each task back in its queue and sends each once again, a refusal of one (its
agent's buffer full) leaves the others dispatched. On the real SQLite store (a file under
the test's tmp_path); the admissions are counted, or failed, by wrapping the store's
`admit_many` (tests/engine/test_first_dispatch.py `Counted`,
tests/engine/test_task_write_faults.py `FailingWrites`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage
from apiary.engine.settings import SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, submit, task
from tests.engine.test_first_dispatch import Counted
from tests.engine.test_task_write_faults import FailingWrites

RETRY_AFTER_S = 1.0
TASKS = ("t1", "t2", "t3")


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    settings = SchedulerSettings(prefetch=2, retry_after_s=RETRY_AFTER_S)
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path, scheduler=settings) as harness:
        yield harness


async def _queued(h: EngineHarness, capacity: int = 100) -> FailingWrites:
    """Three tasks queued for `worker`, registered (window 3: one running, two prefetched)
    and not ready yet; the store's admissions wrapped from now on."""
    await h.register("worker", capacity=capacity, task_concurrency=1)
    for task_id in TASKS:
        queued = await submit(h, task_id, "worker")
        assert queued.task is not None and queued.task.state == "QUEUED"
    return FailingWrites(h.store.messages, "admit_many")


async def _dispatched(h: EngineHarness) -> list[tuple[str, str, int]]:
    return [((t := await task(h, i)).task_id, t.state, t.attempts) for i in TASKS]


async def _data_ids(h: EngineHarness) -> list[str]:
    return [m["message_id"] for m in await h.inbox_payloads("worker") if m["type"] == "DATA"]


async def test_an_agents_window_is_filled_in_one_commit(h: EngineHarness) -> None:
    await _queued(h)
    admissions = Counted(h.store.messages, "admit_many")
    await h.engine.scheduler.agent_ready("worker")
    assert admissions.calls == 1
    assert await _dispatched(h) == [(i, "DISPATCHED", 1) for i in TASKS]
    stored = [await h.store.tasks.get(i) for i in TASKS]
    assert [t.state for t in stored if t is not None] == ["DISPATCHED"] * 3
    assert len(await _data_ids(h)) == 3
    events = await h.events("task.dispatched")
    assert [e.details["task_id"] for e in events] == list(TASKS)
    # The window refills as tasks end: each end lets one more in.
    await ack_task(h, "t1", AckStage.READ)
    await ack_task(h, "t1", AckStage.FULFILLED, note="1")
    assert (await task(h, "t1")).state == "COMPLETED"


async def test_a_failed_commit_puts_every_task_of_the_pass_back_and_sends_each_once_more(
    h: EngineHarness,
) -> None:
    sends = await _queued(h)
    sends.fail()
    await h.engine.scheduler.agent_ready("worker")
    assert sends.failed == 1
    assert await _dispatched(h) == [(i, "QUEUED", 1) for i in TASKS]
    assert [(await h.store.tasks.get(i)).state for i in TASKS] == ["QUEUED"] * 3  # type: ignore[union-attr]
    assert await _data_ids(h) == []

    h.clock.advance(RETRY_AFTER_S)
    await h.engine.scheduler.fire_due()
    assert await _dispatched(h) == [(i, "DISPATCHED", 2) for i in TASKS]
    assert len(await _data_ids(h)) == 3
    assert len(await h.events("task.dispatched")) == 3


async def test_a_commit_that_went_through_unheard_counts_each_dispatch_once(
    h: EngineHarness,
) -> None:
    sends = await _queued(h)
    sends.fail(committed=True)
    await h.engine.scheduler.agent_ready("worker")
    assert sends.failed == 1
    assert await _dispatched(h) == [(i, "DISPATCHED", 1) for i in TASKS]
    assert len(await _data_ids(h)) == 3
    assert len(await h.events("task.dispatched")) == 3


async def test_a_task_its_agents_full_buffer_refuses_waits_and_the_others_go(
    h: EngineHarness,
) -> None:
    await _queued(h, capacity=2)
    await h.engine.scheduler.agent_ready("worker")
    assert await _dispatched(h) == [
        ("t1", "DISPATCHED", 1), ("t2", "DISPATCHED", 1), ("t3", "QUEUED", 0)
    ]  # fmt: skip
    refused = [e for e in await h.events("message.rejected") if e.details["error_code"]]
    assert [e.details["error_code"] for e in refused] == ["buffer_full"]

    (first, _second) = await h.take("worker")
    await h.ack("worker", first.message.message_id, AckStage.FULFILLED)
    h.clock.advance(RETRY_AFTER_S)
    await h.engine.scheduler.fire_due()
    assert (await task(h, "t3")).state == "DISPATCHED"


class _HeldWrites:
    """Holds the store's admissions (`admit_many`) until released: a write in flight."""

    def __init__(self, target: object) -> None:
        self._write = target.admit_many  # type: ignore[attr-defined]
        target.admit_many = self._call  # type: ignore[attr-defined]
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _call(self, *args: object, **kwargs: object) -> object:
        self.entered.set()
        await self.release.wait()
        return await self._write(*args, **kwargs)


async def test_a_pass_cancelled_while_its_commit_is_in_flight_loses_no_task(
    h: EngineHarness,
) -> None:
    await _queued(h)
    held = _HeldWrites(h.store.messages)
    ready = asyncio.ensure_future(h.engine.scheduler.agent_ready("worker"))
    await held.entered.wait()
    ready.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ready
    held.release.set()
    assert await _dispatched(h) == [(i, "QUEUED", 1) for i in TASKS]

    h.clock.advance(RETRY_AFTER_S)
    await h.engine.scheduler.fire_due()
    assert await _dispatched(h) == [(i, "DISPATCHED", 2) for i in TASKS]
    assert len(await h.events("task.dispatched")) == 3
