"""Stored records of the registry and the router, shared by the engine and every store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from apiary.core.events import EventDraft
from apiary.core.value import value


class MessageState(StrEnum):
    """Message lifecycle states (RFC Appendix C; DESIGN.md section 2)."""

    SENT = "SENT"
    RECEIVED = "RECEIVED"
    READ = "READ"
    FULFILLED = "FULFILLED"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    RETRYING = "RETRYING"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {MessageState.FULFILLED, MessageState.REJECTED, MessageState.FAILED, MessageState.TIMED_OUT}
)


_STATE_TEXT: dict[str, str] = {state: state.value for state in MessageState}
"""Each state's text, keyed by the member (and so by its text: a StrEnum member hashes and
compares as its value)."""


def state_text(state: str) -> str:
    """The text of a message state given as a member or its text; ValueError for anything
    else. A dict lookup: `MessageState(state).value` costs several times as much, and every
    admission, state change and state event asks."""
    return _STATE_TEXT.get(state) or MessageState(state).value


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """A registered agent. `descriptor` holds the AgentDescriptor fields as JSON values."""

    agent_id: str
    name: str
    state: str
    registered_at: float
    last_heartbeat_at: float
    descriptor: Mapping[str, Any] = field(default_factory=dict)


@value
class StoredMessage:
    """A durably admitted envelope addressed to one recipient.

    `offset` is the position in the recipient's inbox (assigned by the store on admission,
    strictly increasing per recipient from 1); stream resumption reads after an offset.
    `envelope` is the canonical Envelope's serialized bytes, kept verbatim.
    """

    message_id: str
    recipient: str
    producer_id: str
    correlation_id: str
    message_type: int
    envelope: bytes
    state: MessageState
    created_at: float
    updated_at: float
    offset: int = 0
    error_code: str = ""
    idempotency_token: str = ""
    sequence_number: int = 0
    lane: str = "STANDARD"
    """Communication class lane of the producer: PRIVILEGED, STANDARD or BULK (RFC 7.3)."""
    ack_deadline: float = 0.0
    """Not written by the router any more (0.0): the ACK deadline runs from a hand-out to a
    live stream and is kept in memory (`engine.deadlines`), restarted on every redelivery.
    Kept for rows written before, and for stores' `due` queries."""
    expires_at: float = 0.0
    """TTL expiry (envelope timestamp + ttl_ms); 0 when the message has no TTL."""
    deliveries: int = 0
    """How many times the message was handed to the recipient's stream."""
    last_delivered_at: float = 0.0
    acked_stage: str = ""
    """The furthest AckStage name the recipient acknowledged ('' before any)."""
    signature: bytes = b""
    """The producer's Ed25519 signature over `envelope`, verified at admission (message
    signing on; RFC 6.2) and delivered with it so that the recipient can verify it too; for
    a message the coordinator derived from a signed envelope (a requeued dead letter, a
    message assembled from chunks), the signature over that origin followed by its bytes
    (`core.signatures.with_origin`)."""


def at_offset(message: StoredMessage, offset: int) -> StoredMessage:
    """`message` as admitted at `offset`. The same as dataclasses.replace, at well under half
    its cost: admission makes one copy per message, on the hot path."""
    m = message
    return StoredMessage(
        m.message_id, m.recipient, m.producer_id, m.correlation_id, m.message_type,
        m.envelope, m.state, m.created_at, m.updated_at, offset, m.error_code,
        m.idempotency_token, m.sequence_number, m.lane, m.ack_deadline, m.expires_at,
        m.deliveries, m.last_delivered_at, m.acked_stage, m.signature,
    )  # fmt: skip


def handed_out(message: StoredMessage, at: float, deliveries: int) -> StoredMessage:
    """`message` after its delivery number `deliveries` at `at` (like `at_offset`, a cheap
    dataclasses.replace: delivery makes one copy per message)."""
    m = message
    return StoredMessage(
        m.message_id, m.recipient, m.producer_id, m.correlation_id, m.message_type,
        m.envelope, m.state, m.created_at, m.updated_at, m.offset, m.error_code,
        m.idempotency_token, m.sequence_number, m.lane, m.ack_deadline, m.expires_at,
        deliveries, at, m.acked_stage, m.signature,
    )  # fmt: skip


