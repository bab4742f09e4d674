"""The Scheduler recovers from a task transition whose write the store failed (a cut
PostgreSQL connection, tests/server/test_tasks_under_cut.py). A transition writes first and
changes nothing in memory when the write fails; a dispatch whose write failed (the task's
DISPATCHED commits with the envelope's admission) goes back to its queue (its attempt
counted) and goes out again after `retry_after_s`, one whose write committed unheard counts
as dispatched; a task's first dispatch, in the commit that stores its submission, that
failed stores nothing and answers the submission `unavailable`, and given again the
submission finds that dispatch if it committed; an agent's ACK whose write (its message's
state with the task's transition, one transaction) failed unheard is kept with that
transition, looked up again from the Scheduler's loop until the store answers, and applied
anew when it had not committed; a submission whose write committed although its caller
heard `unavailable` is taken in when it is submitted
again. A write whose connection was lost but that committed (read back) counts as done.

The faults come from `FailingWrites`, a wrapper around the real SQLite store (a file under
the test's tmp_path): it makes the next writes of one of its methods fail with
StoreUnavailableError, as a cut connection does, before the real write or (`committed`)
after it, then lets the writes through to SQLite. Everything else is the real engine on a
fake clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from apiary.core.envelope import AckStage
from apiary.core.records import MessageState
from apiary.engine.scheduler.acks import RETRY_FIRST_S
from apiary.engine.settings import SchedulerSettings
from apiary.errors import UnavailableError
from apiary.store.errors import StoreUnavailableError
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, ready_agent, submit, task

RETRY_AFTER_S = 1.0


class FailingWrites:
    """Wraps one write method of the real SQLite store (`target.name`): the next `times`
    calls whose first argument `matches` fail with StoreUnavailableError, having written
    nothing or, with `committed`, after the real write went through (the caller cannot
    tell); the rest reach SQLite."""

    def __init__(self, target: Any, name: str) -> None:
        self._write: Callable[..., Awaitable[Any]] = getattr(target, name)
        setattr(target, name, self._call)
        self._times = 0
        self._matches: Callable[[Any], bool] = lambda _: True
        self._committed = False
        self.failed = 0

    def fail(
        self, times: int = 1, *, matches: Callable[[Any], bool] | None = None,
        committed: bool = False,
    ) -> None:  # fmt: skip
        self._times = times
        self._matches = matches or (lambda _: True)
        self._committed = committed

    async def _call(self, first: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._times or not self._matches(first):
            return await self._write(first, *args, **kwargs)
        self._times -= 1
        self.failed += 1
        if self._committed:
            await self._write(first, *args, **kwargs)
        raise StoreUnavailableError("PostgreSQL: the connection was cut (FailingWrites)")


class FailingReads:
    """Wraps one read method of the real store (`target.name`): while `on`, every call fails
    with StoreUnavailableError, as a store that does not answer."""

    def __init__(self, target: Any, name: str) -> None:
        self._read: Callable[..., Awaitable[Any]] = getattr(target, name)
        setattr(target, name, self._call)
        self.on = True

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self.on:
            raise StoreUnavailableError("PostgreSQL: no connection (FailingReads)")
        return await self._read(*args, **kwargs)


def in_state(state: str) -> Callable[[Any], bool]:
    """A task write of a record in `state`."""
    return lambda record: record.state == state


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    settings = SchedulerSettings(retry_after_s=RETRY_AFTER_S)
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path, scheduler=settings) as harness:
        await ready_agent(harness, "worker")
        yield harness


async def _data_ids(h: EngineHarness, agent_id: str) -> list[str]:
    """The DATA envelopes sent to the agent, oldest first."""
    return [m["message_id"] for m in await h.inbox_payloads(agent_id) if m["type"] == "DATA"]


async def _queued_for_later(h: EngineHarness, task_id: str) -> None:
    """`task_id` stored QUEUED for agent `late`, registered and not ready yet: its dispatch
    comes after its submission's commit, when `late` is ready (`_ready_late`)."""
    await h.register("late")
    queued = await submit(h, task_id, "late")
    assert queued.accepted and queued.task is not None and queued.task.state == "QUEUED"


