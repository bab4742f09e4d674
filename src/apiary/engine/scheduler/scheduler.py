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

This module holds the Scheduler's state (tasks, queues, running tasks, preemption records,
the one lock and the one timer heap), its entry points, ACK handling, timers and endings.
Helpers that take the Scheduler and work on that state, under its lock:
engine/scheduler/jobs.py (admission, job identity, duplicate jobs: rejected or HELD for a
HITL authorization), engine/scheduler/dispatch.py (picking and sending a free agent's next
task), engine/scheduler/preemption.py (cooperative preemption and the running agent's
enter_section/leave_section/progress commands), engine/scheduler/agents.py (the agent
lifecycle's effects).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleState
from apiary.core.agent_lifecycle import IllegalTransitionError as LifecycleIllegal
from apiary.core.clock import Clock
from apiary.core.envelope import Envelope, MessageType
from apiary.core.ids import IdGenerator
from apiary.core.preemption import PreemptionMachine, PreemptionRecord
from apiary.core.records import TaskRecord, TaskState
from apiary.core.task_queue import QueuedTask, TaskQueue
from apiary.engine.activity import Activity
from apiary.engine.conflict_gate import ConflictGate
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.inference import InferenceEngine, RuleInference
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.engine.scheduler.agents import SchedulerAgents, drive, finished
from apiary.engine.scheduler.dispatch import SEP, SchedulerDispatch, key_agent, queue_key
from apiary.engine.scheduler.jobs import SchedulerJobs
from apiary.engine.scheduler.preemption import SchedulerPreemption, timer_key
from apiary.engine.settings import SchedulerSettings
from apiary.engine.timers import Timers
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyInProgressError,
    NotFoundError,
    ValidationError,
)
from apiary.store.protocols import TaskStore

OPEN_STATES = frozenset(s.value for s in TaskState if not s.terminal)
RECONCILE_EVERY_S = 60.0
"""How often the activity buffer is reconciled with task states (RFC 10)."""


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
    correlation_id: str = ""
    """The flow the task belongs to (its envelopes' correlation_id); empty: the task_id."""


@dataclass(frozen=True, slots=True)
class SubmitResult:
    accepted: bool
    reason: str
    task: TaskRecord | None = None


