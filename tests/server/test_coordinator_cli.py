"""Client commands reach a running coordinator one way (real CLI processes, real sockets):
`--coordinator`, APIARY_COORDINATOR, a profile of the client configuration (`--profile` or
APIARY_PROFILE), the hidden older `--grpc`; a coordinator that does not answer is one line
naming its address and where that came from; tables printed to a pipe keep ids whole."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

ROOT = Path(__file__).resolve().parents[2]
CLIENT_VARIABLES = (
    "APIARY_API_KEY", "APIARY_TLS_CA", "APIARY_TLS_CERT", "APIARY_TLS_KEY", "APIARY_AUDIENCE",
    "APIARY_COORDINATOR", "APIARY_PROFILE", "APIARY_CLIENT_CONFIG", "APIARY_DATA_DIR",
    "APIARY_TENANT", "APIARY_TOKEN", "XDG_CONFIG_HOME", "COLUMNS", "LINES",
)  # fmt: skip


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path / "served") as running:
        await running.registry.register({
            "agent_id": "worker", "name": "worker", "reasoning_connectors": ["builtin://rules"],
            "modalities_supported": ["application/json", "text/plain"],
        })  # fmt: skip
        yield running


def _closed_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _cli(
    tmp_path: Path, *args: str, code: int, env: dict[str, str] | None = None
) -> tuple[str, str]:
    """`apiary ARGS` in `tmp_path` (its own ./.apiary and home), stdout and stderr pipes."""
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_VARIABLES}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", *args, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**base, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "home" / ".config" / "apiary" / "client.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def test_the_environment_variable_names_the_coordinator(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    out, _ = await _cli(tmp_path, "status", "--json", code=0,
                        env={"APIARY_COORDINATOR": address})  # fmt: skip
    called = json.loads(out)["coordinator"]
    assert (called["address"], called["source"]) == (address, "APIARY_COORDINATOR")
    assert [a["agent_id"] for a in json.loads(out)["agents"]] == ["worker"]
    # The flag wins over the variable; the older --grpc still works, hidden.
    closed = f"127.0.0.1:{_closed_port()}"
    out, _ = await _cli(tmp_path, "status", "--json", "--coordinator", address, code=0,
                        env={"APIARY_COORDINATOR": closed})  # fmt: skip
    assert json.loads(out)["coordinator"]["source"] == "--coordinator"
    out, _ = await _cli(tmp_path, "task", "list", "--json", "--grpc", address, code=0,
                        env={"APIARY_COORDINATOR": closed})  # fmt: skip
    assert out == ""


async def test_a_profile_names_the_coordinator(coordinator: Coordinator, tmp_path: Path) -> None:
    address = str(coordinator.grpc_address)
    closed = f"127.0.0.1:{_closed_port()}"
    config = _config(tmp_path, f'[client]\ncoordinator = "{closed}"\n\n'
                               f'[profiles.live]\ncoordinator = "{address}"\n')  # fmt: skip
    out, _ = await _cli(tmp_path, "status", "--json", "--profile", "live", code=0)
    called = json.loads(out)["coordinator"]
    assert (called["address"], called["source"]) == (address, f"{config} [profiles.live]")
    await _cli(tmp_path, "dlq", "list", "--json", code=0, env={"APIARY_PROFILE": "live"})
    # Without a profile, the [client] table's address: nothing answers there.
    _, err = await _cli(tmp_path, "dlq", "list", code=1)
    assert err == f"apiary dlq: cannot reach the coordinator at {closed} (from {config})\n"
    _, err = await _cli(tmp_path, "status", "--profile", "nope", code=2)
    assert err.splitlines() == [
        f"apiary status: profile: no profile 'nope': {config} has live",
    ]


async def test_a_coordinator_that_does_not_answer_is_one_line_naming_it(tmp_path: Path) -> None:
    closed = f"127.0.0.1:{_closed_port()}"
    _, err = await _cli(tmp_path, "events", "--coordinator", closed, code=1)
    assert err == f"apiary events: cannot reach the coordinator at {closed} (from --coordinator)\n"
    _, err = await _cli(tmp_path, "hitl", "list", code=1, env={"APIARY_COORDINATOR": closed})
    assert err == (
        f"apiary hitl: cannot reach the coordinator at {closed} (from APIARY_COORDINATOR)\n"
    )
    _, err = await _cli(tmp_path, "agent", "run", "tests.e2e.sdk_agents:Echo",
                        code=1, env={"APIARY_COORDINATOR": closed})  # fmt: skip
    assert err == (
        f"apiary agent run: cannot reach the coordinator at {closed} (from APIARY_COORDINATOR)\n"
    )
    # `agent run` names it with -c too.
    _, err = await _cli(tmp_path, "agent", "run", "tests.e2e.sdk_agents:Echo", "-c", closed,
                        code=1)  # fmt: skip
    assert (
        err == f"apiary agent run: cannot reach the coordinator at {closed} (from --coordinator)\n"
    )
    _, err = await _cli(tmp_path, "status", "--coordinator", "localhost", code=2)
    assert (
        err == "apiary status: coordinator: 'localhost' must be HOST:PORT (e.g. 127.0.0.1:50051)\n"
    )


async def test_a_table_printed_to_a_pipe_keeps_ids_whole(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    address = str(coordinator.grpc_address)
    task_id = str(uuid.uuid4())
    await _cli(tmp_path, "task", "submit", "worker", "--scope", "repo:app", "--id", task_id,
               "--coordinator", address, code=0)  # fmt: skip
    out, _ = await _cli(tmp_path, "task", "list", "--coordinator", address, code=0)
    row = next(line for line in out.splitlines() if "worker" in line)
    assert re.search(rf"\b{task_id}\b", row), out
    assert max(len(line) for line in out.splitlines()) > 80  # not wrapped at 80 columns
