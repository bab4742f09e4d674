"""Tracing end to end (docs/tracing.md): a real coordinator over gRPC sockets with tracing on,
SDK agents as asyncio tasks of the test, every span recorded by the OpenTelemetry SDK in
memory. One trace runs from the producer through the coordinator to the recipient's handler
and on through what the handler sends: for a send (unary, streamed and through the JSON
gateway), a task (submit -> dispatch -> the agent's run -> its completion) and a tool call.

The coordinator's spans and the agents' go to one provider here (the process's global one,
which the SDK uses); in a deployment they are different processes exporting to one collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from apiary.core.envelope import MessageType
from apiary.core.trace_context import TraceContext
from apiary.errors import ApiaryError, ValidationError
from apiary.sdk.agent import Agent, Message
from apiary.sdk.scheduler import SchedulerClient
from apiary.sdk.tasks import TaskContext
from apiary.sdk.tool_provider import Tool, ToolCallContext, ToolHost
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.server.tracing.otel import OtelTracing
from apiary.server.tracing.settings import TracingSettings
from apiary.wire import pb

WAIT_S = 20.0
SEND = "sw4rm.router.RouterService/SendMessage"
STREAM = "apiary.v1.RouterStreamService/SendStream"
SCOPE = "path:src/app/**"


class SpanLog(SpanProcessor):
    """Every ended span, and waits for one (woken by each span's end, from any thread)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)
        for loop, event in list(self._wakers):
            loop.call_soon_threadsafe(event.set)

    def named(self, name: str, **attributes: Any) -> list[ReadableSpan]:
        return [
            s for s in self.spans
            if s.name == name
            and all((s.attributes or {}).get(k) == v for k, v in attributes.items())
        ]  # fmt: skip

    def children(self, parent: ReadableSpan, name: str = "") -> list[ReadableSpan]:
        span_id = parent.context.span_id
        return [
            s for s in self.spans
            if s.parent is not None and s.parent.span_id == span_id and (not name or s.name == name)
        ]  # fmt: skip

    async def wait(self, found: Callable[[], Sequence[ReadableSpan]]) -> ReadableSpan:
        """The first span `found` returns, once there is one (bounded)."""
        event = asyncio.Event()
        waker = (asyncio.get_running_loop(), event)
        self._wakers.append(waker)
        try:
            async with asyncio.timeout(WAIT_S):
                while not (spans := found()):
                    await event.wait()
                    event.clear()
                return spans[0]
        finally:
            self._wakers.remove(waker)


@pytest.fixture(scope="session")
def provider() -> tuple[TracerProvider, SpanLog]:
    """The process's tracer provider (set once: OpenTelemetry allows no other), recording
    every span in memory."""
    log = SpanLog()
    provider = TracerProvider()
    provider.add_span_processor(log)
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "the global tracer provider was set before"
    return provider, log


@pytest.fixture
def spans(provider: tuple[TracerProvider, SpanLog]) -> SpanLog:
    log = provider[1]
    log.spans.clear()
    return log


@pytest.fixture
async def coordinator(
    tmp_path: Path, provider: tuple[TracerProvider, SpanLog]
) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path, tracing=OtelTracing(provider[0])) as running:
        yield running


@asynccontextmanager
async def _running(agent: Agent) -> AsyncIterator[Agent]:
    """`agent.run()` as a task of the test, registered before the block."""
    registered = asyncio.Event()
    job = asyncio.create_task(agent.run(on_registered=registered.set))
    await asyncio.wait_for(registered.wait(), WAIT_S)
    try:
        yield agent
    finally:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await job


def _same_trace(*spans: ReadableSpan) -> None:
    assert len({s.context.trace_id for s in spans}) == 1, [s.name for s in spans]


