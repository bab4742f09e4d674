"""The thread commands promote_queued_turn and resume_thread (docs/control-plane.md).

promote_queued_turn moves a queued turn ahead in its thread's queue (core/runtime/queue.py):
the queue is ranked anew and stored with a queue.changed event; only queued turns move.

resume_thread continues a thread, explicitly (the contract: resume is explicit when the
runtime cannot prove background work is active). What it does depends on what the runtime
can prove:

- its active turn's task is still the Scheduler's and has not ended: the work goes on, and
  the runtime follows it again (`following`); nothing new runs;
- that task ended unseen: its end is taken in now (`reconciled`);
- the task cannot be found (`task_lost`: the turn failed with it, now or earlier): the lost
  turn runs again as a new turn with its input (`resumedFrom`), at the head of the queue
  (`resubmitted`); the lost turn stays as it ended, and a lost turn is resumed once;
- turns wait and none runs: the first one starts (`started`).

Each writes `thread.updated` with `payload.resume` saying which; a thread with nothing to
resume answers `idle` and writes nothing. Both commands run with the control plane's lock and
take an `idempotency_key` (controlplane/thread_requests.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Final

from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.thread_requests import PromoteQueuedTurn, ResumeThread
from apiary.controlplane.turns import TurnDriver, queue_fact
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.records import TaskState
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.queue import head_rank, promoted, queue_of
from apiary.core.runtime.records import (
    RuntimeWrite,
    ThreadRecord,
    TurnRecord,
    TurnState,
    owner_of,
)
from apiary.core.runtime.turns import thread_status
from apiary.core.runtime.views import turn_view
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyInProgressError,
    NotFoundError,
    ValidationError,
)

_T = RuntimeEventType
LOST: Final = "task_lost"
"""The error code of a turn whose task cannot be found: the one resume_thread runs again."""
RESUME_HISTORY: Final = 1000
"""The turns resume_thread looks through for lost ones (the thread's latest)."""


class ThreadCommands:
    """promote_queued_turn and resume_thread of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, turns: TurnDriver, scheduler: Scheduler, reads: Reads,
        clock: Clock, ids: IdGenerator, lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._turns = turns
        self._scheduler = scheduler
        self._reads = reads
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._keys = CommandKeys(facts.store, clock)

    # ------------------------------------------------------------------ promote

    async def promote(self, caller: Principal, req: PromoteQueuedTurn) -> dict[str, Any]:
        """Move the queued turn ahead of `before_turn_id` (the head when none)."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "promote_queued_turn", req)
            turn, thread = await self._reads.turn(
                caller, req.turn_id, req.thread_id, req.session_id
            )
            if replayed is not None:
                return await self._queue_answer(turn, thread, replayed=True)
            _check_queued(turn)
            queue = queue_of(await self._store.open_turns(thread.thread_id))
            if req.before_turn_id and req.before_turn_id not in {t.turn_id for t in queue}:
                raise ValidationError.for_field(
                    "before_turn_id", f"is not a queued turn of thread {thread.thread_id}"
                )
            order = promoted(queue, turn.turn_id, req.before_turn_id)
            moved = [new for new, old in zip(order, queue, strict=True) if new != old]
            answer = {"turnId": turn.turn_id, "moved": bool(moved)}
            keys = self._keys.keep(key, answer)
            if moved or keys:
                facts: list[Fact] = []
                if moved:
                    ids = [t.turn_id for t in order]
                    more = {"promoted": turn.turn_id, "before": req.before_turn_id or None}
                    facts.append(queue_fact(thread, ids, **more))
                write = RuntimeWrite(turns=tuple(moved), keys=keys)
                await self._facts.commit(write, facts, caller.label)
            return await self._queue_answer(turn, thread, moved=bool(moved))

    async def _queue_answer(
        self, turn: TurnRecord, thread: ThreadRecord, **more: Any
    ) -> dict[str, Any]:
        queue = queue_of(await self._store.open_turns(thread.thread_id))
        ids = [t.turn_id for t in queue]
        stored = await self._store.turn(turn.turn_id) or turn
        return {
            "turnId": turn.turn_id, "threadId": thread.thread_id, "status": stored.state,
            "position": ids.index(turn.turn_id) + 1 if turn.turn_id in ids else None,
            "queuedTurns": ids, **more,
        }  # fmt: skip

    # ------------------------------------------------------------------ resume

    async def resume(self, caller: Principal, req: ResumeThread) -> dict[str, Any]:
        """Continue the thread as the runtime can prove it (module docstring)."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "resume_thread", req)
            _, thread = await self._reads.thread(caller, req.thread_id, req.session_id)
            if replayed is not None:
                return await self._resume_answer(thread, replayed, replayed=True)
            named = await self._named(caller, thread, req.turn_id)
            mode, turn = await self._resume(caller, thread, named, req.reason)
            answer = {"mode": mode, "turnId": turn.turn_id if turn is not None else None}
            keys = self._keys.keep(key, answer)
            if keys:
                await self._facts.commit(RuntimeWrite(keys=keys), [], caller.label)
            return await self._resume_answer(thread, answer)

    async def _named(
        self, caller: Principal, thread: ThreadRecord, turn_id: str
    ) -> TurnRecord | None:
        if not turn_id:
            return None
        turn, _ = await self._reads.turn(caller, turn_id, thread.thread_id)
        state = TurnState(turn.state)
        if state.terminal and turn.error_code != LOST:
            raise AlreadyCompletedError(
                f"turn {turn.turn_id} ended {turn.state} ({turn.error_code or 'no error'}); "
                "resume_thread runs again only a turn whose task was lost: submit_turn a new "
                "turn instead", {"field": "turn_id", "turn_id": turn.turn_id},
            )  # fmt: skip
        if state is TurnState.QUEUED:
            raise AlreadyInProgressError(
                f"turn {turn.turn_id} is queued: it starts when the turns before it end "
                "(promote_queued_turn moves it ahead)", {"field": "turn_id"},
            )  # fmt: skip
        return turn

    async def _resume(
        self, caller: Principal, thread: ThreadRecord, named: TurnRecord | None, reason: str
    ) -> tuple[str, TurnRecord | None]:
        open_turns = await self._store.open_turns(thread.thread_id)
        active = next((t for t in open_turns if TurnState(t.state).active), None)
        checked: tuple[str, TurnRecord, str] | None = None
        if active is not None:
            checked = await self._check(active)
            if named is not None and named.turn_id == active.turn_id:
                if checked is None:  # lost just now: run again below
                    named = await self._store.turn(active.turn_id)
                else:
                    named = None
        lost = named if named is not None else await self._latest_lost(thread)
        if lost is not None and (checked is None or lost.turn_id != checked[1].turn_id):
            return "resubmitted", await self._resubmit(caller, lost, reason)
        if checked is not None:
            mode, turn, state = checked
            await self._resumed(caller, thread, mode, turn, taskState=state)
            return mode, turn
        thread = await self._store.thread(thread.thread_id) or thread
        if active is None and queue_of(open_turns):
            thread = await self._turns.start_next(thread, caller.label)
            started = (
                await self._store.turn(thread.active_turn_id) if thread.active_turn_id else None
            )
            await self._resumed(caller, thread, "started", started)
            return "started", started
        return "idle", None

    async def _check(self, active: TurnRecord) -> tuple[str, TurnRecord, str] | None:
        """What the Scheduler proves of the active turn's task: still in hand (followed
        again), ended unseen (taken in now), or None when it cannot be found (the turn
        fails task_lost)."""
        try:
            task = await self._scheduler.find(active.task_id)
        except NotFoundError:
            await self._turns.lost(active.turn_id)
            return None
        # A task read back from the store carries its state as the stored text.
        state = TaskState(task.state)
        if not state.terminal:
            self._turns.follow(active)
            return "following", active, state.value
        await self._turns.task_changed(active.turn_id, task)
        return "reconciled", active, state.value

    async def _latest_lost(self, thread: ThreadRecord) -> TurnRecord | None:
        """The thread's latest turn whose task was lost and that no turn resumed yet."""
        turns = await self._store.turns(thread.thread_id, RESUME_HISTORY)
        resumed = {t.resumed_from for t in turns if t.resumed_from}
        lost = [t for t in turns if t.error_code == LOST and t.turn_id not in resumed]
        return lost[-1] if lost else None

    async def _resubmit(self, caller: Principal, lost: TurnRecord, reason: str) -> TurnRecord:
        """The lost turn as a new turn at the head of its thread's queue (the same turn when
        one resumed it already), started when the thread is free."""
        turns = await self._store.turns(lost.thread_id, RESUME_HISTORY)
        again = next((t for t in turns if t.resumed_from == lost.turn_id), None)
        if again is not None:
            return again
        thread = await self._store.thread(lost.thread_id)
        assert thread is not None  # a turn is stored with its thread
        open_turns = await self._store.open_turns(thread.thread_id)
        queue = queue_of(open_turns)
        now = self._clock.now()
        turn = TurnRecord(
            self._ids.new_id(), lost.session_id, lost.thread_id, thread.turn_count,
            TurnState.QUEUED.value, lost.input_json, self._ids.new_id(), now, now,
            submitted_by=owner_of(caller), priority=lost.priority,
            queue_rank=head_rank(queue), resumed_from=lost.turn_id,
            status_reason="resumed",
        )  # fmt: skip
        active = next((TurnState(t.state) for t in open_turns if TurnState(t.state).active), None)
        status = thread_status(active, None, len(queue) + 1)
        thread = replace(thread, turn_count=thread.turn_count + 1, updated_at=now, status=status)
        why = (
            reason
            or f"resumed by {caller.label}: task {lost.task_id} of turn {lost.turn_id} was lost"
        )
        facts = [
            Fact(
                _T.TURN_SUBMITTED, turn.session_id, turn.thread_id, turn.turn_id,
                status=turn.state, agent_id=thread.agent_id, status_reason="resumed",
                payload={"ordinal": turn.ordinal, "queuePosition": 1 if active else 0,
                         "inputSize": len(turn.input_json.encode()),
                         "resumedFrom": lost.turn_id},
            ),
            Fact(
                _T.TASK_RESUMED, turn.session_id, turn.thread_id, turn.turn_id,
                task_id=turn.task_id, status=turn.state, agent_id=thread.agent_id,
                status_reason="resumed",
                payload={"resumedFrom": lost.turn_id, "lostTaskId": lost.task_id,
                         "reason": why},
            ),
            self._resume_fact(thread, "resubmitted", turn),
        ]  # fmt: skip
        if active is not None:
            facts.append(queue_fact(thread, [turn.turn_id, *(t.turn_id for t in queue)]))
        await self._facts.commit(
            RuntimeWrite(threads=(thread,), turns=(turn,)), facts, caller.label
        )
        if active is None:
            await self._turns.start_next(thread, caller.label, turn.turn_id)
        return await self._store.turn(turn.turn_id) or turn

    def _resume_fact(
        self, thread: ThreadRecord, mode: str, turn: TurnRecord | None, **more: Any
    ) -> Fact:
        payload = {"resume": mode, "turnId": turn.turn_id if turn is not None else None, **more}
        return Fact(
            _T.THREAD_UPDATED, thread.session_id, thread.thread_id, status=thread.status,
            agent_id=thread.agent_id, payload=payload,
        )  # fmt: skip

    async def _resumed(
        self, caller: Principal, thread: ThreadRecord, mode: str, turn: TurnRecord | None,
        **more: Any,
    ) -> None:  # fmt: skip
        thread = await self._store.thread(thread.thread_id) or thread
        fact = self._resume_fact(thread, mode, turn, **more)
        await self._facts.commit(RuntimeWrite(), [fact], caller.label)

    async def _resume_answer(
        self, thread: ThreadRecord, answer: dict[str, Any], **more: Any
    ) -> dict[str, Any]:
        thread = await self._store.thread(thread.thread_id) or thread
        found: dict[str, Any] = {
            "threadId": thread.thread_id, "mode": answer.get("mode"),
            "resumed": answer.get("mode") != "idle", "threadStatus": thread.status, **more,
        }  # fmt: skip
        turn_id = answer.get("turnId")
        turn = await self._store.turn(turn_id) if isinstance(turn_id, str) else None
        if turn is not None:
            found.update(turnId=turn.turn_id, taskId=turn.task_id, status=turn.state)
            found["turn"] = turn_view(turn).to_json()
        return found


def _check_queued(turn: TurnRecord) -> None:
    state = TurnState(turn.state)
    if state.terminal:
        raise AlreadyCompletedError(
            f"turn {turn.turn_id} has already ended ({turn.state})",
            {"field": "turn_id", "turn_id": turn.turn_id, "state": turn.state},
        )
    if state is not TurnState.QUEUED:
        raise AlreadyInProgressError(
            f"turn {turn.turn_id} is {turn.state}, no longer queued: only queued turns move",
            {"field": "turn_id", "turn_id": turn.turn_id, "state": turn.state},
        )
