"""The parameters of the thread commands promote_queued_turn and resume_thread, read as
controlplane/requests.py reads every command's. Both take an `idempotency_key`
(controlplane/task_requests.py `Keyed`): a retry with the same parameters answers as things
stand without doing anything again (`replayed: true`); the same key with other parameters
is already_exists naming it."""

from __future__ import annotations

from dataclasses import dataclass

from apiary.controlplane.requests import Params
from apiary.controlplane.task_requests import Keyed
from apiary.errors import ValidationError


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
