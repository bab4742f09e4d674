"""A runtime agent task (core/runtime/task_records.py) in the contract's shape
(`$defs.task`): its metadata, every run as an attempt (ended ones kept), its edges as
relationships. Pure: the control plane reads the records and hands them here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from apiary.core.dedup import iso_utc
from apiary.core.runtime.snapshot import RuntimeSnapshot, TaskAttempt, TaskView
from apiary.core.runtime.task_records import (
    LinkKind,
    LinkStatus,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.core.runtime.tasks import RuntimeTaskState


def _time(seconds: float) -> str | None:
    return iso_utc(seconds) if seconds > 0 else None


def meta(task: RuntimeTaskRecord) -> dict[str, Any]:
    """The task's metadata object."""
    found = json.loads(task.meta_json or "{}")
    return found if isinstance(found, dict) else {}


def error_of(code: str, message: str) -> dict[str, Any] | None:
    return {"code": code, "message": message} if code else None


def attempt_view(run: TaskRunRecord) -> TaskAttempt:
    extra: dict[str, Any] = {"reason": run.reason, "nativeTaskId": run.run_id}
    outputs = json.loads(run.outputs_json or "[]")
    if outputs:
        extra["outputRefs"] = outputs
    if run.agent_id:
        extra["worker"] = {"agentId": run.agent_id}
    return TaskAttempt(
        run_id=run.run_id, status=run.state, attempt_id=f"{run.task_id}#{run.attempt}",
        attempt_count=run.attempt, started_at=_time(run.started_at),
        ended_at=_time(run.ended_at), last_error=error_of(run.error_code, run.message),
        extra=extra,
    )  # fmt: skip


def relationship(link: TaskLinkRecord) -> dict[str, Any]:
    found: dict[str, Any] = {
        "kind": link.kind, "targetId": link.target_id, "status": link.status,
        "createdAt": iso_utc(link.created_at), "updatedAt": iso_utc(link.updated_at),
    }  # fmt: skip
    if link.reason:
        found["reason"] = link.reason
    return found


_META_KEYS = (
    "taskProfile", "constraints", "acceptance", "progress", "artifacts", "evidenceRefs",
    "deliveryState", "visibility", "taskFamily", "jobId",
)  # fmt: skip


def runtime_task_view(
    task: RuntimeTaskRecord,
    runs: Sequence[TaskRunRecord],
    links: Sequence[TaskLinkRecord] = (),
    *,
    result: bool = True,
) -> TaskView:
    """The task with its runs as attempts and its edges (removed ones included, with their
    status) as relationships; with `result`, what its last run returned."""
    doc = meta(task)
    extra: dict[str, Any] = {key: doc[key] for key in _META_KEYS if key in doc}
    extra["priority"] = str(task.priority)
    extra["owner"] = {"principal": task.owner}
    if task.scope:
        extra["scope"] = {"scope": task.scope}
    if task.intent:
        extra["intent"] = {"kind": task.intent, "reason": task.intent_reason}
    if links:
        extra["relationships"] = [relationship(link) for link in links]
    parent = next(
        (x for x in links if x.kind == LinkKind.PARENT and x.status == LinkStatus.ACTIVE), None
    )
    if parent is not None:
        extra["parentTaskId"] = parent.target_id
    if result and task.result_json:
        extra["result"] = json.loads(task.result_json)
    assignee: dict[str, Any] | None = None
    if task.agent_id:
        assignee = {"agentId": task.agent_id}
    elif task.capability:
        assignee = {"capability": task.capability}
    reason = task.status_reason or None
    if reason is None and task.intent:
        reason = f"{task.intent} requested"
    return TaskView(
        task_id=task.task_id,
        status=task.state,
        session_id=task.session_id,
        thread_id=task.thread_id or None,
        title=doc.get("title") or None,
        objective=doc.get("objective") or None,
        task_kind=doc.get("taskKind") or "agent_task",
        native_status=runs[-1].state if runs else RuntimeTaskState(task.state).value,
        current_run_id=task.current_run_id or None,
        status_reason=reason,
        attempts=tuple(attempt_view(run) for run in runs),
        assignee=assignee,
        requested_by={"principal": task.owner},
        last_error=error_of(task.error_code, task.message),
        created_at=_time(task.created_at),
        updated_at=_time(task.updated_at),
        started_at=_time(task.started_at),
        ended_at=_time(task.ended_at),
        extra=extra,
    )


def with_tasks(snapshot: RuntimeSnapshot, tasks: Sequence[TaskView]) -> RuntimeSnapshot:
    """The session's snapshot with its agent tasks after its turns' tasks, counted in its
    task summary (active, completed, failed, cancelled; drafts and paused ones apart)."""
    if not tasks:
        return snapshot
    summary = dict(snapshot.task_summary or {})
    for task in tasks:
        ended = ("completed", "failed", "cancelled", "draft", "paused")
        key = task.status if task.status in ended else "active"
        summary[key] = summary.get(key, 0) + 1
    return replace(snapshot, tasks=(*(snapshot.tasks or ()), *tasks), task_summary=summary)
