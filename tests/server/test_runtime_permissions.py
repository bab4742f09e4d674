"""evaluate_permission and resolve_permission against a real coordinator (HTTP sockets, the
HITL engine, the tool service, the message ACLs): a permission is asked of Apiary's own
decisions for the thread's agent; one that needs approval is a HITL invocation that the
thread shows as pending, that resolve_permission decides, and that is never allowed while
unresolved (its deadline denies it, and with no HITL component it is denied at once).
Every event and answer the tests see is validated against the contract's schemas."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.acl import AclPolicy, MessageGrant
from apiary.core.tools.descriptor import ToolDescriptor
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import Hitl, HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.settings import RouterSettings
from apiary.engine.tools.settings import ToolSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from tests.server.runtime_harness import WAIT_S, RuntimeHttp, runtime_http, session_events

HITL = HitlSettings(operators=(OperatorEntry("olivia", token_digest("t0ken"), ("admin",)),))
AGENT = "writer"
TOOL = ToolDescriptor(
    "write_file",
    input_schema='{"type": "object", "properties": {"path": {"type": "string"}}, '
    '"required": ["path"]}',
    side_effects="filesystem",
)


async def _event(
    coordinator: Coordinator, session_id: str, kind: str, **where: Any
) -> dict[str, Any]:
    async def poll() -> dict[str, Any]:
        while True:
            for event in await session_events(coordinator, session_id):
                if event["type"] == kind and all(event.get(k) == v for k, v in where.items()):
                    return event
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(poll(), WAIT_S)


def _hitl(coordinator: Coordinator) -> Hitl:
    assert coordinator.hitl is not None
    return coordinator.hitl


async def _thread(coordinator: Coordinator, runtime: RuntimeHttp) -> dict[str, Any]:
    """A thread bound to AGENT (registered, offering write_file; its turn waits queued)."""
    await coordinator.registry.register(
        {"agent_id": AGENT, "name": AGENT, "reasoning_connectors": ["builtin://rules"]}
    )
    assert coordinator.tools is not None
    await coordinator.tools.register_agent_provider(AGENT, [TOOL], AGENT)
    return await runtime.ok("submit_turn", agent_id=AGENT, turn_id="t-1", input="go")


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=Runtime(hitl=HITL)) as running:
        yield running


@pytest.mark.conformance("runtime.action.unresolved-not-approved")
async def test_an_escalating_tool_call_asks_and_resolve_permission_decides_it(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    turn = await _thread(coordinator, runtime)
    session_id, thread_id = turn["sessionId"], turn["threadId"]
    args = {"path": "README.md"}
    plain = await runtime.ok(
        "evaluate_permission", thread_id=thread_id, tool_name="write_file", arguments=args
    )
    assert (plain["decision"], plain["status"]) == ("allow", "allowed")
    assert [c["check"] for c in plain["permissionDecision"]["checks"]] == [
        "tool_acl", "tool_policy",
    ]  # fmt: skip
    assert plain["request"]["providerId"] == AGENT and "actionId" not in plain
    asked = await runtime.ok(
        "evaluate_permission", thread_id=thread_id, turn_id="t-1", tool_name="write_file",
        arguments=args, privilege_level="ELEVATED", scope={"path": "README.md"},
        prompt="Allow write_file to update README.md?",
    )  # fmt: skip
    assert (asked["decision"], asked["status"]) == ("ask", "pending")
    permission_id = asked["permissionId"]
    assert asked["actionId"] == permission_id and "deadline" in asked
    assert asked["reason"] == "tool_policy: the call asks for privilege_level=ELEVATED"
    # The thread waits on it; it is the HITL inbox's invocation too.
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    (pending,) = read["threads"][0]["pendingRequests"]
    assert (pending["kind"], pending["permissionId"]) == ("permission", permission_id)
    record = await _hitl(coordinator).get(permission_id)
    assert record.reason_type == "TOOL_PRIVILEGE_ESCALATION" and record.state == "PENDING"
    requested = await _event(coordinator, session_id, "permission.requested")
    payload = requested["payload"]
    assert requested["actionId"] == permission_id and requested["turnId"] == "t-1"
    assert payload["prompt"] == "Allow write_file to update README.md?"
    assert payload["decisions"] == ["approve", "deny"] and payload["scope"]["path"] == "README.md"
    assert payload["policy"]["timeoutAction"] == "DENY"
    evaluated = await _event(coordinator, session_id, "permission.evaluated", status="pending")
    assert evaluated["permissionDecision"]["decision"] == "ask"
    # respond_action is for actions; resolve_permission decides a permission.
    wrong = await runtime.error(400, "respond_action", action_id=permission_id, decision="approve")
    assert wrong["details"]["field"] == "action_id"
    bad = await runtime.error(400, "resolve_permission", permission_id=permission_id,
                              decision="maybe")  # fmt: skip
    assert bad["details"]["field"] == "decision"
    done = await runtime.ok(
        "resolve_permission", permission_id=permission_id, decision="allow", rationale="ok"
    )
    assert done["status"] == "allowed" and done["resolution"]["via"] == "operator"
    resolved = await _event(coordinator, session_id, "permission.resolved")
    assert resolved["payload"]["allowed"] is True and resolved["status"] == "allowed"
    read = await runtime.ok("get_thread_read", thread_id=thread_id)
    assert read["threads"][0]["pendingRequests"] == []
    again = await runtime.error(409, "resolve_permission", permission_id=permission_id,
                                decision="deny")  # fmt: skip
    assert again["code"] == "already_completed" and again["details"]["field"] == "permission_id"
    missing = await runtime.error(404, "resolve_permission", permission_id="nope", decision="deny")
    assert missing["details"]["field"] == "permission_id"


async def test_a_permission_left_alone_is_never_allowed_its_deadline_denies_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with (
        open_test_coordinator(tmp_path, runtime=Runtime(clock=clock, hitl=HITL)) as coordinator,
        runtime_http(coordinator) as runtime,
    ):
        turn = await _thread(coordinator, runtime)
        asked = await runtime.ok(
            "evaluate_permission", thread_id=turn["threadId"], tool_name="write_file",
            arguments={"path": "x"}, network_policy="FULL_ACCESS", timeout_s=60,
        )  # fmt: skip
        assert asked["status"] == "pending"
        clock.advance(59)
        await _hitl(coordinator).tick()
        events = await session_events(coordinator, turn["sessionId"])
        assert "permission.resolved" not in [e["type"] for e in events]
        clock.advance(2)
        await _hitl(coordinator).tick()
        resolved = await _event(coordinator, turn["sessionId"], "permission.resolved")
        assert resolved["payload"]["allowed"] is False
        assert (resolved["payload"]["decision"], resolved["payload"]["via"]) == ("deny", "deadline")
        now = await runtime.ok(
            "evaluate_permission", thread_id=turn["threadId"], tool_name="write_file",
            arguments={"path": "x"}, network_policy="FULL_ACCESS", idempotency_key="k-1",
        )  # fmt: skip
        late = await runtime.error(
            409, "resolve_permission", permission_id=asked["permissionId"], decision="approve"
        )
        assert late["code"] == "already_completed"
        assert now["permissionId"] != asked["permissionId"]


async def test_with_no_hitl_component_a_permission_that_asks_is_denied_at_once(
    tmp_path: Path,
) -> None:
    async with open_test_coordinator(tmp_path) as coordinator, runtime_http(coordinator) as runtime:
        turn = await _thread(coordinator, runtime)
        asked = await runtime.ok(
            "evaluate_permission", thread_id=turn["threadId"], tool_name="write_file",
            arguments={"path": "x"}, privilege_level="PRIVILEGED",
        )  # fmt: skip
        assert asked["decision"] == "ask" and asked["status"] == "denied"
        assert asked["resolution"]["allowed"] is False
        events = await session_events(coordinator, turn["sessionId"])
        kinds = [e["type"] for e in events if e["type"].startswith("permission.")]
        assert kinds == ["permission.evaluated", "permission.requested", "permission.resolved"]
        read = await runtime.ok("get_thread_read", thread_id=turn["threadId"])
        assert read["threads"][0]["pendingRequests"] == []


async def test_the_tool_acl_the_message_acls_and_the_access_rules_decide_for_the_agent(
    tmp_path: Path,
) -> None:
    acl = AclPolicy((MessageGrant((AGENT,), ("DATA",), ("reviewer",)),))
    async with (
        open_test_coordinator(
            tmp_path, runtime=Runtime(tools=ToolSettings(acl={"someone": frozenset({AGENT})})),
            router_settings=RouterSettings(acl=acl),
        ) as coordinator,
        runtime_http(coordinator) as runtime,
    ):  # fmt: skip
        thread_id = (await _thread(coordinator, runtime))["threadId"]
        denied = await runtime.ok(
            "evaluate_permission", thread_id=thread_id, tool_name="write_file",
            arguments={"path": "x"},
        )  # fmt: skip
        assert (denied["decision"], denied["status"]) == ("deny", "denied")
        assert denied["reason"].startswith("tool_acl: the tool ACL does not let 'writer' call")

        async def message(message_type: str, recipient: str) -> str:
            found = await runtime.ok(
                "evaluate_permission", thread_id=thread_id, action_type="message",
                message_type=message_type, recipient=recipient,
            )  # fmt: skip
            return str(found["decision"])

        assert await message("DATA", "reviewer") == "allow"
        assert await message("data", "someone-else") == "deny"
        assert await message("CONTROL", "reviewer") == "deny"

        async def call(method: str, **more: Any) -> dict[str, Any]:
            return await runtime.ok(
                "evaluate_permission", thread_id=thread_id, action_type="call", method=method,
                **more,
            )  # fmt: skip

        assert (await call("/sw4rm.registry.RegistryService/Heartbeat"))["decision"] == "allow"
        other = await call("/sw4rm.scheduler.SchedulerService/ShutdownAgent", subjects=["bob"])
        assert other["decision"] == "deny" and "not as bob" in other["reason"]
        assert (await call("submit_turn"))["decision"] == "allow"


async def test_bad_parameters_name_their_field_and_keys_replay(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    thread_id = (await _thread(coordinator, runtime))["threadId"]
    cases: list[tuple[int, str, dict[str, Any]]] = [
        (400, "thread_id", {"tool_name": "write_file"}),
        (404, "thread_id", {"thread_id": "nope", "tool_name": "write_file"}),
        (400, "tool_name", {"thread_id": thread_id}),
        (404, "tool_name", {"thread_id": thread_id, "tool_name": "nope"}),
        (404, "provider_id", {"thread_id": thread_id, "tool_name": "write_file",
                              "provider_id": "nope"}),
        (400, "arguments", {"thread_id": thread_id, "tool_name": "write_file",
                            "arguments": {"path": 7}}),
        (400, "arguments", {"thread_id": thread_id, "tool_name": "write_file", "arguments": 7}),
        (400, "privilege_level", {"thread_id": thread_id, "tool_name": "write_file",
                                  "privilege_level": "ROOT"}),
        (400, "action_type", {"thread_id": thread_id, "action_type": "dance"}),
        (400, "recipient", {"thread_id": thread_id, "action_type": "message",
                            "message_type": "DATA"}),
        (400, "tool_name", {"thread_id": thread_id, "action_type": "message",
                            "message_type": "DATA", "recipient": "x", "tool_name": "t"}),
        (400, "message_type", {"thread_id": thread_id, "action_type": "message",
                               "message_type": "SHOUT", "recipient": "x"}),
        (400, "method", {"thread_id": thread_id, "action_type": "call", "method": "/no/Such"}),
        (400, "object_id", {"thread_id": thread_id, "action_type": "call",
                            "method": "/apiary.v1.TaskQueryService/WaitTask"}),
        (404, "turn_id", {"thread_id": thread_id, "tool_name": "write_file",
                          "arguments": {"path": "x"}, "turn_id": "nope"}),
        (400, "timeout_s", {"thread_id": thread_id, "tool_name": "write_file", "timeout_s": 0}),
    ]  # fmt: skip
    for status, field, params in cases:
        error = await runtime.error(status, "evaluate_permission", **params)
        assert error["details"]["field"] == field, (field, params, error)
    for params in ({}, {"permission_id": "p"}):
        error = await runtime.error(400, "resolve_permission", **params)
        assert error["details"]["field"] in ("permission_id", "decision")
    ask = {"thread_id": thread_id, "tool_name": "write_file", "arguments": {"path": "x"},
           "privilege_level": "ELEVATED"}  # fmt: skip
    first = await runtime.ok("evaluate_permission", idempotency_key="e-1", **ask)
    again = await runtime.ok("evaluate_permission", idempotency_key="e-1", **ask)
    assert again["permissionId"] == first["permissionId"] and again["replayed"] is True
    assert len(await _hitl(coordinator).list()) == 1  # one invocation was opened
    other = await runtime.error(409, "evaluate_permission", idempotency_key="e-1",
                                **{**ask, "privilege_level": "PRIVILEGED"})  # fmt: skip
    assert other["details"]["field"] == "idempotency_key"
    permission_id = first["permissionId"]
    resolved = await runtime.ok("resolve_permission", permission_id=permission_id,
                                decision="deny", idempotency_key="r-1")  # fmt: skip
    assert resolved["status"] == "denied"
    replayed = await runtime.ok("resolve_permission", permission_id=permission_id,
                                decision="deny", idempotency_key="r-1")  # fmt: skip
    assert replayed["replayed"] is True and replayed["status"] == "denied"
    answer = await runtime.call("evaluate_permission", **{**ask, "privilege_level": "MINIMAL"})
    assert answer["result"]["decision"] == "allow"


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


async def test_the_command_line_asks_and_resolves_a_permission(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    thread_id = (await _thread(coordinator, runtime))["threadId"]
    out, _ = await _cli(coordinator, "permission", thread_id, "--tool", "write_file",
                        "--arguments", '{"path": "a"}')  # fmt: skip
    assert json.loads(out)["status"] == "allowed"
    out, _ = await _cli(
        coordinator, "permission", thread_id, "--tool", "write_file", "--arguments",
        '{"path": "a"}', "--privilege", "ELEVATED", code=1,
    )  # fmt: skip
    asked = json.loads(out)
    assert asked["status"] == "pending"
    out, _ = await _cli(coordinator, "resolve-permission", asked["permissionId"], "approve")
    assert json.loads(out)["status"] == "allowed"
    out, _ = await _cli(coordinator, "permission", thread_id, "--method",
                        "/sw4rm.scheduler.SchedulerService/ShutdownAgent", "--subject", "bob",
                        code=1)  # fmt: skip
    assert json.loads(out)["decision"] == "deny"
    _, err = await _cli(coordinator, "resolve-permission", "nope", "deny", code=1)
    assert "nope" in err
