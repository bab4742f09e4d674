"""The Scheduler (RFC 7, 8, 9): task queues, dispatch, cooperative preemption, concurrency.

A task (SubmitTask) is validated, stored QUEUED and put in its agent's queue: one queue per
(agent, lane), priority -19 first and FIFO within a priority (core/task_queue.py). An agent
runs one task at a time. When it is free (lifecycle RUNNABLE, no task), its type is below
max_parallel_instances and the head task has no unresolved scope conflict with a task
running elsewhere (engine/conflict_gate.py), the head is dispatched: a DATA envelope from
`scheduler` to the agent with the task's params as payload, its content type, the task id
as correlation id and `task:<id>:<attempt>` as idempotency token. The agent's ACKs drive
the task: READ -> RUNNING, FULFILLED -> COMPLETED (note "yielded": back to the queue, note
"terminated": FAILED forced_preemption), REJECTED/FAILED -> FAILED with the agent's code.

Lanes (RFC 7.3): a task's lane is its submitter's communication class (STANDARD when the
submitter is not a registered agent). When an agent frees, its LaneScheduler (the router's
implementation, core/lanes.py) picks the lane: PRIVILEGED next (rate-limited, overflow to
STANDARD, weighted sharing), then the best task of that lane. A PRIVILEGED task never
preempts by its lane; only a strictly higher priority starts (cooperative) preemption.

Preemption (RFC 7.1, 7.2; C.4, C.5) follows core/preemption.py; the wire protocol is in
docs/scheduler.md. Agent lifecycle (RFC 8) is engine/lifecycle.py, driven from here.
Every task transition is a `task.*` event and stored before it is acted on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleState
from apiary.core.agent_lifecycle import IllegalTransitionError as LifecycleIllegal
from apiary.core.clock import Clock
from apiary.core.envelope import Envelope, MessageType
from apiary.core.envelope_rules import check_modality
from apiary.core.ids import IdGenerator
from apiary.core.lanes import LANES, LaneChoice, LaneScheduler
from apiary.core.preemption import IllegalTransitionError as PreemptionIllegal
from apiary.core.preemption import (
    PreemptionEffect,
    PreemptionInput,
    PreemptionMachine,
    PreemptionRecord,
    PreemptionStep,
    should_preempt,
)
from apiary.core.records import TaskRecord, TaskState
from apiary.core.scope_overlap import parse_scope
from apiary.core.task_queue import QueuedTask, TaskQueue, validate_priority
from apiary.engine.activity import Activity
from apiary.engine.admission import Outbound
from apiary.engine.conflict_gate import Blocker, ConflictGate
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.inference import InferenceEngine, RuleInference
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.router import Router
from apiary.engine.scheduler_agents import SchedulerAgents, drive, finished
from apiary.engine.settings import SchedulerSettings
from apiary.engine.timers import Timers
from apiary.errors import (
    AgentShutdownError,
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.store.protocols import TaskStore

OPEN_STATES = frozenset(s.value for s in TaskState if not s.terminal)
RECONCILE_EVERY_S = 60.0
"""How often the activity buffer is reconciled with task states (RFC 10)."""
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class Submission:
    """What SubmitTask asks for (RFC 7.1, 9.2)."""

    agent_id: str
    task_id: str
    priority: object = None
    params: bytes = b""
    content_type: str = ""
    scope: str = ""
    submitter: str = ""
    """The submitting agent, when known: its communication class is the task's lane."""
    job_key: str = ""
    """Explicit job identity; empty: derived (see `job_identity`)."""


@dataclass(frozen=True, slots=True)
class SubmitResult:
    accepted: bool
    reason: str
    task: TaskRecord | None = None


