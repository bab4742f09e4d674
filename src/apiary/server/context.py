"""What a service handler learns about the call, whichever transport carried it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from apiary.core.signatures import SIGNATURE_KEY, decode_signature
from apiary.errors import ValidationError

RECIPIENT_KEY = "sw4rm-recipient"
"""Request metadata naming a message's recipient (DESIGN.md section 4)."""
RESUME_AFTER_KEY = "sw4rm-resume-after"
"""StreamIncoming request metadata: resume delivery after this inbox offset (RFC 5.5)."""


@dataclass(frozen=True, slots=True)
class CallContext:
    transport: str
    """'grpc' or 'http'."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Request metadata with lower-case keys (gRPC metadata or HTTP headers)."""
    peer: str = ""

    def get(self, key: str, default: str = "") -> str:
        return self.metadata.get(key, default)


def request_proof(ctx: CallContext) -> bytes:
    """The call's `sw4rm-signature` metadata (RFC 6.2) as bytes; b"" when there is none.
    Malformed text is a ValidationError naming the key."""
    text = ctx.get(SIGNATURE_KEY)
    if not text:
        return b""
    signature = decode_signature(text)
    if signature is None:
        raise ValidationError.for_field(SIGNATURE_KEY, "is not standard base64")
    return signature
