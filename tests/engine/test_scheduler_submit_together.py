"""SubmitTasks that arrive while the Scheduler's lock is taken are decided together: in
arrival order, as each would be alone, their task records stored in one group commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.engine.scheduler.scheduler import Scheduler, Submission, SubmitResult
from apiary.engine.settings import SchedulerSettings
from apiary.errors import AlreadyExistsError
from apiary.store.errors import StoreUnavailableError
from apiary.store.sqlite.store import SqliteStore
from apiary.testing.engine import EngineHarness, open_test_engine

WAIT_S = 10.0


def _sub(task_id: str, agent_id: str = "worker", job: str = "", **fields: Any) -> Submission:
    params = json.dumps({"task": job or task_id}).encode()
    return Submission(agent_id, task_id, 0, params, scope=f"repo:{job or task_id}", **fields)


async def _together(
    scheduler: Scheduler, submissions: list[Submission]
) -> list[SubmitResult | BaseException]:
    """Submit them all while the lock is held, so that they arrive together, in this order
    (each admitted before the next is submitted); then let go."""
    async with scheduler._lock:
        calls = await _arrive(scheduler, submissions)
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT_S)


async def _arrive(
    scheduler: Scheduler, submissions: list[Submission]
) -> list[asyncio.Future[SubmitResult]]:
    calls = []
    for n, submission in enumerate(submissions, 1):
        calls.append(asyncio.ensure_future(scheduler.submit(submission)))
        await _until(lambda n=n: len(scheduler._arrivals) == n)  # type: ignore[misc]
    return calls


async def _until(condition: Any) -> None:
    async def wait() -> None:
        while not condition():  # noqa: ASYNC110 - the state polled has no event of its own
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), WAIT_S)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    settings = SchedulerSettings(max_queued=40, duplicate_jobs="reject")
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, scheduler=settings) as harness:
        await harness.register("worker")
        await harness.register("other")
        yield harness


def _commits(h: EngineHarness) -> int:
    assert isinstance(h.store, SqliteStore)
    return h.store.stats.writer.commits


async def test_submissions_that_arrive_together_share_one_commit(h: EngineHarness) -> None:
    scheduler = h.engine.scheduler
    before = _commits(h)
    results = await _together(scheduler, [_sub(f"t{i:02d}") for i in range(32)])
    assert all(isinstance(r, SubmitResult) and r.accepted for r in results)
    # Decided in arrival order: sequence numbers follow it, each task queued and stored.
    seqs = [r.task.seq for r in results if isinstance(r, SubmitResult) and r.task]
    assert seqs == sorted(seqs) and len(set(seqs)) == 32
    stored = await scheduler.list_tasks(None, "worker", -1, 100)
    assert [t.task_id for t in stored] == [f"t{i:02d}" for i in range(32)]
    # One at a time they took 32 commits or more; together the records took a few.
    assert _commits(h) - before < 8
    logged = [e for e in await h.events() if e.event_type == "task.submitted"]
    assert [e.details["task_id"] for e in logged] == [f"t{i:02d}" for i in range(32)]


async def test_refusals_in_a_batch_are_decided_as_alone(h: EngineHarness) -> None:
    scheduler = h.engine.scheduler
    await scheduler.submit(_sub("open", job="held-job"))
    results = await _together(scheduler, [
        _sub("a"),
        _sub("a", job="another"),  # the same task id again (another job), in the batch
        _sub("b", job="shared"),
        _sub("c", job="shared"),  # the same job as b, earlier in the batch
        _sub("d", job="held-job"),  # the same job as a task already open
        _sub("e", agent_id="other"),
    ])  # fmt: skip
    a, a_again, b, c, d, e = results
    assert isinstance(a, SubmitResult) and a.accepted
    assert isinstance(a_again, AlreadyExistsError)
    assert isinstance(b, SubmitResult) and b.accepted
    assert isinstance(c, SubmitResult) and not c.accepted
    assert c.reason.startswith("duplicate_detected: same job as task b")
    assert isinstance(d, SubmitResult) and not d.accepted
    assert d.reason.startswith("duplicate_detected: same job as task open")
    assert isinstance(e, SubmitResult) and e.accepted
    stored = {t.task_id for t in await scheduler.list_tasks(None, None, -1, 100)}
    assert stored == {"open", "a", "b", "e"}
    assert a.task is not None and (await scheduler.find("a")).params == a.task.params


async def test_a_full_queue_refuses_the_rest_of_a_batch(h: EngineHarness) -> None:
    scheduler = h.engine.scheduler
    results = await _together(scheduler, [_sub(f"t{i:02d}") for i in range(45)])
    accepted = [r for r in results if isinstance(r, SubmitResult) and r.accepted]
    refused = [r for r in results if isinstance(r, SubmitResult) and not r.accepted]
    assert len(accepted) == 40 and len(refused) == 5
    assert all(r.reason == "buffer_full: 40 tasks waiting (max_queued 40)" for r in refused)
    assert len(await scheduler.list_tasks(None, None, -1, 100)) == 40


async def test_a_submission_cancelled_before_its_turn_is_not_stored(h: EngineHarness) -> None:
    scheduler = h.engine.scheduler
    async with scheduler._lock:
        kept, gone = await _arrive(scheduler, [_sub("kept"), _sub("gone")])
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
    result = await asyncio.wait_for(kept, WAIT_S)
    assert result.accepted
    assert [t.task_id for t in await scheduler.list_tasks(None, None, -1, 100)] == ["kept"]


async def test_the_others_are_decided_when_the_first_caller_is_cancelled(
    h: EngineHarness,
) -> None:
    scheduler = h.engine.scheduler
    started = asyncio.Event()
    create_many = scheduler._store.create_many

    async def slow_create(records: Any, events: Any = ()) -> None:
        started.set()
        await asyncio.sleep(0.05)
        await create_many(records, events)

    scheduler._store.create_many = slow_create  # type: ignore[method-assign]
    async with scheduler._lock:
        calls = await _arrive(scheduler, [_sub(f"t{i}") for i in range(3)])
    await asyncio.wait_for(started.wait(), WAIT_S)
    calls[0].cancel()  # the caller deciding for all three, while their records are written
    first, *others = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT_S)
    assert isinstance(first, asyncio.CancelledError)
    assert all(isinstance(r, SubmitResult) and r.accepted for r in others)
    # The decision went through: all three are stored and queued (the first caller's too).
    stored = [t.task_id for t in await scheduler.list_tasks(None, None, -1, 100)]
    assert stored == ["t0", "t1", "t2"]
    assert scheduler.get("t0") is not None


async def test_a_run_of_submissions_is_stored_by_one_write(h: EngineHarness) -> None:
    """One write for the run, whatever the store groups (PostgreSQL groups nothing)."""
    scheduler = h.engine.scheduler
    calls: list[int] = []
    create, create_many = scheduler._store.create, scheduler._store.create_many

    async def counted_create(record: Any, events: Any = ()) -> None:
        calls.append(1)
        await create(record, events)

    async def counted_many(records: Any, events: Any = ()) -> None:
        calls.append(len(records))
        await create_many(records, events)

    scheduler._store.create = counted_create  # type: ignore[method-assign]
    scheduler._store.create_many = counted_many  # type: ignore[method-assign]
    results = await _together(scheduler, [_sub(f"t{i:02d}") for i in range(20)])
    assert all(isinstance(r, SubmitResult) and r.accepted and r.created for r in results)
    assert calls == [20]
    assert [t.state for t in await scheduler.list_tasks(None, None, -1, 100)] == ["QUEUED"] * 20


async def test_a_run_holding_the_id_of_an_ended_task_stores_the_others(
    h: EngineHarness,
) -> None:
    """The run's write finds one task_id taken (its task ended, so the live Scheduler did
    not see it): that one is answered as the task stored under it, the others are stored."""
    scheduler = h.engine.scheduler
    await scheduler.submit(_sub("ended"))
    await scheduler.cancel("ended", "not wanted", "tester")
    results = await _together(scheduler, [_sub("a"), _sub("ended"), _sub("b")])
    a, ended, b = results
    assert isinstance(a, SubmitResult) and (a.accepted, a.created) == (True, True)
    assert isinstance(b, SubmitResult) and (b.accepted, b.created) == (True, True)
    assert isinstance(ended, SubmitResult) and not ended.created
    assert ended.task is not None and (ended.task.state, ended.task.error_code) == (
        "FAILED",
        "cancelled",
    )
    stored = {t.task_id: t.state for t in await scheduler.list_tasks(None, None, -1, 100)}
    assert stored == {"ended": "FAILED", "a": "QUEUED", "b": "QUEUED"}
    submitted = [e.details["task_id"] for e in await h.events() if e.event_type == "task.submitted"]
    assert submitted == ["ended", "a", "b"]


async def test_a_run_whose_write_committed_unheard_is_taken_in_when_submitted_again(
    h: EngineHarness,
) -> None:
    """The run's one write fails with its outcome unknown (a cut connection), having
    committed: each caller gets the error; each submitting again gets its task, queued as
    stored, logged once."""
    scheduler = h.engine.scheduler
    create_many = scheduler._store.create_many

    async def committed_unheard(records: Any, events: Any = ()) -> None:
        await create_many(records, events)
        raise StoreUnavailableError("PostgreSQL: the connection was cut (test)")

    scheduler._store.create_many = committed_unheard  # type: ignore[method-assign]
    subs = [_sub(f"t{i}") for i in range(3)]
    results = await _together(scheduler, subs)
    assert all(isinstance(r, StoreUnavailableError) for r in results), results
    scheduler._store.create_many = create_many  # type: ignore[method-assign]
    for sub in subs:
        again = await scheduler.submit(sub)
        assert (again.accepted, again.created) == (True, False)
        assert again.task is not None and again.task.state == "QUEUED"
    assert [t.task_id for t in scheduler.queued("worker")] == ["t0", "t1", "t2"]
    submitted = [e.details["task_id"] for e in await h.events() if e.event_type == "task.submitted"]
    assert submitted == ["t0", "t1", "t2"]
