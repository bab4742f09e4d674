"""Checks of the task store (`TaskStore`): what the Scheduler relies on to resume its
queues after a restart (RFC 7, 9)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from apiary.core.records import TaskRecord, TaskState
from apiary.store.errors import StoreError, TaskExistsError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    draft,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)

_INT64_MAX = (1 << 63) - 1

BINARY_PARAMS = b"\x00" + bytes(range(256)) + b"\x00\x00 trailing NULs\x00"
"""Every byte value, NULs leading, inside and trailing: params are bytes, not text."""


def task_record(task_id: str, seq: int, **fields: Any) -> TaskRecord:
    """A QUEUED task for agent-b submitted at T0 + seq, with small JSON params."""
    values: dict[str, Any] = {
        "task_id": task_id,
        "agent_id": "agent-b",
        "priority": 5,
        "submitted_at": T0 + seq,
        "seq": seq,
        "state": TaskState.QUEUED.value,
        "updated_at": T0 + seq,
        "scope": "repo-1",
        "job_key": f"job-{task_id}",
        "params": f'{{"task": "{task_id}"}}'.encode(),
        "content_type": "application/json",
        "agent_type": "coder",
    }
    values.update(fields)
    return TaskRecord(**values)


async def _ids(
    store: Store,
    states: Iterable[str] | None = None,
    agent_id: str | None = None,
    after_seq: int = -1,
    limit: int = 100,
) -> list[str]:
    wanted = None if states is None else frozenset(states)
    found = await store.tasks.list(wanted, agent_id=agent_id, after_seq=after_seq, limit=limit)
    return [t.task_id for t in found]


@_check
async def tasks_are_put_and_read(factory: StoreFactory) -> None:
    full = TaskRecord(
        task_id="task-1",
        agent_id="agent-b",
        priority=-3,
        submitted_at=T0 + 0.25,
        seq=7,
        state=TaskState.DISPATCHED,
        updated_at=T0 + 1.5,
        scope="repo-1/worktree-2",
        job_key="lint:repo-1",
        params=BINARY_PARAMS,
        content_type="application/octet-stream",
        agent_type="linter",
        message_id="msg-42",
        attempts=2,
        error_code="agent_unavailable",
        note="redispatched after a restart",
        lane="PRIVILEGED",
        correlation_id="workflow-7",
        submitter="app:ci",
        result='{"summary": "ok", "lines": [1, 2, 3]}',
    )
    minimal = TaskRecord(
        task_id="task-2",
        agent_id="agent-c",
        priority=0,
        submitted_at=T0,
        seq=8,
        state=TaskState.QUEUED,
        updated_at=T0,
    )
    async with factory.open() as store:
        assert await store.tasks.get("task-1") is None
        assert await store.tasks.list() == []
        await store.tasks.put(full)
        await store.tasks.put(minimal)
        stored = await store.tasks.get("task-1")
        assert stored == full
        assert stored is not None
        assert type(stored.params) is bytes
        assert stored.params == BINARY_PARAMS
        assert type(stored.submitted_at) is float
        other = await store.tasks.get("task-2")
        assert other == minimal
        assert other is not None
        assert (other.scope, other.job_key, other.params, other.content_type) == ("", "", b"", "")
        assert (other.agent_type, other.message_id, other.error_code, other.note) == ("",) * 4
        assert (other.submitter, other.result) == ("", "")
        assert other.attempts == 0
        assert await store.tasks.list() == [full, minimal]
        # A submitter's tasks (ListTasks shows a principal its own).
        assert await store.tasks.list(submitter="app:ci") == [full]
        assert await store.tasks.list(submitter="") == [minimal]
        assert await store.tasks.list(submitter="app") == []
        # Unknown ids, ids that differ in case only, and the empty id are not found.
        assert await store.tasks.get("task-3") is None
        assert await store.tasks.get("TASK-1") is None
        assert await store.tasks.get("") is None


@_check
async def tasks_keep_unicode_extremes_and_coerce_like_sql(factory: StoreFactory) -> None:
    record = task_record(
        f"task {UNICODE}",
        0,
        agent_id=f"agent {UNICODE}",
        priority=-_INT64_MAX - 1,
        scope=UNICODE,
        job_key=f"job {UNICODE}",
        params=UNICODE.encode(),
        content_type=f"text/plain; {UNICODE}",
        agent_type=UNICODE,
        message_id=f"msg {UNICODE}",
        attempts=_INT64_MAX,
        error_code=UNICODE,
        note=UNICODE * 100,
    )
    async with factory.open() as store:
        await store.tasks.put(record)
        assert await store.tasks.get(f"task {UNICODE}") == record
        assert await _ids(store, agent_id=f"agent {UNICODE}") == [f"task {UNICODE}"]
        # What a caller may pass loosely comes back as the field's type, on every backend.
        loose = task_record(
            "task-loose",
            _INT64_MAX,
            submitted_at=1_700_000_000,
            params=bytearray(b"\x00mutable\x00"),
            state=TaskState.RUNNING,
        )
        await store.tasks.put(loose)
        stored = await store.tasks.get("task-loose")
        assert stored is not None
        assert (type(stored.submitted_at), type(stored.params)) == (float, bytes)
        assert (stored.submitted_at, stored.params) == (1_700_000_000.0, b"\x00mutable\x00")
        assert type(stored.state) is str
        assert stored.state == "RUNNING"
        assert await store.tasks.max_seq() == _INT64_MAX


@_check
async def large_task_params_round_trip(factory: StoreFactory) -> None:
    params = bytes(range(256)) * 4096  # 1 MiB, NULs every 256 bytes
    assert len(params) == 1 << 20
    async with factory.open() as store:
        await store.tasks.put(task_record("big", 1, params=params))
        await store.tasks.put(task_record("big-reversed", 2, params=params[::-1]))
        stored = await store.tasks.get("big")
        assert stored is not None
        assert stored.params == params
        reversed_ = await store.tasks.get("big-reversed")
        assert reversed_ is not None
        assert reversed_.params == params[::-1]
        assert [t.params for t in await store.tasks.list()] == [params, params[::-1]]


@_check
async def large_task_results_round_trip(factory: StoreFactory) -> None:
    """A result is JSON text up to the default task_result_bytes (1 MiB), any Unicode in it,
    stored with the task as it ends and read back as written."""
    item = json.dumps({"text": UNICODE * 40}, ensure_ascii=False)
    result = "[" + ",".join([item] * ((1 << 20) // (len(item.encode()) + 1) - 1)) + "]"
    assert len(result.encode()) <= 1 << 20
    async with factory.open() as store:
        running = task_record("t-1", 1, state=TaskState.RUNNING.value, submitter="agent-a")
        await store.tasks.put(running)
        done = replace(running, state=TaskState.COMPLETED, result=result, updated_at=T0 + 9)
        await store.tasks.put(done)
        stored = await store.tasks.get("t-1")
        assert stored == done
        assert stored is not None and stored.result == result
        assert await store.tasks.list() == [done]
        # An ending that clears the result (a retried write, say) stores '' again.
        await store.tasks.put(replace(done, result=""))
        again = await store.tasks.get("t-1")
        assert again is not None and again.result == ""


@_check
async def putting_a_task_again_replaces_its_record(factory: StoreFactory) -> None:
    async with factory.open() as store:
        queued = task_record("task-1", 1)
        await store.tasks.put(queued)
        await store.tasks.put(task_record("task-2", 2))
        dispatched = replace(
            queued,
            state=TaskState.DISPATCHED,
            message_id="msg-1",
            attempts=1,
            updated_at=T0 + 10,
        )
        await store.tasks.put(dispatched)
        assert await store.tasks.get("task-1") == dispatched
        assert await _ids(store) == ["task-1", "task-2"]
        assert await _ids(store, {TaskState.QUEUED}) == ["task-2"]
        assert await _ids(store, {TaskState.DISPATCHED}) == ["task-1"]
        # Replaced as a whole, not merged: emptied fields come back empty.
        failed = replace(
            dispatched,
            state=TaskState.FAILED,
            scope="",
            job_key="",
            params=b"",
            content_type="",
            agent_type="",
            message_id="",
            error_code="agent_crashed",
            note="",
            agent_id="agent-z",
        )
        await store.tasks.put(failed)
        assert await store.tasks.get("task-1") == failed
        assert await _ids(store, agent_id="agent-b") == ["task-2"]
        assert await _ids(store, agent_id="agent-z") == ["task-1"]
        # seq is replaced too: the listing and max_seq follow it, and the old seq is free.
        moved = replace(failed, seq=5)
        await store.tasks.put(moved)
        assert await _ids(store) == ["task-2", "task-1"]
        assert await store.tasks.max_seq() == 5
        await store.tasks.put(task_record("task-3", 1))
        assert await _ids(store) == ["task-3", "task-2", "task-1"]
        assert len(await store.tasks.list()) == 3


@_check
async def creating_a_task_refuses_a_task_id_taken(factory: StoreFactory) -> None:
    """`create` is the write that tells a new task_id from a taken one: a task stored under
    it (in any state) refuses the new one with TaskExistsError, and nothing of that write
    (record or events) is stored; of concurrent creates under one id, one is stored."""
    async with factory.open() as store:
        first = task_record("task-1", 1)
        await store.tasks.create(first, [draft(1)])
        ended = replace(first, state=TaskState.COMPLETED, updated_at=T0 + 5)
        await store.tasks.put(ended)
        again = task_record("task-1", 2, priority=9)
        try:
            await store.tasks.create(again, [draft(2)])
        except TaskExistsError as exc:
            assert exc.task_id == "task-1"
        else:
            raise AssertionError("a second task was created under task-1")
        assert await store.tasks.get("task-1") == ended
        assert [e.details["n"] for e in await store.events.read()] == [1]
        assert await store.tasks.max_seq() == 1  # the refused one's seq was not taken
        results = await asyncio.gather(
            *(store.tasks.create(task_record("task-2", 10 + n), [draft(10 + n)]) for n in range(4)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, TaskExistsError)]
        assert len(refused) == 3 and results.count(None) == 1, results
        assert [t.task_id for t in await store.tasks.list()] == ["task-1", "task-2"]
        assert len(await store.events.read()) == 2


@_check
async def creating_tasks_together_is_all_or_none(factory: StoreFactory) -> None:
    """`create_many` stores a burst of new tasks and their events in one write; one task_id
    among them already stored (in any state) refuses them all, naming it, and nothing of
    that write is stored. Past a statement's rows, the chunks all go in (or none)."""
    async with factory.open() as store:
        burst = [task_record(f"task-{n}", n) for n in range(1, 4)]
        await store.tasks.create_many(burst, [draft(n) for n in range(1, 4)])
        assert await store.tasks.list() == burst
        assert [e.details["n"] for e in await store.events.read()] == [1, 2, 3]
        await store.tasks.put(replace(burst[1], state=TaskState.COMPLETED, updated_at=T0 + 9))
        again = [task_record("task-7", 7), task_record("task-2", 8), task_record("task-9", 9)]
        try:
            await store.tasks.create_many(again, [draft(7), draft(8)])
        except TaskExistsError as exc:
            assert exc.task_id == "task-2"
        else:
            raise AssertionError("a burst holding a taken task_id was stored")
        assert [t.task_id for t in await store.tasks.list()] == ["task-1", "task-2", "task-3"]
        assert len(await store.events.read()) == 3
        assert await store.tasks.max_seq() == 3  # the refused ones' seqs were not taken
        many = [task_record(f"bulk-{n:04}", 100 + n) for n in range(1200)]
        await store.tasks.create_many(many)
        assert len(await store.tasks.list(after_seq=99, limit=2000)) == 1200
        clash = [task_record(f"late-{n:04}", 2000 + n) for n in range(1199)]
        try:
            await store.tasks.create_many([*clash, task_record("bulk-1199", 4000)])
        except TaskExistsError as exc:
            assert exc.task_id == "bulk-1199"
        else:
            raise AssertionError("a burst past one statement's rows was partly refused")
        assert await store.tasks.list(after_seq=1999) == []
        await store.tasks.create_many([], [draft(10)])  # no tasks: the events alone
        assert [e.details["n"] for e in await store.events.read()][-1] == 10


