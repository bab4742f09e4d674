"""Runtime agent tasks' runs as Scheduler tasks: the runtime task machine's effects
(core/runtime/tasks.py) performed on Apiary's engine.

Each run is one Scheduler task submitted to the task's agent (or capability queue) by the
task's owner, its id chosen and stored before it is submitted (a restart submits the same
task again, which the Scheduler answers as the one it knows). A follower per run
(`Scheduler.watch_tasks`) turns its changes into the task's inputs until it ends. Stopping a
run (pause, cancel) cancels its Scheduler task while it waits and asks the agent to stop it
while it runs: cooperative preemption whose reason starts `interrupt:`, so that the SDK's
runner fails it `cancelled` at its next safe point (a yield would run it again from the
start, which is what resume_task's new run does anyway); an agent that yields it instead has
it cancelled back in its queue.

Everything here runs with the control plane's lock held; `load` and the followers take it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Final

from apiary.controlplane.facts import RUNTIME_ACTOR, FactWriter
from apiary.controlplane.following import TaskFollowers
from apiary.controlplane.turns import JSON, RESULT_INLINE_BYTES, submitter_of
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.limits import utf8_size
from apiary.core.records import TaskRecord
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.jobs import JobRecord
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import RuntimeWrite
from apiary.core.runtime.task_records import CommandKeyRecord, RuntimeTaskRecord, TaskRunRecord
from apiary.core.runtime.task_views import error_of
from apiary.core.runtime.tasks import (
    Intent,
    RunState,
    RuntimeTaskEffect,
    RuntimeTaskInput,
    RuntimeTaskMachine,
    RuntimeTaskState,
    run_input,
    run_state,
)
from apiary.core.runtime.turns import INTERRUPT_PREFIX
from apiary.core.runtime.views import json_value
from apiary.engine.scheduler.scheduler import Scheduler, Submission
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyInProgressError,
    ApiaryError,
    NotFoundError,
)

log = logging.getLogger("apiary.controlplane")

_T = RuntimeEventType
_I = RuntimeTaskInput
_E = RuntimeTaskEffect
_REASONS: Final = {_I.START: "start", _I.RESUME: "resume", _I.RETRY: "retry"}
_RUN_INPUTS: Final = frozenset({
    _I.REFUSE, _I.DISPATCH, _I.RUN, _I.REQUEUE, _I.COMPLETE_RUN, _I.FAIL_RUN, _I.STOP_RUN,
    _I.LOSE,
})  # fmt: skip

CancelChildren = Callable[[RuntimeTaskRecord, str], Awaitable[None]]
Along = Callable[
    [RuntimeTaskRecord, RuntimeTaskRecord], Awaitable[tuple[tuple[JobRecord, ...], list[Fact]]]
]
"""What a task's change from the first record to the second brings along in its write:
its job as it stands after it, with the job's events (controlplane/jobs.py); raising
refuses the change."""


def run_params(task: RuntimeTaskRecord, run: TaskRunRecord, objective: str) -> bytes:
    """What the agent receives for a run: the task's ids, its objective and input."""
    head = {"taskId": task.task_id, "runId": run.run_id, "attempt": run.attempt}
    if objective:
        head["objective"] = objective
    ids = json.dumps(head, separators=(",", ":"), ensure_ascii=False)
    return f'{ids[:-1]},"input":{task.input_json}}}'.encode()


