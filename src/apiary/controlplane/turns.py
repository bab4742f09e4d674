"""Turns as Scheduler tasks: the turn machine's effects (core/runtime/turns.py) performed on
Apiary's engine.

A thread runs one turn at a time. Its next queued turn starts when it is free: its task is
submitted to the thread's agent (the turn's task id, chosen when the turn was submitted, makes
a second start after a crash the same task), and the turn follows the task
(`Scheduler.watch_tasks`, one follower per started turn) until the task ends; its result or
failure is the turn's. Every change is stored with its contract events (FactWriter), then its
other effects run: cancel or preempt the task of an interrupted turn, start the next turn.

Everything here runs with the control plane's lock held (`lock`): the entry points that take
it are `load` and the followers; the commands take it in controlplane/runtime.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Final

from apiary.controlplane.binding import binding_of
from apiary.controlplane.facts import RUNTIME_ACTOR, FactWriter
from apiary.controlplane.following import TaskFollowers
from apiary.core.clock import Clock
from apiary.core.limits import utf8_size
from apiary.core.records import TaskRecord
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import (
    RuntimeWrite,
    ThreadRecord,
    TurnRecord,
    TurnState,
    queue_key,
)
from apiary.core.runtime.subagents import ended_fact
from apiary.core.runtime.turns import (
    INTERRUPT_PREFIX,
    TurnEffect,
    TurnInput,
    TurnMachine,
    task_inputs,
    thread_status,
)
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
ENDED_STATUSES: Final = frozenset(s.value for s in TurnState if s.terminal)
RESULT_INLINE_BYTES: Final = 64 * 1024
"""A turn.completed event carries the result up to this size; past it, its size (get_task
gives the result)."""
"""A follower that failed (a store outage) follows again after a pause doubling up to the
larger value (real time)."""
JSON: Final = "application/json"
_ERROR_EVENTS: Final = frozenset({_T.TURN_FAILED, _T.TASK_FAILED, _T.TASK_CANCELLED, _T.TASK_LOST})

Sleep = Callable[[float], Awaitable[None]]


def submitter_of(owner: str) -> str:
    """The task submitter of a turn submitted by `owner` (`kind:name`): the name."""
    return owner.partition(":")[2]


def task_params(turn: TurnRecord) -> bytes:
    """What the agent receives: the turn's ids and its input."""
    ids = json.dumps(
        {"sessionId": turn.session_id, "threadId": turn.thread_id, "turnId": turn.turn_id},
        separators=(",", ":"),
    )
    return f'{ids[:-1]},"input":{turn.input_json}}}'.encode()


def queue_fact(thread: ThreadRecord, queued: list[str], **more: Any) -> Fact:
    """queue.changed: the thread's queued turns, in order (`more`: other payload
    properties, what moved)."""
    return Fact(
        _T.QUEUE_CHANGED, thread.session_id, thread.thread_id, agent_id=thread.agent_id,
        payload={"queuedTurns": queued, **more}, extra={"queueId": f"thread:{thread.thread_id}"},
    )  # fmt: skip


