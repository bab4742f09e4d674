"""API keys: per-principal credentials kept hashed in one JSON file (DESIGN.md section 9).

A key is shown once, when it is made: `apk_<key id>_<secret>`. The key id names the entry
and may be printed anywhere; the secret is 32 random bytes and only its SHA-256 is stored.
A fast hash is enough because the secret is random: there is no guessable password for a
slow one to protect. Nothing here logs, stores or echoes a secret.

The file (`<data_dir>/credentials.json`) is shared by processes: `apiary auth` changes it
while a coordinator reads it. Writers serialize on an exclusive `flock` of a sibling lock
file around read-modify-write and replace the file atomically; readers never lock, they
re-read when the file's identity (inode, mtime_ns, size) changed, checked with one `stat`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import fcntl
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from apiary.core.access.principal import (
    DEFAULT_TENANT,
    Mechanism,
    Principal,
    PrincipalKind,
    check_name,
)
from apiary.errors import InternalError, NotFoundError, UnauthenticatedError, ValidationError

CREDENTIALS_FILE: Final = "credentials.json"
"""The key ring's file name inside the coordinator's data directory."""
FORMAT_VERSION: Final = 1
KEY_PREFIX: Final = "apk"
KEY_ID_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"
"""Lower-case base32: no '_' (the key's separator) and nothing that reads ambiguously."""
KEY_ID_LENGTH: Final = 12
SECRET_BYTES: Final = 32
KEYED_KINDS: Final = (PrincipalKind.AGENT, PrincipalKind.OPERATOR, PrincipalKind.APPLICATION)
"""The kinds that hold keys: anonymous is the absence of a credential."""

_KEY_ID = re.compile(rf"^[{KEY_ID_ALPHABET}]{{{KEY_ID_LENGTH}}}$")
_SECRET = re.compile(r"^[A-Za-z0-9_-]{43}$")  # 32 bytes, urlsafe base64 without padding
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# Compared against when the key id is unknown, so that an unknown id and a wrong secret cost
# the same work.
_NO_DIGEST: Final = "0" * 64
_FIELD = "api_key"
T = TypeVar("T")


def credentials_path(data_dir: Path) -> Path:
    """Where the coordinator and `apiary auth` keep the key ring of `data_dir`."""
    return data_dir / CREDENTIALS_FILE


class KeyState(enum.StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


class CredentialsFileError(InternalError):
    """The key ring's file cannot be used (unreadable, not JSON, an unknown version, a bad
    entry). The message names the file: it is the operator's to fix, and no key works
    until it is fixed."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One stored key: whom it authenticates and when, and the SHA-256 of its secret."""

    key_id: str
    kind: PrincipalKind
    name: str
    tenant: str
    roles: tuple[str, ...]
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    digest: str
    """Hex SHA-256 of the secret."""
    replaced_by: str | None = None
    """The key id that `rotate` made to take this key's place."""

    def principal(self) -> Principal:
        """The principal a call presenting this key acts as."""
        return Principal(
            self.kind, self.name, self.tenant, frozenset(self.roles), Mechanism.API_KEY
        )

    def state(self, now: float) -> KeyState:
        """Revoked wins over expired; a key expires at `expires_at` exactly."""
        if self.revoked_at is not None:
            return KeyState.REVOKED
        if self.expires_at is not None and now >= self.expires_at:
            return KeyState.EXPIRED
        return KeyState.ACTIVE

    def to_json(self) -> dict[str, Any]:
        """The entry as the file stores it."""
        return {
            "key_id": self.key_id,
            "kind": self.kind.value,
            "name": self.name,
            "tenant": self.tenant,
            "roles": list(self.roles),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "replaced_by": self.replaced_by,
            "sha256": self.digest,
        }


def iso_utc(when: float) -> str:
    """`when` (epoch seconds) as ISO-8601 UTC, to the second: how messages state times."""
    return (
        dt.datetime.fromtimestamp(when, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


class KeyRing:
    """The API keys stored in one file; see the module docstring for how processes share it.

    Every method takes the current time as an argument, so expiry is decided by the caller's
    clock.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._cached: tuple[tuple[int, int, int], dict[str, KeyEntry]] | None = None

    @property
    def path(self) -> Path:
        return self._path

    def create(
        self,
        kind: PrincipalKind | str,
        name: str,
        *,
        tenant: str = DEFAULT_TENANT,
        roles: Iterable[str] = (),
        expires_at: float | None = None,
        now: float,
    ) -> tuple[KeyEntry, str]:
        """A new key for the principal; returns its entry and the plain key, which exists
        nowhere else: hand it to its holder and drop it."""
        checked = _check_kind(kind)
        _check_field(name, "name")
        _check_field(tenant, "tenant")
        role_list = _check_roles(checked, roles)
        if expires_at is not None and not (math.isfinite(expires_at) and expires_at > now):
            raise ValidationError.for_field(
                "expires_at",
                f"{expires_at!r} is not a time after now ({iso_utc(now)}); give a later time "
                "or none for a key that does not expire",
            )
        return self._update(
            lambda entries: _add_key(entries, checked, name, tenant, role_list, expires_at, now)
        )

    def entries(self) -> list[KeyEntry]:
        """Every stored key, revoked and expired ones included, oldest first."""
        return list(self._current().values())

    def rotate(self, key_id: str, *, now: float, grace_s: float = 0.0) -> tuple[KeyEntry, str]:
        """A new key for the same principal, with the same expiry; the old key stops working
        at `now + grace_s` (revoked at once when the grace is 0). Returns the new entry and
        its plain key.

        Revoked and expired keys are not rotated (create a new key: their access ended on
        purpose), nor keys already rotated (rotate their replacement).
        """
        wanted = _check_key_id(key_id)
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise ValidationError.for_field(
                "grace_s", f"{grace_s!r} must be 0 or more seconds (0 revokes the old key now)"
            )

        def swap(entries: dict[str, KeyEntry]) -> tuple[KeyEntry, str]:
            old = _existing(entries, wanted, self._path)
            _check_rotatable(old, now)
            new, plain = _add_key(
                entries, old.kind, old.name, old.tenant, old.roles, old.expires_at, now
            )
            if grace_s > 0:
                ends = now + grace_s
                if old.expires_at is not None:
                    ends = min(ends, old.expires_at)
                entries[wanted] = replace(old, expires_at=ends, replaced_by=new.key_id)
            else:
                entries[wanted] = replace(old, revoked_at=now, replaced_by=new.key_id)
            return new, plain

        return self._update(swap)

    def revoke(self, key_id: str, *, now: float) -> KeyEntry:
        """Stop the key from working; revoking a revoked key changes nothing."""
        wanted = _check_key_id(key_id)

        def revoke(entries: dict[str, KeyEntry]) -> KeyEntry:
            entry = _existing(entries, wanted, self._path)
            if entry.revoked_at is None:
                entry = entries[wanted] = replace(entry, revoked_at=now)
            return entry

        return self._update(revoke)

    def authenticate(self, presented: str, now: float) -> Principal:
        """The principal of a presented key, or UnauthenticatedError saying why not
        (malformed, unknown, expired at, revoked); the secret is never part of the answer.

        Sees what other processes wrote: the file is re-read when it changed.
        """
        key_id, secret = _split_key(presented)
        entry = self._current().get(key_id)
        digest = _digest(secret)
        matches = hmac.compare_digest(entry.digest if entry else _NO_DIGEST, digest)
        if entry is None or not matches:
            # A wrong secret answers like an unknown id: it tells a guesser nothing.
            raise UnauthenticatedError(
                f"unknown API key {key_id}; ask an operator for a key (apiary auth create)",
                {"field": _FIELD, "key_id": key_id},
            )
        state = entry.state(now)
        if state is KeyState.REVOKED:
            assert entry.revoked_at is not None
            raise UnauthenticatedError(
                f"API key {key_id} was revoked at {iso_utc(entry.revoked_at)}"
                + (f"; its replacement is {entry.replaced_by}" if entry.replaced_by else ""),
                {"field": _FIELD, "key_id": key_id},
            )
        if state is KeyState.EXPIRED:
            assert entry.expires_at is not None
            raise UnauthenticatedError(
                f"API key {key_id} expired at {iso_utc(entry.expires_at)}; ask an operator "
                "for a new key",
                {"field": _FIELD, "key_id": key_id},
            )
        return entry.principal()

    # --- the file ---------------------------------------------------------------------------

    def _current(self) -> dict[str, KeyEntry]:
        """The entries as the file holds them now, re-read only when it changed."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._cached = None
            return {}
        except OSError as exc:
            raise self._error(f"cannot be read: {exc.strerror}") from None
        # Every write makes the file larger (entries are only added, null fields only filled)
        # and replaces its inode, so this identity changes even where mtime is coarse.
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cached
        if cached is not None and cached[0] == identity:
            return cached[1]
        # Read after stat: a write in between is read now and noticed again next call, so the
        # cache can be newer than its identity, never older.
        entries = self._read()
        self._cached = (identity, entries)
        return entries

    def _read(self) -> dict[str, KeyEntry]:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise self._error(f"cannot be read: {exc.strerror}") from None
        return _parse(data, self._error)

    def _update(self, change: Callable[[dict[str, KeyEntry]], T]) -> T:
        """Read-modify-write under the lock, so that concurrent writers lose nothing."""
        with self._locked():
            entries = self._read()
            before = dict(entries)
            result = change(entries)
            if entries != before:
                self._write(entries)
            return result

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self._error(f"cannot be locked ({self._lock_path}): {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write(self, entries: Mapping[str, KeyEntry]) -> None:
        doc = {"version": FORMAT_VERSION, "keys": [e.to_json() for e in entries.values()]}
        data = (json.dumps(doc, indent=2) + "\n").encode()
        # mkstemp creates the file with mode 0600: the hashes are never readable by others.
        fd, tmp = tempfile.mkstemp(
            dir=self._path.parent, prefix=f".{self._path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self._path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)
        self._cached = None

    def _error(self, problem: str) -> CredentialsFileError:
        return CredentialsFileError(f"{self._path}: {problem}", {"path": str(self._path)})


# --- checks and parsing ---------------------------------------------------------------------


def _check_kind(kind: PrincipalKind | str) -> PrincipalKind:
    names = ", ".join(k.value for k in KEYED_KINDS)
    try:
        checked = PrincipalKind(kind)
    except ValueError:
        why = f"{str(kind)[:64]!r} must be one of {names}"
        raise ValidationError.for_field("kind", why) from None
    if checked not in KEYED_KINDS:
        raise ValidationError.for_field(
            "kind", f"{checked.value} principals hold no key; use one of {names}"
        )
    return checked


def _check_field(value: str, what: str) -> None:
    why = check_name(value, what)
    if why is not None:
        raise ValidationError.for_field(what, why)


def _check_roles(kind: PrincipalKind, roles: Iterable[str]) -> tuple[str, ...]:
    unique = tuple(dict.fromkeys(roles))
    if unique and kind is not PrincipalKind.OPERATOR:
        raise ValidationError.for_field(
            "roles",
            f"only operators hold roles; remove them from this {kind.value} key "
            "(it acts as itself)",
        )
    for role in unique:
        _check_field(role, "roles")
    return unique


def _check_key_id(key_id: str) -> str:
    """The key id of `key_id`, which may also be a whole key (revoking a leaked key)."""
    if key_id.startswith(f"{KEY_PREFIX}_"):
        try:
            return _split_key(key_id)[0]
        except UnauthenticatedError as exc:
            raise ValidationError.for_field("key_id", exc.message) from None
    if not _KEY_ID.match(key_id):
        raise ValidationError.for_field(
            "key_id",
            f"must be a {KEY_ID_LENGTH}-character key id as `apiary auth list` shows it "
            f"(letters a-z and digits 2-7)",
        )
    return key_id


def _check_rotatable(old: KeyEntry, now: float) -> None:
    if old.replaced_by is not None:
        raise ValidationError.for_field(
            "key_id", f"key {old.key_id} was already rotated to {old.replaced_by}; rotate that"
        )
    state = old.state(now)
    if state is not KeyState.ACTIVE:
        raise ValidationError.for_field(
            "key_id", f"key {old.key_id} is {state.value}; create a new key for its principal"
        )


def _existing(entries: Mapping[str, KeyEntry], key_id: str, path: Path) -> KeyEntry:
    entry = entries.get(key_id)
    if entry is None:
        raise NotFoundError(
            f"no API key {key_id} in {path}; `apiary auth list --all` shows the keys",
            {"field": "key_id", "key_id": key_id},
        )
    return entry


def _split_key(presented: str) -> tuple[str, str]:
    """(key id, secret) of a presented key, or UnauthenticatedError that echoes none of it."""
    prefix, _, rest = presented.strip().partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or not _KEY_ID.match(key_id) or not _SECRET.match(secret):
        raise UnauthenticatedError(
            f"malformed API key: expected {KEY_PREFIX}_<{KEY_ID_LENGTH}-character key id>_"
            "<secret> as `apiary auth create` printed it",
            {"field": _FIELD},
        )
    return key_id, secret


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _add_key(
    entries: dict[str, KeyEntry],
    kind: PrincipalKind,
    name: str,
    tenant: str,
    roles: tuple[str, ...],
    expires_at: float | None,
    now: float,
) -> tuple[KeyEntry, str]:
    key_id = _new_key_id()
    while key_id in entries:  # 60 random bits: a collision is a curiosity, not a plan
        key_id = _new_key_id()
    secret = secrets.token_urlsafe(SECRET_BYTES)
    entry = KeyEntry(key_id, kind, name, tenant, roles, now, expires_at, None, _digest(secret))
    entries[key_id] = entry
    return entry, f"{KEY_PREFIX}_{key_id}_{secret}"


def _new_key_id() -> str:
    return "".join(secrets.choice(KEY_ID_ALPHABET) for _ in range(KEY_ID_LENGTH))


def _parse(data: bytes, error: Callable[[str], CredentialsFileError]) -> dict[str, KeyEntry]:
    fix = "restore it from a backup, or move it away to start with no keys"
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"is not a JSON key ring ({exc}); {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise error(f'is not a key ring: expected {{"version": 1, "keys": [...]}}; {fix}')
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise error(
            f"has version {version!r}, this Apiary reads version {FORMAT_VERSION}; use the "
            "Apiary that wrote it"
        )
    entries: dict[str, KeyEntry] = {}
    for index, item in enumerate(doc["keys"]):
        try:
            entry = _entry(item)
        except (KeyError, TypeError, ValueError) as exc:
            raise error(f"keys[{index}] is not a valid key entry ({exc}); {fix}") from None
        if entry.key_id in entries:
            raise error(f"keys[{index}] repeats key id {entry.key_id}; {fix}")
        entries[entry.key_id] = entry
    return entries


def _entry(item: Any) -> KeyEntry:
    """One entry of the file, every field checked: a hand-edited file fails loudly."""
    if not isinstance(item, dict):
        raise TypeError("not an object")
    key_id = _typed(item, "key_id", str)
    if not _KEY_ID.match(key_id):
        raise ValueError(f"key_id {key_id[:64]!r} is not a key id")
    kind = PrincipalKind(_typed(item, "kind", str))
    if kind not in KEYED_KINDS:
        raise ValueError(f"kind {kind.value} holds no key")
    name, tenant = _typed(item, "name", str), _typed(item, "tenant", str)
    roles = _typed(item, "roles", list)
    for what, value in (("name", name), ("tenant", tenant), *(("roles", r) for r in roles)):
        if not isinstance(value, str) or check_name(value, what) is not None:
            raise ValueError(f"{what} {str(value)[:64]!r} is not a valid name")
    if roles and kind is not PrincipalKind.OPERATOR:
        raise ValueError(f"roles on an {kind.value} key: only operators hold roles")
    digest = _typed(item, "sha256", str)
    if not _DIGEST.match(digest):
        raise ValueError("sha256 is not 64 lower-case hex digits")
    replaced_by = item.get("replaced_by")
    if replaced_by is not None and not (
        isinstance(replaced_by, str) and _KEY_ID.match(replaced_by)
    ):
        raise ValueError("replaced_by is not a key id")
    return KeyEntry(
        key_id, kind, name, tenant, tuple(roles), _time(item, "created_at"),
        _optional_time(item, "expires_at"), _optional_time(item, "revoked_at"),
        digest, replaced_by,
    )  # fmt: skip


def _typed(item: Mapping[str, Any], key: str, kind: type[T]) -> T:
    value = item[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key} is not a {kind.__name__}")
    return value


def _time(item: Mapping[str, Any], key: str) -> float:
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{key} is not epoch seconds")
    return float(value)


def _optional_time(item: Mapping[str, Any], key: str) -> float | None:
    return None if item.get(key) is None else _time(item, key)