class TaskRuns:
    """Steps runtime tasks and performs their effects (module docstring)."""

    def __init__(
        self, facts: FactWriter, scheduler: Scheduler, clock: Clock, ids: IdGenerator,
        lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._scheduler = scheduler
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._followers = TaskFollowers(scheduler, lock, "run")
        self.pending_key: CommandKeyRecord | None = None
        """A command's idempotency key, stored with the command's first write."""
        self.cancel_children: CancelChildren | None = None
        self.along: Along | None = None

    # ------------------------------------------------------------------ writing

    async def commit(
        self, tasks: tuple[RuntimeTaskRecord, ...], facts: list[Fact], actor: str,
        runs: tuple[TaskRunRecord, ...] = (), **more: Any,
    ) -> None:  # fmt: skip
        keys = (self.pending_key,) if self.pending_key is not None else ()
        self.pending_key = None
        write = RuntimeWrite(tasks=tasks, runs=runs, keys=keys, **more)
        await self._facts.commit(write, facts, actor)

    def fact(
        self, kind: str, of: RuntimeTaskRecord, run: TaskRunRecord | None = None,
        payload: dict[str, Any] | None = None, **extra: Any,
    ) -> Fact:  # fmt: skip
        """The contract event `kind` of the task `of` as it stands now (`extra`: more
        properties of the event; None ones left out)."""
        if run is not None:
            extra.setdefault("attemptId", f"{run.task_id}#{run.attempt}")
        extra = {key: value for key, value in extra.items() if value is not None}
        return Fact(
            kind, of.session_id, of.thread_id, task_id=of.task_id,
            run_id=run.run_id if run is not None else of.current_run_id, status=of.state,
            status_reason=of.status_reason, payload=payload, agent_id=of.agent_id,
            extra=extra,
        )  # fmt: skip

    def _payload(
        self, kind: str, task: RuntimeTaskRecord, run: TaskRunRecord | None
    ) -> dict[str, Any] | None:
        if kind == _T.TASK_COMPLETED and task.result_json:
            size = utf8_size(task.result_json)
            if size <= RESULT_INLINE_BYTES:
                return {"result": json_value(task.result_json)}
            return {"resultSize": size}
        if kind in (_T.TASK_FAILED, _T.TASK_LOST) and task.error_code:
            return {"error": error_of(task.error_code, task.message)}
        if kind == _T.TASK_ATTEMPT_FAILED and run is not None:
            return {
                "status": run.state, "retryable": True,
                "failureCategory": run.error_code or "failed",
                "error": error_of(run.error_code, run.message),
                "nextAttemptPolicy": "manual_or_policy_retry",
            }  # fmt: skip
        if kind == _T.TASK_ATTEMPT_COMPLETED and run is not None:
            return {"status": run.state}
        if kind in (_T.TASK_ATTEMPT_STARTED, _T.TASK_RETRYING, _T.TASK_RESUMED, _T.TASK_STARTED):
            return {"attempt": task.run_count, "reason": run.reason if run else ""}
        if kind == _T.RUN_STATUS and run is not None:
            return {"status": run.state}
        if kind in (_T.TASK_CANCEL_REQUESTED, _T.TASK_CANCELLED, _T.TASK_PAUSED):
            return {"reason": task.intent_reason or None}
        if kind == _T.TASK_UPDATED and task.intent:
            return {"intent": task.intent, "reason": task.intent_reason or None}
        return None

    # ------------------------------------------------------------------ stepping

    async def apply(
        self, task: RuntimeTaskRecord, event: RuntimeTaskInput, actor: str, *,
        run_changes: dict[str, Any] | None = None, **changes: Any,
    ) -> RuntimeTaskRecord:  # fmt: skip
        """Step the task on `event`, store it (and its current or new run) with the row's
        events, then perform the row's other effects; the task as it stands after them.
        IllegalTransitionError (nothing done) when the table has no row."""
        step = RuntimeTaskMachine.step(RuntimeTaskState(task.state), event)
        now = self._clock.now()
        after = replace(task, state=step.state.value, updated_at=now, **changes)
        run: TaskRunRecord | None = None
        if _E.SUBMIT_RUN in step.effects:
            run = TaskRunRecord(
                self._ids.new_id(), task.task_id, task.run_count + 1, RunState.QUEUED.value,
                _REASONS[event], now, now, agent_id=task.agent_id,
            )  # fmt: skip
            after = replace(
                after, run_count=run.attempt, current_run_id=run.run_id, ended_at=0.0,
                started_at=task.started_at or now, error_code="", message="", result_json="",
                intent="", intent_reason="",
            )  # fmt: skip
        elif event in _RUN_INPUTS and task.current_run_id:
            run = await self._store.run(task.current_run_id)
            if run is not None and run_changes:
                run = replace(run, updated_at=now, **run_changes)
        if step.state.terminal or step.state is RuntimeTaskState.PAUSED:
            # The intent is reached (or moot); its reason stays with the task.
            after = replace(after, intent="", ended_at=now if step.state.terminal else 0.0)
        facts = [
            self.fact(kind, after, run, self._payload(kind, after, run)) for kind in step.events
        ]
        if _E.PERSIST in step.effects:
            jobs: tuple[JobRecord, ...] = ()
            if self.along is not None:
                jobs, brought = await self.along(task, after)
                facts += brought
            await self.commit((after,), facts, actor, (run,) if run is not None else (), jobs=jobs)
        for effect in step.effects:
            if effect is _E.SUBMIT_RUN and run is not None:
                after = await self._submit(after, run, actor)
            elif effect is _E.STOP_RUN:
                after = await self.stop_run(after, actor)
            elif effect is _E.CANCEL_CHILDREN and self.cancel_children is not None:
                await self.cancel_children(after, actor)
        return (await self._store.task(after.task_id)) or after

    async def _submit(
        self, task: RuntimeTaskRecord, run: TaskRunRecord, actor: str
    ) -> RuntimeTaskRecord:
        objective = str(json.loads(task.meta_json or "{}").get("objective") or "")
        submission = Submission(
            agent_id=task.agent_id, task_id=run.run_id, priority=task.priority,
            params=run_params(task, run, objective), content_type=JSON,
            scope=task.scope, submitter=submitter_of(task.owner), capability=task.capability,
        )  # fmt: skip
        try:
            result = await self._scheduler.submit(submission)
        except ApiaryError as exc:
            return await self._refused(task, exc.code, exc.message, actor)
        if not result.accepted or result.task is None:
            code = result.error_code or "internal_error"
            return await self._refused(task, code, result.reason, actor)
        self.follow(task, run.run_id)
        return task

    async def _refused(
        self, task: RuntimeTaskRecord, code: str, message: str, actor: str
    ) -> RuntimeTaskRecord:
        ended = {"state": RunState.FAILED.value, "error_code": code, "message": message,
                 "ended_at": self._clock.now()}  # fmt: skip
        return await self.apply(
            task, _I.REFUSE, actor, run_changes=ended, error_code=code, message=message
        )

    # ------------------------------------------------------------------ following

    async def load(self) -> int:
        """After a (re)start: follow every run in hand (submitting again one the Scheduler
        never got); returns how many tasks had one."""
        async with self._lock:
            found = await self._store.open_tasks()
            for task in found:
                run = await self._store.run(task.current_run_id)
                if run is None:
                    log.error("runtime task %s has no stored run %s", task.task_id,
                              task.current_run_id)  # fmt: skip
                    continue
                try:
                    await self._scheduler.find(run.run_id)
                except NotFoundError:
                    await self._submit(task, run, RUNTIME_ACTOR)
                else:
                    self.follow(task, run.run_id)
            return len(found)

    async def close(self) -> None:
        await self._followers.close()

    def follow(self, task: RuntimeTaskRecord, run_id: str) -> None:
        """Follow the run's Scheduler task until the run ends (one follower per run)."""
        task_id = task.task_id
        self._followers.follow(
            run_id, run_id, submitter_of(task.owner),
            partial(self.run_changed, task_id, run_id), partial(self._lost, task_id, run_id),
        )  # fmt: skip

    async def run_changed(self, task_id: str, run_id: str, found: TaskRecord) -> bool:
        """A stored state of a run's Scheduler task; whether the run has ended for the
        task (or is no longer its current one)."""
        task = await self._store.task(task_id)
        if task is None or task.current_run_id != run_id:
            return True
        state = RuntimeTaskState(task.state)
        event = run_input(state, Intent(task.intent), found)
        if event is None:
            return not state.active
        now = self._clock.now()
        ran = run_state(found)
        run_changes: dict[str, Any] = {"state": ran.value, "agent_id": found.agent_id}
        changes: dict[str, Any] = {}
        if found.agent_id and not task.capability:
            changes["agent_id"] = found.agent_id
        if event is _I.RUN:
            run_changes["started_at"] = now
        if ran.terminal:
            run_changes["ended_at"] = now
            run_changes["error_code"] = found.error_code
            run_changes["message"] = found.note if found.error_code else ""
        if event is _I.COMPLETE_RUN:
            changes["result_json"] = found.result
        elif event is _I.FAIL_RUN and state is not RuntimeTaskState.CANCELLING:
            changes["error_code"] = found.error_code or "internal_error"
            changes["message"] = found.note
        after = await self.apply(task, event, RUNTIME_ACTOR, run_changes=run_changes, **changes)
        if event is _I.REQUEUE and after.intent:
            after = await self.stop_run(after, RUNTIME_ACTOR)
        return not RuntimeTaskState(after.state).active

    async def _lost(self, task_id: str, run_id: str) -> None:
        task = await self._store.task(task_id)
        if task is None or task.current_run_id != run_id:
            return
        if not RuntimeTaskState(task.state).active:
            return
        message = f"run {run_id} (its Scheduler task) cannot be found"
        ended = {"state": RunState.FAILED.value, "error_code": "task_lost", "message": message,
                 "ended_at": self._clock.now()}  # fmt: skip
        await self.apply(
            task, _I.LOSE, RUNTIME_ACTOR, run_changes=ended, error_code="task_lost",
            message=message,
        )  # fmt: skip

    async def complete_run(
        self, task: RuntimeTaskRecord, agent_id: str, *, result: str, error_code: str,
        message: str,
    ) -> RuntimeTaskRecord:  # fmt: skip
        """The current run's outcome from the agent holding it (Scheduler.complete, as
        TaskQueryService.CompleteTask), then the task's."""
        ended = await self._scheduler.complete(
            task.current_run_id, agent_id, result=result, error_code=error_code, message=message
        )
        await self.run_changed(task.task_id, task.current_run_id, ended)
        return (await self._store.task(task.task_id)) or task

    async def stop_run(self, task: RuntimeTaskRecord, actor: str) -> RuntimeTaskRecord:
        """Cancel the current run while it waits; ask its agent to stop it while it runs (a
        run that ended already reaches its follower)."""
        run_id = task.current_run_id
        why = task.intent_reason or task.intent or "stopped"
        try:
            ended = await self._scheduler.cancel(run_id, why, actor)
        except AlreadyInProgressError:
            await self._preempt(task, why)
            return task
        except AlreadyCompletedError:
            return task
        except NotFoundError:
            await self._lost(task.task_id, run_id)
        else:
            await self.run_changed(task.task_id, run_id, ended)
        return (await self._store.task(task.task_id)) or task

    async def _preempt(self, task: RuntimeTaskRecord, why: str) -> None:
        try:
            holder = (await self._scheduler.find(task.current_run_id)).agent_id
        except NotFoundError:
            return
        asked = await self._scheduler.request_preemption(
            holder, task.current_run_id, f"{INTERRUPT_PREFIX} {why}"
        )
        if not asked:
            log.info("task %s: its run %s was not preemptible now", task.task_id,
                     task.current_run_id)  # fmt: skip
