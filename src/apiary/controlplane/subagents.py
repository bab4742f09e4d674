"""The subagent commands (core/runtime/subagents.py): spawn_subagent creates a child thread of
the caller's thread, bound to another agent and linked to its parent (and the parent's
turn); send_subagent_input is a turn on the child thread (submit_turn's own path: queued
by the child's policy, run as the child agent's task); wait_subagents follows the children
until they settle (every turn ended) or the timeout; close_subagent interrupts the child's
turn, cancels what it has queued, then closes the thread to new turns (an interrupt of
the parent's turn closes the children spawned with it, a cancelled task the children its
`subagent` edges name: `close_spawned`, `close_named`); list_subagents is the parent-child
graph with each child's state. A child's events go to its parent's thread
as well (`subagent.*`, `subagentId`). Spawn, input and close take an `idempotency_key`;
`subagent_id` and an input's `turn_id` are caller ids that a retry names again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from apiary.controlplane.binding import binding_of, check_binding
from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.requests import Params, SubmitTurn
from apiary.controlplane.task_requests import Keyed, ids
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.limits import DEFAULT_LIMITS
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import QueuePolicy, RuntimeWrite, ThreadRecord, TurnRecord
from apiary.core.runtime.snapshot import ThreadStatus
from apiary.core.runtime.subagents import SETTLED, graph, subagent_fact, subagent_view
from apiary.core.scope_overlap import parse_scope
from apiary.engine.eventlog import EventRecorder
from apiary.engine.registry import Registry
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    NotFoundError,
    ValidationError,
)
from apiary.store.protocols import RuntimeStore

_T = RuntimeEventType
MAX_WAIT_S: Final = 3600
WAIT_MODES: Final = ("all", "any")
Submit = Callable[[Principal, SubmitTurn], Awaitable[dict[str, Any]]]
Stop = Callable[..., Awaitable[tuple[TurnRecord, list[str], list[str]]]]
"""RuntimeControl.stop_turn: stop an open turn, the lock held."""


@dataclass(frozen=True, slots=True)
class SpawnSubagent(Keyed):
    thread_id: str
    agent_id: str = ""
    capability: str = ""
    """Or the capability queue the child's turns go to (any capable agent runs each)."""
    subagent_id: str = ""
    turn_id: str = ""
    role: str = ""
    scope: str = ""
    input_json: str = ""

    @classmethod
    def read(cls, p: Params, max_input_bytes: int) -> SpawnSubagent:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            thread_id=p.id("thread_id", required=True),
            agent_id=p.id("agent_id", required=not p.has("capability")),
            capability=p.id("capability"),
            subagent_id=p.id("subagent_id"),
            turn_id=p.id("turn_id"),
            role=p.text("role"),
            scope=p.text("scope", DEFAULT_LIMITS.document_bytes),
            input_json=p.json_value("input", max_input_bytes) if p.has("input") else "",
        )


@dataclass(frozen=True, slots=True)
class SubagentInput(Keyed):
    subagent_id: str
    input_json: str
    turn_id: str = ""

    @classmethod
    def read(cls, p: Params, max_input_bytes: int) -> SubagentInput:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            subagent_id=p.id("subagent_id", required=True),
            input_json=p.json_value("input", max_input_bytes),
            turn_id=p.id("turn_id"),
        )


@dataclass(frozen=True, slots=True)
class WaitSubagents:
    subagent_ids: tuple[str, ...] = ()
    thread_id: str = ""
    """The parent whose children to wait for, when no subagent_ids are named."""
    timeout_s: int = 0
    mode: str = "all"

    @classmethod
    def read(cls, p: Params) -> WaitSubagents:
        found = cls(
            subagent_ids=ids(p, "subagent_ids"),
            thread_id=p.id("thread_id"),
            timeout_s=p.integer("timeout_s", maximum=MAX_WAIT_S) or 0,
            mode=p.choice("mode", WAIT_MODES, "all"),
        )
        if not (found.subagent_ids or found.thread_id):
            raise ValidationError.for_field("subagent_ids", "is required (or thread_id)")
        return found


@dataclass(frozen=True, slots=True)
class CloseSubagent(Keyed):
    subagent_id: str
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> CloseSubagent:
        return cls(
            idempotency_key=p.id("idempotency_key"),
            subagent_id=p.id("subagent_id", required=True),
            reason=p.text("reason"),
        )


@dataclass(frozen=True, slots=True)
class ListSubagents:
    thread_id: str = ""
    session_id: str = ""

    @classmethod
    def read(cls, p: Params) -> ListSubagents:
        found = cls(p.id("thread_id"), p.id("session_id"))
        if not (found.thread_id or found.session_id):
            raise ValidationError.for_field("thread_id", "is required (or session_id)")
        return found


def no_subagent(subagent_id: str) -> NotFoundError:
    return NotFoundError(
        f"no subagent {subagent_id!r}", {"field": "subagent_id", "subagent_id": subagent_id}
    )


