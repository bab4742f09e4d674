"""write_process_stdin and terminate_process: the processes of runtime threads
(core/runtime/processes.py, docs/control-plane.md "Processes").

A process is a tool call (ToolService.Call/CallStream) that a thread's agent makes while it
holds the Scheduler task of one of the thread's turns or agent tasks' runs (the call's
correlation id may name that task too); its process id is the call id. The tool service
tells `Processes` (a `CallObserver`) when such a call starts, what output it produces and
when it ends; those become `process.started`, `process.output` (bounded, chunked),
`process.completed`, `process.failed` or `process.terminated` events on the thread, written
in order by one writer task so that a call never waits on the store.

write_process_stdin writes to a running process whose command keeps standard input open
(`stdin = "stream"`) and logs `process.input`; terminate_process cancels its call
(ToolService.Cancel: SIGTERM, SIGKILL after the grace period) and answers once it ended (or
the grace period passed). A process whose turn or task is cancelled (or ends) is terminated
the same way: a follower of the event log sees the owner's facts. Both commands take an
`idempotency_key`, kept in memory with the process (controlplane/process_keys.py): a retry
answers the first answer, so a lost answer never writes the input twice. Only the session's owner
(or an operator with `tasks`) reaches a process; anyone else gets not_found. A process id
the runtime does not know, or a process that has ended (or was lost when the coordinator
restarted: processes live in the coordinator that runs them), answers `unavailable` naming
it, with a `runtime.warning` on the process's thread (or on the session or thread the
request names, for an id never seen here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from apiary.controlplane.facts import RUNTIME_ACTOR, FactWriter
from apiary.controlplane.process_keys import ProcessKeys
from apiary.controlplane.process_requests import TerminateProcess, WriteProcessStdin
from apiary.controlplane.reads import Reads
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.events import EventFilter
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import FAMILY, Fact
from apiary.core.runtime.processes import (
    STOPPING_FACTS,
    OutputCutter,
    ProcessRecord,
    ProcessState,
    ended_payload,
    ending,
    output_payload,
)
from apiary.core.runtime.records import RuntimeWrite, TurnState, may_use
from apiary.core.tools.calls import ToolCallState
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.tools.calls import PendingCall
from apiary.engine.tools.command_tools import CommandToolProvider
from apiary.engine.tools.service import ToolService
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyInProgressError,
    NotFoundError,
    UnavailableError,
)
from apiary.stopping import stop_tasks

log = logging.getLogger("apiary.controlplane")
_T = RuntimeEventType
KEEP_ENDED = 10_000
"""Ended processes remembered (their id answers unavailable with a warning on their thread)."""
TERMINATE_SLACK_S = 2.0
"""How long terminate_process waits beyond the tool service's cancel grace period."""
WRITE_TIMEOUT_S = 10.0
"""How long write_process_stdin waits for a process that does not read its input."""
_READ_PAGE = 500
OWNER_STOPPED = "its owner was cancelled or ended"


@dataclass(frozen=True, slots=True)
class _Started:
    call_id: str
    owners: tuple[str, ...]
    agent_id: str
    tool_id: str
    interactive: bool
    started_at: float


@dataclass(frozen=True, slots=True)
class _Output:
    call_id: str
    data: bytes
    dropped: int
    """Bytes past the process's output bound, not kept in the notice."""


@dataclass(frozen=True, slots=True)
class _Ended:
    call_id: str
    state: ToolCallState
    error_code: str
    attempts: int
    duration_ms: int
    reason: str


_Notice = _Started | _Output | _Ended


