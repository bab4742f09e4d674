"""What the Scheduler makes of a SubmitTask (RFC 7.1, 9.2): admission (validation, content
type, lane, the job identity, a task_id when none was given, the shared queue of a task that
names a capability or agent type: core/tasks/shared.py), task ids given again and the
duplicate-job path. A task_id is an idempotency key: the same submission again is the task
submitted first (`created` false), another one under its id is task_id_conflict
(core/tasks/result.py); when the first one's write failed but committed after all (its
outcome unknown: a cut connection), the task stored QUEUED is taken in then, as loading from
the store does. A second submission of a job still open is refused
(`duplicate_jobs = "reject"`) or HELD for a HITL authorization, and queued once approved;
the HELD task's note says why it waits. HELD tasks wait again for their decision after a
restart.

The Scheduler's lock is held by the caller except in `await_authorization`, which waits for
the decision outside it and then takes it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from apiary.core.agent_lifecycle import AgentLifecycleState
from apiary.core.clock import Clock
from apiary.core.envelope import MessageType
from apiary.core.envelope_rules import check_content, check_modality
from apiary.core.ids import IdGenerator
from apiary.core.lanes import LANES
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.tasks.machine import TaskInput, TaskMachine
from apiary.core.tasks.queue import validate_priority
from apiary.core.tasks.result import same_submission
from apiary.core.tasks.shared import describe, queue_name
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.scheduler.dispatch import SchedulerDispatch
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.preemption import SchedulerPreemption
from apiary.engine.scheduler.transitions import TaskTransitions
from apiary.engine.settings import SchedulerSettings
from apiary.errors import (
    AgentShutdownError,
    TaskIdConflictError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.store.errors import StoreError, TaskExistsError
from apiary.store.protocols import TaskStore


@dataclass(frozen=True, slots=True)
class Submission:
    """What SubmitTask asks for (RFC 7.1, 9.2)."""

    agent_id: str
    """The agent to run it; empty when it names a `capability` or an `agent_type`."""
    task_id: str
    """Empty: the Scheduler assigns one (a UUIDv4)."""
    priority: object = None
    params: bytes = b""
    content_type: str = ""
    scope: str = ""
    submitter: str = ""
    """Who submits (the principal's name), when known: a registered agent's communication
    class is the task's lane; WaitTask and WatchTasks are the submitter's."""
    job_key: str = ""
    """Explicit job identity; empty: derived (see `job_identity`)."""
    correlation_id: str = ""
    """The flow the task belongs to (its envelopes' correlation_id); empty: the task_id."""
    capability: str = ""
    """Any RUNNABLE agent offering this capability takes it (a shared queue)."""
    agent_type: str = ""
    """Any RUNNABLE agent of this type (descriptor name) takes it (a shared queue)."""

    @property
    def queue(self) -> str:
        """The shared queue it names ('' for an agent); ValidationError naming the field
        when it names none or several, or a malformed one."""
        return queue_name(
            agent_id=self.agent_id, capability=self.capability, agent_type=self.agent_type
        )


@dataclass(frozen=True, slots=True)
class SubmitResult:
    accepted: bool
    reason: str
    task: TaskRecord | None = None
    created: bool = True
    """False: the task_id named a task submitted before, which `task` is."""
    error_code: str = ""
    """A refusal's protocol error code (buffer_full, duplicate_detected)."""


@dataclass(eq=False, slots=True)
class Arrival:
    """An admitted submission waiting to be decided, and its outcome."""

    record: TaskRecord
    outcome: asyncio.Future[SubmitResult]


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

    def __init__(
        self,
        live: LiveTasks,
        pools: AgentPools,
        transitions: TaskTransitions,
        dispatcher: SchedulerDispatch,
        preemptor: SchedulerPreemption,
        lifecycles: Lifecycles,
        store: TaskStore,
        router: Router,
        registry: Registry,
        events: EventRecorder,
        hitl: Hitl,
        settings: SchedulerSettings,
        clock: Clock,
        ids: IdGenerator,
        lock: asyncio.Lock,
    ) -> None:
        self._live = live
        self._pools = pools
        self._transitions = transitions
        self._dispatcher = dispatcher
        self._preemptor = preemptor
        self._lifecycles = lifecycles
        self._store = store
        self._router = router
        self._registry = registry
        self._events = events
        self._hitl = hitl
        self._settings = settings
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._background: set[asyncio.Future[None]] = set()
        """The HELD tasks' waits for their HITL decision."""

    async def submit_together(self, arrivals: list[Arrival]) -> None:
        """Decide admitted submissions in arrival order (under the lock), each outcome set on
        its future, and then dispatch to the agents they woke.

        A run of plain ones (accepted; or refused without a write: buffer_full) is decided
        without waiting, and its QUEUED records are written together, one group commit for
        the run instead of one each; then each is queued, may preempt and is dispatched, in
        order, as alone. A task_id taken (by an open task, or earlier in the run) or a
        duplicate job (of an open task, or of one earlier in the run) ends the run: it is
        decided alone once the run is stored."""
        rest = arrivals
        taken: set[str] = set()
        """The task ids this decision stored (a task may end before the next run)."""
        try:
            while rest:
                run, rest = self._run_of(rest, taken)
                await self._queue_run(run)
                taken.update(record.task_id for _, record in run)
                if rest:
                    head, rest = rest[0], rest[1:]
                    await _settle(head, self._decide_alone(head.record))
        finally:
            for arrival in rest:  # only when deciding failed midway (the store, say)
                if not arrival.outcome.done():
                    arrival.outcome.set_exception(
                        StoreError("the submission could not be decided; submit it again")
                    )
            await self._dispatcher.drain()

    def _run_of(
        self, arrivals: list[Arrival], taken: set[str]
    ) -> tuple[list[tuple[Arrival, TaskRecord]], list[Arrival]]:
        """The leading run of `arrivals` decided without a write (refusals set now), with
        their sequence numbers; and the rest, led by a task_id given again or a duplicate
        job."""
        live = self._live
        run: list[tuple[Arrival, TaskRecord]] = []
        task_ids: set[str] = set()
        job_keys: set[str] = set()
        for i, arrival in enumerate(arrivals):
            record = arrival.record
            task_id = record.task_id
            given_again = task_id in live.tasks or task_id in task_ids or task_id in taken
            if given_again or record.job_key in live.jobs or record.job_key in job_keys:
                return run, arrivals[i:]
            if refusal := self._full(len(run)):
                arrival.outcome.set_result(refusal)
            else:
                run.append((arrival, replace(record, seq=live.next_seq())))
                task_ids.add(record.task_id)
                job_keys.add(record.job_key)
        return run, []

    def _full(self, also: int = 0) -> SubmitResult | None:
        """The buffer_full refusal when `also` more tasks would exceed max_queued."""
        waiting = len(self._live.tasks) + also
        if waiting < self._settings.max_queued:
            return None
        return SubmitResult(
            False, f"buffer_full: {waiting} tasks waiting (max_queued {self._settings.max_queued})",
            error_code="buffer_full",
        )  # fmt: skip

    async def _decide_alone(self, record: TaskRecord) -> SubmitResult:
        """A submission that waited for the run before it: its task_id given again, a
        duplicate job, or (what it waited behind ended meanwhile) a plain one."""
        existing = self._live.tasks.get(record.task_id) or await self._store.get(record.task_id)
        if existing is not None:
            answer = resubmission(existing, record)
            return await self._take_in(record.task_id) or answer
        if record.job_key in self._live.jobs:
            return await self._duplicate_of_open(record)
        refusal = self._full()
        if refusal is not None:
            return refusal
        record = replace(record, seq=self._live.next_seq())
        event = self._transitions.submission_event(record)
        await self._events.commit([event], partial(self._store.put, record))
        return await self._queued(record)

    def resubmitted_live(self, sub: Submission) -> SubmitResult | None:
        """What a submission whose task_id names a live task is (`resubmission`); None when
        no live task has it. A task that ended is found by the write of the submission's
        record instead (`TaskStore.create`, `_stored_before`): a new id costs no read."""
        existing = self._live.tasks.get(sub.task_id)
        return None if existing is None else resubmission(existing, _again(existing, sub))

    async def resubmitted(self, sub: Submission) -> SubmitResult | None:
        """What a submission whose task_id names a task already stored is (`resubmission`);
        None when the id is new. Asked when a submission with a task_id of its caller's is
        refused (its agent gone, the queue full): a retry of a task stored earlier needs
        neither."""
        existing = self._live.tasks.get(sub.task_id) or await self._store.get(sub.task_id)
        if existing is None:
            return None
        answer = resubmission(existing, _again(existing, sub))
        if not _unqueued(existing, self._live):
            return answer
        async with self._lock:
            return await self._take_in(sub.task_id) or answer

    async def _stored_before(self, record: TaskRecord) -> SubmitResult:
        """A submission whose record's write found its task_id stored (TaskExistsError):
        the task stored under it, again (lock held)."""
        existing = await self._store.get(record.task_id)
        if existing is None:  # (the write found it: tasks are never deleted)
            raise StoreError(f"task {record.task_id!r} was stored and is not found")
        answer = resubmission(existing, _again(existing, record))
        return await self._take_in(record.task_id) or answer

    async def _take_in(self, task_id: str) -> SubmitResult | None:
        """A task stored QUEUED that the live Scheduler does not have (lock held): its
        submission's write failed with its outcome unknown, and committed. It is taken in as
        loading from the store does, and answers its submission given again; None when it
        is not (or no longer) such a task."""
        stored = None if task_id in self._live.tasks else await self._store.get(task_id)
        if stored is None or not _unqueued(stored, self._live):
            return None
        return replace(await self._queued(stored), created=False)

    async def _queue_run(self, run: list[tuple[Arrival, TaskRecord]]) -> None:
        """Store a run's QUEUED records in one write (`TaskStore.create_many`), then queue
        each. When the store finds a task_id of the run taken (by a task that ended) or a
        record it cannot store (ValueError), each is written alone: that one is answered as
        the task stored under its id, or with its error, and the others are stored."""
        if len(run) == 1 and await self._sent_at_once(*run[0]):
            return
        create, event = self._store.create, self._transitions.submission_event
        records = [record for _, record in run]
        writes: list[BaseException | None]
        try:
            drafts = [event(record) for record in records]
            if len(run) == 1:
                await self._events.commit(drafts, partial(create, records[0]))
            else:
                await self._events.commit(drafts, partial(self._store.create_many, records))
            writes = [None] * len(run)
        except (TaskExistsError, ValueError) as exc:
            if len(run) == 1:
                writes = [exc]
            else:
                alone = (self._events.commit([event(r)], partial(create, r)) for r in records)
                writes = await asyncio.gather(*alone, return_exceptions=True)
        except Exception as exc:  # the store failed: each outcome is not known
            writes = [exc] * len(run)
        for (arrival, record), written in zip(run, writes, strict=True):
            if isinstance(written, TaskExistsError):  # (its id names a task that ended)
                await _settle(arrival, self._stored_before(record))
            elif isinstance(written, BaseException):
                arrival.outcome.set_exception(written)
            else:
                await _settle(arrival, self._queued(record))

    async def _sent_at_once(self, arrival: Arrival, record: TaskRecord) -> bool:
        """A submission decided alone (tasks come one at a time): dispatched in the commit
        that stores it when its agent takes it at once (`SchedulerDispatch.first`), its
        outcome set; False when it does not go out at once (nothing of it was stored)."""
        event = self._transitions.submission_event(record)
        try:
            task = await self._dispatcher.first(record, event)
        except Exception as exc:  # the store failed: the outcome is not known
            arrival.outcome.set_exception(exc)
            return True
        if task is None:
            return False
        # A retry of a submission whose first dispatch committed unheard is that task, as
        # stored then (under the seq it got then).
        created = task.seq == record.seq
        arrival.outcome.set_result(SubmitResult(True, self._explain(task), task, created))
        return True

    async def _queued(self, record: TaskRecord) -> SubmitResult:
        """What follows a QUEUED task's write: the rest of its SUBMITTED step, then
        preemption and dispatch."""
        await self._transitions.submitted(record)
        note = await self._preemptor.maybe_preempt(record)
        await self._dispatcher.place(record)
        task = self._live.tasks.get(record.task_id)
        return SubmitResult(True, note or self._explain(task), task)

    def _explain(self, task: TaskRecord | None) -> str:
        if task is None:
            return "ended"
        if task.state in (TaskState.DISPATCHED, TaskState.RUNNING):
            return f"dispatched as message {task.message_id} to {task.agent_id}"
        if task.queue:
            return f"queued: {task.note or self.waiting_note(task)}"
        active = self._live.active[task.agent_type]
        limit = self._settings.instance_limit(task.agent_type)
        if active >= limit:
            return (
                f"queued: agent type {task.agent_type!r} is at max_parallel_instances {limit} "
                f"({active} running)"
            )
        running = self._live.held_by(task.agent_id)
        if running is not None:
            return f"queued behind running task {running.task_id}"
        return f"queued: {task.note}" if task.note else "queued"

    def waiting_note(self, task: TaskRecord) -> str:
        """Why a shared task waits in its queue, as things stand (its note says more when it
        waits for a worktree or behind a conflict)."""
        agents = self._pools.agents_for(task.queue)
        if not agents:
            return f"waiting: no registered agent offers {describe(task.queue)}"
        takers = [a for a in agents if self._pools.takes(a, task.content_type)]
        if not takers:
            return f"waiting: no agent of {describe(task.queue)} takes {task.content_type}"
        return (
            f"waiting for one of the {len(takers)} agent(s) of {describe(task.queue)} to have room"
        )

    async def admit(self, sub: Submission) -> TaskRecord:
        """The QUEUED record a well-formed submission makes (seq still 0; a task_id assigned
        when it has none); raises on a malformed one."""
        queue = sub.queue
        task_id = sub.task_id or self._ids.new_id()
        if sub.correlation_id:
            self._router.check_flow_id("correlation_id", sub.correlation_id)
        elif sub.task_id:  # the task's flow id (an assigned one is a UUIDv4)
            self._router.check_flow_id("task_id", sub.task_id)
        priority = validate_priority(sub.priority)
        if not sub.scope.strip():
            raise ValidationError.for_field(
                "scope", "is required: name the repositories, paths or resources the task uses"
            )
        parse_scope(sub.scope)
        content_type = content_type_of(sub)
        if queue:
            agent_type = sub.agent_type
            job_of = queue
            self._check_takers(queue, content_type)
        else:
            agent = await self._registry.get(sub.agent_id)
            check_modality(content_type, agent.descriptor.get("modalities_supported") or ())
            agent_type = job_of = agent.name
        settings = self._router.settings
        limit = settings.limits.limit_for(MessageType.DATA)
        if len(sub.params) > limit:
            raise ValidationError.for_field(
                "params", f"{len(sub.params)} bytes exceed the DATA limit of {limit}"
            )
        # The rules its dispatch's envelope would be validated by, checked once here: the
        # router admits the Scheduler's dispatches without validating them again.
        check_content(content_type, sub.params, settings.fields, name="params")
        lane = "STANDARD"
        if sub.submitter:
            submitter = await self._registry.find(sub.submitter)
            lane = str((submitter.descriptor if submitter else {}).get("communication_class"))
            lane = lane if lane in LANES else "STANDARD"
        now = self._clock.now()
        return TaskRecord(
            task_id=task_id, agent_id=sub.agent_id, priority=priority, submitted_at=now,
            seq=0, state=TaskMachine.INITIAL, updated_at=now, scope=sub.scope,
            job_key=sub.job_key or job_identity(job_of, content_type, sub.params, sub.scope),
            params=sub.params, content_type=content_type, agent_type=agent_type, lane=lane,
            correlation_id=sub.correlation_id, submitter=sub.submitter, queue=queue,
        )  # fmt: skip

    def _check_takers(self, queue: str, content_type: str) -> None:
        """A shared task's content type must suit one of its queue's agents, when it has
        any (an agent that registers later may take what none takes now)."""
        agents = self._pools.agents_for(queue)
        if agents and not any(self._pools.takes(a, content_type) for a in agents):
            raise UnsupportedMessageTypeError(
                f"content_type: no agent of {describe(queue)} takes {content_type}",
                {"field": "content_type", "content_type": content_type},
            )

    def check_accepting(self, agent_id: str) -> None:
        """AgentShutdownError when the agent takes no new tasks (RFC 8.4); a shared task
        (no agent) always queues."""
        if agent_id and self._lifecycles.state(agent_id) is AgentLifecycleState.SHUTTING_DOWN:
            raise AgentShutdownError(
                f"agent {agent_id} is shutting down and takes no new tasks", {"agent_id": agent_id}
            )

    async def _duplicate_of_open(self, record: TaskRecord) -> SubmitResult:
        """The same job as an open task: rejected, or HELD for a HITL authorization (the
        refusal carries the HELD record)."""
        original_id = self._live.jobs[record.job_key]
        original = self._live.tasks[original_id]
        why = f"same job as task {original_id} ({original.state})"
        if self._settings.duplicate_jobs == "reject":
            await self._events.record(
                "task.duplicate_rejected", SCHEDULER, correlation_id=record.task_id,
                task_id=record.task_id, original_task_id=original_id, job_key=record.job_key,
            )  # fmt: skip
            return SubmitResult(
                False, f"duplicate_detected: {why}", error_code="duplicate_detected"
            )
        seq = self._live.next_seq()
        invocation = await self._hitl.open(
            "TASK_ESCALATION",
            {"reason": f"duplicate job: {why}", "job_key": record.job_key,
             "scope": record.scope, "original_task_id": original_id},
            requested_by=SCHEDULER,
            subject={"task_id": record.task_id, "agent_id": record.agent_id},
            suggested_action="deny", proposed_actions=("approve", "deny"),
            timeout_s=self._settings.hitl_timeout_s, correlation_id=record.task_id,
            priority=record.priority,
        )  # fmt: skip
        invocation_id = invocation.invocation_id
        note = f"held for HITL authorization (invocation {invocation_id}): duplicate job, {why}"
        held = await self._transitions.apply(
            record, TaskInput.HOLD, {"seq": seq, "note": note},
            original_task_id=original_id, invocation_id=invocation_id,
        )  # fmt: skip
        self._spawn(self.await_authorization(held.task_id, invocation_id))
        return SubmitResult(
            False,
            f"duplicate_detected: {why}; held for HITL authorization (invocation {invocation_id})",
            held, error_code="duplicate_detected",
        )  # fmt: skip

    async def await_authorization(self, task_id: str, invocation_id: str) -> None:
        decided = await self._hitl.wait(invocation_id)
        action = str(decided.decision.get("action", "deny")).lower()
        async with self._lock:
            task = self._live.tasks.get(task_id)
            if task is None or task.state != TaskState.HELD:
                return
            if action not in ("approve", "modify"):
                await self._transitions.end(
                    task, TaskInput.DENY, "duplicate_detected", f"HITL {invocation_id}: {action}"
                )
                return
            task = await self._transitions.apply(
                task, TaskInput.AUTHORIZE, {"note": "authorized"}, invocation_id=invocation_id
            )
            await self._preemptor.maybe_preempt(task)
            await self._dispatcher.place(task)
            await self._dispatcher.drain()

    # ------------------------------------------------------------------ start-up

    async def held_invocations(self, records: list[TaskRecord]) -> dict[str, str]:
        """Task id -> its HITL invocation, for the HELD ones among `records`."""
        if not any(r.state == TaskState.HELD for r in records):
            return {}
        return {
            str(r.subject.get("task_id")): r.invocation_id
            for r in await self._hitl.list(include_decided=True, limit=1 << 30)
            if r.reason_type == "TASK_ESCALATION" and r.requested_by == SCHEDULER
        }

    async def reload_held(self, record: TaskRecord, held_for: dict[str, str]) -> None:
        """A HELD task found at start-up waits for its decision again, or fails without one."""
        invocation = held_for.get(record.task_id)
        if invocation is None:
            await self._transitions.end(
                record, TaskInput.DENY, "duplicate_detected", "held job lost its decision"
            )
        else:  # the decision may come (or have come) while the coordinator was down
            self._spawn(self.await_authorization(record.task_id, invocation))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        job = asyncio.ensure_future(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Stop waiting for the HELD tasks' decisions."""
        for job in list(self._background):
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


def content_type_of(sub: Submission) -> str:
    """The submission's content type: as given, else JSON for params, octet-stream for none."""
    return sub.content_type or ("application/json" if sub.params else "application/octet-stream")


def resubmission(existing: TaskRecord, again: TaskRecord) -> SubmitResult:
    """A submission under the task_id of `existing`: the same submission is that task (an
    idempotent retry: accepted unless it is HELD); any other is task_id_conflict."""
    differ = same_submission(existing, again)
    task_id = existing.task_id
    if differ:
        raise TaskIdConflictError(
            f"task_id {task_id!r} names a task submitted with other content ("
            f"{', '.join(differ)} differ): submit under a new task_id, or none",
            {"field": "task_id", "task_id": task_id, "differs": ",".join(differ)},
        )
    note = f": {existing.note}" if existing.note else ""
    return SubmitResult(
        existing.state != TaskState.HELD, f"already submitted, {existing.state}{note}", existing,
        created=False,
    )  # fmt: skip


def _again(existing: TaskRecord, sub: Submission | TaskRecord) -> TaskRecord:
    """`existing` with the content a submission under its task_id gives (a Submission, or
    the record admitted from one), for `resubmission` to compare: a shared task keeps the
    agent that took it."""
    queue = sub.queue
    priority = validate_priority(sub.priority)
    content_type = content_type_of(sub) if isinstance(sub, Submission) else sub.content_type
    return replace(
        existing, agent_id=existing.agent_id if queue else sub.agent_id, queue=queue,
        priority=priority, params=sub.params, content_type=content_type, scope=sub.scope,
        correlation_id=sub.correlation_id, submitter=sub.submitter,
    )  # fmt: skip


def _unqueued(task: TaskRecord, live: LiveTasks) -> bool:
    """Whether `task`, as stored, waits QUEUED but is not among the live tasks."""
    return task.state == TaskState.QUEUED and task.task_id not in live.tasks


async def _settle(arrival: Arrival, deciding: Awaitable[SubmitResult]) -> None:
    """Set the arrival's outcome to what `deciding` returns or raises (an Exception: a
    BaseException, cancellation included, propagates and ends the whole decision)."""
    try:
        arrival.outcome.set_result(await deciding)
    except Exception as exc:
        arrival.outcome.set_exception(exc)
