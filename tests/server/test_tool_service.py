"""Tool calling over real gRPC (RFC 18): registration and discovery, agent providers answering
TOOL_CALL envelopes, Call and CallStream, schema checks, retries, worktrees, the event log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from apiary.core.envelope import MessageType
from apiary.core.ids import is_uuid4
from apiary.engine.assembly import Runtime
from apiary.engine.settings import RouterSettings
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import ApiaryError, error_for_code
from apiary.sdk.agent import Agent
from apiary.sdk.tool_provider import Tool, ToolCallContext
from apiary.sdk.tools import ToolClient
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.tool_agents import StaticWorktrees, never, raw_provider, tool_agent

connector = pb.connector_pb2
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
SUM_SCHEMA = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}


def _runtime(tmp_path: Path) -> Runtime:
    return Runtime(
        tools=ToolSettings(retry_base_s=0.01, cancel_grace_s=0.5),
        worktrees=StaticWorktrees({"bound-caller": tmp_path / "wt"}),
    )


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, runtime=_runtime(tmp_path)) as running:
        yield running


@pytest.fixture
async def channel(coordinator: Coordinator) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as ch:
        yield ch


@pytest.fixture
def client(channel: grpc.aio.Channel) -> ToolClient:
    return ToolClient(channel, agent_id="caller")


def address(coordinator: Coordinator) -> str:
    return str(coordinator.grpc_address)


async def events(coordinator: Coordinator, event_type: str) -> list[dict[str, Any]]:
    found = await coordinator.events.read(limit=10_000)
    return [dict(e.details) for e in found if e.event_type == event_type]


async def add(call: ToolCallContext) -> Any:
    return {"sum": call.args["a"] + call.args["b"]}


CALC = [
    Tool("add", add, input_schema=ADD_SCHEMA, output_schema=SUM_SCHEMA, idempotent=True,
         side_effects="none", default_timeout_s=30),
    Tool("note", add, needs_worktree=True, side_effects="filesystem,process",
         max_concurrency=2),
]  # fmt: skip


# ---------------------------------------------------------------- registration, discovery


def _descriptor(name: str, **fields: Any) -> connector.ToolDescriptor:
    return connector.ToolDescriptor(tool_name=name, **fields)


@pytest.mark.parametrize(
    ("tool", "field", "words"),
    [
        (_descriptor("t", input_schema="{not json"), "input_schema", "is not valid JSON"),
        (_descriptor("t", input_schema='{"type": 12}'), "input_schema", "not a valid JSON Schema"),
        (_descriptor("t", output_schema='"text"'), "output_schema", "JSON Schema object"),
        (_descriptor("bad name!"), "tool_name", "letters, digits"),
        (_descriptor(""), "tool_name", "is required"),
        (_descriptor("t", side_effects="Network!"), "side_effects", "side-effect class"),
        (_descriptor("t", side_effects="none,network"), "side_effects", "cannot be combined"),
    ],
)
async def test_bad_descriptors_are_refused_naming_the_tool_and_field(
    coordinator: Coordinator, tool: connector.ToolDescriptor, field: str, words: str
) -> None:
    async with Agent("prov", coordinator=address(coordinator)) as agent:
        reply = await ToolClient(agent.channel, agent_id="prov").register_provider(
            "prov", [_descriptor("fine"), tool]
        )
    assert not reply.ok
    label = f"tool {tool.tool_name!r}" if tool.tool_name else "tools[1]"
    assert reply.reason.startswith(f"{label}: {field}: "), reply.reason
    assert words in reply.reason
    assert coordinator.tools is not None
    assert coordinator.tools.catalog.get("prov") is None


async def test_providers_must_be_the_registered_agent_itself(
    coordinator: Coordinator, channel: grpc.aio.Channel
) -> None:
    async with Agent("prov", coordinator=address(coordinator)) as agent:
        own = ToolClient(agent.channel, agent_id="prov")
        twice = await own.register_provider("prov", [_descriptor("t"), _descriptor("t")])
        assert not twice.ok
        assert "tool 't': tool_name: appears twice" in twice.reason
        with pytest.raises(ApiaryError) as caught:
            await own.register_provider("someone-else", [_descriptor("t")])
        assert caught.value.code == "permission_denied"
        # Without the metadata, the provider id is taken at its word, but must be an agent.
        anonymous = ToolClient(channel)
        assert (await anonymous.register_provider("prov", [_descriptor("t")])).ok
        ghost = await anonymous.register_provider("ghost", [_descriptor("t")])
        assert not ghost.ok
        assert "provider_id: no registered agent 'ghost'" in ghost.reason


@pytest.mark.conformance(
    "tool.descriptors.mcp-like", "tool.discovery.advertise", "tool.discovery.describe-tools"
)
async def test_described_tools_survive_a_restart(tmp_path: Path) -> None:
    """DescribeTools lists every provider's tools with their schemas, side-effect classes and
    capability requirements; the catalogue is in the SQLite file, so it outlives the
    coordinator."""
    runtime = _runtime(tmp_path)
    async with open_test_coordinator(tmp_path, store="", runtime=runtime) as first:
        for agent_id, tools in (("calc", CALC), ("clock", [Tool("now", add, idempotent=True)])):
            async with tool_agent(address(first), agent_id, tools):
                pass
    async with (
        open_test_coordinator(tmp_path, store="", runtime=runtime) as second,
        grpc.aio.insecure_channel(address(second)) as channel,
    ):
        assert second.store.backend == "sqlite"
        assert (tmp_path / "apiary.db").exists()
        client = ToolClient(channel)
        described = await client.describe()
        assert [t.tool_name for t in described] == ["add", "note", "now"]
        add_tool = described[0]
        assert json.loads(add_tool.input_schema) == ADD_SCHEMA
        assert json.loads(add_tool.output_schema) == SUM_SCHEMA
        assert (add_tool.idempotent, add_tool.default_timeout_s, add_tool.side_effects) == (
            True, 30, "none",
        )  # fmt: skip
        assert [t.tool_name for t in await client.describe("calc")] == ["add", "note"]
        with pytest.raises(ApiaryError) as caught:
            await client.describe("nobody")
        assert caught.value.code == "NOT_FOUND"
        (calc,) = await client.providers("calc")
        assert (calc.kind, calc.registered_by) == ("agent", "calc")
        note = calc.tools[1]
        assert list(note.capabilities) == ["filesystem", "process", "worktree"]
        assert note.descriptor.max_concurrency == 2
        assert calc.state == "OFFLINE"  # the agent deregistered with the first coordinator


# ---------------------------------------------------------------- calls


async def test_a_call_travels_as_a_tool_call_envelope_and_back(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(address(coordinator), "calc", CALC) as provider:
        pending = asyncio.create_task(
            client.call("add", {"a": 2, "b": 3}, policy={"timeout_ms": 4000, "max_retries": 1})
        )
        env, doc = await provider.next_call()
        assert env.producer_id == "tools"
        assert env.ttl_ms == 4000  # it never outlives the attempt
        assert env.content_type == "application/json"
        assert doc["call_id"].startswith("call-")  # assigned by the coordinator
        assert env.correlation_id == doc["call_id"]
        assert {k: doc[k] for k in ("action", "tool_name", "provider_id", "args", "stream")} == {
            "action": "call", "tool_name": "add", "provider_id": "calc",
            "args": {"a": 2, "b": 3}, "stream": False,
        }  # fmt: skip
        assert doc["invoked_by"] == "caller"  # so the provider can apply its own ACLs
        policy = doc["execution_policy"]
        assert (policy["timeout_ms"], policy["max_retries"]) == (4000, 1)
        assert (policy["network_policy"], policy["privilege_level"]) == ("DENY_ALL", "MINIMAL")
        await provider.result(env, {"result": {"sum": 5}, "content_type": "application/json"})
        frame = await asyncio.wait_for(pending, 10)
    assert frame.final
    assert frame.call_id == doc["call_id"]
    assert frame.json() == {"sum": 5}
    assert frame.summary["status"] == "OK"


@pytest.mark.conformance("ids.correlation-id.uuid4")
async def test_under_strict_correlation_ids_a_call_correlates_by_a_uuid4(tmp_path: Path) -> None:
    # A call id need not be a UUIDv4 ("call-..." or the caller's own): with strict ids the
    # TOOL_CALL envelopes carry a UUIDv4 of their own, which admission lets through.
    strict = RouterSettings(strict_correlation_ids=True)
    async with (
        open_test_coordinator(tmp_path, runtime=_runtime(tmp_path), router_settings=strict) as c,
        grpc.aio.insecure_channel(str(c.grpc_address)) as channel,
        raw_provider(address(c), "calc", CALC) as provider,
    ):
        client = ToolClient(channel, agent_id="caller")
        pending = asyncio.create_task(client.call("add", {"a": 2, "b": 3}, call_id="sum-1"))
        env, doc = await provider.next_call()
        assert doc["call_id"] == "sum-1"
        assert is_uuid4(env.correlation_id)
        await provider.result(env, {"result": {"sum": 5}, "content_type": "application/json"})
        assert (await asyncio.wait_for(pending, 10)).json() == {"sum": 5}
        (started,) = await events(c, "tool.call_started")
    assert started["call_id"] == "sum-1"


async def test_calls_the_tool_acl_refuses_are_logged_as_access_decisions(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path)
    assert runtime.tools is not None
    acl = {"coder-1": frozenset({"calc/add"})}
    runtime = replace(runtime, tools=replace(runtime.tools, acl=acl))
    async with (
        open_test_coordinator(tmp_path, runtime=runtime) as c,
        grpc.aio.insecure_channel(str(c.grpc_address)) as channel,
        raw_provider(address(c), "calc", CALC) as provider,
    ):
        granted = ToolClient(channel, agent_id="coder-1")
        pending = asyncio.create_task(granted.call("add", {"a": 1, "b": 2}))
        env, _ = await provider.next_call()
        await provider.result(env, {"result": {"sum": 3}, "content_type": "application/json"})
        assert (await asyncio.wait_for(pending, 10)).json() == {"sum": 3}
        for caller, tool in (("coder-1", "note"), ("intruder", "add"), ("", "add")):
            with pytest.raises(ApiaryError) as caught:
                await ToolClient(channel, agent_id=caller).call(tool, {"a": 1, "b": 2})
            assert caught.value.code == "permission_denied"
            assert f"calc/{tool}" in caught.value.message
        denied = await events(c, "acl.denied")
        started = await events(c, "tool.call_started")
    assert [(d["tool_name"], d["kind"]) for d in denied] == [("note", "tool")] + [
        ("add", "tool")
    ] * 2
    assert len(started) == 1  # the refused calls never started


async def count(call: ToolCallContext) -> AsyncIterator[Any]:
    for i in range(call.args["n"]):
        yield {"i": i}


@pytest.mark.conformance("observability.tool-stream.frame-counts")
async def test_a_stream_ends_with_one_final_frame_and_its_counts_are_logged(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with tool_agent(address(coordinator), "counter", [Tool("count", count)]):
        frames = [f async for f in client.stream("count", {"n": 5}, call_id="stream-1")]
        unary = await client.call("count", {"n": 3})
    assert [f.final for f in frames] == [False] * 5 + [True]
    assert [f.frame_no for f in frames] == [1, 2, 3, 4, 5, 6]
    assert [f.json() for f in frames[:5]] == [{"i": i} for i in range(5)]
    data_bytes = sum(len(f.data) for f in frames)
    assert frames[-1].summary == {"frames": 6, "status": "OK", "bytes": data_bytes, "attempts": 1}
    # A unary Call gets one final frame holding every frame's data.
    assert unary.final
    assert unary.data == b'{"i": 0}{"i": 1}{"i": 2}'
    finished = {e["call_id"]: e for e in await events(coordinator, "tool.call_finished")}
    logged = finished["stream-1"]
    assert (logged["state"], logged["frames"], logged["bytes"], logged["stream"]) == (
        "COMPLETED", 6, data_bytes, True,
    )  # fmt: skip
    (started,) = [e for e in await events(coordinator, "tool.call_started")
                  if e["call_id"] == "stream-1"]  # fmt: skip
    assert (started["provider_id"], started["tool_name"]) == ("counter", "count")


@pytest.mark.conformance("tool.errors.structured-codes")
async def test_arguments_and_results_are_checked_against_the_schemas(
    coordinator: Coordinator, client: ToolClient
) -> None:
    seen: list[Any] = []

    async def sloppy_add(call: ToolCallContext) -> Any:
        seen.append(call.args)
        return {"sum": str(call.args["a"] + call.args["b"])}

    tools = [Tool("add", sloppy_add, input_schema=ADD_SCHEMA, output_schema=SUM_SCHEMA)]
    async with tool_agent(address(coordinator), "calc", tools):
        with pytest.raises(ApiaryError) as missing:
            await client.call("add", {"a": 1})
        with pytest.raises(ApiaryError) as wrong_type:
            await client.call("add", {"a": 1, "b": "two"})
        with pytest.raises(ApiaryError) as not_json:
            await client.call("add", b"{oops", content_type="application/json")
        assert seen == []  # nothing ran
        with pytest.raises(ApiaryError) as bad_result:
            await client.call("add", {"a": 1, "b": 2})
    assert missing.value.code == "validation_error"
    assert missing.value.details == {"field": "args", "path": "$"}
    assert "'b' is a required property" in missing.value.message
    assert wrong_type.value.details == {"field": "args", "path": "$.b"}
    assert "'two' is not of type 'integer'" in wrong_type.value.message
    assert not_json.value.details["field"] == "args"
    assert seen == [{"a": 1, "b": 2}]
    assert bad_result.value.code == "validation_error"
    assert bad_result.value.details == {"field": "result", "path": "$.sum"}


@pytest.mark.conformance("tool.policy.fields-supported")
@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"network_policy": "OPEN"}, "network_policy"),
        ({"privilege_level": "root"}, "privilege_level"),
        ({"backoff": "fibonacci"}, "backoff"),
    ],
)
async def test_unknown_policy_values_are_refused_naming_the_field(
    coordinator: Coordinator, client: ToolClient, policy: dict[str, Any], field: str
) -> None:
    async with tool_agent(address(coordinator), "calc", CALC):
        with pytest.raises(ApiaryError) as caught:
            await client.call("add", {"a": 1, "b": 2}, policy=policy)
    assert caught.value.code == "validation_error"
    assert caught.value.details["field"] == field


async def test_unknown_tools_and_ambiguous_names(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with (
        tool_agent(address(coordinator), "calc", CALC),
        tool_agent(address(coordinator), "calc2", CALC),
    ):
        with pytest.raises(ApiaryError) as unknown:
            await client.call("divide", {})
        with pytest.raises(ApiaryError) as ambiguous:
            await client.call("add", {"a": 1, "b": 1})
        named = await client.call("add", {"a": 1, "b": 1}, provider_id="calc2")
    assert unknown.value.code == "NOT_FOUND"
    assert ambiguous.value.details["field"] == "provider_id"
    assert named.json() == {"sum": 2}


# ---------------------------------------------------------------- retries


def flaky(failures: int, calls: list[int], code: str = "TOOL_TIMEOUT") -> Any:
    async def handler(call: ToolCallContext) -> Any:
        calls.append(len(calls) + 1)
        if len(calls) <= failures:
            raise failure(code)
        return {"attempt": len(calls)}

    return handler


def failure(code: str) -> ApiaryError:
    return error_for_code(code, f"failing with {code} on purpose")


@pytest.mark.conformance("tool.retries.bounded-transient", "tool.retries.no-retry-non-idempotent")
async def test_only_idempotent_tools_are_retried_and_only_on_transient_errors(
    coordinator: Coordinator, client: ToolClient
) -> None:
    idem: list[int] = []
    once: list[int] = []
    invalid: list[int] = []
    bounded: list[int] = []
    tools = [
        Tool("idem", flaky(2, idem), idempotent=True),
        Tool("once", flaky(2, once), idempotent=False),
        Tool("invalid", flaky(2, invalid, "VALIDATION_ERROR"), idempotent=True),
        Tool("bounded", flaky(5, bounded, "WALL_TIMEOUT"), idempotent=True),
    ]
    async with tool_agent(address(coordinator), "flaky", tools):
        done = await client.call("idem", {}, policy={"max_retries": 3, "backoff": "linear"})
        with pytest.raises(ApiaryError) as not_retried:
            await client.call("once", {}, policy={"max_retries": 3})
        with pytest.raises(ApiaryError) as permanent:
            await client.call("invalid", {}, policy={"max_retries": 3})
        with pytest.raises(ApiaryError) as exhausted:
            await client.call("bounded", {}, policy={"max_retries": 2})
    assert done.json() == {"attempt": 3}
    assert done.summary["attempts"] == 3
    assert idem == [1, 2, 3]
    assert (not_retried.value.code, once) == ("tool_timeout", [1])
    assert (permanent.value.code, invalid) == ("validation_error", [1])
    assert (exhausted.value.code, bounded) == ("WALL_TIMEOUT", [1, 2, 3])
    retries = await events(coordinator, "tool.call_retry")
    assert [(e["attempt"], e["error_code"]) for e in retries] == [
        (1, "tool_timeout"), (2, "tool_timeout"), (1, "WALL_TIMEOUT"), (2, "WALL_TIMEOUT"),
    ]  # fmt: skip


@pytest.mark.conformance("tool.invocation.idempotent-safe-retries")
async def test_a_retry_is_recognisable_as_the_same_call(
    coordinator: Coordinator, client: ToolClient
) -> None:
    """Retries keep the call_id and number their attempts, so an idempotent provider can tell
    a retry from a new call and answer it safely (dedupe or compensate)."""
    async with raw_provider(address(coordinator), "calc", CALC) as provider:
        pending = asyncio.create_task(
            client.call("add", {"a": 1, "b": 1}, policy={"max_retries": 2, "timeout_ms": 600})
        )
        first, first_doc = await provider.next_call()  # left unanswered: the attempt times out
        second, second_doc = await provider.next_call()
        assert second_doc["call_id"] == first_doc["call_id"]
        assert (first_doc["attempt"], second_doc["attempt"]) == (1, 2)
        assert second.message_id != first.message_id  # a new envelope for the same call
        await provider.result(second, {"result": {"sum": 2}, "content_type": "application/json"})
        done = await asyncio.wait_for(pending, 10)
    assert (done.json(), done.summary["attempts"]) == ({"sum": 2}, 2)


# ---------------------------------------------------------------- deadlines, errors


@pytest.mark.conformance("tool.errors.structured-codes")
async def test_a_provider_that_does_not_answer_in_time_fails_the_call(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with raw_provider(address(coordinator), "slow", [Tool("wait", never)]) as provider:
        with pytest.raises(ApiaryError) as wall:
            await client.call("wait", {}, policy={"budget_wall_ms": 200})
        with pytest.raises(ApiaryError) as timeout:
            await client.call("wait", {}, policy={"timeout_ms": 200, "budget_wall_ms": 5000})
        assert provider.calls.qsize() == 2  # both reached the agent, neither was answered
        env, _ = await provider.next_call()
        # A late answer for a call that has ended is ignored (and logged).
        await provider.result(env, {"result": "late"})
    assert wall.value.code == "WALL_TIMEOUT"
    assert timeout.value.code == "tool_timeout"
    (late,) = await events(coordinator, "tool.result_unknown")
    assert late["message_type"] == "TOOL_RESULT"


async def test_provider_errors_arrive_with_their_codes(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async def refuse(call: ToolCallContext) -> Any:
        raise failure("PERMISSION_DENIED")

    async def crash(call: ToolCallContext) -> Any:
        raise RuntimeError("disk on fire")

    tools = [Tool("refuse", refuse), Tool("crash", crash)]
    async with tool_agent(address(coordinator), "grumpy", tools):
        with pytest.raises(ApiaryError) as refused:
            await client.call("refuse", {})
        with pytest.raises(ApiaryError) as crashed:
            await client.call("crash", {})
    assert refused.value.code == "permission_denied"
    assert crashed.value.code == "TOOL_FAILED"
    assert "RuntimeError: disk on fire" in crashed.value.message


async def test_results_from_the_wrong_agent_or_for_unknown_calls(
    coordinator: Coordinator, client: ToolClient
) -> None:
    async with (
        raw_provider(address(coordinator), "calc", CALC) as provider,
        raw_provider(address(coordinator), "intruder", [Tool("x", never)]) as intruder,
    ):
        pending = asyncio.create_task(client.call("add", {"a": 1, "b": 1}))
        env, _ = await provider.next_call()
        with pytest.raises(ApiaryError) as caught:
            await intruder.result(env, {"result": {"sum": 666}})
        assert caught.value.code == "permission_denied"
        bogus = provider.agent.envelope(
            {"call_id": "no-such-call", "status": "OK", "result": 1},
            message_type=MessageType.TOOL_RESULT,
        )
        await provider.agent.send_envelope(bogus, to="tools")  # accepted and ignored
        await provider.result(env, {"result": {"sum": 2}})
        assert (await asyncio.wait_for(pending, 10)).json() == {"sum": 2}
    assert [e["call_id"] for e in await events(coordinator, "tool.result_unknown")] == [
        "no-such-call"
    ]


# ---------------------------------------------------------------- worktrees


@pytest.mark.conformance("worktree.tools.not-bound-error")
async def test_worktree_tools_need_a_bound_caller(
    coordinator: Coordinator, channel: grpc.aio.Channel, tmp_path: Path
) -> None:
    roots: list[str] = []

    async def note(call: ToolCallContext) -> Any:
        roots.append(call.worktree_root)
        return "noted"

    async with tool_agent(address(coordinator), "notes", [Tool("note", note, needs_worktree=True)]):
        with pytest.raises(ApiaryError) as unbound:
            await ToolClient(channel, agent_id="caller").call("note", {})
        with pytest.raises(ApiaryError) as anonymous:
            await ToolClient(channel).call("note", {})
        assert roots == []
        done = await ToolClient(channel, agent_id="bound-caller").call("note", {})
    assert unbound.value.code == "worktree_not_bound"
    assert unbound.value.details["agent_id"] == "caller"
    assert anonymous.value.code == "worktree_not_bound"
    assert (done.content_type, done.text()) == ("text/plain", "noted")
    assert roots == [str(tmp_path / "wt")]


async def test_a_stream_is_not_retried_once_the_caller_has_frames(
    coordinator: Coordinator, client: ToolClient
) -> None:
    attempts: list[int] = []

    async def half(call: ToolCallContext) -> AsyncIterator[Any]:
        attempts.append(1)
        yield {"part": 1}
        raise failure("TOOL_TIMEOUT")

    async with tool_agent(address(coordinator), "half", [Tool("half", half, idempotent=True)]):
        received: list[Any] = []
        with pytest.raises(ApiaryError) as caught:
            async for frame in client.stream("half", {}, policy={"max_retries": 3}):
                received.append(frame.json())
    assert caught.value.code == "tool_timeout"
    assert received == [{"part": 1}]
    assert attempts == [1]  # a retry would repeat the frame the caller already has


async def test_max_concurrency_queues_calls_beyond_the_limit(
    coordinator: Coordinator, client: ToolClient
) -> None:
    tools = [Tool("one_at_a_time", never, max_concurrency=1)]
    async with raw_provider(address(coordinator), "serial", tools) as provider:
        first = asyncio.create_task(client.call("one_at_a_time", {"n": 1}))
        call_1, doc_1 = await provider.next_call()
        second = asyncio.create_task(client.call("one_at_a_time", {"n": 2}, call_id="c-2"))
        assert coordinator.tools is not None
        for _ in range(500):
            if coordinator.tools.calls.get("c-2") is not None:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # time enough for the second call to go out, were it allowed
        waiting = coordinator.tools.calls.get("c-2")
        assert waiting is not None
        assert waiting.state == "ACCEPTED"
        assert provider.calls.empty()
        # A call cancelled while it waits for a slot ends at once, having run nowhere.
        third = client.stream("one_at_a_time", {"n": 3}, call_id="c-3")
        first_frame = asyncio.create_task(anext(third))
        for _ in range(500):
            if coordinator.tools.calls.get("c-3") is not None:
                break
            await asyncio.sleep(0.01)
        assert await client.cancel("c-3") == (
            "CANCELLED",
            "c-3: cancellation initiated (CANCELLED)",
        )
        cancelled = await asyncio.wait_for(first_frame, 10)
        assert (cancelled.final, cancelled.summary["status"]) == (True, "CANCELLED")
        await provider.result(call_1, {"result": 1})
        call_2, doc_2 = await provider.next_call()
        await provider.result(call_2, {"result": 2})
        results = await asyncio.gather(first, second)
    assert (doc_1["args"], doc_2["args"]) == ({"n": 1}, {"n": 2})
    assert [r.json() for r in results] == [1, 2]
    assert provider.calls.empty()  # the cancelled third never reached the agent


async def test_without_a_hitl_component_escalations_are_denied_at_once(
    coordinator: Coordinator, client: ToolClient
) -> None:
    """No operator is configured here: RFC 15.3's deny-by-default decides, nothing blocks."""
    async with tool_agent(address(coordinator), "calc", CALC):
        with pytest.raises(ApiaryError) as caught:
            await client.call("add", {"a": 1, "b": 1}, policy={"privilege_level": "PRIVILEGED"})
    assert caught.value.code == "permission_denied"
    assert caught.value.details["decision"] == "deny"
    assert "FALLBACK_APPLIED" in caught.value.message
