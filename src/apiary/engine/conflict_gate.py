"""Scope-conflict analysis between a task about to start and the running ones (RFC 9.2, 9.3).

For each pair (candidate, running task on another agent, or on the same agent when it runs
several tasks at once) the gate asks the Inference Engine (unless a policy override decides),
applies core/conflicts.py, and remembers the outcome until either task ends. ESCALATE opens
one HITL invocation (reason CONFLICT) per pair; the candidate waits until the decision
arrives, then `on_decided(task_id)` tells the Scheduler to try again. Every decision is a
`scheduler.conflict` event (engine, confidence, outcome, reason, invocation) and counted in
`stats`, so concurrency patterns, confidence scores and HITL escalation rates can be
monitored (RFC 9.3 SHOULD).

With the built-in rule-based engine, a candidate is compared only with the running tasks its
scope might meet (`core.scope_index`): a pair in different repositories with no shared
resource is safe with full confidence and needs neither a consult nor an event, so a dispatch
costs O(running tasks in its repositories), not O(running tasks). Pluggable engines are
consulted for every pair, as are pairs whose operation types a policy override governs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from apiary.core.conflicts import (
    ConflictOutcome,
    ConflictPolicy,
    ParallelMode,
    decide,
    hitl_outcome,
)
from apiary.core.records import HitlRecord, TaskRecord
from apiary.core.scope_index import RunningScopes
from apiary.core.scope_overlap import Scope, parse_scope
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.inference import InferenceEngine, RuleInference, consult
from apiary.engine.notices import SCHEDULER

PENDING = "PENDING"
"""A pair waiting for its HITL decision."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """A running task the candidate must not start beside, and why."""

    task_id: str
    outcome: str
    """SERIALIZE, or PENDING while HITL decides."""
    reason: str
    invocation_id: str = ""


class ConflictGate:
    def __init__(
        self,
        policy: ConflictPolicy,
        inference: InferenceEngine,
        hitl: Hitl,
        events: EventRecorder,
        on_decided: Callable[[str], None],
        *,
        inference_timeout_s: float = 5.0,
        hitl_timeout_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self.inference = inference
        self._hitl = hitl
        self._events = events
        self._on_decided = on_decided
        self._timeout = inference_timeout_s
        self._hitl_timeout = hitl_timeout_s
        self._pairs: dict[tuple[str, str], Blocker | None] = {}
        self._by_task: dict[str, set[tuple[str, str]]] = {}
        """Task -> the pairs it is in, so that forgetting a task is O(its pairs)."""
        self._scopes: dict[str, Scope] = {}
        self._running = RunningScopes()
        self._waiters: set[asyncio.Task[None]] = set()
        self.stats: Counter[str] = Counter()
        """Decisions by outcome, escalations, engine failures (not yet exported at /metrics)."""
        self.confidences: list[float] = []
        """The last 1,000 confidence scores the engine returned."""

    def started(self, task: TaskRecord) -> None:
        """`task` runs now: index its scope for the candidates that come after it."""
        scope = self._scope(task)
        self._running.add(task.task_id, scope, always=scope.operation in self.policy.overrides)

    def withdrawn(self, task_id: str) -> None:
        """`task_id` did not start after all (its dispatch was not sent yet, or failed): no
        longer a running scope; the pairs assessed with it are kept."""
        self._running.remove(task_id)

    async def blockers(
        self,
        task: TaskRecord,
        running: Collection[str],
        tasks: Mapping[str, TaskRecord],
        *,
        agent_id: str | None = None,
        alone: bool = True,
    ) -> list[Blocker]:
        """What keeps `task` from starting now on `agent_id` (default: its own agent); empty
        when it may start. `running` are the running tasks' ids (each `started`), `tasks` the
        records by id. The agent's own tasks are compared too unless it runs one at a time
        (`alone`: they cannot run beside it)."""
        runs_on = task.agent_id if agent_id is None else agent_id
        found: list[Blocker] = []
        for task_id in self._compared(task, running):
            other = tasks.get(task_id)
            if other is None or task_id == task.task_id or (alone and other.agent_id == runs_on):
                continue
            key = (task.task_id, other.task_id)
            if key not in self._pairs:
                self._pairs[key] = await self._assess(task, other)
                for member in key:
                    self._by_task.setdefault(member, set()).add(key)
            blocker = self._pairs[key]
            if blocker is not None:
                found.append(blocker)
        return found

    def forget(self, task_id: str) -> None:
        """`task_id` ended: every pair it is in is moot."""
        self._scopes.pop(task_id, None)
        self._running.remove(task_id)
        for key in self._by_task.pop(task_id, set()):
            self._pairs.pop(key, None)
            other = key[1] if key[0] == task_id else key[0]
            pairs = self._by_task.get(other)
            if pairs is not None:
                pairs.discard(key)

    async def close(self) -> None:
        for waiter in list(self._waiters):
            waiter.cancel()
        await asyncio.gather(*self._waiters, return_exceptions=True)

    async def _assess(self, task: TaskRecord, other: TaskRecord) -> Blocker | None:
        operations = (self._operation(task), self._operation(other))
        mode = self.policy.mode(*operations)
        verdict, failure = None, ""
        if mode is ParallelMode.AUTO:
            verdict, failure = await consult(self.inference, task.scope, other.scope, self._timeout)
            if verdict is None:
                self.stats["engine_unavailable"] += 1
            else:
                self.confidences = [*self.confidences[-999:], verdict.confidence_score]
        confidence = verdict.confidence_score if verdict else None
        decision = decide(self.policy, operations, confidence)
        reason = f"{decision.reason}; {failure}" if failure else decision.reason
        self.stats[decision.outcome.value] += 1
        invocation_id = ""
        if decision.outcome is ConflictOutcome.ESCALATE:
            record = await self._hitl.open(
                "CONFLICT",
                {
                    "task_scope": task.scope, "running_scope": other.scope,
                    "confidence_score": confidence, "engine": self.inference.name,
                    "notes": verdict.notes if verdict else failure,
                    "overlaps": list(verdict.overlaps) if verdict else [],
                    "reason": reason,
                },
                requested_by=SCHEDULER,
                subject={"task_id": task.task_id, "running_task_id": other.task_id,
                         "agent_id": task.agent_id, "running_agent_id": other.agent_id},
                suggested_action="deny",
                proposed_actions=("approve", "deny"),
                timeout_s=self._hitl_timeout,
                correlation_id=task.task_id,
                priority=task.priority,
            )  # fmt: skip
            invocation_id = record.invocation_id
        if decision.outcome is ConflictOutcome.PARALLEL and confidence == 1.0:
            return None  # different repositories: nothing to audit, and it is every pair
        await self._events.record(
            "scheduler.conflict", SCHEDULER, correlation_id=task.task_id,
            task_id=task.task_id, running_task_id=other.task_id, outcome=decision.outcome.value,
            reason=reason, confidence_score=confidence, engine=self.inference.name,
            invocation_id=invocation_id,
        )  # fmt: skip
        if decision.outcome is ConflictOutcome.PARALLEL:
            return None
        if decision.outcome is ConflictOutcome.SERIALIZE:
            return Blocker(other.task_id, ConflictOutcome.SERIALIZE.value, reason)
        self.stats["escalated"] += 1
        blocker = Blocker(other.task_id, PENDING, reason, invocation_id)
        self._watch(task.task_id, other.task_id, invocation_id)
        return blocker

    def _compared(self, task: TaskRecord, running: Collection[str]) -> Collection[str]:
        """The running tasks `task` must be assessed against (module docstring)."""
        if not isinstance(self.inference, RuleInference):
            return running
        scope = self._scope(task)
        if scope.operation in self.policy.overrides:
            return running
        found = self._running.candidates(scope)
        return running if found is None else found

    def _scope(self, task: TaskRecord) -> Scope:
        found = self._scopes.get(task.task_id)
        if found is None:
            found = self._scopes[task.task_id] = parse_scope(task.scope)
        return found

    def _operation(self, task: TaskRecord) -> str:
        return self._scope(task).operation

    def _watch(self, task_id: str, other_id: str, invocation_id: str) -> None:
        waiter = asyncio.create_task(self._await_decision(task_id, other_id, invocation_id))
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)

    async def _await_decision(self, task_id: str, other_id: str, invocation_id: str) -> None:
        record: HitlRecord = await self._hitl.wait(invocation_id)
        action = str(record.decision.get("action", "deny"))
        outcome = hitl_outcome(action)
        key = (task_id, other_id)
        if key not in self._pairs:
            return  # one of the tasks ended meanwhile
        reason = f"HITL {invocation_id}: {action} by {record.decision.get('decided_by', '?')}"
        self._pairs[key] = (
            None
            if outcome is ConflictOutcome.PARALLEL
            else Blocker(other_id, ConflictOutcome.SERIALIZE.value, reason, invocation_id)
        )
        self.stats[f"hitl_{outcome.value.lower()}"] += 1
        await self._events.record(
            "scheduler.conflict_decided", SCHEDULER, correlation_id=task_id, task_id=task_id,
            running_task_id=other_id, outcome=outcome.value, reason=reason,
            invocation_id=invocation_id,
        )  # fmt: skip
        self._on_decided(task_id)
