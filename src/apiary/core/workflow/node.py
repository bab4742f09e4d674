"""The workflow node lifecycle of RFC 17.7 as a pure, table-driven machine.

States are the six of "Node Status Transitions" (`sw4rm.workflow.NodeStatus`). A node's run
state is a `NodeRun`; `NodeMachine.step(run, input, now, ...)` returns a `NodeStep`: the next
run, the effects the engine performs in order, and the event type to log. An input the table
has no row for raises `IllegalTransitionError` and changes nothing.

    PENDING --ACTIVATE--> READY --DISPATCHED--> RUNNING --COMPLETE--> COMPLETED
    READY/RUNNING --RETRY--> READY (a later attempt)    READY/RUNNING --FAIL--> FAILED
    PENDING --SKIP--> SKIPPED      PENDING --UPSTREAM_FAILED--> FAILED
    PENDING --TRIGGER / ARM--> PENDING (the trigger fired / a schedule was armed)
    COMPLETED/FAILED/SKIPPED --RESET--> PENDING (ResumeWorkflow)
    PENDING/READY --CANCEL--> SKIPPED    RUNNING --CANCEL--> FAILED (CancelWorkflow)

Decisions where the RFC is silent:
- A node is activated (`ready_to_activate`) when it is PENDING, every dependency is COMPLETED
  (RFC 17.7 MUST NOT run before), and its trigger fired: DEPENDENCY nodes need nothing more,
  EVENT nodes a matching message, SCHEDULE nodes their next cron time after the dependencies
  completed, MANUAL nodes a ResumeWorkflow naming them. A trigger that fires before the
  dependencies complete is remembered (`triggered`), not lost.
- A node whose `condition` is false when it would activate is SKIPPED ("bypassed due to
  conditional logic"); so are, transitively, its dependents, which can then never run.
- A failed attempt is retried while attempts remain (`after_failure`): READY again, after
  the node's retry delay when it has one. The last failure makes the node FAILED, and its
  dependents SKIPPED or FAILED (upstream_failed) per its `on_failure` policy
  (`propagation`); independent nodes go on.
- RESET (ResumeWorkflow of a finished node) starts the node over: attempts, output, error and
  trigger are cleared; `dispatches` is kept, so its next task id is new.
- CANCEL (CancelWorkflow) ends every unfinished node: one with no attempt under way (PENDING,
  READY) is SKIPPED, a RUNNING one FAILED with the cancellation as its error, and its task is
  stopped (STOP_TASK). Nothing propagates: every other unfinished node is cancelled as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from apiary.core.machine import TransitionTable
from apiary.core.workflow.definition import FailurePolicy, NodeOptions, NodeSpec, TriggerType
from apiary.errors import ValidationError


class NodeStatus(StrEnum):
    """Node states (RFC 17.7), named and numbered as `sw4rm.workflow.NodeStatus`."""

    PENDING = "PENDING"
    READY = "READY"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_S = NodeStatus
_TERMINAL: Final = frozenset({_S.COMPLETED, _S.FAILED, _S.SKIPPED})
STATUS_NUMBERS: Final[Mapping[NodeStatus, int]] = MappingProxyType(
    {status: number for number, status in enumerate(_S, start=1)}
)
_BY_NUMBER: Final = {number: status for status, number in STATUS_NUMBERS.items()}


def status_from_proto(number: int) -> NodeStatus:
    found = _BY_NUMBER.get(number)
    if found is None:
        raise ValidationError.for_field("status", f"not a node status number: {number!r}")
    return found


class NodeInput(StrEnum):
    """What moves a node."""

    ACTIVATE = "ACTIVATE"
    """Dependencies COMPLETED and the trigger fired: eligible for execution."""
    DISPATCHED = "DISPATCHED"
    """The node's task was accepted by the Scheduler."""
    COMPLETE = "COMPLETE"
    """The task completed and its output was mapped into workflow_data."""
    FAIL = "FAIL"
    """The attempt failed and no attempt remains (or the task could not be submitted)."""
    RETRY = "RETRY"
    """The attempt failed and another remains."""
    SKIP = "SKIP"
    """The node cannot or need not run: its condition is false, or a dependency was skipped,
    or failed under the `skip` policy."""
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    """A dependency failed under the `fail` policy."""
    TRIGGER = "TRIGGER"
    """The node's EVENT, SCHEDULE or MANUAL trigger fired (remembered until activation)."""
    ARM = "ARM"
    """A SCHEDULE node's dependencies completed: its next cron time is due_at."""
    RESET = "RESET"
    """ResumeWorkflow starts a finished node over."""
    CANCEL = "CANCEL"
    """CancelWorkflow ends the node where it is."""


_I = NodeInput


