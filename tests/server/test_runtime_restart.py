"""The runtime control plane across a coordinator restart on its SQLite store: a thread's
queue, its turns, the task of the turn that waited and an application's channel are all
there again, and the turns go on in order once the agent is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import running_answerer, runtime_http, session_events, types

AGENT = "later"


@pytest.mark.conformance("runtime.queue.survives-restart")
async def test_a_threads_queue_and_its_turns_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "state"
    async with open_test_coordinator(data, store="") as first, runtime_http(first) as runtime:
        assert first.store.backend == "sqlite"
        await first.registry.register(
            {"agent_id": AGENT, "name": AGENT, "reasoning_connectors": ["builtin://rules"]}
        )
        made = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="r-1", input={"value": 1})
        session_id, thread_id = made["sessionId"], made["threadId"]
        for n in (2, 3):
            await runtime.ok(
                "submit_turn", thread_id=thread_id, turn_id=f"r-{n}", input={"value": n}
            )
        channel = (await runtime.ok("reconnect_channel", session_id=session_id))["channel"]
        before = await runtime.ok("get_session", session_id=session_id)
        mark = before["cursor"]["sequence"]
        await runtime.ok(
            "ack_events", channel_id=channel["channelId"], resume_token=channel["resumeToken"],
            sequence=mark,
        )  # fmt: skip
    async with open_test_coordinator(data, store="") as second, runtime_http(second) as runtime:
        after = await runtime.ok("get_session", session_id=session_id)
        (thread,) = after["snapshot"]["threads"]
        assert {t["turnId"]: t["status"] for t in thread["turns"]} == {
            "r-1": "preparing", "r-2": "queued", "r-3": "queued",
        }  # fmt: skip
        assert [q["turnId"] for q in thread["queuedTurns"]] == ["r-2", "r-3"]
        assert thread["activeTurnId"] == "r-1"
        assert [t["nativeStatus"] for t in after["snapshot"]["tasks"]] == ["QUEUED"]
        # The channel resumes from its acknowledged sequence: snapshot, then what came since.
        resumed = await runtime.ok(
            "reconnect_channel", session_id=session_id, channel_id=channel["channelId"],
            resume_token=channel["resumeToken"],
        )  # fmt: skip
        assert resumed["snapshot"]["threads"][0]["queuedTurns"] == thread["queuedTurns"]
        assert all(e["sequence"] > mark for e in resumed["events"])
        async with running_answerer(second, AGENT) as answerer:
            read = await runtime.thread_status(thread_id, "completed")
        assert answerer.seen == ["r-1", "r-2", "r-3"]
        assert {t["turnId"]: t["status"] for t in read["threads"][0]["turns"]} == {
            "r-1": "completed", "r-2": "completed", "r-3": "completed",
        }  # fmt: skip
        assert read["threads"][0]["lastOutcome"]["result"] == {"answer": 3}
        events = await session_events(second, session_id)
        assert types(events, "r-2") == [
            "turn.submitted", "task.created", "task.started", "turn.started", "task.completed",
            "turn.completed",
        ]  # fmt: skip
