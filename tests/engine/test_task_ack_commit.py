"""An agent's ACK of a dispatch and the task transition it causes commit in one transaction
(engine/router/ack_joins.py): the message's READ with the task's RUNNING, its FULFILLED or
REJECTED with the task's COMPLETED or FAILED, each with its events. A fault in either write
(a SQLite trigger inside the transaction) leaves neither, in the store as in the
Scheduler's memory, and the ACK sent again applies both, once. A write whose outcome the
store could not tell, and which nobody can look up yet, keeps the ACK with its transition:
looked up again from the Scheduler's loop, it takes effect once when it had committed.
Everything is the real engine on a SQLite file and a fake clock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage
from apiary.core.records import MessageState
from apiary.engine import eventlog
from apiary.engine.scheduler.acks import RETRY_FIRST_S
from apiary.store.errors import StoreError, StoreUnavailableError
from apiary.store.sqlite.store import SqliteStore
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ack_task, ready_agent, submit, task
from tests.engine.test_task_write_faults import FailingReads, FailingWrites


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    return tmp_path / "apiary.db"


@pytest.fixture
async def h(db: Path, tmp_path: Path) -> AsyncIterator[EngineHarness]:
    async with open_test_engine(store_url=f"sqlite:///{db}", data_dir=tmp_path) as harness:
        await ready_agent(harness, "worker")
        yield harness


def _trigger(db: Path, name: str, sql: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TRIGGER {name} {sql} BEGIN SELECT RAISE(ABORT, 'injected'); END")


def _drop(db: Path, name: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(f"DROP TRIGGER {name}")


async def _stored_state(h: EngineHarness, message_id: str) -> MessageState:
    stored = await h.store.messages.get(message_id)
    assert stored is not None
    return stored.state


async def _task_events(h: EngineHarness, event_type: str) -> list[str]:
    return [e.details["task_id"] for e in await h.events(event_type)]


@pytest.mark.parametrize(
    "fault",
    [
        # The task's write fails: the message's state must not commit without it.
        "BEFORE UPDATE OF state ON tasks WHEN NEW.state = 'COMPLETED'",
        # The message's write fails: the task's transition must not commit without it.
        "BEFORE UPDATE OF state ON messages WHEN NEW.state = 'FULFILLED'",
    ],
)
async def test_a_fault_in_either_write_of_an_end_ack_leaves_neither(
    h: EngineHarness, db: Path, fault: str
) -> None:
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.READ)
    running = await task(h, "t1")
    _trigger(db, "ack_fault", fault)
    with pytest.raises(StoreError):
        await h.ack("worker", running.message_id, AckStage.FULFILLED, note='{"n": 1}')
    assert await _stored_state(h, running.message_id) is MessageState.READ
    assert await h.store.tasks.get("t1") == running
    assert await task(h, "t1") == running
    assert h.engine.scheduler.holding("worker") == [running]
    assert await _task_events(h, "task.completed") == []
    ended = [e for e in await h.events("message.state") if e.details["to"] == "FULFILLED"]
    assert ended == []

    _drop(db, "ack_fault")
    assert (await h.ack("worker", running.message_id, AckStage.FULFILLED, note='{"n": 1}')).accepted
    assert await _stored_state(h, running.message_id) is MessageState.FULFILLED
    done = await h.store.tasks.get("t1")
    assert done is not None and (done.state, done.result) == ("COMPLETED", '{"n": 1}')
    assert await task(h, "t1") == done
    assert h.engine.scheduler.holding("worker") == []
    assert await _task_events(h, "task.completed") == ["t1"]
    await submit(h, "t2", "worker")
    assert (await task(h, "t2")).state == "DISPATCHED", "the agent was not freed"


async def test_a_read_and_the_task_running_commit_together(h: EngineHarness, db: Path) -> None:
    """A fault in the task's RUNNING leaves the message as it was and the task DISPATCHED;
    the READ sent again stores both and registers the activity entry."""
    await submit(h, "t1", "worker")
    dispatched = await task(h, "t1")
    _trigger(db, "read_fault", "BEFORE UPDATE OF state ON tasks WHEN NEW.state = 'RUNNING'")
    with pytest.raises(StoreError):
        await h.ack("worker", dispatched.message_id, AckStage.READ)
    assert await _stored_state(h, dispatched.message_id) is MessageState.RECEIVED
    assert await h.store.tasks.get("t1") == dispatched == await task(h, "t1")
    assert await _task_events(h, "task.running") == []

    _drop(db, "read_fault")
    assert (await h.ack("worker", dispatched.message_id, AckStage.READ)).accepted
    assert await _stored_state(h, dispatched.message_id) is MessageState.READ
    running = await h.store.tasks.get("t1")
    assert running is not None and running.state == "RUNNING"
    assert await task(h, "t1") == running
    assert await _task_events(h, "task.running") == ["t1"]
    assert [e.task_id for e in h.engine.activity.buffer.active()] == ["t1"]


async def test_a_read_and_the_end_in_one_frame_commit_together(h: EngineHarness, db: Path) -> None:
    """A task's READ and its end in one frame (the SDK sends a quick task's so) are one
    commit: a fault in the COMPLETED leaves the message RECEIVED, the task DISPATCHED and no
    event of either step; the frame sent again stores both steps, each with its event and
    its message's move, and the activity entry (registered at dispatch) completed."""
    await submit(h, "t1", "worker")
    dispatched = await task(h, "t1")
    mid = dispatched.message_id
    frame = [(mid, AckStage.READ, "", ""), (mid, AckStage.FULFILLED, "", '{"n": 1}')]
    _trigger(db, "end_fault", "BEFORE UPDATE OF state ON tasks WHEN NEW.state = 'COMPLETED'")
    with pytest.raises(StoreError):
        await h.ack_frame("worker", frame)
    assert await _stored_state(h, mid) is MessageState.RECEIVED
    assert await h.store.tasks.get("t1") == dispatched == await task(h, "t1")
    assert await _task_events(h, "task.running") == []
    assert [e.task_id for e in h.engine.activity.buffer.active()] == ["t1"]  # from dispatch
    assert h.engine.activity.buffer.history() == []

    _drop(db, "end_fault")
    outcomes = await h.ack_frame("worker", frame)
    assert [o.accepted for o in outcomes] == [True, True]
    assert await _stored_state(h, mid) is MessageState.FULFILLED
    done = await h.store.tasks.get("t1")
    assert done is not None and (done.state, done.result) == ("COMPLETED", '{"n": 1}')
    assert h.engine.scheduler.holding("worker") == []
    steps = [
        (e.event_type, e.details["message_from"], e.details["message_state"])
        for e in await h.events() if e.event_type in ("task.running", "task.completed")
    ]  # fmt: skip
    assert steps == [("task.running", "RECEIVED", "READ"), ("task.completed", "READ", "FULFILLED")]
    entries = h.engine.activity.buffer.history()
    assert [(e.task_id, e.outcome) for e in entries] == [("t1", "COMPLETED")]
    assert h.engine.activity.buffer.active() == []
    await submit(h, "t2", "worker")
    assert (await task(h, "t2")).state == "DISPATCHED", "the agent was not freed"


