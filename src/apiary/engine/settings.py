"""Operational settings of the messaging plane, with the RFC's defaults (RFC 20)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from apiary.core.acl import AclPolicy
from apiary.core.conflicts import ConflictPolicy
from apiary.core.credit_adaptation import AdaptivePolicy
from apiary.core.envelope_rules import PayloadLimits
from apiary.core.lanes import LanePolicy
from apiary.core.limits import DEFAULT_LIMITS, Limits
from apiary.core.preemption import PreemptionPolicy
from apiary.core.tasks.capacity import MAX_PREFETCH
from apiary.engine.inference import InferenceSettings
from apiary.engine.lifecycle import LifecycleSettings
from apiary.errors import ValidationError


@dataclass(frozen=True, slots=True)
class RouterSettings:
    ack_timeout_s: float = 10.0
    """Time from a hand-out to the recipient's stream to its first acknowledgement (RFC 11);
    re-armed on every redelivery. A message no stream holds has no ACK due: see
    `max_age_s`."""
    max_age_s: float = 24 * 3600.0
    """How long an unacknowledged message may wait for its recipient while no stream holds
    it (the recipient offline, or the coordinator restarting), counted from admission; it
    then fails into the DLQ (agent_unavailable, saying why) and its producer is NACKed. Its
    TTL, when shorter, ends it first. 0 = no maximum: only the TTL bounds the wait."""
    buffer_capacity: int = 10
    """Default inbound buffer per agent (RFC 13); per-agent values override it."""
    dedup_window_s: float = 3600.0
    """Idempotency deduplication window (RFC 11.2)."""
    limits: PayloadLimits = field(default_factory=PayloadLimits)
    fields: Limits = DEFAULT_LIMITS
    """The bounds on envelope ids, names and times (the configuration's [limits] table)."""
    hlc_required: bool = False
    """When HLC is enabled every envelope must carry hlc_timestamp (RFC 11.1)."""
    strict_correlation_ids: bool = False
    """Every correlation_id must be a UUIDv4 (RFC 11.1, 11.3): envelopes with another one are
    refused, and so are the ids that become the correlation ids of the coordinator's own
    messages (task, workflow, negotiation, room and handoff ids, HITL and tool-call
    correlation ids). Off by default: other SDKs send free strings ("wf123", the RFC's own
    example), which the RFC also sets correlation_id to (docs/decisions.md)."""
    credit_window: int = 0
    """Credit-based flow control (RFC 13.1): in-flight deliveries per receiver; 0 = off."""
    per_producer_cap: int = 0
    """With credits on: at most this many in flight per producer and receiver; 0 = none."""
    credit_adaptive: bool = False
    """With credits on: each receiver's window follows its delivery latency (RFC 13.1 MAY;
    `core.credit_adaptation`), between `credit_min_window` and `credit_window`."""
    credit_min_window: int = 1
    credit_target_latency_s: float = 1.0
    """The hand-out to terminal ACK latency an adaptive window aims for."""
    lanes: LanePolicy = field(default_factory=LanePolicy)
    max_deliveries: int = 5
    """Retry budget: a message handed out this many times without any acknowledgement fails
    into the DLQ (agent_unavailable) on the next attempt; 0 = unlimited."""
    max_frame_items: int = 5000
    """Envelopes per SendStream frame (RFC 5.4: batches bounded by count)."""
    max_frame_bytes: int = 16 * 1024 * 1024
    """Payload bytes per SendStream frame (RFC 5.4: batches bounded by size)."""
    max_batch: int = 256
    """Deliveries per stream batch, and the bound on backlog replayed per read (RFC 5.5)."""
    acl: AclPolicy = field(default_factory=AclPolicy)
    """Message ACLs (`core.acl`; `[router.acl]`): which agents may send which message types
    to whom. Empty: open (development mode). Tool ACLs are `[tools.acl]`."""
    signing_required: bool = False
    """Message signing (RFC 6.2; DESIGN.md section 9): agents register an Ed25519 public key,
    and every envelope they send must carry its signature (`core.signatures`)."""
    hand_over_wait_s: float = 0.05
    """How long a forwarded ACK for a streaming producer waits to be taken by its stream
    from memory before it is stored like any other notice; 0 = always store it."""
    notice_ttl_s: float = 3600.0
    """Coordinator notices (NACKs, forwarded ACKs, join/leave) expire after this long."""
    retention_s: float = 7 * 24 * 3600.0
    """Finished messages, idempotency records and DLQ entries are purged after this long."""


def adaptive_policy(settings: RouterSettings) -> AdaptivePolicy:
    """The adaptive credit policy of `settings`; ValidationError naming the field that makes
    it impossible."""
    if not settings.credit_window:
        raise ValidationError.for_field(
            "credit_adaptive", "needs credit_window: there is no window to adapt"
        )
    if settings.credit_min_window > settings.credit_window:
        raise ValidationError.for_field(
            "credit_min_window",
            f"must not exceed credit_window ({settings.credit_window}),"
            f" got {settings.credit_min_window}",
        )
    return AdaptivePolicy(settings.credit_target_latency_s, settings.credit_min_window)


def default_max_parallel() -> int:
    """Instances of one agent type running tasks at once when no limit is configured (RFC 9.1
    SHOULD: a default based on system capabilities): four per CPU, at least 8."""
    return max(8, 4 * (os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The Scheduler's knobs (`[scheduler]` in the configuration file)."""

    max_parallel_instances: Mapping[str, int] = field(default_factory=dict)
    """Per agent type (the descriptor's name): tasks running at once (RFC 9.1)."""
    default_max_parallel: int = field(default_factory=default_max_parallel)
    max_queued: int = 1_000_000
    """Tasks waiting (queued or held) at most; beyond it SubmitTask answers accepted=false."""
    duplicate_jobs: str = "escalate"
    """RFC 9.2: a duplicate of a live job is refused; "escalate" also asks HITL whether to run
    it anyway (the task is HELD meanwhile), "reject" just refuses."""
    conflicts: ConflictPolicy = field(default_factory=ConflictPolicy)
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    lanes: LanePolicy = field(default_factory=LanePolicy)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    dispatch_attempts: int = 3
    """Dispatches of one task that may time out (no ACK) before it fails."""
    max_attempts: int = 3
    """Attempts of a shared-queue task that may end with the agent holding it lost (failed,
    shut down, deregistered) before the task fails instead of going back to its queue."""
    prefetch: int = 4
    """Tasks kept in flight to an agent beyond its `task_concurrency`, waiting at the agent
    so that the next one is there when one ends (only to agents that declared their
    concurrency; core/tasks/capacity.py)."""
    retry_after_s: float = 1.0
    """When a dispatch met a full inbound buffer, try again after this long."""
    inference_timeout_s: float = 5.0
    """Bound on one Inference Engine consultation; beyond it the engine counts as unavailable."""
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    """The Inference Engine consulted on scope conflicts (`[scheduler.inference]`)."""
    hitl_timeout_s: float = 0.0
    """Decision window of the Scheduler's HITL invocations; 0 = the HITL default."""

    def __post_init__(self) -> None:
        for agent_type, limit in self.max_parallel_instances.items():
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValidationError.for_field(
                    f"scheduler.max_parallel_instances.{agent_type}", "must be an integer >= 1"
                )
        for name in ("default_max_parallel", "max_queued", "dispatch_attempts", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError.for_field(f"scheduler.{name}", "must be an integer >= 1")
        prefetch = self.prefetch
        if isinstance(prefetch, bool) or not isinstance(prefetch, int):
            raise ValidationError.for_field("scheduler.prefetch", "must be an integer")
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise ValidationError.for_field(
                "scheduler.prefetch", f"must be between 0 and {MAX_PREFETCH}"
            )
        if self.duplicate_jobs not in ("escalate", "reject"):
            raise ValidationError.for_field(
                "scheduler.duplicate_jobs", "must be 'escalate' or 'reject'"
            )

    def instance_limit(self, agent_type: str) -> int:
        return self.max_parallel_instances.get(agent_type, self.default_max_parallel)
