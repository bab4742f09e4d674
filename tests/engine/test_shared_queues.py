"""Shared task queues on the engine with a fake clock: a task names a capability or an agent
type, any RUNNABLE agent offering it takes it (fairly), and a task whose agent is lost goes
back to its queue, up to max_attempts (docs/scheduler.md, "Shared queues")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.conflicts import ConflictPolicy
from apiary.core.envelope import AckStage
from apiary.core.records import TaskRecord
from apiary.engine.scheduler.scheduler import Scheduler, Submission, SubmitResult
from apiary.engine.settings import SchedulerSettings
from apiary.errors import (
    DuplicateDetectedError,
    PermissionDeniedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.task_harness import ready_agent as _agent
from tests.engine.task_harness import submit
from tests.engine.task_harness import task as _task


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(scheduler=SchedulerSettings(max_attempts=2)) as harness:
        yield harness


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


async def _shared(
    h: EngineHarness, task_id: str, capability: str = "review", **fields: Any
) -> SubmitResult:
    return await submit(h, task_id, capability=capability, **fields)


async def _read(h: EngineHarness, task_id: str) -> TaskRecord:
    task = await _task(h, task_id)
    await h.ack(task.agent_id, task.message_id, AckStage.READ)
    return await _task(h, task_id)


async def _finish(h: EngineHarness, task_id: str, note: str = "done") -> str:
    """The agent holding the task reads it and completes it; returns that agent."""
    task = await _read(h, task_id)
    await h.ack(task.agent_id, task.message_id, AckStage.FULFILLED, note=note)
    return task.agent_id


def _held(h: EngineHarness, *agents: str) -> dict[str, list[str]]:
    return {a: [t.task_id for t in _sched(h).holding(a)] for a in agents}


async def test_a_capability_task_goes_to_an_agent_offering_it(h: EngineHarness) -> None:
    await _agent(h, "builder", "build")
    await _agent(h, "reviewer", "review", "lint")
    result = await _shared(h, "t1", "review")
    assert result.accepted and result.reason.endswith("to reviewer"), result.reason
    task = await _task(h, "t1")
    assert (task.state, task.queue) == ("DISPATCHED", "capability:review")
    assert task.agent_id == "reviewer"
    assert task.agent_type == "reviewer"
    assert _held(h, "builder", "reviewer") == {"builder": [], "reviewer": ["t1"]}
    assert await _finish(h, "t1", '{"ok": true}') == "reviewer"
    done = await _task(h, "t1")
    assert (done.state, done.result, done.agent_id) == ("COMPLETED", '{"ok": true}', "reviewer")


async def test_an_agent_type_names_a_queue_of_its_own(h: EngineHarness) -> None:
    await _agent(h, "c-1", "coder", name="coder")
    await _agent(h, "r-1", name="reviewer")
    result = await _sched(h).submit(
        Submission("", "t1", params=b"{}", scope="repo:a", agent_type="coder")
    )
    assert result.accepted
    task = await _task(h, "t1")
    assert (task.queue, task.agent_id, task.agent_type) == ("agent_type:coder", "c-1", "coder")


async def test_a_submission_names_exactly_one_agent_or_queue(h: EngineHarness) -> None:
    await _agent(h, "reviewer", "review")
    cases: list[tuple[dict[str, str], str]] = [
        ({}, "agent_id"),
        ({"agent_id": "reviewer", "capability": "review"}, "capability"),
        ({"capability": "review", "agent_type": "reviewer"}, "agent_type"),
        ({"capability": "two words"}, "capability"),
        ({"capability": "x" * 257}, "capability"),
        ({"agent_type": "tab\there"}, "agent_type"),
    ]
    for names, field in cases:
        sub = Submission(names.pop("agent_id", ""), "bad", params=b"{}", scope="repo:a", **names)
        with pytest.raises(ValidationError) as caught:
            await _sched(h).submit(sub)
        assert caught.value.details["field"] == field, (names, caught.value)
    with pytest.raises(UnsupportedMessageTypeError):  # none of its agents takes image/png
        await _shared(h, "png", content_type="image/png")
    assert await h.store.tasks.list() == []


@pytest.mark.conformance("scheduler.priority.order-numeric", "scheduler.priority.order-fifo")
async def test_a_shared_queue_serves_by_priority_then_fifo(h: EngineHarness) -> None:
    await _agent(h, "reviewer", "review")
    await _shared(h, "first")
    for task_id, priority in (("p5", 5), ("a0", 0), ("m3", -3), ("b0", 0)):
        h.clock.advance(1)
        await _shared(h, task_id, priority=priority)
    order = []
    current = "first"
    while True:
        await _finish(h, current)
        nxt = _sched(h).running("reviewer")
        if nxt is None:
            break
        current = nxt.task_id
        order.append(current)
    assert order == ["m3", "a0", "b0", "p5"]


async def test_shared_tasks_are_spread_fairly_over_three_agents(h: EngineHarness) -> None:
    for agent in ("x", "y", "z"):
        await _agent(h, agent, "review")
    for n in range(9):
        await _shared(h, f"t{n}")
    # One each to begin with (round robin among idle agents), the rest wait in the queue.
    assert _held(h, "x", "y", "z") == {"x": ["t0"], "y": ["t1"], "z": ["t2"]}
    assert [t.task_id for t in _sched(h).queued_in("capability:review")] == [
        f"t{n}" for n in range(3, 9)
    ]
    ran: dict[str, list[str]] = {"x": [], "y": [], "z": []}
    while any(_held(h, "x", "y", "z").values()):
        for agent in ("x", "y", "z"):
            for task in _sched(h).holding(agent):
                ran[await _finish(h, task.task_id)].append(task.task_id)
    assert {agent: len(tasks) for agent, tasks in ran.items()} == {"x": 3, "y": 3, "z": 3}
    # A busy agent takes nothing more: the idle ones share what comes.
    await _shared(h, "slow")
    holder = (await _task(h, "slow")).agent_id
    others = sorted({"x", "y", "z"} - {holder})
    for n in range(4):
        await _shared(h, f"u{n}")
        await _finish(h, f"u{n}")
    counts = {a: 0 for a in others}
    for event in await h.events("task.dispatched"):
        if str(event.details["task_id"]).startswith("u"):
            counts[str(event.agent_id)] += 1
    assert counts == dict.fromkeys(others, 2)
    assert [t.task_id for t in _sched(h).holding(holder)] == ["slow"]


async def test_a_capability_nobody_offers_waits_and_says_so(h: EngineHarness) -> None:
    await _agent(h, "builder", "build")
    result = await _shared(h, "t1", "translate")
    assert result.accepted
    assert result.reason == "queued: waiting: no registered agent offers capability 'translate'"
    task = await _task(h, "t1")
    assert (task.state, task.agent_id) == ("QUEUED", "")
    assert task.note == "waiting: no registered agent offers capability 'translate'"
    listed = await _sched(h).list_tasks(None, None, -1, 10, queue="capability:translate")
    assert [(t.task_id, t.note) for t in listed] == [("t1", task.note)]
    assert await _sched(h).list_tasks(None, None, -1, 10, queue="capability:build") == []
    # The first agent offering it takes it as soon as it is ready.
    await h.register("linguist", capabilities=["translate"])
    assert (await _task(h, "t1")).state == "QUEUED"
    await _sched(h).agent_ready("linguist")
    assert (await _task(h, "t1")).agent_id == "linguist"


async def test_a_busy_queue_says_its_agents_are_busy(h: EngineHarness) -> None:
    await _agent(h, "reviewer", "review")
    await _shared(h, "t1")
    result = await _shared(h, "t2")
    assert result.reason == (
        "queued: waiting for one of the 1 agent(s) of capability 'review' to have room"
    )


async def test_a_task_whose_agent_is_lost_goes_back_to_its_queue(h: EngineHarness) -> None:
    await _agent(h, "x", "review")
    await _agent(h, "y", "review")
    await _shared(h, "busy")  # x
    await _shared(h, "t1")  # y
    first = await _read(h, "t1")
    assert first.agent_id == "y" and first.attempts == 1
    await _sched(h).agent_lost("y", "3 missed heartbeats")
    back = await _task(h, "t1")
    assert (back.state, back.agent_id, back.lost_attempts) == ("QUEUED", "", 1)
    assert back.note.startswith("back in its queue: agent y was lost with it (agent_unavailable")
    assert h.engine.scheduler.lifecycles.state("y") == "RECOVERING"  # FAILED, then recovery
    # x takes it once it has room; the dispatch is a new attempt.
    await _finish(h, "busy")
    second = await _task(h, "t1")
    assert (second.state, second.agent_id, second.attempts) == ("DISPATCHED", "x", 2)
    assert second.message_id != first.message_id
    (requeued,) = await h.events("task.requeued")
    assert requeued.details["lost_attempts"] == 1
    assert requeued.details["error_code"] == "agent_unavailable"


async def test_a_late_ack_of_a_taken_back_dispatch_completes_nothing(h: EngineHarness) -> None:
    await _agent(h, "x", "review")
    await _agent(h, "y", "review")
    await _shared(h, "busy")
    await _shared(h, "t1")
    old = await _read(h, "t1")
    await _sched(h).agent_lost("y", "missed heartbeats")
    await _finish(h, "busy")
    new = await _read(h, "t1")
    assert (new.agent_id, new.state) == ("x", "RUNNING")
    # y comes back and reports its old attempt: nothing changes.
    await h.ack("y", old.message_id, AckStage.FULFILLED, note='"stale"')
    now = await _task(h, "t1")
    assert (now.state, now.agent_id, now.attempts, now.result) == ("RUNNING", "x", 2, "")
    (stale,) = await h.events("task.stale_ack")
    assert (stale.details["stage"], stale.details["message_id"]) == ("FULFILLED", old.message_id)
    # Nor may it complete the task through CompleteTask, or x an earlier attempt.
    with pytest.raises(PermissionDeniedError):
        await _sched(h).complete("t1", "y", result='"stale"')
    with pytest.raises(ValidationError) as caught:
        await _sched(h).complete("t1", "x", result='"late"', attempt=1)
    assert caught.value.details["field"] == "attempt"
    done = await _sched(h).complete("t1", "x", result='"fresh"', attempt=2)
    assert (done.state, done.result) == ("COMPLETED", '"fresh"')


async def test_a_lost_agent_reading_a_taken_back_dispatch_is_told_to_stop(
    h: EngineHarness,
) -> None:
    await _agent(h, "x", "review")
    await _shared(h, "t1")
    old = await _task(h, "t1")
    await _sched(h).agent_lost("x", "missed heartbeats")
    assert (await _task(h, "t1")).state == "QUEUED"

    async def revokes() -> list[tuple[str, str]]:
        controls = [p for p in await h.inbox_payloads("x") if p["type"] == "CONTROL"]
        return [(p["command"], p["task_id"]) for p in controls
                if p.get("message_id") == old.message_id]  # fmt: skip

    # Told at once, in case it is alive and runs it still.
    assert await revokes() == [("terminate", "t1")]
    # It was not gone after all: it reads the dispatch now, and is told again.
    await h.ack("x", old.message_id, AckStage.READ)
    assert (await _task(h, "t1")).state == "QUEUED"
    assert await revokes() == [("terminate", "t1")] * 2
    revoked = await h.events("task.revoked")
    assert [e.details["stale_message_id"] for e in revoked] == [old.message_id] * 2


async def test_after_max_attempts_lost_the_task_fails_with_the_reason(h: EngineHarness) -> None:
    for attempt, agent in enumerate(("x", "y"), start=1):
        await _agent(h, agent, "review")
        if attempt == 1:
            await _shared(h, "t1")
        assert (await _task(h, "t1")).agent_id == agent
        await h.engine.registry.deregister(agent, "gone")
        await _sched(h).agent_deregistered(agent)
    failed = await _task(h, "t1")
    assert (failed.state, failed.error_code, failed.lost_attempts) == (
        "FAILED", "agent_unavailable", 2,
    )  # fmt: skip
    assert "agent y was lost with it" in failed.note
    assert "2 of 2 attempts lost ([scheduler] max_attempts)" in failed.note
    kinds = [e.event_type for e in await h.events() if e.details.get("task_id") == "t1"]
    assert kinds == [
        "task.submitted", "task.dispatched", "task.requeued", "task.dispatched", "task.failed",
    ]  # fmt: skip


async def test_a_task_for_one_agent_still_fails_with_its_agent(h: EngineHarness) -> None:
    await _agent(h, "x", "review")
    await _sched(h).submit(Submission("x", "direct", params=b"{}", scope="repo:a"))
    await _sched(h).agent_lost("x", "missed heartbeats")
    task = await _task(h, "direct")
    assert (task.state, task.error_code, task.lost_attempts) == ("FAILED", "agent_unavailable", 0)


async def test_missed_heartbeats_fail_the_agent_and_requeue_its_tasks(h: EngineHarness) -> None:
    await _agent(h, "x", "review")
    await _agent(h, "y", "review")
    await _shared(h, "t1")
    assert (await _task(h, "t1")).agent_id == "x"
    presence = h.engine.presence
    for _ in range(presence.settings.debounce):
        h.clock.advance(presence.settings.heartbeat_timeout_s + 1)
        await h.engine.registry.heartbeat("y", "", {})
        await presence.tick()
    moved = await _task(h, "t1")
    assert (moved.agent_id, moved.lost_attempts, moved.attempts) == ("y", 1, 2)
    lifecycle = [e.details for e in await h.events("agent.lifecycle") if e.agent_id == "x"]
    assert any(d["input"] == "LOST" and d["error_code"] == "agent_unavailable" for d in lifecycle)
    assert h.engine.scheduler.lifecycles.state("y") is not None
    assert [e.agent_id for e in await h.events("agent.state")] == ["x"]


async def test_a_shared_job_is_unique_and_its_conflicts_serialize(h: EngineHarness) -> None:
    async with open_test_engine(
        scheduler=SchedulerSettings(
            duplicate_jobs="reject", conflicts=ConflictPolicy(overrides={"migrate": "serialize"})
        )
    ) as h2:
        await _agent(h2, "x", "db")
        await _agent(h2, "y", "db")
        await _shared(h2, "m1", "db", scope="repo:app op:migrate")
        same = await _sched(h2).submit(
            Submission("", "m1-again", params=json.dumps({"task": "m1"}).encode(),
                       capability="db", scope="repo:app op:migrate")
        )  # fmt: skip
        assert not same.accepted and same.error_code == DuplicateDetectedError.code
        result = await _shared(h2, "m2", "db", scope="repo:app op:migrate")
        assert result.accepted
        waiting = await _task(h2, "m2")
        assert waiting.state == "QUEUED" and waiting.note.startswith("SERIALIZE behind m1")
        assert _held(h2, "y") == {"y": []}  # y is idle, yet m2 waits for m1
        await _finish(h2, "m1")
        assert (await _task(h2, "m2")).state == "DISPATCHED"


async def test_max_parallel_instances_holds_for_shared_queues(h: EngineHarness) -> None:
    async with open_test_engine(
        scheduler=SchedulerSettings(max_parallel_instances={"coder": 1})
    ) as h2:
        await _agent(h2, "c-1", "code", name="coder")
        await _agent(h2, "c-2", "code", name="coder")
        await _shared(h2, "t1", "code")
        result = await _shared(h2, "t2", "code")
        assert (await _task(h2, "t2")).state == "QUEUED", result.reason
        assert _sched(h2).active() == {"coder": 1}
        await _finish(h2, "t1")
        assert (await _task(h2, "t2")).state == "DISPATCHED"


async def test_a_shutdown_takes_back_prefetched_shared_tasks(h: EngineHarness) -> None:
    async with open_test_engine(scheduler=SchedulerSettings(prefetch=1)) as h2:
        await _agent(h2, "x", "review", task_concurrency=1)
        await _shared(h2, "t1")
        await _read(h2, "t1")
        await _shared(h2, "t2")  # prefetched: waits at x, unread
        assert _held(h2, "x") == {"x": ["t1", "t2"]}
        await _sched(h2).shutdown_agent("x", 30.0)
        controls = [p for p in await h2.inbox_payloads("x") if p["type"] == "CONTROL"]
        assert [(p["command"], p.get("task_id")) for p in controls][-2:] == [
            ("preempt_request", "t2"), ("shutdown", None),
        ]  # fmt: skip
        t2 = await _task(h2, "t2")
        await h2.ack("x", t2.message_id, AckStage.FULFILLED, note="yielded")
        back = await _task(h2, "t2")
        assert (back.state, back.agent_id, back.lost_attempts) == ("QUEUED", "", 0)
        await _agent(h2, "y", "review")
        assert (await _task(h2, "t2")).agent_id == "y"
        assert (await _task(h2, "t1")).state == "RUNNING"  # x may finish it in its grace