async def _ready_late(h: EngineHarness) -> None:
    await h.engine.scheduler.agent_ready("late")


def _to(agent_id: str) -> Callable[[Any], bool]:
    """An admission of messages, one of them to `agent_id`."""
    return lambda records: any(r.recipient == agent_id for r in records)


async def _dispatch_again(h: EngineHarness) -> None:
    h.clock.advance(RETRY_AFTER_S)
    await h.engine.scheduler.fire_due()


async def test_a_dispatch_whose_write_committed_unheard_counts_as_dispatched_once(
    h: EngineHarness,
) -> None:
    """The task's DISPATCHED record commits with the envelope's admission: a write the
    store reported unavailable but that committed (the router finds the envelope stored)
    is a dispatch like any other, stored once with its event."""
    sends = FailingWrites(h.store.messages, "admit_many")
    sends.fail(matches=_to("worker"), committed=True)
    submitted = await submit(h, "t1", "worker")
    assert submitted.accepted and sends.failed == 1
    dispatched = await task(h, "t1")
    assert (dispatched.state, dispatched.attempts) == ("DISPATCHED", 1)
    assert dispatched == await h.store.tasks.get("t1")
    assert await _data_ids(h, "worker") == [dispatched.message_id]
    await ack_task(h, "t1", AckStage.READ)
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"
    assert len(await h.events("task.dispatched")) == 1


async def test_a_dispatch_found_committed_only_later_is_taken_as_it_was_stored(
    h: EngineHarness,
) -> None:
    """The admission of a dispatch commits (the task DISPATCHED with its envelope), but the
    store answers no read for longer than the router waits to tell: the Scheduler hears
    `unavailable` and puts the task back in its queue. Before the task goes out again the
    store is asked: the dispatch that committed is the task's, stored once, and its agent's
    ACKs of it complete the task."""
    await _queued_for_later(h, "t1")
    sends = FailingWrites(h.store.messages, "admit_many")
    reads = FailingWrites(h.store.messages, "get")
    sends.fail(matches=_to("late"), committed=True)
    reads.fail(10_000)
    await _ready_late(h)
    assert sends.failed == 1
    assert (await task(h, "t1")).state == "QUEUED"
    stored = await h.store.tasks.get("t1")
    assert stored is not None and stored.state == "DISPATCHED", "the write committed"
    reads.fail(0)

    await _dispatch_again(h)
    dispatched = await task(h, "t1")
    assert dispatched == stored
    assert await _data_ids(h, "late") == [stored.message_id]
    await ack_task(h, "t1", AckStage.READ)
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"
    assert [e.details["message_id"] for e in await h.events("task.dispatched")] == [
        stored.message_id
    ]


async def test_a_first_dispatch_found_committed_only_later_is_the_submission_given_again(
    h: EngineHarness,
) -> None:
    """A task its agent takes at once is dispatched in the commit that stores its
    submission. That commit goes through, but the store answers no read for longer than the
    router waits to tell: the submission is answered `unavailable`, nothing of the task is
    live. Given again, the submission is that task as stored, its dispatch the one that
    committed (one submission and one dispatch in the log), and its ACKs complete it."""
    sends = FailingWrites(h.store.messages, "admit_many")
    reads = FailingWrites(h.store.messages, "get")
    sends.fail(matches=_to("worker"), committed=True)
    reads.fail(10_000)
    with pytest.raises(UnavailableError):
        await submit(h, "t1", "worker")
    assert h.engine.scheduler.get("t1") is None
    stored = await h.store.tasks.get("t1")
    assert stored is not None and stored.state == "DISPATCHED", "the write committed"
    reads.fail(0)

    again = await submit(h, "t1", "worker")
    assert (again.accepted, again.created, again.task) == (True, False, stored)
    assert await _data_ids(h, "worker") == [stored.message_id]
    await ack_task(h, "t1", AckStage.READ)
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"
    for kind in ("task.submitted", "task.dispatched"):
        assert len(await h.events(kind)) == 1, kind


