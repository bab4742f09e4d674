"""The runtime event (spec/agentruntime/agentruntime-event.schema.json) as a Python type.

Every event has a `type` (one of the contract's 120 `RuntimeEventType`s), an `eventId` and a
`timestamp` (RFC 3339); the properties the runtime's own events use are typed fields, and
every other property an event carries (the schema's many optional objects, a profile's own
additions) is kept in `extra` as it came, so that `RuntimeEvent.from_json(doc).to_json() ==
doc`. A property of the wrong type, an unknown event type or a malformed timestamp is a
ValidationError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from apiary.core.runtime.document import Fields, merged, put
from apiary.errors import ValidationError


class RuntimeEventType(StrEnum):
    """The contract's event types, in its order."""

    SESSION_CREATED = "session.created"
    SESSION_UPDATED = "session.updated"
    THREAD_STARTED = "thread.started"
    THREAD_UPDATED = "thread.updated"
    TURN_SUBMITTED = "turn.submitted"
    TURN_STARTED = "turn.started"
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TASK_CREATED = "task.created"
    TASK_ACCEPTED = "task.accepted"
    TASK_QUEUED = "task.queued"
    TASK_STARTED = "task.started"
    TASK_UPDATED = "task.updated"
    TASK_PROGRESS = "task.progress"
    TASK_WAITING = "task.waiting"
    TASK_BLOCKED = "task.blocked"
    TASK_PAUSED = "task.paused"
    TASK_RESUMED = "task.resumed"
    TASK_RETRYING = "task.retrying"
    TASK_CANCEL_REQUESTED = "task.cancel_requested"
    TASK_CANCELLED = "task.cancelled"
    TASK_TIMED_OUT = "task.timed_out"
    TASK_FAILED = "task.failed"
    TASK_LOST = "task.lost"
    TASK_COMPLETED = "task.completed"
    TASK_ARCHIVED = "task.archived"
    RUN_STATUS = "run.status"
    MODEL_REQUESTED = "model.requested"
    MODEL_DELTA = "model.delta"
    MODEL_COMPLETED = "model.completed"
    MODEL_FAILED = "model.failed"
    REASONING_DELTA = "reasoning.delta"
    REASONING_SUMMARY = "reasoning.summary"
    TOOL_CATALOG_RESOLVED = "tool.catalog.resolved"
    TOOL_STARTED = "tool.started"
    TOOL_ARGS = "tool.args"
    TOOL_PROGRESS = "tool.progress"
    TOOL_RESULT = "tool.result"
    TOOL_FAILED = "tool.failed"
    ACTION_REQUIRED = "action.required"
    ACTION_RESOLVED = "action.resolved"
    QUEUE_CHANGED = "queue.changed"
    CONTEXT_RESOLVED = "context.resolved"
    CONTEXT_COMPACTION_STARTED = "context.compaction.started"
    CONTEXT_COMPACTION_COMPLETED = "context.compaction.completed"
    CONTEXT_COMPACTION_FAILED = "context.compaction.failed"
    ARTIFACT_CHANGED = "artifact.changed"
    EVIDENCE_CHANGED = "evidence.changed"
    SUBAGENT_SPAWNED = "subagent.spawned"
    SUBAGENT_STATUS = "subagent.status"
    SUBAGENT_INPUT = "subagent.input"
    SUBAGENT_COMPLETED = "subagent.completed"
    SUBAGENT_FAILED = "subagent.failed"
    SUBAGENT_CLOSED = "subagent.closed"
    LIMIT_CHANGED = "limit.changed"
    SNAPSHOT_UPDATED = "snapshot.updated"
    RUNTIME_WARNING = "runtime.warning"
    RUNTIME_ERROR = "runtime.error"
    PERMISSION_EVALUATED = "permission.evaluated"
    PERMISSION_REQUESTED = "permission.requested"
    PERMISSION_RESOLVED = "permission.resolved"
    SANDBOX_APPLIED = "sandbox.applied"
    SANDBOX_VIOLATION = "sandbox.violation"
    HOOK_STARTED = "hook.started"
    HOOK_COMPLETED = "hook.completed"
    HOOK_FAILED = "hook.failed"
    POLICY_CHANGED = "policy.changed"
    PROCESS_STARTED = "process.started"
    PROCESS_OUTPUT = "process.output"
    PROCESS_INPUT = "process.input"
    PROCESS_COMPLETED = "process.completed"
    PROCESS_FAILED = "process.failed"
    PROCESS_TERMINATED = "process.terminated"
    TASK_PROFILE_RESOLVED = "task.profile.resolved"
    ROUTING_CANDIDATES_RESOLVED = "routing.candidates.resolved"
    ROUTING_DECIDED = "routing.decided"
    ROUTING_FALLBACK_APPLIED = "routing.fallback.applied"
    ROUTING_NOT_POSSIBLE = "routing.not_possible"
    ROUTING_SINGLE_CANDIDATE = "routing.single_candidate"
    TASK_DELEGATED = "task.delegated"
    TASK_DEPENDENCY_UPDATED = "task.dependency.updated"
    TASK_ATTEMPT_STARTED = "task.attempt.started"
    TASK_ATTEMPT_COMPLETED = "task.attempt.completed"
    TASK_ATTEMPT_FAILED = "task.attempt.failed"
    COST_ESTIMATED = "cost.estimated"
    COST_RECORDED = "cost.recorded"
    RATE_LIMIT_HIT = "rate_limit.hit"
    QUOTA_LOW = "quota.low"
    QUOTA_BLOCKED = "quota.blocked"
    CHANNEL_CONNECTED = "channel.connected"
    CHANNEL_DISCONNECTED = "channel.disconnected"
    CHANNEL_RESUMED = "channel.resumed"
    CHANNEL_MESSAGE = "channel.message"
    CHANNEL_PERMISSION_FORWARDED = "channel.permission_forwarded"
    CHANNEL_PERMISSION_RETURNED = "channel.permission_returned"
    JOB_CREATED = "job.created"
    JOB_STARTED = "job.started"
    JOB_PROGRESS = "job.progress"
    JOB_ITEM_STARTED = "job.item.started"
    JOB_ITEM_COMPLETED = "job.item.completed"
    JOB_ITEM_FAILED = "job.item.failed"
    JOB_COMPLETED = "job.completed"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    OUTPUT_SPILLED = "output.spilled"
    OUTPUT_TRUNCATED = "output.truncated"
    OUTPUT_REDACTED = "output.redacted"
    OUTPUT_EXPIRED = "output.expired"
    HISTORY_WINDOW_LOADED = "history.window.loaded"
    HISTORY_RECONSTRUCTED = "history.reconstructed"
    HISTORY_ROLLBACK_STARTED = "history.rollback.started"
    HISTORY_ROLLBACK_COMPLETED = "history.rollback.completed"
    SNAPSHOT_REPAIRED = "snapshot.repaired"
    BENCHMARK_DATASET_RESOLVED = "benchmark.dataset.resolved"
    BENCHMARK_CONFIGURATION_RESOLVED = "benchmark.configuration.resolved"
    BENCHMARK_TRIAL_STARTED = "benchmark.trial.started"
    BENCHMARK_TRIAL_COMPLETED = "benchmark.trial.completed"
    BENCHMARK_TRIAL_FAILED = "benchmark.trial.failed"
    BENCHMARK_REWARD_RECORDED = "benchmark.reward.recorded"
    BENCHMARK_COMPARISON_COMPLETED = "benchmark.comparison.completed"


