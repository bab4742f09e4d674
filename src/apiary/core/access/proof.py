"""Per-call agent proofs (DESIGN.md section 9): an agent that registered an Ed25519 key proves
it is making a call by signing the call's audience, method, its id, the time and a nonce.

The metadata `apiary-agent-proof` is `v1;<agent_id>;<unix_ms>;<nonce>;<signature>` (nonce
and signature in unpadded URL-safe base64); the tenant is the call's `apiary-tenant` (default
`default`), signed with the rest. The coordinator accepts a proof within
`window_s` of its clock, for its own audience and the method called, once (replay window)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from apiary.core.access.principal import DEFAULT_TENANT

PROOF_KEY = "apiary-agent-proof"
VERSION = "v1"
DEFAULT_AUDIENCE = "apiary"
MAX_NONCE_BYTES = 64
SIGNATURE_BYTES = 64


@dataclass(frozen=True, slots=True)
class CallProof:
    agent_id: str
    unix_ms: int
    nonce: bytes
    signature: bytes


def proof_payload(
    audience: str,
    method: str,
    agent_id: str,
    unix_ms: int,
    nonce: bytes,
    tenant: str = DEFAULT_TENANT,
) -> bytes:
    """The bytes an agent signs for one call: bound to the coordinator (audience), the
    method, the agent, its tenant (`apiary-tenant`), the time and a nonce."""
    fields = ("apiary-call-proof/" + VERSION, audience, method, agent_id, tenant, str(unix_ms))
    return "\n".join((*fields, _b64(nonce))).encode()


def encode_proof(proof: CallProof) -> str:
    return ";".join(
        (VERSION, proof.agent_id, str(proof.unix_ms), _b64(proof.nonce), _b64(proof.signature))
    )


def parse_proof(text: str) -> CallProof | str:
    """The proof, or why `text` is not one (a message naming what is wrong)."""
    parts = text.split(";")
    if len(parts) != 5 or parts[0] != VERSION:
        return f"{PROOF_KEY} must be {VERSION};<agent_id>;<unix_ms>;<nonce>;<signature>"
    _, agent_id, unix_ms, nonce, signature = parts
    if not agent_id or not unix_ms.isdigit() or len(unix_ms) > 16:
        return f"{PROOF_KEY}: the agent id is empty or the time is not milliseconds"
    raw_nonce, raw_signature = _unb64(nonce), _unb64(signature)
    if raw_nonce is None or not 8 <= len(raw_nonce) <= MAX_NONCE_BYTES:
        return f"{PROOF_KEY}: the nonce must be 8-64 bytes in URL-safe base64"
    if raw_signature is None or len(raw_signature) != SIGNATURE_BYTES:
        return f"{PROOF_KEY}: the signature must be {SIGNATURE_BYTES} bytes in URL-safe base64"
    return CallProof(agent_id, int(unix_ms), raw_nonce, raw_signature)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    """Strict URL-safe base64 (unpadded): anything outside its alphabet is refused, not
    skipped."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None
