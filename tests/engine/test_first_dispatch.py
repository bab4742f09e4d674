"""A submission its agent takes at once is stored with its first dispatch: the task's record,
`task.submitted` and `task.dispatched` commit in the transaction that admits the envelope
carrying it, one commit instead of two (docs/scheduler.md, "Submitting a task"). One that does not
go out at once is stored QUEUED as before, and nothing of a first try shows. On the real
SQLite store (a file under the test's tmp_path); the store's task writes are counted by
wrapping its methods (the writes go through)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from apiary.core.conflicts import ConflictPolicy
from apiary.core.envelope import AckStage
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, ready_agent, submit, task


class Counted:
    """Counts the calls of one of the store's methods (`target.name`), which go through."""

    def __init__(self, target: Any, name: str) -> None:
        self._call: Callable[..., Awaitable[Any]] = getattr(target, name)
        setattr(target, name, self._counted)
        self.calls = 0

    async def _counted(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self._call(*args, **kwargs)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    settings = SchedulerSettings(prefetch=1, conflicts=ConflictPolicy(serialize_below=0.7))
    async with open_test_engine(store_url=url, data_dir=tmp_path, scheduler=settings) as harness:
        yield harness


async def _kinds(h: EngineHarness, task_id: str) -> list[str]:
    """The task's events, in the log's order."""
    return [
        e.event_type
        for e in await h.events()
        if e.event_type.startswith("task.") and e.details.get("task_id") == task_id
    ]


async def test_a_task_its_agent_takes_at_once_is_stored_with_its_dispatch(
    h: EngineHarness,
) -> None:
    await ready_agent(h, "worker", task_concurrency=1)  # (declared: the prefetch applies)
    creates = Counted(h.store.tasks, "create")
    puts = Counted(h.store.tasks, "put")
    submitted = await submit(h, "t1", "worker")
    assert submitted.accepted and submitted.created
    assert submitted.task is not None and submitted.task.state == "DISPATCHED"
    assert submitted.reason.startswith("dispatched as message")
    assert (creates.calls, puts.calls) == (0, 0), "the record was written apart from the dispatch"
    assert await h.store.tasks.get("t1") == submitted.task
    assert await _kinds(h, "t1") == ["task.submitted", "task.dispatched"]
    # Running t1, the agent takes t2 into its prefetch at once; t3 waits, stored QUEUED.
    await ack_task(h, "t1", AckStage.READ)
    prefetched = await submit(h, "t2", "worker")
    assert prefetched.task is not None and prefetched.task.state == "DISPATCHED"
    assert creates.calls == 0
    queued = await submit(h, "t3", "worker")
    assert queued.task is not None and queued.task.state == "QUEUED"
    assert creates.calls == 1
    assert await _kinds(h, "t3") == ["task.submitted"]
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"
    assert (await task(h, "t3")).state == "DISPATCHED"


async def test_a_shared_queue_task_an_agent_takes_at_once_is_stored_with_its_dispatch(
    h: EngineHarness,
) -> None:
    await ready_agent(h, "a", "review")
    creates = Counted(h.store.tasks, "create")
    submitted = await submit(h, "t1", capability="review")
    assert submitted.task is not None
    assert (submitted.task.state, submitted.task.agent_id) == ("DISPATCHED", "a")
    assert creates.calls == 0
    stored = await h.store.tasks.get("t1")
    assert stored == submitted.task and stored.queue


async def test_a_task_that_must_wait_behind_a_conflict_is_stored_queued_once(
    h: EngineHarness,
) -> None:
    """The first try meets a conflict: nothing of it is stored; the task is stored QUEUED
    and deferred, each with its one event, as a task that never had that try."""
    await ready_agent(h, "worker", task_concurrency=2)
    await submit(h, "m1", "worker", scope="repo:app path:src/a.py")
    waiting = await submit(h, "m2", "worker", scope="repo:app path:src/a.py")
    assert waiting.task is not None and waiting.task.state == "QUEUED"
    assert (await task(h, "m2")).note.startswith("SERIALIZE behind m1")
    assert await _kinds(h, "m2") == ["task.submitted", "task.deferred"]
    stored = await h.store.tasks.get("m2")
    assert stored is not None and stored.state == "QUEUED"


async def test_an_ended_tasks_id_refuses_the_first_dispatch_and_answers_that_task(
    h: EngineHarness,
) -> None:
    """The id is looked up in the dispatch's own transaction: a task that ended under it
    is the answer, and nothing is sent or stored."""
    await ready_agent(h, "worker")
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    ended = await task(h, "t1")
    sent = len(await h.inbox_payloads("worker"))
    again = await submit(h, "t1", "worker")
    assert (again.accepted, again.created, again.task) == (True, False, ended)
    assert len(await h.inbox_payloads("worker")) == sent
    assert await h.store.tasks.get("t1") == ended
    assert await _kinds(h, "t1") == [
        "task.submitted", "task.dispatched", "task.completed",
    ]  # fmt: skip


async def test_a_full_buffer_stores_the_task_queued_and_refuses_its_dispatch_once() -> None:
    """The agent's inbound buffer is full: the first try does not send (no refusal of it
    shows); the task is stored QUEUED and its dispatch refused once, as before."""
    settings = RouterSettings(buffer_capacity=1)
    async with open_test_engine(settings, scheduler=SchedulerSettings(retry_after_s=1.0)) as h:
        await ready_agent(h, "worker")
        await h.register("alice")
        assert (await h.send("alice", "worker", {"fill": 1})).accepted
        queued = await submit(h, "t1", "worker")
        assert queued.task is not None and queued.task.state == "QUEUED"
        assert len(await h.events("message.rejected")) == 1