def job_identity(agent_type: str, content_type: str, params: bytes, scope: str) -> str:
    """RFC 9.2 job identity: the same agent type asked to do the same thing (content type and
    params, byte for byte) over the same scope (canonical form) is the same job."""
    digest = hashlib.sha256()
    for part in (agent_type.encode(), content_type.encode(), parse_scope(scope).text().encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(params)
    return digest.hexdigest()


class Scheduler:
    def __init__(
        self,
        tasks: TaskStore,
        router: Router,
        registry: Registry,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        hitl: Hitl,
        activity: Activity,
        settings: SchedulerSettings | None = None,
        *,
        inference: InferenceEngine | None = None,
        resources: ResourceTracker | None = None,
    ) -> None:
        self.settings = settings or SchedulerSettings()
        self._store = tasks
        self._router = router
        self._registry = registry
        self._events = events
        self._clock = clock
        self._hitl = hitl
        self._activity = activity
        self._envelopes = NoticeFactory(clock, ids, SCHEDULER)
        self._notices = NoticeFactory(clock, ids)
        self.resources = resources or ResourceTracker(events, None)
        self.lifecycles = Lifecycles(events, clock, SchedulerAgents(self), self.settings.lifecycle)
        self.gate = ConflictGate(
            self.settings.conflicts, inference or RuleInference(), hitl, events,
            self._wake_task, inference_timeout_s=self.settings.inference_timeout_s,
            hitl_timeout_s=self.settings.hitl_timeout_s,
        )  # fmt: skip
        self._tasks: dict[str, TaskRecord] = {}
        self._queue = TaskQueue()
        self._seq = 0
        self._lanes: dict[str, LaneScheduler] = {}
        self._running: dict[str, str] = {}
        self._by_message: dict[str, str] = {}
        self._active: Counter[str] = Counter()
        self._jobs: dict[str, str] = {}
        self._preemptions: dict[str, PreemptionRecord] = {}
        self._timers = Timers()
        self._wakeups: set[str] = set()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._type_waiters: dict[str, set[str]] = {}
        """Agents whose next task waits for a free instance of its type (RFC 9.1)."""
        self._blocked_by: dict[str, set[str]] = {}
        """Running task -> agents whose next task waits for it to end (RFC 9.2)."""
        self._background: set[asyncio.Future[None]] = set()
        self._end_listeners: list[Callable[[TaskRecord], None]] = []
        self.on_negotiation: Callable[[Envelope], Awaitable[None]] | None = None
        """Takes NEGOTIATION envelopes addressed to the Scheduler (engine/negotiations.py)."""
        self.worktree_bound: Callable[[str], bool] = lambda agent_id: False
        """Whether the agent has a bound worktree (the worktree manager; RFC 16.3): tasks
        scoped `worktree:required` wait while it has none (UNBOUND or BIND_FAILED)."""
        self._needs_worktree: dict[str, bool] = {}
        router.attach(SCHEDULER, self._on_envelope)

    def add_end_listener(self, listener: Callable[[TaskRecord], None]) -> None:
        """Call `listener` with every task that ends (COMPLETED or FAILED), once it is stored.

        It runs inside the Scheduler's lock: it must not block or call back into the
        Scheduler (queue the record and act on it later)."""
        self._end_listeners.append(listener)

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskRecord | None:
        """A live (non-terminal) task."""
        return self._tasks.get(task_id)

    async def find(self, task_id: str) -> TaskRecord:
        found = self._tasks.get(task_id) or await self._store.get(task_id)
        if found is None:
            raise NotFoundError(f"no task {task_id!r}", {"task_id": task_id})
        return found

    def running(self, agent_id: str) -> TaskRecord | None:
        task_id = self._running.get(agent_id)
        return self._tasks.get(task_id) if task_id else None

    def preemption(self, task_id: str) -> PreemptionRecord | None:
        return self._preemptions.get(task_id)

    def queued(self, agent_id: str | None = None) -> list[TaskRecord]:
        """Waiting tasks in service order per lane (all agents when None)."""
        keys = [k for k in self._queue.agents() if agent_id is None or _agent(k) == agent_id]
        return [self._tasks[q.task_id] for k in sorted(keys) for q in self._queue.listing(k)]

    def active(self) -> Mapping[str, int]:
        """Tasks dispatched or running per agent type (RFC 9.1 tracking)."""
        return dict(self._active)

    def depth(self) -> int:
        return len(self._queue)

    def counts(self) -> dict[str, int]:
        """Tasks held in memory (not yet finished) by state, for monitoring."""
        found: dict[str, int] = {}
        for task in self._tasks.values():
            found[task.state] = found.get(task.state, 0) + 1
        return found

    # ------------------------------------------------------------------ start-up

    async def load(self) -> int:
        """Rebuild queues and running tasks from the store after a (re)start."""
        for agent in await self._registry.list():
            await self.lifecycles.registered(agent.agent_id, agent.name)
        records = await self._store.list(OPEN_STATES, limit=1 << 62)
        self._seq = max(await self._store.max_seq() + 1, 0)
        held_for: dict[str, str] = {}
        if any(r.state == TaskState.HELD for r in records):  # their HITL invocations
            held_for = {
                str(r.subject.get("task_id")): r.invocation_id
                for r in await self._hitl.list(include_decided=True, limit=1 << 30)
                if r.reason_type == "TASK_ESCALATION" and r.requested_by == SCHEDULER
            }
        for record in records:
            self._tasks[record.task_id] = record
            if record.job_key:
                self._jobs[record.job_key] = record.task_id
            if record.state == TaskState.QUEUED:
                self._push(record)
            elif record.state == TaskState.HELD:
                invocation = held_for.get(record.task_id)
                if invocation is None:
                    await self._fail(record, "duplicate_detected", "held job lost its decision")
                else:  # the decision may come (or have come) while the coordinator was down
                    self._spawn(self._await_authorization(record.task_id, invocation))
            else:
                self._occupy(record)
        return len(records)

    # ------------------------------------------------------------------ submission

    async def submit(self, sub: Submission) -> SubmitResult:
        """SubmitTask: refusals of well-formed requests answer accepted=false with the reason;
        malformed ones raise (ValidationError naming the field, NotFoundError, ...)."""
        record = await self._admit(sub)
        async with self._lock:
            duplicate = self._jobs.get(record.job_key)
            if duplicate is not None:
                return await self._duplicate(record, duplicate)
            if len(self._tasks) >= self.settings.max_queued:
                return SubmitResult(
                    False, f"buffer_full: {len(self._tasks)} tasks waiting "
                    f"(max_queued {self.settings.max_queued})",
                )  # fmt: skip
            record = replace(record, seq=self._next_seq())
            await self._save(record, "task.submitted", priority=record.priority,
                             scope=record.scope, lane=record.lane)  # fmt: skip
            self._push(record)
            note = await self._maybe_preempt(record)
            await self._try_dispatch(record.agent_id)
            await self._drain_wakeups()
            return SubmitResult(
                True, note or self._explain(record.task_id), self.get(record.task_id)
            )

    async def _admit(self, sub: Submission) -> TaskRecord:
        for name in ("agent_id", "task_id"):
            if not getattr(sub, name):
                raise ValidationError.for_field(name, "is required")
        priority = validate_priority(sub.priority)
        if not sub.scope.strip():
            raise ValidationError.for_field(
                "scope", "is required: name the repositories, paths or resources the task uses"
            )
        parse_scope(sub.scope)
        agent = await self._registry.get(sub.agent_id)
        if self.lifecycles.state(sub.agent_id) is AgentLifecycleState.SHUTTING_DOWN:
            raise AgentShutdownError(
                f"agent {sub.agent_id} is shutting down and takes no new tasks",
                {"agent_id": sub.agent_id},
            )
        content_type = sub.content_type or ("application/json" if sub.params else "")
        if not content_type:
            content_type = "application/octet-stream"
        check_modality(content_type, agent.descriptor.get("modalities_supported") or ())
        limit = self._router.settings.limits.limit_for(MessageType.DATA)
        if len(sub.params) > limit:
            raise ValidationError.for_field(
                "params", f"{len(sub.params)} bytes exceed the DATA limit of {limit}"
            )
        if sub.task_id in self._tasks or await self._store.get(sub.task_id) is not None:
            raise AlreadyExistsError(
                f"task {sub.task_id!r} was already submitted", {"task_id": sub.task_id}
            )
        lane = "STANDARD"
        if sub.submitter:
            submitter = await self._registry.find(sub.submitter)
            lane = str((submitter.descriptor if submitter else {}).get("communication_class"))
            lane = lane if lane in LANES else "STANDARD"
        now = self._clock.now()
        return TaskRecord(
            task_id=sub.task_id, agent_id=sub.agent_id, priority=priority, submitted_at=now,
            seq=0, state=TaskState.QUEUED.value, updated_at=now, scope=sub.scope,
            job_key=sub.job_key or job_identity(agent.name, content_type, sub.params, sub.scope),
            params=sub.params, content_type=content_type, agent_type=agent.name, lane=lane,
        )  # fmt: skip

    async def _duplicate(self, record: TaskRecord, original_id: str) -> SubmitResult:
        original = self._tasks[original_id]
        why = f"same job as task {original_id} ({original.state})"
        if self.settings.duplicate_jobs == "reject":
            await self._events.record(
                "task.duplicate_rejected", SCHEDULER, correlation_id=record.task_id,
                task_id=record.task_id, original_task_id=original_id, job_key=record.job_key,
            )  # fmt: skip
            return SubmitResult(False, f"duplicate_detected: {why}")
        held = replace(record, seq=self._next_seq(), state=TaskState.HELD.value)
        invocation = await self._hitl.open(
            "TASK_ESCALATION",
            {"reason": f"duplicate job: {why}", "job_key": record.job_key,
             "scope": record.scope, "original_task_id": original_id},
            requested_by=SCHEDULER,
            subject={"task_id": record.task_id, "agent_id": record.agent_id},
            suggested_action="deny", proposed_actions=("approve", "deny"),
            timeout_s=self.settings.hitl_timeout_s, correlation_id=record.task_id,
            priority=record.priority,
        )  # fmt: skip
        held = replace(held, note=f"held for HITL invocation {invocation.invocation_id}")
        await self._save(held, "task.held", original_task_id=original_id,
                         invocation_id=invocation.invocation_id)  # fmt: skip
        self._spawn(self._await_authorization(held.task_id, invocation.invocation_id))
        return SubmitResult(
            False,
            f"duplicate_detected: {why}; held for HITL authorization "
            f"(invocation {invocation.invocation_id})",
            held,
        )

    async def _await_authorization(self, task_id: str, invocation_id: str) -> None:
        decided = await self._hitl.wait(invocation_id)
        action = str(decided.decision.get("action", "deny")).lower()
        async with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state != TaskState.HELD:
                return
            if action not in ("approve", "modify"):
                await self._fail(task, "duplicate_detected", f"HITL {invocation_id}: {action}")
                return
            task = replace(task, state=TaskState.QUEUED.value, note="authorized")
            await self._save(task, "task.authorized", invocation_id=invocation_id)
            self._push(task)
            await self._maybe_preempt(task)
            await self._try_dispatch(task.agent_id)
            await self._drain_wakeups()

    # ------------------------------------------------------------------ operator requests

    async def request_preemption(self, agent_id: str, task_id: str, reason: str) -> bool:
        """RequestPreemption: start cooperative preemption of the agent's running task."""
        async with self._lock:
            running = self.running(agent_id)
            if running is None or (task_id and running.task_id != task_id):
                return False
            record = self._preemptions.get(running.task_id)
            if record is None or record.state.value != "RUNNING":
                return False
            await self._preempt(running, reason or "operator request")
            await self._drain_wakeups()
            return True

    async def shutdown_agent(self, agent_id: str, grace_s: float | None) -> None:
        """ShutdownAgent (RFC 8.4): SHUTTING_DOWN with a grace period."""
        await self._registry.get(agent_id)
        async with self._lock:
            try:
                await self.lifecycles.shutdown(agent_id, grace_s)
            except LifecycleIllegal as exc:
                raise ValidationError.for_field(
                    "agent_id", f"cannot shut down {agent_id} now: {exc}", state=str(exc.state)
                ) from None
            await self._drain_wakeups()

    async def suspend_agent(self, agent_id: str) -> None:
        """Pause a RUNNING agent (RFC 8.1 SUSPENDED): it keeps its task and state.
        ValidationError naming `agent_id` when its state cannot be suspended."""
        await self._operator_input(agent_id, AgentInput.SUSPEND)

    async def resume_agent(self, agent_id: str) -> None:
        """Let a SUSPENDED agent go on (RESUMED, then RUNNING once it reports)."""
        await self._operator_input(agent_id, AgentInput.RESUME)

    async def _operator_input(self, agent_id: str, event: AgentInput) -> None:
        async with self._lock:
            try:
                await self.lifecycles.apply(agent_id, event, note="requested")
            except LifecycleIllegal as exc:
                raise ValidationError.for_field(
                    "agent_id", f"{agent_id} is {exc.state}: {event.value.lower()} does not apply"
                ) from None

    # ------------------------------------------------------------------ agents

    async def agent_registered(self, agent_id: str, agent_type: str) -> None:
        async with self._lock:
            await self.lifecycles.registered(agent_id, agent_type)

    async def agent_ready(self, agent_id: str) -> None:
        """The agent opened its inbound stream (RFC 8.1: RUNNABLE agents indicate readiness)."""
        async with self._lock:
            if self.lifecycles.state(agent_id) is None:
                agent = await self._registry.find(agent_id)
                if agent is None:
                    return
                await self.lifecycles.registered(agent_id, agent.name)
            await self.lifecycles.ready(agent_id)
            await self._try_dispatch(agent_id)

    async def agent_reported(self, agent_id: str, state: str) -> None:
        """The agent's own state in its Heartbeat (sw4rm.common.AgentState name)."""
        try:
            reported = AgentLifecycleState(state)
        except ValueError:
            return
        async with self._lock:
            if self.lifecycles.state(agent_id) is None:
                return
            if reported is AgentLifecycleState.RUNNABLE:
                await self.lifecycles.ready(agent_id)
            await self.lifecycles.report(agent_id, reported)
            await self._try_dispatch(agent_id)
            await self._drain_wakeups()

    async def agent_deregistered(self, agent_id: str) -> None:
        async with self._lock:
            running = self.running(agent_id)
            if running is not None:
                await self._finish(running, TaskState.FAILED, "agent_unavailable",
                                   "the agent deregistered")  # fmt: skip
            await self.lifecycles.deregistered(agent_id)
            await self._drain_wakeups()

    # ------------------------------------------------------------------ lifecycle effects

    async def send_control(self, agent_id: str, body: dict[str, Any]) -> None:
        """A CONTROL command to the agent (lifecycle notices: shutdown, suspend, ...)."""
        env = self._envelopes.control(body)
        (outcome,) = await self._router.send_many([Outbound(env, agent_id, lane="PRIVILEGED")])
        await self._events.record(
            "agent.control", SCHEDULER, agent_id=agent_id, command=body.get("command", ""),
            message_id=env.message_id, accepted=outcome.accepted, reason=outcome.reason,
        )  # fmt: skip

    async def activity_purge(self, agent_id: str) -> None:
        await self._activity.purge(agent_id, None)

    async def deregister(self, agent_id: str, reason: str) -> None:
        await self._registry.deregister(agent_id, reason)

    async def escalate_agent(self, agent_id: str, state: str, reason: str) -> None:
        await self._hitl.open(
            "TASK_ESCALATION", {"reason": reason, "state": state}, requested_by=SCHEDULER,
            subject={"agent_id": agent_id}, suggested_action="deny",
            proposed_actions=("approve", "deny"), timeout_s=self.settings.hitl_timeout_s,
        )  # fmt: skip

    def wake(self, agent_id: str) -> None:
        """Try to dispatch to `agent_id` from the background loop."""
        self._wakeups.add(agent_id)
        self._wake.set()

    def _wake_task(self, task_id: str) -> None:
        task = self._tasks.get(task_id)
        if task is not None:
            self.wake(task.agent_id)

    # ------------------------------------------------------------------ dispatch

    async def _try_dispatch(self, agent_id: str) -> None:
        """Dispatch the agent's next task if everything allows it (lock held)."""
        if agent_id in self._running or not self.lifecycles.accepts_tasks(agent_id):
            return
        picked = self._head(agent_id)
        if picked is None:
            return
        head, choice = picked
        task = self._tasks[head.task_id]
        if self._waits_for_worktree(task):
            await self._held_for_worktree(task)
            return
        limit = self.settings.instance_limit(task.agent_type)
        if self._active[task.agent_type] >= limit:
            self._type_waiters.setdefault(task.agent_type, set()).add(agent_id)
            return
        running = [self._tasks[t] for t in self._running.values()]
        blockers = await self.gate.blockers(task, running)
        if blockers:
            await self._deferred(task, blockers)
            return
        self._take(head)
        await self._dispatch(task, choice)

    def _waits_for_worktree(self, task: TaskRecord) -> bool:
        needs = self._needs_worktree.get(task.task_id)
        if needs is None:
            needs = self._needs_worktree[task.task_id] = parse_scope(task.scope).needs_worktree
        return needs and not self.worktree_bound(task.agent_id)

    async def _held_for_worktree(self, task: TaskRecord) -> None:
        """RFC 16.3: no worktree task for an agent without a bound worktree (BIND_FAILED is
        treated like UNBOUND); the task waits until a BIND succeeds (`wake`)."""
        note = "waiting for the agent to bind a worktree (worktree:required)"
        if task.note == note:
            return
        task = replace(task, note=note, updated_at=self._clock.now())
        await self._save(task, "task.waiting_worktree", reason=note)

    def _head(self, agent_id: str) -> tuple[QueuedTask, LaneChoice] | None:
        ready = {lane: self._queue.count(_key(agent_id, lane)) for lane in LANES}
        if not any(ready.values()):
            return None
        lanes = self._lanes.get(agent_id)
        if lanes is None:
            lanes = self._lanes[agent_id] = LaneScheduler(self.settings.lanes)
        choice = lanes.pick(ready, self._clock.now())
        assert choice is not None
        head = self._queue.peek(_key(agent_id, choice.lane))
        return None if head is None else (head, choice)

    def _take(self, head: QueuedTask) -> None:
        self._queue.remove(head.task_id)

    async def _deferred(self, task: TaskRecord, blockers: list[Blocker]) -> None:
        for blocker in blockers:
            self._blocked_by.setdefault(blocker.task_id, set()).add(task.agent_id)
        note = "; ".join(f"{b.outcome} behind {b.task_id}: {b.reason}" for b in blockers)
        if task.note == note:
            return
        task = replace(task, note=note, updated_at=self._clock.now())
        await self._save(task, "task.deferred", blocked_by=[b.task_id for b in blockers],
                         reason=note)  # fmt: skip
        await self._router.notify(
            task.agent_id,
            self._notices.notification(
                {"event": "task_deferred", "task_id": task.task_id,
                 "blocked_by": [b.task_id for b in blockers], "reason": note},
                task.task_id,
            ),
        )  # fmt: skip

    async def _dispatch(self, task: TaskRecord, choice: LaneChoice | None = None) -> None:
        attempt = task.attempts + 1
        env = self._envelopes.envelope(
            MessageType.DATA, task.params, task.content_type, correlation_id=task.task_id,
            idempotency_token=f"task:{task.task_id}:{attempt}",
        )  # fmt: skip
        (outcome,) = await self._router.send_many([Outbound(env, task.agent_id, lane=task.lane)])
        if not outcome.accepted:
            code = outcome.error_code
            if code == "buffer_full":
                self._push(task)
                self._timers.arm(f"retry{_SEP}{task.agent_id}",
                                 self._clock.now() + self.settings.retry_after_s)  # fmt: skip
                self._wake.set()
                return
            await self._fail(task, code or "internal_error", outcome.reason)
            return
        task = replace(
            task, state=TaskState.DISPATCHED.value, message_id=env.message_id, attempts=attempt,
            updated_at=self._clock.now(), note="",
        )  # fmt: skip
        self._occupy(task)
        flags = {"urgent": choice.urgent, "overflowed": choice.overflowed} if choice else {}
        await self._save(task, "task.dispatched", message_id=env.message_id, attempt=attempt,
                         lane=task.lane, **flags)  # fmt: skip
        await drive(self, task.agent_id, AgentInput.SCHEDULE)

    def _occupy(self, task: TaskRecord) -> None:
        self._running[task.agent_id] = task.task_id
        self._by_message[task.message_id] = task.task_id
        self._active[task.agent_type] += 1
        self._preemptions[task.task_id] = PreemptionMachine.start(task.task_id, self._clock.now())

    def _release(self, task: TaskRecord) -> None:
        """The task no longer holds its agent (ended, yielded or requeued)."""
        if self._running.get(task.agent_id) == task.task_id:
            del self._running[task.agent_id]
        self._by_message.pop(task.message_id, None)
        if self._active[task.agent_type] > 0:
            self._active[task.agent_type] -= 1
        self._preemptions.pop(task.task_id, None)
        self._timers.cancel(f"preempt{_SEP}{task.task_id}")
        self.gate.forget(task.task_id)
        for agent_id in self._type_waiters.pop(task.agent_type, set()):
            self.wake(agent_id)
        for agent_id in self._blocked_by.pop(task.task_id, set()):
            self.wake(agent_id)

    # ------------------------------------------------------------------ preemption

    async def _maybe_preempt(self, task: TaskRecord) -> str:
        running = self.running(task.agent_id)
        if running is None or not should_preempt(running.priority, task.priority):
            return ""
        record = self._preemptions.get(running.task_id)
        if record is None or record.state.value not in ("RUNNING", "NON_PREEMPTIBLE"):
            return f"queued: task {running.task_id} is already being preempted"
        await self._preempt(running, f"higher-priority task {task.task_id} ({task.priority})")
        return f"queued: preempting task {running.task_id} (priority {running.priority})"

    async def _preempt(self, running: TaskRecord, reason: str) -> None:
        record = self._preemptions[running.task_id]
        step = PreemptionMachine.request_preempt(
            record, self._clock.now(), self.settings.preemption
        )
        await self._events.record(
            "task.preempt_requested", SCHEDULER, correlation_id=running.task_id,
            task_id=running.task_id, agent_id=running.agent_id, reason=reason,
        )  # fmt: skip
        await self._perform(running, step, reason)

    async def _perform(self, task: TaskRecord, step: PreemptionStep, reason: str = "") -> None:
        before = self._preemptions.get(task.task_id)
        self._preemptions[task.task_id] = step.record
        if before is not None and before.state is not step.record.state:
            await self._events.record(
                "task.preemption", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
                agent_id=task.agent_id, **{"from": before.state.value,
                                           "to": step.record.state.value},
            )  # fmt: skip
        key = f"preempt{_SEP}{task.task_id}"
        for effect in step.effects:
            if effect is PreemptionEffect.SEND_PREEMPT_REQUEST:
                await self._control(task, {"command": "preempt_request", "reason": reason})
            elif effect is PreemptionEffect.SEND_TERMINATE:
                await self._control(task, {"command": "terminate", "grace_ms": step.grace_ms})
            elif effect is PreemptionEffect.KILL:
                await self._control(task, {"command": "kill"})
                await drive(self, task.agent_id, AgentInput.FAIL, code="forced_preemption")
            elif effect is PreemptionEffect.MARK_FAILED:
                # After KILL the agent's FAIL has already ended the task (ABANDON_TASK):
                # ending the stale record again would log it twice and release it twice.
                current = self._tasks.get(task.task_id)
                if current is not None:
                    await self._fail(current, step.error_code or "forced_preemption",
                                     "forced preemption")  # fmt: skip
            elif effect is PreemptionEffect.REQUEUE_TASK:
                await self._requeue(task, "yielded at a safe point")
            elif effect is PreemptionEffect.DISPATCH_HIGHER:
                self.wake(task.agent_id)
            elif effect is PreemptionEffect.START_TIMER and step.record.deadline is not None:
                self._timers.arm(key, step.record.deadline)
                self._wake.set()
            elif effect is PreemptionEffect.CANCEL_TIMER:
                self._timers.cancel(key)

    async def _control(self, task: TaskRecord, body: dict[str, Any]) -> None:
        env = self._envelopes.control({**body, "task_id": task.task_id}, task.task_id)
        (outcome,) = await self._router.send_many([Outbound(env, task.agent_id, lane="PRIVILEGED")])
        await self._events.record(
            "task.control", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
            agent_id=task.agent_id, command=body["command"], message_id=env.message_id,
            accepted=outcome.accepted, reason=outcome.reason,
        )  # fmt: skip

    async def _requeue(self, task: TaskRecord, why: str) -> None:
        self._release(task)
        task = replace(task, state=TaskState.QUEUED.value, updated_at=self._clock.now(),
                       note=why)  # fmt: skip
        await self._save(task, "task.requeued", reason=why)
        self._push(task)
        await finished(self, task.agent_id)
        self.wake(task.agent_id)

    # ------------------------------------------------------------------ agent envelopes

    async def _on_envelope(self, env: Envelope) -> None:
        """Router endpoint: ACKs of the Scheduler's envelopes, agents' CONTROL commands and
        NEGOTIATION events (RFC 17)."""
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            await self._on_ack(env)
        elif env.message_type is MessageType.CONTROL:
            await self._on_command(env)
        elif env.message_type is MessageType.NEGOTIATION and self.on_negotiation is not None:
            await self.on_negotiation(env)
        else:
            raise ValidationError.for_field(
                "message_type",
                f"the scheduler takes ACKNOWLEDGEMENT, CONTROL and NEGOTIATION envelopes, not "
                f"{env.message_type.name}",
            )

    async def _on_ack(self, env: Envelope) -> None:
        ack = self._router.codec.decode_ack(env)
        async with self._lock:
            task_id = self._by_message.get(ack.ack_for_message_id)
            task = self._tasks.get(task_id) if task_id else None
            if task is None:
                return  # an ACK of a control message, or of a task that already ended
            stage = ack.ack_stage.name
            note = ack.note.strip()
            if stage == "READ" and task.state == TaskState.DISPATCHED:
                task = replace(task, state=TaskState.RUNNING.value, updated_at=self._clock.now())
                await self._save(task, "task.running")
                await drive(self, task.agent_id, AgentInput.START)
            elif stage == "FULFILLED":
                await self._fulfilled(task, note)
            elif stage in ("REJECTED", "FAILED", "TIMED_OUT"):
                await self._ack_failed(task, ack.error_code or "internal_error", ack.note, stage)
            await self._drain_wakeups()

    async def _fulfilled(self, task: TaskRecord, note: str) -> None:
        record = self._preemptions[task.task_id]
        now = self._clock.now()
        said = note.lower()  # the note itself keeps its case: it may carry a result (JSON)
        if said.startswith("yielded") and PreemptionMachine.allows(record.state, _YIELD):
            await self._perform(task, PreemptionMachine.safe_point_yield(record, now))
        elif said.startswith("terminated") and PreemptionMachine.allows(record.state, _TERMINATED):
            await self._perform(task, PreemptionMachine.terminated(record, now))
            await finished(self, task.agent_id)
        else:
            await self._finish(task, TaskState.COMPLETED, "", note)
            await finished(self, task.agent_id)

    async def _ack_failed(self, task: TaskRecord, code: str, note: str, stage: str) -> None:
        if stage == "TIMED_OUT" and task.attempts < self.settings.dispatch_attempts:
            # The router gave up on an acknowledgement: hand the task out again.
            self._release(task)
            task = replace(task, state=TaskState.QUEUED.value, note=f"{code}: {note}")
            await self._save(task, "task.requeued", reason=f"{code}: {note}")
            self._push(task)
            self.wake(task.agent_id)
            return
        await self._finish(task, TaskState.FAILED, code.lower(), note)
        await finished(self, task.agent_id)

    async def _on_command(self, env: Envelope) -> None:
        try:
            body = json.loads(env.payload)
        except ValueError:
            raise ValidationError.for_field("payload", "must be a JSON object") from None
        if not isinstance(body, dict):
            raise ValidationError.for_field("payload", "must be a JSON object")
        command = body.get("command")
        async with self._lock:
            task = self._tasks.get(str(body.get("task_id") or ""))
            if task is None or self._running.get(task.agent_id) != task.task_id:
                raise ValidationError.for_field("task_id", "names no task running now")
            if env.producer_id != task.agent_id:
                raise PermissionDeniedError(
                    f"{env.producer_id} does not run task {task.task_id}",
                    {"task_id": task.task_id},
                )
            if command == "progress":
                await self._progress(task, body)
                return
            record = self._preemptions[task.task_id]
            now = self._clock.now()
            max_ms = body.get("max_duration_ms")
            if command == "enter_section" and (
                isinstance(max_ms, bool) or not isinstance(max_ms, int) or max_ms <= 0
            ):
                raise ValidationError.for_field(
                    "max_duration_ms", "a non-preemptible section needs a maximum duration"
                )
            if command not in ("enter_section", "leave_section"):
                raise ValidationError.for_field(
                    "command", f"{command!r} is not enter_section, leave_section or progress"
                )
            try:
                if command == "enter_section":
                    step = PreemptionMachine.enter_section(record, int(max_ms or 0) / 1000, now)
                else:
                    step = PreemptionMachine.leave_section(record, now, self.settings.preemption)
            except PreemptionIllegal as exc:
                raise ValidationError.for_field("command", str(exc)) from None
            await self._perform(task, step)
            await self._drain_wakeups()

    async def _progress(self, task: TaskRecord, body: dict[str, Any]) -> None:
        """A running task's progress report (RFC 8.1), recorded in the event log."""
        fraction = body.get("fraction")
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValidationError.for_field("fraction", "must be a number between 0 and 1")
        if not 0.0 <= fraction <= 1.0:
            raise ValidationError.for_field("fraction", f"{fraction} is not between 0 and 1")
        note = body.get("note", "")
        if not isinstance(note, str):
            raise ValidationError.for_field("note", "must be a string")
        await self._events.record(
            "task.progress", task.agent_id, correlation_id=task.task_id, agent_id=task.agent_id,
            task_id=task.task_id, fraction=float(fraction), note=note[:1000],
        )  # fmt: skip

    # ------------------------------------------------------------------ timers

    async def fire_due(self) -> int:
        """Preemption deadlines and dispatch retries due now; returns how many fired."""
        fired = 0
        async with self._lock:
            for key in self._timers.due(self._clock.now()):
                fired += 1
                kind, _, name = key.partition(_SEP)
                if kind == "reconcile":
                    await self.reconcile_activity()
                    self._timers.arm(key, self._clock.now() + RECONCILE_EVERY_S)
                    continue
                if kind == "retry":
                    self._wakeups.add(name)
                    continue
                task = self._tasks.get(name)
                record = self._preemptions.get(name)
                if task is None or record is None:
                    continue
                step = PreemptionMachine.deadline(
                    record, self._clock.now(), self.settings.preemption
                )
                await self._perform(task, step)
            fired += await self.lifecycles.fire_due()
            await self._drain_wakeups()
        return fired

    async def _drain_wakeups(self) -> None:
        while self._wakeups:
            agent_id = self._wakeups.pop()
            await self._try_dispatch(agent_id)

    async def reconcile_activity(self) -> int:
        """Purge activity entries of ended or unknown tasks (RFC 10); returns how many."""
        return await self._activity.reconcile_with(self._task_state, RECONCILE_EVERY_S)

    async def _task_state(self, task_id: str) -> str | None:
        task = self._tasks.get(task_id) or await self._store.get(task_id)
        return task.state if task else None

    def next_deadline(self) -> float | None:
        times = [t for t in (self._timers.next(), self.lifecycles.next_deadline()) if t]
        return min(times) if times else None

    async def run(self, sleep: Any) -> None:
        """Forever: fire timers when due and dispatch to woken agents."""
        self._timers.arm(f"reconcile{_SEP}", self._clock.now() + RECONCILE_EVERY_S)
        while True:
            self._wake.clear()
            self.lifecycles.changed.clear()
            await self.fire_due()
            at = self.next_deadline()
            waiter = asyncio.ensure_future(self._wake.wait())
            changed = asyncio.ensure_future(self.lifecycles.changed.wait())
            timer = asyncio.ensure_future(sleep(max(0.0, at - self._clock.now()))) if at else None
            pending = {waiter, changed} | ({timer} if timer else set())
            try:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for item in pending:
                    item.cancel()

    # ------------------------------------------------------------------ endings

    async def _finish(self, task: TaskRecord, state: TaskState, code: str, note: str) -> None:
        self._release(task)
        self._needs_worktree.pop(task.task_id, None)
        task = replace(task, state=state.value, error_code=code, note=note,
                       updated_at=self._clock.now())  # fmt: skip
        event = "task.completed" if state is TaskState.COMPLETED else "task.failed"
        await self._save(task, event, error_code=code, note=note)
        await self._activity.complete(task.agent_id, task.task_id, state.value)
        self.wake(task.agent_id)
        for listener in self._end_listeners:
            listener(task)

    async def _fail(self, task: TaskRecord, code: str, note: str) -> None:
        if task.state == TaskState.QUEUED:
            self._queue.remove(task.task_id)
        await self._finish(task, TaskState.FAILED, code, note)

    async def fail_agent_tasks(
        self, agent_id: str, code: str, *, queued: bool, running_too: bool = True
    ) -> int:
        """End the agent's running task (unless not `running_too`) and its queued ones (when
        `queued`) with `code`."""
        ended = 0
        running = self.running(agent_id) if running_too else None
        if running is not None:
            await self._finish(running, TaskState.FAILED, code, "agent lifecycle")
            ended += 1
        if queued:
            for task in self.queued(agent_id):
                await self._fail(task, code, "agent lifecycle")
                ended += 1
        return ended

    # ------------------------------------------------------------------ helpers

    def _push(self, task: TaskRecord) -> None:
        self._queue.push(
            QueuedTask(task.task_id, _key(task.agent_id, task.lane), task.priority,
                       task.submitted_at, task.seq, task.scope, task.job_key)
        )  # fmt: skip

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    async def _save(self, task: TaskRecord, event: str, **fields: Any) -> None:
        await self._store.put(task)
        if TaskState(task.state).terminal:
            self._tasks.pop(task.task_id, None)
            if self._jobs.get(task.job_key) == task.task_id:
                del self._jobs[task.job_key]
        else:
            self._tasks[task.task_id] = task
            if task.state != TaskState.HELD:
                self._jobs.setdefault(task.job_key, task.task_id)
        await self._events.record(
            event, SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
            agent_id=task.agent_id, state=task.state, **fields,
        )  # fmt: skip

    def _explain(self, task_id: str) -> str:
        task = self._tasks.get(task_id)
        if task is None:
            return "ended"
        if task.state in (TaskState.DISPATCHED, TaskState.RUNNING):
            return f"dispatched as message {task.message_id}"
        limit = self.settings.instance_limit(task.agent_type)
        if self._active[task.agent_type] >= limit:
            return (
                f"queued: agent type {task.agent_type!r} is at max_parallel_instances {limit} "
                f"({self._active[task.agent_type]} running)"
            )
        running = self._running.get(task.agent_id)
        if running:
            return f"queued behind running task {running}"
        return f"queued: {task.note}" if task.note else "queued"

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        job = asyncio.ensure_future(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def close(self) -> None:
        await self.gate.close()
        for job in list(self._background):
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


_YIELD = PreemptionInput.SAFE_POINT_YIELD
_TERMINATED = PreemptionInput.TERMINATED


def _key(agent_id: str, lane: str) -> str:
    return f"{agent_id}{_SEP}{lane}"


def _agent(key: str) -> str:
    return key.partition(_SEP)[0]
