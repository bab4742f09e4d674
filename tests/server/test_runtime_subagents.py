"""Subagents against a real coordinator (HTTP sockets, SDK agents over gRPC): a subagent is a
child thread bound to another agent with parent links; its input is a turn its agent runs;
wait_subagents returns once the children settled; close_subagent interrupts its work and
closes it to new turns; list_subagents is the graph. Every event and answer is validated
against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import (
    RuntimeHttp,
    running_answerer,
    session_events,
    types,
)

PARENT = "lead"
CHILD = "helper"


async def _register(coordinator: Coordinator, agent_id: str) -> None:
    await coordinator.registry.register(
        {"agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"]}
    )


async def test_a_subagent_runs_its_input_and_its_parent_sees_it_end(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, PARENT)  # offline: the parent's turn waits
    parent = await runtime.ok("submit_turn", agent_id=PARENT, turn_id="p-1", input="plan")
    async with running_answerer(coordinator, CHILD) as answerer:
        spawned = await runtime.ok(
            "spawn_subagent", thread_id=parent["threadId"], agent_id=CHILD, subagent_id="kid",
            turn_id="p-1", role="search", input={"value": 1}, idempotency_key="s-1",
        )  # fmt: skip
        assert spawned["created"] and spawned["parentThreadId"] == parent["threadId"]
        assert spawned["parentTurnId"] == "p-1" and spawned["input"]["created"]
        again = await runtime.ok(
            "spawn_subagent", thread_id=parent["threadId"], agent_id=CHILD, subagent_id="kid",
            turn_id="p-1", role="search", input={"value": 1}, idempotency_key="s-1",
        )  # fmt: skip
        assert again["replayed"] and again["subagentId"] == "kid"
        waited = await runtime.ok("wait_subagents", thread_id=parent["threadId"], timeout_s=20)
        assert waited["done"] and not waited["timedOut"]
        (child,) = waited["subagents"]
        assert child["status"] == "completed" and child["lastTurn"]["status"] == "completed"
        sent = await runtime.ok("send_subagent_input", subagent_id="kid", input={"mode": "fail"},
                                turn_id="k-2")  # fmt: skip
        assert sent["turnId"] == "k-2" and sent["created"]
        waited = await runtime.ok("wait_subagents", subagent_ids=["kid"], timeout_s=20)
        assert waited["subagents"][0]["status"] == "failed"
    assert len(answerer.seen) == 2
    events = await session_events(coordinator, parent["sessionId"])
    on_parent = [e for e in events if e.get("threadId") == parent["threadId"]]
    assert [t for t in types(on_parent) if t.startswith("subagent.")] == [
        "subagent.spawned", "subagent.input", "subagent.completed", "subagent.input",
        "subagent.failed",
    ]  # fmt: skip
    assert all(e["subagentId"] == "kid" for e in on_parent if e["type"].startswith("subagent."))
    listed = await runtime.ok("list_subagents", session_id=parent["sessionId"])
    assert listed["graph"] == [{"parentThreadId": parent["threadId"], "childThreadId": "kid"}]
    # A thread snapshot is still valid with children in the session.
    await runtime.ok("get_session", session_id=parent["sessionId"])


async def test_closing_a_subagent_interrupts_it_and_closes_it_to_new_turns(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, PARENT)
    await _register(coordinator, CHILD)  # offline: its turns wait
    parent = await runtime.ok("submit_turn", agent_id=PARENT, input="plan")
    await runtime.ok("spawn_subagent", thread_id=parent["threadId"], agent_id=CHILD,
                     subagent_id="kid", input="one")  # fmt: skip
    await runtime.ok("send_subagent_input", subagent_id="kid", input="two", turn_id="k-2")
    waited = await runtime.ok("wait_subagents", subagent_ids=["kid"], timeout_s=0)
    assert waited["timedOut"] and not waited["done"]
    closed = await runtime.ok("close_subagent", subagent_id="kid", reason="enough")
    assert closed["closed"] and "k-2" in closed["interruptedTurns"]
    assert len(closed["interruptedTurns"]) == 2
    refused = await runtime.error(409, "send_subagent_input", subagent_id="kid", input="three")
    assert refused["code"] == "already_completed" and refused["details"]["field"] == "subagent_id"
    refused = await runtime.error(409, "submit_turn", thread_id="kid", input="three")
    assert refused["details"]["field"] == "thread_id"
    again = await runtime.error(409, "close_subagent", subagent_id="kid")
    assert again["details"]["field"] == "subagent_id"
    listed = await runtime.ok("list_subagents", thread_id=parent["threadId"])
    assert listed["subagents"][0]["closed"] is True
    events = await session_events(coordinator, parent["sessionId"])
    closed_event = next(e for e in events if e["type"] == "subagent.closed")
    assert closed_event["payload"]["reason"] == "enough"


async def test_bad_subagent_parameters_name_their_field(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, PARENT)
    parent = await runtime.ok("submit_turn", agent_id=PARENT, input="plan")
    thread_id = parent["threadId"]
    cases = [
        (400, "spawn_subagent", {"thread_id": thread_id}, "agent_id"),
        (404, "spawn_subagent", {"thread_id": thread_id, "agent_id": "nobody"}, "agent_id"),
        (404, "spawn_subagent", {"thread_id": "nope", "agent_id": PARENT}, "thread_id"),
        (404, "spawn_subagent", {"thread_id": thread_id, "agent_id": PARENT, "turn_id": "x"},
         "turn_id"),
        (400, "send_subagent_input", {"subagent_id": "x"}, "input"),
        (404, "send_subagent_input", {"subagent_id": thread_id, "input": 1}, "subagent_id"),
        (400, "wait_subagents", {}, "subagent_ids"),
        (400, "wait_subagents", {"thread_id": thread_id, "mode": "some"}, "mode"),
        (404, "close_subagent", {"subagent_id": "nope"}, "subagent_id"),
        (400, "list_subagents", {}, "thread_id"),
    ]  # fmt: skip
    for status, command, params, field in cases:
        error = await runtime.error(status, command, **params)
        assert error["details"]["field"] == field, (command, params, error)
    await runtime.ok("spawn_subagent", thread_id=thread_id, agent_id=PARENT, subagent_id="k")
    taken = await runtime.error(409, "spawn_subagent", thread_id=thread_id, agent_id=PARENT,
                                subagent_id="k")  # fmt: skip
    assert taken["details"]["field"] == "subagent_id"


async def test_the_command_line_spawns_lists_and_closes_subagents(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, PARENT)
    parent = await runtime.ok("submit_turn", agent_id=PARENT, input="plan")

    async def cli(*args: str, code: int = 0) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "apiary.cli.main", "runtime", *args,
            "--http", str(coordinator.http_address),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == code, (out.decode(), err.decode())
        return out.decode()

    spawned = json.loads(await cli("spawn", parent["threadId"], PARENT, "--id", "kid",
                                   "--input", '"go"'))  # fmt: skip
    assert spawned["subagentId"] == "kid" and spawned["input"]["created"]
    listed = json.loads(await cli("subagents", "--thread", parent["threadId"]))
    assert [s["subagentId"] for s in listed["subagents"]] == ["kid"]
    waited = json.loads(await cli("wait-subagents", "kid", "--timeout", "0", code=1))
    assert waited["timedOut"]
    closed = json.loads(await cli("close-subagent", "kid", "--reason", "done"))
    assert closed["closed"]
