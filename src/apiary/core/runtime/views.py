"""How the runtime shows its records in the contract's shapes (core/runtime/snapshot.py):
turns, threads and snapshots, and Apiary's Scheduler tasks as the contract's tasks. Pure:
the control plane reads the records and tasks and hands them here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.log import SCHEMA_VERSION
from apiary.core.runtime.queue import queue_of
from apiary.core.runtime.records import SessionRecord, ThreadRecord, TurnRecord, TurnState
from apiary.core.runtime.snapshot import (
    RuntimeSnapshot,
    StatusValue,
    TaskAttempt,
    TaskStatus,
    TaskView,
    ThreadView,
    TurnView,
)

_TASK_STATUS: Final = {
    TaskState.QUEUED: TaskStatus.QUEUED,
    TaskState.HELD: TaskStatus.WAITING_PERMISSION,
    TaskState.DISPATCHED: TaskStatus.PREPARING,
    TaskState.RUNNING: TaskStatus.RUNNING,
    TaskState.COMPLETED: TaskStatus.COMPLETED,
}
"""Apiary's task states as the contract's; FAILED is `failed`, or `cancelled` for a task
ended by a cancellation (`task_status`)."""
CANCELLED_CODES: Final = frozenset({"cancelled"})


def task_status(task: TaskRecord) -> str:
    if task.state == TaskState.FAILED:
        cancelled = task.error_code in CANCELLED_CODES
        return (TaskStatus.CANCELLED if cancelled else TaskStatus.FAILED).value
    return _TASK_STATUS[TaskState(task.state)].value


def run_id(task: TaskRecord) -> str:
    """The id of the task's current run: its dispatch attempt (`<task_id>/<attempt>`)."""
    return f"{task.task_id}/{max(task.attempts, 1)}"


def _time(seconds: float) -> str | None:
    return iso_utc(seconds) if seconds > 0 else None


def json_value(text: str) -> Any:
    """A stored JSON text's value (None for '')."""
    return json.loads(text) if text else None


def task_view(
    task: TaskRecord, turn: TurnRecord | None = None, *, result: bool = False
) -> TaskView:
    """An Apiary task as the contract's task: its Apiary state as `nativeStatus`, its agent
    as `assignee`, its submitter as `requestedBy`, its latest dispatch as its one attempt;
    with `result`, the agent's result (`extra["result"]`)."""
    status = task_status(task)
    attempt_status = status if status in StatusValue.__members__.values() else "queued"
    if task.state == TaskState.HELD:
        attempt_status = StatusValue.BLOCKED.value
    last_error = {"code": task.error_code, "message": task.note} if task.error_code else None
    extra: dict[str, Any] = {"agentId": task.agent_id, "priority": str(task.priority)}
    attempt = TaskAttempt(
        run_id=run_id(task), status=attempt_status, attempt_id=run_id(task),
        attempt_count=task.attempts, last_error=last_error,
    )  # fmt: skip
    if result and task.result:
        extra["result"] = json_value(task.result)
    return TaskView(
        task_id=task.task_id,
        status=status,
        session_id=turn.session_id if turn else None,
        thread_id=turn.thread_id if turn else None,
        turn_id=turn.turn_id if turn else None,
        task_kind="turn" if turn else "task",
        native_status=task.state,
        current_run_id=run_id(task),
        status_reason=task.note if task.note and task.state != TaskState.COMPLETED else None,
        attempts=(attempt,),
        assignee={"agentId": task.agent_id} if task.agent_id else None,
        requested_by={"principal": task.submitter} if task.submitter else None,
        last_error=last_error,
        created_at=_time(task.submitted_at),
        updated_at=_time(task.updated_at),
        extra=extra,
    )


def turn_view(turn: TurnRecord, task: TaskRecord | None = None) -> TurnView:
    """A turn: its task and run once it has one, its error once it failed."""
    extra: dict[str, Any] = {"ordinal": turn.ordinal}
    if turn.status_reason:
        extra["statusReason"] = turn.status_reason
    if turn.error_code:
        extra["error"] = {"code": turn.error_code, "message": turn.message}
    if turn.interrupt:
        extra["interrupt"] = turn.interrupt
    if turn.resumed_from:
        extra["resumedFrom"] = turn.resumed_from
    ran_on = turn.agent_id or (task.agent_id if task is not None else "")
    if ran_on:
        extra["agentId"] = ran_on  # the agent that took its task (of a capability queue too)
    started = turn.state != TurnState.QUEUED
    return TurnView(
        turn_id=turn.turn_id,
        status=turn.state,
        task_id=turn.task_id if started else None,
        run_id=run_id(task) if task is not None and started else None,
        started_at=_time(turn.started_at),
        completed_at=_time(turn.ended_at),
        extra=extra,
    )