class TurnDriver:
    """Starts, follows and ends the turns of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, scheduler: Scheduler, clock: Clock, lock: asyncio.Lock
    ) -> None:
        self._facts = facts
        self._store = facts.store
        self._scheduler = scheduler
        self._clock = clock
        self._lock = lock
        self._followers = TaskFollowers(scheduler, lock, "turn")

    # ------------------------------------------------------------------ life

    async def load(self) -> int:
        """After a (re)start: follow every started turn's task, start the next turn of
        every free thread; returns how many turns were open."""
        async with self._lock:
            open_turns = await self._store.open_turns()
            threads = sorted({t.thread_id for t in open_turns})
            for thread_id in threads:
                thread = await self._store.thread(thread_id)
                if thread is None:
                    log.error("open turns of thread %s, which is not stored", thread_id)
                    continue
                mine = [t for t in open_turns if t.thread_id == thread_id]
                active = [t for t in mine if TurnState(t.state).active]
                for turn in active:
                    self.follow(turn)
                if not active:
                    await self.start_next(thread, RUNTIME_ACTOR)
            return len(open_turns)

    async def close(self) -> None:
        """Stop following (the turns go on; `load` follows them again)."""
        await self._followers.close()

    def following(self) -> int:
        return len(self._followers)

    # ------------------------------------------------------------------ starting

    async def start_next(
        self, thread: ThreadRecord, actor: str, submitted: str = ""
    ) -> ThreadRecord:
        """Start the thread's first queued turn unless one of its turns runs already.
        `submitted`: a turn submitted to the free thread in this same command, which starts
        without having been in the queue anyone saw (no queue.changed)."""
        open_turns = await self._store.open_turns(thread.thread_id)
        if any(TurnState(t.state).active for t in open_turns):
            return thread
        queued = [t for t in open_turns if t.state == TurnState.QUEUED]
        if not queued:
            return thread
        return await self._start(queued[0], thread, actor, queued[0].turn_id == submitted)

    async def _start(
        self, turn: TurnRecord, thread: ThreadRecord, actor: str, unseen: bool
    ) -> ThreadRecord:
        submission = Submission(
            agent_id=thread.agent_id, task_id=turn.task_id, priority=turn.priority,
            params=task_params(turn), content_type=JSON, scope=thread.scope,
            submitter=submitter_of(turn.submitted_by), capability=thread.capability,
        )  # fmt: skip
        try:
            result = await self._scheduler.submit(submission)
        except ApiaryError as exc:
            _, thread = await self.apply(
                turn, thread, TurnInput.REFUSE, actor, error_code=exc.code, message=exc.message
            )
            return thread
        if not result.accepted or result.task is None:
            code = result.error_code or "internal_error"
            _, thread = await self.apply(
                turn, thread, TurnInput.REFUSE, actor, error_code=code, message=result.reason
            )
            return thread
        _, thread = await self.apply(turn, thread, TurnInput.START, actor, quiet=unseen)
        return thread

    # ------------------------------------------------------------------ changes

    async def apply(
        self, turn: TurnRecord, thread: ThreadRecord, event: TurnInput, actor: str, *,
        quiet: bool = False, **changes: Any,
    ) -> tuple[TurnRecord, ThreadRecord]:  # fmt: skip
        """Step the turn on `event`, store it and its thread with the row's events, then
        perform the row's other effects; the records as they stand after them (`quiet`: the
        turn leaves a queue no one saw it in). IllegalTransitionError (nothing done) when the
        table has no row."""
        step = TurnMachine.step(TurnState(turn.state), event)
        now = self._clock.now()
        after = replace(turn, state=step.state.value, updated_at=now, **changes)
        if step.state.terminal:
            after = replace(after, ended_at=now)
        new_thread, facts = await self._thread_after(turn, after, thread, now, quiet)
        facts[:0] = [self._fact(kind, after, new_thread) for kind in step.events]
        if step.state.terminal and new_thread.parent_thread_id:  # a subagent's turn ended
            facts.append(ended_fact(after, new_thread))
        if TurnEffect.PERSIST in step.effects:
            write = RuntimeWrite(threads=(new_thread,), turns=(after,))
            await self._facts.commit(write, facts, actor)
        for effect in step.effects:
            if effect is TurnEffect.FOLLOW_TASK:
                self.follow(after)
            elif effect is TurnEffect.CANCEL_TASK:
                new_thread = await self.cancel_task(after, new_thread, actor)
            elif effect is TurnEffect.PREEMPT_TASK:
                await self._preempt(after, new_thread)
            elif effect is TurnEffect.START_NEXT:
                new_thread = await self.start_next(new_thread, actor)
        return (await self._store.turn(after.turn_id)) or after, new_thread

    async def _thread_after(
        self, before: TurnRecord, after: TurnRecord, thread: ThreadRecord, now: float,
        quiet: bool,
    ) -> tuple[ThreadRecord, list[Fact]]:  # fmt: skip
        """The thread once `before` became `after`: its active turn, its status, and the
        facts of what changed (thread.updated, queue.changed)."""
        state = TurnState(after.state)
        active_id = thread.active_turn_id
        if state.active:
            active_id = after.turn_id
        elif active_id == after.turn_id:
            active_id = ""
        stored = await self._store.open_turns(thread.thread_id)
        others = [t for t in stored if t.turn_id != after.turn_id]
        still_open = [*others, after] if not state.terminal else others
        still_open.sort(key=queue_key)
        queued = [t.turn_id for t in still_open if t.state == TurnState.QUEUED]
        active = next((TurnState(t.state) for t in still_open if TurnState(t.state).active), None)
        last = state if state.terminal else (
            TurnState(thread.status) if thread.status in ENDED_STATUSES else None
        )  # fmt: skip
        status = thread_status(active, last, len(queued))
        new_thread = replace(thread, active_turn_id=active_id, status=status, updated_at=now)
        facts: list[Fact] = []
        moved = (before.state == TurnState.QUEUED) != (after.state == TurnState.QUEUED)
        if moved and not quiet:
            facts.append(queue_fact(new_thread, queued))
        if status != thread.status:
            facts.append(
                Fact(
                    _T.THREAD_UPDATED,
                    thread.session_id,
                    thread.thread_id,
                    status=status,
                    agent_id=thread.agent_id,
                    payload={"activeTurnId": active_id or None},
                )
            )
        return new_thread, facts

    def _fact(self, kind: str, turn: TurnRecord, thread: ThreadRecord) -> Fact:
        """The contract event `kind` of the turn as it stands now."""
        payload: dict[str, Any] = {}
        agent = turn.agent_id or thread.agent_id
        if kind in (_T.TASK_CREATED, _T.TASK_STARTED, _T.TURN_STARTED):
            payload.update({"agentId": agent} if agent else binding_of(thread))
        if kind == _T.TURN_COMPLETED and turn.result_json:
            size = utf8_size(turn.result_json)
            if size <= RESULT_INLINE_BYTES:
                payload["result"] = json_value(turn.result_json)
            else:
                payload["resultSize"] = size
        if turn.error_code and kind in _ERROR_EVENTS:
            payload["error"] = {"code": turn.error_code, "message": turn.message}
        if kind == _T.TASK_CANCEL_REQUESTED:
            payload["reason"] = turn.interrupt
        started = turn.state != TurnState.QUEUED or kind.startswith("task.")
        return Fact(
            kind, turn.session_id, turn.thread_id, turn.turn_id,
            task_id=turn.task_id if started else "", status=turn.state,
            status_reason=turn.status_reason, payload=payload or None, agent_id=agent,
        )  # fmt: skip

    # ------------------------------------------------------------------ tasks

    def follow(self, turn: TurnRecord) -> None:
        """Follow the turn's task until it ends (one follower per turn)."""
        turn_id = turn.turn_id
        self._followers.follow(
            turn_id, turn.task_id, submitter_of(turn.submitted_by),
            partial(self.task_changed, turn_id), partial(self.lost, turn_id),
        )  # fmt: skip

    async def task_changed(self, turn_id: str, task: TaskRecord) -> bool:
        """A stored state of the turn's task; whether the turn has ended."""
        turn = await self._store.turn(turn_id)
        if turn is None or TurnState(turn.state).terminal:
            return True
        events = task_inputs(turn, task)
        if not events:
            return False
        thread = await self._store.thread(turn.thread_id)
        assert thread is not None  # a turn is stored with its thread
        for event in events:
            changes: dict[str, Any] = {}
            if task.agent_id:  # the agent that took it (any capable one, for a capability)
                changes["agent_id"] = task.agent_id
            if event is TurnInput.RUN:
                changes["started_at"] = self._clock.now()
            elif event is TurnInput.COMPLETE:
                changes["result_json"] = task.result
            elif event in (TurnInput.FAIL, TurnInput.STOP):
                changes["error_code"] = task.error_code or "internal_error"
                changes["message"] = task.note
                if event is TurnInput.STOP:
                    changes["status_reason"] = "interrupted"
            turn, thread = await self.apply(turn, thread, event, RUNTIME_ACTOR, **changes)
            if event is TurnInput.REQUEUE and turn.interrupt:
                await self.cancel_task(turn, thread, RUNTIME_ACTOR)
                turn = (await self._store.turn(turn_id)) or turn
        return TurnState(turn.state).terminal

    async def lost(self, turn_id: str) -> None:
        """The turn's task cannot be found: the turn fails `task_lost` (resume_thread runs it
        again as a new turn)."""
        turn = await self._store.turn(turn_id)
        if turn is None or not TurnState(turn.state).active:
            return
        thread = await self._store.thread(turn.thread_id)
        assert thread is not None
        await self.apply(
            turn, thread, TurnInput.LOSE, RUNTIME_ACTOR, error_code="task_lost",
            message=f"task {turn.task_id} cannot be found",
        )  # fmt: skip

    async def cancel_task(self, turn: TurnRecord, thread: ThreadRecord, actor: str) -> ThreadRecord:
        """Cancel the turn's task while it waits; a task that started already is asked to
        stop instead (`_preempt`); one that ended reaches the follower."""
        try:
            reason = turn.interrupt or "interrupted"
            ended = await self._scheduler.cancel(turn.task_id, reason, actor)
        except AlreadyInProgressError:
            await self._preempt(turn, thread)
            return thread
        except AlreadyCompletedError:
            return thread
        except NotFoundError:
            await self.lost(turn.turn_id)
        else:
            await self.task_changed(turn.turn_id, ended)
        return (await self._store.thread(thread.thread_id)) or thread

    async def _preempt(self, turn: TurnRecord, thread: ThreadRecord) -> None:
        """Ask the agent to stop the turn's running task (cooperative preemption whose
        reason starts with INTERRUPT_PREFIX: an SDK agent fails it `cancelled` at its next
        safe point; one that never reaches one is terminated by the Scheduler)."""
        reason = f"{INTERRUPT_PREFIX} {turn.interrupt or 'interrupted'}"
        holder = thread.agent_id
        if not holder:  # a capability queue's task: ask the agent that holds it now
            try:
                holder = (await self._scheduler.find(turn.task_id)).agent_id
            except NotFoundError:
                return
        asked = await self._scheduler.request_preemption(holder, turn.task_id, reason)
        if not asked:
            log.info("turn %s: its task %s was not preemptible now", turn.turn_id, turn.task_id)
