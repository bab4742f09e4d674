"""The runtime control plane end to end with real processes: `apiary serve`, an SDK agent
run by `apiary agent run`, and an application driving turns over HTTP through the SDK's
RuntimeClient and the `apiary runtime` command line. The application follows the session's
channel, gets each turn's result back as its task's result, interrupts a running turn; the
coordinator is SIGKILLed with turns queued, restarted on the same data directory, and the
application's channel resumes (snapshot first, then the events since its acknowledged
sequence) while the queued turns run once the agent is back. Every event and snapshot is
validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.errors import NotFoundError
from apiary.sdk.runtime import RuntimeClient
from tests.e2e.coordinator_process import ROOT, ServeProcess, kill, start_agent
from tests.server.runtime_harness import check_event, check_snapshot

WAIT_S = 30.0
AGENT = "answerer"
TARGET = "tests.e2e.runtime_agents:Answerer"


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    running = ServeProcess(tmp_path / "state")
    await running.start()
    yield running
    if running.proc is not None:
        await kill(running.proc)


async def _until(ready: Any) -> Any:
    async def poll() -> Any:
        while True:
            found = await ready()
            if found:
                return found
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), WAIT_S)


def _turns(snapshot: Any) -> dict[str, str]:
    return {t.turn_id: t.status for thread in snapshot.threads for t in thread.turns or ()}


async def _cli(serve: ServeProcess, *args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", *args, "--http", serve.http,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 0, err.decode()
    return dict(json.loads(out))


async def test_an_application_drives_an_sdk_agent_through_the_runtime_control_plane(
    serve: ServeProcess,
) -> None:
    agent = await start_agent(serve, TARGET)
    try:
        async with RuntimeClient(serve.http) as app:
            first = await _until(lambda: _submit_when_registered(app))
            session_id, thread_id = first.session_id, first.thread_id
            opened = await app.reconnect_channel(session_id)
            channel = opened.channel
            check_snapshot(opened.snapshot.to_json())
            done = await app.wait_turn(session_id, "e-1", timeout=WAIT_S)
            assert (done.status, done.result) == ("completed", {"answer": 1, "turn": "e-1"})
            # The command line submits to the same thread and waits for the result.
            shown = await _cli(
                serve, "submit", '{"value": 2}', "--input-json", "--thread", thread_id,
                "--turn-id", "e-2", "--wait", "--timeout", str(WAIT_S), "--json",
            )  # fmt: skip
            assert shown["result"] == {"answer": 2, "turn": "e-2"} and shown["created"]
            # A running turn is interrupted: it stops at the agent's next safe point.
            await app.submit_turn({"mode": "loop"}, thread_id=thread_id, turn_id="e-3")
            await _until(lambda: _running(app, thread_id, "e-3"))
            await app.interrupt_turn(thread_id=thread_id, reason="changed my mind")
            stopped = await app.wait_turn(session_id, "e-3", timeout=WAIT_S)
            assert stopped.status == "cancelled" and stopped.error["code"] == "cancelled"
            # The agent goes away; turns wait in the thread; the coordinator is killed.
            await kill(agent)
            for n in (4, 5):
                await app.submit_turn({"value": n}, thread_id=thread_id, turn_id=f"e-{n}")
            read = await app.get_session(session_id)
            acked = await app.ack_events(channel.channel_id, channel.resume_token, read.cursor)
            assert acked.acknowledged_sequence == read.cursor
        assert serve.proc is not None
        await serve.kill()
        await serve.start()
        agent = await start_agent(serve, TARGET)
        async with RuntimeClient(serve.http) as app:
            resumed = await app.reconnect_channel(
                session_id, channel_id=channel.channel_id, resume_token=channel.resume_token
            )
            check_snapshot(resumed.snapshot.to_json())
            assert {"e-4", "e-5"} <= set(_turns(resumed.snapshot))
            assert all(e.sequence is not None and e.sequence > read.cursor for e in resumed.events)
            assert resumed.events[-1].type == "channel.resumed"
            last = await app.wait_turn(session_id, "e-5", timeout=WAIT_S)
            assert last.result == {"answer": 5, "turn": "e-5"}
            final = await app.get_thread_read(thread_id)
            check_snapshot(final.to_json())
            assert _turns(final) == {
                "e-1": "completed", "e-2": "completed", "e-3": "cancelled", "e-4": "completed",
                "e-5": "completed",
            }  # fmt: skip
            # Every fact of the session, from the first, is a valid event of the contract.
            everything = await app.reconnect_channel(session_id, limit=0)
            fresh = everything.channel
            replay = await app.reconnect_channel(
                session_id, channel_id=fresh.channel_id, resume_token=fresh.resume_token
            )
            for event in replay.events:
                check_event(event.to_json())
            tasks = await app.list_tasks(session_id=session_id)
            assert [t.turn_id for t in tasks] == ["e-1", "e-2", "e-3", "e-4", "e-5"]
            assert [t.status for t in tasks] == [
                "completed",
                "completed",
                "cancelled",
                "completed",
                "completed",
            ]
    finally:
        await kill(agent)


async def _submit_when_registered(app: RuntimeClient) -> Any:
    try:
        return await app.submit_turn({"value": 1}, agent_id=AGENT, turn_id="e-1")
    except NotFoundError:
        return None  # the agent has not registered yet


async def _running(app: RuntimeClient, thread_id: str, turn_id: str) -> bool:
    return _turns(await app.get_thread_read(thread_id)).get(turn_id) == "running"
