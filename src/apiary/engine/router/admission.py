"""Admission: what the router decides about each incoming envelope before anything is stored.

The gates, in one fixed order: signature, ACL, validation, route, dedup, reserve. Each
envelope's recipient is resolved once and that answer serves the ACL and the route. One
decision (`Admission.decide`) walks the gates as far as memory answers them; where a gate
needs the store it stops there and says so (`Wait`): an agent's ACK is first applied to the
message it acknowledges (`MessageLifecycle`), a chunk joins its transfer, a
coordinator-internal participant handles its envelope, an idempotency token or an old
sequence number is looked up (`DedupGate.check`). `Admission.admit` does that waiting and
goes on through the same gates; most of a stream never waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Final

from apiary.core.acl import AclPolicy
from apiary.core.addressing import resolve_recipient
from apiary.core.chunks import CHUNK_CONTENT_TYPE
from apiary.core.envelope import Envelope, MessageType
from apiary.core.envelope_rules import (
    check_modality,
    content_type_base,
    ttl_deadline,
    validate_envelope,
)
from apiary.core.records import AdmissionWrites, MessageState, StoredMessage
from apiary.core.signatures import SIGNATURE_KEY, verifies, with_origin
from apiary.core.trace_context import TraceContext
from apiary.core.value import value
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.registry import Registry
from apiary.engine.router.credit_control import CreditControl
from apiary.engine.router.inbox import Inboxes
from apiary.engine.settings import RouterSettings
from apiary.engine.transfers import Transfers
from apiary.errors import (
    ApiaryError,
    BufferFullError,
    NoRouteError,
    PermissionDeniedError,
)

if TYPE_CHECKING:  # both import this module's records
    from apiary.engine.router.dedup_gate import DedupGate
    from apiary.engine.router.lifecycle import MessageLifecycle

NOTICE_TYPES = frozenset({MessageType.ACKNOWLEDGEMENT, MessageType.HEARTBEAT})
_ACK = MessageType.ACKNOWLEDGEMENT

LocalEndpoint = Callable[[Envelope], Awaitable[None]]
"""A coordinator-internal participant's handler (see Router.attach)."""
EndpointCheck = Callable[[Envelope], object]
"""What of an envelope an endpoint decides without its state (its type, its payload's
shape, its sender's right): raises to refuse it (see Router.attach)."""


def is_notice(message: StoredMessage | Envelope) -> bool:
    """Notices need no acknowledgement and take no buffer space: ACKs, heartbeats and
    whatever the coordinator itself produced. They are FULFILLED when handed out, and
    admitted without deduplication."""
    return message.producer_id == COORDINATOR or message.message_type in NOTICE_TYPES


@value
class Outbound:
    """An envelope a producer (or the coordinator) wants delivered."""

    envelope: Envelope
    recipient: str = ""
    """Explicit recipient (sw4rm-recipient metadata / gateway field); '' to resolve."""
    raw: bytes = b""
    """The envelope's canonical bytes when the caller has them already (from the wire):
    stored as they are instead of encoding `envelope` again."""
    requeue: bool = False
    """An operator's requeue of a dead letter (RFC 21.1): admitted without deduplication,
    since re-running the operation is the point."""
    dead_letter: int = 0
    """For a requeue: the dead letter's DLQ entry id, marked requeued as the copy in the
    admission's transaction, once (`AdmissionWrites.requeues`): of two requeues of one
    entry at once, on any replicas, one is admitted, the other refused already_completed."""
    lane: str = ""
    """The communication-class lane (RFC 7.3) when the producer chooses it per message (the
    Scheduler dispatches each task in its submitter's lane); '' for the producer's class."""
    signature: bytes = b""
    """The producer's Ed25519 signature of `raw` (RFC 6.2), as it came with the envelope."""
    remote: bool = False
    """Arrived from an agent over the network (gRPC or the gateway), as opposed to produced
    inside the coordinator: with signing on, only remote envelopes carry signatures."""
    origin: bytes = b""
    """For a requeued dead letter: the signed envelope it was derived from, which
    `signature` covers (checked again before it is kept with the copy)."""
    trace: TraceContext | None = None
    """The trace context the message continues (docs/tracing.md), when its sender gives one;
    else, with tracing on, the router takes the context current at admission."""
    new_token: bool = False
    """The producer vouches that the envelope's idempotency token is new (the Scheduler's
    `task:<id>:<attempt>`, one per dispatch attempt): its record is started without the
    store being asked for one. Honoured for the coordinator's own endpoints only."""
    stored_with: AdmissionWrites | None = None
    """The producer's own writes that commit with the envelope's admission, or not at all
    (the Scheduler's dispatch: the task DISPATCHED, with its event). The coordinator's own
    endpoints only: anyone else's is refused."""
    admission_logged: bool = False
    """The first of `stored_with`'s events records the message's admission: it names the
    message, its recipient, lane and state (the Scheduler's task.dispatched), and no
    `message.received` is logged besides it."""
    validated: bool = False
    """The producer built the envelope from input that passed the message-types rules when
    it came in (the Scheduler's dispatch of a task's params, checked at SubmitTask:
    engine/scheduler/jobs.py): the validation gate skips it. Honoured for the coordinator's
    own endpoints only."""


