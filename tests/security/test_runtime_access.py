"""The runtime control plane's access rules in secure mode: every command is decided by its
rule (core/access/table.py RUNTIME_RULES) over HTTP JSON, JSON-RPC, the event stream and
gRPC (RuntimeControlService.Call) alike, so an anonymous caller reaches none; and a session
is its owner's: another principal is answered as if it did not exist (operators with
`tasks` excepted), and a refusal changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.controlplane.commands import COMMANDS
from apiary.core.access.principal import TENANT_KEY
from apiary.core.access.rules import Who
from apiary.core.access.table import RUNTIME_RULES
from apiary.wire import pb
from tests.security.access_harness import Secure, open_secure
from tests.security.tenant_harness import ACME, open_tenants
from tests.server.runtime_harness import RuntimeHttp, runtime_http

pytestmark = pytest.mark.conformance("security.multitenant.authorization")

EXAMPLES: dict[str, dict[str, Any]] = {
    "submit_turn": {"agent_id": "alice", "input": "hi"},
    "interrupt_turn": {"thread_id": "t"},
    "remove_queued_turn": {"turn_id": "u"},
    "promote_queued_turn": {"turn_id": "u"},
    "resume_thread": {"thread_id": "t"},
    "get_session": {"session_id": "s"},
    "get_thread_read": {"thread_id": "t"},
    "list_tasks": {"session_id": "s"},
    "get_task": {"task_id": "x"},
    "export_evidence": {"session_id": "s"},
    "export_replay": {"session_id": "s"},
    "export_review": {"session_id": "s"},
    "reconnect_channel": {"session_id": "s"},
    "ack_events": {"channel_id": "c", "resume_token": "r", "sequence": 1},
    "create_task": {"title": "t"},
    "update_task": {"task_id": "x", "title": "t"},
    "start_task": {"task_id": "x"},
    "append_task_progress": {"task_id": "x", "summary": "s"},
    "pause_task": {"task_id": "x"},
    "resume_task": {"task_id": "x"},
    "cancel_task": {"task_id": "x"},
    "retry_task": {"task_id": "x"},
    "complete_task": {"task_id": "x"},
    "fail_task": {"task_id": "x"},
    "link_tasks": {"task_id": "x", "target_id": "y"},
    "unlink_tasks": {"task_id": "x", "target_id": "y"},
    "respond_action": {"action_id": "a", "decision": "approve"},
    "evaluate_permission": {"thread_id": "t", "tool_name": "x"},
    "resolve_permission": {"permission_id": "p", "decision": "deny"},
    "get_tool_inventory": {"thread_id": "t"},
    "get_execution_environment": {"thread_id": "t"},
    "spawn_subagent": {"thread_id": "t", "agent_id": "alice"},
    "send_subagent_input": {"subagent_id": "c", "input": 1},
    "wait_subagents": {"thread_id": "t"},
    "close_subagent": {"subagent_id": "c"},
    "list_subagents": {"thread_id": "t"},
    "create_job": {"agent_id": "alice", "items": [{}]},
    "get_job": {"job_id": "j"},
    "cancel_job": {"job_id": "j"},
    "write_process_stdin": {"process_id": "p", "text": "x"},
    "terminate_process": {"process_id": "p"},
}


def test_every_served_command_has_exactly_one_rule_and_an_example_here() -> None:
    assert set(RUNTIME_RULES) == set(COMMANDS) == set(EXAMPLES)
    assert all(rule.who is Who.PRINCIPAL for rule in RUNTIME_RULES.values())


def _headers(secure: Secure, who: str | None) -> dict[str, str]:
    return dict(secure.metadata(who))


async def _footprint(secure: Secure) -> tuple[object, ...]:
    coordinator = secure.coordinator
    await coordinator.events.flush()
    events = [
        e.event_type for e in await coordinator.events.read(limit=10_000)
        if e.event_type.startswith("runtime.")
    ]  # fmt: skip
    return events, await coordinator.store.runtime.open_turns()


async def test_in_secure_mode_anonymous_callers_reach_no_runtime_command(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as secure, runtime_http(secure.coordinator) as runtime:
        before = await _footprint(secure)
        for command, params in EXAMPLES.items():
            error = await runtime.error(401, command, **params)
            assert error["code"] == "unauthenticated", command
            answer = await runtime.call(command, **params)
            assert answer["error"]["data"]["code"] == "unauthenticated", command
        async with runtime.http.get("/runtime/v1/sessions/s/events") as response:
            assert response.status == 401
        async with runtime.http.get("/runtime/v1") as response:  # the list is public
            assert response.status == 200
        assert await _footprint(secure) == before


async def _as(secure: Secure, runtime: RuntimeHttp, who: str) -> RuntimeHttp:
    return RuntimeHttp(runtime.http, _headers(secure, who))


async def test_a_session_is_its_owners_and_others_are_answered_as_if_it_did_not_exist(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure, runtime_http(secure.coordinator) as runtime:
        await secure.coordinator.registry.register(
            {"agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"]}
        )
        app = await _as(secure, runtime, "app")
        made = await app.ok("submit_turn", agent_id="alice", turn_id="mine", input=1)
        await app.ok("submit_turn", thread_id=made["threadId"], turn_id="queued", input=2)
        channel = (await app.ok("reconnect_channel", session_id=made["sessionId"]))["channel"]
        session = await app.ok("get_session", session_id=made["sessionId"])
        assert session["session"]["owner"] == "application:ci"
        ids = {
            "session_id": made["sessionId"], "thread_id": made["threadId"],
            "task_id": made["taskId"], "channel_id": channel["channelId"],
            "resume_token": channel["resumeToken"],
        }  # fmt: skip
        asked = {
            "get_session": {"session_id": ids["session_id"]},
            "get_thread_read": {"thread_id": ids["thread_id"]},
            "list_tasks": {"session_id": ids["session_id"]},
            "get_task": {"task_id": ids["task_id"]},
            "export_evidence": {"session_id": ids["session_id"]},
            "export_replay": {"session_id": ids["session_id"]},
            "export_review": {"session_id": ids["session_id"]},
            "interrupt_turn": {"thread_id": ids["thread_id"]},
            "remove_queued_turn": {"turn_id": "queued"},
            "promote_queued_turn": {"turn_id": "queued"},
            "resume_thread": {"thread_id": ids["thread_id"]},
            "reconnect_channel": {"session_id": ids["session_id"]},
            "ack_events": {"channel_id": ids["channel_id"], "resume_token": ids["resume_token"],
                           "sequence": 1},
            "submit_turn": {"session_id": ids["session_id"], "input": 3},
        }  # fmt: skip
        before = await _footprint(secure)
        for who in ("mallory", "no-role"):
            other = await _as(secure, runtime, who)
            for command, params in asked.items():
                error = await other.error(404, command, **params)
                assert error["code"] == "not_found", (who, command, error)
            # A turn id another principal took is refused without saying whose it is.
            taken = await other.error(409, "submit_turn", agent_id="alice", turn_id="mine", input=1)
            assert taken["details"] == {"field": "turn_id"}
        assert await _footprint(secure) == before
        # An operator with `tasks` (admin holds every role) acts on anyone's session.
        root = await _as(secure, runtime, "root")
        for command in ("get_session", "get_thread_read", "list_tasks", "get_task",
                        "export_evidence", "export_replay", "export_review"):  # fmt: skip
            await root.ok(command, **asked[command])
        resumed = await root.ok("resume_thread", thread_id=ids["thread_id"])
        assert resumed["mode"] == "following" and resumed["turnId"] == "mine"
        removed = await root.ok("remove_queued_turn", turn_id="queued")
        assert removed["status"] == "cancelled"
        # The owner's stream; another's is refused as missing.
        path = f"/runtime/v1/sessions/{ids['session_id']}/events?keepalive=0.05"
        async with runtime.http.get(path, headers=_headers(secure, "mallory")) as response:
            assert response.status == 404
        async with runtime.http.get(path, headers=_headers(secure, "app")) as response:
            assert response.status == 200
            first = await response.content.readuntil(b"\n\n")
            assert b"event: snapshot" in first


async def test_a_task_is_its_owners_and_its_agent_may_only_report_on_it(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as secure, runtime_http(secure.coordinator) as runtime:
        await secure.coordinator.registry.register(
            {"agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"]}
        )
        app = await _as(secure, runtime, "app")
        await app.ok("create_task", task_id="t-1", agent_id="alice", title="mine")
        await app.ok("create_task", task_id="t-2", session_id=(
            await app.ok("get_task", task_id="t-1"))["task"]["sessionId"])  # fmt: skip
        asked: dict[str, dict[str, Any]] = {
            "get_task": {"task_id": "t-1"},
            "update_task": {"task_id": "t-1", "title": "theirs"},
            "start_task": {"task_id": "t-1"},
            "append_task_progress": {"task_id": "t-1", "summary": "x"},
            "pause_task": {"task_id": "t-1"},
            "resume_task": {"task_id": "t-1"},
            "cancel_task": {"task_id": "t-1"},
            "retry_task": {"task_id": "t-1"},
            "complete_task": {"task_id": "t-1"},
            "fail_task": {"task_id": "t-1"},
            "link_tasks": {"task_id": "t-1", "target_id": "t-2"},
            "unlink_tasks": {"task_id": "t-1", "target_id": "t-2"},
        }
        before = await secure.coordinator.store.runtime.task("t-1")
        for who in ("mallory", "no-role"):
            other = await _as(secure, runtime, who)
            for command, params in asked.items():
                error = await other.error(404, command, **params)
                assert error["code"] == "not_found", (who, command, error)
            taken = await other.error(409, "create_task", task_id="t-1")
            assert taken["details"] == {"field": "task_id"}
        # Another principal's task is not a target either.
        mallory = await _as(secure, runtime, "mallory")
        await mallory.ok("create_task", task_id="m-1")
        refused = await mallory.error(
            404, "link_tasks", task_id="m-1", target_id="t-1", kind="parent"
        )
        assert refused["details"]["field"] == "target_id"
        assert await secure.coordinator.store.runtime.task("t-1") == before  # unchanged
        # Its agent reports progress, but does not drive it.
        alice = await _as(secure, runtime, "alice")
        await alice.ok("append_task_progress", task_id="t-1", summary="reading")
        for command in ("start_task", "cancel_task", "update_task"):
            error = await alice.error(404, command, **asked[command])
            assert error["code"] == "not_found", command
        # An operator with `tasks` acts on anyone's.
        root = await _as(secure, runtime, "root")
        done = await root.ok("complete_task", task_id="t-1", evidence_refs=["ev"])
        assert done["task"]["status"] == "completed"


async def test_a_session_lives_in_its_principals_tenant(tmp_path: Path) -> None:
    async with open_tenants(tmp_path, "") as tenants, runtime_http(tenants.coordinator) as http:
        assert tenants.coordinator.tenancy is not None
        acme = await tenants.coordinator.tenancy.engine(ACME)
        await acme.engine.registry.register(
            {"agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"]}
        )

        def who(name: str, tenant: str = "") -> RuntimeHttp:
            headers = dict(tenants.metadata(name, tenant))
            return RuntimeHttp(http.http, headers)

        made = await who("app@acme").ok("submit_turn", agent_id="alice", input="in acme")
        session_id = made["sessionId"]
        assert await acme.store.runtime.session(session_id) is not None
        assert await tenants.coordinator.store.runtime.session(session_id) is None
        # Another tenant's principal, and a global operator acting in its own tenant, find
        # no such session; the global operator naming acme reads it.
        for caller in (who("ops@globex"), who("root@default")):
            error = await caller.error(404, "get_session", session_id=session_id)
            assert error["code"] == "not_found"
        named = who("root@default", ACME)
        assert TENANT_KEY in named.headers
        read = await named.ok("get_session", session_id=session_id)
        assert read["snapshot"]["runtimeId"] == "apiary:acme"
        # Over gRPC (RuntimeControlService.Call) as over HTTP, in the caller's tenant.
        async with grpc.aio.insecure_channel(str(tenants.coordinator.grpc_address)) as channel:
            stub = pb.apiary_pb2_grpc.RuntimeControlServiceStub(channel)
            request = pb.apiary_pb2.RuntimeCommandRequest(
                command="get_session", params_json=json.dumps({"session_id": session_id}).encode()
            )
            answer = await stub.Call(request, metadata=tenants.metadata("app@acme"))
            assert json.loads(answer.result_json)["snapshot"]["runtimeId"] == "apiary:acme"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Call(request, metadata=tenants.metadata("ops@globex"))
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND


async def test_permissions_tools_and_subagents_are_the_thread_owners(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure, runtime_http(secure.coordinator) as runtime:
        await secure.coordinator.registry.register(
            {"agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"]}
        )
        app = await _as(secure, runtime, "app")
        made = await app.ok("submit_turn", agent_id="alice", turn_id="mine", input=1)
        thread_id = made["threadId"]

        async def call(caller: RuntimeHttp, method: str) -> dict[str, Any]:
            return await caller.ok(
                "evaluate_permission", thread_id=thread_id, action_type="call", method=method
            )

        # Secure mode: the agent is held to its rules as the access guard holds it.
        assert (await call(app, "/apiary.v1.DlqService/List"))["decision"] == "deny"
        assert (await call(app, "/sw4rm.registry.RegistryService/Heartbeat"))["decision"] == (
            "allow"
        )
        await app.ok("spawn_subagent", thread_id=thread_id, agent_id="alice", subagent_id="kid")
        asked = await app.ok(
            "evaluate_permission", thread_id=thread_id, action_type="call",
            method="/sw4rm.scheduler.SchedulerService/ShutdownAgent", subjects=["bob"],
        )  # fmt: skip
        assert asked["decision"] == "deny"
        before = await _footprint(secure)
        for who in ("mallory", "no-role"):
            other = await _as(secure, runtime, who)
            error = await other.error(404, "evaluate_permission", thread_id=thread_id,
                                      tool_name="x")  # fmt: skip
            assert error["details"]["field"] == "thread_id"
            for command in ("get_tool_inventory", "get_execution_environment",
                            "list_subagents", "wait_subagents"):  # fmt: skip
                error = await other.error(404, command, thread_id=thread_id)
                assert error["details"]["field"] == "thread_id", command
            error = await other.error(404, "spawn_subagent", thread_id=thread_id,
                                      agent_id="alice")  # fmt: skip
            assert error["details"]["field"] == "thread_id"
            for command, params in (
                ("send_subagent_input", {"subagent_id": "kid", "input": 1}),
                ("close_subagent", {"subagent_id": "kid"}),
            ):
                error = await other.error(404, command, **params)
                assert error["details"]["field"] == "subagent_id", command
            error = await other.error(
                404, "resolve_permission", permission_id=asked["permissionId"], decision="deny"
            )
            assert error["details"]["field"] == "permission_id"
        assert await _footprint(secure) == before
        root = await _as(secure, runtime, "root")
        assert (await call(root, "/apiary.v1.DlqService/List"))["decision"] == "deny"
