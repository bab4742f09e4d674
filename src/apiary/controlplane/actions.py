"""Actions (core/runtime/actions.py): HITL invocations opened for a turn's task or an agent
task's run, reported to the session as `action.required` and `action.resolved`, and decided
by `respond_action` through the HITL engine (`Hitl.decide`, as the HITL inbox decides).

A follower watches the HITL engine (`Hitl.changed`): each pending invocation that names a
turn's or run's Scheduler task (its subject's or context's `task_id`, its correlation id) or
was opened by an agent while it held one becomes an action, stored with its event; each
stored action whose invocation is no longer pending is resolved with its event, whoever
decided it (respond_action, an operator, the deadline's fallback, the unavailability
policy). The runtime never decides an action itself: left alone, the HITL policy's timeout
action applies at its deadline (deny by default).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.facts import RUNTIME_ACTOR, FactWriter
from apiary.controlplane.requests import Params
from apiary.controlplane.task_requests import Keyed
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.clock import Clock
from apiary.core.hitl.vocabulary import HitlState
from apiary.core.records import HitlRecord
from apiary.core.runtime.actions import (
    ActionKind,
    ActionRecord,
    ActionState,
    candidate_tasks,
    decisions,
    pending_request,
    required_payload,
    resolved_payload,
)
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.permissions import resolution
from apiary.core.runtime.records import RuntimeWrite, may_use
from apiary.core.runtime.task_records import CommandKeyRecord
from apiary.engine.hitl import Hitl
from apiary.engine.operators import Operator
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import (
    AlreadyCompletedError,
    NotFoundError,
    UnavailableError,
    ValidationError,
)
from apiary.stopping import stop_tasks

log = logging.getLogger("apiary.controlplane")
_T = RuntimeEventType


@dataclass(frozen=True, slots=True)
class RespondAction(Keyed):
    """respond_action's parameters; a retry under its `idempotency_key` answers the first
    decision's answer (`replayed`) instead of already_completed."""

    action_id: str
    decision: str
    rationale: str = ""
    patch: dict[str, Any] | None = None

    @classmethod
    def read(cls, p: Params) -> RespondAction:
        patch = None
        if p.has("patch"):
            patch = p.json("patch", 256 * 1024)
            if not isinstance(patch, dict):
                raise ValidationError.for_field("patch", "must be a JSON object")
        return cls(
            idempotency_key=p.id("idempotency_key"),
            action_id=p.id("action_id", required=True),
            decision=p.id("decision", required=True).lower(),
            rationale=p.text("rationale"),
            patch=patch,
        )


