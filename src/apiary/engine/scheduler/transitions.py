"""The task machine's engine: every change of a task's state is `TaskTransitions.apply`,
which steps core/tasks/machine.py and performs the row's effects in their order (the store,
the live tasks and their watchers, the event log, the activity buffer, the agent's
lifecycle, end listeners). The store's write comes first (the transition's own, or, for a
transition `prepare`d, another write it commits with: the dispatch's envelope admission,
the router's commit of the agent's ACK (engine/router/ack_joins.py); then `stored`): a
transition whose write fails
raises having changed nothing, in memory as in the store (a write the lost connection cut
short counts as done when the record read back shows it committed; the callers decide what
follows a failed one:
engine/scheduler/dispatch.py puts the task back in its queue, engine/scheduler/acks.py keeps
the agent's ACK and applies it again).

Called with the Scheduler's lock held.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final

from apiary.core.activity import ActivityEntry
from apiary.core.clock import Clock
from apiary.core.events import EventDraft
from apiary.core.records import TaskRecord, TaskState
from apiary.core.tasks.machine import TaskEffect, TaskInput, TaskMachine, TaskStep
from apiary.engine.activity import Activity
from apiary.engine.conflict_gate import ConflictGate
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import SCHEDULER
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.wakeups import Wakeups, shared_target
from apiary.engine.scheduler.watch import TaskWatch
from apiary.engine.scheduler.windows import AgentWindows
from apiary.errors import ApiaryError
from apiary.store.errors import StoreError, StoreUnavailableError
from apiary.store.protocols import TaskStore

log = logging.getLogger(__name__)

_E = TaskEffect
_TEXT: Final = {state: state.value for state in TaskState}
"""Each state's text: events and the activity buffer carry plain strings."""
IN_DOUBT_WAIT_S: Final = 2.0
"""How long a task write whose connection was lost waits to learn whether it committed."""
ACTIVITY_KEYS: Final = ("repo_id", "worktree_id", "branch", "description")
"""Fields of a task's JSON params copied into its activity entry (RFC 10)."""


def activity_entry(task: TaskRecord) -> ActivityEntry:
    """The activity entry of a task dispatched to its agent (RFC 10): the agent and task, and
    the ACTIVITY_KEYS its JSON params carry (ValidationError when one is not acceptable)."""
    try:
        body = json.loads(task.params) if _may_name_activity(task.params) else None
    except (ValueError, RecursionError):  # not JSON (or nested past the parser's depth)
        body = None
    found = body if isinstance(body, dict) else {}
    repo_id, worktree_id, branch, description = (
        str(found[key]) if key in found else "" for key in ACTIVITY_KEYS
    )
    return ActivityEntry(task.agent_id, task.task_id, repo_id, worktree_id, branch, description)


_ACTIVITY_NAMES: Final = tuple(f'"{key}"'.encode() for key in ACTIVITY_KEYS)


def _may_name_activity(params: bytes) -> bool:
    """Whether JSON `params` may hold one of ACTIVITY_KEYS: it names one as written, or
    escapes a character (a key may be spelt with escapes). Params that hold none are not
    parsed (a dispatch does not parse what only its agent reads)."""
    return b"\\" in params or any(name in params for name in _ACTIVITY_NAMES)


def _activity_outcome(step: TaskStep, after: TaskRecord) -> str:
    """How a task's activity entry is closed (COMPLETE_ACTIVITY): as the task ended, or, for
    an attempt back in its queue, COMPLETED when it yielded (the one requeue that frees its
    agent) and FAILED otherwise (its ACK deadline passed, its agent was lost)."""
    if after.state.terminal:
        return _TEXT[after.state]
    return "COMPLETED" if _E.FREE_AGENT in step.effects else "FAILED"


def logs_messages(task: TaskRecord) -> bool:
    """Whether the task's own events record the states of its dispatches' messages too
    (docs/scheduler.md, "Events of a task's messages"): when they are found under the same
    correlation id, the task's, which is its flow's unless it was given one of its own (a
    workflow run's, a control-plane thread's): then the router logs the messages' events
    under the flow, as any message's."""
    return task.flow_id == task.task_id


def requeued(task: TaskRecord) -> dict[str, Any]:
    """The record's changes when it goes back to its queue: a shared task is nobody's until
    an agent takes it again."""
    return {"agent_id": ""} if task.queue else {}


@dataclass(frozen=True, slots=True)
class Prepared:
    """A transition decided and not yet stored (`TaskTransitions.prepare`): the record after
    it and its event, for another write to commit (`stored` performs the rest)."""

    step: TaskStep
    before: TaskRecord
    after: TaskRecord
    details: Mapping[str, Any]
    event: EventDraft