@_check
async def a_seq_belongs_to_one_task(factory: StoreFactory) -> None:
    async with factory.open() as store:
        first = task_record("task-1", 1)
        second = task_record("task-2", 2)
        await store.tasks.put(first)
        await store.tasks.put(second)
        for clash in (task_record("task-3", 1), replace(second, seq=1)):
            try:
                await store.tasks.put(clash)
            except StoreError:
                pass
            else:
                raise AssertionError(f"{clash.task_id} was stored with the seq of task-1")
        # Refused without changing anything: neither task was replaced nor removed.
        assert await store.tasks.list() == [first, second]
        assert await store.tasks.get("task-3") is None


async def _list_fixture(store: Store) -> None:
    # Put out of seq order, with priorities and submission times that disagree with seq:
    # the listing orders by seq alone.
    records = [
        task_record("t-6", 6, agent_id="b", state=TaskState.COMPLETED.value, priority=9),
        task_record("t-1", 1, agent_id="a", state=TaskState.QUEUED.value, submitted_at=T0 + 9),
        task_record("t-3", 3, agent_id="b", state=TaskState.QUEUED.value, priority=-1),
        task_record("t-0", 0, agent_id="a", state=TaskState.HELD.value),
        task_record("t-2", 2, agent_id="a", state=TaskState.RUNNING.value),
        task_record("t-5", 5, agent_id="a", state=TaskState.QUEUED.value, submitted_at=T0),
        task_record("t-4", 4, agent_id="c", state=TaskState.DISPATCHED.value),
        task_record("t-7", 7, agent_id="b", state=TaskState.FAILED.value),
    ]
    for record in records:
        await store.tasks.put(record)