def outcome(turn: TurnRecord) -> dict[str, Any]:
    """How an ended turn ended: its result, or its error."""
    found: dict[str, Any] = {"turnId": turn.turn_id, "status": turn.state}
    if turn.result_json:
        found["result"] = json_value(turn.result_json)
    if turn.error_code:
        found["error"] = {"code": turn.error_code, "message": turn.message}
    return found


@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread as read for a snapshot: its record, the turns shown (the last ones, and
    every open one), and the tasks of those turns by task id."""

    thread: ThreadRecord
    turns: Sequence[TurnRecord]
    tasks: Mapping[str, TaskRecord]
    pending: Sequence[Mapping[str, Any]] = ()
    """Its pending requests: the actions waiting for a decision (core/runtime/actions.py)."""

    def queued(self) -> list[TurnRecord]:
        return queue_of(self.turns)


def thread_view(state: ThreadState, *, detail: bool = False) -> ThreadView:
    """A thread: its status, turns, queue (1-based positions); with `detail` (a thread
    read), its last outcome and diagnostics too."""
    thread = state.thread
    queued = state.queued()
    extra: dict[str, Any] = {
        "agentId": thread.agent_id, "queuePolicy": thread.queue_policy,
        "turnCount": thread.turn_count,
    }  # fmt: skip
    if thread.capability:  # bound to a capability queue: each turn says its agent
        del extra["agentId"]
        extra["capability"] = thread.capability
    if detail:
        ended = [t for t in state.turns if TurnState(t.state).terminal]
        if ended:
            extra["lastOutcome"] = outcome(max(ended, key=lambda t: t.ordinal))
        active = state.tasks.get(_active_task(state))
        extra["diagnostics"] = {
            "agentId": thread.agent_id or (active.agent_id if active is not None else None),
            "queueLength": len(queued),
            "activeTaskState": active.state if active is not None else None,
            "activeTaskNote": active.note if active is not None and active.note else None,
        }
    return ThreadView(
        thread_id=thread.thread_id,
        status=thread.status,
        active_turn_id=thread.active_turn_id or None,
        turns=tuple(turn_view(t, state.tasks.get(t.task_id)) for t in state.turns),
        pending_requests=tuple(dict(p) for p in state.pending),
        queued_turns=tuple(
            {"turnId": t.turn_id, "position": i, "submittedAt": iso_utc(t.created_at)}
            for i, t in enumerate(queued, 1)
        ),
        incidents=tuple(_incident(t) for t in state.turns if t.state == TurnState.FAILED),
        extra=extra,
    )


def _incident(turn: TurnRecord) -> dict[str, Any]:
    error = {"code": turn.error_code, "message": turn.message}
    return {"turnId": turn.turn_id, "kind": "turn_failed", "error": error}


def _active_task(state: ThreadState) -> str:
    active = next((t for t in state.turns if t.turn_id == state.thread.active_turn_id), None)
    return active.task_id if active is not None else ""


def snapshot(
    session: SessionRecord,
    threads: Sequence[ThreadState],
    *,
    cursor: int,
    runtime_id: str,
    now: float,
    detail: bool = False,
) -> RuntimeSnapshot:
    """The session's snapshot as of event sequence `cursor` (`extra["cursor"]`): its
    threads (with `detail`, as a thread read shows them) and the tasks of their turns."""
    tasks: list[TaskView] = []
    summary = {"active": 0, "completed": 0, "failed": 0, "cancelled": 0}
    for state in threads:
        for turn in state.turns:
            task = state.tasks.get(turn.task_id)
            if task is None:
                continue
            view = task_view(task, turn)
            tasks.append(view)
            key = view.status if view.status in summary else "active"
            summary[key] += 1
    return RuntimeSnapshot(
        schema_version=SCHEMA_VERSION,
        session_id=session.session_id,
        threads=tuple(thread_view(state, detail=detail) for state in threads),
        runtime_id=runtime_id,
        workspace_id=session.workspace_id or None,
        updated_at=iso_utc(now),
        tasks=tuple(tasks),
        task_summary=summary,
        extra={
            "cursor": {"sequence": cursor},
            "session": session_shell(session),
        },
    )


def session_shell(session: SessionRecord) -> dict[str, Any]:
    """A session's own properties (the contract's session shell)."""
    shell: dict[str, Any] = {
        "sessionId": session.session_id, "owner": session.owner,
        "createdAt": iso_utc(session.created_at), "updatedAt": iso_utc(session.updated_at),
    }  # fmt: skip
    if session.title:
        shell["title"] = session.title
    if session.workspace_id:
        shell["workspaceId"] = session.workspace_id
    return shell
