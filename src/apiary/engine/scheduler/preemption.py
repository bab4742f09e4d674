"""The Scheduler's cooperative preemption (RFC 7.1, 7.2; C.4, C.5): preempt requests, the
PreemptionMachine's steps and their effects (control commands, deadlines on the Scheduler's
timer heap, forced termination, requeueing a yielded task), and the commands a running agent
sends the Scheduler (enter_section, leave_section, progress, report). The rules are
core/preemption.py, and for an agent holding several tasks (or a shared queue's agents)
core/tasks/capacity.py picks what a higher priority preempts and recalls; the wire protocol
is in docs/scheduler.md.

Everything here runs with the Scheduler's lock held: the entry points (`request`,
`on_command`) take it, the rest is called from Scheduler code that holds it. A `report`
(model and reasoning progress, core/runtime/model_reports.py) is the exception: checked to
come from the agent holding the task, it goes to the `reporter` (the runtime control plane)
without the lock, which the reporter's own lock must never wait behind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from apiary.core.agent_lifecycle import AgentInput
from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.core.machine import IllegalTransitionError
from apiary.core.preemption import (
    PreemptionEffect,
    PreemptionInput,
    PreemptionMachine,
    PreemptionStep,
)
from apiary.core.records import TaskRecord
from apiary.core.runtime.turns import INTERRUPT_PREFIX
from apiary.core.tasks.capacity import Victims, any_below, victims
from apiary.core.tasks.machine import TaskInput
from apiary.core.tasks.result import result_from_note
from apiary.engine.eventlog import EventRecorder
from apiary.engine.lifecycle import Lifecycles
from apiary.engine.notices import SCHEDULER, NoticeFactory
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.engine.scheduler.agents import drive
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.pools import AgentPools
from apiary.engine.scheduler.transitions import Prepared, TaskTransitions, requeued
from apiary.engine.scheduler.wakeups import Wakeups, preempt_key
from apiary.engine.scheduler.windows import AgentWindows
from apiary.engine.settings import SchedulerSettings
from apiary.errors import PermissionDeniedError, UnavailableError, ValidationError
from apiary.store.errors import StoreError

Reporter = Callable[[TaskRecord, dict[str, Any]], Awaitable[None]]
"""Takes a `report` command of the agent holding the task (its body as sent)."""

_YIELD = PreemptionInput.SAFE_POINT_YIELD
_TERMINATED = PreemptionInput.TERMINATED
_REQUEST = PreemptionInput.REQUEST_PREEMPT
_YIELDED = "yielded at a safe point"
"""The note of a task requeued by its yield."""


class SchedulerPreemption:
    """Cooperative preemption of the Scheduler's running tasks."""

    def __init__(
        self,
        live: LiveTasks,
        pools: AgentPools,
        wakeups: Wakeups,
        transitions: TaskTransitions,
        lifecycles: Lifecycles,
        windows: AgentWindows,
        router: Router,
        envelopes: NoticeFactory,
        events: EventRecorder,
        settings: SchedulerSettings,
        clock: Clock,
        lock: asyncio.Lock,
        drain: Callable[[], Awaitable[None]],
        has_room: Callable[[str], bool],
    ) -> None:
        self._live = live
        self._pools = pools
        self._has_room = has_room
        """Whether an agent may take one more task now (`SchedulerDispatch.has_room`)."""
        self._wakeups = wakeups
        self._transitions = transitions
        self._lifecycles = lifecycles
        self._windows = windows
        self._router = router
        self._envelopes = envelopes
        self._events = events
        self._settings = settings
        self._clock = clock
        self._lock = lock
        self._drain = drain
        """Dispatches to the agents woken meanwhile (`SchedulerDispatch.drain`)."""
        self.reporter: Reporter | None = None
        """Takes the running agents' `report` commands (set by the runtime control plane)."""

    async def request(self, agent_id: str, task_id: str, reason: str) -> bool:
        """RequestPreemption: start cooperative preemption of the agent's task `task_id`
        (without one: of its lowest-priority task, the latest dispatched among equals)."""
        async with self._lock:
            held = self._live.holding(agent_id)
            if task_id:
                held = [t for t in held if t.task_id == task_id]
            if not held:
                return False
            order = {t.task_id: i for i, t in enumerate(self._live.holding(agent_id))}
            running = max(held, key=lambda t: (t.priority, order[t.task_id]))
            record = self._live.preemptions.get(running.task_id)
            if record is None or record.state.value != "RUNNING":
                return False
            await self.preempt(running, reason or "operator request")
            await self._drain()
            return True

    async def cancel(self, task: TaskRecord, note: str) -> None:
        """An operator's cancellation of a dispatched task its agent has not read (waiting
        there, prefetched): the agent is asked to give it back, as an interrupt (the SDK
        fails a waiting task with `cancelled` at once, and a task it started meanwhile at
        its next safe point); one given back by a yield ends FAILED `cancelled` then (lock
        held)."""
        self._live.cancelling[task.task_id] = note
        record = self._live.preemptions.get(task.task_id)
        if record is not None and PreemptionMachine.allows(record.state, _REQUEST):
            await self.preempt(task, f"{INTERRUPT_PREFIX} {note}")

    async def maybe_preempt(self, task: TaskRecord) -> str:
        """Preempt for a task just queued that cannot start at once (RFC 7.1): on its agent,
        or on the agent of its shared queue whose lowest-priority running task is lowest
        (core/tasks/capacity.py). Returns what the submission's answer says of it."""
        if not task.queue:
            return await self._preempt_on(task, self._victims(task.agent_id, task))
        agents = [
            a for a in sorted(self._pools.agents_for(task.queue))
            if self._pools.takes(a, task.content_type)
        ]  # fmt: skip
        if any(
            self._has_room(a) and self._live.count(a) < self._pools.concurrency(a) for a in agents
        ):
            return ""  # an agent starts it at once
        found = [(a, self._victims(a, task)) for a in agents]
        chosen = [(a, v) for a, v in found if v.preempt]
        if chosen:
            _, picked = max(chosen, key=lambda av: self._rank(av[1].preempt))
            return await self._preempt_on(task, picked)
        busy = next((v for _, v in found if v.busy), Victims())
        return await self._preempt_on(task, busy)

    def _victims(self, agent_id: str, task: TaskRecord) -> Victims:
        if not any_below(self._live.holding(agent_id), task.priority):
            return Victims()  # (what `victims` finds: nothing to preempt or recall)
        view = self._live.held_view(agent_id)
        return victims(view, self._pools.concurrency(agent_id), task.priority)

    def _rank(self, task_id: str) -> tuple[int, int]:
        """How strongly a running task is the one to preempt: lowest priority, latest."""
        held = self._live.tasks[task_id]
        agent = self._live.holding(held.agent_id)
        return held.priority, [t.task_id for t in agent].index(task_id)

    async def _preempt_on(self, task: TaskRecord, chosen: Victims) -> str:
        why = f"higher-priority task {task.task_id} ({task.priority})"
        for recalled in chosen.recall:
            await self.preempt(self._live.tasks[recalled], f"recalled for {why}")
        if chosen.preempt:
            running = self._live.tasks[chosen.preempt]
            await self.preempt(running, why)
            return f"queued: preempting task {running.task_id} (priority {running.priority})"
        if chosen.busy:
            return f"queued: task {chosen.busy} is already being preempted"
        return ""

    async def preempt(self, running: TaskRecord, reason: str) -> None:
        record = self._live.preemptions[running.task_id]
        step = PreemptionMachine.request_preempt(
            record, self._clock.now(), self._settings.preemption
        )
        await self._events.record(
            "task.preempt_requested", SCHEDULER, correlation_id=running.task_id,
            task_id=running.task_id, agent_id=running.agent_id, reason=reason,
        )  # fmt: skip
        await self.perform(running, step, reason)

    async def deadline(self, task_id: str) -> None:
        """The task's preemption deadline passed (its timer fired)."""
        task = self._live.tasks.get(task_id)
        record = self._live.preemptions.get(task_id)
        if task is None or record is None:
            return
        step = PreemptionMachine.deadline(record, self._clock.now(), self._settings.preemption)
        await self.perform(task, step)

    async def perform(self, task: TaskRecord, step: PreemptionStep, reason: str = "") -> None:
        preemptions = self._live.preemptions
        before = preemptions.get(task.task_id)
        preemptions[task.task_id] = step.record
        if before is not None and before.state is not step.record.state:
            await self._events.record(
                "task.preemption", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
                agent_id=task.agent_id, **{"from": before.state.value,
                                           "to": step.record.state.value},
            )  # fmt: skip
        try:
            await self._effects(task, step, reason)
        except (StoreError, UnavailableError):
            # A task write the store failed changed nothing; nor does the step, so that its
            # input can come again (a FULFILLED "yielded" kept by engine/scheduler/acks.py).
            if before is not None and preemptions.get(task.task_id) is step.record:
                preemptions[task.task_id] = before
            raise

    async def _effects(self, task: TaskRecord, step: PreemptionStep, reason: str) -> None:
        key = preempt_key(task.task_id)
        for effect in step.effects:
            if effect is PreemptionEffect.SEND_PREEMPT_REQUEST:
                await self._control(task, {"command": "preempt_request", "reason": reason})
            elif effect is PreemptionEffect.SEND_TERMINATE:
                await self._control(task, {"command": "terminate", "grace_ms": step.grace_ms})
            elif effect is PreemptionEffect.KILL:
                await self._control(task, {"command": "kill"})
                # The task ends first (forced_preemption): failing the agent then abandons
                # only its other tasks in hand (a shared one goes back to its queue).
                current = self._live.tasks.get(task.task_id)
                if current is not None and self._live.holds(current.agent_id, task.task_id):
                    await self._transitions.end(
                        current, TaskInput.TERMINATE, step.error_code or "forced_preemption",
                        "forced preemption",
                    )  # fmt: skip
                await drive(self._lifecycles, task.agent_id, AgentInput.FAIL,
                            code="forced_preemption")  # fmt: skip
            elif effect is PreemptionEffect.MARK_FAILED:
                # After KILL the task has already ended: ending the stale record again would
                # log it twice and release it twice.
                current = self._live.tasks.get(task.task_id)
                if current is not None and self._live.holds(current.agent_id, task.task_id):
                    await self._transitions.end(
                        current, TaskInput.TERMINATE, step.error_code or "forced_preemption",
                        "forced preemption",
                    )  # fmt: skip
            elif effect is PreemptionEffect.REQUEUE_TASK:
                cancelled = self._live.cancelling.get(task.task_id)
                changes = {"updated_at": self._clock.now(), "note": _YIELDED, **requeued(task)}
                task = await self._transitions.apply(
                    task, TaskInput.YIELD, changes, reason=_YIELDED
                )
                if cancelled is not None:  # given back: it ends as cancelled (`cancel`)
                    await self._transitions.end(task, TaskInput.CANCEL, "cancelled", cancelled)
            elif effect is PreemptionEffect.DISPATCH_HIGHER:
                self._wakeups.wake(task.agent_id)
            elif effect is PreemptionEffect.START_TIMER and step.record.deadline is not None:
                self._wakeups.arm(key, step.record.deadline)
            elif effect is PreemptionEffect.CANCEL_TIMER:
                self._wakeups.timers.cancel(key)

    async def revoke(self, agent_id: str, task: TaskRecord, message_id: str) -> None:
        """`agent_id` read `message_id`, a dispatch of `task` taken back from it when it was
        lost, or one the store failed (the task went back to its queue and may run
        elsewhere): tell it to stop that attempt (and that one only: `message_id` names it)."""
        task_id = task.task_id
        why = "revoked: this dispatch was taken back (this agent was lost, or it was not stored)"
        body = {"command": "terminate", "task_id": task_id, "message_id": message_id,
                "grace_ms": 0, "reason": why}  # fmt: skip
        env = self._envelopes.control(body, task.flow_id)
        (outcome,) = await self._router.send_many([Outbound(env, agent_id, lane="PRIVILEGED")])
        await self._events.record(
            "task.revoked", SCHEDULER, correlation_id=task_id, task_id=task_id,
            agent_id=agent_id, stale_message_id=message_id, message_id=env.message_id,
            accepted=outcome.accepted, reason=why,
        )  # fmt: skip

    async def _control(self, task: TaskRecord, body: dict[str, Any]) -> None:
        env = self._envelopes.control({**body, "task_id": task.task_id}, task.flow_id)
        (outcome,) = await self._router.send_many([Outbound(env, task.agent_id, lane="PRIVILEGED")])
        await self._events.record(
            "task.control", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
            agent_id=task.agent_id, command=body["command"], message_id=env.message_id,
            accepted=outcome.accepted, reason=outcome.reason,
        )  # fmt: skip

    # ------------------------------------------------------------------ the agent's side

    async def fulfilled(self, task: TaskRecord, note: str) -> None:
        """A FULFILLED ACK: a yield at a safe point or a termination the preemption expects
        (by its note), else the task completed: its result is the note's (core/tasks/result.py)."""
        record = self._live.preemptions[task.task_id]
        now = self._clock.now()
        said = note.lower()  # the note itself keeps its case: it may carry a result (JSON)
        if said.startswith("yielded") and PreemptionMachine.allows(record.state, _YIELD):
            await self.perform(task, PreemptionMachine.safe_point_yield(record, now))
        elif said.startswith("terminated") and PreemptionMachine.allows(record.state, _TERMINATED):
            await self.perform(task, PreemptionMachine.terminated(record, now))
            await self._windows.freed(task.agent_id)
        else:
            await self._transitions.end(task, TaskInput.FULFIL, "", note, result_from_note(note))

    def prepare_fulfilled(
        self, task: TaskRecord, note: str, moved: Mapping[str, str] | None = None
    ) -> Prepared | None:
        """`fulfilled` as `TaskTransitions.prepare` does it, for a FULFILLED ACK that completes
        the task (its `Prepared` ending; `moved`: more of its event's details); None for a
        note that a preemption in progress may take as a yield or a termination (`fulfilled`
        decides those)."""
        said = note.lower()
        if said.startswith(("yielded", "terminated")):
            return None
        return self._transitions.prepare_end(
            task, TaskInput.FULFIL, "", note, result_from_note(note), moved=moved
        )

    async def on_command(self, env: Envelope) -> None:
        """A running agent's CONTROL command: enter_section, leave_section, progress or
        report."""
        try:
            body = json.loads(env.payload)
        except ValueError:
            raise ValidationError.for_field("payload", "must be a JSON object") from None
        if not isinstance(body, dict):
            raise ValidationError.for_field("payload", "must be a JSON object")
        command = body.get("command")
        if command == "report":
            held = self._held(env, body)  # no await before the check: as under the lock
            if self.reporter is None:
                raise UnavailableError("no runtime control plane takes reports here")
            await self.reporter(held, body)
            return
        async with self._lock:
            task = self._held(env, body)
            if command == "progress":
                await self._progress(task, body)
                return
            record = self._live.preemptions[task.task_id]
            now = self._clock.now()
            max_ms = body.get("max_duration_ms")
            if command == "enter_section" and (
                isinstance(max_ms, bool) or not isinstance(max_ms, int) or max_ms <= 0
            ):
                raise ValidationError.for_field(
                    "max_duration_ms", "a non-preemptible section needs a maximum duration"
                )
            cap = self._settings.preemption.max_section_s
            if command == "enter_section" and isinstance(max_ms, int) and max_ms > cap * 1000:
                raise ValidationError.for_field(
                    "max_duration_ms",
                    f"{max_ms / 1000:g} s is longer than the {cap:g} s a non-preemptible"
                    " section may last (sections are for short critical work, RFC 7.2;"
                    " [scheduler.preemption] max_section_s)",
                )
            if command not in ("enter_section", "leave_section"):
                raise ValidationError.for_field(
                    "command",
                    f"{command!r} is not enter_section, leave_section, progress or report",
                )
            try:
                if command == "enter_section":
                    step = PreemptionMachine.enter_section(record, int(max_ms or 0) / 1000, now)
                else:
                    step = PreemptionMachine.leave_section(record, now, self._settings.preemption)
            except IllegalTransitionError as exc:
                raise ValidationError.for_field("command", str(exc)) from None
            await self.perform(task, step)
            await self._drain()

    def _held(self, env: Envelope, body: dict[str, Any]) -> TaskRecord:
        """The running task the command names, held by the agent that sent it."""
        task = self._live.tasks.get(str(body.get("task_id") or ""))
        if task is None or not self._live.holds(task.agent_id, task.task_id):
            raise ValidationError.for_field("task_id", "names no task running now")
        if env.producer_id != task.agent_id:
            raise PermissionDeniedError(
                f"{env.producer_id} does not run task {task.task_id}",
                {"task_id": task.task_id, "field": "task_id"},
            )
        return task

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
