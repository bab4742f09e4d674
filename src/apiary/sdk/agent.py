"""`apiary.Agent`: an agent process's runtime, with handlers and automatic acknowledgements.

    class Reviewer(apiary.Agent):
        agent_id = "reviewer"
        capabilities = ("review",)

        async def on_data(self, msg: apiary.Message) -> str:
            verdict = check(msg.json())
            await msg.reply({"verdict": verdict})
            return "reviewed"                      # the FULFILLED ACK's note

        async def on_task(self, task: apiary.TaskContext) -> None:
            for step in task.json()["steps"]:
                await self.safe_point()            # yields here when preempted (RFC 7.2)
                async with self.non_preemptible(max_duration=2.0):
                    ...                            # a transaction
                await task.progress(0.5)

    asyncio.run(Reviewer(coordinator="127.0.0.1:50051").run())   # or: apiary agent run mod:Reviewer

`run()` registers (INITIALIZING: `setup()` runs first), reads the inbound stream (resuming
after a reconnect, re-registering when the coordinator restarted), answers heartbeats, runs
the Scheduler's tasks through `on_task` (with activity entries and preemption; sdk/tasks.py)
and every other message through its handler: `on_<message type>` (on_data, on_control,
on_notification, on_tool_call, on_worktree_control, ...) or one given to `handle()`.

Each handled message is acknowledged automatically: RECEIVED when it arrives (unless
`ack_received` is False), READ when its handler starts, then FULFILLED when the handler returns
(its str result is the note), REJECTED when it raises `Rejected` or a refusal error
(validation_error, permission_denied, unsupported_message_type, oversize_payload), FAILED with
the error code for any other `ApiaryError` and internal_error for anything else. A message
with no handler is REJECTED unsupported_message_type. ACKs addressed to this agent go to
`on_acknowledgement` when defined.

Handoffs (RFC 17.6; sdk/handoff.py): an offer addressed to this agent goes to
`on_handoff(offer)` (returning accepts it, raising `Rejected` or any error rejects it with that
reason; without the method offers are left to expire), its completion to
`on_handoff_completed(handoff)` with the transferred context; `handoff(...)` hands work off
and returns a ticket to wait on and complete. Pending offers are also asked for with
GetPendingHandoffs at start and every `handoff_poll_s`.

Graceful shutdown (RFC 8.1 SHUTTING_DOWN): `shutdown()` (SIGTERM under `apiary agent run`) or
the Scheduler's `shutdown` command stops the intake, lets running handlers finish within
`shutdown_grace_s`, runs `teardown()` and deregisters.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from google.protobuf.duration_pb2 import Duration

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.errors import (
    AlreadyInProgressError,
    ApiaryError,
    DuplicateDetectedError,
    NoRouteError,
    OversizePayloadError,
    PermissionDeniedError,
    UnsupportedMessageTypeError,
    ValidationError,
)
from apiary.sdk.client import Client
from apiary.sdk.connection import JSON, Connection, Delivery
from apiary.sdk.credentials import COORDINATOR_ENV, DEFAULT_COORDINATOR
from apiary.sdk.handoff import HandoffClient, HandoffDesk, HandoffTicket
from apiary.sdk.tasks import TaskContext, TaskRunner, current_task
from apiary.sdk.tools import ToolClient
from apiary.sdk.tracing import NO_SPAN, continued
from apiary.sdk.workspace import BOUND_STATES, Workspace, workspace_from
from apiary.wire import pb
from apiary.wire.convert import ack_from_payload

if TYPE_CHECKING:
    from apiary.sdk.trace_spans import AgentSpan

log = logging.getLogger("apiary.sdk.agent")

COORDINATOR = "coordinator"
"""The coordinator's own participant id (producer of its notices)."""
_REFUSALS = (
    ValidationError.code,
    PermissionDeniedError.code,
    UnsupportedMessageTypeError.code,
    OversizePayloadError.code,
)


class Rejected(Exception):  # noqa: N818 - names the ACK stage it produces
    """Raise from a handler to acknowledge its message REJECTED with `code` and `note`."""

    def __init__(self, code: str = ValidationError.code, note: str = "") -> None:
        super().__init__(f"{code}: {note}" if note else code)
        self.code = code
        self.note = note


