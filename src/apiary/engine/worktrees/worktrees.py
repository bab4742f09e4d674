"""Worktree bindings (RFC 16) in the engine: the pure machine with memory, git, timers, HITL.

`apiary.core.worktrees.machine` decides; `Worktrees` keeps every agent's binding (stored, and
recovered by `load`), makes the real git worktrees (engine/worktrees/git.py), runs the retry,
recovery and TTL timers (engine/timers.py, on the injected clock), asks HITL for switches
and escalates bind failures (engine/hitl.py; engine/worktrees/approvals.py applies the
decisions), logs every transition as a `worktree.binding` event with repo_id and worktree_id
(committed with the binding it records, in one transaction), and tells the agent its new
status through the `notify` it is given (WorktreeStatus, engine/worktrees/control.py).

Other parts ask `bound_root(agent_id)` where an agent may work (None: unbound, and
BIND_FAILED counts as unbound) and `binding(agent_id)` for the whole record.

Decisions beyond the machine:
- One lock per agent: an agent's operations, timers and HITL decisions apply one at a time,
  git work included; different agents proceed in parallel.
- A home belongs to one agent: binding a worktree that is another agent's home fails with
  worktree_locked (16.3 "locked"), and retries apply as for any failure. A non-home switch
  may target any worktree: that is what the HITL approval is for.
- The git worktree of the target is made when a switch is approved; when that fails the
  switch is rejected, with the reason in its note.
- UNBIND leaves the git worktree on disk: a later BIND of the same worktree reuses it.
- A deadline that has passed applies before any later operation on the agent, and
  `bound_root` never answers a non-home worktree whose TTL is over, however late the timer
  loop is.
- On `load`, a bound agent whose worktree directory is gone gets it made again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from apiary.core.clock import Clock
from apiary.core.events import EventDraft
from apiary.core.machine import IllegalTransitionError
from apiary.core.worktrees.machine import (
    FAILURE_REASONS,
    BindingEffect,
    BindingInput,
    BindingMachine,
    BindingPolicy,
    BindingStep,
)
from apiary.core.worktrees.records import (
    BindingState,
    BindingTimer,
    Location,
    WorktreeBinding,
    is_bound,
)
from apiary.engine.deadlines import Sleep, run_deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.notices import RESERVED_IDS, WORKTREES
from apiary.engine.timers import Timers
from apiary.engine.worktrees.approvals import Approvals
from apiary.engine.worktrees.git import GitWorktrees
from apiary.engine.worktrees.refusals import refusal
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.errors import ApiaryError, ValidationError, WorktreeLockedError
from apiary.store.protocols import WorktreeStore

log = logging.getLogger(__name__)

Notify = Callable[[WorktreeBinding, Path | None, str, str], Awaitable[None]]
"""(record, its directory, event, in_reply_to) -> tell the agent its status
(engine/worktrees/control.py)."""

_S = BindingState
_I = BindingInput
_F = BindingEffect
_M = BindingMachine
_SEP: Final = "\x1f"


@dataclass(slots=True)
class _Context:
    """Who caused an operation, and the request to answer (a WORKTREE_CONTROL message id)."""

    actor: str
    correlation_id: str = ""
    reply_to: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Worktrees:
    """Every agent's worktree binding, its timers and its transitions."""

    def __init__(
        self,
        store: WorktreeStore,
        events: EventRecorder,
        clock: Clock,
        hitl: Hitl,
        git: GitWorktrees,
        notify: Notify,
        settings: WorktreeSettings | None = None,
    ) -> None:
        self.settings = settings or WorktreeSettings()
        self.git = git
        self._notify_agent = notify
        self._listeners: list[Callable[[str], None]] = []
        self._store = store
        self._events = events
        self._clock = clock
        self._bindings: dict[str, WorktreeBinding] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._timers = Timers()
        self._changed = asyncio.Condition()
        self.approvals = Approvals(self, hitl, events, self.settings.hitl_timeout_s)

    @property
    def policy(self) -> BindingPolicy:
        return self.settings.policy

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with the agent id whenever a binding is stored (the Scheduler
        wakes its worktree tasks); it must not block."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ queries

    def binding(self, agent_id: str) -> WorktreeBinding:
        """The agent's binding; an UNBOUND record of version 0 when it never had one."""
        return self._bindings.get(agent_id) or WorktreeBinding(agent_id)

    def bound_root(self, agent_id: str) -> Path | None:
        """The directory of the worktree the agent may work in now; None when it is not bound
        (UNBOUND, BIND_FAILED). While a switch is pending that is still the home; a non-home
        worktree whose TTL is over is never answered, even before its timer has fired."""
        record = self._bindings.get(agent_id)
        if record is None or not is_bound(record.state):
            return None
        where = record.current
        expired = record.state == _S.BOUND_NON_HOME and record.expires_at <= self._clock.now()
        if expired or where is None:
            where = record.home
        return None if where is None else self.git.path_for(where.repo_id, where.worktree_id)

    def path_of(self, record: WorktreeBinding) -> Path | None:
        """The directory of the record's current worktree (None when it has none)."""
        where = record.current if is_bound(record.state) else None
        return None if where is None else self.git.path_for(where.repo_id, where.worktree_id)

    def list(
        self, states: frozenset[str] | None = None, repo_id: str | None = None
    ) -> list[WorktreeBinding]:
        """Bindings in `states` whose home or current repository is `repo_id`, by agent."""
        return [
            r
            for _, r in sorted(self._bindings.items())
            if (states is None or r.state in states)
            and (repo_id is None or repo_id in (r.repo_id, r.current_repo_id))
        ]

    async def wait_for(self, agent_id: str, *states: BindingState) -> WorktreeBinding:
        """Return once the agent's binding is in one of `states` (callers bound the wait)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.binding(agent_id).state in states)
        return self.binding(agent_id)

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> int:
        """Recover every binding from the store after a (re)start: timers re-armed, pending
        HITL decisions awaited again, missing worktree directories made again."""
        records = await self._store.list()
        for record in records:
            self._bindings[record.agent_id] = record
            self._arm(record)
        for record in records:
            if record.invocation_id and record.state in (_S.SWITCH_PENDING, _S.BIND_FAILED):
                self.approvals.watch(record.agent_id, record.invocation_id)
            if is_bound(record.state):
                await self._restore(record)
        if records:
            await self._events.record("worktree.recovered", WORKTREES, bindings=len(records))
        return len(records)

    async def _restore(self, record: WorktreeBinding) -> None:
        home = record.home
        for where in {home, record.current} - {None}:
            assert where is not None
            path = self.git.path_for(where.repo_id, where.worktree_id)
            if path is None or await asyncio.to_thread(path.is_dir):
                continue
            # The home on its own branch and start; a non-home worktree on its default branch.
            branch, start = (record.branch, record.commit_sha) if where == home else ("", "")
            try:
                await self.git.ensure(where.repo_id, where.worktree_id, branch, start)
            except ApiaryError as exc:
                await self._events.record(
                    "worktree.restore_failed", WORKTREES, agent_id=record.agent_id,
                    repo_id=where.repo_id, worktree_id=where.worktree_id, error_code=exc.code,
                    error=exc.message,
                )  # fmt: skip

    async def close(self) -> None:
        await self.approvals.close()

    # ------------------------------------------------------------------ operations

    async def bind(
        self, agent_id: str, repo_id: str, worktree_id: str, *, branch: str = "",
        commit_sha: str = "", actor: str = "", correlation_id: str = "", reply_to: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """BIND: make (or reuse) the git worktree and bind it as the agent's home. A failure
        of the worktree itself moves the agent to BIND_FAILED with the reason (the record
        says so); a BIND the agent's state does not allow raises and changes nothing."""
        _check_agent(agent_id)
        for name, value in (("repo_id", repo_id), ("worktree_id", worktree_id)):
            if not value:
                raise ValidationError.for_field(name, "is required")
        context = _Context(actor or agent_id, correlation_id, reply_to)
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            if not _M.allows(record.state, _I.BIND_OK):
                raise refusal(record, _I.BIND_OK)
            location = Location(repo_id, worktree_id)
            return await self._bind(record, location, branch, commit_sha, context)

    async def unbind(
        self, agent_id: str, *, actor: str = "", note: str = "", correlation_id: str = "",
        reply_to: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """UNBIND: from a home, a non-home worktree or BIND_FAILED back to UNBOUND."""
        _check_agent(agent_id)
        context = _Context(actor or agent_id, correlation_id, reply_to)
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            return await self._apply(record, _I.UNBIND, context, note=note or "unbound")

    async def request_switch(
        self, agent_id: str, worktree_id: str, *, repo_id: str = "", ttl_s: float = 0.0,
        requires_hitl: bool = True, actor: str = "", correlation_id: str = "",
        reply_to: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """SWITCH_REQUEST: ask to work in a non-home worktree (of the home repository unless
        `repo_id` names another) for `ttl_s` seconds; HITL decides (WORKTREE_OVERRIDE)."""
        _check_agent(agent_id)
        if not worktree_id:
            raise ValidationError.for_field("target_worktree_id", "is required")
        context = _Context(actor or agent_id, correlation_id, reply_to)
        context.extra["requires_hitl"] = requires_hitl
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            if not _M.allows(record.state, _I.SWITCH_REQUEST):
                raise refusal(record, _I.SWITCH_REQUEST)
            location = Location(repo_id or record.repo_id, worktree_id)
            self.git.repository(location.repo_id)  # an unknown repository: nothing to ask
            return await self._apply(
                record, _I.SWITCH_REQUEST, context, location=location, ttl_s=ttl_s,
                note=f"switch to {location} requested by {context.actor}",
            )  # fmt: skip

    async def approve_switch(
        self, agent_id: str, *, worktree_id: str = "", ttl_s: float = 0.0, actor: str = "",
        note: str = "", correlation_id: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """SWITCH_APPROVE: the pending switch happens, for `ttl_s` (0: as requested, else the
        default); its HITL invocation, if still open, is cancelled."""
        _check_agent(agent_id)
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            return await self.approve_locked(
                record, actor or WORKTREES, worktree_id=worktree_id, ttl_s=ttl_s, note=note,
                correlation_id=correlation_id,
            )  # fmt: skip

    async def reject_switch(
        self, agent_id: str, reason: str = "", *, actor: str = "", correlation_id: str = "",
        reply_to: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """SWITCH_REJECT: the pending switch does not happen; the agent stays home."""
        _check_agent(agent_id)
        context = _Context(actor or WORKTREES, correlation_id, reply_to)
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            note = f"switch rejected by {context.actor}" + (f": {reason}" if reason else "")
            return await self._apply(record, _I.SWITCH_REJECT, context, note=note)

    async def revoke_switch(
        self, agent_id: str, reason: str = "", *, actor: str = "", correlation_id: str = "",
        reply_to: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """SWITCH_REVOKE: end a non-home binding before its TTL; the agent returns home."""
        _check_agent(agent_id)
        context = _Context(actor or WORKTREES, correlation_id, reply_to)
        async with self._lock(agent_id):
            record = await self._settled(agent_id)
            note = f"switch revoked by {context.actor}" + (f": {reason}" if reason else "")
            return await self._apply(record, _I.SWITCH_REVOKE, context, note=note)

    # ------------------------------------------------------------------ for approvals

    def lock(self, agent_id: str) -> asyncio.Lock:
        return self._lock(agent_id)

    async def approve_locked(
        self, record: WorktreeBinding, actor: str, *, worktree_id: str = "", ttl_s: float = 0.0,
        note: str = "", correlation_id: str = "",
    ) -> WorktreeBinding:  # fmt: skip
        """SWITCH_APPROVE with the agent's lock held: make the target worktree, then switch;
        a target that cannot be made rejects the switch instead."""
        context = _Context(actor, correlation_id)
        if not _M.allows(record.state, _I.SWITCH_APPROVE):
            raise refusal(record, _I.SWITCH_APPROVE)
        target = record.target
        assert target is not None
        location = Location(target.repo_id, worktree_id) if worktree_id else None
        # Arguments are checked before any git work: a bad TTL or target changes nothing.
        _M.step(record, _I.SWITCH_APPROVE, self._clock.now(), location=location, ttl_s=ttl_s,
                policy=self.policy)  # fmt: skip
        try:
            await self.git.ensure(target.repo_id, target.worktree_id)
        except ApiaryError as exc:
            why = f"switch to {target} approved, but {exc.code}: {exc.message}"
            return await self._apply(record, _I.SWITCH_REJECT, context, note=why)
        return await self._apply(
            record, _I.SWITCH_APPROVE, context, location=location, ttl_s=ttl_s,
            note=note or f"switch to {target} approved by {context.actor}",
        )  # fmt: skip

    async def reject_locked(
        self, record: WorktreeBinding, actor: str, note: str
    ) -> WorktreeBinding:
        return await self._apply(record, _I.SWITCH_REJECT, _Context(actor), note=note)

    async def retry_locked(self, record: WorktreeBinding, actor: str) -> WorktreeBinding:
        """A new BIND of the worktree a BIND_FAILED agent asked for (an operator's retry)."""
        home = record.home
        assert home is not None
        return await self._bind(record, home, record.branch, record.commit_sha, _Context(actor))

    def current(self, agent_id: str) -> WorktreeBinding | None:
        return self._bindings.get(agent_id)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        return self._timers.next()

    async def fire_due(self) -> int:
        """Apply every retry, recovery and TTL deadline due at the clock's now."""
        fired = 0
        for key in self._timers.due(self._clock.now()):
            _, _, agent_id = key.partition(_SEP)
            async with self._lock(agent_id):
                try:
                    fired += await self._fire(agent_id)
                except Exception as exc:  # the loop must go on for every other agent
                    log.exception("worktree timer %s failed", key)
                    await self._events.record(
                        "worktree.timer_failed", WORKTREES, agent_id=agent_id,
                        timer=key.partition(_SEP)[0], error=f"{type(exc).__name__}: {exc}",
                    )  # fmt: skip
        return fired

    async def run(self, sleep: Sleep) -> None:
        """Forever: wait for the earliest deadline (or an earlier one), then fire."""
        await run_deadlines(self._timers, self._clock, self.fire_due, sleep)

    async def _settled(self, agent_id: str) -> WorktreeBinding:
        """The agent's binding after every deadline already due has applied (lock held)."""
        await self._fire(agent_id)
        return self.binding(agent_id)

    async def _fire(self, agent_id: str) -> int:
        fired = 0
        while (record := self._bindings.get(agent_id)) is not None:
            due = _M.due(record, self._clock.now())
            if not due:
                self._arm(record)
                return fired
            fired += 1
            context = _Context(WORKTREES)
            timer = due[0]
            if timer is BindingTimer.TTL:
                await self._apply(record, _I.TTL_EXPIRED, context, note="TTL expired")
            elif timer is BindingTimer.RECOVERY:
                note = f"bind recovery timeout ({self.policy.recovery_timeout_s:g} s)"
                await self._apply(record, _I.RECOVERY_TIMEOUT, context, note=note)
            else:
                await self._retry(record, context)
        return fired

    async def _retry(self, record: WorktreeBinding, context: _Context) -> None:
        home = record.home
        assert home is not None
        try:
            self._check_home_free(record.agent_id, home)
            await self.git.ensure(home.repo_id, home.worktree_id, record.branch, record.commit_sha)
        except ApiaryError as exc:
            if exc.code not in FAILURE_REASONS:
                raise
            note = f"retry {record.attempts} failed: {exc.message}"
            await self._apply(record, _I.RETRY_ERROR, context, reason=exc.code, note=note)
            return
        await self._apply(record, _I.RETRY_OK, context, note=f"retry {record.attempts} succeeded")

    # ------------------------------------------------------------------ internals

    def _lock(self, agent_id: str) -> asyncio.Lock:
        lock = self._locks.get(agent_id)
        if lock is None:
            lock = self._locks[agent_id] = asyncio.Lock()
        return lock

    async def _bind(
        self, record: WorktreeBinding, location: Location, branch: str, commit_sha: str,
        context: _Context,
    ) -> WorktreeBinding:  # fmt: skip
        try:
            self._check_home_free(record.agent_id, location)
            path = await self.git.ensure(location.repo_id, location.worktree_id, branch, commit_sha)
        except ApiaryError as exc:
            if exc.code not in FAILURE_REASONS:
                raise
            return await self._apply(
                record, _I.BIND_ERROR, context, location=location, branch=branch,
                commit_sha=commit_sha, reason=exc.code, note=exc.message,
            )  # fmt: skip
        return await self._apply(
            record, _I.BIND_OK, context, location=location, branch=branch, commit_sha=commit_sha,
            note=f"bound to {location} at {path}",
        )  # fmt: skip

    def _check_home_free(self, agent_id: str, location: Location) -> None:
        for other in self._bindings.values():
            if other.agent_id != agent_id and is_bound(other.state) and other.home == location:
                raise WorktreeLockedError(
                    f"{location} is the home worktree of agent {other.agent_id}",
                    {"repo_id": location.repo_id, "worktree_id": location.worktree_id},
                )

    async def _apply(
        self, record: WorktreeBinding, event: BindingInput, context: _Context, **args: Any
    ) -> WorktreeBinding:
        try:
            step = _M.step(record, event, self._clock.now(), policy=self.policy, **args)
        except IllegalTransitionError:
            raise refusal(record, event) from None
        return await self._perform(step, context)

    async def _perform(self, step: BindingStep, context: _Context) -> WorktreeBinding:
        """The step's effects in order; the record as stored."""
        record = step.record
        for effect in step.effects:
            if effect is _F.REQUEST_APPROVAL:
                record = await self.approvals.request(
                    record, context.actor, context.correlation_id, context.extra
                )
            elif effect is _F.ESCALATE_TO_HITL:
                record = await self.approvals.escalate(record)
            elif effect is _F.CLOSE_INVOCATION:
                await self.approvals.close_invocation(step.before.invocation_id, context.actor)
            elif effect is _F.PERSIST:
                # The transition's event commits with the binding (EMIT_EVENT follows PERSIST
                # in every row, with nothing between that changes the record).
                drafts = (
                    [self._draft(step, record, context)] if _F.EMIT_EVENT in step.effects else []
                )
                await self._events.commit(drafts, partial(self._store.put, record))
                self._bindings[record.agent_id] = record
                for listener in self._listeners:
                    listener(record.agent_id)
            elif effect in (_F.START_TIMER, _F.CANCEL_TIMER):
                self._arm(record)
            elif effect is _F.EMIT_EVENT and _F.PERSIST not in step.effects:
                self._events.queue(self._draft(step, record, context))
            elif effect is _F.NOTIFY_AGENT:
                await self._notify(record, step.input, context.reply_to)
        async with self._changed:
            self._changed.notify_all()
        return await self.approvals.settle(record)

    async def _notify(self, record: WorktreeBinding, event: BindingInput, reply_to: str) -> None:
        try:
            await self._notify_agent(record, self.path_of(record), event.value.lower(), reply_to)
        except Exception as exc:  # the transition stands; the agent asks STATUS when it must
            log.exception("WORKTREE_CONTROL notice to %s failed", record.agent_id)
            await self._events.record(
                "worktree.notify_failed", WORKTREES, agent_id=record.agent_id,
                error=f"{type(exc).__name__}: {exc}",
            )  # fmt: skip

    def _arm(self, record: WorktreeBinding) -> None:
        for timer in BindingTimer:
            key = f"{timer}{_SEP}{record.agent_id}"
            at = record.deadline(timer)
            if at > 0:
                self._timers.arm(key, at)
            else:
                self._timers.cancel(key)

    def _draft(self, step: BindingStep, record: WorktreeBinding, context: _Context) -> EventDraft:
        """The transition's `worktree.binding` event."""
        where = _subject(step, record)
        return self._events.draft(
            "worktree.binding", context.actor, correlation_id=context.correlation_id,
            agent_id=record.agent_id, **{"from": step.before.state}, to=record.state,
            input=step.input.value, repo_id=where.repo_id if where else "",
            worktree_id=where.worktree_id if where else "", home=_text(record.home),
            current=_text(record.current), target=_text(record.target), reason=record.reason,
            note=record.note, attempts=record.attempts, version=record.version,
            invocation_id=record.invocation_id, deadlines=_deadlines(record),
        )  # fmt: skip


def _check_agent(agent_id: str) -> None:
    if not agent_id:
        raise ValidationError.for_field("agent_id", "is required")
    if agent_id in RESERVED_IDS:
        raise ValidationError.for_field("agent_id", f"{agent_id!r} is not an agent")


_SUBJECT_BEFORE: Final = frozenset({_I.SWITCH_REJECT, _I.SWITCH_REVOKE, _I.TTL_EXPIRED, _I.UNBIND})


def _subject(step: BindingStep, record: WorktreeBinding) -> Location | None:
    """The worktree a transition is about, for the log (RFC 19: repo_id/worktree_id)."""
    before = step.before
    if step.input is _I.SWITCH_REQUEST:
        return record.target
    if step.input is _I.SWITCH_REJECT:
        return before.target
    if step.input in _SUBJECT_BEFORE:
        return before.current or before.home
    return record.current or record.home


def _text(location: Location | None) -> str:
    return "" if location is None else str(location)


def _deadlines(record: WorktreeBinding) -> Mapping[str, float]:
    return {t.value: record.deadline(t) for t in BindingTimer if record.deadline(t)}


def build_worktrees(
    settings: WorktreeSettings,
    store: WorktreeStore,
    events: EventRecorder,
    clock: Clock,
    hitl: Hitl,
    data_dir: Path | None,
    notify: Notify,
) -> Worktrees:
    """The manager with worktrees under the configured root, else `<data_dir>/worktrees`
    (none without either), telling agents their status through `notify`."""
    root = settings.root or (data_dir / "worktrees" if data_dir else None)
    git = GitWorktrees(root, settings.repo_paths())
    return Worktrees(store, events, clock, hitl, git, notify, settings)