@dataclass(slots=True)
class SendOutcome:
    """The result for one envelope of a send (RFC 5.4: per-message outcomes)."""

    message_id: str
    accepted: bool
    error: ApiaryError | None = None
    reason: str = ""
    stored: StoredMessage | None = None
    details: dict[str, str] = field(default_factory=dict)

    @classmethod
    def refusal(
        cls, message_id: str, error: ApiaryError, details: dict[str, str] | None = None
    ) -> SendOutcome:
        """The outcome of an envelope refused with `error`."""
        reason = f"{error.code}: {error.message}"
        return cls(message_id, False, error, reason, details={} if details is None else details)

    @property
    def error_code(self) -> str:
        return self.error.code if self.error else ""

    @property
    def recipient(self) -> str:
        return self.stored.recipient if self.stored else ""


@dataclass(slots=True)
class PreparedSend:
    """A batch between `Router.prepare` and `Router.complete`: every member's outcome so far
    and the records to admit (by index into `items`), with buffer space reserved for them."""

    items: Sequence[Outbound]
    now: float
    outcomes: list[SendOutcome]
    admit: list[tuple[int, StoredMessage]]


def merged(batches: Sequence[PreparedSend]) -> PreparedSend:
    """Prepared batches as one, in order (completed with one durable write); the outcomes of
    batch k are the slice of its items' length after those of the batches before it."""
    items: list[Outbound] = []
    outcomes: list[SendOutcome] = []
    admit: list[tuple[int, StoredMessage]] = []
    for batch in batches:
        base = len(items)
        items.extend(batch.items)
        outcomes.extend(batch.outcomes)
        admit.extend((base + index, record) for index, record in batch.admit)
    return PreparedSend(items, batches[-1].now, outcomes, admit)


# Rejections that are outcomes of a well-formed request rather than faults in it: the call
# answers accepted=false (plus a NACK), instead of failing (DESIGN.md section 5).
SOFT_REJECTIONS = frozenset({"buffer_full", "already_in_progress", "duplicate_detected"})


class Gate(Enum):
    """The gates that wait on the store (see the module's docstring)."""

    ACK = "ack"
    CHUNK = "chunk"
    ENDPOINT = "endpoint"
    DEDUP = "dedup"
    AGENT = "agent"
    """Cluster mode: a recipient this replica does not know yet, looked up in the store
    (another replica may have registered it since this one last read the registry)."""
    PRODUCER = "producer"
    """Cluster mode: the same for the producer an applied ACK is forwarded to."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Where the gates stop for the store: at `gate`, for `env` (the item's envelope, or
    the one its chunks assembled) to `target` as `raw`."""

    gate: Gate
    env: Envelope | None = None
    target: str = ""
    raw: bytes = b""


ACK_FIRST: Final = Wait(Gate.ACK)
"""An agent's ACK past the gates before routing: its recipient is the producer of the
message it acknowledges, known once the ACK is applied (`MessageLifecycle`)."""

Admitted = tuple[SendOutcome, StoredMessage | None]
"""A member's outcome and, when it is to be stored, its record (buffer space reserved)."""
Decision = Admitted | Wait


