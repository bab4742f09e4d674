"""A running workflow in memory, and the changes one operation makes to it.

`LiveWorkflow` holds a run with its definition's derived facts (node options, dependents,
EVENT nodes). `apply` steps nodes with the pure machine (core/workflow/node.py) and follows
the effects it returns, breadth first with an explicit queue (a failure may skip a chain of
100k nodes: no recursion): RELEASE_DEPENDENTS looks at each dependent, PROPAGATE steps the
dependents that can no longer run. What must happen outside memory (store, event log, task
submissions and stops, timers) is collected in a `Change`, which engine/workflows.py
carries out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from apiary.core.workflow.dag import validate_dag
from apiary.core.workflow.data import MissingPathError, dump_data, lookup
from apiary.core.workflow.definition import NodeOptions, TriggerType, node_options
from apiary.core.workflow.node import (
    NodeEffect,
    NodeInput,
    NodeMachine,
    NodeRun,
    NodeStatus,
    dependencies_completed,
    propagation,
    ready_to_activate,
)
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowStatus, derive_status
from apiary.store.json_codec import load_json_object

_PROPAGATED = frozenset({NodeInput.SKIP, NodeInput.UPSTREAM_FAILED})


@dataclass(slots=True)
class Change:
    """What one operation changed and what the engine must do about it, in order."""

    dirty: dict[str, NodeRun] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    submit: list[str] = field(default_factory=list)
    timers: list[tuple[str, float]] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    """Cancelled nodes whose task is to be stopped."""


@dataclass(frozen=True, slots=True)
class _Step:
    node_id: str
    event: NodeInput
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Advance:
    node_id: str


class LiveWorkflow:
    """A workflow whose run is RUNNING (or about to be)."""

    def __init__(self, stored: StoredWorkflow) -> None:
        self.spec = stored.spec
        self.run = stored.run
        self.nodes: dict[str, NodeRun] = dict(stored.nodes)
        self.options: dict[str, NodeOptions] = {
            key: node_options(stored.spec, node) for key, node in stored.spec.nodes.items()
        }
        report = validate_dag({k: n.dependencies for k, n in stored.spec.nodes.items()})
        self.roots = report.roots
        self.dependents = report.dependents
        self.event_nodes = tuple(
            key for key, node in stored.spec.nodes.items() if node.trigger is TriggerType.EVENT
        )
        # What the store kept: node outputs may have grown it past a client's limits.
        self.data: dict[str, Any] = load_json_object(stored.run.data) if stored.run.data else {}

    @property
    def workflow_id(self) -> str:
        return self.spec.workflow_id

    def snapshot(self) -> StoredWorkflow:
        return StoredWorkflow(self.spec, replace(self.run, data=dump_data(self.data)), self.nodes)

    def statuses(self) -> Mapping[str, NodeStatus]:
        return {key: run.status for key, run in self.nodes.items()}

    # ------------------------------------------------------------------ stepping

    def apply(
        self, change: Change, now: float, node_id: str, event: NodeInput | None = None,
        **args: Any,
    ) -> None:  # fmt: skip
        """Step `node_id` with `event` (None: look whether it can move on), then follow the
        effects through the graph."""
        queue: deque[_Step | _Advance] = deque()
        queue.append(_Advance(node_id) if event is None else _Step(node_id, event, args))
        while queue:
            item = queue.popleft()
            if isinstance(item, _Advance):
                self._advance(item.node_id, now, queue)
                continue
            run = self.nodes[item.node_id]
            if item.event in _PROPAGATED and run.status is not NodeStatus.PENDING:
                continue  # reached by two failed dependencies: already handled
            step = NodeMachine.step(run, item.event, now, **item.args)
            self.nodes[item.node_id] = step.run
            change.dirty[item.node_id] = step.run
            for effect in step.effects:
                self._follow(change, step.run, effect, step.event_type, queue)

    def _follow(
        self, change: Change, run: NodeRun, effect: NodeEffect, event_type: str,
        queue: deque[_Step | _Advance],
    ) -> None:  # fmt: skip
        node_id = run.node_id
        if effect is NodeEffect.EMIT_EVENT:
            change.events.append((event_type, _details(run)))
        elif effect is NodeEffect.SUBMIT_TASK:
            change.submit.append(node_id)
        elif effect is NodeEffect.START_TIMER:
            change.timers.append((node_id, run.due_at))
        elif effect is NodeEffect.STOP_TASK:
            change.stop.append(node_id)
        elif effect is NodeEffect.RELEASE_DEPENDENTS:
            queue.extend(_Advance(d) for d in self.dependents[node_id])
        elif effect is NodeEffect.PROPAGATE:
            follow = propagation(run.status, self.options[node_id].on_failure)
            verb = "failed" if run.status is NodeStatus.FAILED else "was skipped"
            why = f"dependency {node_id} {verb}"
            if follow is NodeInput.UPSTREAM_FAILED:
                why = f"upstream_failed: {why}"
            queue.extend(_Step(d, follow, {"error": why}) for d in self.dependents[node_id])

    def _advance(self, node_id: str, now: float, queue: deque[_Step | _Advance]) -> None:
        """Move a PENDING node on if it can: skip it (false condition), arm its schedule,
        or activate it."""
        spec, run = self.spec.nodes[node_id], self.nodes[node_id]
        if run.status is not NodeStatus.PENDING:
            return
        statuses = self.statuses_of(spec.dependencies)
        if not dependencies_completed(spec, statuses):
            return
        options = self.options[node_id]
        if options.condition is not None and not self._holds(options):
            why = f"condition {options.condition_text!r} is false"
            queue.append(_Step(node_id, NodeInput.SKIP, {"error": why}))
            return
        cron = options.cron
        if cron is not None and not run.triggered:
            if run.due_at <= 0:
                queue.append(_Step(node_id, NodeInput.ARM, {"due_at": cron.next_after(now)}))
            return
        if ready_to_activate(spec, run, statuses):
            queue.append(_Step(node_id, NodeInput.ACTIVATE, {}))

    def statuses_of(self, node_ids: tuple[str, ...]) -> Mapping[str, NodeStatus]:
        return {key: self.nodes[key].status for key in node_ids}

    def _holds(self, options: NodeOptions) -> bool:
        assert options.condition is not None
        try:
            return bool(lookup(self.data, options.condition))
        except MissingPathError:
            return False

    # ------------------------------------------------------------------ the run

    def settle(self, now: float) -> WorkflowStatus | None:
        """Update the run's status from its nodes; the new status when it just finished."""
        if self.run.status is not WorkflowStatus.RUNNING:
            return None
        status = derive_status(self.nodes.values())
        if status is WorkflowStatus.RUNNING:
            self.run = replace(self.run, updated_at=now)
            return None
        self.run = replace(self.run, status=status, completed_at=now, updated_at=now)
        return status

    def restart(self, now: float, metadata: Mapping[str, str]) -> None:
        """RUNNING again (ResumeWorkflow), with `metadata` merged into the run's."""
        self.run = replace(
            self.run, status=WorkflowStatus.RUNNING, completed_at=0.0, updated_at=now,
            metadata={**self.run.metadata, **metadata},
        )  # fmt: skip

    def cancel(self, change: Change, now: float, why: str) -> None:
        """CANCELLED (CancelWorkflow): every unfinished node is cancelled with `why`."""
        for key, run in self.nodes.items():
            if not run.status.terminal:
                self.apply(change, now, key, NodeInput.CANCEL, error=why)
        self.run = replace(
            self.run, status=WorkflowStatus.CANCELLED, completed_at=now, updated_at=now
        )

    def stored_run(self) -> WorkflowRun:
        return replace(self.run, data=dump_data(self.data))


def _details(run: NodeRun) -> dict[str, Any]:
    details: dict[str, Any] = {"node_id": run.node_id, "status": run.status.value}
    if run.attempts:
        details["attempt"] = run.attempts
    if run.task_id:
        details["task_id"] = run.task_id
    if run.error:
        details["error"] = run.error
    if run.due_at:
        details["due_at"] = run.due_at
    return details