def _commits(h: EngineHarness) -> int:
    assert isinstance(h.store, SqliteStore)
    return h.store.stats.writer.commits


async def test_a_read_and_the_end_in_one_frame_are_one_commit(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's lazy READ: a quick task's READ and end in one frame cost the store one
    commit, the same two ACKs in two frames two. (Events noted outside a state change, the
    agent's lifecycle, ride with the next commit: none of their own meanwhile.)"""
    monkeypatch.setattr(eventlog, "FLUSH_AFTER_S", 60.0)
    await submit(h, "t1", "worker")
    mid = (await task(h, "t1")).message_id
    await asyncio.sleep(0.05)  # a flush already waiting ends
    before = _commits(h)
    await h.ack_frame("worker", [(mid, AckStage.READ, "", ""), (mid, AckStage.FULFILLED, "", "")])
    assert _commits(h) - before == 1
    assert (await task(h, "t1")).state == "COMPLETED"

    await submit(h, "t2", "worker")
    mid = (await task(h, "t2")).message_id
    before = _commits(h)
    await h.ack_frame("worker", [(mid, AckStage.READ, "", "")])
    await h.ack_frame("worker", [(mid, AckStage.FULFILLED, "", "")])
    assert _commits(h) - before == 2
    assert (await task(h, "t2")).state == "COMPLETED"


@pytest.mark.parametrize("committed", [True, False])
async def test_a_read_and_end_in_doubt_take_effect_once_as_stored(
    h: EngineHarness, committed: bool
) -> None:
    """The joint write of a frame's READ and end is reported unavailable and the task cannot
    be read back: both ACKs are kept; once the store answers, both steps take effect once,
    as stored or applied anew."""
    await submit(h, "t1", "worker")
    mid = (await task(h, "t1")).message_id
    writes = FailingWrites(h.store.messages, "record")
    writes.fail(
        matches=lambda changes: any(c.state is MessageState.FULFILLED for c in changes),
        committed=committed,
    )
    unread = FailingReads(h.store.tasks, "get")
    frame = [(mid, AckStage.READ, "", ""), (mid, AckStage.FULFILLED, "", '{"n": 2}')]
    with pytest.raises(StoreUnavailableError):
        await h.ack_frame("worker", frame)
    scheduler = h.engine.scheduler
    assert scheduler.get("t1") is not None

    h.clock.advance(RETRY_FIRST_S)
    unread.on = False
    await scheduler.fire_due()
    done = await task(h, "t1")
    assert (done.state, done.result) == ("COMPLETED", '{"n": 2}')
    assert done == await h.store.tasks.get("t1")
    assert scheduler.holding("worker") == []
    assert await _task_events(h, "task.running") == ["t1"]
    assert await _task_events(h, "task.completed") == ["t1"]
    assert h.engine.activity.buffer.active() == []


async def test_a_rejected_ack_fails_the_task_in_the_same_commit(h: EngineHarness) -> None:
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.READ)
    held = await task(h, "t1")
    answer = await h.ack("worker", held.message_id, AckStage.REJECTED, error_code="BAD_INPUT")
    assert answer.accepted
    assert await _stored_state(h, held.message_id) is MessageState.REJECTED
    failed = await h.store.tasks.get("t1")
    assert failed is not None and (failed.state, failed.error_code) == ("FAILED", "bad_input")
    assert await _task_events(h, "task.failed") == ["t1"]


@pytest.mark.parametrize("committed", [True, False])
async def test_an_end_ack_in_doubt_is_kept_with_its_transition_until_the_store_tells(
    h: EngineHarness, committed: bool
) -> None:
    """The joint write of a FULFILLED is reported unavailable and the task cannot be read
    back: the Scheduler keeps the ACK with its transition, the task RUNNING meanwhile. Once
    the store answers, a transition that had committed takes effect as it was stored (one
    `task.completed`); one that had not is applied anew by the Scheduler's own write."""
    await submit(h, "t1", "worker")
    await ack_task(h, "t1", AckStage.READ)
    running = await task(h, "t1")
    writes = FailingWrites(h.store.messages, "record")
    writes.fail(
        matches=lambda changes: any(c.state is MessageState.FULFILLED for c in changes),
        committed=committed,
    )
    unread = FailingReads(h.store.tasks, "get")
    with pytest.raises(StoreUnavailableError):
        await h.ack("worker", running.message_id, AckStage.FULFILLED, note='{"n": 1}')
    scheduler = h.engine.scheduler
    assert scheduler.holding("worker") == [running]
    assert scheduler.get("t1") == running

    h.clock.advance(RETRY_FIRST_S)
    unread.on = False
    await scheduler.fire_due()
    done = await task(h, "t1")
    assert (done.state, done.result) == ("COMPLETED", '{"n": 1}')
    assert done == await h.store.tasks.get("t1")
    assert scheduler.holding("worker") == []
    assert await _task_events(h, "task.completed") == ["t1"]
