"""Running Scheduler tasks in an agent (RFC 7.2; docs/scheduler.md, "The agent's side").

    async def handler(task: TaskContext) -> str | None:
        for step in task.json()["steps"]:
            await task.safe_point()        # yields here once a preemption was requested
            ...                            # one discrete operation
        async with task.non_preemptible(max_duration=2.0):
            ...                            # a transaction: preemption waits (2 s at most)
        return {"fixed": 3}                # the task's result: any JSON value

    async with Connection("coder-1", coordinator=address) as agent:
        await TaskRunner(agent, handler).run()

The runner reads the agent's deliveries. A DATA envelope from producer `scheduler` is a task:
it is acknowledged READ (the task becomes RUNNING) and its handler starts as its own asyncio
task at once (a READ the coordinator refuses cancels it: the task was taken back),
up to `concurrency` of them at once (the `task_concurrency` the agent declared, 1 by default;
a task that arrives while that many run waits, and starts when one ends: the Scheduler's
prefetch (one that waits RECEIVED_AFTER_S is acknowledged RECEIVED, lazily: with the next
READ or end, sdk/task_acks.py; one that starts before has its READ stand for it); a
preempt_request, terminate or kill for it ends it at once, yielded or forced, without
running it),
and its end is acknowledged: FULFILLED with the handler's return value as the task's result
(what the submitter's `TaskHandle.result()` returns, the output of a workflow node), FULFILLED
`yielded` when it raised `Preempted` at a safe point, FAILED with the code and message of
the ApiaryError it raised (`TaskFailedError` for a code of the handler's own;
internal_error for any other exception). A result or failure that fits in the ACK's note
(4 KB) travels in it (core/tasks/result.py); a larger one goes first through
TaskQueryService.CompleteTask (up to the coordinator's `task_result_bytes`, 1 MiB by
default; past it the task fails with oversize_payload, which the runner logs).

CONTROL envelopes from `scheduler` are handled while the handler runs, and each is ACKed
FULFILLED: `preempt_request` flags the task (its next `safe_point()` raises `Preempted`),
`terminate` cancels the handler (ACK FULFILLED `terminated` once it stopped), `kill` cancels
it and ACKs FAILED `forced_preemption` at once, abandoning a handler that ignores
cancellation; `suspend` holds the task at its next `safe_point()` (its state stays in
memory) until `resume`, which reports the agent RUNNING and lets it go on; `shutdown` ends
`run()` once no task is left; `recover` reports the agent RUNNABLE (heartbeat) once no task is
left. Other messages go to `on_message`, or are ACKed FULFILLED when there is none.

Each task's activity entry (RFC 10) exists before its handler starts: the coordinator
registers it as it dispatches the task, and completes it when the task ends or goes back to
its queue (a yield); the buffer is advisory and does not hold the handler back (RFC 10: it
MUST NOT block execution). The coordinator records the task RUNNING, and the agent RUNNING
(RFC 8), once it applies the READ, which may land a few ms after the handler started: the
context's calls to the coordinator (`waiting`, `progress`, sections, model reports) wait for
the READ to be taken first, and `TaskContext.started()` waits for it for anything else.
`current_task()` is the task inside its handler.

The ACKs travel over the agent's streaming sender (`Connection.ack_soon`, sdk/task_acks.py):
those queued while a frame is in flight go together in the next, in order. A READ is lazy:
it waits for the task's end, or another eager ACK, for LAZY_S at most, so a task that ends
soon is one frame (its READ and its end) and one commit at the coordinator; a task's end and
the next task's READ (a prefetched one, started as soon as a slot frees) travel together too.
An end is sent again only after its READ was taken, so the coordinator never sees it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.runtime.turns import is_interrupt
from apiary.core.tasks.capacity import PREFETCHED_RECEIVED_AFTER_S
from apiary.core.trace_context import TraceContext
from apiary.errors import ApiaryError
from apiary.sdk.connection import Connection, Delivery
from apiary.sdk.errors import CoordinatorUnreachableError, TaskFailedError
from apiary.sdk.model_reports import ModelReporter
from apiary.sdk.task_outcome import (
    YIELDED,
    Outcome,
    complete,
    fits,
    forced_outcome,
    result_outcome,
)
from apiary.sdk.tracing import NO_SPAN, started

if TYPE_CHECKING:
    from apiary.sdk.trace_spans import AgentSpan

log = logging.getLogger("apiary.sdk.tasks")

SCHEDULER = "scheduler"
CANCELLED = "cancelled"
"""The error code of a task stopped by an interrupt (see `Preempted`)."""
"""The Scheduler's participant id: producer of tasks and commands, recipient of sections."""
_EARLY_LIMIT = 1000
ACK_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0)
"""Pauses before acknowledging again after an `unavailable` answer (about 10 s in all)."""


