"""`apiary.Agent` against a real coordinator over gRPC sockets: handlers per message type with
automatic ACK stages, replies, tasks with safe points, progress and activity entries, graceful
shutdown, and the typed clients' error translation. Agents run as asyncio tasks of the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import apiary
from apiary.cli.main import app as main_app
from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.events import Event
from apiary.core.message_machine import MessageState
from apiary.core.records import TaskState
from apiary.engine.notices import NoticeFactory
from apiary.errors import ApiaryError, NotFoundError, ToolTimeoutError
from apiary.sdk.connection import Connection
from apiary.sdk.scheduler import SchedulerClient
from apiary.sdk.tool_provider import Tool, ToolCallContext, ToolHost
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.system import SystemClock, UuidIds
from apiary.testing.events import wait_for_event
from apiary.wire import pb
from apiary.wire.convert import ack_from_payload

SCOPE = "path:src/**"
WAIT_S = 20.0


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path) as running:
        yield running


@asynccontextmanager
async def _running(agent: apiary.Agent) -> AsyncIterator[asyncio.Task[None]]:
    job = asyncio.create_task(agent.run())
    try:
        await _until(lambda: agent._runner is not None)
        yield job
    finally:
        if not job.done():
            job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job


async def _until(check: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not check():  # noqa: ASYNC110 - polls plain attributes of the agent
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), WAIT_S)


async def _event(coordinator: Coordinator, where: Callable[[Event], bool]) -> Event:
    return await wait_for_event(coordinator.events, where, timeout_s=WAIT_S)


class Worker(apiary.Agent):
    agent_id = "worker"
    capabilities = ("work",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[Any] = []
        self.acks: list[Ack] = []
        self.torn_down = False

    async def on_data(self, msg: apiary.Message) -> str:
        body = msg.json()
        self.seen.append(body)
        kind = body["kind"]
        if kind == "reject":
            raise apiary.Rejected("validation_error", "kind reject is refused")
        if kind == "timeout":
            raise ToolTimeoutError("the tool hung")
        if kind == "crash":
            raise KeyError("boom")
        if kind == "echo":
            await msg.reply({"echo": body["value"]})
        return f"did {kind}"

    async def on_acknowledgement(self, ack: Ack, env: Envelope) -> None:
        self.acks.append(ack)

    async def teardown(self) -> None:
        self.torn_down = True


async def _collect_acks(sender: Connection, message_ids: set[str], final: int) -> dict[str, list]:
    """ACKs forwarded to `sender` for `message_ids`, until each has `final` terminal ones."""
    stages: dict[str, list[tuple[AckStage, str, str]]] = {m: [] for m in message_ids}
    terminal = {AckStage.FULFILLED, AckStage.REJECTED, AckStage.FAILED}

    async def read() -> None:
        async for delivery in sender.deliveries():
            env = delivery.envelope
            if env.message_type is MessageType.ACKNOWLEDGEMENT:
                ack = ack_from_payload(env.content_type, env.payload)
                if ack.ack_for_message_id in stages:
                    stages[ack.ack_for_message_id].append((ack.ack_stage, ack.error_code, ack.note))
            else:
                await sender.ack(env, AckStage.FULFILLED)
            done = sum(1 for s in stages.values() for st, _, _ in s if st in terminal)
            if done >= final:
                return

    await asyncio.wait_for(read(), WAIT_S)
    return stages


async def test_handlers_are_acknowledged_through_every_stage(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    worker = Worker(coordinator=address)
    async with _running(worker), Connection("sender", coordinator=address) as sender:
        sent: dict[str, str] = {}
        for kind in ("plain", "reject", "timeout", "crash"):
            env = await sender.send("worker", {"kind": kind})
            sent[kind] = env.message_id
        control = await sender.send("worker", {"x": 1}, message_type=MessageType.CONTROL)
        sent["control"] = control.message_id
        stages = await _collect_acks(sender, set(sent.values()), final=len(sent))
    received, read = AckStage.RECEIVED, AckStage.READ
    assert stages[sent["plain"]] == [
        (received, "", ""), (read, "", ""), (AckStage.FULFILLED, "", "did plain"),
    ]  # fmt: skip
    assert stages[sent["reject"]][-1] == (
        AckStage.REJECTED, "validation_error", "kind reject is refused",
    )  # fmt: skip
    assert stages[sent["timeout"]][-1] == (AckStage.FAILED, "tool_timeout", "the tool hung")
    assert stages[sent["crash"]][-1] == (AckStage.FAILED, "internal_error", "KeyError: 'boom'")
    # No handler for CONTROL: refused without reading it.
    assert stages[sent["control"]] == [
        (received, "", ""),
        (AckStage.REJECTED, "unsupported_message_type", "worker has no handler for CONTROL"),
    ]
    assert [body["kind"] for body in worker.seen] == ["plain", "reject", "timeout", "crash"]
    store = coordinator.store.messages
    states = {kind: (await store.get(mid)).state for kind, mid in sent.items()}  # type: ignore[union-attr]
    assert states == {
        "plain": MessageState.FULFILLED, "reject": MessageState.REJECTED,
        "timeout": MessageState.FAILED, "crash": MessageState.FAILED,
        "control": MessageState.REJECTED,
    }  # fmt: skip


async def test_replies_and_acknowledgements_reach_the_agent(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    worker = Worker(coordinator=address)
    async with _running(worker), Connection("peer", coordinator=address) as peer:
        await worker.send("peer", {"hello": 1})
        request = await peer.send("worker", {"kind": "echo", "value": 42})
        reply: Envelope | None = None
        async for delivery in peer.deliveries():
            env = delivery.envelope
            if env.message_type is MessageType.ACKNOWLEDGEMENT:
                continue
            await peer.ack(env, AckStage.FULFILLED, note="thanks")
            if env.correlation_id == request.correlation_id:
                reply = env
                break
        assert reply is not None
        assert reply.producer_id == "worker"
        # The peer's FULFILLED ACK of the worker's first message goes to on_acknowledgement.
        await _until(lambda: any(a.ack_stage is AckStage.FULFILLED for a in worker.acks))
    assert json.loads(reply.payload) == {"echo": 42}
    assert any(a.note == "thanks" for a in worker.acks)


class Replier(apiary.Agent):
    """Replies twice in one handling, and once more as a second handling of the same delivery
    would (a redelivery after its ACK deadline)."""

    agent_id = "replier"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Envelope | None] = []

    async def on_data(self, msg: apiary.Message) -> str:
        self.sent.append(await msg.reply({"n": 1}))
        self.sent.append(await msg.reply({"n": 2}))
        self.sent.append(await apiary.Message(self, msg.delivery).reply({"n": 1}))
        return "replied"


async def test_a_message_handled_again_does_not_reply_again(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    replier = Replier(coordinator=address)
    async with _running(replier), Connection("peer", coordinator=address) as peer:
        request = await peer.send("replier", {"ask": 1})
        await _until(lambda: len(replier.sent) == 3)
    first, second, again = replier.sent
    assert first is not None and second is not None
    assert again is None  # refused duplicate_detected: the first handling's reply stands
    assert first.idempotency_token == f"replier:reply:{request.message_id}.0"
    assert second.idempotency_token == f"replier:reply:{request.message_id}.1"
    inbox = await coordinator.store.messages.inbox("peer", 0, 100)
    replies = [m.message_id for m in inbox
               if m.producer_id == "replier" and m.message_type == MessageType.DATA]  # fmt: skip
    assert replies == [first.message_id, second.message_id]


class Builder(apiary.Agent):
    agent_id = "builder"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entries_during: list[Any] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def on_task(self, task: apiary.TaskContext) -> str:
        reply = await self.client.activity_buffer.List(
            pb.apiary_pb2.ListActivityRequest(agent_id=self.agent_id)
        )
        self.entries_during = [(e.task_id, e.repo_id, e.description) for e in reply.entries]
        await self.progress(0.5, "half way")
        self.started.set()
        await self.release.wait()
        await self.safe_point()
        async with self.non_preemptible(max_duration=1.0):
            pass
        return "built"


@pytest.mark.conformance(
    "activity.entry.create-before-execution",
    "activity.entry.remove-on-completion",
    "lifecycle.running.progress-updates",
)
async def test_a_task_has_an_activity_entry_while_it_runs_and_reports_progress(
    coordinator: Coordinator,
) -> None:
    address = str(coordinator.grpc_address)
    builder = Builder(coordinator=address)
    async with _running(builder), SchedulerClient(address) as scheduler:
        params = {"repo_id": "shop", "description": "build the shop", "steps": 1}
        accepted, reason = await scheduler.submit_task("builder", "t-1", params, scope=SCOPE)
        assert accepted, reason
        await asyncio.wait_for(builder.started.wait(), WAIT_S)
        assert builder.entries_during == [("t-1", "shop", "build the shop")]
        progress = await _event(coordinator, lambda e: e.event_type == "task.progress")
        assert (progress.details["fraction"], progress.details["note"]) == (0.5, "half way")
        builder.release.set()
        await _event(coordinator, lambda e: e.event_type == "task.completed")
        client = builder.client.activity_buffer
        active = await client.List(pb.apiary_pb2.ListActivityRequest(agent_id="builder"))
        history = await client.List(
            pb.apiary_pb2.ListActivityRequest(agent_id="builder", history=True)
        )
    assert list(active.entries) == []
    assert [(e.task_id, e.outcome) for e in history.entries] == [("t-1", "COMPLETED")]
    assert coordinator.scheduler is not None
    task = await coordinator.scheduler.find("t-1")
    assert (task.state, task.note) == (TaskState.COMPLETED, "built")


async def test_progress_outside_zero_to_one_is_refused(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    outcomes: list[str] = []

    class Reporter(apiary.Agent):
        agent_id = "reporter"

        async def on_task(self, task: apiary.TaskContext) -> str:
            with pytest.raises(ValueError, match="fraction"):
                await task.progress(1.5)
            raw = self.envelope(
                {"command": "progress", "task_id": task.task_id, "fraction": 2},
                message_type=MessageType.CONTROL, correlation_id=task.task_id,
            )  # fmt: skip
            try:
                await self.send_envelope(raw, "scheduler")
            except ApiaryError as exc:
                outcomes.append(f"{exc.code} {exc.details.get('field')}")
            return "ok"

    async with _running(Reporter(coordinator=address)), SchedulerClient(address) as scheduler:
        await scheduler.submit_task("reporter", "t-p", {"n": 1}, scope=SCOPE)
        await _event(coordinator, lambda e: e.event_type == "task.completed")
    assert outcomes == ["validation_error fraction"]


@pytest.mark.conformance("activity.buffer.advisory-non-blocking")
async def test_a_full_activity_buffer_does_not_stop_the_task(coordinator: Coordinator) -> None:
    address = str(coordinator.grpc_address)
    async with apiary.Client(address) as client:
        for n in range(100):  # the per-agent limit (RFC 10.1 default)
            entry = pb.apiary_pb2.ActivityRecord(agent_id="builder", task_id=f"other-{n}")
            await client.activity_buffer.Register(
                pb.apiary_pb2.RegisterActivityRequest(entry=entry)
            )
        with pytest.raises(ApiaryError) as refused:
            entry = pb.apiary_pb2.ActivityRecord(agent_id="builder", task_id="one-more")
            await client.activity_buffer.Register(
                pb.apiary_pb2.RegisterActivityRequest(entry=entry)
            )
        assert refused.value.code == "activity_buffer_full"
        builder = Builder(coordinator=address)
        builder.release.set()
        async with _running(builder), SchedulerClient(address) as scheduler:
            await scheduler.submit_task("builder", "t-full", {"steps": 1}, scope=SCOPE)
            done = await _event(
                coordinator, lambda e: e.event_type in ("task.completed", "task.failed")
            )
    assert done.event_type == "task.completed"
    assert ("t-full", "", "") not in builder.entries_during


@pytest.mark.conformance("lifecycle.shutting-down.graceful")
async def test_a_graceful_shutdown_finishes_the_running_task_then_deregisters(
    coordinator: Coordinator,
) -> None:
    address = str(coordinator.grpc_address)
    builder = Builder(coordinator=address)
    async with SchedulerClient(address) as scheduler:
        job = asyncio.create_task(builder.run())
        await _until(lambda: builder._runner is not None)
        await scheduler.submit_task("builder", "t-long", {"steps": 1}, scope=SCOPE)
        await scheduler.submit_task("builder", "t-next", {"steps": 1}, scope=SCOPE)
        await asyncio.wait_for(builder.started.wait(), WAIT_S)
        await builder.shutdown()
        await _event(
            coordinator,
            lambda e: e.event_type == "agent.lifecycle" and e.details.get("to") == "SHUTTING_DOWN",
        )
        builder.release.set()
        await asyncio.wait_for(job, WAIT_S)
    assert coordinator.scheduler is not None
    finished = await coordinator.scheduler.find("t-long")
    assert (finished.state, finished.note) == (TaskState.COMPLETED, "built")
    # No new task went to the agent once it was shutting down.
    waiting = await coordinator.scheduler.find("t-next")
    assert waiting.state != TaskState.RUNNING
    assert "builder" not in {a.agent_id for a in await coordinator.registry.list()}


async def test_typed_clients_raise_apiary_errors(coordinator: Coordinator) -> None:
    async with apiary.Client(str(coordinator.grpc_address)) as client:
        with pytest.raises(NotFoundError, match="ghost"):
            await client.registry.Heartbeat(pb.registry_pb2.HeartbeatRequest(agent_id="ghost"))
        with pytest.raises(NotFoundError, match="ghost"):  # a stream translates too
            request = pb.apiary_pb2.InboundRequest(agent_id="ghost")
            async for _ in client.router_stream.Inbound(request):
                pass
        reply = await client.discovery.ListAgents(pb.apiary_pb2.ListAgentsRequest())
        assert list(reply.agents) == []


def test_an_agent_needs_an_id() -> None:
    with pytest.raises(ValueError, match="agent_id"):
        apiary.Agent(coordinator="127.0.0.1:1")


def _lifecycle(coordinator: Coordinator, agent_id: str) -> str | None:
    assert coordinator.scheduler is not None
    state = coordinator.scheduler.lifecycles.state(agent_id)
    return None if state is None else state.value


@pytest.mark.conformance(
    "lifecycle.initializing.setup",
    "lifecycle.initializing.register",
    "lifecycle.scheduled.no-execution-before-running",
)
async def test_setup_runs_while_initializing_and_tasks_start_only_when_running(
    coordinator: Coordinator,
) -> None:
    seen: dict[str, str | None] = {}

    class Starter(apiary.Agent):
        agent_id = "starter"

        async def setup(self) -> None:
            # Registered (the Scheduler knows it) but not yet taking work.
            seen["setup"] = _lifecycle(coordinator, self.agent_id)

        async def on_task(self, task: apiary.TaskContext) -> str:
            # The handler starts as the agent sends its READ (its move to RUNNING), which
            # the coordinator applies a few ms later: nothing the handler does reaches the
            # coordinator before it (the progress below waits for it).
            await task.progress(0.5)
            seen["task"] = _lifecycle(coordinator, self.agent_id)
            return "ok"

    address = str(coordinator.grpc_address)
    async with _running(Starter(coordinator=address)), SchedulerClient(address) as scheduler:
        await scheduler.submit_task("starter", "t-s", {"n": 1}, scope=SCOPE)
        await _event(coordinator, lambda e: e.event_type == "task.completed")
    assert seen == {"setup": "INITIALIZING", "task": "RUNNING"}
    # As the coordinator saw it: the task dispatched (the agent SCHEDULED), its READ (the
    # agent RUNNING), then the handler's work.
    shown = ("task.dispatched", "task.running", "task.progress")
    order = [e.event_type for e in await coordinator.events.read(limit=10_000)
             if e.event_type in shown and e.correlation_id == "t-s"]  # fmt: skip
    assert order == list(shown)


class Waiter(apiary.Agent):
    agent_id = "waiter"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = asyncio.Event()
        self.resources = False

    async def on_task(self, task: apiary.TaskContext) -> str:
        if task.task_id != "t-wait":
            return "second"
        async with task.waiting(resources=self.resources):
            await self.arrived.wait()
        return "woke"


@pytest.mark.parametrize("resources", [False, True], ids=["event", "resources"])
@pytest.mark.conformance(
    "lifecycle.waiting.suspend",
    "lifecycle.waiting.assignment-retained",
    "lifecycle.waiting.resume-on-event",
    "lifecycle.waiting-resources.suspend",
)
async def test_a_waiting_task_keeps_its_assignment_and_resumes_on_the_event(
    coordinator: Coordinator, resources: bool
) -> None:
    address = str(coordinator.grpc_address)
    waiter = Waiter(coordinator=address)
    waiter.resources = resources
    scheduler_engine = coordinator.scheduler
    assert scheduler_engine is not None
    expected = "WAITING_RESOURCES" if resources else "WAITING"
    async with _running(waiter), SchedulerClient(address) as scheduler:
        await scheduler.submit_task("waiter", "t-wait", {"n": 1}, scope=SCOPE)
        await _until(lambda: _lifecycle(coordinator, "waiter") == expected)
        await scheduler.submit_task("waiter", "t-after", {"n": 2}, scope=SCOPE)
        await asyncio.sleep(0.1)
        running = scheduler_engine.running("waiter")
        assert running is not None and running.task_id == "t-wait"  # still assigned
        assert (await scheduler_engine.find("t-after")).state == TaskState.QUEUED
        waiter.arrived.set()
        await _event(
            coordinator,
            lambda e: e.event_type == "task.completed" and e.details.get("task_id") == "t-after",
        )
    first = await scheduler_engine.find("t-wait")
    assert (first.state, first.note) == (TaskState.COMPLETED, "woke")
    moves = [
        (e.details["from"], e.details["to"])
        for e in await coordinator.events.read(limit=10_000)
        if e.event_type == "agent.lifecycle" and e.agent_id == "waiter"
    ]
    assert ("RUNNING", expected) in moves
    assert (expected, "RUNNING") in moves


@pytest.mark.conformance("lifecycle.suspended.preserve-state")
async def test_a_suspended_agent_keeps_its_task_state_and_goes_on_when_resumed(
    coordinator: Coordinator,
) -> None:
    counted: list[int] = []
    go_slow = asyncio.Event()

    class Counter(apiary.Agent):
        agent_id = "counter"

        async def on_task(self, task: apiary.TaskContext) -> str:
            total = 0
            for n in range(40):
                await self.safe_point()
                total += n
                counted.append(n)
                if n == 5:
                    go_slow.set()
                await asyncio.sleep(0.005)
            return f"total {total}"

    address = str(coordinator.grpc_address)
    scheduler_engine = coordinator.scheduler
    assert scheduler_engine is not None
    async with _running(Counter(coordinator=address)), SchedulerClient(address) as scheduler:
        await scheduler.submit_task("counter", "t-count", {"n": 1}, scope=SCOPE)
        await asyncio.wait_for(go_slow.wait(), WAIT_S)
        control = apiary.Client(address).agent_control  # the operator's RPC
        paused = await control.Suspend(pb.apiary_pb2.AgentControlRequest(agent_id="counter"))
        assert paused.state == "SUSPENDED"
        await _until(lambda: _lifecycle(coordinator, "counter") == "SUSPENDED")
        await asyncio.sleep(0.1)
        held = len(counted)
        await asyncio.sleep(0.2)
        assert len(counted) == held < 40  # held at a safe point
        resumed = await control.Resume(pb.apiary_pb2.AgentControlRequest(agent_id="counter"))
        assert resumed.state in ("RESUMED", "RUNNING")
        await _event(coordinator, lambda e: e.event_type == "task.completed")
    task = await scheduler_engine.find("t-count")
    assert (task.state, task.note) == (TaskState.COMPLETED, f"total {sum(range(40))}")
    assert counted == list(range(40))  # went on from where it stood, not from the start
    assert task.attempts == 1  # one dispatch: never yielded nor restarted


@pytest.mark.conformance("preemption.safepoint.placement")
async def test_a_safe_point_inside_a_transaction_does_not_yield(coordinator: Coordinator) -> None:
    """A safe point must sit where the state is consistent: inside a non-preemptible section
    (a transaction) the SDK never yields, even when asked to; at the boundary it does."""
    steps: list[str] = []

    class Ledger(apiary.Agent):
        agent_id = "ledger"

        async def on_task(self, task: apiary.TaskContext) -> str:
            if task.task_id == "urgent":
                return "urgent done"
            if task.attempt > 1:
                return "resumed"
            async with self.non_preemptible(max_duration=10.0):
                steps.append("debit")
                while not task.preempt_requested:  # noqa: ASYNC110 - waits for the request
                    await asyncio.sleep(0.01)
                await self.safe_point()  # inside the transaction: no yield
                steps.append("credit")
            try:
                await self.safe_point()  # the transaction's boundary: yields
            except apiary.Preempted:
                steps.append("yielded")
                raise
            return "never preempted"

    address = str(coordinator.grpc_address)
    async with _running(Ledger(coordinator=address)), SchedulerClient(address) as scheduler:
        await scheduler.submit_task("ledger", "transfer", {"n": 1}, priority=10, scope=SCOPE)
        await _until(lambda: steps == ["debit"])
        await scheduler.submit_task("ledger", "urgent", {"n": 2}, priority=-5, scope=SCOPE)
        await _event(
            coordinator,
            lambda e: e.event_type == "task.completed" and e.details.get("task_id") == "transfer",
        )
    assert steps == ["debit", "credit", "yielded"]
    assert coordinator.scheduler is not None
    done = await coordinator.scheduler.find("transfer")
    assert (done.note, done.attempts) == ("resumed", 2)


@pytest.mark.conformance("registry.register.required-fields")
async def test_an_agent_registers_its_descriptor_and_its_tool_descriptors(
    coordinator: Coordinator,
) -> None:
    """RFC 14's registration: name, description, capabilities, communication class and
    modalities in the descriptor; tool descriptors through ConnectorService (the canonical
    AgentDescriptor has no field for them)."""

    async def add(call: ToolCallContext) -> int:
        return int(call.args["a"]) + int(call.args["b"])

    class Calculator(apiary.Agent):
        agent_id = "calc"
        name = "Calculator"
        description = "Adds numbers for other agents."
        capabilities = ("arithmetic",)
        modalities = ("application/json",)
        communication_class = "BULK"

    async with Calculator(coordinator=str(coordinator.grpc_address)) as calc:
        await ToolHost(calc, [Tool("add", add, idempotent=True)]).register()
        record = await coordinator.registry.get("calc")
        described = await calc.tools.describe("calc")
    descriptor = record.descriptor
    assert (descriptor["name"], descriptor["description"]) == (
        "Calculator", "Adds numbers for other agents.",
    )  # fmt: skip
    assert list(descriptor["capabilities"]) == ["arithmetic"]
    assert descriptor["communication_class"] == "BULK"
    assert list(descriptor["modalities_supported"]) == ["application/json"]
    assert [(t.tool_name, t.idempotent) for t in described] == [("add", True)]


async def test_coordinator_notices_reach_on_notification_unacknowledged(
    coordinator: Coordinator,
) -> None:
    seen: list[dict[str, Any]] = []

    class Listener(apiary.Agent):
        agent_id = "listener"

        async def on_notification(self, msg: apiary.Message) -> None:
            seen.append(msg.json())

    listener = Listener(coordinator=str(coordinator.grpc_address))
    async with _running(listener):
        notices = NoticeFactory(SystemClock(), UuidIds())
        env = notices.notification({"event": "task_deferred", "task_id": "t-9"}, "t-9")
        outcome = await coordinator.router.notify("listener", env)
        assert outcome.accepted
        await _until(lambda: bool(seen))
    assert seen == [{"event": "task_deferred", "task_id": "t-9"}]
    # The directory notices stay the connection's own business.
    assert all(s.get("event") not in ("directory", "agent_joined") for s in seen)
    acks = [e for e in await coordinator.events.read(limit=10_000)
            if e.event_type == "message.state" and e.details.get("message_id") == env.message_id
            and str(e.details.get("input", "")).startswith("ACK_")]  # fmt: skip
    assert acks == []  # a notice is never acknowledged


async def test_suspend_and_resume_refuse_what_does_not_apply(coordinator: Coordinator) -> None:
    async with apiary.Client(str(coordinator.grpc_address)) as client:
        with pytest.raises(ApiaryError) as unnamed:
            await client.agent_control.Suspend(pb.apiary_pb2.AgentControlRequest())
        assert (unnamed.value.code, unnamed.value.details["field"]) == (
            "validation_error", "agent_id",
        )  # fmt: skip
        with pytest.raises(NotFoundError):
            await client.agent_control.Suspend(pb.apiary_pb2.AgentControlRequest(agent_id="x"))
        async with apiary.Agent("idle", coordinator=str(coordinator.grpc_address)):
            with pytest.raises(ApiaryError) as idle:  # INITIALIZING: nothing to suspend
                await client.agent_control.Suspend(
                    pb.apiary_pb2.AgentControlRequest(agent_id="idle")
                )
            assert idle.value.code == "validation_error"
            assert "does not apply" in idle.value.message
            address = str(coordinator.grpc_address)
            cli = await asyncio.to_thread(
                CliRunner().invoke, main_app, ["agent", "suspend", "idle", "--grpc", address]
            )
    assert cli.exit_code == 1
    assert "apiary agent suspend: validation_error" in cli.output
