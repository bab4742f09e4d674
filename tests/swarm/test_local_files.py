"""The files of a swarm home: the state file (UTF-8, 0600, schema-validated, atomic), its
export and import, the identity key (0600, refused when others can read it) and node.json."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from apiary.swarm import membership as ms
from apiary.swarm.errors import SwarmFileError
from apiary.swarm.home import NodeConfig, SwarmHome
from apiary.swarm.keyfile import load_identity, save_identity
from apiary.swarm.keys import Identity
from apiary.swarm.statefile import (
    StateFile,
    export_state,
    import_state,
    load_state,
    save_state,
    state_json,
)

SWARM = "550e8400-e29b-41d4-a716-446655440000"
OTHER = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
AT = "2026-02-05T14:30:00.000Z"
KEY = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _state(
    agent: str = "agent-ü", swarm_id: str = SWARM, name: str = "bâtisseurs"
) -> ms.MembershipState:
    me = ms.Member(agent, "https://me.example/swarm", KEY, AT)
    return ms.create(ms.MembershipState(agent), swarm_id, name, me).state


@pytest.mark.conformance("swarm.state.utf8", "swarm.state.owner-only", "swarm.state.schema")
def test_the_state_file_is_utf8_owner_only_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "home" / "state.json"
    state = ms.mute_agent(_state(), "spam-bot").state
    save_state(path, state)
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    text = path.read_bytes().decode("utf-8")
    assert "agent-ü" in text and "bâtisseurs" in text  # UTF-8, not \\u escapes
    assert load_state(path) == state
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temporary left


@pytest.mark.conformance("swarm.state.owner-only")
def test_an_open_or_invalid_state_file_is_refused_naming_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, _state())
    path.chmod(0o644)
    with pytest.raises(SwarmFileError, match="chmod 600"):
        load_state(path)
    path.chmod(0o600)
    body = json.loads(path.read_text())
    body["swarms"][SWARM]["members"][0]["endpoint"] = "http://plain.example"
    path.write_text(json.dumps(body))
    with pytest.raises(SwarmFileError) as caught:
        load_state(path)
    assert caught.value.field == f"swarms.{SWARM}.members.0.endpoint"
    path.write_text(json.dumps({**body, "schema_version": "2.0.0"}))
    with pytest.raises(SwarmFileError) as caught:
        load_state(path)
    assert caught.value.field == "schema_version"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(SwarmFileError, match="UTF-8"):
        load_state(path)
    with pytest.raises(SwarmFileError, match="apiary swarm init"):
        load_state(tmp_path / "missing.json")


def test_state_changes_are_read_modify_write_under_a_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, _state())
    first, second = StateFile(path), StateFile(path)  # two processes' views
    assert first.load() == second.load()
    first.update(lambda s: (ms.mute_agent(s, "a").state, None))
    second.update(lambda s: (ms.mute_agent(s, "b").state, None))  # sees "a": nothing lost
    assert first.load().muted_agents == frozenset({"a", "b"})
    assert _mode(path) == 0o600
    unchanged = path.stat().st_mtime_ns
    assert first.update(lambda s: (s, "no change")) == "no change"
    assert path.stat().st_mtime_ns == unchanged  # nothing to write, nothing written


def test_export_adds_exported_at_and_import_merges_or_replaces(tmp_path: Path) -> None:
    current = ms.mute_agent(_state(), "a").state
    current = current.with_key("x", ms.KeyEntry(KEY, "2026-01-01T00:00:00.000Z", ""))
    other = _state(swarm_id=OTHER, name="other")
    other = ms.mute_agent(other, "b").state
    other = other.with_key("x", ms.KeyEntry(KEY, "2026-02-01T00:00:00.000Z", ""))
    exported = export_state(other, 1770301800.0)
    assert exported["exported_at"] == "2026-02-05T14:30:00.000Z"
    data = json.dumps(exported).encode()
    merged = import_state(data, current, "merge")
    assert set(merged.swarms) == {SWARM, OTHER}
    assert merged.muted_agents == frozenset({"a", "b"})
    assert merged.public_keys["x"].fetched_at == "2026-02-01T00:00:00.000Z"  # the newer
    replaced = import_state(data, current, "replace")
    assert set(replaced.swarms) == {OTHER}
    assert "exported_at" not in state_json(replaced).decode()
    with pytest.raises(SwarmFileError) as caught:
        import_state(data, ms.MembershipState("someone-else"))
    assert caught.value.field == "agent_id"
    bad = json.dumps({**exported, "schema_version": "9.0.0"}).encode()
    with pytest.raises(SwarmFileError) as caught:
        import_state(bad, current)
    assert caught.value.field == "schema_version"
    with pytest.raises(SwarmFileError) as caught:
        import_state(json.dumps({**exported, "muted_swarms": ["not-a-uuid"]}).encode(), current)
    assert caught.value.field == "muted_swarms.0"


def test_the_identity_key_is_owner_only_and_refused_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "identity.key"
    identity = Identity.generate()
    save_identity(path, identity)
    assert _mode(path) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert load_identity(path).public_key == identity.public_key
    for mode in (0o640, 0o604, 0o660):
        path.chmod(mode)
        with pytest.raises(SwarmFileError, match=f"mode {mode:04o}.*chmod 600"):
            load_identity(path)
    path.chmod(0o600)
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    path.write_bytes(other)
    with pytest.raises(SwarmFileError, match="Ed25519"):
        load_identity(path)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(SwarmFileError):
        load_identity(link)
    with pytest.raises(SwarmFileError, match="apiary swarm init"):
        load_identity(tmp_path / "none.key")


def test_a_home_is_made_once_and_keeps_its_identity(tmp_path: Path) -> None:
    home = SwarmHome(tmp_path / "home")
    config = NodeConfig("alpha", "https://alpha.example/swarm", wake="notify-send x")
    identity = home.init(config)
    assert home.config() == config
    assert _mode(home.path) == 0o700
    assert all(_mode(p) == 0o600 for p in home.path.iterdir())
    assert home.init(config).public_key == identity.public_key  # kept
    with pytest.raises(SwarmFileError) as caught:
        home.init(NodeConfig("beta", "https://beta.example/swarm"))
    assert caught.value.field == "agent_id"
    with pytest.raises(SwarmFileError) as caught:
        home.init(NodeConfig("alpha", "http://alpha.example/swarm"))
    assert caught.value.field == "endpoint"
    home.config_path.write_text(json.dumps({"agent_id": "alpha", "endpoint": 3}))
    with pytest.raises(SwarmFileError) as caught:
        home.config()
    assert caught.value.field == "endpoint"