def _child_of(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None, f"{child.name} has no parent"
    assert child.parent.span_id == parent.context.span_id, f"{child.name} under {parent.name}"
    assert child.context.trace_id == parent.context.trace_id


class Consumer(Agent):
    agent_id = "consumer"

    async def on_data(self, msg: Message) -> str:
        await msg.reply({"seen": msg.json()})
        return "handled"


async def test_a_send_continues_the_producers_trace_to_the_recipients_handler(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)
    tracer = trace.get_tracer("test")
    async with (
        Agent("producer", coordinator=address) as producer,
        _running(Consumer(coordinator=address)),
    ):
        with tracer.start_as_current_span("producer work") as work:
            env = await producer.send("consumer", {"n": 1})
        handling = await spans.wait(
            lambda: spans.named("process DATA", **{"messaging.message.id": env.message_id})
        )
        # The handler's reply and ACKs are sent within its span: they continue the trace.
        reply = {"apiary.message_type": "DATA", "apiary.producer_id": "consumer"}
        await spans.wait(lambda: spans.named(SEND, **reply))
    (root,) = spans.named("producer work")
    assert root.context.span_id == work.get_span_context().span_id
    (send,) = spans.named(SEND, **{"messaging.message.id": env.message_id})
    _child_of(send, root)
    assert send.kind is SpanKind.SERVER
    assert send.attributes is not None
    assert send.attributes["messaging.destination.name"] == "consumer"
    assert send.attributes["apiary.transport"] == "grpc"
    _child_of(handling, send)
    assert handling.kind is SpanKind.CONSUMER
    assert handling.status.status_code is StatusCode.UNSET
    sent = spans.children(handling, SEND)
    kinds = sorted(str((s.attributes or {}).get("apiary.message_type")) for s in sent)
    assert kinds == ["ACKNOWLEDGEMENT", "ACKNOWLEDGEMENT", "DATA"]  # READ, FULFILLED, reply


async def test_a_streamed_send_has_a_span_per_envelope_in_the_senders_trace(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)
    tracer = trace.get_tracer("test")
    async with (
        Agent("producer", coordinator=address) as producer,
        _running(Consumer(coordinator=address)),
    ):
        with tracer.start_as_current_span("batch") as work:
            items = [(producer.envelope({"n": i}), "consumer") for i in range(3)]
            results = await producer.send_many(items)
        # Outside any span, an envelope is streamed as the first of a new trace.
        (lone,) = await producer.send_many([(producer.envelope({"n": 9}), "consumer")])
        for env, _ in items:
            await spans.wait(
                lambda e=env: spans.named("process DATA", **{"messaging.message.id": e.message_id})
            )
    assert all(r.accepted for r in results)
    (root,) = spans.named("batch")
    assert root.context.span_id == work.get_span_context().span_id
    for env, _ in items:
        (streamed,) = spans.named(STREAM, **{"messaging.message.id": env.message_id})
        _child_of(streamed, root)
        (handling,) = spans.named("process DATA", **{"messaging.message.id": env.message_id})
        _child_of(handling, streamed)
    (alone,) = spans.named(STREAM, **{"messaging.message.id": lone.message_id})
    assert alone.parent is None
    assert alone.context.trace_id != root.context.trace_id


async def test_the_gateway_takes_the_trace_context_from_http_headers(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with _running(Consumer(coordinator=address)):
        body = {
            "msg": {
                "message_id": "0b5a8f4e-7d1c-4d8e-9b3a-2f6e1c9d8a71", "producer_id": "script",
                "correlation_id": "0b5a8f4e-7d1c-4d8e-9b3a-2f6e1c9d8a71",
                "message_type": "DATA", "content_type": "application/json",
                "content_length": "2", "payload": "e30=",
            },
            "recipient": "consumer",
        }  # fmt: skip
        headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=a1"}
        url = f"http://{coordinator.http_address}/v1/sw4rm.router.RouterService/SendMessage"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=body, headers=headers) as response,
        ):
            assert response.status == 200, await response.text()
            assert (await response.json())["accepted"] is True
        handling = await spans.wait(lambda: spans.named("process DATA"))
    (send,) = spans.named(SEND, **{"apiary.transport": "http"})
    assert f"{send.context.trace_id:032x}" == trace_id
    assert send.parent is not None and f"{send.parent.span_id:016x}" == parent_id
    assert send.parent.is_remote
    assert str(send.context.trace_state) == str(send.parent.trace_state)
    assert send.context.trace_state.get("vendor") == "a1"
    _child_of(handling, send)


def _completion_acked(spans: SpanLog, task_id: str) -> list[ReadableSpan]:
    """The task's run span once it has ended with an ACK sent within it (else none)."""
    runs = spans.named("run task", **{"apiary.task_id": task_id})
    acked = bool(runs) and any(
        (a.attributes or {}).get("apiary.message_type") == "ACKNOWLEDGEMENT"
        for a in spans.children(runs[0], STREAM)
    )
    return list(runs) if acked else []


class Worker(Agent):
    agent_id = "worker"

    async def on_task(self, task: TaskContext) -> object:
        size = task.json()["size"]
        await asyncio.sleep(0)
        return {"blob": "x" * size}