class TaskTransitions:
    """Applies task inputs: the machine decides, this performs (see the module docstring)."""

    def __init__(
        self,
        live: LiveTasks,
        wakeups: Wakeups,
        gate: ConflictGate,
        store: TaskStore,
        events: EventRecorder,
        activity: Activity,
        windows: AgentWindows,
        clock: Clock,
        watch: TaskWatch,
    ) -> None:
        self._live = live
        self._wakeups = wakeups
        self._gate = gate
        self._store = store
        self._events = events
        self._activity = activity
        self._windows = windows
        self._clock = clock
        self._watch = watch
        self._end_listeners: list[Callable[[TaskRecord], None]] = []

    def add_end_listener(self, listener: Callable[[TaskRecord], None]) -> None:
        """Call `listener` with every task that ends (COMPLETED or FAILED), once it is stored.

        It runs inside the Scheduler's lock: it must not block or call back into the
        Scheduler (queue the record and act on it later)."""
        self._end_listeners.append(listener)

    async def apply(
        self,
        task: TaskRecord,
        event: TaskInput,
        changes: Mapping[str, Any],
        **details: Any,
    ) -> TaskRecord:
        """Step `task` on `event` and perform the row's effects; `changes` are the record's
        other new fields, `details` the logged event's. Returns the new record.
        IllegalTransitionError (nothing done) when the table has no row."""
        step = TaskMachine.step(task.state, event)
        after = replace(task, state=step.state, **changes)
        await self._perform(step, task, after, details)
        return after

    def prepare(
        self, task: TaskRecord, event: TaskInput, changes: Mapping[str, Any], **details: Any
    ) -> Prepared:
        """`apply`'s step, record and event without the write: for a row that persists and
        logs, whose record and event another write commits (then `stored`).
        IllegalTransitionError when the table has no row."""
        step = TaskMachine.step(task.state, event)
        if _E.PERSIST not in step.effects or _E.EMIT_EVENT not in step.effects:
            raise ValueError(f"{event} from {task.state} is not stored with an event")
        after = replace(task, state=step.state, **changes)
        return Prepared(step, task, after, details, self._event(step, after, details))

    async def stored(self, prepared: Prepared) -> TaskRecord:
        """The effects of a `prepare`d transition whose record and event are committed."""
        p = prepared
        await self._perform(p.step, p.before, p.after, p.details, write=False)
        return p.after

    async def stored_record(self, task_id: str) -> TaskRecord | None:
        """The task as the store holds it (StoreError when it does not answer)."""
        return await self._store.get(task_id)

    async def end(
        self, task: TaskRecord, event: TaskInput, code: str, note: str, result: str = ""
    ) -> TaskRecord:
        """`apply` of an input that ends the task, with its error code (empty when it
        completed), note and result (JSON text, core/tasks/result.py), logged with the event
        (the result by its size)."""
        changes, details = self._ending(code, note, result)
        return await self.apply(task, event, changes, **details)

    def prepare_end(
        self, task: TaskRecord, event: TaskInput, code: str, note: str, result: str = "",
        *, moved: Mapping[str, str] | None = None,
    ) -> Prepared:  # fmt: skip
        """`end` as `prepare` does it: the ending's record and event, for another write;
        `moved`: more of the event's details (its message's move, engine/scheduler/acks.py)."""
        changes, details = self._ending(code, note, result)
        return self.prepare(task, event, changes, **details, **(moved or {}))

    def _ending(self, code: str, note: str, result: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The record's changes and the event's details of an ending (`end`)."""
        changes = {"error_code": code, "note": note, "updated_at": self._clock.now(),
                   "result": result}  # fmt: skip
        details: dict[str, Any] = {"error_code": code, "note": note}
        if result:
            details["result_size"] = len(result.encode())
        return changes, details

    async def read(self, task: TaskRecord) -> TaskRecord:
        """The agent read the task (its READ ACK): RUNNING. Its activity entry (RFC 10) was
        registered at its dispatch (REGISTER_ACTIVITY): the agent starts a task before its
        READ is answered."""
        return await self.apply(task, TaskInput.READ, {"updated_at": self._clock.now()})

    def prepare_read(self, task: TaskRecord, moved: Mapping[str, str] | None = None) -> Prepared:
        """`read` as `prepare` does it (`stored` follows the write); `moved`: more of
        the event's details (its message's move, engine/scheduler/acks.py)."""
        changes = {"updated_at": self._clock.now()}
        return self.prepare(task, TaskInput.READ, changes, **(moved or {}))

    async def _register(self, task: TaskRecord) -> None:
        """The task's activity entry, recorded by its `task.dispatched` (a refusal by an
        event of its own, `activity.refused`). The entry is advisory: one
        refused (a full buffer) is logged and the task runs."""
        entry = activity_entry(task)
        try:
            await self._activity.register(entry, logged=True)
        except ApiaryError as exc:
            log.warning("task %s runs without an activity entry: %s", task.task_id, exc)
            await self._activity.refused(entry, exc.code)

    async def committed_as(self, after: TaskRecord) -> bool | None:
        """Whether a write of `after` whose outcome the store could not tell committed: the
        record read back is `after` (True) or not (False); None when the store does not
        answer within IN_DOUBT_WAIT_S."""
        return await self._stored_as(after)

    def submission_event(self, record: TaskRecord) -> EventDraft:
        """The event of `TaskMachine.SUBMITTED` for a new submission's record (its priority,
        scope and lane), for the store to commit with the record (`submitted` follows)."""
        details = {"priority": record.priority, "scope": record.scope, "lane": record.lane}
        return self._event(TaskMachine.SUBMITTED, record, details)

    async def submitted(self, record: TaskRecord) -> None:
        """A new submission's record, already stored with its event (with the rest of its
        run in one group commit): the other effects of `TaskMachine.SUBMITTED`."""
        await self._perform(TaskMachine.SUBMITTED, record, record, {}, write=False)

    def _event(self, step: TaskStep, after: TaskRecord, details: Mapping[str, Any]) -> EventDraft:
        return self._events.draft(
            step.event, SCHEDULER, correlation_id=after.task_id, task_id=after.task_id,
            agent_id=after.agent_id, state=_TEXT[after.state], **details,
        )  # fmt: skip

    async def _perform(
        self,
        step: TaskStep,
        before: TaskRecord,
        after: TaskRecord,
        details: Mapping[str, Any],
        *,
        write: bool = True,
    ) -> None:
        # The branches go by how often rows ask for them: every row persists and logs. The
        # event commits with the record (`TaskStore.put`); a row that logs without
        # persisting appends its event by the recorder's flusher.
        live = self._live
        effects = step.effects
        logged = not write or (_E.PERSIST in effects and _E.EMIT_EVENT in effects)
        if write and _E.PERSIST in effects:
            # The write goes before every other effect: a write that fails (the store cut
            # off) raises with nothing changed in memory, so the same input can be applied
            # again (or the task handled as it stands) once the store answers.
            events = [self._event(step, after, details)] if logged else []
            await self._write(events, after)
        # The agent that held or now holds the task: a shared task back in its queue has
        # none any more, one just dispatched had none before.
        holder = before.agent_id or after.agent_id
        for effect in effects:
            if effect is _E.PERSIST:
                live.stored(after)
                self._watch.changed(after)
            elif effect is _E.EMIT_EVENT:
                if not logged:
                    self._events.queue(self._event(step, after, details))
            elif effect is _E.RELEASE:
                live.release(before)
                self._gate.forget(before.task_id)
            elif effect is _E.SCHEDULE_AGENT:
                await self._windows.assigned(after.agent_id)
            elif effect is _E.START_AGENT:
                await self._windows.started(after.agent_id)
            elif effect is _E.FREE_AGENT:
                await self._windows.freed(holder)
            elif effect is _E.WAKE:
                if holder:
                    self._wakeups.wake(holder)
                if after.queue and after.state == TaskState.QUEUED:
                    self._wakeups.wake(shared_target(after.queue))
            elif effect is _E.ENQUEUE:
                live.push(after)
            elif effect is _E.OCCUPY:
                live.occupy(after)
                self._gate.started(after)
            elif effect is _E.REGISTER_ACTIVITY:
                # Before anything awaits: the DATA that carries the task is not written to
                # its agent's stream until this turn of the loop yields.
                await self._register(after)
            elif effect is _E.COMPLETE_ACTIVITY:
                await self._activity.complete(
                    holder, after.task_id, _activity_outcome(step, after), logged=True
                )
            elif effect is _E.ANNOUNCE_END:
                for listener in self._end_listeners:
                    listener(after)
            elif effect is _E.DEQUEUE:
                live.queue.remove(after.task_id)

    async def _write(self, events: list[EventDraft], after: TaskRecord) -> None:
        """Store `after` with `events`. A write the connection's loss cut short may have
        committed: it counts as done when the record read back is `after`, as failed when
        it is not or the store does not tell within IN_DOUBT_WAIT_S (the task write applied
        again would store the same change twice, with its event)."""
        try:
            await self._events.commit(events, partial(self._store.put, after))
        except StoreUnavailableError:
            if await self._stored_as(after) is not True:
                raise

    async def _stored_as(self, after: TaskRecord) -> bool | None:
        """Whether the task is stored as `after`; None when the store does not answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IN_DOUBT_WAIT_S
        pause = 0.05
        while True:
            try:
                return await self._store.get(after.task_id) == after
            except StoreError:
                if loop.time() + pause > deadline:
                    return None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