@value
class StateChange:
    """One message state change, for batched updates."""

    message_id: str
    state: MessageState
    at: float
    error_code: str = ""
    acked_stage: str = ""
    """When non-empty, also record the furthest acknowledged stage."""
    clear_ack_deadline: bool = False
    deliveries: int = 0
    """The hand-outs counted so far, which the router writes behind (with the message's
    next change); a store keeps the larger of this and the count it has."""
    last_delivered_at: float = 0.0
    """The last hand-out's time, kept the same way."""
    expected: str = ""
    """When non-empty, the state the change was decided from: it applies only while the
    message is still in it (cluster mode, where another replica may have changed the
    message since it was read); else the store applies nothing of the call and raises
    `store.errors.StaleStateError`."""


def changed(message: StoredMessage, change: StateChange) -> StoredMessage:
    """`message` after `change`, as every store applies it: state, time and error code
    replaced, the acknowledged stage kept unless the change names one, the ACK deadline
    cleared on request, the delivery count and time the larger of the two. Lets a caller
    that holds the current record skip reading it back."""
    m = message
    return StoredMessage(
        m.message_id, m.recipient, m.producer_id, m.correlation_id, m.message_type,
        m.envelope, change.state, m.created_at, change.at, m.offset, change.error_code,
        m.idempotency_token, m.sequence_number, m.lane,
        0.0 if change.clear_ack_deadline else m.ack_deadline, m.expires_at,
        max(m.deliveries, change.deliveries), max(m.last_delivered_at, change.last_delivered_at),
        change.acked_stage or m.acked_stage, m.signature,
    )  # fmt: skip


