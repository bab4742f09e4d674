"""Message signing (RFC 6.2, 14, 23; DESIGN.md section 9): Ed25519 over an envelope's bytes.

What is signed is the canonical Envelope's deterministic protobuf serialization, exactly the
bytes the coordinator stores. The signature travels beside the envelope, never inside it: in
the `sw4rm-signature` metadata of a unary SendMessage (standard base64), or in the
`signature` field of an apiary.v1 OutboundEnvelope. The key is the raw 32-byte Ed25519
public key the agent registered (AgentDescriptor.public_key).

The same scheme proves an agent's identity to the Registry: with signing on, re-registering
under a different key (rotation) or deregistering needs the request signed by the key the
agent holds now.
"""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SIGNATURE_KEY = "sw4rm-signature"
"""Request metadata carrying the standard-base64 signature of the request's payload."""
SIGNATURE_BYTES = 64


def sign(private_key: Ed25519PrivateKey, data: bytes) -> bytes:
    """The Ed25519 signature of `data`."""
    return private_key.sign(data)


def verifies(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is `public_key`'s signature of `data` (False for a malformed key
    or signature, never an exception)."""
    if len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def with_origin(signature: bytes, origin: bytes = b"") -> bytes:
    """What is stored and delivered to vouch for a message: the producer's signature over
    the message itself, or, for a message the coordinator derived from a signed envelope
    (a requeued dead letter, a message assembled from chunks), the signature over that
    `origin` followed by the origin's bytes. Empty without a signature."""
    if not signature:
        return b""
    return signature + origin if origin else signature


def split_origin(proof: bytes) -> tuple[bytes, bytes]:
    """`with_origin` undone: (signature, origin envelope or b"")."""
    return proof[:SIGNATURE_BYTES], proof[SIGNATURE_BYTES:]


def encode_signature(signature: bytes) -> str:
    """A signature as metadata text (standard base64, padded)."""
    return base64.b64encode(signature).decode()


def decode_signature(text: str) -> bytes | None:
    """Metadata text back to a signature; None when it is not base64."""
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def public_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key to register."""
    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
