"""Actions against a real coordinator with a HITL component (operators configured): an SDK
agent that asks for a decision inside a turn (sw4rm.hitl.HitlService.Decide) makes its
thread show an `action.required` with every field the contract lists; `respond_action`
decides it through the HITL engine and the agent goes on with the decision; an action left
alone is never approved: at its deadline the HITL fallback denies it. Every event and
answer the tests see is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import AlreadyCompletedError
from apiary.sdk.agent import Agent
from apiary.sdk.runtime import RuntimeClient
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.wire import pb
from tests.server.runtime_harness import WAIT_S, RuntimeHttp, runtime_http, session_events

HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest("t0ken"), ("admin",)),))
AGENT = "asker"


async def _event(
    coordinator: Coordinator, session_id: str, kind: str, **where: Any
) -> dict[str, Any]:
    """The session's first event of type `kind` (matching `where`), once it is logged."""

    async def poll() -> dict[str, Any]:
        while True:
            for event in await session_events(coordinator, session_id):
                if event["type"] == kind and all(event.get(k) == v for k, v in where.items()):
                    return event
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(poll(), WAIT_S)


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        yield running


@pytest.fixture
async def asker(coordinator: Coordinator) -> AsyncIterator[None]:
    """An agent whose turns ask for a decision and answer with it."""
    async with Agent(AGENT, coordinator=str(coordinator.grpc_address)) as agent:

        async def handle(task: TaskContext) -> object:
            body = task.json()
            context = {"prompt": f"May I push {body['input']}?", "task_id": task.task_id}
            decision = await agent.client.hitl.Decide(
                pb.hitl_pb2.HitlInvocation(
                    reason_type=pb.common_pb2.SECURITY_APPROVAL,
                    context=json.dumps(context).encode(),
                    proposed_actions=["approve", "deny"],
                )
            )
            return {"decision": decision.action}

        job = asyncio.create_task(TaskRunner(agent, handle).run())
        try:
            yield None
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


@pytest.mark.conformance("runtime.action.required-fields")
async def test_an_agents_question_is_an_action_that_respond_action_decides(
    coordinator: Coordinator, runtime: RuntimeHttp, asker: None
) -> None:
    turn = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="push", input="main")
    session_id, thread_id = turn["sessionId"], turn["threadId"]
    required = await _event(coordinator, session_id, "action.required", turnId="push")
    action_id = required["actionId"]
    payload = required["payload"]
    assert (required["threadId"], required["taskId"]) == (thread_id, turn["taskId"])
    assert payload["actionType"] == "security_approval"
    assert payload["prompt"] == "May I push main?"
    assert payload["decisions"] == ["approve", "deny"]
    assert payload["scope"] == {"sessionId": session_id, "threadId": thread_id,
                                "turnId": "push", "taskId": turn["taskId"]}  # fmt: skip
    assert payload["policy"]["timeoutAction"] == "DENY" and "deadline" in payload["timeout"]
    # The thread waits on it: its read shows the pending request.
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    (pending,) = read["threads"][0]["pendingRequests"]
    assert pending["actionId"] == action_id and pending["decisions"] == ["approve", "deny"]
    refused = await runtime.error(400, "respond_action", action_id=action_id, decision="maybe")
    assert refused["details"]["field"] == "decision"
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        answer = await client.respond_action(action_id, "approve", rationale="looks fine")
    assert answer["status"] == "resolved" and answer["decision"]["approved"] is True
    done = await runtime.thread_status(thread_id, "completed")
    assert done["threads"][0]["lastOutcome"]["result"] == {"decision": "approve"}
    assert done["threads"][0]["pendingRequests"] == []
    resolved = await _event(coordinator, session_id, "action.resolved", actionId=action_id)
    assert resolved["payload"]["decision"] == "approve" and resolved["payload"]["via"] == "operator"
    again = await runtime.error(409, "respond_action", action_id=action_id, decision="deny")
    assert again["code"] == "already_completed" and again["details"]["field"] == "action_id"
    missing = await runtime.error(404, "respond_action", action_id="nope", decision="approve")
    assert missing["details"]["field"] == "action_id"


