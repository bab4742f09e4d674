"""The Scheduler's cooperative preemption (RFC 7.1, 7.2; C.4, C.5): preempt requests, the
PreemptionMachine's steps and their effects (control commands, deadlines on the Scheduler's
timer heap, forced termination, requeueing a yielded task), and the commands a running agent
sends the Scheduler (enter_section, leave_section, progress). The rules are
core/preemption.py; the wire protocol is in docs/scheduler.md.

Everything here runs with the Scheduler's lock held: the entry points (`request`,
`on_command`) take it, the rest is called from Scheduler code that holds it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from apiary.core.agent_lifecycle import AgentInput
from apiary.core.envelope import Envelope
from apiary.core.preemption import IllegalTransitionError as PreemptionIllegal
from apiary.core.preemption import (
    PreemptionEffect,
    PreemptionInput,
    PreemptionMachine,
    PreemptionStep,
    should_preempt,
)
from apiary.core.records import TaskRecord, TaskState
from apiary.engine.notices import SCHEDULER
from apiary.engine.router.admission import Outbound
from apiary.engine.scheduler.agents import drive, finished
from apiary.engine.scheduler.dispatch import SEP
from apiary.errors import PermissionDeniedError, ValidationError

if TYPE_CHECKING:
    from apiary.engine.scheduler.scheduler import Scheduler

_YIELD = PreemptionInput.SAFE_POINT_YIELD
_TERMINATED = PreemptionInput.TERMINATED


def timer_key(task_id: str) -> str:
    """The task's preemption deadline on the Scheduler's timer heap."""
    return f"preempt{SEP}{task_id}"


class SchedulerPreemption:
    """Cooperative preemption of the Scheduler's running tasks."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def request(self, agent_id: str, task_id: str, reason: str) -> bool:
        """RequestPreemption: start cooperative preemption of the agent's running task."""
        s = self._scheduler
        async with s._lock:
            running = s.running(agent_id)
            if running is None or (task_id and running.task_id != task_id):
                return False
            record = s._preemptions.get(running.task_id)
            if record is None or record.state.value != "RUNNING":
                return False
            await self.preempt(running, reason or "operator request")
            await s._drain_wakeups()
            return True

    async def maybe_preempt(self, task: TaskRecord) -> str:
        s = self._scheduler
        running = s.running(task.agent_id)
        if running is None or not should_preempt(running.priority, task.priority):
            return ""
        record = s._preemptions.get(running.task_id)
        if record is None or record.state.value not in ("RUNNING", "NON_PREEMPTIBLE"):
            return f"queued: task {running.task_id} is already being preempted"
        await self.preempt(running, f"higher-priority task {task.task_id} ({task.priority})")
        return f"queued: preempting task {running.task_id} (priority {running.priority})"

    async def preempt(self, running: TaskRecord, reason: str) -> None:
        s = self._scheduler
        record = s._preemptions[running.task_id]
        step = PreemptionMachine.request_preempt(record, s._clock.now(), s.settings.preemption)
        await s._events.record(
            "task.preempt_requested", SCHEDULER, correlation_id=running.task_id,
            task_id=running.task_id, agent_id=running.agent_id, reason=reason,
        )  # fmt: skip
        await self.perform(running, step, reason)

    async def deadline(self, task_id: str) -> None:
        """The task's preemption deadline passed (its timer fired)."""
        s = self._scheduler
        task = s._tasks.get(task_id)
        record = s._preemptions.get(task_id)
        if task is None or record is None:
            return
        step = PreemptionMachine.deadline(record, s._clock.now(), s.settings.preemption)
        await self.perform(task, step)

    async def perform(self, task: TaskRecord, step: PreemptionStep, reason: str = "") -> None:
        s = self._scheduler
        before = s._preemptions.get(task.task_id)
        s._preemptions[task.task_id] = step.record
        if before is not None and before.state is not step.record.state:
            await s._events.record(
                "task.preemption", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
                agent_id=task.agent_id, **{"from": before.state.value,
                                           "to": step.record.state.value},
            )  # fmt: skip
        key = timer_key(task.task_id)
        for effect in step.effects:
            if effect is PreemptionEffect.SEND_PREEMPT_REQUEST:
                await self._control(task, {"command": "preempt_request", "reason": reason})
            elif effect is PreemptionEffect.SEND_TERMINATE:
                await self._control(task, {"command": "terminate", "grace_ms": step.grace_ms})
            elif effect is PreemptionEffect.KILL:
                await self._control(task, {"command": "kill"})
                await drive(s, task.agent_id, AgentInput.FAIL, code="forced_preemption")
            elif effect is PreemptionEffect.MARK_FAILED:
                # After KILL the agent's FAIL has already ended the task (ABANDON_TASK):
                # ending the stale record again would log it twice and release it twice.
                current = s._tasks.get(task.task_id)
                if current is not None:
                    await s._fail(current, step.error_code or "forced_preemption",
                                  "forced preemption")  # fmt: skip
            elif effect is PreemptionEffect.REQUEUE_TASK:
                await self._requeue(task, "yielded at a safe point")
            elif effect is PreemptionEffect.DISPATCH_HIGHER:
                s.wake(task.agent_id)
            elif effect is PreemptionEffect.START_TIMER and step.record.deadline is not None:
                s._timers.arm(key, step.record.deadline)
                s._wake.set()
            elif effect is PreemptionEffect.CANCEL_TIMER:
                s._timers.cancel(key)

    async def _control(self, task: TaskRecord, body: dict[str, Any]) -> None:
        s = self._scheduler
        env = s._envelopes.control({**body, "task_id": task.task_id}, task.flow_id)
        (outcome,) = await s._router.send_many([Outbound(env, task.agent_id, lane="PRIVILEGED")])
        await s._events.record(
            "task.control", SCHEDULER, correlation_id=task.task_id, task_id=task.task_id,
            agent_id=task.agent_id, command=body["command"], message_id=env.message_id,
            accepted=outcome.accepted, reason=outcome.reason,
        )  # fmt: skip

    async def _requeue(self, task: TaskRecord, why: str) -> None:
        s = self._scheduler
        s._release(task)
        task = replace(task, state=TaskState.QUEUED.value, updated_at=s._clock.now(),
                       note=why)  # fmt: skip
        await s._save(task, "task.requeued", reason=why)
        s._push(task)
        await finished(s, task.agent_id)
        s.wake(task.agent_id)

    # ------------------------------------------------------------------ the agent's side

    async def fulfilled(self, task: TaskRecord, note: str) -> None:
        """A FULFILLED ACK: a yield at a safe point or a termination the preemption expects
        (by its note), else the task completed."""
        s = self._scheduler
        record = s._preemptions[task.task_id]
        now = s._clock.now()
        said = note.lower()  # the note itself keeps its case: it may carry a result (JSON)
        if said.startswith("yielded") and PreemptionMachine.allows(record.state, _YIELD):
            await self.perform(task, PreemptionMachine.safe_point_yield(record, now))
        elif said.startswith("terminated") and PreemptionMachine.allows(record.state, _TERMINATED):
            await self.perform(task, PreemptionMachine.terminated(record, now))
            await finished(s, task.agent_id)
        else:
            await s._finish(task, TaskState.COMPLETED, "", note)
            await finished(s, task.agent_id)

    async def on_command(self, env: Envelope) -> None:
        """A running agent's CONTROL command: enter_section, leave_section or progress."""
        s = self._scheduler
        try:
            body = json.loads(env.payload)
        except ValueError:
            raise ValidationError.for_field("payload", "must be a JSON object") from None
        if not isinstance(body, dict):
            raise ValidationError.for_field("payload", "must be a JSON object")
        command = body.get("command")
        async with s._lock:
            task = s._tasks.get(str(body.get("task_id") or ""))
            if task is None or s._running.get(task.agent_id) != task.task_id:
                raise ValidationError.for_field("task_id", "names no task running now")
            if env.producer_id != task.agent_id:
                raise PermissionDeniedError(
                    f"{env.producer_id} does not run task {task.task_id}",
                    {"task_id": task.task_id},
                )
            if command == "progress":
                await self._progress(task, body)
                return
            record = s._preemptions[task.task_id]
            now = s._clock.now()
            max_ms = body.get("max_duration_ms")
            if command == "enter_section" and (
                isinstance(max_ms, bool) or not isinstance(max_ms, int) or max_ms <= 0
            ):
                raise ValidationError.for_field(
                    "max_duration_ms", "a non-preemptible section needs a maximum duration"
                )
            cap = s.settings.preemption.max_section_s
            if command == "enter_section" and isinstance(max_ms, int) and max_ms > cap * 1000:
                raise ValidationError.for_field(
                    "max_duration_ms",
                    f"{max_ms / 1000:g} s is longer than the {cap:g} s a non-preemptible"
                    " section may last (sections are for short critical work, RFC 7.2;"
                    " [scheduler.preemption] max_section_s)",
                )
            if command not in ("enter_section", "leave_section"):
                raise ValidationError.for_field(
                    "command", f"{command!r} is not enter_section, leave_section or progress"
                )
            try:
                if command == "enter_section":
                    step = PreemptionMachine.enter_section(record, int(max_ms or 0) / 1000, now)
                else:
                    step = PreemptionMachine.leave_section(record, now, s.settings.preemption)
            except PreemptionIllegal as exc:
                raise ValidationError.for_field("command", str(exc)) from None
            await self.perform(task, step)
            await s._drain_wakeups()

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
        await self._scheduler._events.record(
            "task.progress", task.agent_id, correlation_id=task.task_id, agent_id=task.agent_id,
            task_id=task.task_id, fraction=float(fraction), note=note[:1000],
        )  # fmt: skip