class Subagents:
    """The subagent commands of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, reads: Reads, registry: Registry, events: EventRecorder,
        submit: Submit, stop: Stop, clock: Clock, ids: IdGenerator,
        lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store: RuntimeStore = facts.store
        self._reads = reads
        self._registry = registry
        self._events = events
        self._submit = submit
        self._stop = stop
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._keys = CommandKeys(facts.store, clock)

    async def _child(self, caller: Principal, subagent_id: str) -> ThreadRecord:
        try:
            _, child = await self._reads.thread(caller, subagent_id)
        except NotFoundError:
            raise no_subagent(subagent_id) from None
        if not child.parent_thread_id:
            raise no_subagent(subagent_id)
        return child

    # ------------------------------------------------------------------ spawn

    async def spawn(self, caller: Principal, req: SpawnSubagent) -> dict[str, Any]:
        """A child thread of `thread_id` bound to `agent_id`; its first turn when `input`."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "spawn_subagent", req)
            session, parent = await self._reads.thread(caller, req.thread_id)
            if replayed is not None:
                child = await self._child(caller, str(replayed["subagentId"]))
                return {**await self._answer(child), "created": False, "replayed": True}
            if parent.closed_at:
                raise AlreadyCompletedError(
                    f"thread {parent.thread_id} is closed", {"field": "thread_id"}
                )
            if req.turn_id:
                await self._reads.turn(caller, req.turn_id, parent.thread_id)
            if req.subagent_id and await self._store.thread(req.subagent_id) is not None:
                raise AlreadyExistsError(
                    f"subagent_id {req.subagent_id!r} names a thread that exists; a retry "
                    "sends its idempotency_key", {"field": "subagent_id"},
                )  # fmt: skip
            await check_binding(self._registry, req.agent_id, req.capability)
            child_id = req.subagent_id or self._ids.new_id()
            scope = req.scope or f"resource:runtime-thread/{child_id}"
            parse_scope(scope)
            now = self._clock.now()
            child = ThreadRecord(
                child_id, session.session_id, req.agent_id, scope, QueuePolicy.QUEUE.value,
                ThreadStatus.IDLE.value, now, now, parent_thread_id=parent.thread_id,
                parent_turn_id=req.turn_id, role=req.role, capability=req.capability,
            )  # fmt: skip
            facts = [
                Fact(
                    _T.THREAD_STARTED, session.session_id, child.thread_id,
                    agent_id=child.agent_id, status=child.status,
                    payload={**binding_of(child), "queuePolicy": child.queue_policy,
                             "parentThreadId": parent.thread_id},
                ),
                subagent_fact(_T.SUBAGENT_SPAWNED, child,
                              {"role": req.role or None, "scope": scope}),
            ]  # fmt: skip
            keys = self._keys.keep(key, {"subagentId": child.thread_id})
            await self._facts.commit(RuntimeWrite(threads=(child,), keys=keys), facts,
                                     caller.label)  # fmt: skip
        answer = {**await self._answer(child), "created": True}
        if req.input_json:
            answer["input"] = await self._input(caller, child, req.input_json, "", None)
        return answer

    # ------------------------------------------------------------------ input

    async def send_input(self, caller: Principal, req: SubagentInput) -> dict[str, Any]:
        """A turn on the child thread with `input` (`turn_id` when the caller names it)."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "send_subagent_input", req)
            child = await self._child(caller, req.subagent_id)
        turn_id = str(replayed["turnId"]) if replayed is not None else req.turn_id
        if child.closed_at and replayed is None:
            raise AlreadyCompletedError(
                f"subagent {child.thread_id} is closed: it takes no more input",
                {"field": "subagent_id", "subagent_id": child.thread_id},
            )
        return await self._input(caller, child, req.input_json, turn_id, key)

    async def _input(
        self, caller: Principal, child: ThreadRecord, input_json: str, turn_id: str,
        key: Any,
    ) -> dict[str, Any]:  # fmt: skip
        submitted = await self._submit(
            caller, SubmitTurn(input_json, thread_id=child.thread_id, turn_id=turn_id)
        )
        if submitted["created"] or key is not None:
            facts = []
            if submitted["created"]:
                payload = {"turnId": submitted["turnId"], "inputSize": len(input_json.encode())}
                facts.append(subagent_fact(_T.SUBAGENT_INPUT, child, payload))
            keys = self._keys.keep(key, {"turnId": submitted["turnId"]})
            async with self._lock:
                await self._facts.commit(RuntimeWrite(keys=keys), facts, caller.label)
        return {
            "subagentId": child.thread_id, "turnId": submitted["turnId"],
            "taskId": submitted["taskId"], "status": submitted["status"],
            "created": submitted["created"],
        }  # fmt: skip

    # ------------------------------------------------------------------ wait

    async def wait(self, caller: Principal, req: WaitSubagents) -> dict[str, Any]:
        """The children once every one (`mode: any`: one) settled, or as they stand at the
        timeout (`timedOut`)."""
        names = list(req.subagent_ids)
        if not names:
            session, parent = await self._reads.thread(caller, req.thread_id)
            names = [t.thread_id for t in await self._store.threads(session.session_id)
                     if t.parent_thread_id == parent.thread_id]  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout_s
        while True:
            sequence = await self._events.last_sequence()
            children = [await self._child(caller, name) for name in names]
            settled = [c for c in children if c.status in SETTLED]
            done = len(settled) == len(children) if req.mode == "all" else bool(settled)
            remaining = deadline - loop.time()
            if done or not children or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._events.wait_after(sequence)
        views = [await self._answer(c) for c in children]
        return {"subagents": views, "done": done or not children, "timedOut": not done}

    # ------------------------------------------------------------------ close

    async def close(self, caller: Principal, req: CloseSubagent) -> dict[str, Any]:
        """Interrupt the child's work (its queued turns cancelled), then close the thread."""
        async with self._lock:
            replayed, key = await self._keys.known(caller, "close_subagent", req)
            child = await self._child(caller, req.subagent_id)
            if replayed is not None:
                return {**await self._answer(child), "replayed": True}
            if child.closed_at:
                raise AlreadyCompletedError(
                    f"subagent {child.thread_id} is closed already",
                    {"field": "subagent_id", "subagent_id": child.thread_id},
                )
            reason = req.reason or f"subagent closed by {caller.label}"
            closed, interrupted = await self.close_held(child, reason, caller.label, key)
        return {**await self._answer(closed), "interruptedTurns": interrupted}

    async def close_held(
        self, child: ThreadRecord, reason: str, actor: str, key: Any = None
    ) -> tuple[ThreadRecord, list[str]]:
        """Close `child` (the lock held): its turn is interrupted and its queued turns
        cancelled (each recording its intent first, and closing the subagents spawned
        with them), then the thread is closed (`subagent.closed`). The closed thread and
        the turns it stopped."""
        open_turns = await self._store.open_turns(child.thread_id)
        interrupted: list[str] = []
        if open_turns:
            target = next(
                (t for t in open_turns if t.turn_id == child.active_turn_id), open_turns[0]
            )
            turn, cleared, _ = await self._stop(target, child, reason, actor, clear=True)
            interrupted = [turn.turn_id, *cleared]
        child = await self._store.thread(child.thread_id) or child
        now = self._clock.now()
        closed = replace(child, closed_at=now, updated_at=now)
        fact = subagent_fact(
            _T.SUBAGENT_CLOSED, closed, {"reason": reason, "interruptedTurns": interrupted}
        )
        keys = self._keys.keep(key, {"subagentId": child.thread_id})
        await self._facts.commit(RuntimeWrite(threads=(closed,), keys=keys), [fact], actor)
        return closed, interrupted

    async def close_spawned(
        self, parent: ThreadRecord, turn_id: str, reason: str, actor: str
    ) -> list[str]:
        """Close the open subagents spawned with the parent's turn `turn_id` (the lock
        held: an interrupt of that turn propagates to them); their ids."""
        threads = await self._store.threads(parent.session_id)
        spawned = [
            t for t in threads
            if t.parent_thread_id == parent.thread_id and t.parent_turn_id == turn_id
            and not t.closed_at
        ]  # fmt: skip
        for child in spawned:
            await self.close_held(child, reason, actor)
        return [child.thread_id for child in spawned]

    async def close_named(self, subagent_id: str, owner: str, reason: str, actor: str) -> bool:
        """Close the subagent `subagent_id` when it is open and its session is `owner`'s
        (the lock held: a cancelled task's subagent edge propagates to it); whether it
        was closed."""
        child = await self._store.thread(subagent_id)
        if child is None or not child.parent_thread_id or child.closed_at:
            return False
        session = await self._store.session(child.session_id)
        if session is None or session.owner != owner:
            return False
        await self.close_held(child, reason, actor)
        return True

    # ------------------------------------------------------------------ list

    async def list(self, caller: Principal, req: ListSubagents) -> dict[str, Any]:
        """The parent-child graph of a session's threads (of one thread's children when
        `thread_id` is named), each child as it stands."""
        if req.thread_id:
            session, parent = await self._reads.thread(caller, req.thread_id, req.session_id)
            threads = await self._store.threads(session.session_id)
            children = [t for t in threads if t.parent_thread_id == parent.thread_id]
        else:
            session = await self._reads.session(caller, req.session_id)
            threads = await self._store.threads(session.session_id)
            children = [t for t in threads if t.parent_thread_id]
        return {
            "sessionId": session.session_id,
            "subagents": [await self._answer(c) for c in children],
            "graph": graph(children),
        }

    async def _answer(self, child: ThreadRecord) -> dict[str, Any]:
        child = await self._store.thread(child.thread_id) or child
        last = await self._store.turns(child.thread_id, 1)
        return subagent_view(child, last[-1] if last else None)
