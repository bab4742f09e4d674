"""The Scheduler (RFC 7, 8, 9): task queues, dispatch, cooperative preemption, concurrency.

A task (SubmitTask) is validated, stored QUEUED and put in its agent's queue, or, naming a
capability or an agent type, in that shared queue (core/tasks/shared.py): one queue per
(agent or shared queue, lane), priority -19 first and FIFO within a priority
(core/tasks/queue.py). An agent holds up to its window of tasks: the `task_concurrency` it
declared (1 by default) and, declared, `[scheduler] prefetch` more (core/tasks/capacity.py).
While it has room (lifecycle RUNNABLE when it holds none, SCHEDULED or RUNNING when it holds
some: the lifecycle steps as the window fills and empties, engine/scheduler/windows.py), a
new instance of its type is below max_parallel_instances and the best head task of its own
and its shared queues has no unresolved scope conflict with a running task
(engine/conflict_gate.py), that head is dispatched: a DATA envelope from `scheduler` to the
agent with the task's params as payload, its content type, the task id as correlation id
and `task:<id>:<attempt>` as idempotency token. A shared queue's tasks go to its agents
fairly (the least loaded first, round robin among equals). The agent's ACKs drive
the task: READ -> RUNNING, FULFILLED -> COMPLETED (note "yielded": back to the queue, note
"terminated": FAILED forced_preemption), REJECTED/FAILED -> FAILED with the agent's code.
A result too large for an ACK's note comes through `complete` (TaskQueryService.CompleteTask);
the submitter waits for it (`wait`) or watches its tasks (`watch_tasks`; engine/scheduler/watch.py).
An agent lost with tasks in hand (its lifecycle failed, it missed its heartbeats, it shut
down or deregistered) has its shared tasks requeued, up to `[scheduler] max_attempts`, and
the others failed; an ACK of a dispatch taken back that way completes nothing, and a READ of
one is answered with a terminate naming that dispatch (`task.revoked`).

Lanes (RFC 7.3): a task's lane is its submitter's communication class (STANDARD when the
submitter is not a registered agent). When an agent frees, its LaneScheduler (the router's
implementation, core/lanes.py) picks the lane: PRIVILEGED next (rate-limited, overflow to
STANDARD, weighted sharing), then the best task of that lane. A PRIVILEGED task never
preempts by its lane; only a strictly higher priority starts (cooperative) preemption.

Preemption (RFC 7.1, 7.2; C.4, C.5) follows core/preemption.py; the wire protocol is in
docs/scheduler.md. Agent lifecycle (RFC 8) is engine/lifecycle.py, driven from here.
Every task state change is a row of the task machine (core/tasks/machine.py, drawn in
docs/task-lifecycle.md), stored and logged as a `task.*` event before it is acted on.

This module is the Scheduler's face: its entry points, reads, ACK handling and the loop,
each taking the one lock. Its parts, built here and given what they use:
engine/scheduler/live.py (the live tasks, queues and what running tasks hold),
engine/scheduler/pools.py (which agents serve which shared queues, and how many tasks each
takes at once),
engine/scheduler/watch.py (who waits for which task),
engine/scheduler/wakeups.py (agents to dispatch to and the timer heap),
engine/scheduler/transitions.py (the task machine's effects),
engine/scheduler/jobs.py (admission, task ids given again, job identity, duplicate jobs:
rejected or HELD for a HITL authorization), engine/scheduler/dispatch.py (picking and
sending a free agent's next task), engine/scheduler/preemption.py (cooperative preemption
and the running agent's enter_section/leave_section/progress commands),
engine/scheduler/agents.py (the agent lifecycle's effects), engine/scheduler/windows.py (when
task changes step an agent's lifecycle), engine/scheduler/losses.py (the
tasks of an agent lost with them), engine/scheduler/acks.py (the agents' ACKs, kept and
applied again when the store fails their write).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import replace
from typing import Any, Protocol

from apiary.core.agent_lifecycle import AgentInput, AgentLifecycleMachine, AgentLifecycleState
from apiary.core.clock import Clock
from apiary.core.envelope import Envelope, MessageType
from apiary.core.events import EventDraft
from apiary.core.ids import IdGenerator
from apiary.core.limits import check_members
from apiary.core.machine import IllegalTransitionError
from apiary.core.preemption import PreemptionRecord
from apiary.core.records import TaskRecord, TaskState
from apiary.core.tasks.machine import TaskInput, TaskMachine
from apiary.engine.activity import Activity
from apiary.engine.conflict_gate import ConflictGate
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.inference import InferenceEngine, RuleInference
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.resources import ResourceTracker
from apiary.engine.router.ack_joins import AckedMessage, JoinedAcks
from apiary.engine.router.router import Router
from apiary.engine.scheduler.acks import JoinedAck, TaskAcks, failure_code
from apiary.engine.scheduler.agents import SchedulerAgents
from apiary.engine.scheduler.dispatch import SchedulerDispatch, WorktreeView
from apiary.engine.scheduler.jobs import Arrival, SchedulerJobs, Submission, SubmitResult
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.losses import LostTasks
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.preemption import Reporter, SchedulerPreemption
from apiary.engine.scheduler.steals import PrefetchSteals
from apiary.engine.scheduler.traces import TaskTraces
from apiary.engine.scheduler.transitions import TaskTransitions
from apiary.engine.scheduler.wakeups import RECONCILE_KEY, SEP, Wakeups, shared_target
from apiary.engine.scheduler.watch import TaskWatch
from apiary.engine.scheduler.windows import AgentWindows
from apiary.engine.settings import SchedulerSettings
from apiary.engine.tracing import Tracing
from apiary.errors import (
    AgentUnavailableError,
    AlreadyCompletedError,
    AlreadyInProgressError,
    ApiaryError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    ValidationError,
)
from apiary.store.errors import StoreError
from apiary.store.protocols import TaskStore

log = logging.getLogger(__name__)

__all__ = ["Scheduler", "Submission", "SubmitResult"]

OPEN_STATES = frozenset(s.value for s in TaskState if not s.terminal)
_DISPATCHED = frozenset({TaskState.DISPATCHED, TaskState.RUNNING})
RECONCILE_EVERY_S = 60.0
"""How often the activity buffer is reconciled with task states (RFC 10)."""


class Deputy(Protocol):
    """Where the Scheduler's inputs go while another replica leads the cluster
    (docs/cluster.md, "The leader"): the leader's Scheduler acts on them."""

    async def registered(self, agent_id: str, agent_type: str) -> None: ...

    async def ready(self, agent_id: str) -> None: ...

    async def reported(self, agent_id: str, state: str) -> None: ...

    async def deregistered(self, agent_id: str) -> None: ...

    async def lost(self, agent_id: str, reason: str) -> None: ...

    async def envelope(self, endpoint: str, env: Envelope) -> None: ...


