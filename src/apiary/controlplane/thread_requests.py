"""The parameters of the turn and queue commands interrupt_turn, remove_queued_turn,
promote_queued_turn and resume_thread, read as controlplane/requests.py reads every
command's. Each takes an `idempotency_key` (controlplane/task_requests.py `Keyed`): a retry
with the same parameters answers without doing anything again (`replayed: true`); the same
key with other parameters is already_exists naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from apiary.controlplane.requests import Params
from apiary.controlplane.task_requests import Keyed
from apiary.errors import ValidationError

QUEUED_WORK: Final = ("preserve", "clear")


@dataclass(frozen=True, slots=True)
class InterruptTurn(Keyed):
    thread_id: str
    turn_id: str = ""
    session_id: str = ""
    queued: str = "preserve"
    """What happens to the thread's queued turns: kept (preserve) or cancelled (clear)."""
    reason: str = ""
    propagate: bool = True
    """Whether the subagents spawned with the turn are closed too (false: they go on)."""

    @classmethod
    def read(cls, p: Params) -> InterruptTurn:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            thread_id=p.id("thread_id", required=not p.has("turn_id")),
            turn_id=p.id("turn_id"),
            session_id=p.id("session_id"),
            queued=p.choice("queued", QUEUED_WORK, "preserve"),
            reason=p.text("reason"),
            propagate=p.boolean("propagate", True),
        )


@dataclass(frozen=True, slots=True)
class RemoveQueuedTurn(Keyed):
    turn_id: str
    thread_id: str = ""
    session_id: str = ""
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> RemoveQueuedTurn:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            turn_id=p.id("turn_id", required=True),
            thread_id=p.id("thread_id"),
            session_id=p.id("session_id"),
            reason=p.text("reason"),
        )


@dataclass(frozen=True, slots=True)
class PromoteQueuedTurn(Keyed):
    turn_id: str
    before_turn_id: str = ""
    """The queued turn it moves ahead of ('' for the head of the queue)."""
    thread_id: str = ""
    session_id: str = ""

    @classmethod
    def read(cls, p: Params) -> PromoteQueuedTurn:
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            turn_id=p.id("turn_id", required=True),
            before_turn_id=p.id("before_turn_id"),
            thread_id=p.id("thread_id"),
            session_id=p.id("session_id"),
        )
        if found.before_turn_id == found.turn_id:
            raise ValidationError.for_field("before_turn_id", "names the turn that moves")
        return found


@dataclass(frozen=True, slots=True)
class ResumeThread(Keyed):
    thread_id: str
    session_id: str = ""
    turn_id: str = ""
    """The lost turn to run again ('' for the thread's latest one not resumed yet)."""
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> ResumeThread:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            thread_id=p.id("thread_id", required=True),
            session_id=p.id("session_id"),
            turn_id=p.id("turn_id"),
            reason=p.text("reason"),
        )
