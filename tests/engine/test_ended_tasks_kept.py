"""The tasks that ended last are kept as they were stored (engine/scheduler/live.py
`ENDED_KEPT`, within `ENDED_KEPT_BYTES`): their submitters ask for them just after they
end (WaitTask, FollowTasks, `apiary task status`), and an ended record never changes, so
those asks do not read the store. Older ones are read from it. On the real SQLite store;
its reads are counted by wrapping its method (the reads go through)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage
from apiary.core.records import TaskRecord, TaskState
from apiary.engine.scheduler import live
from apiary.engine.scheduler.wakeups import Wakeups
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, ready_agent, submit
from tests.engine.test_first_dispatch import Counted


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path) as harness:
        yield harness


async def _run(h: EngineHarness, task_id: str, stage: AckStage = AckStage.FULFILLED) -> None:
    assert (await submit(h, task_id, "worker")).accepted
    await ack_task(h, task_id, AckStage.READ)
    await ack_task(h, task_id, stage, note='{"n": 1}')


async def test_a_task_that_ended_lately_is_found_without_the_store(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "ENDED_KEPT", 2)
    await ready_agent(h, "worker")
    for task_id in ("t1", "t2", "t3"):
        await _run(h, task_id)
    reads = Counted(h.store.tasks, "get")
    scheduler = h.engine.scheduler
    for task_id in ("t2", "t3"):
        found = await scheduler.find(task_id)
        assert found == await h.store.tasks.get(task_id)  # (as stored: its result too)
        assert found.state == "COMPLETED" and found.result == '{"n": 1}'
        assert await scheduler.owner(task_id) == found.submitter
        assert (await scheduler.wait(task_id, 0.0)) == found
    assert reads.calls == 2  # the comparisons' own reads only
    assert (await scheduler.find("t1")).state == "COMPLETED"  # the oldest: from the store
    assert reads.calls == 3


def _ended(task_id: str, result_bytes: int) -> TaskRecord:
    return TaskRecord(task_id, "worker", 0, 1.0, 1, TaskState.COMPLETED, 2.0,
                      result="x" * result_bytes)  # fmt: skip


def test_the_kept_records_hold_at_most_their_byte_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A result may be 1 MiB or more: the kept records are bounded by their params and
    results, not only by their count; one larger than the budget is not kept at all."""
    monkeypatch.setattr(live, "ENDED_KEPT_BYTES", 3000)
    tasks = live.LiveTasks(FakeClock(), Wakeups())
    for n in range(5):
        tasks.stored(_ended(f"t{n}", 1000))
    assert [t for t in ("t0", "t1", "t2", "t3", "t4") if tasks.known(t)] == ["t2", "t3", "t4"]
    tasks.stored(_ended("huge", 3001))
    assert tasks.known("huge") is None
    assert [t for t in ("t2", "t3", "t4") if tasks.known(t)] == ["t2", "t3", "t4"]
    tasks.stored(_ended("t5", 2500))
    assert [t for t in ("t3", "t4", "t5") if tasks.known(t)] == ["t5"]
