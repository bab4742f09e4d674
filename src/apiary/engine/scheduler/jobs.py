"""What the Scheduler makes of a SubmitTask (RFC 7.1, 9.2): admission (validation, content
type, lane, the job identity) and the duplicate-job path: a second submission of a job still
open is refused (`duplicate_jobs = "reject"`) or HELD for a HITL authorization, and queued
once approved. HELD tasks wait again for their decision after a restart.

The Scheduler's lock is held by the caller except in `await_authorization`, which waits for
the decision outside it and then takes it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable
from dataclasses import replace
from typing import TYPE_CHECKING

from apiary.core.agent_lifecycle import AgentLifecycleState
from apiary.core.envelope import MessageType
from apiary.core.envelope_rules import check_modality
from apiary.core.lanes import LANES
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.task_queue import validate_priority
from apiary.engine.notices import SCHEDULER
from apiary.errors import AgentShutdownError, AlreadyExistsError, ValidationError
from apiary.store.errors import StoreError

if TYPE_CHECKING:
    from apiary.engine.scheduler.scheduler import Arrival, Scheduler, Submission, SubmitResult


def job_identity(agent_type: str, content_type: str, params: bytes, scope: str) -> str:
    """RFC 9.2 job identity: the same agent type asked to do the same thing (content type and
    params, byte for byte) over the same scope (canonical form) is the same job."""
    digest = hashlib.sha256()
    for part in (agent_type.encode(), content_type.encode(), parse_scope(scope).text().encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(params)
    return digest.hexdigest()


class SchedulerJobs:
    """Admission and duplicate jobs for the Scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def submit_together(self, arrivals: list[Arrival]) -> None:
        """Decide admitted submissions in arrival order (under the lock), each outcome set on
        its future, and then dispatch to the agents they woke.

        A run of plain ones (accepted; or refused without a write: buffer_full, a task id
        given twice) is decided without waiting, and its QUEUED records are written together,
        one group commit for the run instead of one each; then each is queued, may preempt
        and is dispatched, in order, as alone. A duplicate job (of an open task, or of one
        earlier in the run) ends the run: it is decided alone once the run is stored."""
        s = self._scheduler
        rest = arrivals
        try:
            while rest:
                run, rest = self._run_of(rest)
                await self._queue_run(run)
                if rest:
                    head, rest = rest[0], rest[1:]
                    await _settle(head, s._submit_one(head.record))
        finally:
            for arrival in rest:  # only when deciding failed midway (the store, say)
                if not arrival.outcome.done():
                    arrival.outcome.set_exception(
                        StoreError("the submission could not be decided; submit it again")
                    )
            await s._drain_wakeups()

    def _run_of(
        self, arrivals: list[Arrival]
    ) -> tuple[list[tuple[Arrival, TaskRecord]], list[Arrival]]:
        """The leading run of `arrivals` decided without a write (refusals set now), with
        their sequence numbers; and the rest, led by a duplicate job."""
        s = self._scheduler
        run: list[tuple[Arrival, TaskRecord]] = []
        task_ids: set[str] = set()
        job_keys: set[str] = set()
        for i, arrival in enumerate(arrivals):
            record = arrival.record
            if record.task_id in s._tasks or record.task_id in task_ids:
                arrival.outcome.set_exception(AlreadyExistsError(
                    f"task {record.task_id!r} was already submitted", {"task_id": record.task_id}
                ))  # fmt: skip
            elif record.job_key in s._jobs or record.job_key in job_keys:
                return run, arrivals[i:]
            elif (waiting := len(s._tasks) + len(run)) >= s.settings.max_queued:
                arrival.outcome.set_result(s._buffer_full(waiting))
            else:
                run.append((arrival, replace(record, seq=s._next_seq())))
                task_ids.add(record.task_id)
                job_keys.add(record.job_key)
        return run, []

    async def _queue_run(self, run: list[tuple[Arrival, TaskRecord]]) -> None:
        s = self._scheduler
        writes = await asyncio.gather(
            *(s._store.put(record) for _, record in run), return_exceptions=True
        )
        for (arrival, record), written in zip(run, writes, strict=True):
            if isinstance(written, BaseException):
                arrival.outcome.set_exception(written)
            else:
                await _settle(arrival, s._queued(record))

    async def admit(self, sub: Submission) -> TaskRecord:
        """The QUEUED record a well-formed submission makes (seq still 0); raises on a
        malformed one."""
        s = self._scheduler
        for name in ("agent_id", "task_id"):
            if not getattr(sub, name):
                raise ValidationError.for_field(name, "is required")
        if sub.correlation_id:
            s._router.check_flow_id("correlation_id", sub.correlation_id)
        else:
            s._router.check_flow_id("task_id", sub.task_id)
        priority = validate_priority(sub.priority)
        if not sub.scope.strip():
            raise ValidationError.for_field(
                "scope", "is required: name the repositories, paths or resources the task uses"
            )
        parse_scope(sub.scope)
        agent = await s._registry.get(sub.agent_id)
        if s.lifecycles.state(sub.agent_id) is AgentLifecycleState.SHUTTING_DOWN:
            raise AgentShutdownError(
                f"agent {sub.agent_id} is shutting down and takes no new tasks",
                {"agent_id": sub.agent_id},
            )
        content_type = sub.content_type or ("application/json" if sub.params else "")
        if not content_type:
            content_type = "application/octet-stream"
        check_modality(content_type, agent.descriptor.get("modalities_supported") or ())
        limit = s._router.settings.limits.limit_for(MessageType.DATA)
        if len(sub.params) > limit:
            raise ValidationError.for_field(
                "params", f"{len(sub.params)} bytes exceed the DATA limit of {limit}"
            )
        if sub.task_id in s._tasks or await s._store.get(sub.task_id) is not None:
            raise AlreadyExistsError(
                f"task {sub.task_id!r} was already submitted", {"task_id": sub.task_id}
            )
        lane = "STANDARD"
        if sub.submitter:
            submitter = await s._registry.find(sub.submitter)
            lane = str((submitter.descriptor if submitter else {}).get("communication_class"))
            lane = lane if lane in LANES else "STANDARD"
        now = s._clock.now()
        return TaskRecord(
            task_id=sub.task_id, agent_id=sub.agent_id, priority=priority, submitted_at=now,
            seq=0, state=TaskState.QUEUED.value, updated_at=now, scope=sub.scope,
            job_key=sub.job_key or job_identity(agent.name, content_type, sub.params, sub.scope),
            params=sub.params, content_type=content_type, agent_type=agent.name, lane=lane,
            correlation_id=sub.correlation_id,
        )  # fmt: skip

    async def duplicate(
        self, record: TaskRecord, original_id: str
    ) -> tuple[str, TaskRecord | None]:
        """The same job as the open task `original_id`: rejected, or HELD for a HITL
        authorization. Returns the refusal's reason and the HELD record (None if rejected)."""
        s = self._scheduler
        original = s._tasks[original_id]
        why = f"same job as task {original_id} ({original.state})"
        if s.settings.duplicate_jobs == "reject":
            await s._events.record(
                "task.duplicate_rejected", SCHEDULER, correlation_id=record.task_id,
                task_id=record.task_id, original_task_id=original_id, job_key=record.job_key,
            )  # fmt: skip
            return f"duplicate_detected: {why}", None
        held = replace(record, seq=s._next_seq(), state=TaskState.HELD.value)
        invocation = await s._hitl.open(
            "TASK_ESCALATION",
            {"reason": f"duplicate job: {why}", "job_key": record.job_key,
             "scope": record.scope, "original_task_id": original_id},
            requested_by=SCHEDULER,
            subject={"task_id": record.task_id, "agent_id": record.agent_id},
            suggested_action="deny", proposed_actions=("approve", "deny"),
            timeout_s=s.settings.hitl_timeout_s, correlation_id=record.task_id,
            priority=record.priority,
        )  # fmt: skip
        held = replace(held, note=f"held for HITL invocation {invocation.invocation_id}")
        await s._save(held, "task.held", original_task_id=original_id,
                      invocation_id=invocation.invocation_id)  # fmt: skip
        s._spawn(self.await_authorization(held.task_id, invocation.invocation_id))
        return (
            f"duplicate_detected: {why}; held for HITL authorization "
            f"(invocation {invocation.invocation_id})",
            held,
        )

    async def await_authorization(self, task_id: str, invocation_id: str) -> None:
        s = self._scheduler
        decided = await s._hitl.wait(invocation_id)
        action = str(decided.decision.get("action", "deny")).lower()
        async with s._lock:
            task = s._tasks.get(task_id)
            if task is None or task.state != TaskState.HELD:
                return
            if action not in ("approve", "modify"):
                await s._fail(task, "duplicate_detected", f"HITL {invocation_id}: {action}")
                return
            task = replace(task, state=TaskState.QUEUED.value, note="authorized")
            await s._save(task, "task.authorized", invocation_id=invocation_id)
            s._push(task)
            await s._preemptor.maybe_preempt(task)
            await s._try_dispatch(task.agent_id)
            await s._drain_wakeups()

    # ------------------------------------------------------------------ start-up

    async def held_invocations(self, records: list[TaskRecord]) -> dict[str, str]:
        """Task id -> its HITL invocation, for the HELD ones among `records`."""
        if not any(r.state == TaskState.HELD for r in records):
            return {}
        return {
            str(r.subject.get("task_id")): r.invocation_id
            for r in await self._scheduler._hitl.list(include_decided=True, limit=1 << 30)
            if r.reason_type == "TASK_ESCALATION" and r.requested_by == SCHEDULER
        }

    async def reload_held(self, record: TaskRecord, held_for: dict[str, str]) -> None:
        """A HELD task found at start-up waits for its decision again, or fails without one."""
        s = self._scheduler
        invocation = held_for.get(record.task_id)
        if invocation is None:
            await s._fail(record, "duplicate_detected", "held job lost its decision")
        else:  # the decision may come (or have come) while the coordinator was down
            s._spawn(self.await_authorization(record.task_id, invocation))


async def _settle(arrival: Arrival, deciding: Awaitable[SubmitResult]) -> None:
    """Set the arrival's outcome to what `deciding` returns or raises (an Exception: a
    BaseException, cancellation included, propagates and ends the whole decision)."""
    try:
        arrival.outcome.set_result(await deciding)
    except Exception as exc:
        arrival.outcome.set_exception(exc)
