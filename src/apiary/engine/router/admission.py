"""What the router decides about each incoming envelope before anything is stored."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from apiary.core.envelope import Envelope
from apiary.core.records import StoredMessage
from apiary.core.value import value
from apiary.errors import ApiaryError


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


@dataclass(slots=True)
class SendOutcome:
    """The result for one envelope of a send (RFC 5.4: per-message outcomes)."""

    message_id: str
    accepted: bool
    error: ApiaryError | None = None
    reason: str = ""
    stored: StoredMessage | None = None
    details: dict[str, str] = field(default_factory=dict)

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

# Admission failures that mean the message can never succeed go to the DLQ (RFC 21.1);
# back-pressure and deduplication outcomes do not.
DEAD_LETTER_CODES = frozenset(
    {
        "validation_error",
        "permission_denied",
        "unsupported_message_type",
        "oversize_payload",
        "ttl_expired",
        "no_route",
    }
)
