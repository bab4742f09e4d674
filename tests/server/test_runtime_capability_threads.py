"""Threads bound to a capability queue, against a real coordinator (HTTP sockets, SDK agents
over gRPC): a thread started with `capability` instead of `agent_id` sends each turn's task
to that shared queue, any capable idle agent runs it, the thread shows which agent ran each
turn, and the thread still runs one turn at a time. Every event and answer is validated
against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.errors import NotFoundError
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import (
    Answerer,
    RuntimeHttp,
    running_answerer,
    session_events,
)

REVIEW = ("review",)
HOLD = {"mode": "hold"}


def _turns(read: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["turnId"]: t for t in read["threads"][0]["turns"]}


def _holder(turn_id: str, *answerers: tuple[str, Answerer]) -> str:
    (found,) = [name for name, a in answerers if turn_id in a.seen]
    return found


async def _taken(turn_id: str, *answerers: tuple[str, Answerer]) -> str:
    """The agent whose handler took the turn (bounded wait)."""

    waits = [asyncio.ensure_future(a.running(turn_id)) for _, a in answerers]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for job in pending:
        job.cancel()
    for job in done:
        job.result()  # a timeout is the test's failure
    return _holder(turn_id, *answerers)


async def test_a_capability_threads_turns_run_on_any_capable_agent_one_at_a_time(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with (
        running_answerer(coordinator, "r-1", REVIEW) as one,
        running_answerer(coordinator, "r-2", REVIEW) as two,
    ):
        agents = (("r-1", one), ("r-2", two))
        first = await runtime.ok("submit_turn", capability="review", turn_id="a-1", input=HOLD)
        thread_id = first["threadId"]
        first_agent = await _taken("a-1", *agents)
        # The thread is busy: its next turn waits although an agent of the queue is idle.
        queued = await runtime.ok("submit_turn", thread_id=thread_id, turn_id="a-2",
                                  input={"value": 2})  # fmt: skip
        assert queued["status"] == "queued"
        # Another thread of the same queue runs on the idle agent meanwhile.
        other = await runtime.ok("submit_turn", capability="review", turn_id="b-1",
                                 session_id=first["sessionId"], input=HOLD)  # fmt: skip
        idle = two if first_agent == "r-1" else one
        await idle.running("b-1")
        read = await runtime.ok("get_thread_read", thread_id=thread_id)
        assert read["threads"][0]["capability"] == "review"
        assert _turns(read)["a-2"]["status"] == "queued"
        assert "a-2" not in one.seen + two.seen
        one.release("a-1")
        two.release("a-1")
        await runtime.thread_status(thread_id, "completed")
        one.release("b-1")
        two.release("b-1")
        await runtime.thread_status(other["threadId"], "completed")
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    turns = _turns(read)
    assert turns["a-1"]["agentId"] == first_agent
    assert turns["a-2"]["agentId"] == _holder("a-2", *agents)
    assert read["threads"][0]["lastOutcome"]["result"] == {"answer": 2}
    events = await session_events(coordinator, first["sessionId"])
    started = {e["turnId"]: e for e in events if e["type"] == "turn.started"}
    assert started["a-1"]["payload"]["agentId"] == first_agent
    assert started["b-1"]["payload"]["agentId"] != first_agent
    thread_started = next(e for e in events if e["type"] == "thread.started")
    assert thread_started["payload"]["capability"] == "review"
    ends = [e["turnId"] for e in events if e["type"] == "turn.completed"]
    assert ends.index("a-1") < ends.index("a-2")  # one turn at a time, in order
    case = (await runtime.ok("export_replay", session_id=first["sessionId"],
                             thread_id=thread_id))["replay"]  # fmt: skip
    assert case["threads"][0]["capability"] == "review"  # what a replay submits to again


async def test_a_capability_subagent_and_an_agent_task_of_a_capability_thread(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with running_answerer(coordinator, "r-1", REVIEW):
        parent = await runtime.ok("submit_turn", capability="review", input={"value": 1})
        spawned = await runtime.ok("spawn_subagent", thread_id=parent["threadId"],
                                   capability="review", subagent_id="kid",
                                   input={"value": 3})  # fmt: skip
        assert spawned["capability"] == "review" and "agentId" not in spawned
        waited = await runtime.ok("wait_subagents", subagent_ids=["kid"], timeout_s=20)
        assert waited["subagents"][0]["status"] == "completed"
        task = await runtime.ok("create_task", thread_id=parent["threadId"], input={"value": 4},
                                start=True)  # fmt: skip
        assert task["task"]["status"] in ("queued", "running", "completed")
        done = await runtime.until(
            "get_task", lambda d: d["task"]["status"] == "completed", task_id=task["taskId"]
        )
    assert done["task"]["result"] == {"answer": 4}
    await session_events(coordinator, parent["sessionId"])


async def test_bad_bindings_name_their_field(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await coordinator.registry.register(
        {"agent_id": "r-1", "name": "r-1", "capabilities": ["review"],
         "reasoning_connectors": ["builtin://rules"]}
    )  # fmt: skip
    cases = [
        (400, {"agent_id": "r-1", "capability": "review"}, "capability"),
        (400, {}, "agent_id"),
        (404, {"capability": "juggling"}, "capability"),
        (400, {"capability": "two words"}, "capability"),
    ]
    for status, params, field in cases:
        error = await runtime.error(status, "submit_turn", input=1, **params)
        assert error["details"]["field"] == field, (params, error)
    thread = await runtime.ok("submit_turn", capability="review", input=1)
    for params, field in (({"agent_id": "r-1"}, "agent_id"), ({"capability": "x"}, "capability")):
        error = await runtime.error(400, "submit_turn", thread_id=thread["threadId"], input=2,
                                    **params)  # fmt: skip
        assert error["details"]["field"] == field
    error = await runtime.error(404, "spawn_subagent", thread_id=thread["threadId"],
                                capability="juggling")  # fmt: skip
    assert error["details"]["field"] == "capability"
    error = await runtime.error(400, "get_execution_environment", thread_id=thread["threadId"])
    assert error["details"]["field"] == "thread_id"
    # Authorization as submit_turn: another principal's capability thread is not there.
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    mallory = Principal(PrincipalKind.AGENT, "mallory")
    with pytest.raises(NotFoundError):
        await COMMANDS["submit_turn"](control, mallory, {"thread_id": thread["threadId"],
                                                         "input": 3})  # fmt: skip


async def test_interrupting_a_capability_threads_turn_stops_it_on_the_agent_holding_it(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with running_answerer(coordinator, "r-1", REVIEW) as one:
        turn = await runtime.ok("submit_turn", capability="review", turn_id="l-1",
                                input={"mode": "loop"})  # fmt: skip
        await one.running("l-1")
        answer = await runtime.ok("interrupt_turn", turn_id="l-1", reason="enough")
        assert answer["interrupt"] == "requested"
        read = await runtime.thread_status(turn["threadId"], "cancelled")
    assert _turns(read)["l-1"]["agentId"] == "r-1"


async def test_the_command_line_submits_to_a_capability_queue(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with running_answerer(coordinator, "r-1", REVIEW):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "apiary.cli.main", "runtime", "submit", '{"value": 9}',
            "--input-json", "--capability", "review", "--wait", "--timeout", "30", "--json",
            "--http", str(coordinator.http_address),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out.decode(), err.decode())
    shown = json.loads(out)
    read = await runtime.ok("get_thread_read", thread_id=shown["thread_id"])
    assert read["threads"][0]["capability"] == "review"
    assert read["threads"][0]["lastOutcome"]["result"] == {"answer": 9}