class NodeEffect(StrEnum):
    """What the engine does after a step, in the order listed."""

    PERSIST = "PERSIST"
    """Store the node's run (with the workflow's, in one write)."""
    EMIT_EVENT = "EMIT_EVENT"
    """Append the transition to the event log."""
    SUBMIT_TASK = "SUBMIT_TASK"
    """Submit the node's next attempt to the Scheduler now."""
    START_TIMER = "START_TIMER"
    """Arm the node's timer at `due_at` (a retry delay or a cron time)."""
    RELEASE_DEPENDENTS = "RELEASE_DEPENDENTS"
    """Activate the dependents that became ready."""
    PROPAGATE = "PROPAGATE"
    """The dependents can never run: step each with `propagation(...)`."""
    STOP_TASK = "STOP_TASK"
    """End the node's task where the Scheduler can: cancel it while it waits in its agent's
    queue (one the agent holds is left to end, and its result is not used)."""


_F = NodeEffect


@dataclass(frozen=True, slots=True)
class NodeRun:
    """The run state of one node, as stored (its part of `WorkflowState.node_states`).

    `attempts` counts dispatches since the node last started over; `dispatches` counts all of
    them, so `task_id_for` gives every dispatch its own task id. `due_at` is the time a
    pending retry or a cron trigger is due (0: none); `triggered` whether the node's trigger
    fired; `event` the JSON of the message that fired an EVENT node.
    """

    node_id: str
    status: NodeStatus = NodeStatus.PENDING
    attempts: int = 0
    dispatches: int = 0
    task_id: str = ""
    started_at: float = 0.0
    completed_at: float = 0.0
    output: str = ""
    error: str = ""
    triggered: bool = False
    due_at: float = 0.0
    event: str = ""
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeRow:
    status: NodeStatus
    effects: tuple[NodeEffect, ...]
    event_type: str


@dataclass(frozen=True, slots=True)
class NodeStep:
    run: NodeRun
    effects: tuple[NodeEffect, ...]
    event_type: str
    event: NodeInput


def _table() -> dict[NodeStatus, dict[NodeInput, NodeRow]]:
    logged = (_F.PERSIST, _F.EMIT_EVENT)
    retry = NodeRow(_S.READY, (*logged, _F.SUBMIT_TASK, _F.START_TIMER), "workflow.node_retrying")
    fail = NodeRow(_S.FAILED, (*logged, _F.PROPAGATE), "workflow.node_failed")
    ended = {_I.RESET: NodeRow(_S.PENDING, logged, "workflow.node_reset")}
    skipped = NodeRow(_S.SKIPPED, logged, "workflow.node_cancelled")
    return {
        _S.PENDING: {
            _I.ACTIVATE: NodeRow(_S.READY, (*logged, _F.SUBMIT_TASK), "workflow.node_ready"),
            _I.SKIP: NodeRow(_S.SKIPPED, (*logged, _F.PROPAGATE), "workflow.node_skipped"),
            _I.UPSTREAM_FAILED: fail,
            _I.TRIGGER: NodeRow(_S.PENDING, logged, "workflow.node_triggered"),
            _I.ARM: NodeRow(_S.PENDING, (*logged, _F.START_TIMER), "workflow.node_scheduled"),
            _I.CANCEL: skipped,
        },
        _S.READY: {
            _I.DISPATCHED: NodeRow(_S.RUNNING, logged, "workflow.node_running"),
            _I.RETRY: retry,
            _I.FAIL: fail,
            _I.CANCEL: skipped,
        },
        _S.RUNNING: {
            _I.COMPLETE: NodeRow(
                _S.COMPLETED, (*logged, _F.RELEASE_DEPENDENTS), "workflow.node_completed"
            ),
            _I.RETRY: retry,
            _I.FAIL: fail,
            _I.CANCEL: NodeRow(_S.FAILED, (*logged, _F.STOP_TASK), "workflow.node_cancelled"),
        },
        _S.COMPLETED: dict(ended),
        _S.FAILED: dict(ended),
        _S.SKIPPED: dict(ended),
    }


