"""`apiary swarm ...` with real processes: two `apiary swarm serve` (HTTPS, the tests' CA),
driven by the CLI's commands next to them on the same homes."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from apiary.cli.main import app
from tests.swarm.pki import Pki

SRC = Path(__file__).resolve().parents[2] / "src"
COMMANDS = (
    "init", "create", "invite", "join", "leave", "kick", "mute", "unmute", "transfer", "send",
    "messages", "members", "status", "export", "import", "serve", "retry",
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cli:
    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, home: Path, *args: str, ok: bool = True) -> Any:
        result = self.runner.invoke(app, ["swarm", *args, "--home", str(home)])
        if ok:
            assert result.exit_code == 0, (args, result.output, result.exception)
        return result

    def json(self, home: Path, *args: str) -> Any:
        lines = self(home, *args, "--json").stdout.splitlines()
        return [json.loads(line) for line in lines]


def _serve(home: Path, port: int, pki: Pki) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "apiary.cli.main", "swarm", "serve", "--home", str(home),
        "--listen", f"127.0.0.1:{port}", "--cert", str(pki.cert_file), "--key", str(pki.key_file),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)  # fmt: skip
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("swarm="):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(60):
        process.kill()
        raise AssertionError(f"swarm serve did not start: {lines} {process.stderr.read()}")  # type: ignore[union-attr]
    return process


@pytest.fixture
def homes(tmp_path: Path, pki: Pki) -> Iterator[dict[str, Path]]:
    cli = Cli()
    found: dict[str, Path] = {}
    processes = []
    ports = {name: _free_port() for name in ("alpha", "beta")}
    for name, port in ports.items():
        home = tmp_path / name
        cli(home, "init", "--agent-id", name, "--endpoint",
            f"https://127.0.0.1:{port}/swarm", "--ca", str(pki.ca_file))  # fmt: skip
        found[name] = home
    try:
        processes = [_serve(found[name], port, pki) for name, port in ports.items()]
        yield found
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            assert process.wait(30) == 0


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(app, ["swarm", "--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert f" {command} " in result.output


def test_two_agents_federate_from_the_command_line(homes: dict[str, Path], tmp_path: Path) -> None:
    cli = Cli()
    alpha, beta = homes["alpha"], homes["beta"]
    (created,) = cli.json(alpha, "create", "builders")
    sid = created["swarm_id"]
    url = cli(alpha, "invite", sid, "--max-uses", "1").stdout.strip()
    assert url.startswith(f"swarm://{sid}@127.0.0.1:")
    assert "joined builders" in cli(beta, "join", url).stdout
    refused = cli(beta, "join", url.replace(sid, "0" * 8 + sid[8:]), ok=False)
    assert refused.exit_code == 1 and "INVALID_TOKEN" in refused.stderr
    listed = cli.json(alpha, "members", sid)
    assert [(m["agent_id"], m["master"]) for m in listed] == [("alpha", True), ("beta", False)]
    assert cli.json(beta, "members", sid) == listed

    sent = cli(beta, "send", sid, "alpha", "hello from beta", "--meta", "topic=greeting")
    assert "alpha: delivered" in sent.stdout
    inbox = [m for m in cli.json(alpha, "messages", "--swarm", sid) if m["type"] == "message"]
    assert [(m["from"], m["content"], m["metadata"]) for m in inbox] == [
        ("beta", "hello from beta", {"topic": "greeting"}),
    ]  # fmt: skip
    cli(alpha, "messages", "--mark-read")
    assert cli.json(alpha, "messages", "--status", "unread") == []
    (row,) = cli.json(beta, "messages", "--outbox")
    assert (row["to"], row["status"], row["attempts"]) == ("alpha", "delivered", 1)
    bad = cli(alpha, "messages", "--status", "lost", ok=False)
    assert bad.exit_code == 1 and "field status" in bad.stderr

    for home, args, expected in (
        (alpha, ("kick", sid, "nobody"), "MEMBER_NOT_FOUND"),
        (beta, ("kick", sid, "alpha"), "NOT_MASTER"),
        (alpha, ("send", "6ba7b810-9dad-41d1-80b4-00c04fd430c8", "beta", "x"), "SWARM_NOT_FOUND"),
        (alpha, ("invite", sid, "--expires-in", "5"), "field expires_in"),
        (alpha, ("mute",), "exactly one of --swarm or --agent"),
        (alpha, ("retry", "6ba7b810-9dad-41d1-80b4-00c04fd430c8"), "MESSAGE_NOT_FOUND"),
    ):
        result = cli(home, *args, ok=False)
        assert result.exit_code != 0 and expected in result.stderr, (args, result.output)

    cli(alpha, "kick", sid, "beta", "--reason", "done")
    (status,) = cli.json(beta, "status")
    assert status["swarms"] == []  # beta's own server applied the kick
    (status,) = cli.json(alpha, "status")
    assert [(s["name"], s["members"]) for s in status["swarms"]] == [("builders", 1)]

    exported = tmp_path / "alpha-state.json"
    cli(alpha, "export", "-o", str(exported))
    assert stat.S_IMODE(exported.stat().st_mode) == 0o600
    body = json.loads(exported.read_text())
    assert body["agent_id"] == "alpha" and "exported_at" in body
    cli(alpha, "leave", sid)
    assert cli.json(alpha, "status")[0]["swarms"] == []
    assert "1 swarm(s)" in cli(alpha, "import", str(exported)).stdout
    assert "exported_at" not in (alpha / "state.json").read_text()
    wrong = cli(beta, "import", str(exported), ok=False)
    assert wrong.exit_code == 1 and "agent_id" in wrong.stderr
