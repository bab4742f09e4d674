"""The agents' ACKs of the Scheduler's DATA envelopes: READ -> RUNNING (its activity entry,
RFC 10, was registered at its dispatch), FULFILLED ->
COMPLETED (or the yield or termination a preemption expects, engine/scheduler/preemption.py),
REJECTED/FAILED -> FAILED with the agent's code, TIMED_OUT -> handed out again while the task
has dispatch attempts left, FAILED after that. An ACK of an envelope no live task's dispatch
is goes to engine/scheduler/losses.py (`stale_ack`).

The router commits an ACK before it hands it to the Scheduler; an end ACK sent again after
its message ended comes here again too (the router's own write may have committed unheard,
engine/router/lifecycle.py `_forward_target`), and is applied by the task's state like any
other. An ACK whose task write the store failed (a cut connection) is kept here (once: its
repeats wait with it) and applied again from the Scheduler's loop (`retry`, on its timer
heap), in the order the ACKs came,
with a pause that doubles from RETRY_FIRST_S to RETRY_MAX_S while the store keeps failing. A
transition whose write fails changes nothing (engine/scheduler/transitions.py), so the ACK
applied again is applied as if for the first time. Kept ACKs live in memory: a coordinator
that stops before the store answers again loses them.

The ACKs of a stream's frame that only step their tasks (READ -> RUNNING, FULFILLED ->
COMPLETED, REJECTED/FAILED -> FAILED) are not handed over after the router's commit: the
router asks for their transitions first (`prepare`: records and events, nothing changed in
memory) and commits them with the messages' states (engine/router/ack_joins.py); their
effects follow that commit (`joined`). A commit that fails changes nothing here; one whose
outcome the store could not tell is looked up (`in_doubt`): the transitions found stored
take effect, and when the store does not answer, the ACKs are kept with their records, to
be looked up again before they are applied anew.

Called with the Scheduler's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from apiary.core.clock import Clock
from apiary.core.envelope import Ack
from apiary.core.records import TaskRecord
from apiary.core.tasks.machine import TaskInput, TaskMachine
from apiary.engine.router.ack_joins import AckedMessage
from apiary.engine.scheduler.live import LiveTasks
from apiary.engine.scheduler.losses import LostTasks
from apiary.engine.scheduler.preemption import SchedulerPreemption
from apiary.engine.scheduler.transitions import (
    Prepared,
    TaskTransitions,
    logs_messages,
    requeued,
)
from apiary.engine.scheduler.wakeups import SEP, Wakeups
from apiary.engine.settings import SchedulerSettings
from apiary.errors import UnavailableError
from apiary.store.errors import StoreError

log = logging.getLogger(__name__)

ACKS_KEY: Final = f"acks{SEP}"
"""The timer of the kept ACKs' next try."""
RETRY_FIRST_S: Final = 0.1
RETRY_MAX_S: Final = 5.0
_ENDS: Final = frozenset({"FULFILLED", "REJECTED", "FAILED"})


def failure_code(code: str) -> str:
    """The error code a task fails with for an agent's code (an ACK's or CompleteTask's):
    lower case, as the Scheduler's own codes are."""
    return code.lower()


@dataclass(frozen=True, slots=True)
class JoinedAck:
    """An agent's ACK whose task transition commits with the router's write of the ACK
    (`TaskAcks.prepare`)."""

    producer: str
    ack: Ack
    prepared: Prepared
    logged: str = ""
    """The message whose move the transition's event carries ('' none)."""
    stores: TaskRecord | None = None
    """The task's record the commit stores, when a later ACK of the frame steps the task
    again (its READ and its end in one frame); None: this transition's own."""

    @property
    def stored_record(self) -> TaskRecord:
        """What the task's record is once the commit that takes this transition is stored."""
        return self.stores if self.stores is not None else self.prepared.after


