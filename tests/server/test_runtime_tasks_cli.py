"""`apiary runtime create-task ...` against a running coordinator (real CLI processes, an SDK
agent running the task's runs): create and start a task and wait for it, show it, link it,
and say clearly what went wrong."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from apiary.server.coordinator import Coordinator
from tests.server.test_runtime_tasks import AGENT, Worker, worker

__all__ = ["worker"]  # the fixture, shared with test_runtime_tasks.py


async def _cli(coordinator: Coordinator, *args: str, code: int = 0) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", *args,
        "--http", str(coordinator.http_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode(), err.decode()


async def test_the_command_line_creates_starts_and_reconciles_a_task(
    coordinator: Coordinator, worker: Worker
) -> None:
    out, _ = await _cli(
        coordinator, "create-task", "--task-id", "cli-1", "--agent", AGENT, "--title", "by hand",
        "--input", '{"mode": "answer"}', "--start", "--wait", "--timeout", "30",
    )  # fmt: skip
    task = json.loads(out)
    assert task["status"] == "completed" and task["result"] == {"done": "cli-1", "attempt": 1}
    out, _ = await _cli(coordinator, "create-task", "--task-id", "cli-2", "--session",
                        task["sessionId"], "--depends-on", "cli-1")  # fmt: skip
    assert json.loads(out)["relationships"][0]["targetId"] == "cli-1"
    out, _ = await _cli(coordinator, "link-tasks", "cli-2", "ev-9", "--kind", "evidence")
    assert {r["kind"] for r in json.loads(out)["relationships"]} == {"dependency", "evidence"}
    out, _ = await _cli(coordinator, "complete-task", "cli-2", "--result", '{"ok": true}',
                        "--evidence", "ev-9")  # fmt: skip
    assert json.loads(out)["evidenceRefs"] == ["ev-9"]
    # A refusal says what went wrong and exits 1.
    _, err = await _cli(coordinator, "retry-task", "cli-2", code=1)
    assert "cli-2" in err and "completed" in err
    _, err = await _cli(coordinator, "pause-task", "nope", code=1)
    assert "no task 'nope'" in err