@dataclass(eq=False, slots=True)
class Arrival:
    """An admitted submission waiting to be decided, and its outcome."""

    record: TaskRecord
    outcome: asyncio.Future[SubmitResult]


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
        self._running: dict[str, str] = {}
        self._by_message: dict[str, str] = {}
        self._active: Counter[str] = Counter()
        self._jobs: dict[str, str] = {}
        self._preemptions: dict[str, PreemptionRecord] = {}
        self._timers = Timers()
        self._wakeups: set[str] = set()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._arrivals: list[Arrival] = []
        """Submissions admitted and waiting for the lock (`submit`)."""
        self._type_waiters: dict[str, set[str]] = {}
        """Agents whose next task waits for a free instance of its type (RFC 9.1)."""
        self._blocked_by: dict[str, set[str]] = {}
        """Running task -> agents whose next task waits for it to end (RFC 9.2)."""
        self._background: set[asyncio.Future[None]] = set()
        self._end_listeners: list[Callable[[TaskRecord], None]] = []
        self.on_negotiation: Callable[[Envelope], Awaitable[None]] | None = None
        """Takes NEGOTIATION envelopes addressed to the Scheduler
        (engine/negotiation/negotiations.py)."""
        self.worktree_bound: Callable[[str], bool] = lambda agent_id: False
        """Whether the agent has a bound worktree (the worktree manager; RFC 16.3): tasks
        scoped `worktree:required` wait while it has none (UNBOUND or BIND_FAILED)."""
        self._needs_worktree: dict[str, bool] = {}
        self._submissions = SchedulerJobs(self)
        self._preemptor = SchedulerPreemption(self)
        self._dispatcher = SchedulerDispatch(self)
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

    async def list_tasks(
        self, states: frozenset[str] | None, agent_id: str | None, after_seq: int, limit: int
    ) -> list[TaskRecord]:
        """Stored tasks (every change is stored) in `states` of `agent_id`, by submission
        order after `after_seq`; a state that does not exist is a ValidationError."""
        for state in states or ():
            if state not in TaskState.__members__:
                names = ", ".join(TaskState)
                raise ValidationError.for_field("states", f"must be among {names}, got {state!r}")
        return await self._store.list(states, agent_id, after_seq, limit)

    def running(self, agent_id: str) -> TaskRecord | None:
        task_id = self._running.get(agent_id)
        return self._tasks.get(task_id) if task_id else None

    def preemption(self, task_id: str) -> PreemptionRecord | None:
        return self._preemptions.get(task_id)

    def queued(self, agent_id: str | None = None) -> list[TaskRecord]:
        """Waiting tasks in service order per lane (all agents when None)."""
        keys = [k for k in self._queue.agents() if agent_id is None or key_agent(k) == agent_id]
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
        held_for = await self._submissions.held_invocations(records)
        for record in records:
            self._tasks[record.task_id] = record
            if record.job_key:
                self._jobs[record.job_key] = record.task_id
            if record.state == TaskState.QUEUED:
                self._push(record)
            elif record.state == TaskState.HELD:
                await self._submissions.reload_held(record, held_for)
            else:
                self._occupy(record)
        return len(records)

    # ------------------------------------------------------------------ submission

    async def submit(self, sub: Submission) -> SubmitResult:
        """SubmitTask: refusals of well-formed requests answer accepted=false with the reason;
        malformed ones raise (ValidationError naming the field, NotFoundError, ...).

        Submissions that arrive while the lock is taken are decided together by the first of
        them to get it, in arrival order, their task records stored in one group commit
        instead of one commit each (`SchedulerJobs.submit_together`)."""
        record = await self._submissions.admit(sub)
        arrival = Arrival(record, asyncio.get_running_loop().create_future())
        self._arrivals.append(arrival)
        try:
            async with self._lock:
                if not arrival.outcome.done():
                    arrivals, self._arrivals = self._arrivals, []
                    # The others' outcomes depend on it: a cancelled caller still sees the
                    # decision through before the lock goes (and is cancelled after it).
                    await _to_the_end(self._submissions.submit_together(arrivals))
        except asyncio.CancelledError:
            if arrival in self._arrivals:
                self._arrivals.remove(arrival)  # never decided: nothing was stored
            raise
        return arrival.outcome.result()

    def _buffer_full(self, waiting: int) -> SubmitResult:
        return SubmitResult(
            False, f"buffer_full: {waiting} tasks waiting (max_queued {self.settings.max_queued})"
        )

    async def _submit_one(self, record: TaskRecord) -> SubmitResult:
        """One submission, decided alone (under the lock): a duplicate job."""
        duplicate = self._jobs[record.job_key]
        reason, held = await self._submissions.duplicate(record, duplicate)
        return SubmitResult(False, reason, held)

    async def _queued(self, record: TaskRecord) -> SubmitResult:
        """What follows a QUEUED task's write (under the lock): its live copy and event, its
        queue, preemption and dispatch."""
        self._stored(record, "task.submitted", priority=record.priority, scope=record.scope,
                     lane=record.lane)  # fmt: skip
        self._push(record)
        note = await self._preemptor.maybe_preempt(record)
        await self._try_dispatch(record.agent_id)
        return SubmitResult(True, note or self._explain(record.task_id), self.get(record.task_id))

    # ------------------------------------------------------------------ operator requests

    async def cancel(self, task_id: str, reason: str, by: str) -> TaskRecord:
        """An operator's cancellation of a task that has not started (QUEUED or HELD): it
        ends FAILED with error code `cancelled`. A dispatched or running task is refused
        (already_in_progress: preempt it instead), an ended one is already_completed."""
        async with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                ended = await self.find(task_id)  # NotFoundError for an unknown one
                raise AlreadyCompletedError(
                    f"task {task_id} has already ended ({ended.state})",
                    {"task_id": task_id, "state": ended.state},
                )
            if task.state not in (TaskState.QUEUED, TaskState.HELD):
                raise AlreadyInProgressError(
                    f"task {task_id} is {task.state}: preempt it instead of cancelling it",
                    {"task_id": task_id, "state": task.state},
                )
            await self._fail(task, "cancelled", f"cancelled by {by}: {reason}".rstrip(": "))
        return await self.find(task_id)

    async def request_preemption(self, agent_id: str, task_id: str, reason: str) -> bool:
        """RequestPreemption: start cooperative preemption of the agent's running task."""
        return await self._preemptor.request(agent_id, task_id, reason)

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
        await self._dispatcher.try_dispatch(agent_id)

    def _occupy(self, task: TaskRecord) -> None:
        self._running[task.agent_id] = task.task_id
        self.gate.started(task)
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
        self._timers.cancel(timer_key(task.task_id))
        self.gate.forget(task.task_id)
        for agent_id in self._type_waiters.pop(task.agent_type, set()):
            self.wake(agent_id)
        for agent_id in self._blocked_by.pop(task.task_id, set()):
            self.wake(agent_id)

    # ------------------------------------------------------------------ agent envelopes

    async def _on_envelope(self, env: Envelope) -> None:
        """Router endpoint: ACKs of the Scheduler's envelopes, agents' CONTROL commands and
        NEGOTIATION events (RFC 17)."""
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            await self._on_ack(env)
        elif env.message_type is MessageType.CONTROL:
            await self._preemptor.on_command(env)
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
                await self._preemptor.fulfilled(task, note)
            elif stage in ("REJECTED", "FAILED", "TIMED_OUT"):
                await self._ack_failed(task, ack.error_code or "internal_error", ack.note, stage)
            await self._drain_wakeups()

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

    # ------------------------------------------------------------------ timers

    async def fire_due(self) -> int:
        """Preemption deadlines and dispatch retries due now; returns how many fired."""
        fired = 0
        async with self._lock:
            for key in self._timers.due(self._clock.now()):
                fired += 1
                kind, _, name = key.partition(SEP)
                if kind == "reconcile":
                    await self.reconcile_activity()
                    self._timers.arm(key, self._clock.now() + RECONCILE_EVERY_S)
                    continue
                if kind == "retry":
                    self._wakeups.add(name)
                    continue
                await self._preemptor.deadline(name)
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
        self._timers.arm(f"reconcile{SEP}", self._clock.now() + RECONCILE_EVERY_S)
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
            QueuedTask(task.task_id, queue_key(task.agent_id, task.lane), task.priority,
                       task.submitted_at, task.seq, task.scope, task.job_key)
        )  # fmt: skip

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    async def _save(self, task: TaskRecord, event: str, **fields: Any) -> None:
        await self._store.put(task)
        self._stored(task, event, **fields)

    def _stored(self, task: TaskRecord, event: str, **fields: Any) -> None:
        """`_save` once the record is stored: the live copy, the job index and the event."""
        if TaskState(task.state).terminal:
            self._tasks.pop(task.task_id, None)
            if self._jobs.get(task.job_key) == task.task_id:
                del self._jobs[task.job_key]
        else:
            self._tasks[task.task_id] = task
            if task.state != TaskState.HELD:
                self._jobs.setdefault(task.job_key, task.task_id)
        self._events.note(
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


async def _to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` to its end even if the caller is cancelled meanwhile; the cancellation is
    raised once it has ended."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError
