"""Agent tasks across a coordinator restart on its SQLite store: a task whose run waited for
its agent is there again with its attempts and edges, the same run goes on once the agent is
back (no second run), and a cancel after the restart records its intent and ends it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from apiary.sdk.agent import Agent
from apiary.sdk.tasks import TaskRunner
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import runtime_http, session_events
from tests.server.test_runtime_tasks import AGENT, Worker


async def test_a_tasks_run_in_hand_survives_a_restart_and_goes_on(tmp_path: Path) -> None:
    data = tmp_path / "state"
    async with open_test_coordinator(data, store="") as first, runtime_http(first) as runtime:
        await first.registry.register(
            {"agent_id": AGENT, "name": AGENT, "reasoning_connectors": ["builtin://rules"]}
        )
        made = await runtime.ok("create_task", task_id="keep", agent_id=AGENT, start=True)
        session_id = made["sessionId"]
        await runtime.ok("create_task", task_id="drop", session_id=session_id, agent_id=AGENT,
                         parent_task_id="keep", start=True)  # fmt: skip
        before = (await runtime.ok("get_task", task_id="keep"))["task"]
        assert before["status"] == "queued" and len(before["attempts"]) == 1
    async with open_test_coordinator(data, store="") as second, runtime_http(second) as runtime:
        after = (await runtime.ok("get_task", task_id="keep"))["task"]
        assert after["status"] == "queued" and after["attempts"] == before["attempts"]
        dropped = await runtime.ok("cancel_task", task_id="drop", reason="after the restart")
        assert dropped["status"] == "cancelled"
        worker = Worker()
        async with Agent(AGENT, coordinator=str(second.grpc_address)) as agent:
            job = asyncio.create_task(TaskRunner(agent, worker.handle).run())
            try:
                done = await runtime.until(
                    "get_task", lambda d: d["task"]["status"] == "completed", task_id="keep"
                )
            finally:
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job
        (attempt,) = done["task"]["attempts"]
        assert attempt["runId"] == before["attempts"][0]["runId"] and worker.runs == [
            attempt["runId"]
        ]
        events = await session_events(second, session_id)
        drop = [e["type"] for e in events if e.get("taskId") == "drop"]
        assert drop[-3:] == ["task.cancel_requested", "task.attempt.failed", "task.cancelled"]