class Scheduler:
    """Tasks from submission to their end, over the agents' lifecycles (module docstring).

    `worktrees` says which agents have a bound worktree (RFC 16.3): tasks scoped
    `worktree:required` wait while their agent has none (always, without it), and a new
    binding wakes the agent. `on_negotiation` takes the NEGOTIATION envelopes addressed to
    the Scheduler (engine/negotiation/negotiations.py).
    """

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
        worktrees: WorktreeView | None = None,
        on_negotiation: Callable[[Envelope], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings = settings or SchedulerSettings()
        self._store = tasks
        self._router = router
        self._registry = registry
        self._clock = clock
        self._activity = activity
        self._on_negotiation = on_negotiation
        self.resources = resources or ResourceTracker(events, None)
        self._envelopes = envelopes = NoticeFactory(clock, ids, SCHEDULER)
        self._wakeups = wakeups = Wakeups()
        self._live = live = LiveTasks(clock, wakeups)
        self._pools = pools = AgentPools(settings.prefetch)
        self.watch = TaskWatch(self.find, live.tasks.values, sleep)
        self._queue = live.queue
        self._lock = asyncio.Lock()
        self._follow_ups: set[asyncio.Future[None]] = set()
        """Dispatches after a frame's task ACKs, running on after the frame was answered."""
        self._arrivals: list[Arrival] = []
        self.deputy: Deputy | None = None
        """In cluster mode, while another replica leads: what the agents' inputs (readiness,
        reports, losses, the envelopes addressed to the Scheduler) are handed to instead of
        acted on here; requests that change tasks are refused (`leading`)."""
        """Submissions admitted and waiting for the lock (`submit`)."""
        hooks = SchedulerAgents(
            self, router, envelopes, events, registry, hitl, activity, self.resources,
            settings.hitl_timeout_s,
        )  # fmt: skip
        self.lifecycles = Lifecycles(events, clock, hooks, settings.lifecycle)
        self.gate = ConflictGate(
            settings.conflicts, inference or RuleInference(), hitl, events, live.wake_task,
            inference_timeout_s=settings.inference_timeout_s,
            hitl_timeout_s=settings.hitl_timeout_s,
        )  # fmt: skip
        self._windows = windows = AgentWindows(live, pools, self.lifecycles)
        self._transitions = TaskTransitions(
            live, wakeups, self.gate, tasks, events, activity, windows, clock, self.watch
        )
        # The trace each task continues (docs/tracing.md), with tracing on only.
        self._traces = None if tracing is None else TaskTraces(tracing, live.tasks.__contains__)
        if self._traces is not None:
            self._transitions.add_end_listener(self._traces.ended)
        self._dispatcher = SchedulerDispatch(
            live, pools, wakeups, self._transitions, windows, self.gate, router,
            envelopes, NoticeFactory(clock, ids), settings, clock, worktrees,
            traces=self._traces,
        )  # fmt: skip
        self._preemptor = SchedulerPreemption(
            live, pools, wakeups, self._transitions, self.lifecycles, windows, router, envelopes,
            events, settings, clock, self._lock, self._dispatcher.drain, self._dispatcher.has_room,
        )  # fmt: skip
        self._steals = PrefetchSteals(
            live, pools, self._preemptor, wakeups, clock, self._dispatcher.bound,
            self._dispatcher.has_room,
        )  # fmt: skip
        self._dispatcher.on_free = self._steals.rebalance
        self._dispatcher.withheld = self._steals.withheld
        self._jobs = SchedulerJobs(
            live, pools, self._transitions, self._dispatcher, self._preemptor, self.lifecycles,
            tasks, router, registry, events, hitl, settings, clock, ids, self._lock,
        )  # fmt: skip
        self._losses = LostTasks(
            live, pools, self._transitions, self._preemptor, registry, events, tasks, settings,
            clock,
        )  # fmt: skip
        self._acks = TaskAcks(
            live, self._transitions, self._preemptor, self._losses, wakeups, settings, clock
        )
        router.attach(SCHEDULER, self._on_envelope)
        router.join_acks(SCHEDULER, self._join_acks)
        if worktrees is not None:
            worktrees.subscribe(self.wake)

    def take_reports(self, reporter: Reporter) -> None:
        """Send the running agents' `report` commands (model and reasoning progress from a
        task they hold, checked to come from its holder) to `reporter`, outside the lock."""
        self._preemptor.reporter = reporter

    def add_end_listener(self, listener: Callable[[TaskRecord], None]) -> None:
        """Call `listener` with every task that ends (COMPLETED or FAILED), once it is stored.

        It runs inside the Scheduler's lock: it must not block or call back into the
        Scheduler (queue the record and act on it later)."""
        self._transitions.add_end_listener(listener)

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskRecord | None:
        """A live (non-terminal) task."""
        return self._live.tasks.get(task_id)

    async def find(self, task_id: str) -> TaskRecord:
        """The task as stored (a shared task waiting in its queue with why it waits)."""
        found = self._live.known(task_id) or await self._store.get(task_id)
        if found is None:
            raise NotFoundError(f"no task {task_id!r}", {"task_id": task_id})
        return self._shown(found)

    def _shown(self, task: TaskRecord) -> TaskRecord:
        """A QUEUED shared task with no note of its own says why it waits, as things stand
        now (no agent offers its capability, all of them are busy, ...)."""
        if task.queue and task.state == TaskState.QUEUED and not task.note:
            return replace(task, note=self._jobs.waiting_note(task))
        return task

    async def owner(self, task_id: str) -> str | None:
        """Who submitted the task (the access rule of WaitTask and CancelTask); None when
        there is no such task."""
        found = self._live.known(task_id) or await self._store.get(task_id)
        return None if found is None else found.submitter

    async def wait(self, task_id: str, timeout_s: float | None = None) -> TaskRecord:
        """WaitTask: the task once it has ended, or as it stands after `timeout_s` seconds
        (None: no limit but the caller's cancellation); NotFoundError for an unknown one."""
        return await self.watch.wait(task_id, timeout_s)

    def watch_tasks(
        self, submitter: str, task_ids: frozenset[str] = frozenset(), *, every: bool = False
    ) -> AsyncIterator[TaskRecord]:
        """WatchTasks: the submitter's tasks as they change (`TaskWatch.changes`)."""
        return self.watch.changes(submitter, task_ids, every=every)

    async def list_tasks(
        self, states: frozenset[str] | None, agent_id: str | None, after_seq: int, limit: int,
        queue: str | None = None, submitter: str | None = None,
    ) -> list[TaskRecord]:  # fmt: skip
        """Stored tasks (every change is stored) in `states` of `agent_id` in the shared
        `queue` submitted by `submitter` (None: anyone), by submission order after
        `after_seq`; a state that does not exist is a ValidationError."""
        check_members(states or (), TaskState, "states")
        found = await self._store.list(
            states, agent_id, after_seq, limit, queue=queue, submitter=submitter
        )
        return [self._shown(task) for task in found]

    def running(self, agent_id: str) -> TaskRecord | None:
        """The agent's earliest dispatched task in hand (DISPATCHED or RUNNING), if any."""
        return self._live.held_by(agent_id)

    def holding(self, agent_id: str) -> list[TaskRecord]:
        """Every task the agent holds, in dispatch order (several when it runs tasks
        concurrently or has some prefetched)."""
        return self._live.holding(agent_id)

    def preemption(self, task_id: str) -> PreemptionRecord | None:
        return self._live.preemptions.get(task_id)

    def queued(self, agent_id: str | None = None) -> list[TaskRecord]:
        """Waiting tasks in service order per lane (all agents when None)."""
        return self._live.queued(agent_id)

    def queued_in(self, queue: str) -> list[TaskRecord]:
        """The tasks waiting in a shared queue, in service order per lane."""
        return self._live.queued(shared_target(queue))

    def active(self) -> Mapping[str, int]:
        """Agents holding tasks per agent type: the instances max_parallel_instances counts
        (RFC 9.1 tracking)."""
        return {k: v for k, v in self._live.active.items() if v}

    def depth(self) -> int:
        return len(self._queue)

    def open_tasks(self) -> int:
        """Tasks not yet finished (a tenant's `tasks` quota)."""
        return len(self._live.tasks)

    def counts(self) -> dict[str, int]:
        """Tasks held in memory (not yet finished) by state, for monitoring."""
        found: dict[str, int] = {}
        for task in self._live.tasks.values():
            found[task.state] = found.get(task.state, 0) + 1
        return found

    # ------------------------------------------------------------------ start-up

    async def load(self) -> int:
        """Rebuild queues and running tasks from the store after a (re)start."""
        await self._envelopes.resume(self._router.last_sequence)
        for agent in await self._registry.list():
            await self.lifecycles.registered(agent.agent_id, agent.name)
            self._pools.join(agent)
        records = await self._store.list(OPEN_STATES, limit=1 << 62)
        self._live.resume_seq(await self._store.max_seq() + 1)
        held_for = await self._jobs.held_invocations(records)
        for record in records:
            self._live.adopt(record)
            if record.state == TaskState.QUEUED:
                self._live.push(record)
            elif record.state == TaskState.HELD:
                await self._jobs.reload_held(record, held_for)
            else:
                self._live.occupy(record)
                self.gate.started(record)
        async with self._lock:
            await self._settle_stored_acks(records)
            await self._windows.settle()
        return len(records)

    async def _settle_stored_acks(self, records: Sequence[TaskRecord]) -> None:
        """Each of `records` DISPATCHED or RUNNING whose dispatch the store records as READ
        or ended (its agent's ACK committed and the task's change never: the coordinator,
        or the replica that was to relay the ACK, died in between) takes that ACK now, as
        if it had just come (its note, the result, as its token's record cached it). Asked
        at load, for every open task, and when an agent's stream opens, for the tasks it
        holds (its stream's replica may have died with the ACK: docs/cluster.md, "ACKs
        committed and not applied"). The ACK moves the task on, so it is applied once; one
        that arrives after it is stale and changes nothing. Called with the lock held."""
        for record in records:
            if record.state not in _DISPATCHED or not record.message_id:
                continue
            try:
                ack = await self._router.stored_ack(record.message_id)
            except StoreError as exc:
                log.warning("stored ACKs not read (asked again at the next stream): %s", exc)
                return
            if ack is None or (ack.ack_stage.name == "READ" and record.state != "DISPATCHED"):
                continue
            log.info(
                "task %s: the %s ACK of its dispatch %s was stored and not applied: applied",
                record.task_id, ack.ack_stage.name, record.message_id,
            )  # fmt: skip
            await self._acks.take(record.agent_id, ack)

    # ------------------------------------------------------------------ submission

    def leading(self) -> None:
        """UnavailableError while another replica leads (cluster mode): tasks are changed
        by the leader's Scheduler only, which the calls are forwarded to."""
        if self.deputy is not None:
            raise UnavailableError(
                "this replica does not lead the cluster: the Scheduler runs on the leader "
                "(try again: calls are forwarded to it)",
                {"component": SCHEDULER},
            )

    async def submit(self, sub: Submission) -> SubmitResult:
        """SubmitTask: refusals of well-formed requests answer accepted=false with the reason;
        malformed ones raise (ValidationError naming the field, NotFoundError, ...).

        Submissions that arrive while the lock is taken are decided together by the first of
        them to get it, in arrival order, their task records stored in one group commit
        instead of one commit each (`SchedulerJobs.submit_together`)."""
        self.leading()
        arrived = await self._arrive(sub)
        if isinstance(arrived, SubmitResult):
            return arrived
        await self._decide([arrived])
        return await self._answered(sub, arrived.outcome.result())

    async def submit_many(self, subs: Sequence[Submission]) -> list[SubmitResult | Exception]:
        """SubmitTasks: each submission's outcome, in order, as `submit` would return it or
        the exception it would raise; one's error leaves the others be. They arrive
        together, so they are decided in one run (one group commit for those stored)."""
        self.leading()
        outcomes: list[SubmitResult | Exception | Arrival] = []
        for sub in subs:
            try:
                outcomes.append(await self._arrive(sub))
            except Exception as exc:  # its own outcome (the caller tells it apart)
                outcomes.append(exc)
        arrivals = [o for o in outcomes if isinstance(o, Arrival)]
        if arrivals:
            await self._decide(arrivals)
        answers: list[SubmitResult | Exception] = []
        for sub, outcome in zip(subs, outcomes, strict=True):
            answer = _outcome(outcome) if isinstance(outcome, Arrival) else outcome
            if isinstance(answer, SubmitResult):
                answer = await self._answered(sub, answer)
            answers.append(answer)
        return answers

    async def _arrive(self, sub: Submission) -> SubmitResult | Arrival:
        """A submission admitted, waiting to be decided; or, for a task_id given before, what
        it is. A malformed one raises."""
        if sub.task_id:
            known = self._jobs.resubmitted_live(sub)
            if known is not None:
                return known
        try:
            record = await self._jobs.admit(sub)
            self._jobs.check_accepting(record.agent_id)
        except ApiaryError:
            # A retry of a task stored earlier is that task, though its agent is gone.
            if sub.task_id and (known := await self._jobs.resubmitted(sub)) is not None:
                return known
            raise
        if self._traces is not None:
            self._traces.submitted(record.task_id)
        return Arrival(record, asyncio.get_running_loop().create_future())

    async def _decide(self, arrivals: list[Arrival]) -> None:
        """Decide `arrivals` with every submission waiting for the lock (module docstring):
        the first to get the lock decides for all."""
        self._arrivals.extend(arrivals)
        try:
            async with self._lock:
                if not arrivals[0].outcome.done():  # (arrivals are taken all at once)
                    waiting, self._arrivals = self._arrivals, []
                    # The others' outcomes depend on it: a cancelled caller still sees the
                    # decision through before the lock goes (and is cancelled after it).
                    await _to_the_end(self._jobs.submit_together(waiting))
        except asyncio.CancelledError:
            if arrivals[0] in self._arrivals:  # never decided: nothing was stored
                self._arrivals = [a for a in self._arrivals if a not in arrivals]
            raise

    async def _answered(self, sub: Submission, result: SubmitResult) -> SubmitResult:
        """`result`, or, for a submission with a task_id of its own that the full queue
        refused, the task stored under that id (a retry is its task)."""
        if sub.task_id and result.error_code == "buffer_full":
            return await self._jobs.resubmitted(sub) or result
        return result

    # ------------------------------------------------------------------ operator requests

    async def cancel(self, task_id: str, reason: str, by: str) -> TaskRecord:
        """An operator's cancellation of a task that has not started: QUEUED or HELD, it
        ends FAILED with error code `cancelled` at once; DISPATCHED (waiting at its agent,
        unread: a prefetch) it does once the agent gives it back, which the SDK does at
        once (`SchedulerPreemption.cancel`; the answer is the task as it stands, still
        DISPATCHED). A running task is refused (already_in_progress: preempt it instead),
        an ended one is already_completed."""
        self.leading()
        note = f"cancelled by {by}: {reason}".rstrip(": ")
        async with self._lock:
            task = self._live.tasks.get(task_id)
            if task is None:
                ended = await self.find(task_id)  # NotFoundError for an unknown one
                raise AlreadyCompletedError(
                    f"task {task_id} has already ended ({ended.state})",
                    {"task_id": task_id, "state": ended.state},
                )
            if task.state == TaskState.DISPATCHED:
                await self._preemptor.cancel(task, note)
            elif TaskMachine.allows(task.state, TaskInput.CANCEL):
                await self._transitions.end(task, TaskInput.CANCEL, "cancelled", note)
            else:
                raise AlreadyInProgressError(
                    f"task {task_id} is {task.state}: preempt it instead of cancelling it",
                    {"task_id": task_id, "state": task.state},
                )
        return await self.find(task_id)

    async def complete(
        self, task_id: str, agent_id: str, *, result: str = "", error_code: str = "",
        message: str = "", attempt: int = 0,
    ) -> TaskRecord:  # fmt: skip
        """The outcome of a task dispatched to `agent_id`, from the agent itself (CompleteTask):
        COMPLETED with `result` (JSON text, checked by the caller), or FAILED with
        `error_code` and `message`. An ended task is already_completed; another agent's
        task permission_denied; one not dispatched a ValidationError naming task_id; with
        `attempt` (its dispatch's, from the idempotency token `task:<id>:<attempt>`), an
        earlier attempt than the task's current one (handed out again since) a
        ValidationError naming attempt."""
        async with self._lock:
            task = self._live.tasks.get(task_id)
            if task is None:
                ended_task = await self.find(task_id)  # NotFoundError for an unknown one
                raise AlreadyCompletedError(
                    f"task {task_id} has already ended ({ended_task.state})",
                    {"task_id": task_id, "state": ended_task.state},
                )
            if task.agent_id and task.agent_id != agent_id:
                raise PermissionDeniedError(
                    f"task {task_id} is agent {task.agent_id}'s, not {agent_id}'s",
                    {"task_id": task_id},
                )
            if not self._live.holds(agent_id, task_id):
                raise ValidationError.for_field(
                    "task_id", f"is {task.state}: it has not been dispatched to {agent_id}",
                    task_id=task_id,
                )  # fmt: skip
            if attempt and attempt != task.attempts:
                raise ValidationError.for_field(
                    "attempt", f"is {attempt}, but task {task_id} is on attempt "
                    f"{task.attempts} now: it was handed out again", task_id=task_id,
                )  # fmt: skip
            if error_code:
                await self._transitions.end(task, TaskInput.FAIL, failure_code(error_code), message)
            else:
                await self._transitions.end(task, TaskInput.FULFIL, "", message, result)
            await self._dispatcher.drain()
        return await self.find(task_id)

    async def request_preemption(self, agent_id: str, task_id: str, reason: str) -> bool:
        """RequestPreemption: start cooperative preemption of the agent's running task."""
        self.leading()
        return await self._preemptor.request(agent_id, task_id, reason)

    async def shutdown_agent(self, agent_id: str, grace_s: float | None) -> None:
        """ShutdownAgent (RFC 8.4): SHUTTING_DOWN with a grace period."""
        self.leading()
        await self._registry.get(agent_id)
        async with self._lock:
            try:
                await self.lifecycles.shutdown(agent_id, grace_s)
            except IllegalTransitionError as exc:
                raise ValidationError.for_field(
                    "agent_id", f"cannot shut down {agent_id} now: {exc}", state=str(exc.state)
                ) from None
            await self._dispatcher.drain()

    async def suspend_agent(self, agent_id: str) -> None:
        """Pause a RUNNING agent (RFC 8.1 SUSPENDED): it keeps its task and state.
        ValidationError naming `agent_id` when its state cannot be suspended."""
        self.leading()
        await self._operator_input(agent_id, AgentInput.SUSPEND)

    async def resume_agent(self, agent_id: str) -> None:
        """Let a SUSPENDED agent go on (RESUMED, then RUNNING once it reports)."""
        self.leading()
        await self._operator_input(agent_id, AgentInput.RESUME)

    async def _operator_input(self, agent_id: str, event: AgentInput) -> None:
        async with self._lock:
            try:
                await self.lifecycles.apply(agent_id, event, note="requested")
            except IllegalTransitionError as exc:
                raise ValidationError.for_field(
                    "agent_id", f"{agent_id} is {exc.state}: {event.value.lower()} does not apply"
                ) from None

    # ------------------------------------------------------------------ agents

    async def agent_registered(self, agent_id: str, agent_type: str) -> None:
        """The agent registered (again): its lifecycle, and the shared queues and capacity
        its registration declares."""
        if self.deputy is not None:
            await self.deputy.registered(agent_id, agent_type)
            return
        async with self._lock:
            await self.lifecycles.registered(agent_id, agent_type)
            self._join(agent_id)
            await self._dispatcher.try_dispatch(agent_id)

    def _join(self, agent_id: str) -> None:
        record = self._registry.known(agent_id)
        if record is not None:
            self._pools.join(record)

    async def agent_ready(self, agent_id: str) -> None:
        """The agent opened its inbound stream (RFC 8.1: RUNNABLE agents indicate readiness)."""
        if self.deputy is not None:
            await self.deputy.ready(agent_id)
            return
        async with self._lock:
            if self.lifecycles.state(agent_id) is None:
                agent = await self._registry.find(agent_id)
                if agent is None:
                    return
                await self.lifecycles.registered(agent_id, agent.name)
            self._join(agent_id)
            await self._settle_stored_acks(self._live.holding(agent_id))
            await self.lifecycles.ready(agent_id)
            await self._dispatcher.try_dispatch(agent_id)
            await self._windows.settle()

    async def agent_reported(self, agent_id: str, state: str) -> None:
        """The agent's own state in its Heartbeat (sw4rm.common.AgentState name)."""
        if self.deputy is not None:
            await self.deputy.reported(agent_id, state)
            return
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
            await self._dispatcher.try_dispatch(agent_id)
            await self._dispatcher.drain()

    async def agent_deregistered(self, agent_id: str) -> None:
        if self.deputy is not None:
            await self.deputy.deregistered(agent_id)
            return
        async with self._lock:
            await self._settle_stored_acks(self._live.holding(agent_id))
            for task in self._live.holding(agent_id):
                await self._losses.lost_with(
                    task, AgentUnavailableError.code, "the agent deregistered"
                )
            self._pools.leave(agent_id)
            await self.lifecycles.deregistered(agent_id)
            await self._dispatcher.drain()

    async def agent_lost(self, agent_id: str, reason: str) -> None:
        """The agent missed its heartbeats (engine/presence.py): its lifecycle fails (LOST,
        agent_unavailable) from wherever it takes or holds tasks, abandoning them: shared
        ones go back to their queues. It recovers as any failed agent does."""
        if self.deputy is not None:
            await self.deputy.lost(agent_id, reason)
            return
        async with self._lock:
            await self._settle_stored_acks(self._live.holding(agent_id))
            state = self.lifecycles.state(agent_id)
            if state is not None and AgentLifecycleMachine.allows(state, AgentInput.LOST):
                await self.lifecycles.apply(
                    agent_id, AgentInput.LOST, error_code=AgentUnavailableError.code, note=reason
                )
            await self._dispatcher.drain()

    async def fail_agent_tasks(
        self, agent_id: str, code: str, *, queued: bool, running_too: bool = True
    ) -> int:
        """End the agent's tasks in hand (unless not `running_too`; a shared one goes back to
        its queue while it has attempts left) and its queued ones (when `queued`) with
        `code` (the lifecycle's hooks; the lock is held)."""
        ended = 0
        for task in self._live.holding(agent_id) if running_too else ():
            await self._losses.lost_with(task, code, "agent lifecycle")
            ended += 1
        if queued:
            for task in self._live.queued(agent_id):
                await self._transitions.end(task, TaskInput.ABANDON, code, "agent lifecycle")
                ended += 1
        return ended

    async def recall_waiting(self, agent_id: str, reason: str) -> int:
        """Take back the shared tasks waiting at the agent, not started (the lifecycle's
        hooks; the lock is held)."""
        return await self._losses.recall_waiting(agent_id, reason)

    def wake(self, agent_id: str) -> None:
        """Try to dispatch to `agent_id` from the background loop."""
        self._wakeups.wake(agent_id)

    # ------------------------------------------------------------------ agent envelopes

    async def _on_envelope(self, env: Envelope) -> None:
        """Router endpoint: ACKs of the Scheduler's envelopes, agents' CONTROL commands and
        NEGOTIATION events (RFC 17)."""
        if self.deputy is not None:
            await self.deputy.envelope(SCHEDULER, env)
            return
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            await self._on_ack(env)
        elif env.message_type is MessageType.CONTROL:
            await self._preemptor.on_command(env)
        elif env.message_type is MessageType.NEGOTIATION and self._on_negotiation is not None:
            await self._on_negotiation(env)
        else:
            raise ValidationError.for_field(
                "message_type",
                f"the scheduler takes ACKNOWLEDGEMENT, CONTROL and NEGOTIATION envelopes, not "
                f"{env.message_type.name}",
            )

    async def _join_acks(self, acks: Sequence[AckedMessage]) -> JoinedAcks | None:
        """The router's question for a frame's ACKs of the Scheduler's dispatches
        (engine/router/ack_joins.py): their task transitions, prepared under the lock, which
        stays held until the router's commit has taken them (or failed)."""
        if self.deputy is not None:
            return None
        await self._lock.acquire()
        try:
            joined = self._acks.prepare(acks)
        except BaseException:
            self._lock.release()
            raise
        if joined is None:
            self._lock.release()
            return None
        return _JoinedTaskAcks(
            self._lock, self._acks, self._dispatcher.drain, self._follow_up, joined
        )

    def _follow_up(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` after the caller returns, kept until it ends (`close` waits for it)."""
        job = asyncio.ensure_future(work)
        self._follow_ups.add(job)
        job.add_done_callback(self._follow_ups.discard)

    async def _on_ack(self, env: Envelope) -> None:
        ack = self._router.codec.decode_ack(env)
        async with self._lock:
            await self._acks.take(env.producer_id, ack)
            await self._dispatcher.drain()

    # ------------------------------------------------------------------ timers

    async def fire_due(self) -> int:
        """Preemption deadlines and dispatch retries due now; returns how many fired."""
        fired = 0
        async with self._lock:
            for key in self._wakeups.timers.due(self._clock.now()):
                fired += 1
                kind, _, name = key.partition(SEP)
                if kind == "reconcile":
                    await self.reconcile_activity()
                    self._wakeups.timers.arm(key, self._clock.now() + RECONCILE_EVERY_S)
                    continue
                if kind in ("retry", "steal"):
                    self._wakeups.agents.add(name)
                    continue
                if kind == "acks":
                    await self._acks.retry()
                    continue
                if self._steals.spares(name):
                    continue
                await self._preemptor.deadline(name)
            fired += await self.lifecycles.fire_due()
            await self._dispatcher.drain()
        return fired

    async def reconcile_activity(self) -> int:
        """Purge activity entries of ended or unknown tasks (RFC 10); returns how many."""
        return await self._activity.reconcile_with(self._task_state, RECONCILE_EVERY_S)

    async def _task_state(self, task_id: str) -> str | None:
        task = self._live.known(task_id) or await self._store.get(task_id)
        return task.state if task else None

    def next_deadline(self) -> float | None:
        times = [t for t in (self._wakeups.timers.next(), self.lifecycles.next_deadline()) if t]
        return min(times) if times else None

    async def run(self, sleep: Any) -> None:
        """Forever: fire timers when due and dispatch to woken agents."""
        self._wakeups.timers.arm(RECONCILE_KEY, self._clock.now() + RECONCILE_EVERY_S)
        woken = self._wakeups.loop
        while True:
            woken.clear()
            self.lifecycles.changed.clear()
            await self.fire_due()
            at = self.next_deadline()
            waiter = asyncio.ensure_future(woken.wait())
            changed = asyncio.ensure_future(self.lifecycles.changed.wait())
            timer = asyncio.ensure_future(sleep(max(0.0, at - self._clock.now()))) if at else None
            pending = {waiter, changed} | ({timer} if timer else set())
            try:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for item in pending:
                    item.cancel()

    async def settled(self) -> None:
        """Once the dispatches that follow task ACKs already answered have been made."""
        while self._follow_ups:
            await asyncio.gather(*self._follow_ups, return_exceptions=True)

    async def close(self) -> None:
        await self.settled()
        await self.gate.close()
        await self._jobs.close()


class _JoinedTaskAcks:
    """The Scheduler's part of the router's commit of a frame's ACKs (`Scheduler.
    _join_acks`): the task transitions that commit with it, and their effects after it, with
    the Scheduler's lock held from their preparation to the end of those effects."""

    def __init__(
        self, lock: asyncio.Lock, acks: TaskAcks, drain: Callable[[], Awaitable[None]],
        after: Callable[[Coroutine[Any, Any, None]], None], joined: list[JoinedAck],
    ) -> None:  # fmt: skip
        self._lock = lock
        self._acks = acks
        self._drain = drain
        self._after = after
        self._joined = joined
        # A task stepped twice in the frame (its READ and its end) is stored once, as its
        # last step left it; each step has its event.
        self.tasks: Sequence[TaskRecord] = [
            item.prepared.after for item in joined if item.stores is None
        ]
        self.events: Sequence[EventDraft] = [item.prepared.event for item in joined]
        self.logged: Collection[str] = {item.logged for item in joined if item.logged}

    async def committed(self) -> None:
        """The transitions' effects, then the dispatches they made possible, which go on
        after this returns (the router answers the frame meanwhile: the agent's next ACKs
        are on their way while the next task is dispatched) with the lock still held."""
        try:
            await self._acks.joined(self._joined)
        except (StoreError, ApiaryError) as exc:
            # Stored already: what failed after it is what an ACK handed over would have
            # refused; the ACKs are the router's to answer, and it answered them.
            log.warning("task ACKs stored; their effects stopped short: %s", exc)
        except BaseException:
            self._lock.release()
            raise
        self._after(self._drain_and_release())

    async def _drain_and_release(self) -> None:
        try:
            await self._drain()
        except (StoreError, ApiaryError) as exc:
            log.warning("dispatch after task ACKs stopped short: %s", exc)
        except Exception:  # nobody awaits this: a bug must still be seen
            log.exception("dispatch after task ACKs failed")
        finally:
            self._lock.release()

    async def failed(self, error: BaseException, in_doubt: bool) -> None:
        try:
            if in_doubt:
                await self._acks.in_doubt(self._joined, error)
        finally:
            self._lock.release()


def _outcome(arrival: Arrival) -> SubmitResult | Exception:
    """A decided arrival's outcome, or the exception deciding it raised."""
    exc = arrival.outcome.exception()
    if exc is None:
        return arrival.outcome.result()
    if isinstance(exc, Exception):
        return exc
    raise exc


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
