"""`apiary demo` end to end: a real coordinator and two real agent processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from apiary.demo.job import run_demo


async def test_demo_exchange_is_in_the_event_log(tmp_path: Path) -> None:
    result = await run_demo(tmp_path / "demo")
    assert result.ok, result.reason
    assert result.count("agent.registered") == 2
    assert result.count("message.received") == 2  # hello and reply (ACKs are notices)
    assert result.ack_stages()["FULFILLED"] == 2
    alice = next(r for r in result.reports if r["agent"] == "alice")
    assert alice["reply"] == "hello back"
    assert alice["ack_stages"] == ["READ", "FULFILLED"]


def test_demo_command_exits_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "demo", "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo ok" in done.stdout
