"""`apiary runtime ...` against a running coordinator (real sockets, real CLI processes, an
SDK agent answering the turns): submit and wait, read the session, the thread and the tasks,
follow the events, acknowledge, interrupt, and say clearly what went wrong."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from apiary.controlplane.commands import CONTRACT_COMMANDS
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import Answerer, check_event, check_snapshot, running_answerer


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


async def test_the_command_line_drives_a_thread(coordinator: Coordinator) -> None:
    async with running_answerer(coordinator) as answerer:
        out, _ = await _cli(
            coordinator, "submit", "hello", "--agent", "answerer", "--turn-id", "c-1",
            "--wait", "--timeout", "30", "--json",
        )  # fmt: skip
        made = json.loads(out)
        assert (made["status"], made["result"]) == ("completed", {"answer": "hello"})
        session, thread = made["session_id"], made["thread_id"]
        # The same turn id again is the same turn, over JSON-RPC too.
        again = json.loads((await _cli(coordinator, "submit", "hello", "--thread", thread,
                                       "--turn-id", "c-1", "--json", "--jsonrpc"))[0])  # fmt: skip
        assert not again["created"] and again["task_id"] == made["task_id"]
        read = json.loads((await _cli(coordinator, "session", session, "--json"))[0])
        check_snapshot(read["snapshot"])
        shown, _ = await _cli(coordinator, "thread", thread)
        assert "c-1" in shown and "completed" in shown and '"answer": "hello"' in shown
        tasks = json.loads((await _cli(coordinator, "tasks", "--session", session, "--json"))[0])
        assert [t["turnId"] for t in tasks] == ["c-1"]
        task = json.loads((await _cli(coordinator, "task", made["task_id"]))[0])
        assert task["result"] == {"answer": "hello"}
        lines = (await _cli(coordinator, "events", session, "--after", "0"))[0].splitlines()
        first, *events = [json.loads(line) for line in lines]
        check_snapshot(first["snapshot"])
        for event in events:
            check_event(event)
        assert "turn.completed" in [e["type"] for e in events]
        channel = first["channel"]
        acked = json.loads((await _cli(
            coordinator, "ack", channel["channel_id"], str(events[-1]["sequence"]),
            "--token", channel["resume_token"],
        ))[0])  # fmt: skip
        assert acked["acknowledged_sequence"] == events[-1]["sequence"]
        await _interrupt(coordinator, answerer, thread)
        listed, _ = await _cli(coordinator, "commands", "--json")
        served = {c["command"]: c["served"] for c in json.loads(listed)}
        assert set(served) == set(CONTRACT_COMMANDS) and all(served.values())


async def _interrupt(coordinator: Coordinator, answerer: Answerer, thread: str) -> None:
    await _cli(coordinator, "submit", '{"mode": "hold"}', "--input-json", "--thread", thread,
               "--turn-id", "c-2")  # fmt: skip
    await answerer.running("c-2")
    out, _ = await _cli(coordinator, "interrupt", thread, "--reason", "stop")
    assert json.loads(out)["turnId"] == "c-2"
    answerer.release("c-2")  # the hold ends; the interrupt was asked for first


async def test_the_command_line_says_what_went_wrong(coordinator: Coordinator) -> None:
    _, err = await _cli(coordinator, "session", "nope", code=1)
    assert err.strip() == "apiary runtime session: NOT_FOUND: no session 'nope' (field session_id)"
    _, err = await _cli(coordinator, "submit", "x", code=1)
    assert "agent_id: is required to start a thread" in err
    _, err = await _cli(coordinator, "submit", "{", "--input-json", "--agent", "a", code=2)
    assert "TEXT is not JSON" in err