@dataclass(frozen=True, slots=True)
class Message:
    """One inbound message as a handler sees it."""

    agent: Agent
    delivery: Delivery
    _replies: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    """Numbers this handling's replies: their idempotency tokens (see `reply`)."""

    @property
    def envelope(self) -> Envelope:
        return self.delivery.envelope

    @property
    def message_type(self) -> MessageType:
        return self.envelope.message_type

    @property
    def producer_id(self) -> str:
        return self.envelope.producer_id

    @property
    def correlation_id(self) -> str:
        return self.envelope.correlation_id

    @property
    def payload(self) -> bytes:
        return self.envelope.payload

    @property
    def content_type(self) -> str:
        return self.envelope.content_type

    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload decoded as JSON; Rejected validation_error when it is not JSON."""
        try:
            return json.loads(self.payload) if self.payload else None
        except ValueError as exc:
            raise Rejected(ValidationError.code, f"payload is not JSON: {exc}") from None

    async def reply(
        self,
        body: Any,
        *,
        message_type: MessageType = MessageType.DATA,
        content_type: str = JSON,
    ) -> Envelope | None:
        """Send `body` back to the producer, in the same correlation; returns the reply.

        A producer that is not a registered agent has no inbox to answer to (`apiary send`
        without --wait, an application's one-way send, an agent gone since): the coordinator
        refuses the reply with no_route, which is logged here and returns None, so that the
        handler goes on and its message is not failed for it (docs/decisions.md).

        Delivery is at least once: a message delivered again (its ACK deadline passed, the
        stream was lost before the ACK) runs its handler again. The n-th reply of a handling
        carries the idempotency token `<agent>:reply:<message_id>.<n>`, so the coordinator
        admits it once however often the message is handled; a repeat is refused
        duplicate_detected (or already_in_progress), logged here, and returns None."""
        token = f"{self.agent.agent_id}:reply:{self.envelope.message_id}.{next(self._replies)}"
        try:
            return await self.agent.send(
                self.producer_id, body, message_type=message_type, content_type=content_type,
                correlation_id=self.correlation_id, idempotency_token=token,
            )  # fmt: skip
        except (DuplicateDetectedError, AlreadyInProgressError) as exc:
            log.info(
                "%s: the reply to %s was sent by an earlier handling of it (%s)",
                self.agent.agent_id, self.envelope.message_id, exc.code,
            )  # fmt: skip
            return None
        except NoRouteError as exc:
            log.warning(
                "%s: the reply to %s in %s is not delivered: %s is not a registered agent (%s)",
                self.agent.agent_id, self.envelope.message_id, self.correlation_id,
                self.producer_id, exc.message,
            )  # fmt: skip
            return None


MessageHandlerFn = Callable[[Message], Awaitable[object]]


class Agent(Connection):
    """An agent: subclass it (class attributes give the defaults) or give handlers to
    `handle()`. Construct with the same arguments as `Connection`; `coordinator` defaults to
    $APIARY_COORDINATOR, then 127.0.0.1:50051."""

    agent_id: str = ""
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    capabilities: ClassVar[Sequence[str]] = ()
    modalities: ClassVar[Sequence[str]] = (JSON, "text/plain")
    communication_class: ClassVar[str] = "STANDARD"
    ack_received: ClassVar[bool] = True
    """Acknowledge RECEIVED on arrival (one more ACK per message)."""
    concurrency: ClassVar[int] = 1
    """Messages (not tasks) handled at once; 1 keeps their arrival order."""
    task_concurrency: int | None = 1
    """Scheduler tasks run at once (`on_task` handlers), declared at registration: the
    Scheduler keeps that many in flight to the agent, plus its prefetch (docs/scheduler.md).
    None declares nothing (one at a time, nothing prefetched)."""
    shutdown_grace_s: ClassVar[float] = 30.0
    handoff_poll_s: ClassVar[float] = 30.0
    """How often to ask for pending handoff offers (0: only at start)."""

    def __init__(
        self, agent_id: str | None = None, *, coordinator: str | None = None, **options: Any
    ) -> None:
        chosen = agent_id or type(self).agent_id
        if not chosen:
            raise ValueError(f"{type(self).__name__} needs an agent_id (argument or attribute)")
        cls = type(self)
        defaults: dict[str, Any] = {
            "name": cls.name, "description": cls.description,
            "capabilities": cls.capabilities, "modalities": cls.modalities,
            "communication_class": cls.communication_class,
            "task_concurrency": cls.task_concurrency,
        }  # fmt: skip
        super().__init__(
            chosen,
            coordinator=coordinator or os.environ.get(COORDINATOR_ENV) or DEFAULT_COORDINATOR,
            **{**defaults, **options},
        )
        self._handlers: dict[MessageType, MessageHandlerFn] = {}
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._runner: TaskRunner | None = None
        self._stopping = asyncio.Event()
        self._client: Client | None = None
        self._tools: ToolClient | None = None
        self._workspace: Workspace | None = None
        self._desk: HandoffDesk | None = None

    # ------------------------------------------------------------------ handlers

    def handle(self, message_type: MessageType, handler: MessageHandlerFn) -> None:
        """Handle `message_type` with `handler` (instead of an `on_<type>` method)."""
        self._handlers[message_type] = handler

    def handler_for(self, message_type: MessageType) -> MessageHandlerFn | None:
        given = self._handlers.get(message_type)
        if given is not None:
            return given
        method = getattr(self, f"on_{message_type.name.lower()}", None)
        return method if callable(method) else None

    async def on_task(self, task: TaskContext) -> object:
        """A Scheduler task; without an override, tasks fail unsupported_message_type."""
        raise UnsupportedMessageTypeError(f"{self.agent_id} runs no tasks (no on_task)")

    async def on_worktree_control(self, msg: Message) -> str:
        """The coordinator's notices about this agent's worktree binding (docs/worktrees.md):
        `workspace` follows them (gone once the agent is no longer bound). Override to act
        on them; requests from other agents are refused."""
        if msg.producer_id != COORDINATOR:
            raise Rejected(
                UnsupportedMessageTypeError.code, "WORKTREE_CONTROL is the coordinator's"
            )
        body = msg.json() or {}
        state = str(body.get("state", ""))
        if self._workspace is not None and state and state not in BOUND_STATES:
            self._workspace.close()
            self._workspace = None
        return f"binding {state or 'unchanged'}"

    async def setup(self) -> None:
        """Runs once registered, before any message is handled (RFC 8.1 INITIALIZING)."""

    async def teardown(self) -> None:
        """Runs during a graceful shutdown, after the last handler, before deregistering."""

    # ------------------------------------------------------------------ inside tasks

    async def safe_point(self) -> None:
        """A safe point of the task running in this coroutine (see TaskContext.safe_point);
        outside a task it only yields to the event loop."""
        task = current_task()
        if task is None:
            await asyncio.sleep(0)
        else:
            await task.safe_point()

    def non_preemptible(
        self, max_duration: float | None = None
    ) -> AbstractAsyncContextManager[None]:
        """A non-preemptible section of the task running in this coroutine (RFC 7.2)."""
        task = current_task()
        if task is None:
            raise RuntimeError("non_preemptible() is only meaningful inside a task handler")
        return task.non_preemptible(max_duration)

    async def progress(self, fraction: float, note: str = "") -> None:
        """Report the running task's progress to the Scheduler (RFC 8.1)."""
        task = current_task()
        if task is None:
            raise RuntimeError("progress() is only meaningful inside a task handler")
        await task.progress(fraction, note)

    @property
    def client(self) -> Client:
        """Typed clients of every service over this agent's channel, calling as this agent."""
        if self._client is None:
            self._client = Client(self.channel, agent_id=self.agent_id)
        return self._client

    @property
    def tools(self) -> ToolClient:
        """Tool calls as this agent (docs/tools.md): `await agent.tools.call(name, args)`."""
        if self._tools is None:
            self._tools = ToolClient(self.channel, self.agent_id)
        return self._tools

    # ------------------------------------------------------------------ worktree

    @property
    def workspace(self) -> Workspace | None:
        """The worktree bound by `bind_worktree`, or None."""
        return self._workspace

    async def bind_worktree(
        self, repo_id: str, worktree_id: str, *, branch: str = "", commit_sha: str = ""
    ) -> Workspace:
        """BIND this agent's home worktree (a real git worktree; RFC 16) and return it with
        a confined file API. A failed bind raises its reason's error (worktree_not_found,
        worktree_locked, permission_denied, filesystem_error)."""
        request = pb.apiary_pb2.BindWorktreeRequest(
            agent_id=self.agent_id, repo_id=repo_id, worktree_id=worktree_id, branch=branch,
            commit_sha=commit_sha,
        )  # fmt: skip
        binding = await self.client.worktree_binding.Bind(request)
        if self._workspace is not None:
            self._workspace.close()
        self._workspace = workspace_from(binding)
        return self._workspace

    async def unbind_worktree(self) -> None:
        """UNBIND (the git worktree stays on disk for a later BIND)."""
        request = pb.worktree_pb2.UnbindRequest(agent_id=self.agent_id)
        await self.client.worktree.Unbind(request)
        if self._workspace is not None:
            self._workspace.close()
            self._workspace = None

    # ------------------------------------------------------------------ handoffs

    @property
    def handoffs(self) -> HandoffClient:
        """The handoff calls (request, accept, reject, complete, pending, get) as this agent."""
        return self._handoff_desk().client

    async def handoff(self, to_agent: str = "", **request: Any) -> HandoffTicket:
        """Hand work off (RFC 17.6): `request` as for `HandoffClient.request` (context,
        content_type, reason, capabilities, priority, timeout_s, request_id). The ticket
        follows the coordinator's notifications: `await ticket.outcome()`, then
        `await ticket.complete()` once this agent stopped work on the context."""
        desk = self._handoff_desk()
        request_id = str(request.pop("request_id", "") or self._ids.new_id())
        ticket = desk.ticket(request_id)  # before the call: its notices may come first
        await desk.client.request(to_agent, request_id=request_id, **request)
        return ticket

    def _handoff_desk(self) -> HandoffDesk:
        if self._desk is None:
            self._desk = HandoffDesk(
                HandoffClient(self.channel, self.agent_id),
                getattr(self, "on_handoff", None),
                getattr(self, "on_handoff_completed", None),
                _reason,
            )
        return self._desk

    # ------------------------------------------------------------------ running

    async def run(self, *, on_registered: Callable[[], object] | None = None) -> None:
        """Register, set up, handle messages and tasks until shut down; then deregister.
        `on_registered` is called once the agent is registered, before `setup()`."""
        await self.start()
        if on_registered is not None:
            on_registered()
        reason = "shutdown"
        try:
            await self.setup()
            self._runner = TaskRunner(self, self.on_task, on_message=self._enqueue, reconnect=True)
            await self._serve(self._runner)
        except BaseException as exc:
            reason = f"agent failed: {type(exc).__name__}"
            raise
        finally:
            with contextlib.suppress(ApiaryError):
                await self.stop(reason)

    async def shutdown(self) -> None:
        """Ask `run()` to stop gracefully (safe from a signal handler's callback)."""
        self._stopping.set()

    async def _serve(self, runner: TaskRunner) -> None:
        workers = [asyncio.ensure_future(self._work()) for _ in range(max(1, self.concurrency))]
        workers.append(asyncio.ensure_future(self._handoff_desk().run(self.handoff_poll_s)))
        reader = asyncio.ensure_future(runner.run())
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # ended by the Scheduler's shutdown, or failed: raises
            else:
                await self._drain(runner, reader)
            await self._queue.join()
            await self.teardown()
        finally:
            for job in (*workers, reader, stopper):
                job.cancel()
            await asyncio.gather(*workers, reader, stopper, return_exceptions=True)

    async def _drain(self, runner: TaskRunner, reader: asyncio.Future[None]) -> None:
        """SHUTTING_DOWN on the agent's own initiative: ask the Scheduler to shut this agent
        down (no new tasks; RFC 8.4) and let the running task finish within the grace."""
        grace = Duration()
        grace.FromMilliseconds(int(self.shutdown_grace_s * 1000))
        request = pb.scheduler_pb2.ShutdownAgentRequest(agent_id=self.agent_id, grace_period=grace)
        try:
            await self.client.scheduler.ShutdownAgent(request)
        except ApiaryError as exc:  # the coordinator is gone: finish what runs, then stop
            log.warning("%s: the Scheduler did not take the shutdown: %s", self.agent_id, exc)
            runner.shutdown_requested.set()
        done, _ = await asyncio.wait({reader}, timeout=self.shutdown_grace_s)
        if not done and runner.running:
            log.warning("%s: shut down with task(s) %s unfinished", self.agent_id, runner.running)

    async def _enqueue(self, delivery: Delivery) -> None:
        env = delivery.envelope
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            await self._on_ack(delivery)
            return
        if delivery.notice:
            await self._on_notice(delivery)
            return
        if self.ack_received:
            await self._ack(env, AckStage.RECEIVED)
        self._queue.put_nowait(delivery)

    async def _work(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self._handle(delivery)
            except Exception:  # a failed ACK must not stop the worker
                log.exception("%s: handling %s failed", self.agent_id, delivery.envelope.message_id)
            finally:
                self._queue.task_done()

    async def _handle(self, delivery: Delivery) -> None:
        env = delivery.envelope
        handler = self.handler_for(env.message_type)
        if handler is None:
            await self._ack(
                env, AckStage.REJECTED, UnsupportedMessageTypeError.code,
                f"{self.agent_id} has no handler for {env.message_type.name}",
            )  # fmt: skip
            return
        # With a trace context (the coordinator traces), the handling is a span of its trace,
        # and what the handler sends (its ACKs too) carries the trace on (docs/tracing.md).
        with _handling(self, delivery) as span:
            await self._ack(env, AckStage.READ)
            stage, code, note = await _outcome(handler, Message(self, delivery))
            if span is not None and code:
                span.fail(code, note)
            await self._ack(env, stage, code, note)

    async def _on_notice(self, delivery: Delivery) -> None:
        """A coordinator notice: handoff events update the handoff desk; every notice goes to
        `on_notification` (if any); notices are never acknowledged."""
        try:
            body = json.loads(delivery.envelope.payload or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict) and str(body.get("event", "")).startswith("handoff."):
            self._handoff_desk().notice(body)
        handler = self.handler_for(MessageType.NOTIFICATION)
        if handler is None:
            return
        try:
            await handler(Message(self, delivery))
        except Exception:
            log.exception("%s: on_notification failed", self.agent_id)

    async def _on_ack(self, delivery: Delivery) -> None:
        handler = getattr(self, "on_acknowledgement", None)
        if not callable(handler):
            return
        env = delivery.envelope
        try:
            ack = ack_from_payload(env.content_type, env.payload)
        except (ApiaryError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable ACK %s: %s", self.agent_id, env.message_id, exc)
            return
        await handler(ack, env)

    async def _ack(self, env: Envelope, stage: AckStage, code: str = "", note: str = "") -> None:
        try:
            await self.ack(env, stage, error_code=code, note=note)
        except ApiaryError as exc:
            log.warning(
                "%s could not ACK %s %s: %s", self.agent_id, env.message_id, stage.name, exc
            )


def _handling(agent: Connection, delivery: Delivery) -> AbstractContextManager[AgentSpan | None]:
    """The span of the agent's handling of `delivery`, when it carries a trace context."""
    if delivery.trace is None:
        return NO_SPAN
    env = delivery.envelope
    attributes = {
        "messaging.system": "sw4rm", "messaging.operation.name": "process",
        "messaging.message.id": env.message_id,
        "messaging.message.conversation_id": env.correlation_id,
        "messaging.destination.name": agent.agent_id, "apiary.producer_id": env.producer_id,
        "apiary.message_type": env.message_type.name,
    }  # fmt: skip
    return continued(delivery.trace, f"process {env.message_type.name}", attributes)


def _reason(exc: BaseException) -> str:
    """The rejection reason of a refused handoff offer."""
    if isinstance(exc, Rejected):
        return exc.note or exc.code
    if isinstance(exc, ApiaryError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


async def _outcome(handler: MessageHandlerFn, message: Message) -> tuple[AckStage, str, str]:
    """Run `handler` and map its end to an ACK stage, error code and note."""
    try:
        result = await handler(message)
    except Rejected as exc:
        return AckStage.REJECTED, exc.code, exc.note
    except ApiaryError as exc:
        stage = AckStage.REJECTED if exc.code in _REFUSALS else AckStage.FAILED
        return stage, exc.code, exc.message
    except Exception as exc:
        log.exception("handler of %s failed", message.envelope.message_id)
        return AckStage.FAILED, "internal_error", f"{type(exc).__name__}: {exc}"
    return AckStage.FULFILLED, "", result if isinstance(result, str) else ""


__all__ = ["Ack", "Agent", "Message", "Rejected"]