class Processes:
    """The processes of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, reads: Reads, tools: ToolService | None, scheduler: Scheduler,
        clock: Clock, settings: RuntimeSettings,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._reads = reads
        self._tools = tools
        self._scheduler = scheduler
        self._clock = clock
        self._settings = settings
        self._live: dict[str, ProcessRecord] = {}
        self._ended: OrderedDict[str, ProcessRecord] = OrderedDict()
        self._cutters: dict[str, OutputCutter] = {}
        self._gone: dict[str, asyncio.Event] = {}
        self._foreign: set[str] = set()
        """Calls running that are no runtime process (their notices are ignored)."""
        self._unread: dict[str, int] = {}
        """Output bytes each running call may still pass on (process_output_bytes)."""
        self._notices: asyncio.Queue[_Notice] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[asyncio.Task[str]] = set()
        self._keys = ProcessKeys()

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        if self._tools is None or self._tasks:
            return
        self._tools.observers.add(self)
        self._tasks = [
            asyncio.create_task(self._write(), name="apiary-runtime-processes"),
            asyncio.create_task(self._follow(), name="apiary-runtime-process-owners"),
        ]

    async def close(self) -> None:
        if self._tools is not None:
            self._tools.observers.remove(self)
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self._stopping]
        self._tasks = []
        await stop_tasks(tasks, "runtime processes")

    # ------------------------------------------------------------------ the tool service's notices

    def call_started(self, call: PendingCall) -> None:
        # The call's own correlation id (its call id, by default) names no task.
        named = call.correlation_id and call.correlation_id != call.call_id
        owners = [call.correlation_id] if named else []
        if call.caller:
            owners += [t.task_id for t in self._scheduler.holding(call.caller)]
        if not owners:
            self._foreign.add(call.call_id)
            return
        provider = call.provider
        interactive = isinstance(provider, CommandToolProvider) and (
            provider.spec(call.tool_name).stdin == "stream"
        )
        self._notices.put_nowait(
            _Started(call.call_id, tuple(dict.fromkeys(owners)), call.caller,
                     f"{call.provider_id}/{call.tool_name}", interactive, self._clock.now())
        )  # fmt: skip

    def call_output(self, call: PendingCall, data: bytes) -> None:
        if call.call_id in self._foreign:
            return
        # Bounded here already: notices waiting on a slow store never hold more than that.
        left = self._unread.get(call.call_id, self._settings.process_output_bytes)
        kept = data[:left]
        self._unread[call.call_id] = left - len(kept)
        self._notices.put_nowait(_Output(call.call_id, kept, len(data) - len(kept)))

    def call_finished(self, call: PendingCall) -> None:
        self._unread.pop(call.call_id, None)
        if call.call_id in self._foreign:
            self._foreign.discard(call.call_id)
            return
        duration_ms = round((self._clock.now() - call.started_at) * 1000)
        self._notices.put_nowait(
            _Ended(call.call_id, call.state, call.error_code, call.attempts, duration_ms,
                   call.cancel_reason)
        )  # fmt: skip

    async def settled(self) -> None:
        """Return once every notice so far is written (a command sees what the calls did)."""
        await self._notices.join()

    # ------------------------------------------------------------------ writing the events

    async def _write(self) -> None:
        while True:
            batch = [await self._notices.get()]
            while not self._notices.empty():
                batch.append(self._notices.get_nowait())
            try:
                facts = [fact for notice in batch for fact in await self._facts_of(notice)]
                if facts:
                    await self._facts.commit(RuntimeWrite(), facts, RUNTIME_ACTOR)
            except Exception:  # a store outage, say: the calls go on, their events are lost
                log.exception("runtime processes: %d notices not written", len(batch))
            finally:
                for _ in batch:
                    self._notices.task_done()

    async def _facts_of(self, notice: _Notice) -> list[Fact]:
        if isinstance(notice, _Started):
            return await self._started(notice)
        process = self._live.get(notice.call_id)
        if process is None:
            if isinstance(notice, _Ended):
                self._foreign.discard(notice.call_id)
            return []
        cutter = self._cutters[process.process_id]
        if isinstance(notice, _Output):
            cutter.dropped += notice.dropped
            return self._output(process, cutter, cutter.feed(notice.data))
        facts = self._output(process, cutter, cutter.flush())
        del self._cutters[process.process_id]
        return [*facts, self._ended_fact(process, notice)]

    async def _started(self, notice: _Started) -> list[Fact]:
        process = await self._owner(notice)
        if process is None:
            self._foreign.add(notice.call_id)
            return []
        self._live[process.process_id] = process
        self._cutters[process.process_id] = OutputCutter(
            self._settings.process_output_chunk_bytes, self._settings.process_output_bytes
        )
        self._gone[process.process_id] = asyncio.Event()
        if await self._owner_stopped(process):  # before the follower could see it
            self._spawn_stop(process)
        payload = {"processId": process.process_id, "toolId": process.tool_id,
                   "agentId": process.agent_id, "interactive": process.interactive}  # fmt: skip
        return [self._fact(_T.PROCESS_STARTED, process, payload)]

    async def _owner(self, notice: _Started) -> ProcessRecord | None:
        """The process of the turn or run among the call's owners (None: no runtime work)."""
        for task_id in notice.owners:
            turn = await self._store.turn_of_task(task_id)
            if turn is not None:
                return self._record(notice, turn.session_id, turn.thread_id,
                                    turn_id=turn.turn_id, task_id=task_id)  # fmt: skip
            run = await self._store.run(task_id)
            task = await self._store.task(run.task_id) if run is not None else None
            if run is not None and task is not None:
                return self._record(notice, task.session_id, task.thread_id,
                                    task_id=task.task_id, run_id=run.run_id)  # fmt: skip
        return None

    async def _owner_stopped(self, process: ProcessRecord) -> bool:
        """Whether the process's turn was interrupted or has ended already (a fact the
        follower, which looks only while processes run, may have passed over)."""
        turn = await self._store.turn(process.turn_id) if process.turn_id else None
        return turn is not None and (bool(turn.interrupt) or TurnState(turn.state).terminal)

    def _spawn_stop(self, process: ProcessRecord) -> None:
        task = asyncio.create_task(self._stop(process, OWNER_STOPPED, RUNTIME_ACTOR))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    @staticmethod
    def _record(
        notice: _Started, session_id: str, thread_id: str, *, turn_id: str = "",
        task_id: str = "", run_id: str = "",
    ) -> ProcessRecord:  # fmt: skip
        return ProcessRecord(
            notice.call_id, session_id, thread_id, notice.agent_id, notice.tool_id,
            notice.interactive, notice.started_at, turn_id=turn_id, task_id=task_id,
            run_id=run_id,
        )  # fmt: skip

    def _output(
        self, process: ProcessRecord, cutter: OutputCutter, pieces: Sequence[bytes]
    ) -> list[Fact]:
        process.dropped_bytes = cutter.dropped
        facts = []
        for piece in pieces:
            payload = output_payload(process, piece, process.output_bytes)
            process.output_bytes += len(piece)
            facts.append(self._fact(_T.PROCESS_OUTPUT, process, payload))
        return facts

    def _ended_fact(self, process: ProcessRecord, notice: _Ended) -> Fact:
        kind, process.state = ending(notice.state)
        payload = ended_payload(
            process, error_code=notice.error_code, attempts=notice.attempts,
            duration_ms=notice.duration_ms, reason=notice.reason,
        )  # fmt: skip
        self._live.pop(process.process_id, None)
        self._ended[process.process_id] = process
        while len(self._ended) > KEEP_ENDED:
            forgotten, _ = self._ended.popitem(last=False)
            self._keys.forget(forgotten)
        gone = self._gone.pop(process.process_id, None)
        if gone is not None:
            gone.set()
        return self._fact(kind, process, payload)

    def _fact(
        self, kind: str, process: ProcessRecord, payload: dict[str, Any], status: str = ""
    ) -> Fact:
        return Fact(
            kind, process.session_id, process.thread_id, process.turn_id,
            task_id=process.task_id, run_id=process.run_id, agent_id=process.agent_id,
            status=status or process.state.value, payload=payload,
            extra={"toolCallId": process.process_id},
        )  # fmt: skip

    # ------------------------------------------------------------------ owners' cancellation

    async def _follow(self) -> None:
        """Terminate the processes whose turn or task is cancelled or ends (module
        docstring), from the runtime facts in the event log."""
        events = self._facts.events
        seen = await events.last_sequence()
        where = EventFilter(event_types=frozenset({FAMILY}))
        while True:
            await events.wait_after(seen)
            if not self._live:  # nothing to stop: no store read (see _started)
                seen = max(seen, events.last_committed)
                continue
            try:
                top = await events.last_sequence()
                found = await events.read(after=seen, limit=_READ_PAGE, where=where)
                full = len(found) == _READ_PAGE  # more to read: go on from the last
                seen = found[-1].sequence if full else max([top, *(e.sequence for e in found)])
                owners = {
                    str(event.details.get(key)) for event in found
                    if event.event_type[len(FAMILY):] in STOPPING_FACTS
                    for key in ("turnId", "taskId", "runId") if event.details.get(key)
                }  # fmt: skip
                for process in [p for p in self._live.values() if p.owned_by(owners)]:
                    await self._stop(process, OWNER_STOPPED, RUNTIME_ACTOR)
            except Exception:  # a store outage, say: the next events are looked at again
                log.exception("runtime processes: following the owners failed")

    async def _stop(self, process: ProcessRecord, reason: str, by: str) -> str:
        """Cancel the process's call; its CancelAnswer's code."""
        assert self._tools is not None
        if not process.terminate_reason:
            process.terminate_reason, process.terminated_by = reason, by
        answer = await self._tools.cancel(process.process_id, by)
        return answer.error_code

    # ------------------------------------------------------------------ commands

    def _tools_of(self) -> ToolService:
        if self._tools is None:
            raise UnavailableError("this control plane has no tool service to run processes")
        return self._tools

    async def write_stdin(self, caller: Principal, req: WriteProcessStdin) -> dict[str, Any]:
        """Write to the process's standard input (module docstring), once per idempotency
        key."""
        tools = self._tools_of()
        write = partial(self._write_stdin, tools, caller, req)
        return await self._keys.once(caller, "write_process_stdin", req.process_id, req, write)

    async def _write_stdin(
        self, tools: ToolService, caller: Principal, req: WriteProcessStdin
    ) -> dict[str, Any]:
        process = await self._running(caller, req.process_id, "write_process_stdin",
                                      req.session_id, req.thread_id)  # fmt: skip
        if not process.interactive:
            raise AlreadyCompletedError(
                f"process {process.process_id} ({process.tool_id}) takes no input: its "
                'command does not keep standard input open (stdin = "stream")',
                {"field": "process_id", "process_id": process.process_id},
            )  # fmt: skip
        if process.stdin_closed:
            raise AlreadyCompletedError(
                f"process {process.process_id} has its standard input closed (eof was sent)",
                {"field": "process_id", "process_id": process.process_id},
            )
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await tools.write_stdin(process.process_id, req.data, eof=req.eof,
                                        by=caller.label)  # fmt: skip
        except TimeoutError:
            raise UnavailableError(
                f"process {process.process_id} did not read its input within "
                f"{WRITE_TIMEOUT_S:g} s", {"field": "process_id", "process_id": process.process_id},
            ) from None  # fmt: skip
        except AlreadyInProgressError as exc:  # between two attempts of its call
            raise AlreadyInProgressError(
                exc.message, {"field": "process_id", "process_id": process.process_id}
            ) from None
        except (NotFoundError, AlreadyCompletedError) as exc:  # it ended, or closed its input
            await self.settled()
            raise await self._unavailable(
                process.process_id, "write_process_stdin", process,
                f"its input cannot be written ({exc.message})",
            ) from None  # fmt: skip
        process.input_bytes += len(req.data)
        process.stdin_closed = process.stdin_closed or req.eof
        payload = {"processId": process.process_id, "bytes": len(req.data), "eof": req.eof,
                   "text": req.data[: self._settings.process_output_chunk_bytes]
                   .decode("utf-8", "replace")}  # fmt: skip
        await self._facts.commit(
            RuntimeWrite(), [self._fact(_T.PROCESS_INPUT, process, payload)], caller.label
        )
        return {"process": process.view(), "written": len(req.data), "eof": req.eof}

    async def terminate(self, caller: Principal, req: TerminateProcess) -> dict[str, Any]:
        """Cancel the process's call; answer once it ended, or the grace period passed
        (`status` then says `terminating`), once per idempotency key."""
        tools = self._tools_of()
        stop = partial(self._terminate, tools, caller, req)
        return await self._keys.once(caller, "terminate_process", req.process_id, req, stop)

    async def _terminate(
        self, tools: ToolService, caller: Principal, req: TerminateProcess
    ) -> dict[str, Any]:
        process = await self._running(caller, req.process_id, "terminate_process",
                                      req.session_id, req.thread_id)  # fmt: skip
        reason = req.reason or f"terminated by {caller.label}"
        code = await self._stop(process, reason, caller.label)
        if code != "CANCELLED":  # ALREADY_COMPLETED or NOT_FOUND: it ended meanwhile
            await self.settled()
        gone = self._gone.get(process.process_id)
        if gone is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tools.settings.cancel_grace_s + TERMINATE_SLACK_S):
                    await gone.wait()
        await self.settled()
        status = "terminating" if process.state is ProcessState.RUNNING else process.state.value
        return {"process": {**process.view(), "status": status}, "reason": reason}

    async def _running(
        self, caller: Principal, process_id: str, command: str, session_id: str, thread_id: str
    ) -> ProcessRecord:
        """The running process `process_id` when `caller` may reach it (module docstring)."""
        await self.settled()
        process = self._live.get(process_id) or self._ended.get(process_id)
        if process is None:
            raise await self._unknown(caller, process_id, command, session_id, thread_id)
        session = await self._store.session(process.session_id)
        if session is None or not may_use(caller, session.owner):
            raise NotFoundError(
                f"no process {process_id!r}", {"field": "process_id", "process_id": process_id}
            )
        if process.state.ended:
            raise await self._unavailable(
                process_id, command, process, f"it has ended ({process.state.value})"
            )
        return process

    async def _unknown(
        self, caller: Principal, process_id: str, command: str, session_id: str, thread_id: str
    ) -> UnavailableError:
        """Unavailable for an id never seen here, with a warning on the session or thread the
        request names (when `caller` may use it)."""
        scope = None
        with contextlib.suppress(NotFoundError):
            if thread_id:
                _, thread = await self._reads.thread(caller, thread_id, session_id)
                scope = (thread.session_id, thread.thread_id, thread.agent_id)
            elif session_id:
                session = await self._reads.session(caller, session_id)
                scope = (session.session_id, "", "")
        why = ("it is not known to the runtime (never started here, or lost when the "
               "coordinator restarted)")  # fmt: skip
        error = _unavailable_error(process_id, command, why)
        if scope is not None:
            payload = _warning(process_id, command, why)
            fact = Fact(_T.RUNTIME_WARNING, scope[0], scope[1], agent_id=scope[2],
                        status="unavailable", payload=payload)  # fmt: skip
            await self._facts.commit(RuntimeWrite(), [fact], caller.label)
        return error

    async def _unavailable(
        self, process_id: str, command: str, process: ProcessRecord, why: str
    ) -> UnavailableError:
        fact = self._fact(_T.RUNTIME_WARNING, process, _warning(process_id, command, why),
                          status="unavailable")  # fmt: skip
        await self._facts.commit(RuntimeWrite(), [fact], RUNTIME_ACTOR)
        return _unavailable_error(process_id, command, why)


def _warning(process_id: str, command: str, why: str) -> dict[str, Any]:
    return {"code": "process_unavailable", "processId": process_id, "command": command,
            "message": f"process {process_id} cannot be reached: {why}"}  # fmt: skip


def _unavailable_error(process_id: str, command: str, why: str) -> UnavailableError:
    return UnavailableError(
        f"{command}: process {process_id!r} is unavailable: {why}",
        {"field": "process_id", "process_id": process_id},
    )
