"""`apiary auth create|list|rotate|revoke` on a real data directory (DESIGN.md section 9)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from apiary.cli.auth import app, parse_duration
from apiary.errors import UnauthenticatedError, ValidationError
from apiary.server.auth.keys import KeyRing, credentials_path

KEY = re.compile(r"^apk_[a-z2-7]{12}_[A-Za-z0-9_-]{43}$")
SHOWN_ONCE = "This key will not be shown again"


def _auth(
    data_dir: Path | None, *args: str, code: int = 0, env: dict[str, str] | None = None
) -> Result:
    """`apiary auth ARGS --data-dir DATA_DIR` (no --data-dir when None)."""
    argv = [*args] if data_dir is None else [*args, "--data-dir", str(data_dir)]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "250", **(env or {})})
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


def _create(data_dir: Path, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_auth(data_dir, "create", *args, "--json").stdout)
    return doc


def _listed(data_dir: Path, *args: str) -> list[dict[str, Any]]:
    out = _auth(data_dir, "list", "--json", *args).stdout
    return [json.loads(line) for line in out.splitlines()]


def _ring(data_dir: Path) -> KeyRing:
    return KeyRing(credentials_path(data_dir))


def test_create_prints_the_key_once_and_it_authenticates(tmp_path: Path) -> None:
    result = _auth(tmp_path, "create", "operator", "olivia", "--role", "admin", "--role", "hitl",
                   "--tenant", "acme", "--expires", "30d")  # fmt: skip
    key = result.stdout.strip()
    assert KEY.match(key)
    assert SHOWN_ONCE in result.stderr and key not in result.stderr
    assert "for operator:olivia@acme, roles admin,hitl, expires 20" in result.stderr
    principal = _ring(tmp_path).authenticate(key, time.time())
    assert principal.label == "operator:olivia@acme"
    assert principal.roles == frozenset({"admin", "hitl"})
    assert key.split("_", 2)[2] not in credentials_path(tmp_path).read_text()
    [entry] = _ring(tmp_path).entries()
    assert entry.expires_at is not None
    assert abs(entry.expires_at - entry.created_at - 30 * 86400) < 1


def test_create_json_is_one_document_with_the_key(tmp_path: Path) -> None:
    before = time.time()
    doc = _create(tmp_path, "agent", "bob", "--expires", "12h")
    assert KEY.match(doc["key"]) and doc["key"].split("_")[1] == doc["key_id"]
    assert [doc[k] for k in ("kind", "name", "tenant", "roles")] == ["agent", "bob", "default", []]
    assert [doc[k] for k in ("principal", "state", "revoked_at")] == [
        "agent:bob@default", "active", None,
    ]  # fmt: skip
    assert before + 12 * 3600 <= doc["expires_at"] <= time.time() + 12 * 3600
    assert SHOWN_ONCE in doc["note"] and "sha256" not in doc
    assert _ring(tmp_path).authenticate(doc["key"], time.time()).name == "bob"


def test_list_shows_a_table_and_hides_revoked_keys_unless_all(tmp_path: Path) -> None:
    bob = _create(tmp_path, "agent", "bob")
    ci = _create(tmp_path, "application", "ci", "--tenant", "acme", "--expires", "90m")
    _auth(tmp_path, "revoke", bob["key_id"])
    table = _auth(tmp_path, "list").stdout
    assert "API keys (1)" in table and ci["key_id"] in table and bob["key_id"] not in table
    row = next(line for line in table.splitlines() if ci["key_id"] in line)
    assert re.search(r"application\s*│\s*ci\s*│\s*acme\s*│\s*│\s*20\d\d-.*│\s*active", row)
    everything = _auth(tmp_path, "list", "--all").stdout
    assert "API keys (2)" in everything
    bob_row = next(line for line in everything.splitlines() if bob["key_id"] in line)
    assert "never" in bob_row and "revoked" in bob_row
    for out in (table, everything):
        assert bob["key"] not in out and ci["key"] not in out


def test_list_json_is_one_key_per_line_without_hashes(tmp_path: Path) -> None:
    bob = _create(tmp_path, "agent", "bob")
    olivia = _create(tmp_path, "operator", "olivia", "--role", "admin")
    _auth(tmp_path, "revoke", olivia["key_id"])
    assert [d["key_id"] for d in _listed(tmp_path)] == [bob["key_id"]]
    both = _listed(tmp_path, "--all")
    assert [(d["name"], d["state"], d["roles"]) for d in both] == [
        ("bob", "active", []), ("olivia", "revoked", ["admin"]),
    ]  # fmt: skip
    assert all("sha256" not in d and "key" not in d for d in both)


def test_an_empty_data_dir_lists_no_keys(tmp_path: Path) -> None:
    assert "API keys (0)" in _auth(tmp_path / "new", "list").stdout
    assert _listed(tmp_path / "new") == []
    assert not (tmp_path / "new").exists()


def test_rotate_prints_a_new_key_and_revokes_the_old_one(tmp_path: Path) -> None:
    old = _create(tmp_path, "agent", "bob")
    result = _auth(tmp_path, "rotate", old["key_id"])
    new_key = result.stdout.strip()
    assert KEY.match(new_key) and new_key != old["key"]
    assert SHOWN_ONCE in result.stderr and "the old key is revoked" in result.stderr
    ring = _ring(tmp_path)
    assert ring.authenticate(new_key, time.time()).name == "bob"
    with pytest.raises(UnauthenticatedError, match="was revoked"):
        ring.authenticate(old["key"], time.time())


def test_rotate_with_grace_keeps_the_old_key_working(tmp_path: Path) -> None:
    old = _create(tmp_path, "agent", "bob")
    doc = json.loads(_auth(tmp_path, "rotate", old["key_id"], "--grace", "1h", "--json").stdout)
    assert KEY.match(doc["key"]) and doc["replaces"]["key_id"] == old["key_id"]
    assert doc["replaces"]["state"] == "active" and doc["replaces"]["replaced_by"] == doc["key_id"]
    assert abs(doc["replaces"]["expires_at"] - (doc["created_at"] + 3600)) < 1e-6
    now = time.time()
    assert _ring(tmp_path).authenticate(old["key"], now).name == "bob"
    assert _ring(tmp_path).authenticate(doc["key"], now).name == "bob"
    human = _auth(tmp_path, "rotate", doc["key_id"], "--grace", "90m")
    assert "the old key works until 20" in human.stderr


def test_revoke_stops_the_key(tmp_path: Path) -> None:
    bob = _create(tmp_path, "agent", "bob")
    out = _auth(tmp_path, "revoke", bob["key_id"]).stdout
    assert out.startswith(f"revoked key {bob['key_id']} of agent:bob@default at 20")
    with pytest.raises(UnauthenticatedError, match="was revoked"):
        _ring(tmp_path).authenticate(bob["key"], time.time())
    again = json.loads(_auth(tmp_path, "revoke", bob["key"], "--json").stdout)
    assert again["state"] == "revoked" and "sha256" not in again


def test_the_data_dir_comes_from_the_environment(tmp_path: Path) -> None:
    env = {"APIARY_DATA_DIR": str(tmp_path / "env")}
    key = _auth(None, "create", "agent", "bob", env=env).stdout.strip()
    assert _ring(tmp_path / "env").authenticate(key, time.time()).name == "bob"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["create", "agent", "bob", "--role", "admin"],
         "apiary auth: validation_error: roles: only operators hold roles"),
        (["create", "agent", "bad name"], "apiary auth: validation_error: name: name 'bad name'"),
        (["create", "agent", "bob", "--tenant", "a/b"], "apiary auth: validation_error: tenant: "),
        (["create", "anonymous", "x"], "apiary auth: validation_error: kind: anonymous principals"),
        (["create", "robot", "x"], "apiary auth: validation_error: kind: 'robot' must be one of"),
        (["create", "agent", "bob", "--expires", "5x"],
         "apiary auth: validation_error: --expires: '5x' is not a duration: use 30d, 12h, 90m"),
        (["rotate", "aaaaaaaaaaaa", "--grace", "soon"],
         "apiary auth: validation_error: --grace: 'soon' is not a duration"),
        (["rotate", "aaaaaaaaaaaa"], "apiary auth: NOT_FOUND: no API key aaaaaaaaaaaa in "),
        (["revoke", "aaaaaaaaaaaa"], "apiary auth: NOT_FOUND: no API key aaaaaaaaaaaa in "),
        (["revoke", "nope"], "apiary auth: validation_error: key_id: must be a 12-character"),
    ],
)  # fmt: skip
def test_errors_name_the_field_and_exit_1(tmp_path: Path, args: list[str], line: str) -> None:
    result = _auth(tmp_path, *args, code=1)
    assert result.stderr.startswith(line) and result.stdout == ""
    assert "Traceback" not in result.stderr


def test_a_not_found_key_names_the_field(tmp_path: Path) -> None:
    stderr = _auth(tmp_path, "revoke", "aaaaaaaaaaaa", code=1).stderr
    assert "(field key_id)" in stderr


def test_a_corrupt_file_is_reported_with_its_path(tmp_path: Path) -> None:
    credentials_path(tmp_path).write_text("{oops")
    for args in (["list"], ["create", "agent", "bob"]):
        stderr = _auth(tmp_path, *args, code=1).stderr
        assert stderr.startswith(f"apiary auth: internal_error: {credentials_path(tmp_path)}: ")
        assert "is not a JSON key ring" in stderr
    assert credentials_path(tmp_path).read_text() == "{oops"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400.0), ("12h", 43200.0), ("90m", 5400.0), ("45s", 45.0), ("0", 0.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == seconds


def test_never_is_a_duration_only_where_allowed() -> None:
    assert parse_duration("never", "--expires", never=True) is None
    with pytest.raises(ValidationError, match="--grace: 'never' is not a duration"):
        parse_duration("never", "--grace")
    for bad in ("", "1.5h", "-1d", "10", "d"):
        with pytest.raises(ValidationError):
            parse_duration(bad, "--expires", never=True)