class Actions:
    """The actions of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, hitl: Hitl | None, scheduler: Scheduler, clock: Clock,
        lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._hitl = hitl
        self._scheduler = scheduler
        self._clock = clock
        self._lock = lock
        self._keys = CommandKeys(facts.store, clock)
        self._foreign: set[str] = set()
        """Pending invocations that are no runtime action (not looked up again)."""
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ following

    def start(self) -> None:
        if self._hitl is not None and self._watcher is None:
            self._watcher = asyncio.create_task(
                self._watch(self._hitl), name="apiary-runtime-actions"
            )

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await stop_tasks([watcher], "runtime actions watcher")

    async def _watch(self, hitl: Hitl) -> None:
        seen = -1
        while True:
            async with hitl.changed:
                while hitl.version == seen:
                    await hitl.changed.wait()
                seen = hitl.version
            try:
                async with self._lock:
                    await self.sync()
            except Exception:  # a store outage, say: the next change syncs again
                log.exception("runtime actions: sync failed")

    async def sync(self) -> None:
        """Report new pending invocations of runtime work, and resolve the stored actions
        whose invocations were decided (the lock held)."""
        hitl = self._hitl
        if hitl is None:
            return
        pending = {r.invocation_id: r for r in await hitl.list(limit=10_000)}
        known = {a.action_id: a for a in await self._store.open_actions()}
        for record in pending.values():
            if record.invocation_id in known or record.invocation_id in self._foreign:
                continue
            if await self._store.action(record.invocation_id) is None:
                await self._required(record)
        for action in known.values():
            if action.action_id not in pending:
                await self.resolved(action, await self._record(action.action_id))
        self._foreign &= set(pending)

    async def _record(self, action_id: str) -> HitlRecord | None:
        assert self._hitl is not None
        try:
            return await self._hitl.get(action_id)
        except NotFoundError:
            return None

    async def _scope(self, record: HitlRecord) -> ActionRecord | None:
        """The action an invocation is, from the turn or run it names (or its agent holds)."""
        names = candidate_tasks(record)
        if record.requested_by:
            names += [t.task_id for t in self._scheduler.holding(record.requested_by)]
        now = self._clock.now()
        for task_id in names:
            turn = await self._store.turn_of_task(task_id)
            if turn is not None:
                return ActionRecord(
                    record.invocation_id, turn.session_id, ActionState.PENDING.value, now, now,
                    thread_id=turn.thread_id, turn_id=turn.turn_id, task_id=task_id,
                )  # fmt: skip
            run = await self._store.run(task_id)
            task = await self._store.task(run.task_id) if run is not None else None
            if run is not None and task is not None:
                return ActionRecord(
                    record.invocation_id, task.session_id, ActionState.PENDING.value, now, now,
                    thread_id=task.thread_id, task_id=task.task_id, run_id=run.run_id,
                )  # fmt: skip
        return None

    def _fact(
        self, kind: str, action: ActionRecord, payload: dict[str, Any], status: str = "",
        **extra: Any,
    ) -> Fact:  # fmt: skip
        return Fact(
            kind, action.session_id, action.thread_id, action.turn_id, task_id=action.task_id,
            run_id=action.run_id, status=status or action.state, payload=payload,
            extra={"actionId": action.action_id, **extra},
        )  # fmt: skip

    async def _required(self, record: HitlRecord) -> None:
        action = await self._scope(record)
        if action is None:
            self._foreign.add(record.invocation_id)
            return
        scope = {"sessionId": action.session_id, "threadId": action.thread_id,
                 "turnId": action.turn_id, "taskId": action.task_id}  # fmt: skip
        fact = self._fact(_T.ACTION_REQUIRED, action, required_payload(record, scope))
        await self._facts.commit(RuntimeWrite(actions=(action,)), [fact], RUNTIME_ACTOR)

    async def resolved(
        self, action: ActionRecord, record: HitlRecord | None,
        keys: tuple[CommandKeyRecord, ...] = (),
    ) -> ActionRecord:  # fmt: skip
        """Store `action` resolved as its invocation `record` ended (None: lost), with its
        event: `action.resolved`, or `permission.resolved` for a permission (which only an
        approval allows); `keys`: the deciding command's idempotency key, kept with it."""
        permission = action.kind == ActionKind.PERMISSION
        payload: dict[str, Any]
        if record is None:
            payload = {"decision": None, "approved": False, "via": "lost"}
            if permission:
                payload.update(allowed=False, status="denied")
        else:
            payload = resolution(record) if permission else resolved_payload(record)
        after = replace(
            action, state=ActionState.RESOLVED.value, updated_at=self._clock.now(),
            decision=str(payload.get("decision") or ""), via=str(payload["via"]),
        )  # fmt: skip
        if permission:
            status = "allowed" if payload["approved"] else "denied"
            fact = self._fact(_T.PERMISSION_RESOLVED, after, payload, status=status,
                              permissionDecision={"status": status,
                                                  "decision": payload["decision"]})  # fmt: skip
        else:
            fact = self._fact(_T.ACTION_RESOLVED, after, payload)
        await self._facts.commit(RuntimeWrite(actions=(after,), keys=keys), [fact], RUNTIME_ACTOR)
        return after

    # ------------------------------------------------------------------ reads

    async def pending(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's pending actions as a thread read's pending requests."""
        found = []
        for action in await self._store.open_actions():
            if action.thread_id == thread_id:
                record = await self._record(action.action_id) if self._hitl else None
                found.append(pending_request(action, record))
        return found

    # ------------------------------------------------------------------ respond_action

    async def respond(self, caller: Principal, req: RespondAction) -> dict[str, Any]:
        """Decide the action as `caller` (the session's owner, or an operator with
        `tasks`): the HITL engine checks the invocation's approver roles, its deadline and
        the decision; the action is resolved with its event before the answer."""
        if self._hitl is None:
            raise UnavailableError("this control plane has no HITL engine to decide actions on")
        async with self._lock:
            replayed, key = await self._keys.known(caller, "respond_action", req)
            if replayed is not None:
                return {**replayed, "replayed": True}
            await self.sync()
            action = await self._store.action(req.action_id)
            session = await self._store.session(action.session_id) if action else None
            if action is None or session is None or not may_use(caller, session.owner):
                raise NotFoundError(
                    f"no action {req.action_id!r}",
                    {"field": "action_id", "action_id": req.action_id},
                )
            if action.kind == ActionKind.PERMISSION:
                raise ValidationError.for_field(
                    "action_id", f"{action.action_id} is a permission: resolve_permission "
                    "decides it",
                )  # fmt: skip
            if action.state == ActionState.RESOLVED:
                outcome = action.decision or "no decision"
                raise AlreadyCompletedError(
                    f"action {action.action_id} was resolved already ({outcome} via {action.via})",
                    {"field": "action_id", "action_id": action.action_id, "via": action.via},
                )
            record = await self._hitl.get(action.action_id)
            if req.decision not in decisions(record):
                raise ValidationError.for_field(
                    "decision", f"must be one of: {', '.join(decisions(record))}"
                )
            roles = caller.roles if caller.kind is PrincipalKind.OPERATOR else frozenset()
            rationale = req.rationale or f"decided by {caller.label} (respond_action)"
            decided = await self._hitl.decide(
                action.action_id, req.decision, Operator(caller.label, frozenset(roles)),
                rationale, req.patch,
            )  # fmt: skip
            if decided.state == HitlState.PENDING.value:  # deferred: its deadline moved
                answer: dict[str, Any] = {"actionId": action.action_id, "status": action.state,
                                          "deadline": decided.deadline}  # fmt: skip
                if key is not None:
                    write = RuntimeWrite(keys=self._keys.keep(key, answer))
                    await self._facts.commit(write, [], caller.label)
                return answer
            answer = {
                "actionId": action.action_id, "status": ActionState.RESOLVED.value,
                "decision": resolved_payload(decided),
            }  # fmt: skip
            await self.resolved(action, decided, self._keys.keep(key, answer))
        return answer
