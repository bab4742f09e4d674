"""Configuration layering: defaults < TOML < environment < flags, with named errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.errors import ValidationError
from apiary.server.config import Address, load_config


def test_defaults() -> None:
    config = load_config(None, {}, {})
    assert str(config.grpc) == "127.0.0.1:50051"
    assert str(config.http) == "127.0.0.1:8080"
    assert config.data_dir == Path(".apiary")
    assert config.store == ""


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        '[server]\ngrpc = "0.0.0.0:1"\nhttp = "0.0.0.0:2"\ndata_dir = "/f"\nlog_level = "debug"\n'
    )
    env = {"APIARY_HTTP": "127.0.0.1:3", "APIARY_DATA_DIR": "/e"}
    config = load_config(file, env, {"data_dir": "/flag", "grpc": None})
    assert config.grpc == Address("0.0.0.0", 1)
    assert config.http == Address("127.0.0.1", 3)
    assert config.data_dir == Path("/flag")
    assert config.log_level == "DEBUG"


def test_config_file_from_environment(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('[server]\nstore = "memory://"\n')
    assert load_config(None, {"APIARY_CONFIG": str(file)}, {}).store == "memory://"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"grpc": "nope"}, "grpc"),
        ({"http": "127.0.0.1:99999"}, "http"),
        ({"log_level": "LOUD"}, "log_level"),
    ],
)
def test_bad_flags_name_the_setting(flags: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_config(None, {}, flags)
    assert field in caught.value.message


def test_unknown_file_setting_is_named(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[server]\ngrcp = '127.0.0.1:1'\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert "grcp" in caught.value.message


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        load_config(tmp_path / "absent.toml", {}, {})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ValidationError, match=str(bad)):
        load_config(bad, {}, {})


def test_ipv6_address() -> None:
    address = Address.parse("[::1]:0", "grpc")
    assert address == Address("::1", 0)
    assert str(address) == "[::1]:0"


def test_router_table_sets_messaging_settings(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[router]\nbuffer_capacity = 500\nack_timeout_s = 30\nhlc_required = true\n"
        "[router.limits]\nDATA = 1024\n"
    )
    router = load_config(file, {}, {}).router
    assert (router.buffer_capacity, router.ack_timeout_s, router.hlc_required) == (500, 30.0, True)
    assert router.limits.data == 1024


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("buffer_capacity = 0", "buffer_capacity"),
        ("ack_timeout_s = 'soon'", "ack_timeout_s"),
        ("bufer_capacity = 5", "bufer_capacity"),
    ],
)
def test_bad_router_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(f"[router]\n{table}\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert field in caught.value.message


def test_hitl_table_configures_policy_and_operators(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[hitl]\ntimeout_s = 120\ntimeout_action = 'AUTO_RESOLVE'\n"
        "unavailable_policy = 'EXTEND_TIMEOUT'\npresence_required = true\n"
        "[[hitl.operators]]\nname = 'olivia'\ntoken = 'secret'\nroles = ['admin']\n"
        "[[hitl.operators]]\nname = 'sam'\n"
        "token_sha256 = '2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b'\n"
    )
    hitl = load_config(file, {}, {}).hitl
    assert hitl.policy.default_timeout_s == 120.0
    assert (hitl.policy.timeout_action, hitl.policy.unavailable_policy) == (
        "AUTO_RESOLVE", "EXTEND_TIMEOUT",
    )  # fmt: skip
    assert hitl.presence_required is True
    assert [o.name for o in hitl.operators] == ["olivia", "sam"]
    assert hitl.operators[0].token_sha256 != "secret"  # only the digest is kept


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("[hitl]\ntimeout_action = 'MAYBE'\n", "timeout_action"),
        ("[hitl]\ntimout_s = 5\n", "timout_s"),
        ("[[hitl.operators]]\nname = 'x'\n", "token"),
        ("[[hitl.operators]]\ntoken = 'x'\n", "name"),
    ],
)
def test_bad_hitl_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(table)
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert field in caught.value.message
