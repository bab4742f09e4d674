"""The [cluster] table: defaults, its settings from TOML, errors that name the setting; and
cluster mode is refused on a store that is not PostgreSQL."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from apiary.engine.cluster.settings import ClusterSettings, default_replica_id
from apiary.errors import ValidationError
from apiary.server.config.loader import checked_serving, load_config

PG = "postgresql://postgres@127.0.0.1:5432/test"


def _config(tmp_path: Path, text: str) -> ClusterSettings:
    file = tmp_path / "apiary.toml"
    file.write_text(text)
    return load_config(file, {}, {}).cluster


def test_defaults() -> None:
    settings = load_config(None, {}, {}).cluster
    assert settings == ClusterSettings(False, "", 5.0, 64)
    assert settings.renew_s == pytest.approx(5.0 / 3)
    assert settings.resolved_replica_id() == f"{socket.gethostname()}-{os.getpid()}"
    assert default_replica_id() == settings.resolved_replica_id()


def test_the_cluster_table_sets_every_setting(tmp_path: Path) -> None:
    text = '[cluster]\nenabled = true\nreplica_id = "eu-1"\nlease_s = 3\npartitions = 128\n'
    settings = _config(tmp_path, text)
    assert settings == ClusterSettings(True, "eu-1", 3.0, 128)
    assert (settings.renew_s, settings.resolved_replica_id()) == (1.0, "eu-1")


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("lease_s = 0", "cluster.lease_s", "between 0.5 and 300"),
        ("lease_s = 301", "cluster.lease_s", "between 0.5 and 300"),
        ('lease_s = "5s"', "cluster.lease_s", "must be a number"),
        ("partitions = 0", "cluster.partitions", "between 1 and 4096"),
        ("partitions = 5000", "cluster.partitions", "between 1 and 4096"),
        ("partitions = 8.5", "cluster.partitions", "must be an integer"),
        ('enabled = "yes"', "cluster.enabled", "must be true or false"),
        ('replica_id = "a b"', "cluster.replica_id", "letters, digits"),
        ('replica_id = "-x"', "cluster.replica_id", "starting with a letter or digit"),
        (f'replica_id = "{"r" * 129}"', "cluster.replica_id", "at most 128"),
        ("replica_id = 7", "cluster.replica_id", "must be a string"),
        ("renew_s = 1", "cluster.renew_s", "unknown setting cluster.renew_s"),
    ],
)
def test_a_bad_cluster_setting_is_named(tmp_path: Path, text: str, field: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _config(tmp_path, f"[cluster]\n{text}\n")
    assert caught.value.details["field"] == field
    assert says in caught.value.message
    assert "apiary.toml [cluster]" in caught.value.message


def test_cluster_mode_needs_postgresql(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text("[cluster]\nenabled = true\n")
    with pytest.raises(ValidationError, match="needs a PostgreSQL store") as caught:
        checked_serving(load_config(file, {}, {}))
    assert caught.value.details["field"] == "cluster.enabled"
    assert checked_serving(load_config(file, {}, {"store": PG})).cluster.enabled
    # Off (the default), nothing changes.
    file.write_text("[cluster]\nenabled = false\nlease_s = 2\n")
    assert checked_serving(load_config(file, {}, {"store": PG})).cluster.lease_s == 2.0