async def test_a_first_dispatch_whose_send_failed_stores_nothing_and_goes_out_when_given_again(
    h: EngineHarness,
) -> None:
    """The commit that was to store a submission with its first dispatch fails: nothing of
    the task is stored or live, the submission is answered `unavailable`, and the same
    submission again is dispatched under the same first attempt."""
    sends = FailingWrites(h.store.messages, "admit_many")
    sends.fail(matches=_to("worker"))
    with pytest.raises(UnavailableError):
        await submit(h, "t1", "worker")
    assert sends.failed == 1
    assert h.engine.scheduler.get("t1") is None
    assert await h.store.tasks.get("t1") is None
    assert await h.events("task.submitted") == []

    again = await submit(h, "t1", "worker")
    assert (again.accepted, again.created) == (True, True)
    sent = await task(h, "t1")
    assert (sent.state, sent.attempts) == ("DISPATCHED", 1)
    assert await _data_ids(h, "worker") == [sent.message_id]
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"


async def test_a_dispatch_whose_send_failed_goes_back_to_its_queue_and_out_again(
    h: EngineHarness,
) -> None:
    await _queued_for_later(h, "t1")
    sends = FailingWrites(h.store.messages, "admit_many")
    sends.fail(matches=_to("late"))
    await _ready_late(h)
    assert sends.failed == 1
    queued = await task(h, "t1")
    assert (queued.state, queued.attempts) == ("QUEUED", 1)
    assert [t.task_id for t in h.engine.scheduler.queued("late")] == ["t1"]
    # Nothing of the dispatch was stored: the task's record commits with the envelope.
    stored = await h.store.tasks.get("t1")
    assert stored is not None and stored.state == "QUEUED"
    assert await h.events("task.dispatched") == []

    await _dispatch_again(h)
    again = await task(h, "t1")
    assert (again.state, again.attempts, again.error_code) == ("DISPATCHED", 2, "")
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"


async def test_an_end_ack_whose_write_failed_is_applied_again_until_the_store_takes_it(
    h: EngineHarness,
) -> None:
    """The FULFILLED's write (the message's state with the task's COMPLETED, one
    transaction) is reported unavailable and the store answers no read: the ACK is kept with
    its transition, the task RUNNING and held meanwhile, and looked up again from the
    Scheduler's loop, with a longer pause while the store still does not answer."""
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.READ)
    writes = FailingWrites(h.store.messages, "record")
    writes.fail(matches=lambda changes: any(c.state is MessageState.FULFILLED for c in changes))
    reads = FailingReads(h.store.tasks, "get")
    (data,) = await _data_ids(h, "worker")
    with pytest.raises(StoreUnavailableError):
        await h.ack("worker", data, AckStage.FULFILLED, note='{"n": 1}')
    scheduler = h.engine.scheduler
    running = await task(h, "t1")
    assert running.state == "RUNNING"
    assert scheduler.holding("worker") == [running], "the agent let go of a task still RUNNING"
    # The same ACK again (the agent's retry: the router stores the message's FULFILLED now)
    # waits with the kept one: no second task write.
    assert (await h.ack("worker", data, AckStage.FULFILLED, note='{"n": 1}')).accepted
    assert (await h.store.messages.get(data)).state is MessageState.FULFILLED  # type: ignore[union-attr]
    assert scheduler.get("t1") == running

    h.clock.advance(RETRY_FIRST_S)
    await scheduler.fire_due()  # the store answers no read yet: the next try waits longer
    assert scheduler.get("t1") == running
    reads.on = False
    h.clock.advance(RETRY_FIRST_S)
    await scheduler.fire_due()
    assert scheduler.get("t1") == running
    h.clock.advance(2 * RETRY_FIRST_S)
    await scheduler.fire_due()
    done = await task(h, "t1")
    assert (done.state, done.result) == ("COMPLETED", '{"n": 1}')
    assert scheduler.holding("worker") == []
    assert [e.details["task_id"] for e in await h.events("task.completed")] == ["t1"]

    await submit(h, "t2", "worker")
    assert (await task(h, "t2")).state == "DISPATCHED", "the agent was not freed"


