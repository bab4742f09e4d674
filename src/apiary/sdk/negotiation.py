"""Negotiation events for agents (RFC 17, 17.1): read what the Scheduler fans out, build what
participants send it.

    from apiary.sdk import negotiation

    class Frontend(apiary.Agent):
        async def on_negotiation(self, msg: apiary.Message) -> str:
            event = negotiation.decode(msg.payload)       # unknown fields are ignored
            if event.kind == "counter":
                draft = event.payload_json()              # payload_b64, decoded on demand
                await negotiation.send(self, negotiation.evaluation(event.negotiation_id, 0.9))
            return event.kind

The Scheduler's events arrive as NEGOTIATION envelopes (correlation_id = negotiation_id) in
the order of its stream. A participant speaks either through NegotiationService (Propose,
Counter, Evaluate, Abort; `agent.client.negotiation`) or, as here, with NEGOTIATION
envelopes addressed to the Scheduler whose payload is the same JSON.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from apiary.core.envelope import Envelope, MessageType
from apiary.core.negotiation.events import NegotiationEvent, b64, decode_event, encode, event

if TYPE_CHECKING:
    from apiary.sdk.connection import Connection

SCHEDULER = "scheduler"
JSON = "application/json"


def decode(payload: bytes | str) -> NegotiationEvent:
    """A NEGOTIATION envelope's payload as an event (ValidationError if it is not one)."""
    return decode_event(payload)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _body(kind: str, negotiation_id: str, **fields: Any) -> bytes:
    return encode(event(kind, _now(), negotiation_id=negotiation_id, **fields))


def proposal(
    negotiation_id: str, payload: bytes, *, content_type: str = JSON, counter: bool = False
) -> bytes:
    """A propose (or counter) event carrying `payload` as it is."""
    kind = "counter" if counter else "propose"
    return _body(kind, negotiation_id, ct=content_type, payload_b64=b64(payload))


def evaluation(negotiation_id: str, score: float, notes: str = "") -> bytes:
    """An evaluate event: this participant's score of the current draft, in [0, 1]."""
    return _body("evaluate", negotiation_id, score=score, notes=notes)


def abort(negotiation_id: str, reason: str) -> bytes:
    return _body("abort", negotiation_id, reason=reason)


async def send(agent: Connection, body: bytes, negotiation_id: str = "") -> Envelope:
    """Send an event built here to the Scheduler as a NEGOTIATION envelope (refusals come
    back as a NACK, e.g. validation_error for an invalid draft)."""
    found = decode_event(body)
    return await agent.send(
        SCHEDULER, body, message_type=MessageType.NEGOTIATION, content_type=JSON,
        correlation_id=negotiation_id or found.negotiation_id,
    )  # fmt: skip


__all__ = ["NegotiationEvent", "abort", "decode", "evaluation", "proposal", "send"]
