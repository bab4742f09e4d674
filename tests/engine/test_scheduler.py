"""The Scheduler engine on a fake clock: queues, dispatch, preemption, concurrency control."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.conflicts import ConflictPolicy, ParallelMode
from apiary.core.envelope import AckStage, MessageType
from apiary.core.preemption import PreemptionPolicy
from apiary.core.scope_overlap import ParallelismVerdict
from apiary.engine.hitl import HitlSettings
from apiary.engine.inference import RuleInference
from apiary.engine.notices import SCHEDULER
from apiary.engine.router.dedup_gate import cache_key
from apiary.engine.scheduler.scheduler import Submission
from apiary.engine.settings import SchedulerSettings
from apiary.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.server.metrics import Metrics
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.scheduler_harness import (
    ALICE,
    DOCS,
    SCOPE,
    _finish,
    _inbox,
    _ready,
    _sched,
    _state,
    _submit,
)


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        yield harness


# --- submission ---------------------------------------------------------------------------


@pytest.mark.conformance("scheduler.priority.range", "scheduler.priority.default-zero")
async def test_priorities_are_minus_19_to_20_and_default_to_zero(h: EngineHarness) -> None:
    await _ready(h, "worker")
    for bad in (-20, 21, "high", True):
        with pytest.raises(ValidationError) as caught:
            await _submit(h, f"bad-{bad}", priority=bad)
        assert caught.value.details["field"] == "priority"
    await _submit(h, "lo", priority=20)
    await _submit(h, "hi", priority=-19)
    await _submit(h, "default")
    assert (await _sched(h).find("default")).priority == 0


@pytest.mark.conformance("concurrency.scope.metadata-required")
async def test_a_task_needs_scope_a_known_agent_and_a_fresh_id(h: EngineHarness) -> None:
    await _ready(h, "worker")
    with pytest.raises(ValidationError) as caught:
        await _submit(h, "t1", scope="  ")
    assert caught.value.details["field"] == "scope"
    with pytest.raises(ValidationError):
        await _submit(h, "t1", scope="path:../etc")
    with pytest.raises(NotFoundError):
        await _submit(h, "t1", agent_id="nobody")
    with pytest.raises(UnsupportedMessageTypeError):  # not one of the agent's modalities
        await _submit(h, "t1", content_type="image/png")
    assert (await _submit(h, "t1")).accepted
    with pytest.raises(AlreadyExistsError):
        await _submit(h, "t1", scope="repo:other path:x")
    assert [t.task_id for t in await h.store.tasks.list()] == ["t1"]


async def test_the_task_arrives_as_a_data_envelope_from_the_scheduler(h: EngineHarness) -> None:
    await _ready(h, "worker")
    result = await _submit(h, "t1")
    assert result.accepted and "dispatched" in result.reason
    (handout,) = await h.take("worker")
    env = h.engine.router.codec.decode(handout.message.envelope)
    assert env.message_type is MessageType.DATA and env.producer_id == SCHEDULER
    assert env.correlation_id == "t1" and env.idempotency_token == "task:t1:1"
    assert json.loads(env.payload) == {"task": "t1"}
    await h.ack("worker", env.message_id, AckStage.READ)
    assert await _state(h, "t1") == "RUNNING"
    await h.ack("worker", env.message_id, AckStage.FULFILLED)
    assert await _state(h, "t1") == "COMPLETED"
    assert [e.details["state"] for e in await h.events() if e.event_type.startswith("task.")] == [
        "QUEUED", "DISPATCHED", "RUNNING", "COMPLETED"
    ]  # fmt: skip


async def test_a_dispatch_token_has_no_record_the_task_record_keeps_it_unique(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch token `task:<id>:<attempt>` is new by construction (the task record
    counts the attempt, committed with the envelope): the router neither reads the cache
    nor starts a record, and logs no decision of its own; task.dispatched names the token.
    The ACKs the Scheduler joins start none either: the task records the outcome."""
    await _ready(h, "worker")
    lookups: list[str] = []
    cache = h.store.idempotency
    looked_up = cache.get

    async def get(token: str) -> Any:
        lookups.append(token)
        return await looked_up(token)

    monkeypatch.setattr(cache, "get", get)
    assert (await _submit(h, "t1")).accepted
    held = await _sched(h).find("t1")
    key = cache_key(SCHEDULER, "task:t1:1")
    assert await looked_up(key) is None
    assert await h.events("idempotency.decision") == []
    (dispatched,) = await h.events("task.dispatched")
    assert (dispatched.details["token"], dispatched.details["message_id"]) == (
        "task:t1:1", held.message_id,
    )  # fmt: skip
    await h.ack("worker", held.message_id, AckStage.READ)
    await h.ack("worker", held.message_id, AckStage.FULFILLED, note='"done"')
    assert lookups == []
    assert await looked_up(key) is None
    assert await h.events("idempotency.cached") == []
    done = await _sched(h).find("t1")
    assert (done.state, done.result) == ("COMPLETED", '"done"')


