"""Results back to the submitter, in the engine, on memory, a real SQLite file and PostgreSQL:
a task_id given again is the task submitted first (other content is task_id_conflict), a
missing one is assigned, the agent's result is stored with the task (from its FULFILLED note,
or through `complete`), `wait` answers the end or the state at its timeout (virtual time),
`watch_tasks` feeds a submitter its tasks' changes, and a held duplicate says why it waits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from apiary.core.envelope import AckStage
from apiary.core.ids import is_uuid4
from apiary.core.records import TaskRecord, TaskState
from apiary.engine.hitl import HitlSettings
from apiary.engine.scheduler.scheduler import Scheduler, Submission, SubmitResult
from apiary.errors import (
    AlreadyCompletedError,
    NotFoundError,
    PermissionDeniedError,
    TaskIdConflictError,
    ValidationError,
)
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds
from tests.engine.scheduler_harness import ALICE, SCOPE, _finish, _ready

WAIT_S = 10.0
BACKENDS = ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'apiary.db'}"
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema: str = request.getfixturevalue("postgres_schema")
        separator = "&" if "?" in dsn else "?"
        yield f"{dsn}{separator}apiary_schema={schema}&connect_timeout=5"


class Opener:
    """Opens engines over one store in turn (a restart), with one clock and id sequence."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url, self.data_dir = url, data_dir
        self.clock, self.ids = FakeClock(), SequentialIds()

    @property
    def durable(self) -> bool:
        return self.url != "memory://"

    @asynccontextmanager
    async def open(self) -> AsyncIterator[EngineHarness]:
        async with open_test_engine(
            store_url=self.url, data_dir=self.data_dir, clock=self.clock, ids=self.ids,
            hitl=HitlSettings(operators=(ALICE,)),
        ) as harness:  # fmt: skip
            await _ready(harness, "worker")
            await harness.register("other")
            yield harness


@pytest.fixture
def opener(store_url: str, tmp_path: Path) -> Opener:
    return Opener(store_url, tmp_path)


@pytest.fixture
async def h(opener: Opener) -> AsyncIterator[EngineHarness]:
    async with opener.open() as harness:
        yield harness


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


async def _until(condition: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not condition():  # noqa: ASYNC110 - the state polled has no event of its own
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), WAIT_S)


async def _submit(
    h: EngineHarness, task_id: str, agent_id: str = "worker", *, body: Any = None,
    scope: str = SCOPE, **fields: Any,
) -> SubmitResult:  # fmt: skip
    """Submit a task whose params are `body` as JSON (default: one naming the task)."""
    params = json.dumps({"task": task_id} if body is None else body).encode()
    return await _sched(h).submit(
        Submission(agent_id, task_id, params=params, scope=scope, **fields)
    )


async def _submitted(h: EngineHarness, task_id: str, **fields: Any) -> TaskRecord:
    result = await _submit(h, task_id, **fields)
    assert isinstance(result, SubmitResult) and result.task is not None, result
    return result.task


# --- task ids ----------------------------------------------------------------------------------


async def test_a_task_id_given_again_with_the_same_submission_is_that_task(
    opener: Opener, h: EngineHarness
) -> None:
    first = await _submit(h, "t1", submitter="app")
    assert first.accepted and first.created
    again = await _submit(h, "t1", submitter="app")
    assert (again.accepted, again.created) == (True, False)
    assert again.task is not None and again.task.task_id == "t1"
    assert again.reason.startswith("already submitted, DISPATCHED")
    await _finish(h, "t1", note='{"lines": 3}')
    ended = await _submit(h, "t1", submitter="app")
    assert (ended.created, ended.task and ended.task.state) == (False, "COMPLETED")
    # One task, one submission event: a retry writes nothing.
    assert [t.task_id for t in await h.store.tasks.list()] == ["t1"]
    assert len(await h.events("task.submitted")) == 1
    if not opener.durable:
        return
    async with opener.open() as reopened:  # the id is a key across a restart too
        later = await _submit(reopened, "t1", submitter="app")
        assert (later.created, later.task and later.task.result) == (False, '{"lines": 3}')


