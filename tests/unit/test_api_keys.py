"""The API key ring (DESIGN.md section 9): keys stored hashed in one file, shown once,
expiring, rotated and revoked, shared safely between processes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from apiary.core.access.principal import Mechanism, Principal, PrincipalKind
from apiary.errors import NotFoundError, UnauthenticatedError, ValidationError
from apiary.server.auth.keys import (
    FORMAT_VERSION,
    CredentialsFileError,
    KeyEntry,
    KeyRing,
    KeyState,
    credentials_path,
)

NOW = 1_700_000_000.0
DAY = 86_400.0
KEY_FORMAT = re.compile(r"^apk_[a-z2-7]{12}_[A-Za-z0-9_-]{43}$")


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return KeyRing(credentials_path(tmp_path / "data"))


def _secret(plain: str) -> str:
    return plain.split("_", 2)[2]


def _doc(ring: KeyRing) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(ring.path.read_text())
    return doc


def _write_doc(ring: KeyRing, doc: dict[str, Any]) -> None:
    ring.path.write_text(json.dumps(doc))


def _refused(ring: KeyRing, presented: str, now: float = NOW) -> UnauthenticatedError:
    with pytest.raises(UnauthenticatedError) as caught:
        ring.authenticate(presented, now)
    if presented.count("_") >= 2:
        assert _secret(presented) not in caught.value.message
    return caught.value


# --- creation and authentication ------------------------------------------------------------


def test_a_created_key_authenticates_as_its_principal(ring: KeyRing) -> None:
    entry, plain = ring.create(
        PrincipalKind.OPERATOR, "olivia", tenant="acme", roles=("hitl", "admin"), now=NOW
    )
    assert KEY_FORMAT.match(plain) and plain.split("_")[1] == entry.key_id
    assert len(base64.urlsafe_b64decode(_secret(plain) + "=")) == 32
    assert ring.authenticate(plain, NOW) == Principal(
        PrincipalKind.OPERATOR, "olivia", "acme", frozenset({"hitl", "admin"}), Mechanism.API_KEY
    )
    assert (entry.kind, entry.name, entry.tenant, entry.roles) == (
        PrincipalKind.OPERATOR, "olivia", "acme", ("hitl", "admin"),
    )  # fmt: skip
    assert (entry.created_at, entry.expires_at, entry.revoked_at) == (NOW, None, None)
    assert ring.entries() == [entry]


def test_kinds_are_taken_as_strings_and_each_key_is_distinct(ring: KeyRing) -> None:
    agent, agent_key = ring.create("agent", "bob", now=NOW)
    app, app_key = ring.create("application", "ci", now=NOW)
    assert agent.key_id != app.key_id and _secret(agent_key) != _secret(app_key)
    assert ring.authenticate(agent_key, NOW).label == "agent:bob@default"
    assert ring.authenticate(app_key, NOW).label == "application:ci@default"
    assert [e.key_id for e in ring.entries()] == [agent.key_id, app.key_id]


def test_the_file_holds_the_hash_never_the_secret(ring: KeyRing) -> None:
    entry, plain = ring.create("agent", "bob", now=NOW)
    text = ring.path.read_text()
    assert _secret(plain) not in text and plain not in text
    doc = json.loads(text)
    assert doc["version"] == FORMAT_VERSION == 1
    [stored] = doc["keys"]
    assert stored["sha256"] == hashlib.sha256(_secret(plain).encode()).hexdigest() == entry.digest
    assert stored["key_id"] == entry.key_id and stored["kind"] == "agent"
    assert _secret(plain) not in repr(entry)


def test_the_file_and_its_lock_are_private_to_the_owner(ring: KeyRing) -> None:
    ring.create("agent", "bob", now=NOW)
    ring.create("agent", "carol", now=NOW)
    assert stat.S_IMODE(ring.path.stat().st_mode) == 0o600
    lock = ring.path.with_name(ring.path.name + ".lock")
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert sorted(p.name for p in ring.path.parent.iterdir()) == [
        "credentials.json",
        "credentials.json.lock",
    ]  # fmt: skip  (no temporary file left behind)


def test_a_missing_file_is_an_empty_ring(ring: KeyRing) -> None:
    assert ring.entries() == []
    key = "apk_abcdefghijkl_" + "A" * 43
    assert "unknown API key abcdefghijkl" in _refused(ring, key).message
    assert not ring.path.exists()


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "apk_",
        "Bearer apk_abcdefghijkl_" + "A" * 43,
        "xyz_abcdefghijkl_" + "A" * 43,
        "apk_ABCDEFGHIJKL_" + "A" * 43,  # key ids are lower case
        "apk_abcdefghijk_" + "A" * 43,  # 11-character id
        "apk_abcdefghijkl_" + "A" * 42,  # a short secret
        "apk_abcdefghijkl_" + "A" * 42 + "=",  # padding is not part of the format
        "apk_abcdefghijkl",
    ],
)
def test_a_malformed_key_is_refused_without_echoing_it(ring: KeyRing, presented: str) -> None:
    ring.create("agent", "bob", now=NOW)
    exc = _refused(ring, presented)
    assert exc.message.startswith("malformed API key: expected apk_<12-character key id>_")
    assert exc.details == {"field": "api_key"}
    if len(presented) > len("apk_"):
        assert presented not in exc.message and "A" * 20 not in exc.message


def test_a_wrong_secret_answers_exactly_like_an_unknown_key(ring: KeyRing) -> None:
    entry, _ = ring.create("agent", "bob", now=NOW)
    wrong = f"apk_{entry.key_id}_" + "B" * 43
    exc = _refused(ring, wrong)
    assert exc.message.startswith(f"unknown API key {entry.key_id};")
    assert "B" * 10 not in exc.message
    assert exc.details == {"field": "api_key", "key_id": entry.key_id}
    other = _refused(ring, "apk_aaaaaaaaaaaa_" + "B" * 43)
    assert other.message == exc.message.replace(entry.key_id, "aaaaaaaaaaaa")


def test_a_key_works_until_its_expiry_and_not_at_or_after_it(ring: KeyRing) -> None:
    entry, plain = ring.create("agent", "bob", expires_at=NOW + DAY, now=NOW)
    assert ring.authenticate(plain, NOW + DAY - 0.001).name == "bob"
    assert entry.state(NOW + DAY - 0.001) is KeyState.ACTIVE
    for now in (NOW + DAY, NOW + 2 * DAY):
        exc = _refused(ring, plain, now)
        assert exc.message.startswith(f"API key {entry.key_id} expired at 2023-11-15T22:13:20Z")
        assert entry.state(now) is KeyState.EXPIRED and entry.state(now) == "expired"


def test_an_expiry_must_be_after_now(ring: KeyRing) -> None:
    for expires_at in (NOW, NOW - 1, float("nan"), float("inf")):
        with pytest.raises(ValidationError) as caught:
            ring.create("agent", "bob", expires_at=expires_at, now=NOW)
        assert caught.value.details["field"] == "expires_at"
    assert ring.entries() == []


# --- revocation and rotation ---------------------------------------------------------------


def test_a_revoked_key_is_refused_and_revoking_again_changes_nothing(ring: KeyRing) -> None:
    entry, plain = ring.create("agent", "bob", now=NOW)
    revoked = ring.revoke(entry.key_id, now=NOW + 10)
    assert revoked.revoked_at == NOW + 10 and revoked.state(NOW + 10) is KeyState.REVOKED
    exc = _refused(ring, plain, NOW + 11)
    assert exc.message == f"API key {entry.key_id} was revoked at 2023-11-14T22:13:30Z"
    assert ring.revoke(entry.key_id, now=NOW + 99).revoked_at == NOW + 10
    assert ring.entries() == [revoked]


def test_revoked_wins_over_expired(ring: KeyRing) -> None:
    entry, plain = ring.create("agent", "bob", expires_at=NOW + 5, now=NOW)
    ring.revoke(entry.key_id, now=NOW + 1)
    assert "was revoked" in _refused(ring, plain, NOW + 50).message


def test_a_key_is_revoked_by_its_whole_text_too(ring: KeyRing) -> None:
    _, plain = ring.create("agent", "bob", now=NOW)
    ring.revoke(plain, now=NOW)
    assert "was revoked" in _refused(ring, plain).message


def test_an_unknown_or_malformed_key_id_is_named_in_the_refusal(ring: KeyRing) -> None:
    ring.create("agent", "bob", now=NOW)
    for act in (
        lambda: ring.revoke("zzzzzzzzzzzz", now=NOW),
        lambda: ring.rotate("zzzzzzzzzzzz", now=NOW),
    ):
        with pytest.raises(NotFoundError) as caught:
            act()
        assert "zzzzzzzzzzzz" in caught.value.message
        assert caught.value.details == {"field": "key_id", "key_id": "zzzzzzzzzzzz"}
    with pytest.raises(ValidationError) as bad:
        ring.revoke("not a key id", now=NOW)
    assert bad.value.message.startswith("key_id: must be a 12-character key id")
    with pytest.raises(ValidationError) as cut:
        ring.revoke("apk_abcdefghijkl_" + "A" * 20, now=NOW)
    assert cut.value.message.startswith("key_id: malformed API key")
    assert "A" * 20 not in str(cut.value)


def test_rotation_without_grace_revokes_the_old_key_at_once(ring: KeyRing) -> None:
    old, old_key = ring.create("operator", "olivia", roles=["admin"], now=NOW)
    new, new_key = ring.rotate(old.key_id, now=NOW + 60)
    assert new.key_id != old.key_id and _secret(new_key) != _secret(old_key)
    assert ring.authenticate(new_key, NOW + 60) == ring.authenticate(new_key, NOW + 60)
    assert ring.authenticate(new_key, NOW + 60).label == "operator:olivia@default"
    assert ring.authenticate(new_key, NOW + 60).roles == {"admin"}
    assert new.created_at == NOW + 60 and new.expires_at is None
    exc = _refused(ring, old_key, NOW + 60)
    assert exc.message.endswith(f"; its replacement is {new.key_id}")
    [stored_old, stored_new] = ring.entries()
    assert (stored_old.revoked_at, stored_old.replaced_by) == (NOW + 60, new.key_id)
    assert stored_new == new


def test_rotation_with_grace_keeps_the_old_key_until_the_grace_ends(ring: KeyRing) -> None:
    old, old_key = ring.create("agent", "bob", now=NOW)
    _, new_key = ring.rotate(old.key_id, now=NOW, grace_s=3600)
    assert ring.authenticate(old_key, NOW + 3599).name == "bob"
    assert ring.authenticate(new_key, NOW + 3599).name == "bob"
    assert "expired at 2023-11-14T23:13:20Z" in _refused(ring, old_key, NOW + 3600).message
    assert ring.authenticate(new_key, NOW + 10 * DAY).name == "bob"
    assert ring.entries()[0].revoked_at is None and ring.entries()[0].expires_at == NOW + 3600


def test_rotation_keeps_the_expiry_and_grace_never_extends_it(ring: KeyRing) -> None:
    old, _ = ring.create("agent", "bob", expires_at=NOW + 100, now=NOW)
    new, _ = ring.rotate(old.key_id, now=NOW + 10, grace_s=DAY)
    assert new.expires_at == NOW + 100
    assert ring.entries()[0].expires_at == NOW + 100


def test_only_active_unrotated_keys_rotate(ring: KeyRing) -> None:
    revoked, _ = ring.create("agent", "a", now=NOW)
    ring.revoke(revoked.key_id, now=NOW)
    expired, _ = ring.create("agent", "b", expires_at=NOW + 1, now=NOW)
    rotated, _ = ring.create("agent", "c", now=NOW)
    successor, _ = ring.rotate(rotated.key_id, now=NOW, grace_s=60)
    cases = {
        revoked.key_id: "is revoked; create a new key",
        expired.key_id: "is expired; create a new key",
        rotated.key_id: f"was already rotated to {successor.key_id}; rotate that",
    }
    before = ring.path.read_bytes()
    for key_id, why in cases.items():
        with pytest.raises(ValidationError) as caught:
            ring.rotate(key_id, now=NOW + 2)
        assert caught.value.details["field"] == "key_id" and why in caught.value.message
    assert ring.path.read_bytes() == before


@pytest.mark.parametrize("grace", [-1.0, float("nan"), float("inf")])
def test_a_grace_is_zero_or_more_finite_seconds(ring: KeyRing, grace: float) -> None:
    entry, _ = ring.create("agent", "bob", now=NOW)
    with pytest.raises(ValidationError) as caught:
        ring.rotate(entry.key_id, now=NOW, grace_s=grace)
    assert caught.value.details["field"] == "grace_s"


# --- who may hold a key --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name", "tenant", "field"),
    [
        ("agent", "has space", "default", "name"),
        ("agent", "", "default", "name"),
        ("agent", "a/b", "default", "name"),
        ("agent", "x" * 129, "default", "name"),
        ("agent", "bob", "-acme", "tenant"),
        ("agent", "bob", "", "tenant"),
        ("anonymous", "anonymous", "default", "kind"),
        ("robot", "bob", "default", "kind"),
    ],
)
def test_bad_principals_are_refused_naming_the_field(
    ring: KeyRing, kind: str, name: str, tenant: str, field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ring.create(kind, name, tenant=tenant, now=NOW)
    assert caught.value.details["field"] == field
    assert caught.value.message.startswith(f"{field}: ")
    assert not ring.path.exists()


@pytest.mark.parametrize("kind", ["agent", "application"])
def test_only_operators_hold_roles(ring: KeyRing, kind: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ring.create(kind, "bob", roles=["admin"], now=NOW)
    assert caught.value.message == (
        f"roles: only operators hold roles; remove them from this {kind} key (it acts as itself)"
    )


def test_operator_roles_are_checked_and_kept_once(ring: KeyRing) -> None:
    entry, _ = ring.create("operator", "olivia", roles=["hitl", "admin", "hitl"], now=NOW)
    assert entry.roles == ("hitl", "admin")
    with pytest.raises(ValidationError) as caught:
        ring.create("operator", "olivia", roles=["bad role"], now=NOW)
    assert caught.value.details["field"] == "roles"


def test_entry_states_and_principal() -> None:
    entry = KeyEntry(
        "abcdefghijkl", PrincipalKind.AGENT, "bob", "t1", (), NOW, NOW + 1, None, "0" * 64
    )
    assert [entry.state(t) for t in (NOW, NOW + 1)] == ["active", "expired"]
    assert entry.principal() == Principal(
        PrincipalKind.AGENT, "bob", "t1", frozenset(), Mechanism.API_KEY
    )


# --- the file ------------------------------------------------------------------------------


def test_a_tampered_hash_makes_the_key_unknown(ring: KeyRing) -> None:
    _, plain = ring.create("agent", "bob", now=NOW)
    doc = _doc(ring)
    doc["keys"][0]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    _write_doc(ring, doc)
    assert "unknown API key" in _refused(ring, plain).message


def test_a_tampered_revocation_is_honoured_only_as_written(ring: KeyRing) -> None:
    _, plain = ring.create("agent", "bob", now=NOW)
    doc = _doc(ring)
    doc["keys"][0]["revoked_at"] = NOW
    _write_doc(ring, doc)
    assert "was revoked" in _refused(ring, plain).message


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("kind", "anonymous", "kind anonymous holds no key"),
        ("kind", "robot", "'robot' is not a valid PrincipalKind"),
        ("roles", ["admin"], "roles on an agent key: only operators hold roles"),
        ("sha256", "XYZ", "sha256 is not 64 lower-case hex digits"),
        ("name", "a b", "name 'a b' is not a valid name"),
        ("created_at", "yesterday", "created_at is not epoch seconds"),
        ("key_id", "short", "key_id 'short' is not a key id"),
    ],
)
def test_a_tampered_entry_fails_naming_the_file(
    ring: KeyRing, field: str, value: Any, problem: str
) -> None:
    ring.create("operator", "olivia", now=NOW)
    _, plain = ring.create("agent", "bob", now=NOW)
    doc = _doc(ring)
    doc["keys"][1][field] = value
    _write_doc(ring, doc)
    with pytest.raises(CredentialsFileError) as caught:
        ring.authenticate(plain, NOW)
    assert caught.value.message.startswith(f"{ring.path}: keys[1] is not a valid key entry (")
    assert problem in caught.value.message
    assert caught.value.code == "internal_error"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "is not a JSON key ring"),
        (b"\xff\xfe", "is not a JSON key ring"),
        (b"[]", "is not a key ring"),
        (b'{"version": 1}', "is not a key ring"),
        (b'{"version": 2, "keys": []}', "has version 2, this Apiary reads version 1"),
        (b'{"keys": []}', "has version None"),
    ],
)
def test_a_corrupt_file_is_an_error_naming_it_and_is_never_overwritten(
    ring: KeyRing, content: bytes, problem: str
) -> None:
    ring.path.parent.mkdir(parents=True)
    ring.path.write_bytes(content)
    for act in (
        lambda: ring.authenticate("apk_abcdefghijkl_" + "A" * 43, NOW),
        ring.entries,
        lambda: ring.create("agent", "bob", now=NOW),
    ):
        with pytest.raises(CredentialsFileError) as caught:
            act()
        assert caught.value.message.startswith(f"{ring.path}: {problem}")
        assert caught.value.details == {"path": str(ring.path)}
    assert ring.path.read_bytes() == content


def test_a_repeated_key_id_is_corruption(ring: KeyRing) -> None:
    ring.create("agent", "bob", now=NOW)
    doc = _doc(ring)
    doc["keys"].append(doc["keys"][0])
    _write_doc(ring, doc)
    with pytest.raises(CredentialsFileError, match=r"keys\[1\] repeats key id"):
        ring.entries()


# --- sharing the file ----------------------------------------------------------------------


def test_another_ring_on_the_same_file_sees_every_change(ring: KeyRing) -> None:
    coordinator = KeyRing(ring.path)
    entry, plain = ring.create("agent", "bob", now=NOW)
    assert coordinator.authenticate(plain, NOW).name == "bob"
    ring.revoke(entry.key_id, now=NOW)
    assert "was revoked" in _refused(coordinator, plain).message
    _, carol = ring.create("agent", "carol", now=NOW)
    assert coordinator.authenticate(carol, NOW).name == "carol"
    ring.path.unlink()
    assert "unknown API key" in _refused(coordinator, carol).message


def test_an_unchanged_file_is_not_read_again(ring: KeyRing) -> None:
    """The cache is keyed by the file's identity: same inode, mtime and size means no read.
    Garbage written in place with the old mtime restored goes unnoticed; a new mtime is read."""
    _, plain = ring.create("agent", "bob", now=NOW)
    assert ring.authenticate(plain, NOW).name == "bob"
    before = ring.path.stat()
    with ring.path.open("r+b") as f:
        f.write(b"#" * before.st_size)
    os.utime(ring.path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ring.authenticate(plain, NOW).name == "bob"
    os.utime(ring.path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    with pytest.raises(CredentialsFileError):
        ring.authenticate(plain, NOW)


_WRITER = """
import sys
from pathlib import Path
from apiary.server.auth.keys import KeyRing
ring = KeyRing(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
for i in range(int(sys.argv[3])):
    print(ring.create("agent", f"{sys.argv[2]}-{i}", now=1.0)[1], flush=True)
"""


def test_concurrent_creation_from_two_processes_loses_no_key(ring: KeyRing) -> None:
    count = 40
    command = [sys.executable, "-c", _WRITER, str(ring.path)]
    writers = [
        subprocess.Popen(
            [*command, who, str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for who in ("left", "right")
    ]
    try:
        for proc in writers:  # both are loaded and waiting: release them together
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in writers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=60)[0] for proc in writers]
    finally:
        for proc in writers:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in writers] == [0, 0]
    keys = [line for out in outputs for line in out.splitlines()]
    assert len(keys) == 2 * count
    names = sorted(ring.authenticate(key, NOW).name for key in keys)
    assert names == sorted(f"{who}-{i}" for who in ("left", "right") for i in range(count))
    assert len({e.key_id for e in ring.entries()}) == 2 * count
