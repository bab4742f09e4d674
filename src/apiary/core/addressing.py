"""Recipient resolution (DESIGN.md section 4: Apiary's addressing decision).

In order: the explicit recipient (gRPC metadata `sw4rm-recipient` or the JSON gateway's
`recipient` field); else a `"to"` field in a JSON payload; else, for an ACKNOWLEDGEMENT, the
producer of the acknowledged message; else `no_route`.
"""

from __future__ import annotations

from apiary.core.envelope import Envelope, MessageType
from apiary.core.json_reader import JsonError, parse_json
from apiary.core.limits import DEFAULT_LIMITS, check_id
from apiary.errors import NoRouteError


def recipient_from_payload(env: Envelope) -> str:
    """The `"to"` field of a JSON object payload, or '' when there is none."""
    if not env.content_type.split(";")[0].strip().endswith("json"):
        return ""
    payload = env.payload
    if b'"to"' not in payload and b"\\" not in payload and b"\x00" not in payload:
        # No "to" key can be in there: in UTF-8 an unescaped one appears as is and an
        # escaped one needs a backslash (UTF-16 and UTF-32 text, which json.loads also
        # reads, always has NUL bytes). Spares parsing every ACK's payload once more.
        return ""
    try:
        doc = parse_json(env.payload)
    except JsonError:
        return ""  # validation refuses the payload, with its own message
    to = doc.get("to") if isinstance(doc, dict) else None
    if not isinstance(to, str):
        return ""
    check_id(to, "payload.to", DEFAULT_LIMITS.agent_id_bytes)
    return to


def resolve_recipient(env: Envelope, explicit: str = "", acked_producer: str = "") -> str:
    """The agent this envelope goes to; raises NoRouteError when nothing names one.

    `acked_producer` is the producer of the message an ACKNOWLEDGEMENT refers to, looked up
    by the caller (the engine) because it needs the store.
    """
    if explicit:
        return explicit
    to = recipient_from_payload(env)
    if to:
        return to
    if env.message_type is MessageType.ACKNOWLEDGEMENT and acked_producer:
        return acked_producer
    raise NoRouteError(
        f"message {env.message_id} names no recipient: set the sw4rm-recipient metadata, "
        'a "to" field in a JSON payload, or acknowledge a known message',
        details={"message_id": env.message_id},
    )