async def test_other_content_under_a_task_id_is_task_id_conflict_naming_the_field(
    h: EngineHarness,
) -> None:
    await _submit(h, "t1", submitter="app")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"scope": "repo:other"}, "scope"),
        ({"priority": 5}, "priority"),
        ({"agent_id": "other"}, "agent_id"),
        ({"submitter": "mallory"}, "submitter"),
    ]
    for fields, differs in cases:
        with pytest.raises(TaskIdConflictError) as caught:
            await _submit(h, "t1", **{"submitter": "app", **fields})
        assert caught.value.code == "task_id_conflict"
        assert caught.value.details["field"] == "task_id"
        assert caught.value.details["differs"] == differs
    # Nothing stored for the refusals; the first submission stands.
    (stored,) = await h.store.tasks.list()
    assert (stored.task_id, stored.scope, stored.submitter) == ("t1", SCOPE, "app")


async def test_a_task_id_of_an_ended_task_is_found_by_the_write_not_by_a_read(
    h: EngineHarness,
) -> None:
    """A new id costs the submission no read of the store: the record's write is what tells
    it from a task stored under it (`TaskStore.create`). Given again after the task ended,
    the same content is that task, other content task_id_conflict; nothing is stored for
    either, and the retry of a task whose agent is gone is still that task."""
    store = h.store.tasks
    reads: list[str] = []
    get = store.get

    async def counted(task_id: str) -> TaskRecord | None:
        reads.append(task_id)
        return await get(task_id)

    store.get = counted  # type: ignore[method-assign]
    assert (await _submit(h, "t1", submitter="app")).created
    assert reads == []
    await _finish(h, "t1", note='{"lines": 1}')
    ended = await _submit(h, "t1", submitter="app")
    assert (ended.accepted, ended.created) == (True, False)
    assert ended.task is not None and ended.task.result == '{"lines": 1}'
    with pytest.raises(TaskIdConflictError) as caught:
        await _submit(h, "t1", submitter="app", scope="repo:other")
    assert caught.value.details["differs"] == "scope"
    assert len(await h.events("task.submitted")) == 1
    assert [t.task_id for t in await store.list()] == ["t1"]
    await h.engine.registry.deregister("worker", "gone")
    gone = await _submit(h, "t1", submitter="app")
    assert (gone.created, gone.task and gone.task.state) == (False, "COMPLETED")
    with pytest.raises(NotFoundError):  # a new id for the agent that is gone is refused
        await _submit(h, "t2", submitter="app")


async def test_submissions_of_one_task_id_that_arrive_together_are_one_task(
    h: EngineHarness,
) -> None:
    scheduler = _sched(h)
    calls: list[asyncio.Future[SubmitResult]] = []
    async with scheduler._lock:  # they arrive together, in this order, decided in one go
        arriving: list[dict[str, Any]] = [{}, {}, {"priority": 3}, {}]
        for n, fields in enumerate(arriving, 1):
            calls.append(asyncio.ensure_future(_submit(h, "t1", submitter="app", **fields)))
            await _until(lambda n=n: len(scheduler._arrivals) == n)  # type: ignore[misc]
    first, second, other, third = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(first, SubmitResult) and first.created
    for again in (second, third):
        assert isinstance(again, SubmitResult) and (again.accepted, again.created) == (True, False)
    assert isinstance(other, TaskIdConflictError)
    assert len(await h.store.tasks.list()) == 1


async def test_without_a_task_id_the_scheduler_assigns_one(h: EngineHarness) -> None:
    a = await _submitted(h, "", scope="repo:a")
    b = await _submitted(h, "", scope="repo:b")
    assert is_uuid4(a.task_id) and is_uuid4(b.task_id) and a.task_id != b.task_id
    stored = await _sched(h).find(a.task_id)
    assert (stored.correlation_id, stored.flow_id) == ("", a.task_id)