async def test_a_task_is_one_trace_from_submission_through_dispatch_to_its_completion(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)
    tracer = trace.get_tracer("test")
    async with SchedulerClient(address) as scheduler, _running(Worker(coordinator=address)):
        with tracer.start_as_current_span("submitter"):
            small = await scheduler.submit("worker", {"size": 3}, scope=SCOPE)
            # Past an ACK's 4 KB, the result goes through CompleteTask first.
            large = await scheduler.submit("worker", {"size": 6000}, scope=SCOPE)
        assert (await small.result(timeout=WAIT_S))["blob"] == "xxx"
        assert len((await large.result(timeout=WAIT_S))["blob"]) == 6000
        # The runs, and their completion ACKs (sent after the result was read, for the
        # large one), before the agent stops.
        for handle in (small, large):
            await spans.wait(lambda h=handle: _completion_acked(spans, h.task_id))
    (root,) = spans.named("submitter")
    for handle in (small, large):
        (submit,) = spans.named(
            "apiary.v1.TaskQueryService/SubmitTask", **{"apiary.task_id": handle.task_id}
        )
        _child_of(submit, root)
        (dispatch,) = spans.named("dispatch task", **{"apiary.task_id": handle.task_id})
        # However it was dispatched (at once, or once the agent was free: within the other
        # task's completion), each dispatch continues its own task's submission.
        _child_of(dispatch, submit)
        assert (dispatch.attributes or {})["apiary.agent_id"] == "worker"
        (run,) = spans.named("run task", **{"apiary.task_id": handle.task_id})
        _child_of(run, dispatch)
        # The completion ACK goes within the run's span (its READ, before the span starts),
        # over the agent's streaming sender.
        acks = spans.children(run, STREAM)
        assert "ACKNOWLEDGEMENT" in [(a.attributes or {}).get("apiary.message_type") for a in acks]
    (large_run,) = spans.named("run task", **{"apiary.task_id": large.task_id})
    (completion,) = spans.children(large_run, "apiary.v1.TaskQueryService/CompleteTask")
    assert completion.status.status_code is StatusCode.UNSET


async def test_a_failed_task_marks_its_spans_failed(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)

    class Failing(Agent):
        agent_id = "failing"

        async def on_task(self, task: TaskContext) -> object:
            raise RuntimeError("no luck")

    tracer = trace.get_tracer("test")
    async with SchedulerClient(address) as scheduler, _running(Failing(coordinator=address)):
        with tracer.start_as_current_span("submitter"):
            handle = await scheduler.submit("failing", {}, scope=SCOPE)
        status = await handle.wait(timeout=WAIT_S)
        assert status.state == "FAILED"
        run = await spans.wait(
            lambda: spans.named("run task", **{"apiary.task_id": handle.task_id})
        )
    assert run.status.status_code is StatusCode.ERROR
    assert (run.attributes or {})["apiary.error_code"] == "internal_error"


async def test_a_tool_call_reaches_the_providers_handler_in_the_callers_trace(
    coordinator: Coordinator, spans: SpanLog
) -> None:
    address = str(coordinator.grpc_address)

    async def add(call: ToolCallContext) -> Any:
        return call.args["a"] + call.args["b"]

    async def boom(call: ToolCallContext) -> Any:
        raise ValidationError.for_field("a", "is not a number")

    tracer = trace.get_tracer("test")
    async with (
        Agent("calc", coordinator=address) as calc,
        Agent("caller", coordinator=address) as caller,
    ):
        host = ToolHost(calc, [Tool("add", add, idempotent=True), Tool("boom", boom)])
        await host.register()
        serving = asyncio.create_task(host.serve())
        try:
            with tracer.start_as_current_span("caller work"):
                result = await caller.tools.call("add", {"a": 2, "b": 3})
            assert result.json() == 5
            tool = await spans.wait(lambda: spans.named("tool add"))
            with pytest.raises(ApiaryError):
                await caller.tools.call("boom", {"a": "x"})
            failed = await spans.wait(lambda: spans.named("tool boom"))
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await serving
    (root,) = spans.named("caller work")
    (call,) = spans.children(root, "sw4rm.tool.ToolService/Call")
    _child_of(tool, call)
    assert (tool.attributes or {})["apiary.tool_name"] == "add"
    # The result travels back to the coordinator within the tool's span.
    results = spans.children(tool, SEND)
    assert "TOOL_RESULT" in [(r.attributes or {}).get("apiary.message_type") for r in results]
    assert tool.status.status_code is StatusCode.UNSET
    # A tool that raises ends its span failed with the error it answered.
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["apiary.error_code"] == "validation_error"
    errors = spans.children(failed, SEND)
    assert "TOOL_ERROR" in [(r.attributes or {}).get("apiary.message_type") for r in errors]


