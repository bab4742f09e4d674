"""The parameters of the control plane's task commands (create_task ... unlink_tasks), read
as controlplane/requests.py reads every command's: snake_case or the contract's camelCase,
each refusal a ValidationError naming the field.

Every mutating task command takes an `idempotency_key`: the first call's effect is kept
under it, and a retry with the same parameters answers the task as it stands without doing
anything again (`replayed: true`); the same key with other parameters is already_exists.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from apiary.controlplane.requests import TEXT_BYTES, Params
from apiary.core.limits import DEFAULT_LIMITS
from apiary.core.runtime.task_records import LinkKind
from apiary.errors import ValidationError

META_BYTES: Final = 256 * 1024
"""A task's metadata object (profile, constraints, acceptance, ...) at most, as JSON."""
VISIBILITY: Final = ("foreground", "background", "internal", "hidden", "unknown")


def _json(p: Params, name: str, limit: int = META_BYTES) -> Any:
    """A JSON parameter's value (None when absent)."""
    if not p.has(name):
        return None
    return p.json(name, limit)


def obj(p: Params, name: str) -> dict[str, Any] | None:
    value = _json(p, name)
    if value is not None and not isinstance(value, dict):
        raise ValidationError.for_field(name, "must be a JSON object")
    return value


def objects(p: Params, name: str) -> list[dict[str, Any]] | None:
    value = _json(p, name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValidationError.for_field(name, "must be an array of JSON objects")
    return value


def strings(p: Params, name: str) -> list[str] | None:
    value = _json(p, name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValidationError.for_field(name, "must be an array of non-empty strings")
    return value


def ids(p: Params, name: str) -> tuple[str, ...]:
    found = strings(p, name) or []
    for value in found:
        if len(value.encode()) > DEFAULT_LIMITS.id_bytes:
            raise ValidationError.for_field(
                name, f"holds an id over {DEFAULT_LIMITS.id_bytes} bytes"
            )
    return tuple(found)


def optional_input(p: Params, name: str, limit: int) -> str | None:
    """A JSON value of any type as compact text, None when absent."""
    return p.json_value(name, limit) if p.has(name) else None


@dataclass(frozen=True, slots=True)
class Keyed:
    """A mutating command's idempotency key, and the digest of what it asks."""

    idempotency_key: str

    def digest(self) -> str:
        doc = {k: v for k, v in asdict(self).items() if k != "idempotency_key"}
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """What create_task and update_task set of a task's metadata (None: not given)."""

    title: str | None = None
    objective: str | None = None
    task_kind: str | None = None
    task_profile: dict[str, Any] | None = None
    constraints: dict[str, Any] | None = None
    acceptance: list[dict[str, Any]] | None = None
    visibility: str | None = None

    @classmethod
    def read(cls, p: Params) -> TaskMeta:
        visibility = p.choice("visibility", VISIBILITY, "") or None
        profile = obj(p, "task_profile")
        if profile is None:
            profile = obj(p, "profile")
        return cls(
            title=p.text("title") if p.has("title") else None,
            objective=p.text("objective", 64 * 1024) if p.has("objective") else None,
            task_kind=p.id("task_kind") or None,
            task_profile=profile,
            constraints=obj(p, "constraints"),
            acceptance=objects(p, "acceptance"),
            visibility=visibility,
        )

    def changes(self) -> dict[str, Any]:
        """The given fields by their contract names."""
        names = {
            "title": "title", "objective": "objective", "task_kind": "taskKind",
            "task_profile": "taskProfile", "constraints": "constraints",
            "acceptance": "acceptance", "visibility": "visibility",
        }  # fmt: skip
        return {names[k]: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class CreateTask(Keyed):
    task_id: str = ""
    session_id: str = ""
    thread_id: str = ""
    agent_id: str = ""
    capability: str = ""
    scope: str = ""
    priority: int = 0
    input_json: str = "null"
    meta: TaskMeta = field(default_factory=TaskMeta)
    parent_task_id: str = ""
    depends_on: tuple[str, ...] = ()
    start: bool = False

    @classmethod
    def read(cls, p: Params, max_input_bytes: int) -> CreateTask:
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id"),
            session_id=p.id("session_id"),
            thread_id=p.id("thread_id"),
            agent_id=p.id("agent_id"),
            capability=p.id("capability"),
            scope=p.text("scope", DEFAULT_LIMITS.document_bytes),
            priority=p.integer("priority", minimum=-19, maximum=20) or 0,
            input_json=optional_input(p, "input", max_input_bytes) or "null",
            meta=TaskMeta.read(p),
            parent_task_id=p.id("parent_task_id"),
            depends_on=ids(p, "depends_on"),
            start=p.boolean("start", False),
        )
        if found.agent_id and found.capability:
            raise ValidationError.for_field("capability", "names a queue; agent_id an agent: one")
        return found


@dataclass(frozen=True, slots=True)
class UpdateTask(Keyed):
    task_id: str = ""
    meta: TaskMeta = field(default_factory=TaskMeta)
    input_json: str | None = None
    agent_id: str | None = None
    capability: str | None = None
    scope: str | None = None
    priority: int | None = None

    @classmethod
    def read(cls, p: Params, max_input_bytes: int) -> UpdateTask:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id", required=True),
            meta=TaskMeta.read(p),
            input_json=optional_input(p, "input", max_input_bytes),
            agent_id=p.id("agent_id") if p.has("agent_id") else None,
            capability=p.id("capability") if p.has("capability") else None,
            scope=p.text("scope", DEFAULT_LIMITS.document_bytes) if p.has("scope") else None,
            priority=p.integer("priority", minimum=-19, maximum=20),
        )

    def run_fields(self) -> list[str]:
        """The given fields that shape the task's next run."""
        return [
            name for name in ("input_json", "agent_id", "capability", "scope", "priority")
            if getattr(self, name) is not None
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class TaskAction(Keyed):
    """start_task, pause_task, resume_task, retry_task: a task and why."""

    task_id: str = ""
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> TaskAction:
        return cls(p.id("idempotency_key"), p.id("task_id", required=True), p.text("reason"))


@dataclass(frozen=True, slots=True)
class CancelTask(Keyed):
    task_id: str = ""
    reason: str = ""
    propagate: bool = True
    """Cancel the task's child tasks too."""

    @classmethod
    def read(cls, p: Params) -> CancelTask:
        return cls(
            p.id("idempotency_key"), p.id("task_id", required=True), p.text("reason"),
            p.boolean("propagate", True),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class AppendTaskProgress(Keyed):
    task_id: str = ""
    phase: str = ""
    summary: str = ""
    percent: int | None = None
    counters: dict[str, Any] | None = None
    delivery_state: dict[str, Any] | None = None
    output_refs: list[dict[str, Any]] | None = None

    @classmethod
    def read(cls, p: Params) -> AppendTaskProgress:
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id", required=True),
            phase=p.id("phase"),
            summary=p.text("summary", TEXT_BYTES),
            percent=p.integer("percent", maximum=100),
            counters=obj(p, "counters"),
            delivery_state=obj(p, "delivery_state"),
            output_refs=objects(p, "output_refs"),
        )
        for name, value in (found.counters or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError.for_field("counters", f"{name[:64]!r} is not a number")
        if not any((found.phase, found.summary, found.counters, found.delivery_state,
                    found.output_refs, found.percent is not None)):  # fmt: skip
            raise ValidationError.for_field(
                "summary", "is required (or phase, percent, counters, delivery_state, output_refs)"
            )
        return found


@dataclass(frozen=True, slots=True)
class Reconcile(Keyed):
    """complete_task and fail_task: the outcome, and what it brings along."""

    task_id: str = ""
    result_json: str = ""
    summary: str = ""
    error_code: str = ""
    message: str = ""
    retryable: bool = True
    artifacts: list[dict[str, Any]] | None = None
    evidence_refs: list[str] | None = None
    delivery_state: dict[str, Any] | None = None

    @classmethod
    def read_complete(cls, p: Params, max_result_bytes: int) -> Reconcile:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id", required=True),
            result_json=optional_input(p, "result", max_result_bytes) or "",
            summary=p.text("summary"),
            **cls._along(p),
        )

    @classmethod
    def read_fail(cls, p: Params) -> Reconcile:
        error = obj(p, "error") or {}
        code = p.id("error_code") or str(error.get("code") or "") or "task_failed"
        message = p.text("message") or str(error.get("message") or "")
        return cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id", required=True),
            error_code=code[: DEFAULT_LIMITS.id_bytes],
            message=message[:TEXT_BYTES],
            retryable=p.boolean("retryable", True),
            **cls._along(p),
        )

    @staticmethod
    def _along(p: Params) -> dict[str, Any]:
        return {
            "artifacts": objects(p, "artifacts"),
            "evidence_refs": strings(p, "evidence_refs"),
            "delivery_state": obj(p, "delivery_state"),
        }


@dataclass(frozen=True, slots=True)
class LinkTasks(Keyed):
    task_id: str = ""
    target_id: str = ""
    kind: str = LinkKind.DEPENDENCY.value
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> LinkTasks:
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            task_id=p.id("task_id", required=True),
            target_id=p.id("target_id", required=True),
            kind=p.choice("kind", tuple(LinkKind), LinkKind.DEPENDENCY.value),
            reason=p.text("reason"),
        )
        if found.target_id == found.task_id:
            raise ValidationError.for_field("target_id", "names the task itself")
        return found
