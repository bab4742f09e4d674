"""The identity key file: the agent's Ed25519 private key as unencrypted PKCS#8 PEM (what
`openssl genpkey -algorithm ed25519` writes), readable by its owner only.

A key file that its group or others may read, or that another user owns, is refused with an
error saying how to fix it: a leaked signing key lets anyone speak for the agent.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.swarm.errors import SwarmFileError
from apiary.swarm.keys import Identity
from apiary.swarm.private_file import write_private


def save_identity(path: Path, identity: Identity) -> None:
    """Write the key (mode 0600, atomically); the directory is created mode 0700."""
    pem = identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private(path, pem)


def load_identity(path: Path) -> Identity:
    """The key at `path`; SwarmFileError when it is missing, too open, or not an Ed25519 key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SwarmFileError(path, "no identity key: run `apiary swarm init`") from None
    except OSError as exc:
        raise SwarmFileError(path, f"cannot open the identity key: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        check_private(path, os.fstat(handle.fileno()), "identity key")
        data = handle.read()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SwarmFileError(path, f"not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SwarmFileError(path, f"an Ed25519 key is needed, not {type(key).__name__}")
    return Identity(key)


def check_private(path: Path, info: os.stat_result, what: str) -> None:
    """SwarmFileError unless `info` is a regular file of this user that only they can use."""
    if not stat.S_ISREG(info.st_mode):
        raise SwarmFileError(path, f"the {what} must be a regular file")
    if info.st_uid != os.getuid():
        raise SwarmFileError(path, f"the {what} belongs to uid {info.st_uid}, not to this user")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise SwarmFileError(
            path, f"the {what} is readable or writable by group or others (mode {mode:04o}); "
            f"restrict it with: chmod 600 {path}",
        )  # fmt: skip
