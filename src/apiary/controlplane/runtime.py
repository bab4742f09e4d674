"""`RuntimeControl`: the runtime control plane of one tenant (spec/runtime-control-plane.txt,
docs/control-plane.md) over its engine: sessions owned by the calling principal, threads
bound to an agent, turns run as the agent's Scheduler tasks (controlplane/turns.py), reads in
the contract's shapes (controlplane/reads.py) and resumable channels over the event log
(controlplane/channels.py).

Every command takes the calling principal and its typed request (controlplane/requests.py)
and answers a JSON object; commands that change state hold the control plane's lock, so
that a thread's queue changes one command at a time.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from apiary.controlplane.actions import Actions
from apiary.controlplane.binding import binding_of, bound_to, check_binding
from apiary.controlplane.channels import Channels, channel_json
from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.environment import Environment
from apiary.controlplane.exports import Exports
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.jobs import JobCommands
from apiary.controlplane.model_progress import ModelProgress
from apiary.controlplane.permissions import Permissions
from apiary.controlplane.processes import Processes
from apiary.controlplane.reads import Reads, no_thread
from apiary.controlplane.requests import (
    AckEvents,
    GetSession,
    GetTask,
    GetThreadRead,
    ListTasks,
    ReconnectChannel,
    SubmitTurn,
)
from apiary.controlplane.settings import RuntimeSettings
from apiary.controlplane.subagents import Subagents
from apiary.controlplane.tasks import TaskCommands
from apiary.controlplane.thread_requests import InterruptTurn, RemoveQueuedTurn
from apiary.controlplane.threads import ThreadCommands
from apiary.controlplane.turns import ENDED_STATUSES, TurnDriver, queue_fact
from apiary.core.access.principal import Principal
from apiary.core.acl import AclPolicy
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import (
    QueuePolicy,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
    TurnState,
    owner_of,
)
from apiary.core.runtime.snapshot import ThreadStatus
from apiary.core.runtime.task_records import CommandKeyRecord
from apiary.core.runtime.turns import TurnInput, thread_status
from apiary.core.runtime.views import turn_view
from apiary.core.scope_overlap import parse_scope
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.registry import Registry
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.engine.tools.service import ToolService
from apiary.engine.worktrees.worktrees import Worktrees
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    AlreadyInProgressError,
    BufferFullError,
    NotFoundError,
    ValidationError,
)
from apiary.store.protocols import RuntimeStore

_T = RuntimeEventType


class RuntimeControl:
    """The control plane of one tenant (module docstring). `load` after a restart; `close`
    stops following tasks (the turns go on, and are followed again at the next `load`)."""

    def __init__(
        self,
        store: RuntimeStore,
        scheduler: Scheduler,
        registry: Registry,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        *,
        runtime_id: str = "apiary",
        settings: RuntimeSettings | None = None,
        hitl: Hitl | None = None,
        tools: ToolService | None = None,
        acl: AclPolicy | None = None,
        secure: bool = False,
        worktrees: Worktrees | None = None,
    ) -> None:
        self.settings = settings = settings or RuntimeSettings()
        self._store = store
        self._registry = registry
        self._events = events
        self._clock = clock
        self._ids = ids
        self._lock = asyncio.Lock()
        self._facts = FactWriter(store, events, ids, runtime_id)
        self._keys = CommandKeys(store, clock)
        self.turns = TurnDriver(self._facts, scheduler, clock, self._lock)
        self.reads = Reads(store, scheduler, clock, settings, runtime_id)
        self.channels = Channels(self._facts, self.reads, clock, ids, settings, self._lock)
        self.exports = Exports(self._facts, self.reads, clock, self._lock)
        self.tasks = TaskCommands(
            self._facts, scheduler, registry, self.reads, clock, ids, settings, self._lock
        )
        self.jobs = JobCommands(
            self._facts, self.tasks, self.reads, registry, clock, ids, self._lock
        )
        self.threads = ThreadCommands(
            self._facts, self.turns, scheduler, self.reads, clock, ids, self._lock
        )
        self.actions = Actions(self._facts, hitl, scheduler, clock, self._lock)
        self.reads.pending_requests = self.actions.pending
        self.permissions = Permissions(
            self._facts, self.reads, self.actions, hitl, tools, acl or AclPolicy(), scheduler,
            clock, ids, self._lock, secure=secure,
        )  # fmt: skip
        self.environment = Environment(self._facts, self.reads, tools, worktrees, self._lock)
        self.processes = Processes(self._facts, self.reads, tools, scheduler, clock, settings)
        self.subagents = Subagents(
            self._facts, self.reads, registry, events, self.submit_turn, self.stop_turn,
            clock, ids, self._lock,
        )  # fmt: skip
        self.tasks.close_subagent = self.subagents.close_named
        self.model_progress = ModelProgress(self._facts)
        scheduler.take_reports(self.model_progress.report)

    async def load(self) -> int:
        """Follow the started turns again and start what waits, and the agent tasks' runs
        in hand; returns the open turns."""
        await self.tasks.runs.load()
        opened = await self.turns.load()
        self.actions.start()
        self.processes.start()
        return opened

    async def close(self) -> None:
        await self.processes.close()
        await self.actions.close()
        await self.turns.close()
        await self.tasks.runs.close()

    async def wait_after(self, sequence: int) -> None:
        """Return once an event after `sequence` was logged (any: the caller filters)."""
        await self._events.wait_after(sequence)

    # ------------------------------------------------------------------ submit_turn

    async def submit_turn(self, caller: Principal, req: SubmitTurn) -> dict[str, Any]:
        """Create or select the session and thread, queue the turn, start it when its
        thread is free. A turn_id given again answers the turn submitted first (created
        false) when the request is the same; other content under it is already_exists."""
        async with self._lock:
            if req.turn_id:
                known = await self._store.turn(req.turn_id)
                if known is not None:
                    return await self._resubmitted(caller, known, req)
            session, new_session = await self._session_for(caller, req)
            thread, new_thread = await self._thread_for(session, req)
            turn, thread = await self._queue(caller, session, thread, req, new_session, new_thread)
            if not thread.active_turn_id:
                await self.turns.start_next(thread, caller.label, turn.turn_id)
            stored = await self._store.turn(turn.turn_id)
        return self._submitted(stored or turn, created=True)

    async def _resubmitted(
        self, caller: Principal, known: TurnRecord, req: SubmitTurn
    ) -> dict[str, Any]:
        try:
            _, thread = await self.reads.thread(caller, known.thread_id)
        except NotFoundError:
            raise AlreadyExistsError(
                f"turn_id {req.turn_id!r} is taken", {"field": "turn_id"}
            ) from None
        differs = [
            name for name, given, stored in (
                ("session_id", req.session_id, known.session_id),
                ("thread_id", req.thread_id, known.thread_id),
                ("agent_id", req.agent_id, thread.agent_id),
                ("capability", req.capability, thread.capability),
            ) if given and given != stored
        ]  # fmt: skip
        if json.loads(req.input_json) != json.loads(known.input_json):
            differs.append("input")
        if differs:
            raise AlreadyExistsError(
                f"turn_id {req.turn_id!r} names a turn submitted with another "
                f"{', '.join(differs)}; a retry sends the same request",
                {"field": "turn_id", "differs": ",".join(differs)},
            )
        return self._submitted(known, created=False)

    def _submitted(self, turn: TurnRecord, *, created: bool) -> dict[str, Any]:
        return {
            "created": created, "sessionId": turn.session_id, "threadId": turn.thread_id,
            "turnId": turn.turn_id, "taskId": turn.task_id, "status": turn.state,
            "turn": turn_view(turn).to_json(),
        }  # fmt: skip

    async def _session_for(self, caller: Principal, req: SubmitTurn) -> tuple[SessionRecord, bool]:
        """The thread's session (a known thread_id selects it), the one session_id names,
        or a new one (with session_id as its id when given)."""
        if req.thread_id:
            known = await self._store.thread(req.thread_id)
            if known is not None:
                session, _ = await self.reads.thread(caller, req.thread_id, req.session_id)
                return session, False
        if req.session_id:
            found = await self._store.session(req.session_id)
            if found is not None:
                return await self.reads.session(caller, req.session_id), False
        now = self._clock.now()
        session = SessionRecord(
            req.session_id or self._ids.new_id(), owner_of(caller), now, now,
            workspace_id=req.workspace_id, title=req.title,
        )  # fmt: skip
        return session, True

    async def _thread_for(
        self, session: SessionRecord, req: SubmitTurn
    ) -> tuple[ThreadRecord, bool]:
        if req.thread_id:
            found = await self._store.thread(req.thread_id)
            if found is not None:
                if found.session_id != session.session_id:
                    raise no_thread(req.thread_id, session.session_id)
                if found.closed_at:
                    raise AlreadyCompletedError(
                        f"thread {found.thread_id} is a closed subagent: it takes no turns",
                        {"field": "thread_id", "thread_id": found.thread_id},
                    )
                for name, given, bound in (
                    ("agent_id", req.agent_id, found.agent_id),
                    ("capability", req.capability, found.capability),
                ):
                    if given and given != bound:
                        raise ValidationError.for_field(name, f"thread {found.thread_id} is "
                            f"bound to {bound_to(found.agent_id, found.capability)}")  # fmt: skip
                return found, False
        await check_binding(self._registry, req.agent_id, req.capability)
        thread_id = req.thread_id or self._ids.new_id()
        scope = req.scope or f"resource:runtime-thread/{thread_id}"
        parse_scope(scope)
        now = self._clock.now()
        thread = ThreadRecord(
            thread_id, session.session_id, req.agent_id, scope, req.queue_policy,
            ThreadStatus.IDLE.value, now, now, capability=req.capability,
        )  # fmt: skip
        return thread, True

    async def _queue(
        self, caller: Principal, session: SessionRecord, thread: ThreadRecord,
        req: SubmitTurn, new_session: bool, new_thread: bool,
    ) -> tuple[TurnRecord, ThreadRecord]:  # fmt: skip
        """Store the new turn QUEUED in its thread (and the new session and thread), with
        their events."""
        open_turns = await self._store.open_turns(thread.thread_id)
        queued = [t.turn_id for t in open_turns if t.state == TurnState.QUEUED]
        busy = bool(thread.active_turn_id or open_turns)
        if busy and thread.queue_policy == QueuePolicy.REJECT:
            raise AlreadyInProgressError(
                f"thread {thread.thread_id} is busy and its queue_policy is reject: wait for "
                "its turn to end, or interrupt it",
                {"field": "thread_id", "thread_id": thread.thread_id},
            )
        if len(queued) >= self.settings.max_queued_turns:
            raise BufferFullError(
                f"thread {thread.thread_id} has {len(queued)} turns queued, the most it holds",
                {"field": "thread_id", "thread_id": thread.thread_id},
            )
        now = self._clock.now()
        turn = TurnRecord(
            req.turn_id or self._ids.new_id(), session.session_id, thread.thread_id,
            thread.turn_count, TurnState.QUEUED.value, req.input_json, self._ids.new_id(),
            now, now, submitted_by=owner_of(caller), priority=req.priority,
        )  # fmt: skip
        status = thread.status
        if busy:  # it waits: the thread's status counts it
            states = [TurnState(t.state) for t in open_turns]
            active = next((state for state in states if state.active), None)
            last = TurnState(thread.status) if thread.status in ENDED_STATUSES else None
            status = thread_status(active, last, len(queued) + 1)
        thread = replace(thread, turn_count=thread.turn_count + 1, updated_at=now, status=status)
        agent = thread.agent_id
        facts: list[Fact] = []
        if new_session:
            facts.append(Fact(_T.SESSION_CREATED, session.session_id, agent_id=agent,
                              payload={"owner": session.owner}))  # fmt: skip
        if new_thread:
            facts.append(
                Fact(
                    _T.THREAD_STARTED,
                    session.session_id,
                    thread.thread_id,
                    agent_id=agent,
                    status=thread.status,
                    payload={**binding_of(thread), "queuePolicy": thread.queue_policy},
                )
            )
        facts.append(
            Fact(
                _T.TURN_SUBMITTED, session.session_id, thread.thread_id, turn.turn_id,
                status=turn.state, agent_id=agent,
                payload={"ordinal": turn.ordinal, "queuePosition": len(queued) + 1 if busy else 0,
                         "inputSize": len(turn.input_json.encode())},
            )
        )  # fmt: skip
        if busy:
            facts.append(queue_fact(thread, [*queued, turn.turn_id]))
        write = RuntimeWrite(
            sessions=(session,) if new_session else (), threads=(thread,), turns=(turn,)
        )
        await self._facts.commit(write, facts, caller.label)
        return turn, thread

    # ------------------------------------------------------------------ interrupts

    async def interrupt_turn(self, caller: Principal, req: InterruptTurn) -> dict[str, Any]:
        """Stop a turn: a queued one is cancelled at once; a started one records the intent
        (task.cancel_requested), then its task is cancelled while it waits or asked to stop
        while it runs. `queued: clear` cancels the thread's queued turns too; the subagents
        spawned with the turn are closed after it unless `propagate` is false. A retry under
        its `idempotency_key` answers the first interrupt's answer (`replayed`)."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "interrupt_turn", req)
            if replayed is not None:
                return {**replayed, "replayed": True}
            if req.turn_id:
                turn, thread = await self.reads.turn(
                    caller, req.turn_id, req.thread_id, req.session_id
                )
            else:
                _, thread = await self.reads.thread(caller, req.thread_id, req.session_id)
                active_id = thread.active_turn_id
                active = await self._store.turn(active_id) if active_id else None
                if active is None:
                    raise AlreadyCompletedError(
                        f"thread {thread.thread_id} runs no turn now; name a queued one with "
                        "turn_id", {"field": "thread_id", "thread_id": thread.thread_id},
                    )  # fmt: skip
                turn = active
            reason = req.reason or f"interrupted by {caller.label}"
            if TurnState(turn.state).terminal:
                raise AlreadyCompletedError(
                    f"turn {turn.turn_id} has already ended ({turn.state})",
                    {"field": "turn_id", "turn_id": turn.turn_id, "state": turn.state},
                )
            turn, cleared, closed = await self.stop_turn(
                turn, thread, reason, caller.label, clear=req.queued == "clear",
                propagate=req.propagate,
            )  # fmt: skip
            answer = {
                "turnId": turn.turn_id, "status": turn.state,
                "interrupt": "cancelled" if turn.state == TurnState.CANCELLED else (
                    "requested" if turn.interrupt else turn.state
                ),
                "clearedTurns": cleared, "closedSubagents": closed,
                "turn": turn_view(turn).to_json(),
            }  # fmt: skip
            await self._keep(caller, key, answer)
        return answer

    async def _keep(
        self, caller: Principal, key: CommandKeyRecord | None, answer: dict[str, Any]
    ) -> None:
        """Store a command's idempotency key with its answer, once its writes are done (the
        lock held)."""
        keys = self._keys.keep(key, answer)
        if keys:
            await self._facts.commit(RuntimeWrite(keys=keys), [], caller.label)

    async def stop_turn(
        self, turn: TurnRecord, thread: ThreadRecord, reason: str, actor: str, *,
        clear: bool = False, propagate: bool = True,
    ) -> tuple[TurnRecord, list[str], list[str]]:  # fmt: skip
        """Stop an open turn (the lock held): a queued one is cancelled at once, a started
        one records the intent, then its task is cancelled or asked to stop; with `clear`
        the thread's queued turns are cancelled too; with `propagate` the subagents spawned
        with the turn are closed after it, each recording its own intent first. The turn as
        it stands, the cleared turns and the closed subagents."""
        cleared: list[str] = []
        if clear:  # first: the interrupted turn's end starts the next
            for queued in await self._store.open_turns(thread.thread_id):
                if queued.state == TurnState.QUEUED and queued.turn_id != turn.turn_id:
                    await self._cancel_queued(actor, queued, "cleared by an interrupt")
                    cleared.append(queued.turn_id)
            thread = (await self._store.thread(thread.thread_id)) or thread
        turn = await self._interrupt(actor, turn, thread, reason)
        closed: list[str] = []
        if propagate:
            why = f"its parent turn {turn.turn_id} was interrupted: {reason}"
            closed = await self.subagents.close_spawned(thread, turn.turn_id, why, actor)
        return (await self._store.turn(turn.turn_id)) or turn, cleared, closed

    async def _interrupt(
        self, actor: str, turn: TurnRecord, thread: ThreadRecord, reason: str
    ) -> TurnRecord:
        state = TurnState(turn.state)
        if state is TurnState.QUEUED:
            return await self._cancel_queued(actor, turn, reason, "interrupted")
        if turn.interrupt:
            return turn  # asked already: the task's end will tell
        after, _ = await self.turns.apply(
            turn, thread, TurnInput.INTERRUPT, actor, interrupt=reason
        )
        return after

    async def _cancel_queued(
        self, actor: str, turn: TurnRecord, reason: str, why: str = "removed"
    ) -> TurnRecord:
        thread = await self._store.thread(turn.thread_id)
        assert thread is not None
        after, _ = await self.turns.apply(
            turn, thread, TurnInput.CANCEL, actor, status_reason=why,
            error_code="cancelled", message=reason,
        )  # fmt: skip
        return after

    async def remove_queued_turn(self, caller: Principal, req: RemoveQueuedTurn) -> dict[str, Any]:
        """Take a queued turn out of its thread's queue (it ends cancelled, never run); a
        retry under its `idempotency_key` answers the first answer (`replayed`)."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "remove_queued_turn", req)
            if replayed is not None:
                return {**replayed, "replayed": True}
            turn, _ = await self.reads.turn(caller, req.turn_id, req.thread_id, req.session_id)
            state = TurnState(turn.state)
            if state.terminal:
                raise AlreadyCompletedError(
                    f"turn {turn.turn_id} has already ended ({turn.state})",
                    {"field": "turn_id", "turn_id": turn.turn_id, "state": turn.state},
                )
            if state is not TurnState.QUEUED:
                raise AlreadyInProgressError(
                    f"turn {turn.turn_id} is {turn.state}, no longer queued: interrupt_turn "
                    "stops it", {"field": "turn_id", "turn_id": turn.turn_id, "state": turn.state},
                )  # fmt: skip
            reason = req.reason or f"removed by {caller.label}"
            turn = await self._cancel_queued(caller.label, turn, reason)
            answer = {"turnId": turn.turn_id, "status": turn.state, "removed": True}
            await self._keep(caller, key, answer)
        return answer

    # ------------------------------------------------------------------ reads

    async def get_session(self, caller: Principal, req: GetSession) -> dict[str, Any]:
        """The session's shell, its snapshot (threads, their last turns and queues, their
        tasks) and the cursor it reflects."""
        async with self._lock:
            cursor = await self._events.last_sequence()
            session = await self.reads.session(caller, req.session_id)
            threads = await self._store.threads(session.session_id)
            snapshot = await self.reads.snapshot(session, threads, cursor, turns=req.turns)
        return {
            "session": snapshot.extra["session"], "snapshot": snapshot.to_json(),
            "cursor": {"sequence": cursor},
        }  # fmt: skip

    async def get_thread_read(self, caller: Principal, req: GetThreadRead) -> dict[str, Any]:
        """A snapshot of one thread: status, queue, pending requests, last outcome,
        incidents and diagnostics."""
        async with self._lock:
            cursor = await self._events.last_sequence()
            session, thread = await self.reads.thread(caller, req.thread_id, req.session_id)
            snapshot = await self.reads.snapshot(
                session, [thread], cursor, turns=req.turns, detail=True
            )
        return snapshot.to_json()

    async def list_tasks(self, caller: Principal, req: ListTasks) -> dict[str, Any]:
        """The Apiary tasks of a session's (or a thread's) turns; a session's agent tasks
        (create_task) follow its turns'."""
        if req.thread_id:
            _, thread = await self.reads.thread(caller, req.thread_id, req.session_id)
            return {"tasks": [t.to_json() for t in await self.reads.tasks([thread])]}
        session = await self.reads.session(caller, req.session_id)
        threads = await self._store.threads(session.session_id)
        found = [t.to_json() for t in await self.reads.tasks(threads)]
        found += await self.tasks.session_tasks(session.session_id, self.settings.tasks_listed)
        return {"tasks": found}

    async def get_task(self, caller: Principal, req: GetTask) -> dict[str, Any]:
        """A runtime agent task with its runs, or an Apiary task as the contract's task,
        with its result."""
        own = await self.tasks.find(caller, req.task_id)
        if own is not None:
            return {"task": own}
        return {"task": (await self.reads.task(caller, req.task_id)).to_json()}

    # ------------------------------------------------------------------ channels

    async def reconnect_channel(self, caller: Principal, req: ReconnectChannel) -> dict[str, Any]:
        """Open a channel, or resume one from its last acknowledged sequence: the
        session's snapshot first, then the events after that position (at most `limit`,
        `more` when there are others: follow from `cursor`)."""
        start = await self.channels.start(caller, req)
        limit = self.settings.replay_limit if req.limit is None else req.limit
        replay = await self.channels.replay(start.snapshot.session_id, start.after, limit)
        return {
            "channel": start.channel, "snapshot": start.snapshot.to_json(),
            "events": [e.to_json() for e in replay.events], "more": replay.more,
            "cursor": {"sequence": replay.cursor},
        }  # fmt: skip

    async def ack_events(self, caller: Principal, req: AckEvents) -> dict[str, Any]:
        """Acknowledge the channel's events up to `sequence` (it never goes back)."""
        return channel_json(await self.channels.ack(caller, req))