# --- results -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("note", "result"),
    [
        ('{"fixed": [1, 2]}', '{"fixed": [1, 2]}'),
        (" 42 ", "42"),
        ("all done", '"all done"'),
        ("", ""),
    ],
)
async def test_a_fulfilled_note_is_the_tasks_result(
    h: EngineHarness, note: str, result: str
) -> None:
    await _submit(h, "t1")
    await _finish(h, "t1", note=note)
    done = await _sched(h).find("t1")
    assert (done.state, done.note, done.result) == ("COMPLETED", note.strip(), result)
    assert (await h.store.tasks.get("t1")) == done


async def test_the_agent_completes_its_own_task_with_a_result_and_nothing_else(
    opener: Opener, h: EngineHarness
) -> None:
    scheduler = _sched(h)
    await _submit(h, "queued-first", "other")
    with pytest.raises(ValidationError) as caught:  # not dispatched: "other" has no stream
        await scheduler.complete("queued-first", "other", result="1")
    assert caught.value.details["field"] == "task_id" and "QUEUED" in caught.value.message
    await _submit(h, "t1")
    with pytest.raises(PermissionDeniedError):
        await scheduler.complete("t1", "other", result="1")
    with pytest.raises(NotFoundError):
        await scheduler.complete("nope", "worker", result="1")
    running = scheduler.get("t1")
    assert running is not None
    big = json.dumps({"rows": ["x" * 100] * 1000})
    done = await scheduler.complete("t1", "worker", result=big, message="rows")
    assert (done.state, done.result, done.note) == ("COMPLETED", big, "rows")
    with pytest.raises(AlreadyCompletedError):
        await scheduler.complete("t1", "worker", result="2")
    # The agent's FULFILLED ACK that follows (or any late one) changes nothing.
    await h.ack("worker", running.message_id, AckStage.FULFILLED, note="late")
    assert await scheduler.find("t1") == done
    await _submit(h, "t2", scope="repo:b")
    failed = await scheduler.complete("t2", "worker", error_code="Empty_Input", message="no rows")
    assert (failed.state, failed.error_code, failed.note, failed.result) == (
        "FAILED", "empty_input", "no rows", "",
    )  # fmt: skip
    completed = [e for e in await h.events("task.completed") if e.details["task_id"] == "t1"]
    assert completed[0].details["result_size"] == len(big)  # logged by its size, not itself
    if opener.durable:
        async with opener.open() as reopened:
            assert (await _sched(reopened).find("t1")).result == big


# --- waiting and watching ----------------------------------------------------------------------


async def test_wait_answers_the_end_or_the_state_at_its_timeout(h: EngineHarness) -> None:
    scheduler = _sched(h)
    await _submit(h, "t1", "other")  # "other" never connects: the task waits
    sleeping = h.clock.pending_sleepers
    timed = asyncio.ensure_future(scheduler.wait("t1", 30.0))
    await _until(lambda: h.clock.pending_sleepers > sleeping)
    h.clock.advance(29.0)
    await asyncio.sleep(0)
    assert not timed.done()
    h.clock.advance(1.0)
    assert (await asyncio.wait_for(timed, WAIT_S)).state == "QUEUED"
    # A wait with no timeout answers the end, with the result.
    await _submit(h, "t2", scope="repo:b")
    ended = asyncio.ensure_future(scheduler.wait("t2"))
    await _until(lambda: scheduler.watch.waiting() == 1)
    await _finish(h, "t2", note='{"ok": true}')
    done = await asyncio.wait_for(ended, WAIT_S)
    assert (done.state, done.result) == ("COMPLETED", '{"ok": true}')
    assert (await scheduler.wait("t2", 0.0)).state == "COMPLETED"  # ended: at once
    assert scheduler.watch.waiting() == 0
    with pytest.raises(NotFoundError):
        await scheduler.wait("nope", 1.0)
    assert scheduler.watch.waiting() == 0