async def _no_join(_acks: object) -> None:
    return None


async def test_an_end_ack_the_scheduler_did_not_join_starts_its_tokens_record(
    h: EngineHarness,
) -> None:
    """An end ACK that commits without the task's transition (not joined: the Scheduler
    hears it after the commit) leaves its outcome in a token record it starts, with its
    `idempotency.cached` event: what the Scheduler reads back if it never heard of it
    (`Router.stored_ack`, tests/server/test_stored_acks.py)."""
    await _ready(h, "worker")
    assert (await _submit(h, "t1")).accepted
    held = await _sched(h).find("t1")
    h.engine.router.join_acks(SCHEDULER, _no_join)
    await h.ack("worker", held.message_id, AckStage.READ)
    key = cache_key(SCHEDULER, "task:t1:1")
    assert await h.store.idempotency.get(key) is None  # (no record follows its progress)
    await h.ack("worker", held.message_id, AckStage.FULFILLED, note='"done"')
    record = await h.store.idempotency.get(key)
    assert record is not None
    assert (record.status, record.result, record.original_message_id) == (
        "FULFILLED", '"done"', held.message_id,
    )  # fmt: skip
    (cached,) = await h.events("idempotency.cached")
    assert cached.details["message_id"] == held.message_id
    moved = [e.details["to"] for e in await h.events("message.state")]
    assert moved == ["READ", "FULFILLED"]
    assert (await _sched(h).find("t1")).state == "COMPLETED"
    stored = await h.engine.router.stored_ack(held.message_id)
    assert stored is not None and stored.note == '"done"'