class Preempted(Exception):  # noqa: N818 - a signal, not an error
    """Raised by `TaskContext.safe_point` once the Scheduler asked the task to yield.

    Let it propagate out of the handler: the runner acknowledges the task FULFILLED with note
    `yielded`, and the Scheduler puts it back in its queue (it keeps its place) to run again
    later, from the start, as a new attempt. A preemption whose reason starts with
    `interrupt:` (the runtime control plane's interrupt_turn) asks the task to stop instead:
    the runner fails it with `cancelled`, and it does not run again.
    """

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id} preempted: {reason}" if reason else task_id)
        self.task_id = task_id
        self.reason = reason


class TaskContext:
    """One task attempt as the handler sees it."""

    def __init__(self, agent: Connection, envelope: Envelope) -> None:
        self.agent = agent
        self.envelope = envelope
        self.task_id = envelope.correlation_id
        self.params = envelope.payload
        self.content_type = envelope.content_type
        self.attempt = _attempt(envelope.idempotency_token)
        """1 for the first dispatch; a yielded or retried task comes back with the next."""
        self.model = ModelReporter(self._command)
        """Model and reasoning progress reported from this task (sdk/model_reports.py)."""
        self._preempt_reason: str | None = None
        self._read: asyncio.Future[bool] | None = None
        """The answer to the task's READ, sent as the handler starts (`started`)."""
        self._in_section = False
        self._resumed = asyncio.Event()
        self._resumed.set()

    def json(self) -> Any:
        """The params decoded as JSON (None when there are none)."""
        return json.loads(self.params) if self.params else None

    async def started(self) -> bool:
        """Wait until the coordinator took the task's READ: from then it records the task
        RUNNING and its agent RUNNING (RFC 8). True then; False when it refused it (the task
        was taken back or cancelled meanwhile: the runner is cancelling the handler).

        The handler starts as soon as the task arrives, before its READ is answered (the
        READ travels lazily: with the task's end when the handler ends within 10 ms, one
        frame and one commit). Its activity entry (RFC 10) exists already (registered at
        dispatch). The context's own calls to the coordinator (`waiting`, `progress`,
        sections, model reports) wait for the READ themselves; a handler that asks the
        coordinator about its task or agent otherwise calls this first."""
        read = self._read
        if read is None:
            return True
        if not read.done():
            self.agent.acks_now()  # someone waits for it: no reason to wait for the end
        # Shielded: a handler cancelled while it waits must not cancel the runner's READ.
        return await asyncio.shield(read)

    async def _after_read(self) -> None:
        """Before a call to the coordinator about this task: its READ taken (`started`),
        so that the coordinator sees the call after the task's start. A refused READ
        cancels the handler (the runner does too)."""
        if not await self.started():
            raise asyncio.CancelledError(f"task {self.task_id}: its READ was refused")

    @property
    def preempt_requested(self) -> bool:
        """Whether the Scheduler asked this task to yield (see `safe_point`)."""
        return self._preempt_reason is not None

    @property
    def in_section(self) -> bool:
        return self._in_section

    async def safe_point(self) -> None:
        """A point where the task's state is consistent (RFC 7.2): raises `Preempted` when a
        preemption was requested, unless inside a non-preemptible section (the request waits
        for the next safe point after it). Call it between discrete operations."""
        await asyncio.sleep(0)  # let the runner read the commands that arrived
        if not self._resumed.is_set():  # SUSPENDED: wait here, state kept, until resumed
            await self._resumed.wait()
        if self._preempt_reason is not None and not self._in_section:
            raise Preempted(self.task_id, self._preempt_reason)

    @property
    def suspended(self) -> bool:
        """Whether the Scheduler suspended the agent (see `safe_point`)."""
        return not self._resumed.is_set()

    def waiting(self, *, resources: bool = False) -> AbstractAsyncContextManager[None]:
        """Declare that the task waits for an external event (RFC 8.1 WAITING), or for
        resources (WAITING_RESOURCES with `resources`), for the duration of the block:

            async with task.waiting():
                reply = await inbox.get()      # execution is suspended until it arrives

        The agent keeps its task assignment; the Scheduler sees the agent's state change
        and, for WAITING_RESOURCES, applies its 300 s resource timeout."""
        return self._waiting("WAITING_RESOURCES" if resources else "WAITING")

    @contextlib.asynccontextmanager
    async def _waiting(self, state: str) -> AsyncIterator[None]:
        await self._after_read()  # WAITING is a RUNNING agent's state (RFC 8.1)
        await self.agent.heartbeat(state)
        try:
            yield
        finally:
            with contextlib.suppress(ApiaryError):  # gone meanwhile: nothing to report
                await self.agent.heartbeat("RUNNING")

    def non_preemptible(
        self, max_duration: float | None = None
    ) -> AbstractAsyncContextManager[None]:
        """A non-preemptible section of at most `max_duration` seconds (RFC 7.2: required).

        The Scheduler defers preemption while the section lasts, and no longer than its
        maximum: past it, preemption proceeds (by force if the task does not yield). Sections
        do not nest, and are for short critical work: the coordinator refuses one declared
        longer than its `preemption.max_section_s` (300 s by default) with a ValidationError
        naming `max_duration_ms`. ValueError unless `max_duration` is a positive, finite
        number.
        """
        if (
            isinstance(max_duration, bool)
            or not isinstance(max_duration, int | float)
            or not 0 < max_duration < math.inf
        ):
            raise ValueError(
                "a non-preemptible section needs a positive, finite max_duration (seconds), "
                f"not {max_duration!r}"
            )
        return self._section(max(1, math.ceil(max_duration * 1000)))

    async def progress(self, fraction: float, note: str = "") -> None:
        """Report progress (0.0-1.0) to the Scheduler, which records it (RFC 8.1: RUNNING
        agents communicate progress). ValueError outside 0..1."""
        if isinstance(fraction, bool) or not 0.0 <= float(fraction) <= 1.0:
            raise ValueError(f"progress is a fraction between 0 and 1, not {fraction!r}")
        await self._command("progress", fraction=float(fraction), note=note)

    @contextlib.asynccontextmanager
    async def _section(self, max_duration_ms: int) -> AsyncIterator[None]:
        if self._in_section:
            raise RuntimeError(f"task {self.task_id}: non-preemptible sections do not nest")
        await self._command("enter_section", max_duration_ms=max_duration_ms)
        self._in_section = True
        try:
            yield
        except asyncio.CancelledError:
            self._in_section = False  # terminated: the task ends; nothing to declare
            raise
        except BaseException:
            self._in_section = False
            await self._leave()
            raise
        self._in_section = False
        await self._leave()

    async def _leave(self) -> None:
        try:
            await self._command("leave_section")
        except ApiaryError as exc:  # the task may have ended meanwhile (forced preemption)
            log.info("task %s: leave_section refused: %s", self.task_id, exc)

    async def _command(self, command: str, **fields: Any) -> None:
        await self._after_read()  # the Scheduler takes commands for a RUNNING task
        env = self.agent.envelope(
            {"command": command, "task_id": self.task_id, **fields},
            message_type=MessageType.CONTROL,
            correlation_id=self.task_id,
        )
        await self.agent.send_envelope(env, SCHEDULER)

    def _suspend(self) -> None:
        self._resumed.clear()

    def _resume(self) -> None:
        self._resumed.set()

    def _request_preempt(self, reason: str) -> None:
        if self._preempt_reason is None:
            self._preempt_reason = reason or "preempt_request"


_CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "apiary_current_task", default=None
)


def current_task() -> TaskContext | None:
    """The task whose handler is running in the calling coroutine (None outside one)."""
    return _CURRENT.get()


Handler = Callable[[TaskContext], Awaitable[object]]
MessageHandler = Callable[[Delivery], Awaitable[None]]


@dataclass(slots=True)
class _Running:
    context: TaskContext
    handler: asyncio.Task[object]
    stop: str = ""
    """"terminate" or "kill" once the Scheduler forced the task."""
    ended: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Done once the handler ended, or the task was killed (its handler abandoned)."""
    supervisor: asyncio.Task[None] | None = None
    span: AgentSpan | None = None
    """The task's span when its DATA carried a trace context (docs/tracing.md)."""
    read: asyncio.Future[bool] | None = None
    """Its READ's answer: True once taken, False once refused (the handler is cancelled
    and its end not reported: the task is not this agent's to run)."""

    def end(self, _: object = None) -> None:
        """The handler ended (a done callback), or the task was killed."""
        if not self.ended.done():
            self.ended.set_result(None)


class TaskRunner:
    """Runs the Scheduler's tasks for `agent` with `handler` (see the module docstring)."""

    def __init__(
        self,
        agent: Connection,
        handler: Handler,
        *,
        on_message: MessageHandler | None = None,
        reconnect: bool = False,
        report_recovery: bool = True,
        concurrency: int | None = None,
    ) -> None:
        """`concurrency`: how many tasks run at once (default: the `task_concurrency` the
        agent declared, else 1); a task that arrives while that many run waits, unread
        (ACK RECEIVED), for one to end: the Scheduler's prefetch (docs/scheduler.md)."""
        self.agent = agent
        self._handler = handler
        self._on_message = on_message
        self._reconnect = reconnect
        self._report_recovery = report_recovery
        declared = getattr(agent, "task_concurrency", None)
        self._concurrency = max(1, concurrency or declared or 1)
        self._running: dict[str, _Running] = {}
        self._waiting: OrderedDict[str, tuple[Envelope, TraceContext | None]] = OrderedDict()
        """Tasks that arrived while `concurrency` ran, in arrival order, not started."""
        self._early: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Commands for tasks whose DATA has not arrived yet (lanes may reorder them)."""
        self._recover_pending = False
        self._jobs: set[asyncio.Future[Any]] = set()
        """ACKs sent without waiting for them (RECEIVED of a prefetched task)."""
        self._stop = asyncio.Event()
        self.shutdown_requested = asyncio.Event()
        """Set when the Scheduler sent `shutdown` (RFC 8.4)."""

    @property
    def running(self) -> list[str]:
        """The ids of the tasks running now."""
        return list(self._running)

    @property
    def waiting(self) -> list[str]:
        """The ids of the tasks waiting for one of the running ones to end (prefetched)."""
        return list(self._waiting)

    async def run(self) -> None:
        """Until the inbound stream ends (or fails: the error propagates), or a shutdown
        command arrived and no task is left. Tasks still running are cancelled on the way out
        (unacknowledged: the coordinator settles them)."""
        reader = asyncio.ensure_future(self._read())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()
        finally:
            for item in (reader, stopper):
                item.cancel()
            await asyncio.gather(reader, stopper, return_exceptions=True)
            await self._abandon_all()

    async def _read(self) -> None:
        async for delivery in self.agent.deliveries(reconnect=self._reconnect):
            await self._on_delivery(delivery)

    async def _on_delivery(self, delivery: Delivery) -> None:
        env = delivery.envelope
        if env.producer_id == SCHEDULER and env.message_type is MessageType.DATA:
            await self._start(env, delivery.trace)
        elif env.producer_id == SCHEDULER and env.message_type is MessageType.CONTROL:
            await self._control(env)
        elif self._on_message is not None:
            await self._on_message(delivery)
        elif env.message_type is not MessageType.ACKNOWLEDGEMENT and not delivery.notice:
            await self._ack(env, AckStage.FULFILLED, note="not a task")

    # ------------------------------------------------------------------ tasks

    async def _start(self, env: Envelope, trace: TraceContext | None = None) -> None:
        context = TaskContext(self.agent, env)
        task_id = context.task_id
        current = self._running.get(task_id)
        if current is not None and current.context.envelope.message_id == env.message_id:
            return  # the same attempt again after a reconnect: it is running already
        queued = self._waiting.get(task_id)
        if queued is not None and queued[0].message_id == env.message_id:
            return  # waiting already
        if self._slots_taken() >= self._concurrency:
            # Prefetched: it waits here, unread, until a running task ends (`_next`).
            self._waiting[task_id] = (env, trace)
            # Acknowledged RECEIVED only if it still waits RECEIVED_AFTER_S from now (well
            # within the coordinator's 10 s ACK deadline); one that starts before has its
            # READ stand for it, so a prefetch costs no ACK of its own.
            loop = asyncio.get_running_loop()
            loop.call_later(RECEIVED_AFTER_S, self._received_if_waiting, task_id, env)
            return
        # It starts now, its READ queued first: lazily, so that a handler that ends soon
        # sends its READ and its end in one frame (one commit at the coordinator), and one
        # that runs on sends its READ after LAZY_S (sdk/task_acks.py). The handler does not
        # wait for the READ's answer; a refused READ cancels it (`_read_answered`).
        read = self._ack_soon(env, AckStage.READ, lazy=True)
        context._read = read
        early = self._early.pop(task_id, None)
        if early is not None and early[0] in ("terminate", "kill"):
            await self._ack(env, *forced_outcome(early[0]), after=read)
            return
        if early is not None:
            context._request_preempt(early[1])
        # With a trace context, the task's run (handler, activity and report) is a span of
        # its trace, current in the handler's and the supervisor's tasks (docs/tracing.md).
        span = started(trace, "run task", _attributes(context)) if trace is not None else None
        with span.within() if span is not None else NO_SPAN:
            token = _CURRENT.set(context)
            try:  # the handler's task copies the context: current_task() is this task there
                handler = asyncio.ensure_future(self._handler(context))
            finally:
                _CURRENT.reset(token)
            running = _Running(context, handler, span=span, read=read)
            handler.add_done_callback(running.end)
            self._running[task_id] = running
            read.add_done_callback(partial(self._read_answered, running))
            running.supervisor = asyncio.ensure_future(self._supervise(running))

    def _received_if_waiting(self, task_id: str, env: Envelope) -> None:
        """Acknowledge RECEIVED a prefetched task still waiting (`_start`); not waited for:
        the next deliveries are read meanwhile (a refusal is logged)."""
        waiting = self._waiting.get(task_id)
        if waiting is not None and waiting[0].message_id == env.message_id:
            self._keep(self._ack_soon(env, AckStage.RECEIVED, lazy=True))

    def _read_answered(self, running: _Running, read: asyncio.Future[bool]) -> None:
        """A refused READ (the task was taken back, cancelled, or is another attempt's now)
        stops the handler: its end is not reported."""
        if _refused(read):
            running.handler.cancel()

    async def _supervise(self, running: _Running) -> None:
        await running.ended
        # Killed while the handler ignores cancellation: abandon it.
        done = running.handler.done()
        outcome = _outcome(running) if done else Outcome(*forced_outcome("kill"))
        reported: asyncio.Future[Any] | None = None
        try:
            if _refused(running.read):
                log.info("task %s was not this agent's to run: its READ was refused",
                         running.context.task_id)  # fmt: skip
            else:
                # Queued behind its READ: both leave in one frame when the READ is still
                # waiting for one. (A yield's activity entry is closed by the coordinator.)
                reported = self._report(running.context, outcome, running.read)
        finally:
            if self._running.get(running.context.task_id) is running:
                del self._running[running.context.task_id]
            if running.span is not None:
                if outcome.code:
                    running.span.fail(outcome.code, outcome.note)
                running.span.end()
            # The next task starts now: its READ follows this one's end in the same frame.
            await self._next()
            if reported is not None:
                await reported
            await self._settled()

    async def _next(self) -> None:
        """Start the tasks waiting here while fewer than `concurrency` run."""
        while self._waiting and self._slots_taken() < self._concurrency:
            _, (env, trace) = self._waiting.popitem(last=False)
            await self._start(env, trace)

    def _slots_taken(self) -> int:
        """Tasks running."""
        return len(self._running)

    def _report(
        self, context: TaskContext, outcome: Outcome, read: asyncio.Future[bool] | None = None
    ) -> asyncio.Future[Any]:
        """Acknowledge the task's end, after its `read`: in the ACK when it fits (queued at
        once), else through CompleteTask first (sdk/task_outcome.py), once the READ is taken.
        Done once acknowledged (or given up)."""
        env = context.envelope
        if outcome.result is None and fits(env, outcome.stage, outcome.code, outcome.note):
            return self._ack_soon(env, outcome.stage, outcome.code, outcome.note, after=read)
        return asyncio.ensure_future(self._complete(context, outcome, read))

    async def _complete(
        self, context: TaskContext, outcome: Outcome, read: asyncio.Future[bool] | None
    ) -> None:
        if read is not None and not await read:  # CompleteTask is for a RUNNING task
            return
        stage, code, note = await complete(self.agent, context.task_id, outcome, context.attempt)
        await self._ack(context.envelope, stage, code, note)

    async def _settled(self) -> None:
        """No task may be left: finish a recovery or a shutdown that waited for it."""
        if self._running or self._waiting:
            return
        if self._recover_pending:
            self._recover_pending = False
            try:
                await self.agent.heartbeat("RUNNABLE")
            except ApiaryError as exc:
                log.warning("%s could not report its recovery: %s", self.agent.agent_id, exc)
        if self.shutdown_requested.is_set():
            self._stop.set()

    async def _abandon_all(self) -> None:
        jobs: list[asyncio.Future[Any]] = []
        for running in list(self._running.values()):
            running.handler.cancel()
            if running.supervisor is not None:
                running.supervisor.cancel()
                jobs.append(running.supervisor)
            jobs.append(running.handler)
        self._running.clear()
        self._waiting.clear()  # unread: the coordinator settles them
        # A handler that ignores cancellation is not waited for.
        if jobs:
            await asyncio.wait(jobs, timeout=1.0)

    # ------------------------------------------------------------------ commands

    async def _control(self, env: Envelope) -> None:
        try:
            body = json.loads(env.payload or b"{}")
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        command = str(body.get("command", ""))
        task_id = str(body.get("task_id") or "")
        running = self._running.get(task_id) if task_id else None
        # A command naming one dispatch (`message_id`: an attempt taken back from this agent)
        # leaves any other attempt of the task alone.
        attempt = str(body.get("message_id") or "")
        if running is not None and attempt and running.context.envelope.message_id != attempt:
            running = None
        queued = self._waiting.get(task_id) if task_id else None
        if queued is not None and attempt and queued[0].message_id != attempt:
            queued = None
        if command in ("preempt_request", "terminate", "kill"):
            reason = str(body.get("reason", ""))
            if queued is not None:
                await self._give_back(task_id, command, reason)
            elif running is None and task_id and not attempt:
                self._remember(task_id, command, reason)
            elif running is not None:
                self._force(running, command, reason)
        if command == "suspend":
            for item in self._running.values():
                item.context._suspend()
        await self._ack(env, AckStage.FULFILLED)
        if command == "resume":
            await self._resume_all()
        if command == "shutdown":
            self.shutdown_requested.set()
            await self._settled()
        elif command == "recover" and self._report_recovery:
            self._recover_pending = True
            await self._settled()

    async def _resume_all(self) -> None:
        """RESUMED: state restored (it never left memory); report RUNNING, then go on."""
        try:
            await self.agent.heartbeat("RUNNING")
        except ApiaryError as exc:
            log.warning("%s could not report its resumption: %s", self.agent.agent_id, exc)
        for item in self._running.values():
            item.context._resume()

    async def _give_back(self, task_id: str, command: str, reason: str) -> None:
        """A waiting task (never started) is preempted or forced: it yields at once (the
        Scheduler puts it back in its queue), or ends as forced."""
        env, _ = self._waiting.pop(task_id)
        if command != "preempt_request":
            await self._ack(env, *forced_outcome(command))
        elif is_interrupt(reason):
            await self._ack(env, AckStage.FAILED, CANCELLED, reason)
        else:
            await self._ack(env, AckStage.FULFILLED, note=YIELDED)
        await self._settled()

    def _force(self, running: _Running, command: str, reason: str) -> None:
        if command == "preempt_request":
            running.context._request_preempt(reason)
            return
        if running.stop != "kill":
            running.stop = command
        running.handler.cancel()
        if command == "kill":
            running.end()

    def _remember(self, task_id: str, command: str, reason: str) -> None:
        before = self._early.get(task_id)
        if before is None or _STRENGTH[command] > _STRENGTH[before[0]]:
            self._early[task_id] = (command, reason)
        while len(self._early) > _EARLY_LIMIT:
            self._early.popitem(last=False)

    async def _ack(
        self, env: Envelope, stage: AckStage, code: str = "", note: str = "",
        *, after: asyncio.Future[bool] | None = None,
    ) -> bool:  # fmt: skip
        """`_ack_soon`, waited for."""
        return await self._ack_soon(env, stage, code, note, after=after)

    def _ack_soon(
        self, env: Envelope, stage: AckStage, code: str = "", note: str = "",
        *, lazy: bool = False, after: asyncio.Future[bool] | None = None,
    ) -> asyncio.Future[bool]:  # fmt: skip
        """Acknowledge `env`, queued now behind the ACKs queued before it (sdk/task_acks.py;
        `lazy`: it waits for an eager one to carry it), and again after each `unavailable`
        answer (the coordinator could not store it, or cannot tell that it did: a repeated
        ACK is safe) or none at all (the coordinator, or the replica of a cluster, went away:
        the channel moves to the next address it has), ACK_RETRY_DELAYS_S apart, each time
        after `after` (the task's READ, sent again first) was taken. The future's result:
        True once taken, False (logged) once refused otherwise, those are spent, or `after`
        was refused. A task whose READ or end was never acknowledged would otherwise wait
        for its ACK forever."""
        first = self.agent.ack_soon(env, stage, error_code=code, note=note, lazy=lazy)
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        first.add_done_callback(
            partial(self._first_answered, env, stage, code, note, after, outcome)
        )
        return outcome

    def _first_answered(
        self, env: Envelope, stage: AckStage, code: str, note: str,
        after: asyncio.Future[bool] | None, outcome: asyncio.Future[bool],
        first: asyncio.Future[None],
    ) -> None:  # fmt: skip
        """`_ack_soon`'s first try answered: taken (as almost every ACK is, with no task of
        its own), or on to the tries after it (`_acked`)."""
        if outcome.done():
            return  # (nobody waits for it any more)
        if first.cancelled():
            outcome.cancel()
        elif first.exception() is None:
            outcome.set_result(True)
        else:
            tries = asyncio.ensure_future(self._acked(env, stage, code, note, first, after))
            tries.add_done_callback(partial(_pass_on, outcome))
            self._keep(tries)

    async def _acked(
        self, env: Envelope, stage: AckStage, code: str, note: str, sent: Awaitable[None],
        after: asyncio.Future[bool] | None,
    ) -> bool:  # fmt: skip
        delays = iter(ACK_RETRY_DELAYS_S)
        while True:
            try:
                await sent
            except ApiaryError as exc:
                unknown = exc.code == "unavailable" or isinstance(exc, CoordinatorUnreachableError)
                delay = next(delays, None) if unknown else None
                if delay is None:
                    log.warning(
                        "%s could not acknowledge %s %s: %s", self.agent.agent_id,
                        env.message_id, stage.name, exc,
                    )  # fmt: skip
                    return False
                if after is not None and not await after:
                    return False
                await asyncio.sleep(delay)
                sent = self.agent.ack_soon(env, stage, error_code=code, note=note)
            else:
                return True

    def _keep(self, job: asyncio.Future[Any]) -> None:
        """Hold a reference to a job nobody waits for until it ends."""
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)


async def run_tasks(agent: Connection, handler: Handler, **options: Any) -> None:
    """`TaskRunner(agent, handler, **options).run()`."""
    await TaskRunner(agent, handler, **options).run()


_STRENGTH = {"preempt_request": 0, "terminate": 1, "kill": 2}

RECEIVED_AFTER_S = PREFETCHED_RECEIVED_AFTER_S
"""How long a prefetched task waits before it is acknowledged RECEIVED (`_start`): the
coordinator's ACK deadline is 10 s by default (RFC 11), and no less than
PREFETCH_ACK_TIMEOUT_S with a prefetch (its configuration is refused otherwise)."""


def _attributes(context: TaskContext) -> dict[str, str | int | bool]:
    """The attributes of a task run's span."""
    return {
        "messaging.system": "sw4rm", "messaging.operation.name": "process",
        "messaging.message.id": context.envelope.message_id,
        "apiary.task_id": context.task_id, "apiary.attempt": context.attempt,
        "apiary.agent_id": context.agent.agent_id,
    }  # fmt: skip


