"""Agents' signing keys on disk (RFC 6.2; docs/security.md): an Ed25519 private key as an
unencrypted PKCS#8 PEM file readable by its owner only."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from apiary.core.signatures import public_bytes
from apiary.errors import ValidationError

SIGNING_KEY_ENV = "APIARY_SIGNING_KEY"


def write_signing_key(path: Path, *, overwrite: bool = False) -> Ed25519PrivateKey:
    """Generate a key and write it to `path` (mode 0600), making its directory (mode 0700)
    when missing; refuses to replace a file unless `overwrite` (a key lost is an identity
    lost). A path that cannot be written is a ValidationError naming it."""
    if path.exists() and not overwrite:
        raise ValidationError.for_field("path", f"{path} exists; a new key would replace it")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise ValidationError.for_field("path", f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    os.chmod(path, 0o600)
    return key


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 key in `path`; ValidationError naming the file when it is not one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValidationError.for_field(
            "signing_key", f"cannot read {path}: {exc.strerror}"
        ) from None
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ValidationError.for_field(
            "signing_key", f"{path} is not an unencrypted PEM private key: {exc}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValidationError.for_field("signing_key", f"{path} holds no Ed25519 key")
    return key


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The public key as AgentDescriptor.public_key's JSON form (standard base64)."""
    return base64.b64encode(public_bytes(key)).decode()