@_check
async def task_list_filters_by_states_agent_and_after_seq(factory: StoreFactory) -> None:
    everything = [f"t-{i}" for i in range(8)]
    queued, held = TaskState.QUEUED.value, TaskState.HELD.value
    async with factory.open() as store:
        await _list_fixture(store)
        assert await _ids(store) == everything
        assert await _ids(store, {queued}) == ["t-1", "t-3", "t-5"]
        assert await _ids(store, {queued, held}) == ["t-0", "t-1", "t-3", "t-5"]
        terminal = {s.value for s in TaskState if s.terminal}
        assert await _ids(store, terminal) == ["t-6", "t-7"]
        assert await _ids(store, {s.value for s in TaskState}) == everything
        # An empty set of states matches nothing, whatever else is asked; so do unknown ones.
        assert await _ids(store, set()) == []
        assert await _ids(store, set(), agent_id="a") == []
        assert await _ids(store, set(), after_seq=-100) == []
        assert await _ids(store, {"UNKNOWN"}) == []
        assert await _ids(store, {"queued"}) == []
        # agent_id is an exact match.
        assert await _ids(store, agent_id="a") == ["t-0", "t-1", "t-2", "t-5"]
        assert await _ids(store, agent_id="c") == ["t-4"]
        assert await _ids(store, agent_id="A") == []
        assert await _ids(store, agent_id="") == []
        # after_seq is a strict bound on seq; the default (-1) includes seq 0.
        assert await _ids(store, after_seq=3) == everything[4:]
        assert await _ids(store, after_seq=0) == everything[1:]
        assert await _ids(store, after_seq=7) == []
        assert await _ids(store, after_seq=-(1 << 62)) == everything
        # Combinations: every filter applies.
        assert await _ids(store, {queued}, agent_id="a") == ["t-1", "t-5"]
        assert await _ids(store, {queued}, agent_id="a", after_seq=1) == ["t-5"]
        assert await _ids(store, {queued}, after_seq=1) == ["t-3", "t-5"]
        assert await _ids(store, agent_id="b", after_seq=3) == ["t-6", "t-7"]
        assert await _ids(store, terminal, agent_id="b", after_seq=6) == ["t-7"]
        assert await _ids(store, {held}, agent_id="b") == []


