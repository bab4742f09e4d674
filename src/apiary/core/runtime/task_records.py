"""What the runtime stores of its agent tasks (core/runtime/tasks.py): the task with the
contract's metadata, its runs (one Apiary Scheduler task each, kept after they end), the
edges between tasks (and to artifacts, evidence, sources, subagents), and the idempotency
keys of the commands that changed them. Times are UTC seconds; JSON is kept as text."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class LinkKind(StrEnum):
    """The kinds of edge `link_tasks` keeps (`$defs.taskRelationship.kind`)."""

    PARENT = "parent"
    """The target is the task's parent: cancelling the parent cancels the task."""
    CHILD = "child"
    """The target is the task's child."""
    DEPENDENCY = "dependency"
    """The task depends on the target: it starts once the target completed."""
    SOURCE = "source"
    ARTIFACT = "artifact"
    EVIDENCE = "evidence"
    SUBAGENT = "subagent"


TASK_LINKS: Final = frozenset({LinkKind.PARENT, LinkKind.CHILD, LinkKind.DEPENDENCY})
"""Kinds whose target is another runtime task (checked to be one the caller may use)."""


class LinkStatus(StrEnum):
    ACTIVE = "active"
    REMOVED = "removed"
    """Unlinked: kept, so that the graph's history stays readable."""


@dataclass(frozen=True, slots=True)
class RuntimeTaskRecord:
    task_id: str
    session_id: str
    """The session whose stream carries its events (a new one when it was created alone)."""
    owner: str
    """`owner_of` its creator."""
    state: str
    """A RuntimeTaskState value."""
    created_at: float
    updated_at: float
    thread_id: str = ""
    agent_id: str = ""
    """The agent its runs go to ('' with a capability, or while a draft names none)."""
    capability: str = ""
    """Or the capability queue any capable agent takes its runs from."""
    scope: str = ""
    """Its runs' scope (RFC 9.2)."""
    priority: int = 0
    input_json: str = "null"
    """What its runs give the agent, a JSON value as text."""
    meta_json: str = "{}"
    """The contract's metadata as a JSON object: title, objective, taskKind, taskProfile,
    constraints, acceptance, progress, artifacts, evidenceRefs, deliveryState, visibility."""
    result_json: str = ""
    error_code: str = ""
    message: str = ""
    status_reason: str = ""
    intent: str = ""
    """An Intent value: a pause or cancel recorded before the run reached it."""
    intent_reason: str = ""
    run_count: int = 0
    """Runs submitted so far: the next run's attempt number is run_count + 1."""
    current_run_id: str = ""
    """The latest run's id (its Scheduler task id); '' before the first."""
    started_at: float = 0.0
    ended_at: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskRunRecord:
    """One run (attempt) of a runtime task: one Apiary Scheduler task."""

    run_id: str
    """Its Scheduler task id (chosen before it is submitted: a restart submits the same)."""
    task_id: str
    attempt: int
    """1, 2, ...: its place among the task's runs."""
    state: str
    """A RunState value."""
    reason: str
    """Why it was submitted: start, resume or retry."""
    created_at: float
    updated_at: float
    agent_id: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    error_code: str = ""
    message: str = ""
    outputs_json: str = "[]"
    """Its output refs (append_task_progress), a JSON array of objects."""


@dataclass(frozen=True, slots=True)
class TaskLinkRecord:
    """An edge from a task: `task_id` --kind--> `target_id`."""

    task_id: str
    kind: str
    """A LinkKind value."""
    target_id: str
    status: str
    """A LinkStatus value."""
    created_at: float
    updated_at: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommandKeyRecord:
    """A mutating command's idempotency key: its first answer, given again to a retry."""

    owner: str
    key: str
    command: str
    digest: str
    """A digest of the command's parameters: a key reused for another request is refused."""
    answer_json: str
    created_at: float
