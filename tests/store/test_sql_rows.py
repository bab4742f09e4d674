"""Each SQL row is built from its record by column name: a record whose every field holds a
value of its own lands in the row's field of the same name, and comes back unchanged.

What a store writes is a plain tuple in the columns' order (`apiary.store.sql.columns`);
these round trips are what keeps two columns of one type from trading places unnoticed.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from apiary.core.records import (
    DlqEntry,
    HandoffRecord,
    HitlRecord,
    IdempotencyRecord,
    TaskRecord,
    TaskState,
)
from apiary.core.runtime.actions import ActionRecord
from apiary.core.runtime.jobs import JobItemRecord, JobRecord
from apiary.core.runtime.records import ChannelRecord, SessionRecord, ThreadRecord, TurnRecord
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.store.sql import (
    dlq,
    handoffs,
    hitl,
    idempotency,
    runtime,
    runtime_jobs,
    runtime_tasks,
    tasks,
    tools,
    worktrees,
)
from apiary.store.sql.columns import Columns

_numbers = itertools.count(1)


def distinct(record_type: type[Any], **fixed: Any) -> Any:
    """A `record_type` whose every str, int, float and bytes field holds a value no other
    field holds (`fixed` fields as given)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(record_type):
        if field.name in fixed:
            continue
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        n = next(_numbers)
        if kind in ("str", "TaskState"):
            values[field.name] = f"{field.name}-{n}"
        elif kind == "int":
            values[field.name] = n
        elif kind == "float":
            values[field.name] = n + 0.5
        elif kind == "bytes":
            values[field.name] = f"{field.name}-{n}".encode()
    return record_type(**values, **fixed)


CASES: list[tuple[str, Any, Callable[[Any], Any], Columns[Any], Callable[[Any], Any]]] = [
    (
        "tasks",
        distinct(TaskRecord, state=TaskState.RUNNING),
        tasks.task_row,
        tasks.TASKS,
        tasks.task_from_row,
    ),
    (
        "idempotency",
        distinct(IdempotencyRecord, attempts=("m-1", "m-2")),
        idempotency.idempotency_row,
        idempotency.IDEMPOTENCY,
        idempotency.idempotency_from_row,
    ),
    (
        "dlq",
        distinct(DlqEntry, entry_id=0, attempts=({"n": 1},)),
        dlq.dlq_row,
        dlq.DLQ,
        dlq.dlq_from_row,
    ),
    (
        "hitl",
        distinct(
            HitlRecord,
            subject={"s": 1},
            context={"c": 2},
            decision={"d": 3},
            proposed_actions=("a",),
            approver_roles=("r",),
        ),
        hitl.hitl_row,
        hitl.HITL,
        hitl.hitl_from_row,
    ),
    (
        "handoffs",
        distinct(
            HandoffRecord,
            state="PENDING",
            capabilities_required=("c",),
            tried=("t",),
            context_holders=("h",),
        ),
        handoffs.handoff_row,
        handoffs.HANDOFFS,
        handoffs.handoff_from_row,
    ),
    (
        "worktrees",
        distinct(WorktreeBinding, state=BindingState.BOUND_HOME.value),
        worktrees.worktree_row,
        worktrees.WORKTREES,
        worktrees.worktree_from_row,
    ),
    (
        "runtime_sessions",
        distinct(SessionRecord),
        runtime.session_row,
        runtime.SESSIONS,
        runtime.session_from_row,
    ),
    (
        "runtime_threads",
        distinct(ThreadRecord, queue_policy="queue", status="running"),
        runtime.thread_row,
        runtime.THREADS,
        runtime.thread_from_row,
    ),
    (
        "runtime_turns",
        distinct(TurnRecord, state="preparing"),
        runtime.turn_row,
        runtime.TURNS,
        runtime.turn_from_row,
    ),
    (
        "runtime_channels",
        distinct(ChannelRecord),
        runtime.channel_row,
        runtime.CHANNELS,
        runtime.channel_from_row,
    ),
    (
        "runtime_tasks",
        distinct(RuntimeTaskRecord, state="running", intent="cancel"),
        runtime_tasks.task_row,
        runtime_tasks.TASKS,
        runtime_tasks.task_from_row,
    ),
    (
        "runtime_task_runs",
        distinct(TaskRunRecord, state="failed"),
        runtime_tasks.run_row,
        runtime_tasks.RUNS,
        runtime_tasks.run_from_row,
    ),
    (
        "runtime_task_links",
        distinct(TaskLinkRecord, kind="parent", status="removed"),
        runtime_tasks.link_row,
        runtime_tasks.LINKS,
        runtime_tasks.link_from_row,
    ),
    (
        "runtime_actions",
        distinct(ActionRecord, state="resolved", kind="permission"),
        runtime_tasks.action_row,
        runtime_tasks.ACTIONS,
        runtime_tasks.action_from_row,
    ),
    (
        "runtime_jobs",
        distinct(JobRecord, state="cancelling"),
        runtime_jobs.job_row,
        runtime_jobs.JOBS,
        runtime_jobs.job_from_row,
    ),
    (
        "runtime_job_items",
        distinct(JobItemRecord),
        runtime_jobs.item_row,
        runtime_jobs.ITEMS,
        runtime_jobs.item_from_row,
    ),
    (
        "runtime_command_keys",
        distinct(CommandKeyRecord),
        runtime_tasks.key_row,
        runtime_tasks.KEYS,
        runtime_tasks.key_from_row,
    ),
]


@pytest.mark.parametrize(
    ("record", "to_row", "columns", "from_row"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_row_holds_each_field_under_its_name_and_maps_back(
    record: Any, to_row: Callable[[Any], Any], columns: Columns[Any], from_row: Callable[[Any], Any]
) -> None:
    values = to_row(record)
    assert len(values) == columns.count
    row = columns.of(values)
    for name in columns.names:
        value = getattr(record, name)
        if isinstance(value, str | int | float | bytes):
            assert getattr(row, name) == value, name
    assert from_row(values) == record


def test_tool_rows_hold_each_field_under_its_name_and_map_back() -> None:
    tool = distinct(ToolDescriptor, idempotent=True)
    record = distinct(ToolProviderRecord, tools=(tool,), config={"k": "v"})
    provider, (tool_values,) = tools.provider_row(record), tools.tool_rows(record)
    provider_row, tool_row = tools.PROVIDERS.of(provider), tools.TOOLS.of(tool_values)
    assert (len(provider), len(tool_values)) == (tools.PROVIDERS.count, tools.TOOLS.count)
    for name in tools.PROVIDERS.names:
        if isinstance(getattr(record, name), str | float):
            assert getattr(provider_row, name) == getattr(record, name), name
    for name in tools.TOOLS.names:
        if hasattr(tool, name) and isinstance(getattr(tool, name), str | int | bool):
            assert getattr(tool_row, name) == getattr(tool, name), name
    assert tools.provider_from_rows(provider, [tool_values]) == record
