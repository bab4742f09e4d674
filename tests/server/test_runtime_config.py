"""The [runtime] table: the control plane's limits and windows from TOML, each refused past
its bounds with the setting named; and a coordinator configured with it applies them (a
thread's queue at its configured size refuses the next turn with buffer_full), over a real
HTTP socket."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from apiary.controlplane.settings import RuntimeSettings
from apiary.errors import ValidationError
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.coordinator import open_coordinator
from tests.server.runtime_harness import runtime_http


def _load(tmp_path: Path, text: str) -> RuntimeSettings:
    file = tmp_path / "apiary.toml"
    file.write_text(text)
    return load_config(file, {}, {}).runtime


def test_the_defaults_without_the_table() -> None:
    assert load_config(None, {}, {}).runtime == RuntimeSettings()


def test_the_runtime_table_sets_every_setting(tmp_path: Path) -> None:
    text = (
        "[runtime]\nmax_input_bytes = 1048576\nmax_queued_turns = 1\nturns_shown = 1000\n"
        "tasks_listed = 1\nreplay_limit = 5000\nchannel_ttl_s = 60\ntext_bytes = 65536\n"
    )
    assert _load(tmp_path, text) == RuntimeSettings(1048576, 1, 1000, 1, 5000, 60.0, 65536)


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("max_input_bytes = 1048577", "runtime.max_input_bytes", "between 1 and 1.04858e+06"),
        ("max_input_bytes = 0", "runtime.max_input_bytes", "between 1 and"),
        ("max_queued_turns = 100001", "runtime.max_queued_turns", "between 1 and 100000"),
        ("turns_shown = 0", "runtime.turns_shown", "between 1 and 1000"),
        ("tasks_listed = 10001", "runtime.tasks_listed", "between 1 and 10000"),
        ("replay_limit = 5001", "runtime.replay_limit", "between 1 and 5000"),
        ("channel_ttl_s = 59", "runtime.channel_ttl_s", "between 60 and 2.592e+06"),
        ("text_bytes = 65537", "runtime.text_bytes", "between 1 and 65536"),
        ("replay_limit = 1.5", "runtime.replay_limit", "must be an integer"),
        ('channel_ttl_s = "1d"', "runtime.channel_ttl_s", "must be a number"),
        ("queue = 3", "runtime.queue", "unknown setting runtime.queue"),
    ],
)
def test_a_bad_runtime_setting_is_named(tmp_path: Path, text: str, field: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _load(tmp_path, f"[runtime]\n{text}\n")
    assert caught.value.details["field"] == field
    assert says in caught.value.message
    assert "apiary.toml [runtime]" in caught.value.message


async def test_a_coordinator_applies_its_runtime_table(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text("[runtime]\nmax_queued_turns = 1\n")
    config = replace(
        load_config(file, {}, {}), data_dir=tmp_path / "data", store="memory://",
        grpc=Address("127.0.0.1", 0), http=Address("127.0.0.1", 0),
    )  # fmt: skip
    async with open_coordinator(config) as coordinator, runtime_http(coordinator) as runtime:
        await coordinator.registry.register(
            {"agent_id": "offline", "name": "offline", "reasoning_connectors": ["builtin://rules"]}
        )
        first = await runtime.ok("submit_turn", agent_id="offline", input=1)  # it starts
        await runtime.ok("submit_turn", thread_id=first["threadId"], input=2)  # it waits
        refused = await runtime.error(429, "submit_turn", thread_id=first["threadId"], input=3)
        assert refused["code"] == "buffer_full"
        assert refused["details"]["field"] == "thread_id"
