"""The runtime's agent tasks in SQL (schema version 21): `runtime_tasks`, their runs
`runtime_task_runs`, their edges `runtime_task_links` and the idempotency keys of the
commands that changed them `runtime_command_keys`, and the actions the runtime reported
`runtime_actions`. Rows and statements only; they are
written in the runtime store's one transaction (store/sql/runtime.py) and read by its
methods. The memory backend runs the same rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.runtime.actions import ActionKind, ActionRecord, ActionState
from apiary.core.runtime.records import RuntimeWrite
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    LinkKind,
    LinkStatus,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.core.runtime.tasks import OPEN_TASK_STATES, Intent, RunState, RuntimeTaskState
from apiary.store.sql.checks import checked_int64
from apiary.store.sql.columns import Columns
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.statements import ExecuteMany, Query, QueryOne, Transaction

Row = tuple[Any, ...]


class TaskRow(NamedTuple):
    task_id: str
    session_id: str
    owner: str
    state: str
    created_at: float
    updated_at: float
    thread_id: str
    agent_id: str
    capability: str
    scope: str
    priority: int
    input_json: str
    meta_json: str
    result_json: str
    error_code: str
    message: str
    status_reason: str
    intent: str
    intent_reason: str
    run_count: int
    current_run_id: str
    started_at: float
    ended_at: float


class RunRow(NamedTuple):
    run_id: str
    task_id: str
    attempt: int
    state: str
    reason: str
    created_at: float
    updated_at: float
    agent_id: str
    started_at: float
    ended_at: float
    error_code: str
    message: str
    outputs_json: str


class LinkRow(NamedTuple):
    task_id: str
    kind: str
    target_id: str
    status: str
    created_at: float
    updated_at: float
    reason: str


class KeyRow(NamedTuple):
    owner: str
    key: str
    command: str
    digest: str
    answer_json: str
    created_at: float


class ActionRow(NamedTuple):
    action_id: str
    session_id: str
    state: str
    created_at: float
    updated_at: float
    thread_id: str
    turn_id: str
    task_id: str
    run_id: str
    decision: str
    via: str
    kind: str
    detail_json: str


TASKS = Columns(TaskRow)
ACTIONS = Columns(ActionRow)
RUNS = Columns(RunRow)
LINKS = Columns(LinkRow)
KEYS = Columns(KeyRow)


def task_row(r: RuntimeTaskRecord) -> Row:
    """ValueError for a state or intent that is not one, a number outside int64."""
    return (
        r.task_id, r.session_id, r.owner, RuntimeTaskState(r.state).value, float(r.created_at),
        float(r.updated_at), r.thread_id, r.agent_id, r.capability, r.scope,
        checked_int64("priority", r.priority), r.input_json, r.meta_json, r.result_json,
        r.error_code, r.message, r.status_reason, Intent(r.intent).value, r.intent_reason,
        checked_int64("run_count", r.run_count), r.current_run_id, float(r.started_at),
        float(r.ended_at),
    )  # fmt: skip


def task_from_row(fetched: Sequence[Any]) -> RuntimeTaskRecord:
    return RuntimeTaskRecord(*TASKS.of(fetched))


def run_row(r: TaskRunRecord) -> Row:
    return (
        r.run_id, r.task_id, checked_int64("attempt", r.attempt), RunState(r.state).value,
        r.reason, float(r.created_at), float(r.updated_at), r.agent_id, float(r.started_at),
        float(r.ended_at), r.error_code, r.message, r.outputs_json,
    )  # fmt: skip


def run_from_row(fetched: Sequence[Any]) -> TaskRunRecord:
    return TaskRunRecord(*RUNS.of(fetched))


def link_row(r: TaskLinkRecord) -> Row:
    return (
        r.task_id, LinkKind(r.kind).value, r.target_id, LinkStatus(r.status).value,
        float(r.created_at), float(r.updated_at), r.reason,
    )  # fmt: skip


def link_from_row(fetched: Sequence[Any]) -> TaskLinkRecord:
    return TaskLinkRecord(*LINKS.of(fetched))


def key_row(r: CommandKeyRecord) -> Row:
    return (r.owner, r.key, r.command, r.digest, r.answer_json, float(r.created_at))


def key_from_row(fetched: Sequence[Any]) -> CommandKeyRecord:
    return CommandKeyRecord(*KEYS.of(fetched))


def action_row(r: ActionRecord) -> Row:
    return (
        r.action_id, r.session_id, ActionState(r.state).value, float(r.created_at),
        float(r.updated_at), r.thread_id, r.turn_id, r.task_id, r.run_id, r.decision, r.via,
        ActionKind(r.kind).value, r.detail_json,
    )  # fmt: skip


def action_from_row(fetched: Sequence[Any]) -> ActionRecord:
    return ActionRecord(*ACTIONS.of(fetched))


class TaskRows(NamedTuple):
    tasks: list[Row]
    runs: list[Row]
    links: list[Row]
    keys: list[Row]
    actions: list[Row]


def task_rows(write: RuntimeWrite) -> TaskRows:
    """The task rows of a write, checked (ValueError) before anything is written."""
    return TaskRows(
        [task_row(r) for r in write.tasks], [run_row(r) for r in write.runs],
        [link_row(r) for r in write.links], [key_row(r) for r in write.keys],
        [action_row(r) for r in write.actions],
    )  # fmt: skip


_PUT_TASK = by_dialect(lambda d: d.upsert("runtime_tasks", TASKS, "task_id"))
_PUT_RUN = by_dialect(lambda d: d.upsert("runtime_task_runs", RUNS, "run_id"))
_PUT_LINK = by_dialect(
    lambda d: d.upsert("runtime_task_links", LINKS, ("task_id", "kind", "target_id"))
)
_ADD_KEY = by_dialect(lambda d: d.insert("runtime_command_keys", KEYS))
_PUT_ACTION = by_dialect(lambda d: d.upsert("runtime_actions", ACTIONS, "action_id"))

TASK = QueryOne(f"SELECT {TASKS.sql} FROM runtime_tasks WHERE task_id = ?")
SESSION_TASKS = Query(
    f"SELECT {TASKS.sql} FROM runtime_tasks WHERE session_id = ? "
    "ORDER BY created_at DESC, task_id LIMIT ?"
)
_OPEN = sorted(OPEN_TASK_STATES)
OPEN_TASKS = Query(
    f"SELECT {TASKS.sql} FROM runtime_tasks WHERE {in_list('state', len(_OPEN))} ORDER BY task_id",
    _OPEN,
)
RUNS_OF = Query(f"SELECT {RUNS.sql} FROM runtime_task_runs WHERE task_id = ? ORDER BY attempt")
RUN = QueryOne(f"SELECT {RUNS.sql} FROM runtime_task_runs WHERE run_id = ?")
LINKS_FROM = Query(
    f"SELECT {LINKS.sql} FROM runtime_task_links WHERE task_id = ? ORDER BY created_at, kind, "
    "target_id"
)
LINKS_TO = Query(
    f"SELECT {LINKS.sql} FROM runtime_task_links WHERE target_id = ? ORDER BY created_at, "
    "task_id, kind"
)
KEY = QueryOne(f"SELECT {KEYS.sql} FROM runtime_command_keys WHERE owner = ? AND key = ?")
ACTION = QueryOne(f"SELECT {ACTIONS.sql} FROM runtime_actions WHERE action_id = ?")
OPEN_ACTIONS = Query(
    f"SELECT {ACTIONS.sql} FROM runtime_actions WHERE state = ? ORDER BY created_at, action_id",
    (ActionState.PENDING.value,),
)


def save_tasks(d: Dialect, rows: TaskRows) -> Transaction[None]:
    """Insert or replace the task rows; a key stored already raises StoreError."""
    yield from ExecuteMany(_PUT_TASK, rows.tasks)
    yield from ExecuteMany(_PUT_RUN, rows.runs)
    yield from ExecuteMany(_PUT_LINK, rows.links)
    yield from ExecuteMany(_ADD_KEY, rows.keys)
    yield from ExecuteMany(_PUT_ACTION, rows.actions)