EVENT_TYPES: Final = frozenset(t.value for t in RuntimeEventType)

_IDS: Final = (
    ("sessionId", "session_id"),
    ("threadId", "thread_id"),
    ("turnId", "turn_id"),
    ("taskId", "task_id"),
    ("runId", "run_id"),
    ("attemptId", "attempt_id"),
    ("actionId", "action_id"),
    ("channelId", "channel_id"),
)
"""Id properties the runtime's events carry (non-empty strings, schema `minLength: 1`)."""
_TEXTS: Final = (
    ("schemaVersion", "schema_version"),
    ("runtimeId", "runtime_id"),
    ("status", "status"),
    ("statusReason", "status_reason"),
    ("traceId", "trace_id"),
)


def check_timestamp(value: str, path: str) -> str:
    """`value` when it is an RFC 3339 date-time with its offset (`Z` or `+hh:mm`)."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or "T" not in value.upper():
        raise ValidationError.for_field(
            path, f"{value[:40]!r} is not an RFC 3339 date-time (2026-05-11T10:00:00Z)"
        )
    return value


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """One runtime fact (see the module docstring). `payload` None: no payload."""

    type: str
    event_id: str
    timestamp: str
    sequence: int | None = None
    schema_version: str | None = None
    runtime_id: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    attempt_id: str | None = None
    action_id: str | None = None
    channel_id: str | None = None
    status: str | None = None
    status_reason: str | None = None
    trace_id: str | None = None
    payload: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Every other property, as it came."""

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValidationError.for_field(
                "type", f"{self.type[:64]!r} is not an event type of the runtime contract"
            )
        if not self.event_id:
            raise ValidationError.for_field("eventId", "must not be empty")

    @classmethod
    def from_json(cls, doc: object, where: str = "") -> RuntimeEvent:
        """Read an event document (ValidationError naming the first bad property)."""
        fields = Fields(doc, where)
        kind = fields.required_text("type")
        if kind not in EVENT_TYPES:
            raise ValidationError.for_field(
                fields.path("type"), f"{kind[:64]!r} is not an event type of the runtime contract"
            )
        known: dict[str, Any] = {
            "type": kind,
            "event_id": fields.required_text("eventId", nonempty=True),
            "timestamp": check_timestamp(
                fields.required_text("timestamp"), fields.path("timestamp")
            ),
            "sequence": fields.integer("sequence", minimum=0),
        }
        for key, name in _IDS:
            known[name] = fields.text(key, nonempty=True)
        for key, name in _TEXTS:
            known[name] = fields.text(key)
        payload = fields.raw("payload")
        extra = fields.rest()
        if payload is None and fields.present("payload"):
            extra["payload"] = None  # a null payload is kept as it came
        return cls(**known, payload=payload, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """The event document (camelCase properties, absent ones left out)."""
        out: dict[str, Any] = {
            "type": self.type,
            "eventId": self.event_id,
            "timestamp": self.timestamp,
        }
        put(out, "sequence", self.sequence)
        for key, name in (*_TEXTS[:2], *_IDS, *_TEXTS[2:]):
            put(out, key, getattr(self, name))
        put(out, "payload", self.payload)
        return merged(out, self.extra)
