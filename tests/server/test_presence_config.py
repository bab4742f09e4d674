"""The [presence] table: its settings from TOML with errors that name the setting, and a
coordinator configured with it marks an agent that stops answering heartbeats UNAVAILABLE on
its schedule (the defaults would take 15 s and more), over real gRPC sockets."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from apiary.engine.presence import PresenceSettings
from apiary.errors import ValidationError
from apiary.sdk.connection import Connection
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.coordinator import open_coordinator

WAIT_S = 10.0
"""Far below what the default settings take to mark an agent UNAVAILABLE (15 s + 3 x 5 s)."""


def _load(tmp_path: Path, text: str) -> PresenceSettings | None:
    file = tmp_path / "apiary.toml"
    file.write_text(text)
    return load_config(file, {}, {}).presence


def test_without_the_table_the_engine_defaults_apply(tmp_path: Path) -> None:
    assert load_config(None, {}, {}).presence is None
    assert PresenceSettings() == PresenceSettings(5.0, 15.0, 3)


def test_the_presence_table_sets_every_setting(tmp_path: Path) -> None:
    text = "[presence]\nheartbeat_interval_s = 1\nheartbeat_timeout_s = 2.5\ndebounce = 2\n"
    assert _load(tmp_path, text) == PresenceSettings(1.0, 2.5, 2)
    # At the limits.
    text = "[presence]\nheartbeat_interval_s = 0.1\nheartbeat_timeout_s = 3600\ndebounce = 100\n"
    assert _load(tmp_path, text) == PresenceSettings(0.1, 3600.0, 100)


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("heartbeat_interval_s = 0.05", "presence.heartbeat_interval_s", "between 0.1 and 3600"),
        ("heartbeat_timeout_s = 3601", "presence.heartbeat_timeout_s", "between 0.1 and 3600"),
        ("heartbeat_interval_s = nan", "presence.heartbeat_interval_s", "must be a number"),
        ('heartbeat_interval_s = "5s"', "presence.heartbeat_interval_s", "must be a number"),
        (
            "heartbeat_interval_s = 10\nheartbeat_timeout_s = 5",
            "presence.heartbeat_timeout_s",
            "must be at least presence.heartbeat_interval_s",
        ),
        ("debounce = 0", "presence.debounce", "between 1 and 100"),
        ("debounce = 101", "presence.debounce", "between 1 and 100"),
        ("debounce = 1.5", "presence.debounce", "must be an integer"),
        ("timeout = 3", "presence.timeout", "unknown setting presence.timeout"),
    ],
)
def test_a_bad_presence_setting_is_named(tmp_path: Path, text: str, field: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _load(tmp_path, f"[presence]\n{text}\n")
    assert caught.value.details["field"] == field
    assert says in caught.value.message
    assert "apiary.toml [presence]" in caught.value.message


async def test_an_agent_that_stops_answering_is_unavailable_on_the_configured_schedule(
    tmp_path: Path,
) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        "[presence]\nheartbeat_interval_s = 0.1\nheartbeat_timeout_s = 0.3\ndebounce = 2\n"
    )
    config = replace(
        load_config(file, {}, {}), data_dir=tmp_path / "data", store="memory://",
        grpc=Address("127.0.0.1", 0), http=Address("127.0.0.1", 0),
    )  # fmt: skip
    async with open_coordinator(config) as coordinator:
        assert coordinator.presence.settings == PresenceSettings(0.1, 0.3, 2)
        # Registered, then silent: it never reads its stream, so it answers no heartbeat.
        async with Connection("quiet", coordinator=str(coordinator.grpc_address)) as quiet:
            await quiet.register()

            async def unavailable() -> None:
                # The registry's stored state has no event to wait for: polled.
                while (await coordinator.registry.get("quiet")).state != "UNAVAILABLE":  # noqa: ASYNC110
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(unavailable(), WAIT_S)