class Admission:
    """The gates (the module's docstring), one envelope at a time; `Batches` takes a
    batch through them."""

    def __init__(
        self, settings: RouterSettings, registry: Registry, codec: EnvelopeCodec,
        events: EventRecorder, inboxes: Inboxes, credits: CreditControl, dedup: DedupGate,
        endpoints: Mapping[str, LocalEndpoint], transfers: Transfers,
        lifecycle: MessageLifecycle,
    ) -> None:  # fmt: skip
        self._settings = settings
        self._registry = registry
        self._codec = codec
        self._events = events
        self._inboxes = inboxes
        self._credits = credits
        self._dedup = dedup
        self._endpoints = endpoints
        self._transfers = transfers
        self._lifecycle = lifecycle
        self._signing = settings.signing_required
        self._acl: AclPolicy | None = settings.acl if settings.acl.messages else None

    def decide(self, item: Outbound, now: float, acked: str = "") -> Decision:
        """The gates for `item` as far as memory answers: its outcome (and record), or the
        first gate that waits on the store. `acked`: where its ACK, applied already, is
        forwarded (the gates before routing passed then)."""
        env = item.envelope
        try:
            if acked:
                target = resolve_recipient(env, item.recipient, acked)
                if target == acked and self._unreachable(target):
                    if self._registry.reads_through:
                        return Wait(Gate.PRODUCER, env, target)
                    return _not_forwarded(env, target)
            else:
                screened = self._screened(item, now)
                if screened is None:
                    return ACK_FIRST
                target = screened
            if content_type_base(env.content_type) == CHUNK_CONTENT_TYPE:
                return Wait(Gate.CHUNK, env, target)
            return self._routed(item, env, target, now, item.raw)
        except ApiaryError as exc:
            return SendOutcome.refusal(env.message_id, exc), None

    async def admit(self, item: Outbound, now: float, decision: Decision | None = None) -> Admitted:
        """`item` through every gate, waiting on the store where `decide` stops; `decision`:
        what `decide` answered already."""
        if decision is None:
            decision = self.decide(item, now)
        while isinstance(decision, Wait):
            wait = decision
            try:
                decision = await self._resume(item, now, wait)
            except ApiaryError as exc:
                env = wait.env or item.envelope
                return SendOutcome.refusal(env.message_id, exc), None
        return decision

    async def _resume(self, item: Outbound, now: float, wait: Wait) -> Decision:
        """The store's answer at `wait`, and the gates after it (raises their refusals)."""
        if wait.gate is Gate.ACK:
            forward = await self._lifecycle.acknowledge(item.envelope, now)
            return self.decide(item, now, forward)
        env, target = wait.env, wait.target
        assert env is not None
        if wait.gate is Gate.CHUNK:
            assembled = await self._transfers.receive(env, target, now)
            if assembled is None:
                return SendOutcome(env.message_id, True, reason="chunk buffered"), None
            return self._assembled(item, assembled, target, now)
        if wait.gate is Gate.AGENT or wait.gate is Gate.PRODUCER:
            if await self._registry.refresh(target) is None:
                if wait.gate is Gate.PRODUCER:
                    return _not_forwarded(env, target)
                raise _no_route(env, target)
            return self._routed(item, env, target, now, wait.raw)
        if wait.gate is Gate.ENDPOINT:
            await self._endpoints[target](env)
            return SendOutcome(env.message_id, True, reason=f"handled by {target}"), None
        duplicate = await self._dedup.check(env, now, requeue=item.requeue)
        if duplicate is not None:
            return duplicate, None
        return self._reserved(item, env, target, now, wait.raw, notice=False)

    def _assembled(self, item: Outbound, env: Envelope, target: str, now: float) -> Decision:
        """The gates from validation on for `env`, assembled from `item` and the chunks
        before it: a new envelope, validated again; its refusals name it."""
        try:
            self._validate(env, now)
            return self._routed(item, env, target, now, b"")
        except ApiaryError as exc:
            return SendOutcome.refusal(env.message_id, exc), None

    def _unreachable(self, producer: str) -> bool:
        """Whether an applied ACK's producer is no participant to forward it to: neither
        the coordinator, one of its endpoints nor a registered agent (`apiary send` without
        --wait, an application, an agent deregistered since). The ACK did its work on the
        message it acknowledges; forwarding ends here instead of as no_route
        (docs/decisions.md, "Producers that are not agents")."""
        return (
            producer != COORDINATOR
            and producer not in self._endpoints
            and self._registry.known(producer) is None
        )

    # ------------------------------------------------------------------ the gates

    def _screened(self, item: Outbound, now: float) -> str | None:
        """The signature, ACL and validation gates (each raises); returns the recipient,
        resolved once for the ACL and the route, or None for an agent's ACK (the ACL takes
        no ACKs, and the producer of the message it acknowledges is its recipient)."""
        env = item.envelope
        if item.remote and self._signing:
            self._check_signature(item)
        acl = self._acl if item.remote and env.message_type is not _ACK else None
        if acl is None:
            if not (item.validated and self._own(item)):
                self._validate(env, now)
            if env.message_type is _ACK and env.producer_id != COORDINATOR:
                return None
            return resolve_recipient(env, item.recipient)
        try:
            target = resolve_recipient(env, item.recipient)
        except NoRouteError:
            self._validate(env, now)  # validation comes first; then no_route is the route's
            raise
        self._check_acl(acl, env, target)
        self._validate(env, now)
        return target

    def _check_signature(self, item: Outbound) -> None:
        """With signing on (RFC 6.2): refuse an envelope from an agent whose signature is
        missing or does not verify against the key its producer registered. Envelopes
        produced inside the coordinator carry none and are not asked."""
        env = item.envelope
        details = {"field": "signature", "message_id": env.message_id}
        if not item.signature:
            raise PermissionDeniedError(
                f"{env.message_id} from {env.producer_id} is not signed: message signing"
                f" is on ({SIGNATURE_KEY} metadata, or OutboundEnvelope.signature)",
                details,
            )
        key = self._registry.public_key(env.producer_id)
        if not key:
            raise PermissionDeniedError(
                f"{env.producer_id} has no registered public key to verify {env.message_id}"
                " by: register with one", details,
            )  # fmt: skip
        if not verifies(key, item.raw, item.signature):
            raise PermissionDeniedError(
                f"the signature of {env.message_id} does not verify against the key"
                f" {env.producer_id} registered", details,
            )  # fmt: skip

    def _check_acl(self, acl: AclPolicy, env: Envelope, target: str) -> None:
        """With message ACLs (`core.acl`): refuse an envelope its producer may not send,
        logged as `acl.denied`. Envelopes to the coordinator's own endpoints (tool results,
        worktree control, task and room answers, swarm replies) are requests to those
        services, which authorize them themselves."""
        if target in self._endpoints or target == COORDINATOR:
            return
        try:
            acl.check_message(env.producer_id, env.message_type, target)
        except PermissionDeniedError as exc:
            self._events.note(
                "acl.denied", env.producer_id, correlation_id=env.correlation_id,
                agent_id=target, kind="message", message_id=env.message_id,
                message_type=env.message_type.name, recipient=target,
                field=exc.details.get("field", ""),
            )  # fmt: skip
            raise

    def _validate(self, env: Envelope, now: float) -> None:
        """The message-types validation rules with this router's settings (raises)."""
        settings = self._settings
        validate_envelope(
            env, limits=settings.limits, now=now, hlc_required=settings.hlc_required,
            strict_correlation=settings.strict_correlation_ids, fields=settings.fields,
        )  # fmt: skip

    def _routed(
        self, item: Outbound, env: Envelope, target: str, now: float, raw: bytes
    ) -> Decision:
        """The route and dedup gates for `env` to `target`, then the reservation."""
        if target == COORDINATOR:
            # ACKs of coordinator notices end here: nothing to forward.
            return SendOutcome(env.message_id, True, reason="acknowledged"), None
        if target in self._endpoints:
            return Wait(Gate.ENDPOINT, env, target)
        agent = self._registry.known(target)
        if agent is None:
            if self._registry.reads_through:
                return Wait(Gate.AGENT, env, target, raw)
            raise _no_route(env, target)
        notice = is_notice(env)
        if notice:
            return self._reserved(item, env, target, now, raw, notice=True)
        check_modality(env.content_type, agent.descriptor.get("modalities_supported") or ())
        if item.stored_with is not None and not self._own(item):
            raise PermissionDeniedError(
                f"{env.producer_id} may not store other writes with {env.message_id}",
                {"message_id": env.message_id},
            )
        if item.requeue or not self._dedup.fresh(env):
            new = item.new_token and not item.requeue and self._own(item)
            if not (new and self._dedup.claim(env)):
                return Wait(Gate.DEDUP, env, target, raw)
        return self._reserved(item, env, target, now, raw, notice=False)

    def _own(self, item: Outbound) -> bool:
        """Whether `item` was produced inside the coordinator by one of its endpoints."""
        return not item.remote and item.envelope.producer_id in self._endpoints

    def _reserved(
        self, item: Outbound, env: Envelope, target: str, now: float, raw: bytes, *,
        notice: bool,
    ) -> Admitted:  # fmt: skip
        """The reserve gate (buffer space and a credit; a notice needs neither), and the
        record to store."""
        if not notice:
            try:
                self._reserve(target, env)
            except ApiaryError:
                self._dedup.release(env.message_id)  # frees what deduplication reserved
                raise
        return SendOutcome(env.message_id, True), self._record(
            env, target, now, notice, raw, item.lane, self._verified(item, raw)
        )

    def _reserve(self, target: str, env: Envelope) -> None:
        inbox = self._inboxes[target]
        if not inbox.has_room():
            raise BufferFullError(
                f"Inbound buffer capacity exceeded for agent={target} "
                f"({inbox.depth}/{inbox.capacity})",
                {"recipient": target, "capacity": str(inbox.capacity)},
            )
        if self._credits.enabled:
            self._credits.consume(target, env.producer_id)
        inbox.reserve(env.message_id)

    def _verified(self, item: Outbound, raw: bytes) -> bytes:
        """What vouches for the message admitted from `item` as `raw`, kept with it for its
        recipient (`core.signatures.with_origin`). With signing on: the signature admission
        verified over `raw`; for a message assembled from chunks (`raw` is not the item's
        own bytes), the signature over the chunk that completed it, with that chunk; for a
        requeued dead letter, the signature over the envelope it was derived from, with that
        envelope, once the producer's keys verify it again. Nothing without signing and for
        the coordinator's own envelopes."""
        if not self._signing or not item.signature:
            return b""
        if item.remote and item.raw:
            return item.signature if raw is item.raw else with_origin(item.signature, item.raw)
        producer = item.envelope.producer_id
        if item.requeue and self._registry.vouches(producer, item.origin, item.signature):
            return with_origin(item.signature, item.origin)
        return b""

    def _record(
        self, env: Envelope, target: str, now: float, notice: bool, raw: bytes, lane: str,
        signature: bytes,
    ) -> StoredMessage:  # fmt: skip
        settings = self._settings
        if not lane:
            producer = self._registry.known(env.producer_id)
            lane = _lane(producer.descriptor if producer else {})
        # Positional, in StoredMessage's field order (a record per admitted envelope):
        # message_id ... updated_at, offset, error_code, idempotency_token, sequence_number,
        # lane, ack_deadline, expires_at, deliveries, last_delivered_at, acked_stage, signature.
        return StoredMessage(
            env.message_id, target, env.producer_id, env.correlation_id, int(env.message_type),
            raw or self._codec.encode(env), MessageState.RECEIVED, now, now, 0, "",
            env.idempotency_token, env.sequence_number, lane, 0.0,
            ttl_deadline(env, received_at=now)
            or (now + settings.notice_ttl_s if notice else 0.0),
            0, 0.0, "", signature,
        )  # fmt: skip


def _no_route(env: Envelope, target: str) -> NoRouteError:
    return NoRouteError(
        f"no registered agent {target!r} to deliver {env.message_id} to",
        {"recipient": target, "message_id": env.message_id},
    )


def _not_forwarded(env: Envelope, target: str) -> Admitted:
    """An applied ACK whose producer is no participant: its work is done (`_unreachable`)."""
    return SendOutcome(
        env.message_id, True,
        reason=f"acknowledged; {target} is not a registered agent: not forwarded",
    ), None  # fmt: skip


def _lane(descriptor: object) -> str:
    value = descriptor.get("communication_class", "") if isinstance(descriptor, dict) else ""
    return value if value in ("PRIVILEGED", "STANDARD", "BULK") else "STANDARD"
