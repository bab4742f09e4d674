"""Jobs across a coordinator restart on its SQLite store: a job whose items waited for their
agent is there again with its status and counts, its items' runs go on once the agent is back
(no second run) and the job completes; a job cancelled after the restart records its intent
and ends cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from apiary.sdk.agent import Agent
from apiary.sdk.tasks import TaskRunner
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import runtime_http, session_events
from tests.server.test_runtime_tasks import AGENT, Worker


async def test_a_job_survives_a_restart_and_its_items_go_on(tmp_path: Path) -> None:
    data = tmp_path / "state"
    async with open_test_coordinator(data, store="") as first, runtime_http(first) as runtime:
        await first.registry.register(
            {"agent_id": AGENT, "name": AGENT, "reasoning_connectors": ["builtin://rules"]}
        )
        made = await runtime.ok("create_job", job_id="kept", agent_id=AGENT,
                                items=[{"task_id": "k-1"}, {"task_id": "k-2"}])  # fmt: skip
        session_id = made["sessionId"]
        await runtime.ok("create_job", job_id="dropped", session_id=session_id,
                         agent_id=AGENT, items=[{"task_id": "d-1"}])  # fmt: skip
        before = (await runtime.ok("get_job", job_id="kept"))["job"]
        assert before["status"] == "queued" and before["itemCounts"] == {"queued": 2}
    async with open_test_coordinator(data, store="") as second, runtime_http(second) as runtime:
        after = (await runtime.ok("get_job", job_id="kept"))["job"]
        assert after == before
        dropped = await runtime.ok("cancel_job", job_id="dropped", reason="after the restart")
        assert dropped["status"] == "cancelled" and dropped["cancel"] == "cancelled"
        worker = Worker()
        async with Agent(AGENT, coordinator=str(second.grpc_address)) as agent:
            job = asyncio.create_task(TaskRunner(agent, worker.handle).run())
            try:
                done = await runtime.until(
                    "get_job", lambda d: d["job"]["status"] == "completed", job_id="kept"
                )
            finally:
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job
        items = done["job"]["items"]
        assert [i["attemptCount"] for i in items] == [1, 1] and len(worker.runs) == 2
        assert [i["currentRunId"] for i in items] == [i["currentRunId"] for i in before["items"]]
        events = await session_events(second, session_id)
        assert _job_events(events, "kept") == [
            "job.created", "job.started", "job.progress", "job.completed",
        ]  # fmt: skip
        assert _job_events(events, "dropped") == ["job.created", "job.progress", "job.cancelled"]


def _job_events(events: list[dict[str, Any]], job_id: str) -> list[str]:
    """The job's own events (not its items')."""
    return [
        e["type"] for e in events
        if e.get("jobId") == job_id and e["type"].startswith("job.") and "jobItemId" not in e
    ]  # fmt: skip
