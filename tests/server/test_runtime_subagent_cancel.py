"""Cancellation propagates to subagents, against a real coordinator (HTTP sockets, SDK agents
over gRPC): interrupting a turn closes the subagents spawned with it, cancelling an agent task
closes the subagents its `subagent` edges name; each records its own intent (its turn's
task.cancel_requested) after its parent's, then `subagent.closed`; `propagate: false` keeps
them. Every event is validated against the contract's schema."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import RuntimeHttp, running_answerer, session_events

LOOP = {"mode": "loop"}


async def _register(coordinator: Coordinator, agent_id: str) -> None:
    await coordinator.registry.register(
        {"agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"]}
    )


async def _subagents(runtime: RuntimeHttp, thread_id: str) -> dict[str, dict[str, Any]]:
    listed = await runtime.ok("list_subagents", thread_id=thread_id)
    return {s["subagentId"]: s for s in listed["subagents"]}


def _position(events: list[dict[str, Any]], kind: str, **where: str) -> int:
    return next(
        i for i, e in enumerate(events)
        if e["type"] == kind and all(e.get(k) == v for k, v in where.items())
    )  # fmt: skip


async def test_interrupting_a_turn_closes_the_subagents_spawned_with_it(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with (
        running_answerer(coordinator, "lead") as lead,
        running_answerer(coordinator, "helper") as helper,
    ):
        parent = await runtime.ok("submit_turn", agent_id="lead", turn_id="p-1", input=LOOP)
        thread_id = parent["threadId"]
        await lead.running("p-1")
        await runtime.ok("spawn_subagent", thread_id=thread_id, agent_id="helper",
                         subagent_id="kid", turn_id="p-1", input=LOOP)  # fmt: skip
        await runtime.ok("spawn_subagent", thread_id=thread_id, agent_id="helper",
                         subagent_id="loose")  # fmt: skip
        kid_turn = (await runtime.ok("list_subagents", thread_id=thread_id))["subagents"][0]
        await helper.running(kid_turn["lastTurn"]["turnId"])
        answer = await runtime.ok("interrupt_turn", turn_id="p-1", reason="stop all")
        assert answer["closedSubagents"] == ["kid"]
        await runtime.thread_status(thread_id, "cancelled")
        await runtime.thread_status("kid", "cancelled")
    listed = await _subagents(runtime, thread_id)
    assert listed["kid"]["closed"] and listed["kid"]["lastTurn"]["status"] == "cancelled"
    assert not listed["loose"]["closed"]  # spawned with no turn: it goes on
    refused = await runtime.error(409, "send_subagent_input", subagent_id="kid", input=1)
    assert refused["details"]["field"] == "subagent_id"
    events = await session_events(coordinator, parent["sessionId"])
    parent_intent = _position(events, "task.cancel_requested", turnId="p-1")
    kid_intent = _position(events, "task.cancel_requested", threadId="kid")
    closed = _position(events, "subagent.closed", subagentId="kid")
    assert parent_intent < kid_intent < closed
    assert "stop all" in events[closed]["payload"]["reason"]
    assert events[closed]["turnId"] == "p-1" and events[closed]["threadId"] == thread_id
    assert not [e for e in events if e["type"] == "subagent.closed" and e["subagentId"] == "loose"]


async def test_an_interrupt_with_propagate_false_keeps_the_subagents(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, "lead")  # offline: its turn waits in its queue
    await _register(coordinator, "helper")
    parent = await runtime.ok("submit_turn", agent_id="lead", turn_id="p-1", input="plan")
    await runtime.ok("spawn_subagent", thread_id=parent["threadId"], agent_id="helper",
                     subagent_id="kid", turn_id="p-1", input="go")  # fmt: skip
    refused = await runtime.error(400, "interrupt_turn", turn_id="p-1", propagate="no")
    assert refused["details"]["field"] == "propagate"
    answer = await runtime.ok("interrupt_turn", turn_id="p-1", propagate=False)
    assert answer["closedSubagents"] == [] and answer["interrupt"] == "cancelled"
    (kid,) = (await runtime.ok("list_subagents", thread_id=parent["threadId"]))["subagents"]
    assert not kid["closed"] and kid["status"] == "queued"
    # The command line's --keep-subagents is the same policy.
    await runtime.ok("submit_turn", thread_id=parent["threadId"], turn_id="p-2", input="more")
    await runtime.ok("spawn_subagent", thread_id=parent["threadId"], agent_id="helper",
                     subagent_id="kid-2", turn_id="p-2")  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "runtime", "interrupt", parent["threadId"],
        "--turn", "p-2", "--keep-subagents", "--http", str(coordinator.http_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out.decode(), err.decode())
    assert json.loads(out)["closedSubagents"] == []
    listed = await _subagents(runtime, parent["threadId"])
    assert not listed["kid"]["closed"] and not listed["kid-2"]["closed"]
    events = await session_events(coordinator, parent["sessionId"])
    assert not [e for e in events if e["type"] == "subagent.closed"]


async def test_cancelling_a_task_closes_the_subagents_it_links(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, "lead")
    async with (
        running_answerer(coordinator, "helper") as helper,
        running_answerer(coordinator, "other") as other,
    ):
        parent = await runtime.ok("submit_turn", agent_id="lead", input="plan")
        thread_id, session_id = parent["threadId"], parent["sessionId"]
        for kid, agent in (("kid", helper), ("kept", other)):
            spawned = await runtime.ok("spawn_subagent", thread_id=thread_id,
                                       agent_id="helper" if agent is helper else "other",
                                       subagent_id=kid, input=LOOP)  # fmt: skip
            await agent.running(spawned["input"]["turnId"])
        for task_id, kid in (("fix", "kid"), ("keep", "kept")):
            await runtime.ok("create_task", task_id=task_id, session_id=session_id)
            await runtime.ok("link_tasks", task_id=task_id, target_id=kid, kind="subagent")
        answer = await runtime.ok("cancel_task", task_id="fix", reason="superseded")
        assert answer["status"] == "cancelled"
        await runtime.thread_status("kid", "cancelled")
        await runtime.ok("cancel_task", task_id="keep", propagate=False)
        listed = await _subagents(runtime, thread_id)
        assert listed["kid"]["closed"] and not listed["kept"]["closed"]
        assert listed["kept"]["status"] == "running"
        await runtime.ok("close_subagent", subagent_id="kept")
    events = await session_events(coordinator, session_id)
    task_intent = _position(events, "task.cancel_requested", taskId="fix")
    kid_intent = _position(events, "task.cancel_requested", threadId="kid")
    closed = _position(events, "subagent.closed", subagentId="kid")
    assert task_intent < kid_intent < closed
    assert events[closed]["payload"]["reason"] == "its task fix was cancelled"


async def test_a_task_edge_to_another_principals_subagent_does_not_close_it(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    await _register(coordinator, "lead")
    await _register(coordinator, "helper")
    parent = await runtime.ok("submit_turn", agent_id="lead", input="plan")
    await runtime.ok("spawn_subagent", thread_id=parent["threadId"], agent_id="helper",
                     subagent_id="kid", input="go")  # fmt: skip
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    mallory = Principal(PrincipalKind.AGENT, "mallory")  # not the session's owner
    await COMMANDS["create_task"](control, mallory, {"task_id": "m-1"})
    edge = {"task_id": "m-1", "target_id": "kid", "kind": "subagent"}
    await COMMANDS["link_tasks"](control, mallory, edge)
    cancelled = await COMMANDS["cancel_task"](control, mallory, {"task_id": "m-1"})
    assert cancelled["status"] == "cancelled"
    (kid,) = (await runtime.ok("list_subagents", thread_id=parent["threadId"]))["subagents"]
    assert not kid["closed"] and kid["status"] == "queued"