async def test_watch_feeds_a_submitter_its_tasks_and_their_changes(h: EngineHarness) -> None:
    scheduler = _sched(h)
    await _submit(h, "open", "other", submitter="app")
    await _submit(h, "theirs", "other", scope="repo:x", submitter="someone")
    seen: list[tuple[str, str]] = []

    async def watch(task_ids: frozenset[str] = frozenset()) -> None:
        async for task in scheduler.watch_tasks("app", task_ids):
            seen.append((task.task_id, task.state))

    everything = asyncio.ensure_future(watch())
    await _until(lambda: seen == [("open", "QUEUED")])
    await _submit(h, "t1", scope="repo:b", submitter="app")
    await _until(lambda: ("t1", "DISPATCHED") in seen)
    await _finish(h, "t1", note="3")
    await _until(lambda: seen[-1] == ("t1", "COMPLETED"))
    assert all(task_id != "theirs" for task_id, _ in seen)
    everything.cancel()
    # Named tasks: each as it stands first, and the stream ends once all have ended.
    seen.clear()
    await asyncio.wait_for(watch(frozenset({"t1"})), WAIT_S)
    assert seen == [("t1", "COMPLETED")]
    with pytest.raises(NotFoundError):  # another submitter's task is not found for "app"
        await asyncio.wait_for(watch(frozenset({"theirs"})), WAIT_S)
    await asyncio.gather(everything, return_exceptions=True)
    assert scheduler.watch.waiting() == 0


async def test_a_follower_is_offered_each_followed_end_once_and_refuses_what_it_may_not_see(
    h: EngineHarness,
) -> None:
    scheduler = _sched(h)
    watch = scheduler.watch
    await _submit(h, "early", scope="repo:a", submitter="app")
    await _finish(h, "early", note="1")
    await _submit(h, "later", "other", scope="repo:b", submitter="app")
    await _submit(h, "dropped", "other", scope="repo:c", submitter="app")
    await _submit(h, "theirs", "other", scope="repo:d", submitter="someone")

    def mine(task: TaskRecord) -> bool:
        return task.submitter == "app"

    with watch.follower() as follower:
        # Read after it is followed: an end stored before is offered at once.
        refused = await watch.follow(
            follower, ["early", "later", "dropped", "theirs", "nope"], mine
        )
        assert sorted(refused) == ["nope", "theirs"]
        assert follower.following == {"later", "dropped"}
        assert await watch.follow(follower, ["later"], mine) == []  # (followed already)
        follower.refuse(refused)
        taken = await asyncio.wait_for(follower.next(), WAIT_S)
        assert taken is not None
        ended, told = taken
        assert ([t.task_id for t in ended], sorted(told)) == (["early"], ["nope", "theirs"])
        watch.unfollow(follower, ["dropped"])
        assert watch.waiting() == 1
        await scheduler.cancel("dropped", "not wanted", "app")
        await scheduler.cancel("later", "ends", "app")
        taken = await asyncio.wait_for(follower.next(), WAIT_S)
        assert taken is not None and [t.task_id for t in taken[0]] == ["later"]
        assert (taken[0][0].state, taken[0][0].error_code) == ("FAILED", "cancelled")
        # Closed with nothing followed left: the follower says so.
        follower.close()
        assert await asyncio.wait_for(follower.next(), WAIT_S) is None
        await watch.follow(follower, ["theirs"], lambda _task: True)
    assert watch.waiting() == 0  # (the block's end unfollows the rest)


# --- held duplicates -----------------------------------------------------------------------------


async def test_a_held_duplicate_job_says_why_it_waits_and_its_id_still_names_it(
    h: EngineHarness,
) -> None:
    scheduler = _sched(h)
    await _submit(h, "first", "other", body="job")
    held = await _submit(h, "second", "other", body="job", submitter="app")
    assert not held.accepted and held.error_code == "duplicate_detected"
    assert held.task is not None and held.task.state == TaskState.HELD
    (invocation,) = await h.engine.hitl.list()
    assert held.task.note == (
        f"held for HITL authorization (invocation {invocation.invocation_id}): duplicate job, "
        "same job as task first (QUEUED)"
    )
    assert (await h.store.tasks.get("second")) == held.task
    again = await _submit(h, "second", "other", body="job", submitter="app")
    assert (again.accepted, again.created, again.task) == (False, False, held.task)
    assert len(await h.engine.hitl.list()) == 1  # no second escalation
    assert (await scheduler.wait("second", 0.0)).note == held.task.note