@pytest.mark.conformance("runtime.action.unresolved-not-approved")
async def test_an_action_left_alone_is_never_approved_its_deadline_denies_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with (
        open_test_coordinator(tmp_path, runtime=Runtime(clock=clock, hitl=HITL)) as coordinator,
        runtime_http(coordinator) as runtime,
    ):
        await coordinator.registry.register(
            {"agent_id": "away", "name": "away", "reasoning_connectors": ["builtin://rules"]}
        )
        made = await runtime.ok("create_task", task_id="deploy", agent_id="away", start=True)
        run_id = made["task"]["currentRunId"]
        await coordinator.hitl.open(
            "SECURITY_APPROVAL", {"prompt": "Deploy to production?"}, requested_by="away",
            subject={"task_id": run_id}, proposed_actions=["approve", "deny"], timeout_s=60,
            suggested_action="approve",
        )  # fmt: skip
        session_id = made["sessionId"]
        required = await _event(coordinator, session_id, "action.required", taskId="deploy")
        assert required["runId"] == run_id and required["payload"]["suggestedDecision"] == "approve"
        # Nobody decides: time passes, nothing approves it until its deadline...
        clock.advance(59)
        await coordinator.hitl.tick()
        events = await session_events(coordinator, session_id)
        assert "action.resolved" not in [e["type"] for e in events]
        # ... where the HITL fallback denies it.
        clock.advance(2)
        await coordinator.hitl.tick()
        resolved = await _event(coordinator, session_id, "action.resolved", taskId="deploy")
        assert resolved["payload"]["approved"] is False
        assert (resolved["payload"]["decision"], resolved["payload"]["via"]) == ("deny", "deadline")
        late = await runtime.error(
            409, "respond_action", action_id=required["actionId"], decision="approve"
        )
        assert late["code"] == "already_completed"


@pytest.mark.conformance("runtime.idempotency.mutating-keys")
async def test_a_retried_respond_action_answers_the_first_decision(
    coordinator: Coordinator, runtime: RuntimeHttp, asker: None
) -> None:
    turn = await runtime.ok("submit_turn", agent_id=AGENT, turn_id="ship", input="v2")
    required = await _event(coordinator, turn["sessionId"], "action.required", turnId="ship")
    action_id = required["actionId"]
    async with RuntimeClient(f"http://{coordinator.http_address}") as client:
        first = await client.respond_action(action_id, "approve", idempotency_key="d-1")
    assert first["status"] == "resolved" and first["decision"]["approved"] is True
    assert "replayed" not in first
    # The answer was lost: the retry answers the first decision, not already_completed.
    again = await runtime.ok("respond_action", action_id=action_id, decision="approve",
                             idempotency_key="d-1")  # fmt: skip
    assert again == {**first, "replayed": True}
    other = await runtime.error(409, "respond_action", action_id=action_id, decision="deny",
                                idempotency_key="d-1")  # fmt: skip
    assert other["code"] == "already_exists" and other["details"]["field"] == "idempotency_key"
    done = await runtime.thread_status(turn["threadId"], "completed")
    assert done["threads"][0]["lastOutcome"]["result"] == {"decision": "approve"}
    events = await session_events(coordinator, turn["sessionId"])
    assert [e["type"] for e in events].count("action.resolved") == 1
    # Keys are per principal: under the same key an operator's request is its own, and the
    # action it names is resolved already.
    assert coordinator.control_planes is not None
    control = await coordinator.control_planes.of("default")
    operator = Principal(PrincipalKind.OPERATOR, "ops", roles=frozenset({Role.TASKS}))
    params = {"action_id": action_id, "decision": "approve", "idempotency_key": "d-1"}
    with pytest.raises(AlreadyCompletedError) as refused:
        await COMMANDS["respond_action"](control, operator, params)
    assert refused.value.details["field"] == "action_id"