def _outcome(running: _Running) -> Outcome:
    """How a task whose handler ended ends."""
    handler = running.handler
    if handler.cancelled():
        if running.stop:
            return Outcome(*forced_outcome(running.stop))
        return Outcome(AckStage.FAILED, "internal_error", "the handler was cancelled")
    exc = handler.exception()
    if exc is None:
        return result_outcome(running.context.envelope, handler.result())
    if isinstance(exc, Preempted):
        if is_interrupt(exc.reason):  # the runtime control plane's interrupt_turn: stop
            return Outcome(AckStage.FAILED, CANCELLED, exc.reason)
        return Outcome(AckStage.FULFILLED, "", YIELDED)
    if running.stop:  # it stopped after a forced preemption, however it ended
        return Outcome(*forced_outcome(running.stop))
    if isinstance(exc, TaskFailedError):
        return Outcome(AckStage.FAILED, exc.error_code, exc.message)
    if isinstance(exc, ApiaryError):
        return Outcome(AckStage.FAILED, exc.code, exc.message)
    return Outcome(AckStage.FAILED, "internal_error", f"{type(exc).__name__}: {exc}")


def _pass_on(to: asyncio.Future[bool], done: asyncio.Future[bool]) -> None:
    """Give `to` the outcome of `done` (unless it has one: its waiter went away)."""
    if to.done():
        return
    if done.cancelled():
        to.cancel()
    elif (exc := done.exception()) is not None:
        to.set_exception(exc)
    else:
        to.set_result(done.result())


def _refused(read: asyncio.Future[bool] | None) -> bool:
    """Whether a task's READ was answered refused (not taken: the task is not this agent's
    to run); False while it is on the way."""
    return (
        read is not None and read.done() and not read.cancelled()
        and read.exception() is None and not read.result()
    )  # fmt: skip


def _attempt(token: str) -> int:
    """The attempt number of a `task:<task_id>:<attempt>` idempotency token (1 otherwise)."""
    _, _, tail = token.rpartition(":")
    return int(tail) if token.startswith("task:") and tail.isdigit() else 1


__all__ = [
    "SCHEDULER",
    "Preempted",
    "TaskContext",
    "TaskRunner",
    "current_task",
    "run_tasks",
]
