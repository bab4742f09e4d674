"""Typed clients for every service of a coordinator, raising Apiary's exceptions.

    async with Client("127.0.0.1:50051") as client:
        reply = await client.registry.Heartbeat(pb.registry_pb2.HeartbeatRequest(agent_id="a"))
        async for event in client.hitl_operator.Watch(pb.apiary_pb2.WatchInvocationsRequest()):
            ...

Each property is the service's generated asyncio stub (same methods, request and response
types, so type checkers follow every call), wrapped so that a failed call raises the
`apiary.errors` exception for its protocol error code instead of a raw gRPC error: awaiting a
unary call and iterating a streaming one both translate. Request and response messages come
from `apiary.wire.pb` (the generated modules of the canonical and apiary.v1 protos).

`submit_task` submits a Scheduler task and returns its handle, whose `result()` is what the
agent returned (sdk/task_handle.py):

    handle = await client.submit_task("coder-1", {"fix": "bug-7"}, scope="repo:app")
    value = await handle.result(timeout=60)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import grpc

from apiary.sdk import errors, task_handle
from apiary.sdk.channel import ClientTls, open_channel
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.task_handle import TaskHandle
from apiary.sdk.task_submits import TaskSubmissions
from apiary.sdk.task_waits import TaskWaits
from apiary.wire import pb

if TYPE_CHECKING:
    from apiary.wire.pb import (
        activity_pb2_grpc,
        apiary_pb2_grpc,
        connector_pb2_grpc,
        handoff_pb2_grpc,
        hitl_pb2_grpc,
        logging_pb2_grpc,
        negotiation_pb2_grpc,
        negotiation_room_pb2_grpc,
        reasoning_pb2_grpc,
        reasoning_proxy_pb2_grpc,
        registry_pb2_grpc,
        router_pb2_grpc,
        scheduler_pb2_grpc,
        scheduler_policy_pb2_grpc,
        tool_pb2_grpc,
        workflow_pb2_grpc,
        worktree_pb2_grpc,
    )

AGENT_KEY = "sw4rm-agent-id"
"""Call metadata naming the calling agent (services that act for an agent read it)."""


class _GuardedCall:
    """One call in flight: awaiting (unary) or iterating (streaming) translates errors."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __await__(self) -> Generator[Any, None, Any]:
        return errors.call(lambda: self._call).__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        return errors.stream(self._call.__aiter__())

    async def write(self, request: Any) -> None:
        """Send one request on a client- or bidirectional-streaming call."""
        await errors.call(lambda: self._call.write(request))

    async def done_writing(self) -> None:
        await errors.call(self._call.done_writing)

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _GuardedStub:
    """A generated stub whose every method returns a `_GuardedCall`."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str) -> Callable[..., _GuardedCall]:
        method = getattr(self._stub, name)

        def invoke(*args: Any, **kwargs: Any) -> _GuardedCall:
            if self._metadata:
                kwargs["metadata"] = (*self._metadata, *(kwargs.get("metadata") or ()))
            return _GuardedCall(method(*args, **kwargs))

        invoke.__name__ = name
        return invoke


class Client:
    """Every service of one coordinator over one channel (its own when given an address).

    `agent_id` is sent as `sw4rm-agent-id` call metadata on every call, for the services that
    act on behalf of the calling agent (tools, HITL, worktrees); `metadata` adds more.

    A channel it opens presents `credentials` (default: `ClientCredentials.load()`, so
    `APIARY_API_KEY` or the client configuration file); `tls` overrides their TLS settings.
    An `authorization` entry in `metadata` (an operator token) wins over their API key.
    """

    def __init__(
        self,
        target: grpc.aio.Channel | str,
        *,
        agent_id: str = "",
        metadata: Mapping[str, str] | None = None,
        tls: ClientTls | None = None,
        credentials: ClientCredentials | None = None,
    ) -> None:
        self._owned = isinstance(target, str)
        self.channel = open_channel(target, tls, credentials) if isinstance(target, str) else target
        self.agent_id = agent_id
        pairs = dict(metadata or {})
        if agent_id:
            pairs[AGENT_KEY] = agent_id
        self._metadata = tuple(pairs.items())
        self._stubs: dict[str, _GuardedStub] = {}
        self._waits: TaskWaits | None = None
        self._submissions: TaskSubmissions | None = None

    @property
    def task_waits(self) -> TaskWaits:
        """The waits of this client's task handles: one FollowTasks stream, opened at the
        first wait and closed with the client (sdk/task_waits.py)."""
        if self._waits is None:
            self._waits = TaskWaits(self)
        return self._waits

    @property
    def task_submissions(self) -> TaskSubmissions:
        """This client's submissions: concurrent `submit_task` calls share SubmitTasks calls
        (sdk/task_submits.py)."""
        if self._submissions is None:
            self._submissions = TaskSubmissions(self)
        return self._submissions

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the task handles' stream and the submissions not sent yet; close the channel
        when this client opened it."""
        if self._submissions is not None:
            await self._submissions.close()
        if self._waits is not None:
            await self._waits.close()
        if self._owned:
            await self.channel.close()

    async def submit_task(
        self,
        agent_id: str = "",
        params: bytes | Any = b"",
        *,
        scope: str,
        task_id: str = "",
        priority: int = 0,
        content_type: str | None = None,
        submitter: str | None = None,
        capability: str = "",
        agent_type: str = "",
    ) -> TaskHandle:
        """Submit a task for `agent_id` and return its handle; or, instead of an agent, for
        any RUNNABLE agent offering `capability` or of `agent_type` (a shared queue: the
        first with room takes it, fairly; it waits while none is registered). Bytes params go
        as they are, anything else as JSON. Without `task_id` the coordinator assigns one
        (`handle.task_id`); with one, the same submission again is the same task
        (`handle.created` false) and other content under it raises TaskIdConflictError.
        Refusals raise (DuplicateDetectedError, BufferFullError, ...); a duplicate job held
        for a HITL authorization is a HELD task (`handle.status()`).
        `submitter` (default: this client's agent_id) names the submitting agent of an
        anonymous caller in dev mode; an authenticated caller submits as itself.

        Concurrent submissions of this client go together in TaskQueryService.SubmitTasks
        calls, each answered as its own SubmitTask call would be (sdk/task_submits.py)."""
        return await task_handle.submit_task(
            self, agent_id, params, scope=scope, task_id=task_id, priority=priority,
            content_type=content_type, submitter=self.agent_id if submitter is None else submitter,
            capability=capability, agent_type=agent_type,
        )  # fmt: skip

    def task(self, task_id: str) -> TaskHandle:
        """A handle of the task `task_id`, submitted earlier (by this caller: WaitTask and
        CancelTask are its submitter's, or a `tasks` operator's)."""
        return TaskHandle(self, task_id, created=False)

    def _stub(self, name: str, factory: Callable[[grpc.aio.Channel], Any]) -> Any:
        stub = self._stubs.get(name)
        if stub is None:
            stub = self._stubs[name] = _GuardedStub(factory(self.channel), self._metadata)
        return stub

    @property
    def registry(self) -> registry_pb2_grpc.RegistryServiceAsyncStub:
        """sw4rm.registry.RegistryService: register, heartbeat, deregister."""
        stub = self._stub("registry", pb.registry_pb2_grpc.RegistryServiceStub)
        return cast("registry_pb2_grpc.RegistryServiceAsyncStub", stub)

    @property
    def router(self) -> router_pb2_grpc.RouterServiceAsyncStub:
        """sw4rm.router.RouterService: send and stream messages."""
        stub = self._stub("router", pb.router_pb2_grpc.RouterServiceStub)
        return cast("router_pb2_grpc.RouterServiceAsyncStub", stub)

    @property
    def scheduler(self) -> scheduler_pb2_grpc.SchedulerServiceAsyncStub:
        """sw4rm.scheduler.SchedulerService: tasks, preemption, shutdown, activity."""
        stub = self._stub("scheduler", pb.scheduler_pb2_grpc.SchedulerServiceStub)
        return cast("scheduler_pb2_grpc.SchedulerServiceAsyncStub", stub)

    @property
    def scheduler_policy(self) -> scheduler_policy_pb2_grpc.SchedulerPolicyServiceAsyncStub:
        """sw4rm.scheduler.SchedulerPolicyService: negotiation policy."""
        stub = self._stub(
            "scheduler_policy", pb.scheduler_policy_pb2_grpc.SchedulerPolicyServiceStub
        )
        return cast("scheduler_policy_pb2_grpc.SchedulerPolicyServiceAsyncStub", stub)

    @property
    def hitl(self) -> hitl_pb2_grpc.HitlServiceAsyncStub:
        """sw4rm.hitl.HitlService: decisions on HITL invocations."""
        stub = self._stub("hitl", pb.hitl_pb2_grpc.HitlServiceStub)
        return cast("hitl_pb2_grpc.HitlServiceAsyncStub", stub)

    @property
    def worktree(self) -> worktree_pb2_grpc.WorktreeServiceAsyncStub:
        """sw4rm.worktree.WorktreeService: worktree binding."""
        stub = self._stub("worktree", pb.worktree_pb2_grpc.WorktreeServiceStub)
        return cast("worktree_pb2_grpc.WorktreeServiceAsyncStub", stub)

    @property
    def tool(self) -> tool_pb2_grpc.ToolServiceAsyncStub:
        """sw4rm.tool.ToolService: call tools."""
        stub = self._stub("tool", pb.tool_pb2_grpc.ToolServiceStub)
        return cast("tool_pb2_grpc.ToolServiceAsyncStub", stub)

    @property
    def connector(self) -> connector_pb2_grpc.ConnectorServiceAsyncStub:
        """sw4rm.connector.ConnectorService: tool providers."""
        stub = self._stub("connector", pb.connector_pb2_grpc.ConnectorServiceStub)
        return cast("connector_pb2_grpc.ConnectorServiceAsyncStub", stub)

    @property
    def negotiation(self) -> negotiation_pb2_grpc.NegotiationServiceAsyncStub:
        """sw4rm.negotiation.NegotiationService."""
        stub = self._stub("negotiation", pb.negotiation_pb2_grpc.NegotiationServiceStub)
        return cast("negotiation_pb2_grpc.NegotiationServiceAsyncStub", stub)

    @property
    def negotiation_room(self) -> negotiation_room_pb2_grpc.NegotiationRoomServiceAsyncStub:
        """sw4rm.negotiation_room.NegotiationRoomService."""
        stub = self._stub(
            "negotiation_room", pb.negotiation_room_pb2_grpc.NegotiationRoomServiceStub
        )
        return cast("negotiation_room_pb2_grpc.NegotiationRoomServiceAsyncStub", stub)

    @property
    def handoff(self) -> handoff_pb2_grpc.HandoffServiceAsyncStub:
        """sw4rm.handoff.HandoffService."""
        stub = self._stub("handoff", pb.handoff_pb2_grpc.HandoffServiceStub)
        return cast("handoff_pb2_grpc.HandoffServiceAsyncStub", stub)

    @property
    def workflow(self) -> workflow_pb2_grpc.WorkflowServiceAsyncStub:
        """sw4rm.workflow.WorkflowService."""
        stub = self._stub("workflow", pb.workflow_pb2_grpc.WorkflowServiceStub)
        return cast("workflow_pb2_grpc.WorkflowServiceAsyncStub", stub)

    @property
    def activity(self) -> activity_pb2_grpc.ActivityServiceAsyncStub:
        """sw4rm.activity.ActivityService: artifacts."""
        stub = self._stub("activity", pb.activity_pb2_grpc.ActivityServiceStub)
        return cast("activity_pb2_grpc.ActivityServiceAsyncStub", stub)

    @property
    def logging(self) -> logging_pb2_grpc.LoggingServiceAsyncStub:
        """sw4rm.logging.LoggingService."""
        stub = self._stub("logging", pb.logging_pb2_grpc.LoggingServiceStub)
        return cast("logging_pb2_grpc.LoggingServiceAsyncStub", stub)

    @property
    def inference(self) -> reasoning_pb2_grpc.InferenceProxyAsyncStub:
        """sw4rm.reasoning.InferenceProxy."""
        stub = self._stub("inference", pb.reasoning_pb2_grpc.InferenceProxyStub)
        return cast("reasoning_pb2_grpc.InferenceProxyAsyncStub", stub)

    @property
    def reasoning(self) -> reasoning_proxy_pb2_grpc.ReasoningProxyAsyncStub:
        """sw4rm.reasoning.ReasoningProxy."""
        stub = self._stub("reasoning", pb.reasoning_proxy_pb2_grpc.ReasoningProxyStub)
        return cast("reasoning_proxy_pb2_grpc.ReasoningProxyAsyncStub", stub)

    @property
    def events(self) -> apiary_pb2_grpc.EventLogServiceAsyncStub:
        """apiary.v1.EventLogService: read the event log."""
        stub = self._stub("events", pb.apiary_pb2_grpc.EventLogServiceStub)
        return cast("apiary_pb2_grpc.EventLogServiceAsyncStub", stub)

    @property
    def router_stream(self) -> apiary_pb2_grpc.RouterStreamServiceAsyncStub:
        """apiary.v1.RouterStreamService: streaming send and inbound."""
        stub = self._stub("router_stream", pb.apiary_pb2_grpc.RouterStreamServiceStub)
        return cast("apiary_pb2_grpc.RouterStreamServiceAsyncStub", stub)

    @property
    def discovery(self) -> apiary_pb2_grpc.DiscoveryServiceAsyncStub:
        """apiary.v1.DiscoveryService: list and read agents."""
        stub = self._stub("discovery", pb.apiary_pb2_grpc.DiscoveryServiceStub)
        return cast("apiary_pb2_grpc.DiscoveryServiceAsyncStub", stub)

    @property
    def dlq(self) -> apiary_pb2_grpc.DlqServiceAsyncStub:
        """apiary.v1.DlqService: the dead letter queue."""
        stub = self._stub("dlq", pb.apiary_pb2_grpc.DlqServiceStub)
        return cast("apiary_pb2_grpc.DlqServiceAsyncStub", stub)

    @property
    def hitl_operator(self) -> apiary_pb2_grpc.HitlOperatorServiceAsyncStub:
        """apiary.v1.HitlOperatorService: the operators' HITL inbox."""
        stub = self._stub("hitl_operator", pb.apiary_pb2_grpc.HitlOperatorServiceStub)
        return cast("apiary_pb2_grpc.HitlOperatorServiceAsyncStub", stub)

    @property
    def negotiation_room_query(self) -> apiary_pb2_grpc.NegotiationRoomQueryServiceAsyncStub:
        """apiary.v1.NegotiationRoomQueryService: list and read proposals, decisions and
        policy versions."""
        stub = self._stub(
            "negotiation_room_query", pb.apiary_pb2_grpc.NegotiationRoomQueryServiceStub
        )
        return cast("apiary_pb2_grpc.NegotiationRoomQueryServiceAsyncStub", stub)

    @property
    def activity_buffer(self) -> apiary_pb2_grpc.ActivityBufferServiceAsyncStub:
        """apiary.v1.ActivityBufferService: in-flight work."""
        stub = self._stub("activity_buffer", pb.apiary_pb2_grpc.ActivityBufferServiceStub)
        return cast("apiary_pb2_grpc.ActivityBufferServiceAsyncStub", stub)

    @property
    def handoff_query(self) -> apiary_pb2_grpc.HandoffQueryServiceAsyncStub:
        """apiary.v1.HandoffQueryService: list and read handoffs."""
        stub = self._stub("handoff_query", pb.apiary_pb2_grpc.HandoffQueryServiceStub)
        return cast("apiary_pb2_grpc.HandoffQueryServiceAsyncStub", stub)

    @property
    def negotiation_operator(self) -> apiary_pb2_grpc.NegotiationOperatorServiceAsyncStub:
        """apiary.v1.NegotiationOperatorService: open with a profile, list and inspect."""
        stub = self._stub("negotiation_operator", pb.apiary_pb2_grpc.NegotiationOperatorServiceStub)
        return cast("apiary_pb2_grpc.NegotiationOperatorServiceAsyncStub", stub)

    @property
    def worktree_binding(self) -> apiary_pb2_grpc.WorktreeBindingServiceAsyncStub:
        """apiary.v1.WorktreeBindingService: bind with a branch, list, revoke switches."""
        stub = self._stub("worktree_binding", pb.apiary_pb2_grpc.WorktreeBindingServiceStub)
        return cast("apiary_pb2_grpc.WorktreeBindingServiceAsyncStub", stub)

    @property
    def tool_provider(self) -> apiary_pb2_grpc.ToolProviderServiceAsyncStub:
        """apiary.v1.ToolProviderService: list providers, register MCP servers."""
        stub = self._stub("tool_provider", pb.apiary_pb2_grpc.ToolProviderServiceStub)
        return cast("apiary_pb2_grpc.ToolProviderServiceAsyncStub", stub)

    @property
    def agent_control(self) -> apiary_pb2_grpc.AgentControlServiceAsyncStub:
        """apiary.v1.AgentControlService: suspend and resume agents."""
        stub = self._stub("agent_control", pb.apiary_pb2_grpc.AgentControlServiceStub)
        return cast("apiary_pb2_grpc.AgentControlServiceAsyncStub", stub)

    @property
    def task_query(self) -> apiary_pb2_grpc.TaskQueryServiceAsyncStub:
        """apiary.v1.TaskQueryService: submit with a handle, wait for and watch results,
        list, read and cancel Scheduler tasks."""
        stub = self._stub("task_query", pb.apiary_pb2_grpc.TaskQueryServiceStub)
        return cast("apiary_pb2_grpc.TaskQueryServiceAsyncStub", stub)

    @property
    def workflow_query(self) -> apiary_pb2_grpc.WorkflowQueryServiceAsyncStub:
        """apiary.v1.WorkflowQueryService: list workflows, cancel one, read a run's history."""
        stub = self._stub("workflow_query", pb.apiary_pb2_grpc.WorkflowQueryServiceStub)
        return cast("apiary_pb2_grpc.WorkflowQueryServiceAsyncStub", stub)
