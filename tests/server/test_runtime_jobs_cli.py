"""`apiary runtime job ...` against a running coordinator (real CLI processes, an SDK agent
running the items): create a job and wait for it, show it, cancel one, and say clearly what
went wrong."""

from __future__ import annotations

import json

from apiary.server.coordinator import Coordinator
from tests.server.test_runtime_tasks import AGENT, Worker, worker
from tests.server.test_runtime_tasks_cli import _cli

__all__ = ["worker"]  # the fixture, shared with test_runtime_tasks.py


async def test_the_command_line_creates_waits_for_shows_and_cancels_a_job(
    coordinator: Coordinator, worker: Worker
) -> None:
    out, _ = await _cli(
        coordinator, "job", "create", "--job-id", "cli-job", "--agent", AGENT,
        "--items", '[{"task_id": "c-1", "input": {"mode": "answer"}}]',
        "--item", '{"task_id": "c-2"}', "--wait", "--timeout", "30",
    )  # fmt: skip
    job = json.loads(out)
    assert job["status"] == "completed" and job["item_count"] == 2
    assert [i["output"]["done"] for i in job["items"]] == ["c-1", "c-2"]
    out, _ = await _cli(coordinator, "job", "get", "cli-job")
    assert json.loads(out)["job_id"] == "cli-job"
    # A job whose item holds is cancelled; the command waits for its items to stop.
    out, _ = await _cli(
        coordinator, "job", "create", "--job-id", "held", "--agent", AGENT,
        "--item", '{"input": {"mode": "loop"}}',
    )  # fmt: skip
    assert json.loads(out)["status"] in ("queued", "running")
    out, _ = await _cli(coordinator, "job", "cancel", "held", "--reason", "by hand", "--wait",
                        "--timeout", "30")  # fmt: skip
    cancelled = json.loads(out)
    assert cancelled["status"] == "cancelled"
    assert cancelled["intent"] == {"kind": "cancel", "reason": "by hand"}
    # Waited for, a job that did not complete prints as it ended and exits 1.
    out, _ = await _cli(
        coordinator, "job", "create", "--job-id", "failing", "--agent", AGENT,
        "--item", '{"input": {"mode": "fail"}}', "--wait", "--timeout", "30", code=1,
    )  # fmt: skip
    assert json.loads(out)["status"] == "failed"
    # A refusal says what went wrong and exits 1; a bad option exits 2.
    _, err = await _cli(coordinator, "job", "cancel", "cli-job", code=1)
    assert "cli-job" in err and "completed" in err
    _, err = await _cli(coordinator, "job", "get", "nope", code=1)
    assert "no job 'nope'" in err
    _, err = await _cli(coordinator, "job", "create", "--agent", AGENT, code=2)
    assert "--items" in err