async def test_a_submission_that_committed_unheard_is_taken_in_when_submitted_again(
    h: EngineHarness,
) -> None:
    await h.register("late")  # (not ready: the task is stored QUEUED, not dispatched at once)
    writes = FailingWrites(h.store.tasks, "create")
    writes.fail(matches=in_state("QUEUED"), committed=True)
    with pytest.raises(StoreUnavailableError):
        await submit(h, "t1", "late")
    assert (await h.store.tasks.get("t1")) is not None, "the write committed"

    again = await submit(h, "t1", "late")
    assert (again.accepted, again.created) == (True, False)
    assert (await task(h, "t1")).state == "QUEUED"
    await _ready_late(h)
    dispatched = await task(h, "t1")
    assert (dispatched.state, dispatched.attempts) == ("DISPATCHED", 1)
    await ack_task(h, "t1", AckStage.FULFILLED, note='{"n": 1}')
    assert (await task(h, "t1")).state == "COMPLETED"
    submitted = [e for e in await h.events("task.submitted") if e.details["task_id"] == "t1"]
    assert len(submitted) == 1


async def test_a_task_write_that_committed_unheard_counts_as_done_once(
    h: EngineHarness,
) -> None:
    """The Scheduler's own write of a transition (here the agent's CompleteTask) reported
    unavailable but committed: read back, it counts as done, logged once."""
    state, event = "COMPLETED", "task.completed"
    writes = FailingWrites(h.store.tasks, "put")
    writes.fail(matches=in_state(state), committed=True)
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.READ)
    done = await h.engine.scheduler.complete("t1", "worker", result='{"n": 1}')
    assert writes.failed == 1
    assert (done.state, done.result) == ("COMPLETED", '{"n": 1}')
    assert done == await h.store.tasks.get("t1")
    assert h.engine.scheduler.holding("worker") == []
    assert len(await h.events(event)) == 1, f"{event} logged twice: its write went twice"


async def test_an_end_ack_whose_write_committed_unheard_is_the_tasks_end_once(
    tmp_path: Path,
) -> None:
    """The agent's FULFILLED and the task's COMPLETED commit together, but the store
    reported the write unavailable: the Scheduler reads the task back, finds it stored and
    takes the end as it was stored. Restarted, the agent's repeat of its ACK (as the SDK
    does on unavailable) changes nothing: one `task.completed`."""
    url = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with open_test_engine(store_url=url, data_dir=tmp_path) as before:
        await ready_agent(before, "worker")
        writes = FailingWrites(before.store.messages, "record")
        await submit(before, "t1", "worker")
        dispatched = await task(before, "t1")
        await ack_task(before, "t1", AckStage.READ)
        writes.fail(
            matches=lambda changes: any(c.state is MessageState.FULFILLED for c in changes),
            committed=True,
        )
        with pytest.raises(StoreUnavailableError):  # the agent hears unavailable
            await before.ack("worker", dispatched.message_id, AckStage.FULFILLED, note='{"n": 1}')
        assert writes.failed == 1
        assert (await task(before, "t1")).state == "COMPLETED"
        assert before.engine.scheduler.holding("worker") == []
    async with open_test_engine(store_url=url, data_dir=tmp_path) as h:
        stored = await h.store.messages.get(dispatched.message_id)
        assert stored is not None and stored.state is MessageState.FULFILLED
        done = await task(h, "t1")
        assert (done.state, done.result) == ("COMPLETED", '{"n": 1}')
        await ready_agent(h, "worker")
        again = await h.ack("worker", dispatched.message_id, AckStage.FULFILLED, note='{"n": 1}')
        assert again.accepted
        assert await task(h, "t1") == done
        assert len(await h.events("task.completed")) == 1