class NodeMachine:
    """The node table with `step` as its operation."""

    TABLE: dict[NodeStatus, dict[NodeInput, NodeRow]] = _table()
    TRANSITIONS: TransitionTable[NodeStatus, NodeInput, NodeRow] = TransitionTable(
        TABLE, "workflow node"
    )

    @classmethod
    def row(cls, status: NodeStatus, event: NodeInput) -> NodeRow:
        """The table's row for (status, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(status, event)

    @classmethod
    def allows(cls, status: NodeStatus, event: NodeInput) -> bool:
        return cls.TRANSITIONS.allows(status, event)

    @classmethod
    def step(
        cls,
        run: NodeRun,
        event: NodeInput,
        now: float,
        *,
        task_id: str = "",
        output: str = "",
        error: str = "",
        due_at: float = 0.0,
        payload: str = "",
    ) -> NodeStep:
        """Apply `event` to `run` at `now`.

        DISPATCHED takes the `task_id`; COMPLETE the `output` (JSON text); FAIL, RETRY, SKIP,
        UPSTREAM_FAILED and CANCEL the `error`; RETRY and ARM the `due_at` (RETRY: 0 or a past
        time dispatches at once, SUBMIT_TASK; a later one arms a timer, START_TIMER); TRIGGER
        the event `payload` (JSON, for EVENT nodes).
        """
        found = cls.row(run.status, event)
        changed = _apply(run, event, now, task_id, output, error, due_at, payload)
        effects = found.effects
        if event is _I.RETRY:
            later = changed.due_at > now
            effects = tuple(
                e for e in effects if e is not (_F.SUBMIT_TASK if later else _F.START_TIMER)
            )
        return NodeStep(replace(changed, status=found.status, updated_at=now), effects,
                        found.event_type, event)  # fmt: skip


def _apply(
    run: NodeRun, event: NodeInput, now: float, task_id: str, output: str, error: str,
    due_at: float, payload: str,
) -> NodeRun:  # fmt: skip
    if event is _I.ACTIVATE:
        return replace(run, due_at=0.0)
    if event is _I.DISPATCHED:
        if not task_id:
            raise ValidationError.for_field("task_id", "DISPATCHED needs the task id")
        first = run.attempts == 0
        return replace(
            run, task_id=task_id, attempts=run.attempts + 1, dispatches=run.dispatches + 1,
            started_at=now if first else run.started_at, due_at=0.0,
        )  # fmt: skip
    if event is _I.COMPLETE:
        return replace(run, output=output, error="", completed_at=now)
    if event in (_I.FAIL, _I.SKIP, _I.UPSTREAM_FAILED, _I.CANCEL):
        return replace(run, error=error, completed_at=now, due_at=0.0)
    if event is _I.RETRY:
        return replace(run, error=error, due_at=due_at)
    if event is _I.TRIGGER:
        return replace(run, triggered=True, event=payload or run.event)
    if event is _I.ARM:
        return replace(run, due_at=due_at)
    return NodeRun(node_id=run.node_id, dispatches=run.dispatches)  # RESET


# ---------------------------------------------------------------------------- decisions


def ready_to_activate(spec: NodeSpec, run: NodeRun, statuses: Mapping[str, NodeStatus]) -> bool:
    """Whether `run` may be activated: PENDING, every dependency COMPLETED, trigger fired
    (DEPENDENCY nodes need none)."""
    if run.status is not _S.PENDING or not dependencies_completed(spec, statuses):
        return False
    return spec.trigger is TriggerType.DEPENDENCY or run.triggered


def dependencies_completed(spec: NodeSpec, statuses: Mapping[str, NodeStatus]) -> bool:
    return all(statuses[d] is _S.COMPLETED for d in spec.dependencies)


def after_failure(run: NodeRun, options: NodeOptions, now: float) -> tuple[NodeInput, float]:
    """RETRY (with the time the next attempt is due) while attempts remain, else FAIL."""
    if run.attempts < options.max_attempts:
        return _I.RETRY, now + options.retry_delay(run.attempts)
    return _I.FAIL, 0.0


def propagation(status: NodeStatus, policy: FailurePolicy) -> NodeInput:
    """The input for the dependents of a node that ended `status` without completing: a
    SKIPPED node's are skipped; a FAILED node's are skipped or failed per its policy (an
    upstream failure propagates as a failure, so a chain under `fail` fails throughout)."""
    if status is _S.FAILED and policy is FailurePolicy.FAIL:
        return _I.UPSTREAM_FAILED
    return _I.SKIP


def descendants(start: str, dependents: Mapping[str, Iterable[str]]) -> list[str]:
    """Every node downstream of `start`, each once, nearest first (breadth first)."""
    seen = {start}
    found: list[str] = []
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for dependent in dependents.get(node, ()):
                if dependent not in seen:
                    seen.add(dependent)
                    found.append(dependent)
                    following.append(dependent)
        frontier = following
    return found


def task_id_for(workflow_id: str, node_id: str, dispatch: int) -> str:
    """The Scheduler task id of a node's `dispatch`-th dispatch (1-based): unique forever."""
    return f"workflow:{workflow_id}:{node_id}:{dispatch}"


def mermaid() -> str:
    """The state diagram of the table, for the docs."""
    ended = (_S.COMPLETED, _S.FAILED, _S.SKIPPED)
    return NodeMachine.TRANSITIONS.mermaid((_S.PENDING,), ended, lambda row: row.status, loops=True)
