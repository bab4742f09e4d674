"""promote_queued_turn and resume_thread against a real coordinator (HTTP sockets, an SDK
agent over gRPC, the SQLite store across a restart): a promoted turn runs ahead of the turns
it passed, only queued turns move; resume follows work the runtime can prove active, runs a
turn whose task was lost again as a new turn (once, never on its own), and starts what
waits. Every event and snapshot is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.sdk.runtime import RuntimeClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.server.runtime_harness import (
    RuntimeHttp,
    running_answerer,
    runtime_http,
    session_events,
    types,
)

AGENT = "later"


async def _register_offline(coordinator: Coordinator) -> None:
    """The agent is registered but has no stream: its tasks wait QUEUED."""
    await coordinator.registry.register(
        {"agent_id": AGENT, "name": AGENT, "reasoning_connectors": ["builtin://rules"]}
    )


async def _queue(runtime: RuntimeHttp, count: int) -> tuple[str, str]:
    """Turn q-1 holds the thread (its task waits for the agent), q-2.. are queued."""
    made = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="q-1", input={"value": 1})
    for n in range(2, count + 1):
        await runtime.ok(
            "submit_turn", thread_id=made["threadId"], turn_id=f"q-{n}", input={"value": n}
        )
    return made["sessionId"], made["threadId"]


def _queued(read: dict[str, Any]) -> list[str]:
    return [q["turnId"] for q in read["threads"][0]["queuedTurns"]]


async def test_a_promoted_turn_runs_ahead_of_the_turns_it_passed(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    session_id, thread_id = await _queue(runtime, 4)
    moved = await runtime.ok("promote_queued_turn", turn_id="q-4")
    assert moved["moved"] and moved["position"] == 1
    assert moved["queuedTurns"] == ["q-4", "q-2", "q-3"]
    moved = await runtime.ok("promote_queued_turn", turn_id="q-3", before_turn_id="q-2")
    assert moved["queuedTurns"] == ["q-4", "q-3", "q-2"] and moved["position"] == 2
    # Ahead of a turn it is ahead of already: it stays, nothing is written.
    stays = await runtime.ok("promote_queued_turn", turn_id="q-4", before_turn_id="q-2")
    assert not stays["moved"] and stays["queuedTurns"] == ["q-4", "q-3", "q-2"]
    await runtime.ok("submit_turn", thread_id=thread_id, turn_id="q-5", input={"value": 5})
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert _queued(read) == ["q-4", "q-3", "q-2", "q-5"]
    assert [q["position"] for q in read["threads"][0]["queuedTurns"]] == [1, 2, 3, 4]
    events = await session_events(coordinator, session_id)
    changes = [e for e in events if e["type"] == "queue.changed" and "promoted" in e["payload"]]
    assert [(e["payload"]["promoted"], e["payload"]["queuedTurns"]) for e in changes] == [
        ("q-4", ["q-4", "q-2", "q-3"]), ("q-3", ["q-4", "q-3", "q-2"]),
    ]  # fmt: skip
    assert all(e["queueId"] == f"thread:{thread_id}" for e in changes)
    async with running_answerer(coordinator, AGENT) as answerer:
        await runtime.thread_status(thread_id, "completed")
    assert answerer.seen == ["q-1", "q-4", "q-3", "q-2", "q-5"]


async def test_only_queued_turns_move_and_bad_parameters_name_their_field(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    _, thread_id = await _queue(runtime, 3)
    error = await runtime.error(409, "promote_queued_turn", turn_id="q-1")
    assert error["code"] == "already_in_progress" and error["details"]["field"] == "turn_id"
    await runtime.ok("remove_queued_turn", turn_id="q-3")
    error = await runtime.error(409, "promote_queued_turn", turn_id="q-3")
    assert error["code"] == "already_completed" and error["details"]["field"] == "turn_id"
    error = await runtime.error(400, "promote_queued_turn", turn_id="q-2", before_turn_id="q-1")
    assert error["details"]["field"] == "before_turn_id"
    error = await runtime.error(400, "promote_queued_turn", turn_id="q-2", before_turn_id="q-2")
    assert error["details"]["field"] == "before_turn_id"
    error = await runtime.error(400, "promote_queued_turn")
    assert error["details"]["field"] == "turn_id"
    error = await runtime.error(400, "promote_queued_turn", turn_id="q-2", ahead=True)
    assert error["details"]["field"] == "ahead"
    error = await runtime.error(404, "promote_queued_turn", turn_id="nope")
    assert error["code"] == "not_found" and error["details"]["field"] == "turn_id"
    error = await runtime.error(404, "promote_queued_turn", turn_id="q-2", thread_id="other")
    assert error["code"] == "not_found"
    error = await runtime.error(400, "resume_thread")
    assert error["details"]["field"] == "thread_id"
    error = await runtime.error(404, "resume_thread", thread_id="nope")
    assert error["details"]["field"] == "thread_id"
    error = await runtime.error(409, "resume_thread", thread_id=thread_id, turn_id="q-2")
    assert error["code"] == "already_in_progress" and error["details"]["field"] == "turn_id"
    error = await runtime.error(409, "resume_thread", thread_id=thread_id, turn_id="q-3")
    assert error["code"] == "already_completed" and error["details"]["field"] == "turn_id"
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert _queued(read) == ["q-2"]


@pytest.mark.conformance("runtime.idempotency.mutating-keys")
async def test_promote_and_resume_take_idempotency_keys(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    session_id, thread_id = await _queue(runtime, 3)
    first = await runtime.ok("promote_queued_turn", turn_id="q-3", idempotency_key="p-1")
    assert first["queuedTurns"] == ["q-3", "q-2"] and "replayed" not in first
    await runtime.ok("promote_queued_turn", turn_id="q-2")
    again = await runtime.ok("promote_queued_turn", turn_id="q-3", idempotency_key="p-1")
    assert again["replayed"] and again["queuedTurns"] == ["q-2", "q-3"]  # as things stand
    error = await runtime.error(409, "promote_queued_turn", turn_id="q-2", idempotency_key="p-1")
    assert error["code"] == "already_exists" and error["details"]["field"] == "idempotency_key"
    resumed = await runtime.ok("resume_thread", thread_id=thread_id, idempotency_key="r-1")
    assert resumed["mode"] == "following" and resumed["turnId"] == "q-1"
    again = await runtime.ok("resume_thread", thread_id=thread_id, idempotency_key="r-1")
    assert again["replayed"] and again["mode"] == "following"
    error = await runtime.error(409, "resume_thread", thread_id=thread_id,
                                idempotency_key="p-1")  # fmt: skip
    assert error["details"]["field"] == "idempotency_key"
    events = await session_events(coordinator, session_id)
    resumes = [e for e in events if e["type"] == "thread.updated" and "resume" in e["payload"]]
    assert len(resumes) == 1  # the replay wrote nothing
    promoted = [e for e in events if e["type"] == "queue.changed" and "promoted" in e["payload"]]
    assert len(promoted) == 2


@pytest.mark.conformance("runtime.idempotency.mutating-keys")
async def test_interrupt_and_remove_replay_their_first_answer_under_a_key(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    session_id, thread_id = await _queue(runtime, 4)
    removed = await runtime.ok("remove_queued_turn", turn_id="q-3", idempotency_key="rm-1")
    assert removed["removed"] and removed["status"] == "cancelled" and "replayed" not in removed
    # The retry answers the first answer, not already_completed for the removed turn.
    address = str(coordinator.http_address)
    async with RuntimeClient(address, transport="jsonrpc") as client:
        again = await client.remove_queued_turn("q-3", idempotency_key="rm-1")
    assert again == {**removed, "replayed": True}
    error = await runtime.error(409, "remove_queued_turn", turn_id="q-4", idempotency_key="rm-1")
    assert error["code"] == "already_exists" and error["details"]["field"] == "idempotency_key"
    # The thread's running turn is interrupted; a retry after the next turn started
    # answers the first interrupt's answer and interrupts nothing else.
    stopped = await runtime.ok("interrupt_turn", thread_id=thread_id, idempotency_key="i-1")
    assert stopped["turnId"] == "q-1" and "replayed" not in stopped
    read = await runtime.until(
        "get_thread_read", lambda d: d["threads"][0]["activeTurnId"] == "q-2",
        thread_id=thread_id,
    )  # fmt: skip
    again = await runtime.ok("interrupt_turn", thread_id=thread_id, idempotency_key="i-1")
    assert again == {**stopped, "replayed": True}
    out = await _cli(address, "interrupt", thread_id, "--idempotency-key", "i-1")
    assert json.loads(out) == again
    error = await runtime.error(409, "interrupt_turn", thread_id=thread_id, reason="other",
                                idempotency_key="i-1")  # fmt: skip
    assert error["code"] == "already_exists" and error["details"]["field"] == "idempotency_key"
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert read["threads"][0]["activeTurnId"] == "q-2" and _queued(read) == ["q-4"]
    events = await session_events(coordinator, session_id)
    assert types(events).count("task.cancel_requested") == 1  # the interrupt, once
    ended = [(e["turnId"], e["status"]) for e in events if e["type"] == "turn.failed"]
    assert ended == [("q-3", "cancelled"), ("q-1", "cancelled")]
    # Keys are per principal: the same key is an operator's own, a new request.
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    operator = Principal(PrincipalKind.OPERATOR, "ops", roles=frozenset({Role.TASKS}))
    params = {"turn_id": "q-4", "idempotency_key": "rm-1"}
    by_operator = await COMMANDS["remove_queued_turn"](control, operator, params)
    assert by_operator["turnId"] == "q-4" and "replayed" not in by_operator
    params = {"thread_id": thread_id, "idempotency_key": "i-1"}
    by_operator = await COMMANDS["interrupt_turn"](control, operator, params)
    assert by_operator["turnId"] == "q-2" and "replayed" not in by_operator


async def test_resume_follows_work_it_can_prove_active_and_is_idle_with_none(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    session_id, thread_id = await _queue(runtime, 2)
    resumed = await runtime.ok("resume_thread", thread_id=thread_id)
    assert resumed["mode"] == "following" and resumed["resumed"]
    assert resumed["turnId"] == "q-1" and resumed["status"] == "preparing"
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert {t["turnId"] for t in read["threads"][0]["turns"]} == {"q-1", "q-2"}  # no new turn
    events = await session_events(coordinator, session_id)
    (update,) = [e for e in events if e["type"] == "thread.updated" and "resume" in e["payload"]]
    assert update["payload"] == {"resume": "following", "turnId": "q-1", "taskState": "QUEUED"}
    async with running_answerer(coordinator, AGENT):
        await runtime.thread_status(thread_id, "completed")
    idle = await runtime.ok("resume_thread", thread_id=thread_id)
    assert idle["mode"] == "idle" and not idle["resumed"] and "turnId" not in idle


async def test_after_a_restart_resume_follows_the_task_the_store_holds(tmp_path: Path) -> None:
    """The active turn's task, read back from the store after a restart, is followed again
    (its stored state proves it waits), not an internal error."""
    data = tmp_path / "state"
    async with open_test_coordinator(data, store="") as first, runtime_http(first) as runtime:
        await _register_offline(first)
        _, thread_id = await _queue(runtime, 1)
    async with open_test_coordinator(data, store="") as second, runtime_http(second) as runtime:
        resumed = await runtime.ok("resume_thread", thread_id=thread_id)
        assert (resumed["mode"], resumed["turnId"]) == ("following", "q-1")
        async with running_answerer(second, AGENT):
            read = await runtime.thread_status(thread_id, "completed")
        assert read["threads"][0]["lastOutcome"]["result"] == {"answer": 1}


@pytest.mark.conformance("runtime.queue.explicit-resume")
async def test_a_turn_whose_task_was_lost_runs_again_only_on_an_explicit_resume(
    tmp_path: Path,
) -> None:
    data = tmp_path / "state"
    async with open_test_coordinator(data, store="") as first, runtime_http(first) as runtime:
        await _register_offline(first)
        session_id, thread_id = await _queue(runtime, 2)
        task_id = (await runtime.ok("get_thread_read", thread_id=thread_id))["tasks"][0]["taskId"]
    with sqlite3.connect(data / "apiary.db") as db:  # a store that lost the task
        assert db.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,)).rowcount == 1
    async with open_test_coordinator(data, store="") as second, runtime_http(second) as runtime:
        read = await runtime.until(
            "get_thread_read", lambda d: d["threads"][0]["turns"][0]["status"] == "failed",
            thread_id=thread_id,
        )  # fmt: skip
        lost = read["threads"][0]["turns"][0]
        assert lost["turnId"] == "q-1" and lost["error"]["code"] == "task_lost"
        # Not run again on its own: the next turn went ahead.
        assert read["threads"][0]["activeTurnId"] == "q-2"
        resumed = await runtime.ok("resume_thread", thread_id=thread_id, reason="store restored")
        assert resumed["mode"] == "resubmitted" and resumed["status"] == "queued"
        again_id = resumed["turnId"]
        assert again_id != "q-1" and resumed["turn"]["resumedFrom"] == "q-1"
        read = await runtime.ok("get_thread_read", thread_id=thread_id)
        assert _queued(read) == [again_id]
        # Resumed once: naming it again answers the same turn.
        twice = await runtime.ok("resume_thread", thread_id=thread_id, turn_id="q-1")
        assert twice["mode"] == "resubmitted" and twice["turnId"] == again_id
        async with running_answerer(second, AGENT) as answerer:
            read = await runtime.thread_status(thread_id, "completed")
        assert answerer.seen == ["q-2", again_id]
        assert read["threads"][0]["lastOutcome"]["result"] == {"answer": 1}  # q-1's input
        events = await session_events(second, session_id)
        assert types(events, "q-1")[-2:] == ["task.lost", "turn.failed"]
        assert types(events, again_id) == [
            "turn.submitted", "task.resumed", "task.created", "task.started", "turn.started",
            "task.completed", "turn.completed",
        ]  # fmt: skip
        (resumed_event,) = [e for e in events if e["type"] == "task.resumed"]
        assert resumed_event["payload"] == {
            "resumedFrom": "q-1", "lostTaskId": task_id, "reason": "store restored",
        }  # fmt: skip
        assert (await runtime.ok("resume_thread", thread_id=thread_id))["mode"] == "idle"


async def test_the_sdk_and_the_command_line_promote_and_resume(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register_offline(coordinator)
    _, thread_id = await _queue(runtime, 3)
    address = str(coordinator.http_address)
    async with RuntimeClient(address, transport="jsonrpc") as client:
        moved = await client.promote_queued_turn("q-3", idempotency_key="sdk-1")
        assert moved["queuedTurns"] == ["q-3", "q-2"]
        resumed = await client.resume_thread(thread_id)
        assert resumed["mode"] == "following" and resumed["turnId"] == "q-1"
    out = await _cli(address, "promote", "q-2", "--before", "q-3", "--idempotency-key", "c-1")
    assert json.loads(out)["queuedTurns"] == ["q-2", "q-3"]
    out = await _cli(address, "resume", thread_id, "--reason", "checking", "--jsonrpc")
    assert json.loads(out)["mode"] == "following"
    out = await _cli(address, "promote", "q-1", code=1)
    assert "already_in_progress" in out or "q-1" in out


async def _cli(address: str, *args: str, code: int = 0) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", *args, "--http", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, out.decode(), err.decode())
    return out.decode() if code == 0 else err.decode()
