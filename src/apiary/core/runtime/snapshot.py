"""The runtime snapshot (spec/agentruntime/agentruntime-snapshot.schema.json) as Python types:
a session's threads, their turns and queues, and the tasks behind them.

As with events (core/runtime/events.py), each type names the properties the runtime fills in
and keeps every other one in `extra`, so that a snapshot read and written again is the same
JSON; the schema's enumerations (thread status, task status, attempt status) are checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from apiary.core.runtime.document import Fields, JsonObject, merged, put
from apiary.core.runtime.events import check_timestamp
from apiary.errors import ValidationError


class ThreadStatus(StrEnum):
    """`$defs.thread.status`."""

    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALE = "stale"
    UNKNOWN = "unknown"


class StatusValue(StrEnum):
    """`$defs.statusValue`: a run's or attempt's status."""

    IDLE = "idle"
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    BLOCKED = "blocked"
    STREAMING = "streaming"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALE = "stale"
    UNKNOWN = "unknown"
    UNAVAILABLE = "unavailable"
    NOT_APPLICABLE = "not_applicable"


class TaskStatus(StrEnum):
    """`$defs.taskStatusValue`."""

    DRAFT = "draft"
    ACCEPTED = "accepted"
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    WAITING_INPUT = "waiting_input"
    WAITING_PERMISSION = "waiting_permission"
    WAITING_RESOURCE = "waiting_resource"
    BLOCKED = "blocked"
    PAUSED = "paused"
    RETRYING = "retrying"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    LOST = "lost"
    COMPLETED = "completed"
    ARCHIVED = "archived"
    STALE = "stale"
    UNKNOWN = "unknown"


def _member(value: str, allowed: type[StrEnum], path: str) -> str:
    if value not in allowed.__members__.values():
        words = ", ".join(m.value for m in allowed)
        raise ValidationError.for_field(path, f"{value[:40]!r} is not one of: {words}")
    return value


def _time(fields: Fields, key: str) -> str | None:
    value = fields.text(key)
    return None if value is None else check_timestamp(value, fields.path(key))


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """`$defs.taskAttempt`: one run of a task."""

    run_id: str
    status: str
    attempt_id: str | None = None
    attempt_count: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_error: JsonObject | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> TaskAttempt:
        f = Fields(doc, where)
        return cls(
            run_id=f.required_text("runId"),
            status=_member(f.required_text("status"), StatusValue, f.path("status")),
            attempt_id=f.text("attemptId"),
            attempt_count=f.integer("attemptCount", minimum=0),
            started_at=_time(f, "startedAt"),
            ended_at=_time(f, "endedAt"),
            last_error=f.obj("lastError"),
            extra=f.rest(),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runId": self.run_id}
        put(out, "attemptId", self.attempt_id)
        out["status"] = self.status
        for key, value in (
            ("attemptCount", self.attempt_count), ("startedAt", self.started_at),
            ("endedAt", self.ended_at), ("lastError", self.last_error),
        ):  # fmt: skip
            put(out, key, value)
        return merged(out, self.extra)


_TASK_TEXTS: Final = (
    ("sessionId", "session_id"),
    ("threadId", "thread_id"),
    ("turnId", "turn_id"),
    ("title", "title"),
    ("objective", "objective"),
    ("taskKind", "task_kind"),
    ("nativeStatus", "native_status"),
    ("currentRunId", "current_run_id"),
    ("statusReason", "status_reason"),
)
_TASK_TIMES: Final = (
    ("createdAt", "created_at"),
    ("updatedAt", "updated_at"),
    ("startedAt", "started_at"),
    ("endedAt", "ended_at"),
)
_TASK_OBJECTS: Final = (
    ("assignee", "assignee"),
    ("requestedBy", "requested_by"),
    ("lastError", "last_error"),
)


@dataclass(frozen=True, slots=True)
class TaskView:
    """`$defs.task`: an agent task as the contract shows it."""

    task_id: str
    status: str
    session_id: str | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    title: str | None = None
    objective: str | None = None
    task_kind: str | None = None
    native_status: str | None = None
    current_run_id: str | None = None
    status_reason: str | None = None
    attempts: tuple[TaskAttempt, ...] | None = None
    assignee: JsonObject | None = None
    requested_by: JsonObject | None = None
    last_error: JsonObject | None = None
    created_at: str | None = None
    updated_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> TaskView:
        f = Fields(doc, where)
        known: dict[str, Any] = {
            "task_id": f.required_text("taskId"),
            "status": _member(f.required_text("status"), TaskStatus, f.path("status")),
            "attempts": f.items("attempts", TaskAttempt.from_json),
        }
        for key, name in _TASK_TEXTS:
            known[name] = f.text(key)
        for key, name in _TASK_TIMES:
            known[name] = _time(f, key)
        for key, name in _TASK_OBJECTS:
            known[name] = f.obj(key)
        return cls(**known, extra=f.rest())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"taskId": self.task_id}
        for key, name in (*_TASK_TEXTS[:6], ("status", "status"), *_TASK_TEXTS[6:]):
            put(out, key, getattr(self, name))
        put(out, "attempts", self.attempts)
        for key, name in (*_TASK_OBJECTS, *_TASK_TIMES):
            put(out, key, getattr(self, name))
        return merged(out, self.extra)


@dataclass(frozen=True, slots=True)
class TurnView:
    """`$defs.turn`: one turn of a thread."""

    turn_id: str
    status: str
    task_id: str | None = None
    run_id: str | None = None
    attempt_id: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> TurnView:
        f = Fields(doc, where)
        return cls(
            turn_id=f.required_text("turnId"),
            status=f.required_text("status"),
            task_id=f.text("taskId"),
            run_id=f.text("runId"),
            attempt_id=f.text("attemptId"),
            started_at=_time(f, "startedAt"),
            completed_at=_time(f, "completedAt"),
            extra=f.rest(),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turnId": self.turn_id, "status": self.status}
        for key, value in (
            ("taskId", self.task_id), ("runId", self.run_id), ("attemptId", self.attempt_id),
            ("startedAt", self.started_at), ("completedAt", self.completed_at),
        ):  # fmt: skip
            put(out, key, value)
        return merged(out, self.extra)


_THREAD_LISTS: Final = (
    ("pendingRequests", "pending_requests"),
    ("queuedTurns", "queued_turns"),
    ("incidents", "incidents"),
)


@dataclass(frozen=True, slots=True)
class ThreadView:
    """`$defs.thread`: a thread's status, turns, queue, pending requests and incidents."""

    thread_id: str
    status: str
    active_turn_id: str | None = None
    turns: tuple[TurnView, ...] | None = None
    pending_requests: tuple[JsonObject, ...] | None = None
    queued_turns: tuple[JsonObject, ...] | None = None
    incidents: tuple[JsonObject, ...] | None = None
    tasks: tuple[TaskView, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> ThreadView:
        f = Fields(doc, where)
        known: dict[str, Any] = {
            "thread_id": f.required_text("threadId"),
            "status": _member(f.required_text("status"), ThreadStatus, f.path("status")),
            "active_turn_id": f.text("activeTurnId"),
            "turns": f.items("turns", TurnView.from_json),
            "tasks": f.items("tasks", TaskView.from_json),
        }
        for key, name in _THREAD_LISTS:
            known[name] = f.objects(key)
        return cls(**known, extra=f.rest())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"threadId": self.thread_id, "status": self.status}
        put(out, "activeTurnId", self.active_turn_id)
        put(out, "turns", self.turns)
        for key, name in _THREAD_LISTS:
            put(out, key, getattr(self, name))
        put(out, "tasks", self.tasks)
        return merged(out, self.extra)