def merged(first: StateChange, then: StateChange) -> StateChange:
    """One change of a message with the effect of `first` and then `then` on it (`changed`
    of both in turn), decided from the state `first` was (`expected`)."""
    return StateChange(
        then.message_id, then.state, then.at, then.error_code,
        then.acked_stage or first.acked_stage,
        first.clear_ack_deadline or then.clear_ack_deadline,
        max(first.deliveries, then.deliveries),
        max(first.last_delivered_at, then.last_delivered_at), first.expected,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """The idempotency cache entry of one logical operation (RFC 11.2, 11.1, 21).

    `status` is the MessageState name of the operation's current attempt, or of the earliest
    attempt that reached a terminal outcome once one has (`outcome_at` > 0).
    """

    token: str
    producer_id: str
    original_message_id: str
    """The first attempt (and, after reconciliation, the earliest successful one)."""
    current_message_id: str
    status: str
    created_at: float
    updated_at: float
    outcome_at: float = 0.0
    """When a terminal outcome was cached (the `cached_at` of DUPLICATE_DETECTED); 0: none."""
    error_code: str = ""
    result: str = ""
    """The cached result: the terminal ACK's note (JSON text when the agent sent JSON)."""
    attempts: tuple[str, ...] = ()
    """Every attempt's message_id, oldest first."""


@dataclass(frozen=True, slots=True)
class AdmissionBound:
    """Cluster mode: the limits a message's admission is held to by the store, counted in
    the admitting transaction over every replica's admissions (`core.admission_bounds`);
    0 for a limit not applied."""

    capacity: int = 0
    """The recipient's buffer capacity: its messages admitted and not yet READ (RFC 13)."""
    window: int = 0
    """The recipient's credit window: its messages in flight (not finished), from every
    producer (RFC 13.1)."""
    cap: int = 0
    """The per-producer cap: its messages in flight from this one producer."""
    queued: int = 0
    """The tenant's `queued_messages` quota: its messages admitted and not yet READ, to
    every recipient (the store's whole table)."""


@dataclass(frozen=True, slots=True)
class AdmissionWrites:
    """What commits with one message's admission, in its transaction, when the message is
    admitted (a duplicate member writes none of it): its events and, for a message sent
    under an idempotency token, the token's record. A store that committed the message has
    committed these; one that did not, neither."""

    events: tuple[EventDraft, ...] = ()
    idempotency: IdempotencyRecord | None = None
    task: TaskRecord | None = None
    """A task record stored with the message: the Scheduler's dispatch, the task DISPATCHED
    with the envelope that carries it to its agent."""
    idempotency_found: IdempotencyRecord | None = None
    """The token's record as deduplication found it before admitting the message (None:
    none). `idempotency` is written only if the stored record is still that one, or absent
    (`core.dedup.unchanged`): otherwise another admission of the token (on another replica)
    came first, and the message is not admitted (`store.errors.TokenTakenError`)."""
    idempotency_forced: bool = False
    """Write `idempotency` whatever is stored (an operator's requeue of a dead letter)."""
    requeues: int = 0
    """The dead letter (DLQ entry id) the message requeues (0: none): marked requeued as
    the message, at its `created_at`, in the admission's transaction, if no requeue marked
    it before; else the message is not admitted (`store.errors.RequeuedError`), so that
    of two requeues of one entry at once (on two replicas) one is admitted."""
    bound: AdmissionBound | None = None
    """Cluster mode: the limits the store holds the admission to (`AdmissionBound`); a
    member over one is not admitted (`store.errors.BoundExceededError`)."""
    task_new: bool = False
    """`task` is a new task (its submission, dispatched in the transaction that stores it):
    when its task_id is stored already, the message is not admitted
    (`store.errors.TaskExistsError`) and nothing of the member is written."""


@dataclass(frozen=True, slots=True)
class TokenProgress:
    """An attempt's new state, to be reflected in its token's idempotency record
    (core/dedup.py `advance`) by the store in the transaction that stores the attempt's own
    state change: read, updated and written there, so that the record commits with the state
    it records and no other write of the token comes between its read and its write.

    `cached` is the event appended with it when the attempt's outcome becomes the one the
    record caches (its `original_message_id` is then `message_id`, its status `state`)."""

    key: str
    """The record's key (the producer-scoped token, engine/router/dedup_gate.py)."""
    message_id: str
    state: MessageState
    at: float
    error_code: str = ""
    result: str = ""
    cached: EventDraft | None = None
    producer: str = ""
    """When the token has no record: the producer whose record an outcome starts (a token
    its producer keeps unique by records of its own, which admission starts no record for:
    engine/router/dedup_gate.py `kept_by_producer`); '' leaves an absent record absent."""


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """A dead-lettered message with the diagnostic context of RFC 21.1."""

    entry_id: int
    """Assigned by the store, strictly increasing from 1."""
    message_id: str
    producer_id: str
    recipient: str
    correlation_id: str
    message_type: int
    error_code: str
    """Final error classification (a protocol error code)."""
    reason: str
    created_at: float
    """When the message was first accepted."""
    failed_at: float
    content_type: str
    payload_size: int
    envelope: bytes
    """The canonical Envelope bytes: the secure reference to the payload (never exported
    whole by default; `payload_excerpt` gives operators a bounded view)."""
    attempts: tuple[Mapping[str, Any], ...] = ()
    """Attempt history: one JSON object per event (at, what, reason) in time order."""
    route: str = ""
    """How it travelled, e.g. 'producer -> coordinator -> recipient'."""
    requeued_at: float = 0.0
    requeued_as: str = ""
    """The message_id the requeued copy was admitted under."""
    signature: bytes = b""
    """What vouched for `envelope` (message signing on): the producer's signature, followed by
    the signed origin envelope for a message the coordinator had derived
    (`core.signatures.with_origin`); a requeue carries it on. Empty without signing."""


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """Conjunctive DLQ filter (RFC 21.1); None fields match everything."""

    since: float | None = None
    until: float | None = None
    error_code: str | None = None
    recipient: str | None = None
    producer_id: str | None = None
    include_requeued: bool = True

    def matches(self, entry: DlqEntry) -> bool:
        checks = (
            self.since is None or entry.failed_at >= self.since,
            self.until is None or entry.failed_at <= self.until,
            self.error_code is None or entry.error_code == self.error_code,
            self.recipient is None or entry.recipient == self.recipient,
            self.producer_id is None or entry.producer_id == self.producer_id,
            self.include_requeued or not entry.requeued_as,
        )
        return all(checks)


@dataclass(frozen=True, slots=True)
class HitlRecord:
    """One HITL invocation and, once there is one, its decision (RFC 15).

    `state` is a HitlState name (core/hitl/vocabulary.py): PENDING, DECIDED, TIMED_OUT,
    FALLBACK_APPLIED or CANCELLED. JSON-valued fields hold plain JSON objects/lists.
    """

    invocation_id: str
    reason_type: str
    """A HitlReasonType name: CONFLICT, SECURITY_APPROVAL, TASK_ESCALATION, ..."""
    state: str
    created_at: float
    updated_at: float
    deadline: float
    """When the configured fallback applies if nobody decided (UTC seconds)."""
    requested_by: str
    """The agent or engine area that escalated."""
    correlation_id: str = ""
    subject: Mapping[str, Any] = field(default_factory=dict)
    """What the decision is about: repo_id, worktree_id, task_id, negotiation_id, ..."""
    context: Mapping[str, Any] = field(default_factory=dict)
    """Facts, diffs, risk notes, prior attempts, inference-engine metadata."""
    suggested_action: str = ""
    proposed_actions: tuple[str, ...] = ()
    approver_roles: tuple[str, ...] = ()
    """Roles allowed to decide; empty means any authenticated operator."""
    timeout_action: str = "DENY"
    """Fallback at the deadline: DENY (deny-by-default) or AUTO_RESOLVE (suggested action)."""
    priority: int = 0
    extensions: int = 0
    """How many times the deadline was extended (defer, EXTEND_TIMEOUT)."""
    decision: Mapping[str, Any] = field(default_factory=dict)
    """The decision record once decided: action, rationale, patch, decided_by, decided_at,
    via (operator | deadline | unavailable | cancelled), policy."""


class TaskState(StrEnum):
    """Where a scheduled task stands (RFC 7, 9; the lifecycle is core/tasks/machine.py).

    QUEUED waits in its agent's queue (a yielded task returns here, keeping its place); HELD
    waits for a HITL decision before it may queue (a duplicate job, RFC 9.2); DISPATCHED was
    handed to the router as a DATA envelope; RUNNING was read by the agent. COMPLETED and
    FAILED are the ends.
    """

    QUEUED = "QUEUED"
    HELD = "HELD"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.FAILED)