@_check
async def task_list_pages_by_seq_and_limit(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _list_fixture(store)
        pages: list[list[str]] = []
        after = -1
        for _ in range(5):  # bounded: a store that ignored after_seq would loop forever
            page = await store.tasks.list(after_seq=after, limit=3)
            if not page:
                break
            pages.append([t.task_id for t in page])
            after = page[-1].seq
        assert pages == [["t-0", "t-1", "t-2"], ["t-3", "t-4", "t-5"], ["t-6", "t-7"]]
        # `limit` counts matching records.
        queued = {TaskState.QUEUED.value}
        assert await _ids(store, queued, limit=2) == ["t-1", "t-3"]
        assert await _ids(store, agent_id="a", limit=3) == ["t-0", "t-1", "t-2"]
        assert await _ids(store, queued, agent_id="a", after_seq=1, limit=1) == ["t-5"]
        assert await _ids(store, limit=0) == []
        assert await _ids(store, queued, limit=0) == []
        assert await _ids(store, limit=1) == ["t-0"]
        assert len(await store.tasks.list(limit=1000)) == 8
        assert len(await store.tasks.list()) == 8
        for states in (None, frozenset(queued), frozenset()):
            try:
                await store.tasks.list(states, limit=-1)
            except ValueError:
                pass
            else:
                raise AssertionError(f"tasks.list({states!r}, limit=-1) did not raise ValueError")


@_check
async def task_max_seq_is_the_highest_stored(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.tasks.max_seq() == -1
        await store.tasks.put(task_record("t-0", 0))
        assert await store.tasks.max_seq() == 0
        await store.tasks.put(task_record("t-9", 9))
        await store.tasks.put(task_record("t-4", 4))
        assert await store.tasks.max_seq() == 9
        # Terminal tasks count too: seq must never be handed out twice.
        await store.tasks.put(task_record("t-9", 9, state=TaskState.COMPLETED.value))
        assert await store.tasks.max_seq() == 9
        # It is the highest stored now, not the highest ever stored.
        await store.tasks.put(task_record("t-9", 2))
        assert await store.tasks.max_seq() == 4


@_check
async def tasks_that_do_not_fit_are_refused(factory: StoreFactory) -> None:
    bad_fields: list[dict[str, Any]] = [
        {"state": "NOT_A_STATE"},
        {"state": "queued"},
        {"priority": 1 << 63},
        {"priority": -(1 << 63) - 1},
        {"seq": 1 << 63},
        {"attempts": 1 << 64},
    ]
    good = task_record("task-1", 1)
    async with factory.open() as store:
        for fields in bad_fields:
            try:
                await store.tasks.put(replace(good, **fields))
            except ValueError:
                pass
            else:
                raise AssertionError(f"a task with {fields!r} was accepted")
        assert await store.tasks.get("task-1") is None
        assert await store.tasks.max_seq() == -1
        # A refused replacement leaves the stored record as it was.
        await store.tasks.put(good)
        for fields in bad_fields:
            with contextlib.suppress(ValueError):
                await store.tasks.put(replace(good, note="replaced", **fields))
        assert await store.tasks.list() == [good]


@_check
async def many_concurrent_task_puts_are_all_stored(factory: StoreFactory) -> None:
    count = 500
    records = [
        task_record(f"task-{i:03}", i, agent_id=f"agent-{i % 7}", params=bytes([i % 256]) * i)
        for i in range(count)
    ]
    async with factory.open() as store:
        await asyncio.gather(*(store.tasks.put(r) for r in reversed(records)))
        assert await store.tasks.max_seq() == count - 1
        assert await store.tasks.list(limit=count + 1) == records
        fetched = await asyncio.gather(*(store.tasks.get(r.task_id) for r in records))
        assert fetched == records
        assert await _ids(store, agent_id="agent-3", limit=count) == [
            r.task_id for r in records if r.agent_id == "agent-3"
        ]
        # Concurrent replacements of every task land too.
        running = [replace(r, state=TaskState.RUNNING, attempts=1) for r in records]
        await asyncio.gather(*(store.tasks.put(r) for r in running))
        assert await store.tasks.list(frozenset({TaskState.RUNNING.value}), limit=count) == running
        assert await store.tasks.list(frozenset({TaskState.QUEUED.value})) == []


@_check
async def tasks_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    held = task_record("t-1", 1, state=TaskState.HELD.value, params=BINARY_PARAMS)
    running = task_record("t-2", 2, state=TaskState.RUNNING.value, message_id="m-2", attempts=1)
    async with factory.open() as store:
        await store.tasks.put(held)
        await store.tasks.put(task_record("t-2", 2))
        await store.tasks.put(running)
    async with factory.open() as store:
        assert await store.tasks.get("t-1") == held
        assert await store.tasks.get("t-2") == running
        assert await store.tasks.list() == [held, running]
        assert await store.tasks.max_seq() == 2
        queued = replace(held, state=TaskState.QUEUED, updated_at=T0 + 60)
        await store.tasks.put(queued)
        await store.tasks.put(task_record("t-3", 3))
    async with factory.open() as store:
        assert await store.tasks.list(frozenset({TaskState.HELD.value})) == []
        assert await _ids(store, {TaskState.QUEUED.value}) == ["t-1", "t-3"]
        assert await store.tasks.list(limit=2) == [queued, running]
        assert await store.tasks.max_seq() == 3


@_check
async def shared_queue_tasks_keep_their_queue_and_lost_attempts(factory: StoreFactory) -> None:
    """A task of a shared queue (schema version 19): its queue and the attempts lost with
    their agent are stored and read back, and `list` filters by queue."""
    waiting = task_record(
        "s-1", 1, agent_id="", queue="capability:review", state=TaskState.QUEUED.value
    )
    held = task_record(
        "s-2", 2, agent_id="agent-x", queue="capability:review", lost_attempts=2,
        state=TaskState.RUNNING.value, attempts=3, message_id="m-3",
    )  # fmt: skip
    typed = task_record("s-3", 3, agent_id="", queue="agent_type:coder")
    direct = task_record("d-4", 4)
    async with factory.open() as store:
        for record in (waiting, held, typed, direct):
            await store.tasks.put(record)
        assert await store.tasks.get("s-2") == held
        assert (await store.tasks.get("d-4")) == direct and direct.queue == ""
        assert await _queue_ids(store, "capability:review") == ["s-1", "s-2"]
        assert await _queue_ids(store, "agent_type:coder") == ["s-3"]
        assert await _queue_ids(store, "") == ["d-4"]  # the tasks submitted to one agent
        assert await _queue_ids(store, "capability:nobody") == []
        assert await _queue_ids(store, "capability:review", agent_id="agent-x") == ["s-2"]
        assert await _queue_ids(store, "capability:review", agent_id="") == ["s-1"]
        states = frozenset({TaskState.QUEUED.value})
        found = await store.tasks.list(states, queue="capability:review")
        assert [t.task_id for t in found] == ["s-1"]
        # Back in its queue after its agent was lost: no agent, one more attempt lost.
        requeued = replace(held, agent_id="", state=TaskState.QUEUED, lost_attempts=3)
        await store.tasks.put(requeued)
        assert await store.tasks.get("s-2") == requeued
        for bad in (1 << 63, -(1 << 63) - 1):
            try:
                await store.tasks.put(replace(held, lost_attempts=bad))
            except ValueError:
                pass
            else:
                raise AssertionError(f"lost_attempts={bad} was accepted")
        assert await store.tasks.get("s-2") == requeued


async def _queue_ids(store: Store, queue: str, agent_id: str | None = None) -> list[str]:
    return [t.task_id for t in await store.tasks.list(agent_id=agent_id, queue=queue)]