@dataclass(frozen=True, slots=True)
class RuntimeSnapshot:
    """A session's state at one point of its event stream (`extra["cursor"]` in the
    runtime's own snapshots: the sequence it reflects)."""

    schema_version: str
    session_id: str
    threads: tuple[ThreadView, ...]
    runtime_id: str | None = None
    workspace_id: str | None = None
    updated_at: str | None = None
    tasks: tuple[TaskView, ...] | None = None
    task_summary: JsonObject | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ValidationError.for_field("sessionId", "must not be empty")

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> RuntimeSnapshot:
        f = Fields(doc, where)
        threads = f.items("threads", ThreadView.from_json)
        if threads is None:
            raise ValidationError.for_field(f.path("threads"), "is required")
        return cls(
            schema_version=f.required_text("schemaVersion"),
            session_id=f.required_text("sessionId", nonempty=True),
            threads=threads,
            runtime_id=f.text("runtimeId"),
            workspace_id=f.text("workspaceId"),
            updated_at=_time(f, "updatedAt"),
            tasks=f.items("tasks", TaskView.from_json),
            task_summary=f.obj("taskSummary"),
            extra=f.rest(),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schemaVersion": self.schema_version}
        put(out, "runtimeId", self.runtime_id)
        out["sessionId"] = self.session_id
        put(out, "workspaceId", self.workspace_id)
        put(out, "updatedAt", self.updated_at)
        out["threads"] = [thread.to_json() for thread in self.threads]
        put(out, "tasks", self.tasks)
        put(out, "taskSummary", self.task_summary)
        return merged(out, self.extra)

    def thread(self, thread_id: str) -> ThreadView | None:
        return next((t for t in self.threads if t.thread_id == thread_id), None)