@value
class TaskRecord:
    """One task submitted to the Scheduler (SubmitTask), as stored.

    `priority`, `submitted_at` and `seq` are the queue order (core/tasks/queue.py); `scope`
    the scope metadata as submitted; `job_key` the job identity used for uniqueness (RFC 9.2);
    `params` and `content_type` the payload the agent receives; `message_id` the DATA
    envelope of the current (last) dispatch and `attempts` how many dispatches there were.
    `state` changes only through the task machine (core/tasks/machine.py); `error_code` and
    `note` say why it failed or what happened last (yielded, terminated, held for ...).
    `submitter` is who submitted it (WaitTask and WatchTasks are its) and `result` what its
    agent returned, as JSON text (core/tasks/result.py).
    A `value` record (core/value.py): it is built several times over each task's run.
    """

    task_id: str
    agent_id: str
    priority: int
    submitted_at: float
    seq: int
    state: TaskState
    updated_at: float
    scope: str = ""
    job_key: str = ""
    params: bytes = b""
    content_type: str = ""
    agent_type: str = ""
    """The target agent's type (its descriptor name) when submitted: the key of
    max_parallel_instances (RFC 9.1)."""
    message_id: str = ""
    attempts: int = 0
    error_code: str = ""
    note: str = ""
    lane: str = "STANDARD"
    """The communication-class lane it is dispatched in (RFC 7.3): its submitter's class."""
    correlation_id: str = ""
    """The correlation id of the envelopes the task causes (`flow_id`): '' for the task_id;
    a workflow's node tasks carry the workflow id."""
    submitter: str = ""
    """The submitting principal's name (an anonymous caller's `apiary-submitter`); '' when
    not known."""
    result: str = ""
    """The outcome of a COMPLETED task as JSON text; '' when it has none."""
    queue: str = ""
    """The shared queue it was submitted to (`capability:<name>` or `agent_type:<name>`,
    core/tasks/shared.py); '' for a task submitted to one agent. A shared task's `agent_id`
    is the agent holding it (or that held it last), '' while it waits."""
    lost_attempts: int = 0
    """How many of its attempts ended because the agent holding it was lost (failed, shut
    down, deregistered): a shared task goes back to its queue until `[scheduler]
    max_attempts` of them."""

    @property
    def flow_id(self) -> str:
        """The correlation id its dispatches, notices and control messages carry."""
        return self.correlation_id or self.task_id


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """One agent handoff (RFC 17.6) as stored: the request, where it stands, and who may
    read its context.

    `state` is a HandoffState value (core/handoff.py). `to_agent` is the current target;
    `requested_to` the target as requested ("" for capability-based routing). Each offer to
    a target is an attempt: `attempt` counts them from 1 and `tried` lists their targets in
    order (the current one last). `deadline` is when the current offer expires (UTC seconds).
    `context_holders` are the agents allowed to read `context_snapshot`: the origin and the
    current target while the handoff is open, the receiving agent alone once it completed.
    """

    request_id: str
    from_agent: str
    to_agent: str
    state: str
    created_at: float
    updated_at: float
    deadline: float
    timeout_s: float
    """The acceptance window of every attempt, in seconds."""
    requested_to: str = ""
    reason: str = ""
    context_snapshot: bytes = b""
    snapshot_content_type: str = ""
    """The snapshot's declared media type; "" when the requester declared none (opaque)."""
    capabilities_required: tuple[str, ...] = ()
    priority: int = 0
    attempt: int = 1
    tried: tuple[str, ...] = ()
    accepting_agent: str = ""
    rejection_reason: str = ""
    """Why the last target declined ("" unless the handoff is REJECTED)."""
    context_holders: tuple[str, ...] = ()
