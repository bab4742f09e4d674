"""Ed25519 identities and message signatures (INTEROP.md): the raw 32-byte SHA-256 digest of
the signing input is signed; signatures and public keys travel as standard base64."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from apiary.swarm.errors import SwarmError, bad_signature, invalid
from apiary.swarm.wire import SwarmMessage, signing_input

_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
"""DER SubjectPublicKeyInfo header of an Ed25519 key (the spec's examples use that form)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An agent's signing key."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        return self.private_key.private_bytes_raw()

    @property
    def public_key(self) -> str:
        """Standard base64 of the raw 32-byte public key."""
        return base64.b64encode(self.private_key.public_key().public_bytes_raw()).decode()

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.private_key.sign(data)).decode()


def public_key(text: object, name: str = "public_key") -> Ed25519PublicKey:
    """A base64 public key (raw 32 bytes, or the DER SubjectPublicKeyInfo form)."""
    if not isinstance(text, str) or not text:
        raise invalid(name, "must be a base64 Ed25519 public key")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(name, "is not valid base64") from None
    if len(raw) == 44 and raw.startswith(_SPKI_PREFIX):
        raw = raw[len(_SPKI_PREFIX) :]
    if len(raw) != 32:
        raise invalid(name, f"must hold a 32-byte Ed25519 key, not {len(raw)} bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def normalize_key(text: object, name: str = "public_key") -> str:
    """A public key in the state file's form: standard base64 of the raw 32 bytes."""
    return base64.b64encode(public_key(text, name).public_bytes_raw()).decode()


def verify(key: str, data: bytes, signature: str) -> bool:
    """Whether `signature` (base64) signs `data` under `key` (base64); False when malformed."""
    try:
        raw = base64.b64decode(signature, validate=True)
        public_key(key).verify(raw, data)
    except (InvalidSignature, binascii.Error, ValueError, SwarmError):
        return False
    return True


def sign_message(identity: Identity, message: SwarmMessage) -> SwarmMessage:
    return replace(message, signature=identity.sign(signing_input(message)))


def verify_message(key: str, message: SwarmMessage) -> None:
    """SwarmError 401 unless the message is signed by `key`."""
    if not verify(key, signing_input(message), message.signature):
        raise bad_signature(
            f"signature of message {message.message_id} does not verify for "
            f"{message.sender.agent_id}"
        )