class TaskAcks:
    """Applies the agents' ACKs to their tasks (module docstring)."""

    def __init__(
        self,
        live: LiveTasks,
        transitions: TaskTransitions,
        preemptor: SchedulerPreemption,
        losses: LostTasks,
        wakeups: Wakeups,
        settings: SchedulerSettings,
        clock: Clock,
    ) -> None:
        self._live = live
        self._transitions = transitions
        self._preemptor = preemptor
        self._losses = losses
        self._wakeups = wakeups
        self._settings = settings
        self._clock = clock
        self._kept: list[tuple[str, Ack, JoinedAck | None]] = []
        """(producer, ACK, transition in doubt) whose write the store failed, in the order
        they came; the transition, when one was written with the router's commit and nobody
        could tell whether it committed (`in_doubt`)."""
        self._pause = RETRY_FIRST_S

    @property
    def kept(self) -> int:
        """How many ACKs wait for the store."""
        return len(self._kept)

    async def take(self, producer: str, ack: Ack) -> None:
        """Apply `producer`'s ACK; kept for `retry` when the store fails it. The same ACK
        sent again while one is kept waits with it (applied once)."""
        if any(
            kept.ack_for_message_id == ack.ack_for_message_id and kept.ack_stage is ack.ack_stage
            for _, kept, _ in self._kept
        ):
            return
        try:
            await self._apply(producer, ack)
        except (StoreError, UnavailableError) as exc:
            self._keep(producer, ack, None, exc)

    def _keep(
        self, producer: str, ack: Ack, prepared: JoinedAck | None, exc: BaseException
    ) -> None:
        log.warning(
            "%s ACK of %s kept until the store takes it: %s",
            ack.ack_stage.name, ack.ack_for_message_id, exc,
        )  # fmt: skip
        self._kept.append((producer, ack, prepared))
        if len(self._kept) == 1:
            self._wakeups.arm(ACKS_KEY, self._clock.now() + self._pause)

    def prepare(self, acks: Sequence[AckedMessage]) -> list[JoinedAck] | None:
        """The transitions of `acks` (one frame's, of the Scheduler's dispatches), decided
        and not stored, for the router to commit with its write of the ACKs (`joined`
        follows it); None when any of them is not a plain step of a live task (a stale ACK,
        a yield, a retry, ACKs kept for the store, a second ACK of one task other than its
        end after its READ): then they all come the usual way, after the router's commit,
        in their order. A live task's RECEIVED joins with nothing to write; a READ and the
        end that follows it in the frame both join, the end stepping the record the READ
        made. Each transition's event carries its message's move
        (engine/router/ack_joins.py): the one record of both."""
        if self._kept:
            return None
        joined: list[JoinedAck] = []
        last: dict[str, int] = {}
        """Each task's last transition in `joined`, by its index."""
        live = self._live
        for acked in acks:
            producer, ack = acked.producer, acked.ack
            task_id = live.by_message.get(ack.ack_for_message_id)
            task = live.tasks.get(task_id) if task_id else None
            stage = ack.ack_stage.name
            if task is not None and stage == "RECEIVED":
                continue  # (a live task's RECEIVED steps nothing: `_apply`)
            if task is None:
                return None
            earlier = last.get(task.task_id)
            if earlier is not None:
                before = joined[earlier]
                if before.ack.ack_stage.name != "READ" or stage not in _ENDS:
                    return None
                task = before.prepared.after
            move = acked.move if acked.move is not None and logs_messages(task) else None
            moved = {} if move is None else move.details()
            prepared: Prepared | None = None
            if stage == "READ" and TaskMachine.allows(task.state, TaskInput.READ):
                prepared = self._transitions.prepare_read(task, moved)
            elif stage == "FULFILLED" and TaskMachine.allows(task.state, TaskInput.FULFIL):
                prepared = self._preemptor.prepare_fulfilled(task, ack.note.strip(), moved)
            elif stage in ("REJECTED", "FAILED") and TaskMachine.allows(task.state, TaskInput.FAIL):
                code = failure_code(ack.error_code or "internal_error")
                prepared = self._transitions.prepare_end(
                    task, TaskInput.FAIL, code, ack.note, moved=moved
                )
            if prepared is None:
                return None
            logged = move.message_id if move is not None else ""
            if earlier is not None:
                joined[earlier] = replace(joined[earlier], stores=prepared.after)
            last[task.task_id] = len(joined)
            joined.append(JoinedAck(producer, ack, prepared, logged))
        return joined

    async def joined(self, joined: Sequence[JoinedAck]) -> None:
        """The effects of `prepare`d transitions, committed with the router's write."""
        for item in joined:
            await self._transitions.stored(item.prepared)

    async def in_doubt(self, joined: Sequence[JoinedAck], exc: BaseException) -> None:
        """The router's write of `joined` failed without telling whether it committed: each
        transition found stored takes effect; when the store does not answer, the ACK is
        kept with it (`retry` looks it up again); one found not stored changes nothing (the
        router's write did not commit: the agent's ACK was refused)."""
        for i, item in enumerate(joined):
            found = await self._transitions.committed_as(item.stored_record)
            if found is None:
                for rest in joined[i:]:
                    self._keep(rest.producer, rest.ack, rest, exc)
                return
            if found:
                await self.joined([item])

    async def retry(self) -> None:
        """Apply the kept ACKs again, in order, up to the first the store fails again (it and
        those after it wait for the next try, after a longer pause)."""
        kept, self._kept = self._kept, []
        for i, (producer, ack, prepared) in enumerate(kept):
            try:
                if prepared is not None:
                    found = await self._transitions.committed_as(prepared.stored_record)
                    if found is None:
                        raise UnavailableError("the store does not answer")
                    if found:
                        await self.joined([prepared])
                        continue
                    kept[i] = (producer, ack, None)  # (not committed: applied anew)
                await self._apply(producer, ack)
            except (StoreError, UnavailableError):
                self._kept[:0] = kept[i:]
                self._pause = min(self._pause * 2, RETRY_MAX_S)
                self._wakeups.arm(ACKS_KEY, self._clock.now() + self._pause)
                return
        self._pause = RETRY_FIRST_S

    async def _apply(self, producer: str, ack: Ack) -> None:
        message_id = ack.ack_for_message_id
        task_id = self._live.by_message.get(message_id)
        task = self._live.tasks.get(task_id) if task_id else None
        stage = ack.ack_stage.name
        if task is None:
            # An ACK of a control message, of a task that already ended, or of a dispatch
            # taken back (from a lost agent, or not stored).
            await self._losses.stale_ack(producer, message_id, stage)
        elif stage == "READ" and TaskMachine.allows(task.state, TaskInput.READ):
            await self._transitions.read(task)
        elif stage == "FULFILLED":
            await self._preemptor.fulfilled(task, ack.note.strip())
        elif stage in ("REJECTED", "FAILED", "TIMED_OUT"):
            await self._failed(task, ack.error_code or "internal_error", ack.note, stage)

    async def _failed(self, task: TaskRecord, code: str, note: str, stage: str) -> None:
        if stage == "TIMED_OUT" and task.attempts < self._settings.dispatch_attempts:
            # The router gave up on an acknowledgement: hand the task out again.
            why = f"{code}: {note}"
            changes = {"note": why, **requeued(task)}
            await self._transitions.apply(task, TaskInput.RETRY, changes, reason=why)
            return
        await self._transitions.end(task, TaskInput.FAIL, failure_code(code), note)
