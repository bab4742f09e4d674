"""HITL for worktree bindings (RFC 15, 16): the WORKTREE_OVERRIDE invocation of a switch
request, the operator escalation of a bind that cannot recover (16.3), and their decisions.

A switch's decision drives the machine: approve (or modify, whose patch may set `ttl_ms`)
-> SWITCH_APPROVE, anything else (deny, the deadline's fallback, a cancelled or lost
invocation) -> SWITCH_REJECT. An escalation's approve retries the BIND at once; any other
decision leaves the agent in BIND_FAILED for an operator's explicit UNBIND or BIND.

An invocation HITL decides while it is opened (no HITL component: RFC 15.3) is applied
before the operation that opened it returns; others are awaited by a task per invocation,
again after a restart (`watch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.hitl.vocabulary import HitlReason, HitlState
from apiary.core.records import HitlRecord
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.notices import WORKTREES
from apiary.errors import ApiaryError, NotFoundError

if TYPE_CHECKING:
    from apiary.engine.worktrees.worktrees import Worktrees

_APPROVING: Final = frozenset({"approve", "modify"})
_S = BindingState


class Approvals:
    def __init__(
        self, worktrees: Worktrees, hitl: Hitl, events: EventRecorder, timeout_s: float = 0.0
    ) -> None:
        self._worktrees = worktrees
        self._hitl = hitl
        self._events = events
        self._timeout_s = timeout_s
        self._opened: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def request(
        self, record: WorktreeBinding, actor: str, correlation_id: str, extra: Mapping[str, Any]
    ) -> WorktreeBinding:
        """Open the WORKTREE_OVERRIDE invocation of a switch request; the record with its id."""
        home, target = record.home, record.target
        assert home is not None and target is not None
        ttl_ms = round(record.ttl_s * 1000) if record.ttl_s else None
        invocation = await self._hitl.open(
            HitlReason.WORKTREE_OVERRIDE.value,
            {"reason": "non-home worktree switch (RFC 16)", "agent_id": record.agent_id,
             "home": str(home), "target": str(target), "ttl_ms": ttl_ms,
             "requested_by": actor, **extra,
             "approve": "the agent works in the target until its TTL ends",
             "modify": "approve with a patch {\"ttl_ms\": N} to change the TTL"},
            requested_by=record.agent_id,
            subject={"agent_id": record.agent_id, "repo_id": target.repo_id,
                     "worktree_id": target.worktree_id},
            suggested_action="deny", proposed_actions=("approve", "deny", "modify"),
            timeout_s=self._timeout_s, correlation_id=correlation_id,
        )  # fmt: skip
        self._opened.add(invocation.invocation_id)
        return _with_invocation(record, invocation.invocation_id)

    async def escalate(self, record: WorktreeBinding) -> WorktreeBinding:
        """Tell an operator that the agent's BIND has not recovered (16.3)."""
        home = record.home
        invocation = await self._hitl.open(
            HitlReason.WORKTREE_OVERRIDE.value,
            {"reason": "bind_failed: the BIND did not recover (RFC 16.3)",
             "agent_id": record.agent_id, "worktree": "" if home is None else str(home),
             "error_code": record.reason, "error": record.note, "attempts": record.attempts,
             "failed_since": iso_utc(record.entered_at),
             "approve": "retry the BIND now", "deny": "leave the agent unbound"},
            requested_by=record.agent_id,
            subject={"agent_id": record.agent_id,
                     "repo_id": record.repo_id, "worktree_id": record.worktree_id},
            suggested_action="deny", proposed_actions=("approve", "deny"),
            timeout_s=self._timeout_s,
        )  # fmt: skip
        self._opened.add(invocation.invocation_id)
        return _with_invocation(record, invocation.invocation_id)

    async def close_invocation(self, invocation_id: str, actor: str) -> None:
        """Cancel the invocation when it is still pending (decided some other way)."""
        if not invocation_id:
            return
        try:
            found = await self._hitl.get(invocation_id)
        except NotFoundError:
            return
        if found.state == HitlState.PENDING.value:
            await self._hitl.cancel(
                invocation_id, by=actor, reason="decided through the worktree service"
            )

    async def settle(self, record: WorktreeBinding) -> WorktreeBinding:
        """After a step (agent lock held): a just-opened invocation HITL has decided already
        is applied now; a pending one is awaited."""
        invocation_id = record.invocation_id
        if invocation_id not in self._opened:
            return record
        self._opened.discard(invocation_id)
        found = await self._hitl.get(invocation_id)
        if found.state == HitlState.PENDING.value:
            self.watch(record.agent_id, invocation_id)
            return record
        return await self.apply(record, found)

    def watch(self, agent_id: str, invocation_id: str) -> None:
        """Await the invocation's decision and apply it (in a task of its own)."""
        self._spawn(self._await(agent_id, invocation_id))

    async def _await(self, agent_id: str, invocation_id: str) -> None:
        try:
            decided: HitlRecord | None = await self._hitl.wait(invocation_id)
        except NotFoundError:
            decided = None
        async with self._worktrees.lock(agent_id):
            record = self._worktrees.current(agent_id)
            if record is None or record.invocation_id != invocation_id:
                return  # the binding moved on (decided directly, unbound): nothing to apply
            await self.apply(record, decided)

    async def apply(self, record: WorktreeBinding, decided: HitlRecord | None) -> WorktreeBinding:
        """Apply a decision to the binding it is about (agent lock held)."""
        decision = {} if decided is None else dict(decided.decision)
        action = str(decision.get("action", "deny")).lower()
        by = str(decision.get("decided_by") or WORKTREES)
        how = f"HITL {record.invocation_id}: {action} by {by}"
        if decision.get("via") and decision.get("via") != "operator":
            how += f" ({decision['via']})"
        if decided is None:
            how = f"HITL invocation {record.invocation_id} is lost"
        if record.state == _S.SWITCH_PENDING:
            if action not in _APPROVING:
                return await self._worktrees.reject_locked(record, by, how)
            try:
                return await self._worktrees.approve_locked(
                    record, by, ttl_s=_patched_ttl(decision), note=how
                )
            except ApiaryError as exc:  # e.g. a patch with a TTL beyond the limit
                return await self._worktrees.reject_locked(record, by, f"{how}; {exc}")
        if record.state == _S.BIND_FAILED:
            await self._events.record(
                "worktree.escalation_decided", by, agent_id=record.agent_id,
                invocation_id=record.invocation_id, action=action, repo_id=record.repo_id,
                worktree_id=record.worktree_id,
            )  # fmt: skip
            if action in _APPROVING:
                return await self._worktrees.retry_locked(record, by)
        return record

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _with_invocation(record: WorktreeBinding, invocation_id: str) -> WorktreeBinding:
    return replace(record, invocation_id=invocation_id)


def _patched_ttl(decision: Mapping[str, Any]) -> float:
    """The TTL (seconds) a modify decision's patch sets; 0.0 when it sets none."""
    patch = decision.get("patch")
    value = patch.get("ttl_ms") if isinstance(patch, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) / 1000.0