async def test_a_refused_call_is_a_failed_span(coordinator: Coordinator, spans: SpanLog) -> None:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        stub = pb.router_pb2_grpc.RouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.SendMessage(pb.router_pb2.SendMessageRequest())
    (send,) = spans.named(SEND)
    assert send.status.status_code is StatusCode.ERROR
    assert (send.attributes or {})["apiary.error_code"] == "validation_error"


async def test_sampling_follows_the_callers_decision_and_the_ratio_for_new_traces(
    tmp_path: Path, spans: SpanLog
) -> None:
    recorded = SpanLog()
    tracing = OtelTracing.from_settings(TracingSettings(enabled=True, sample_ratio=0.0), recorded)
    sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    unsampled = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    try:
        async with (
            open_test_coordinator(tmp_path, tracing=tracing) as coordinator,
            grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
        ):
            stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
            request = pb.apiary_pb2.ListAgentsRequest()
            await stub.ListAgents(request)  # a new trace: ratio 0 records none
            await stub.ListAgents(request, metadata=(("traceparent", unsampled),))
            await stub.ListAgents(request, metadata=(("traceparent", sampled),))
            await stub.ListAgents(request, metadata=(("traceparent", "00-garbage"),))
    finally:
        await tracing.close()
    listed = recorded.named("apiary.v1.DiscoveryService/ListAgents")
    assert [f"{s.context.trace_id:032x}" for s in listed] == ["4bf92f3577b34da6a3ce929d0e0e4736"]


async def test_with_tracing_off_nothing_is_traced_or_carried(tmp_path: Path) -> None:
    async with (
        open_test_coordinator(tmp_path) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        address = str(coordinator.grpc_address)
        async with Agent("producer", coordinator=address), Agent("consumer", coordinator=address):
            router = pb.router_pb2_grpc.RouterServiceStub(channel)
            env = pb.common_pb2.Envelope(
                message_id="0b5a8f4e-7d1c-4d8e-9b3a-2f6e1c9d8a71", producer_id="producer",
                correlation_id="0b5a8f4e-7d1c-4d8e-9b3a-2f6e1c9d8a71",
                message_type=pb.common_pb2.DATA, content_type="application/json",
                content_length=2, payload=b"{}",
            )  # fmt: skip
            parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            reply = await router.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=env),
                metadata=(("sw4rm-recipient", "consumer"), ("traceparent", parent)),
            )
            assert reply.accepted
            inbound = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel).Inbound(
                pb.apiary_pb2.InboundRequest(agent_id="consumer")
            )
            delivery = await _first_data(inbound)
            inbound.cancel()
    assert delivery.msg.message_id == env.message_id
    assert (delivery.traceparent, delivery.tracestate) == ("", "")
    assert coordinator.router.tracing is None


async def _first_data(inbound: Any) -> Any:
    async with asyncio.timeout(WAIT_S):
        async for batch in inbound:
            for delivery in batch.deliveries:
                if delivery.msg.message_type == MessageType.DATA:
                    return delivery
    raise AssertionError("the stream ended")


def test_a_coordinator_with_tracing_off_never_loads_opentelemetry(tmp_path: Path) -> None:
    """A process that serves and routes with tracing off imports no OpenTelemetry at all."""
    script = f"""
import asyncio, sys
from pathlib import Path
from apiary.core.envelope import AckStage
from apiary.sdk.agent import Agent
from apiary.server.inprocess import open_test_coordinator

async def main():
    async with open_test_coordinator(Path({str(tmp_path)!r})) as coordinator:
        address = str(coordinator.grpc_address)
        async with Agent("a", coordinator=address) as a, Agent("b", coordinator=address) as b:
            await a.send("b", {{"n": 1}})
            async for delivery in b.deliveries():
                assert delivery.trace is None
                await b.ack(delivery.envelope, AckStage.FULFILLED)
                break
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"')) == []


def test_an_invalid_parent_starts_a_new_trace(provider: tuple[TracerProvider, SpanLog]) -> None:
    tracing = OtelTracing(provider[0])
    span = tracing.start("work", None, {"k": "v"})
    span.end()
    assert span.context.trace_id
    bad = tracing.start("work", TraceContext("00-zz-11-01"), {})
    bad.end()
    assert bad.context.trace_id and bad.context.trace_id != "zz"
    assert tracing.current() is None
    with trace.get_tracer("test").start_as_current_span("outer", context=Context()) as outer:
        found = tracing.current()
        assert found is not None
        assert found.span_id == f"{outer.get_span_context().span_id:016x}"