async def test_an_agent_failure_fails_the_task_with_its_code(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _submit(h, "t1")
    task = _sched(h).get("t1")
    assert task is not None
    await h.ack("worker", task.message_id, AckStage.FAILED, "tool_timeout", "lint hung")
    done = await _sched(h).find("t1")
    assert (done.state, done.error_code) == ("FAILED", "tool_timeout")


@pytest.mark.conformance("scheduler.priority.order-numeric", "scheduler.priority.order-fifo")
async def test_waiting_tasks_run_by_priority_then_submission_order(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _submit(h, "running", priority=-19)
    for task_id, priority in (("p5", 5), ("a0", 0), ("m3", -3), ("b0", 0), ("m19", -19)):
        h.clock.advance(1)
        await _submit(h, task_id, priority=priority)
    order = []
    current = "running"
    for _ in range(6):
        await _finish(h, current)
        nxt = _sched(h).running("worker")
        if nxt is None:
            break
        current = nxt.task_id
        order.append(current)
    assert order == ["m19", "m3", "a0", "b0", "p5"]


# --- preemption -----------------------------------------------------------------------------


def _controls(payloads: list[dict[str, Any]]) -> list[str]:
    return [p["command"] for p in payloads if p["type"] == "CONTROL"]


@pytest.mark.conformance(
    "preemption.trigger.higher-priority", "preemption.trigger.not-equal-or-lower",
    "preemption.cooperative.required",
)  # fmt: skip
async def test_only_a_strictly_higher_priority_preempts_and_the_yield_requeues(
    h: EngineHarness,
) -> None:
    await _ready(h, "worker")
    await _submit(h, "low", priority=5)
    assert (await _sched(h).find("low")).state == "DISPATCHED"
    await _submit(h, "same", priority=5)
    await _submit(h, "lower", priority=9)
    assert _controls(await _inbox(h, "worker")) == []
    result = await _submit(h, "high", priority=-2)
    assert "preempting task low" in result.reason
    assert _controls(await _inbox(h, "worker")) == ["preempt_request"]
    # C.4: the agent yields at its safe point; the preempted task keeps its place.
    await _finish(h, "low", note="yielded")
    assert await _state(h, "low") == "QUEUED"
    assert _sched(h).running("worker").task_id == "high"  # type: ignore[union-attr]
    await _finish(h, "high")
    assert _sched(h).running("worker").task_id == "low"  # type: ignore[union-attr]
    assert (await _sched(h).find("low")).attempts == 2


def _preempting(**policy: float) -> SchedulerSettings:
    return SchedulerSettings(preemption=PreemptionPolicy(**policy))


@pytest.mark.conformance(
    "preemption.deferral.defer", "preemption.deferral.enforce-max-duration",
    "preemption.cooperative.no-force-first", "preemption.forced.soft-signal-grace",
    "preemption.forced.hard-after-grace", "preemption.forced.mark-failed",
)  # fmt: skip
async def test_a_section_defers_preemption_until_its_maximum_then_it_is_forced() -> None:
    settings = _preempting(safe_point_timeout_s=30, grace_s=3)
    async with open_test_engine(scheduler=settings) as h:
        await _ready(h, "worker")
        await _submit(h, "low", priority=5)
        await _command(h, "worker", "enter_section", "low", max_duration_ms=10_000)
        await _submit(h, "high", priority=0)
        assert _controls(await _inbox(h, "worker")) == ["preempt_request"]
        h.clock.advance(9.9)
        await _sched(h).fire_due()
        assert _controls(await _inbox(h, "worker")) == ["preempt_request"]
        h.clock.advance(0.1)  # the declared maximum: soft termination with a grace period
        await _sched(h).fire_due()
        assert _controls(await _inbox(h, "worker")) == ["preempt_request", "terminate"]
        (terminate,) = [p for p in await _inbox(h, "worker") if p.get("command") == "terminate"]
        assert terminate["grace_ms"] == 3000
        h.clock.advance(3)
        await _sched(h).fire_due()
        assert _controls(await _inbox(h, "worker"))[-1] == "kill"
        low = await _sched(h).find("low")
        assert (low.state, low.error_code) == ("FAILED", "forced_preemption")


async def test_an_agent_that_stops_within_the_grace_is_terminated_not_killed() -> None:
    async with open_test_engine(scheduler=_preempting(safe_point_timeout_s=1, grace_s=3)) as h:
        await _ready(h, "worker")
        await _submit(h, "low", priority=5)
        await _submit(h, "high", priority=0)
        h.clock.advance(1)
        await _sched(h).fire_due()
        await _finish(h, "low", note="terminated")
        low = await _sched(h).find("low")
        assert (low.state, low.error_code) == ("FAILED", "forced_preemption")
        assert "kill" not in _controls(await _inbox(h, "worker"))
        assert _sched(h).running("worker").task_id == "high"  # type: ignore[union-attr]


@pytest.mark.conformance("preemption.nonpreemptible.max-duration")
async def test_a_section_without_a_maximum_duration_is_refused(h: EngineHarness) -> None:
    await _ready(h, "worker")
    await _submit(h, "t1")
    with pytest.raises(ValidationError) as caught:
        await _command(h, "worker", "enter_section", "t1")
    assert caught.value.details["field"] == "max_duration_ms"
    await _ready(h, "other")
    with pytest.raises(PermissionDeniedError):
        await _command(h, "other", "enter_section", "t1", max_duration_ms=100)


@pytest.mark.conformance("preemption.nonpreemptible.sparingly")
async def test_a_section_longer_than_the_policy_allows_is_refused_before_it_starts() -> None:
    # Sections are for short critical work: the policy caps how long one may be declared.
    policy = PreemptionPolicy(max_section_s=60.0)
    async with open_test_engine(scheduler=SchedulerSettings(preemption=policy)) as h:
        await _ready(h, "worker")
        await _submit(h, "t1")
        with pytest.raises(ValidationError) as caught:
            await _command(h, "worker", "enter_section", "t1", max_duration_ms=61_000)
        assert caught.value.details["field"] == "max_duration_ms"
        assert "longer than the 60 s" in caught.value.message
        await _command(h, "worker", "enter_section", "t1", max_duration_ms=60_000)
        assert _sched(h).preemption("t1") is not None
    with pytest.raises(ValidationError) as bad:
        PreemptionPolicy(max_section_s=0)
    assert bad.value.details["field"] == "preemption.max_section_s"


async def _command(h: EngineHarness, agent: str, command: str, task_id: str, **extra: Any) -> None:
    body = {"command": command, "task_id": task_id, **extra}
    await h.send(agent, SCHEDULER, body, message_type=MessageType.CONTROL)


async def test_request_preemption_preempts_the_running_task_on_demand(h: EngineHarness) -> None:
    await _ready(h, "worker")
    assert not await _sched(h).request_preemption("worker", "", "maintenance")
    await _submit(h, "t1")
    assert not await _sched(h).request_preemption("worker", "other-task", "maintenance")
    assert await _sched(h).request_preemption("worker", "t1", "maintenance")
    assert not await _sched(h).request_preemption("worker", "t1", "again")
    assert _controls(await _inbox(h, "worker")) == ["preempt_request"]


# --- concurrency ---------------------------------------------------------------------------


@pytest.mark.conformance(
    "concurrency.instances.configurable-limit", "concurrency.instances.enforce",
    "concurrency.instances.queue-at-limit", "concurrency.instances.track-active",
    "concurrency.instances.reject-exceeding", "concurrency.instances.queued-feedback",
)  # fmt: skip
async def test_max_parallel_instances_queues_with_feedback() -> None:
    settings = SchedulerSettings(max_parallel_instances={"coder": 1})
    async with open_test_engine(scheduler=settings) as h:
        await _ready(h, "c1", name="coder")
        await _ready(h, "c2", name="coder")
        await _submit(h, "t1", agent_id="c1", scope="repo:a path:x")
        result = await _submit(h, "t2", agent_id="c2", scope="repo:b path:y")
        assert result.accepted
        assert "max_parallel_instances 1" in result.reason
        assert await _state(h, "t2") == "QUEUED"
        assert _sched(h).active() == {"coder": 1}
        await _finish(h, "t1")
        assert await _state(h, "t2") == "DISPATCHED"
        assert _sched(h).active() == {"coder": 1}


@pytest.mark.conformance(
    "concurrency.jobs.no-identical-simultaneous", "concurrency.jobs.identity-criteria",
    "concurrency.jobs.reject-duplicates",
)  # fmt: skip
async def test_a_duplicate_job_is_refused_unless_hitl_authorizes_it() -> None:
    hitl = HitlSettings(operators=(ALICE,))
    async with open_test_engine(hitl=hitl) as h:
        await _ready(h, "worker")
        await _submit(h, "t1")
        dup = await _sched(h).submit(
            Submission("worker", "t2", None, json.dumps({"task": "t1"}).encode(), scope=SCOPE)
        )
        assert not dup.accepted and dup.reason.startswith("duplicate_detected")
        assert "t1" in dup.reason
        assert await _state(h, "t2") == "HELD"
        (invocation,) = await h.engine.hitl.list()
        assert invocation.subject["task_id"] == "t2"
        operator = h.engine.hitl.operators.authenticate("Bearer alice-token")
        await h.engine.hitl.decide(invocation.invocation_id, "approve", operator, "rerun wanted")
        await _until(
            lambda: _sched(h).get("t2") is not None and _sched(h).get("t2").state == "QUEUED"
        )  # type: ignore[union-attr]
    async with open_test_engine(scheduler=SchedulerSettings(duplicate_jobs="reject")) as h:
        await _ready(h, "worker")
        await _submit(h, "t1")
        dup = await _sched(h).submit(
            Submission("worker", "t2", None, json.dumps({"task": "t1"}).encode(), scope=SCOPE)
        )
        assert not dup.accepted and "duplicate_detected" in dup.reason
        assert await h.store.tasks.get("t2") is None


async def test_a_held_job_waits_for_its_decision_across_a_restart(tmp_path: Path) -> None:
    hitl = HitlSettings(operators=(ALICE,))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with open_test_engine(hitl=hitl, store_url=url, data_dir=tmp_path) as first:
        await _ready(first, "worker")
        await _submit(first, "t1")
        params = json.dumps({"task": "t1"}).encode()
        await _sched(first).submit(Submission("worker", "t2", None, params, scope=SCOPE))
        assert await _state(first, "t2") == "HELD"
        clock, ids = first.clock, first.ids
    async with open_test_engine(
        hitl=hitl, store_url=url, data_dir=tmp_path, clock=clock, ids=ids
    ) as again:
        assert await _state(again, "t2") == "HELD"  # not failed: its invocation still stands
        (invocation,) = await again.engine.hitl.list()
        assert invocation.subject["task_id"] == "t2"
        operator = again.engine.hitl.operators.authenticate("Bearer alice-token")
        await again.engine.hitl.decide(invocation.invocation_id, "approve", operator, "go")
        for _ in range(500):  # a background task applies it, through the SQLite writer thread
            if await _state(again, "t2") != "HELD":
                break
            await asyncio.sleep(0.01)
        assert await _state(again, "t2") == "QUEUED"


async def _until(predicate: Any) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


@pytest.mark.conformance(
    "concurrency.scope.overlap-analysis", "concurrency.inference.below-threshold-hitl",
    "concurrency.safety.serialize-when-uncertain", "concurrency.safety.prioritize",
    "concurrency.monitoring.patterns",
)  # fmt: skip
async def test_overlapping_scopes_escalate_conflict_and_a_denial_serializes() -> None:
    async with open_test_engine(hitl=HitlSettings(operators=(ALICE,))) as h:
        await _ready(h, "x")
        await _ready(h, "y")
        await _submit(h, "tx", agent_id="x", scope="repo:app path:src/**")
        await _submit(h, "ty", agent_id="y", scope="repo:app path:src/api/**")
        assert await _state(h, "ty") == "QUEUED"
        (invocation,) = await h.engine.hitl.list()
        assert invocation.reason_type == "CONFLICT"
        assert invocation.context["confidence_score"] < 0.7
        deferred = [m for m in await h.inbox_payloads("y") if m.get("event") == "task_deferred"]
        assert deferred and deferred[0]["blocked_by"] == ["tx"]
        operator = h.engine.hitl.operators.authenticate("Bearer alice-token")
        await h.engine.hitl.decide(invocation.invocation_id, "deny", operator, "serialize")
        await _until(lambda: not _sched(h).gate._waiters)
        await _sched(h).fire_due()
        assert await _state(h, "ty") == "QUEUED"
        await _finish(h, "tx")
        await _sched(h).fire_due()
        assert await _state(h, "ty") == "DISPATCHED"
        # RFC 9.3 monitoring at /metrics: decisions, confidence scores, escalation outcomes.
        scrape = Metrics(scheduler=_sched(h)).render().decode()
    assert 'apiary_scheduler_conflict_decisions_total{outcome="escalated"} 1.0' in scrape
    assert 'apiary_scheduler_conflict_hitl_decisions_total{outcome="serialize"} 1.0' in scrape
    assert "apiary_scheduler_inference_confidence_count 1.0" in scrape
    assert 'apiary_scheduler_tasks{state="DISPATCHED"} 1.0' in scrape


class _CountingRules(RuleInference):
    """The built-in engine, counting what it is asked (to see which pairs were assessed)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []

    async def check_parallelism(self, scope_a: str, scope_b: str) -> ParallelismVerdict:
        self.pairs.append((scope_a, scope_b))
        return await super().check_parallelism(scope_a, scope_b)


async def test_a_dispatch_assesses_only_the_running_tasks_its_scope_may_meet() -> None:
    # 30 agents busy in repositories of their own: a candidate in repo "app" is compared
    # with the running tasks in "app", those naming no repository and those sharing a
    # resource, not with the rest (the rule-based engine calls those safe for certain).
    policy = ConflictPolicy(threshold=0.4, serialize_below=0.2)
    async with open_test_engine(scheduler=SchedulerSettings(conflicts=policy)) as h:
        for n in range(30):
            await _ready(h, f"busy-{n}")
            await _submit(h, f"busy-{n}", agent_id=f"busy-{n}", scope=f"repo:r{n} path:src")
        for agent, scope in (
            ("same", "repo:app path:docs"), ("nowhere", "path:lib"),
            ("db", "repo:other resource:db.orders"),
        ):  # fmt: skip
            await _ready(h, agent)
            await _submit(h, f"t-{agent}", agent_id=agent, scope=scope)
        running = [f"busy-{n}" for n in range(30)] + ["t-same", "t-nowhere", "t-db"]
        assert {await _state(h, t) for t in running} == {"DISPATCHED"}
        gate = _sched(h).gate
        gate.inference = counting = _CountingRules()
        await _ready(h, "candidate")
        await _submit(h, "c", agent_id="candidate", scope="repo:app path:src resource:db")
        assert sorted(b for _, b in counting.pairs) == sorted(
            ["repo:app path:docs", "path:lib", "repo:other resource:db.orders"]
        )
        assert await _state(h, "c") == "QUEUED"
        task = _sched(h).get("c")
        assert task is not None
        assert task.note.startswith("SERIALIZE behind t-db") and "busy-" not in task.note
        # A candidate naming no repository may meet any running task: all are assessed.
        counting.pairs.clear()
        await _ready(h, "anywhere")
        await _submit(h, "a", agent_id="anywhere", scope="path:tests")
        assert len(counting.pairs) == len(running)
        # When its blocker ends, the candidate runs; the index forgets ended tasks.
        await _finish(h, "t-db")
        await _sched(h).fire_due()
        assert await _state(h, "c") == "DISPATCHED"
        assert "t-db" not in gate._scopes


async def test_disjoint_scopes_and_permitted_operations_run_in_parallel() -> None:
    policy = ConflictPolicy(overrides={"read": ParallelMode.PARALLEL})
    async with open_test_engine(scheduler=SchedulerSettings(conflicts=policy)) as h:
        for agent in ("x", "y", "z"):
            await _ready(h, agent)
        await _submit(h, "tx", agent_id="x", scope="repo:app path:src/**")
        await _submit(h, "ty", agent_id="y", scope="repo:app path:docs/**")
        await _submit(h, "tz", agent_id="z", scope="repo:app path:src/** op:read")
        assert await _state(h, "ty") == "DISPATCHED"
        assert await _state(h, "tz") == "QUEUED"  # tx's operation does not permit it
        (invocation,) = await h.engine.hitl.list(include_decided=True)
        assert invocation.subject == {
            "task_id": "tz", "running_task_id": "tx", "agent_id": "z", "running_agent_id": "x"
        }  # fmt: skip


@pytest.mark.conformance(
    "concurrency.policy.overrides-documented", "security.inference.bounded-by-policy"
)
async def test_an_override_decision_is_recorded_as_the_policys() -> None:
    policy = ConflictPolicy(overrides={"deploy": ParallelMode.SERIALIZE})
    async with open_test_engine(scheduler=SchedulerSettings(conflicts=policy)) as h:
        for agent in ("x", "y"):
            await _ready(h, agent)
        await _submit(h, "tx", agent_id="x", scope="repo:app path:docs/**")
        await _submit(h, "ty", agent_id="y", scope="repo:app path:src/** op:deploy")
        assert await _state(h, "ty") == "QUEUED"  # disjoint paths, yet the policy serializes
        (event,) = [e for e in await h.engine.events.read(limit=1000)
                    if e.event_type == "scheduler.conflict"]  # fmt: skip
        assert event.details["outcome"] == "SERIALIZE"
        assert event.details["reason"] == "policy: serialize for deploy / -"  # candidate first
        assert await h.engine.hitl.list(include_decided=True) == []
    assert "**Policy overrides** per operation type" in DOCS.read_text()
