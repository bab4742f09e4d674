"""The runtime control plane's store: `runtime_sessions`, `runtime_threads`,
`runtime_turns` and `runtime_channels` (schema versions 20, 23 and 27), and the agent tasks'
tables (schema version 21, store/sql/runtime_tasks.py) and the jobs' (schema version 25,
store/sql/runtime_jobs.py). A save writes any of them, with its events, in one transaction
(`SqlEventLog.write_with`).

The rows are shared with the memory backend, which runs them so that it refuses what the
SQL backends refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.runtime.actions import ActionRecord
from apiary.core.runtime.records import (
    OPEN_TURN_STATES,
    ChannelRecord,
    QueuePolicy,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
    TurnState,
)
from apiary.core.runtime.snapshot import ThreadStatus
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.store.sql import runtime_jobs as j
from apiary.store.sql import runtime_tasks as t
from apiary.store.sql.checks import check_limit, checked_int64
from apiary.store.sql.columns import Columns
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect, in_list
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import ExecuteMany, Query, QueryOne, Transaction

Row = tuple[Any, ...]


class SessionRow(NamedTuple):
    session_id: str
    owner: str
    created_at: float
    updated_at: float
    workspace_id: str
    title: str


class ThreadRow(NamedTuple):
    thread_id: str
    session_id: str
    agent_id: str
    scope: str
    queue_policy: str
    status: str
    created_at: float
    updated_at: float
    active_turn_id: str
    turn_count: int
    parent_thread_id: str
    parent_turn_id: str
    role: str
    closed_at: float
    capability: str


class TurnRow(NamedTuple):
    turn_id: str
    session_id: str
    thread_id: str
    ordinal: int
    state: str
    input_json: str
    task_id: str
    created_at: float
    updated_at: float
    started_at: float
    ended_at: float
    error_code: str
    message: str
    result_json: str
    interrupt: str
    status_reason: str
    submitted_by: str
    priority: int
    queue_rank: int
    resumed_from: str
    agent_id: str


class ChannelRow(NamedTuple):
    channel_id: str
    session_id: str
    owner: str
    token_digest: str
    acked_sequence: int
    created_at: float
    updated_at: float
    expires_at: float


SESSIONS = Columns(SessionRow)
THREADS = Columns(ThreadRow)
TURNS = Columns(TurnRow)
CHANNELS = Columns(ChannelRow)


def session_row(r: SessionRecord) -> Row:
    return (
        r.session_id, r.owner, float(r.created_at), float(r.updated_at), r.workspace_id,
        r.title,
    )  # fmt: skip


def session_from_row(fetched: Sequence[Any]) -> SessionRecord:
    return SessionRecord(*SESSIONS.of(fetched))


def thread_row(r: ThreadRecord) -> Row:
    """ValueError for a queue policy or status that is not one, a turn count outside int64."""
    return (
        r.thread_id, r.session_id, r.agent_id, r.scope, QueuePolicy(r.queue_policy).value,
        ThreadStatus(r.status).value, float(r.created_at), float(r.updated_at),
        r.active_turn_id, checked_int64("turn_count", r.turn_count), r.parent_thread_id,
        r.parent_turn_id, r.role, float(r.closed_at), r.capability,
    )  # fmt: skip


def thread_from_row(fetched: Sequence[Any]) -> ThreadRecord:
    return ThreadRecord(*THREADS.of(fetched))


def turn_row(r: TurnRecord) -> Row:
    """ValueError for a state that is not a TurnState, an ordinal outside int64."""
    return (
        r.turn_id, r.session_id, r.thread_id, checked_int64("ordinal", r.ordinal),
        TurnState(r.state).value, r.input_json, r.task_id, float(r.created_at),
        float(r.updated_at), float(r.started_at), float(r.ended_at), r.error_code, r.message,
        r.result_json, r.interrupt, r.status_reason, r.submitted_by,
        checked_int64("priority", r.priority), checked_int64("queue_rank", r.queue_rank),
        r.resumed_from, r.agent_id,
    )  # fmt: skip


def turn_from_row(fetched: Sequence[Any]) -> TurnRecord:
    return TurnRecord(*TURNS.of(fetched))


def channel_row(r: ChannelRecord) -> Row:
    return (
        r.channel_id, r.session_id, r.owner, r.token_digest,
        checked_int64("acked_sequence", r.acked_sequence), float(r.created_at),
        float(r.updated_at), float(r.expires_at),
    )  # fmt: skip


def channel_from_row(fetched: Sequence[Any]) -> ChannelRecord:
    return ChannelRecord(*CHANNELS.of(fetched))


def write_rows(
    write: RuntimeWrite,
) -> tuple[list[Row], list[Row], list[Row], list[Row], t.TaskRows, j.JobRows]:
    """The rows of a write, checked (ValueError) before anything is written."""
    return (
        [session_row(r) for r in write.sessions],
        [thread_row(r) for r in write.threads],
        [turn_row(r) for r in write.turns],
        [channel_row(r) for r in write.channels],
        t.task_rows(write),
        j.job_rows(write),
    )


_PUT_SESSION = by_dialect(lambda d: d.upsert("runtime_sessions", SESSIONS, "session_id"))
_PUT_THREAD = by_dialect(lambda d: d.upsert("runtime_threads", THREADS, "thread_id"))
_PUT_TURN = by_dialect(lambda d: d.upsert("runtime_turns", TURNS, "turn_id"))
_PUT_CHANNEL = by_dialect(lambda d: d.upsert("runtime_channels", CHANNELS, "channel_id"))
_SESSION = QueryOne(f"SELECT {SESSIONS.sql} FROM runtime_sessions WHERE session_id = ?")
_THREAD = QueryOne(f"SELECT {THREADS.sql} FROM runtime_threads WHERE thread_id = ?")
_THREADS = Query(
    f"SELECT {THREADS.sql} FROM runtime_threads WHERE session_id = ? ORDER BY created_at, thread_id"
)
_TURN = QueryOne(f"SELECT {TURNS.sql} FROM runtime_turns WHERE turn_id = ?")
_TURN_OF_TASK = QueryOne(f"SELECT {TURNS.sql} FROM runtime_turns WHERE task_id = ?")
_LAST_TURNS = Query(
    f"SELECT {TURNS.sql} FROM runtime_turns WHERE thread_id = ? ORDER BY ordinal DESC LIMIT ?"
)
_OPEN = sorted(OPEN_TURN_STATES)
_OPEN_TURNS = f"SELECT {TURNS.sql} FROM runtime_turns WHERE {in_list('state', len(_OPEN))}"
_CHANNEL = QueryOne(f"SELECT {CHANNELS.sql} FROM runtime_channels WHERE channel_id = ?")


def save_runtime(
    d: Dialect, sessions: list[Row], threads: list[Row], turns: list[Row], channels: list[Row],
    tasks: t.TaskRows, jobs: j.JobRows,
) -> Transaction[None]:  # fmt: skip
    """Insert or replace the rows (`write_rows`); a unique index that refuses a turn's
    place or task, or a command key stored already, raises StoreError and the transaction
    writes nothing."""
    yield from ExecuteMany(_PUT_SESSION, sessions)
    yield from ExecuteMany(_PUT_THREAD, threads)
    yield from ExecuteMany(_PUT_TURN, turns)
    yield from ExecuteMany(_PUT_CHANNEL, channels)
    yield from t.save_tasks(d, tasks)
    yield from j.save_jobs(d, jobs)


class SqlRuntimeStore(j.SqlJobReads):
    """`RuntimeStore` in the runtime_* tables; events that commit with a write go through
    `log`; the jobs' reads are `SqlJobReads`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def save(self, write: RuntimeWrite, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the records of `write` with `events`, in one transaction."""
        rows = write_rows(write)
        await self._log.write_with(events, save_runtime, *rows)

    async def session(self, session_id: str) -> SessionRecord | None:
        row = await self._db.read(_SESSION, (session_id,))
        return None if row is None else session_from_row(row)

    async def thread(self, thread_id: str) -> ThreadRecord | None:
        row = await self._db.read(_THREAD, (thread_id,))
        return None if row is None else thread_from_row(row)

    async def threads(self, session_id: str) -> list[ThreadRecord]:
        rows = await self._db.read(_THREADS, (session_id,))
        return [thread_from_row(row) for row in rows]

    async def turn(self, turn_id: str) -> TurnRecord | None:
        row = await self._db.read(_TURN, (turn_id,))
        return None if row is None else turn_from_row(row)

    async def turn_of_task(self, task_id: str) -> TurnRecord | None:
        row = await self._db.read(_TURN_OF_TASK, (task_id,))
        return None if row is None else turn_from_row(row)

    async def turns(self, thread_id: str, last: int = 100) -> list[TurnRecord]:
        """The thread's last `last` turns, in ordinal order."""
        check_limit(last)
        rows = await self._db.read(_LAST_TURNS, (thread_id, last))
        return [turn_from_row(row) for row in reversed(rows)]

    async def open_turns(self, thread_id: str | None = None) -> list[TurnRecord]:
        """Turns not ended of one thread (of all when None), by thread_id, then queue order
        (queue_rank, ordinal)."""
        params: list[Any] = list(_OPEN)
        sql = _OPEN_TURNS
        if thread_id is not None:
            sql += " AND thread_id = ?"
            params.append(thread_id)
        rows = await self._db.read(Query(sql + " ORDER BY thread_id, queue_rank, ordinal", params))
        return [turn_from_row(row) for row in rows]

    async def channel(self, channel_id: str) -> ChannelRecord | None:
        row = await self._db.read(_CHANNEL, (channel_id,))
        return None if row is None else channel_from_row(row)

    # ------------------------------------------------------------------ agent tasks

    async def task(self, task_id: str) -> RuntimeTaskRecord | None:
        row = await self._db.read(t.TASK, (task_id,))
        return None if row is None else t.task_from_row(row)

    async def session_tasks(self, session_id: str, last: int = 100) -> list[RuntimeTaskRecord]:
        """The session's last `last` tasks, oldest first."""
        check_limit(last)
        rows = await self._db.read(t.SESSION_TASKS, (session_id, last))
        return [t.task_from_row(row) for row in reversed(rows)]

    async def open_tasks(self) -> list[RuntimeTaskRecord]:
        """Tasks with a run in hand, by task_id."""
        return [t.task_from_row(row) for row in await self._db.read(t.OPEN_TASKS)]

    async def runs(self, task_id: str) -> list[TaskRunRecord]:
        """The task's runs by attempt."""
        return [t.run_from_row(row) for row in await self._db.read(t.RUNS_OF, (task_id,))]

    async def run(self, run_id: str) -> TaskRunRecord | None:
        row = await self._db.read(t.RUN, (run_id,))
        return None if row is None else t.run_from_row(row)

    async def links(self, task_id: str) -> list[TaskLinkRecord]:
        """The edges from the task (removed ones too), oldest first."""
        return [t.link_from_row(row) for row in await self._db.read(t.LINKS_FROM, (task_id,))]

    async def links_to(self, target_id: str) -> list[TaskLinkRecord]:
        """The edges to `target_id` (removed ones too), oldest first."""
        return [t.link_from_row(row) for row in await self._db.read(t.LINKS_TO, (target_id,))]

    async def command_key(self, owner: str, key: str) -> CommandKeyRecord | None:
        row = await self._db.read(t.KEY, (owner, key))
        return None if row is None else t.key_from_row(row)

    async def action(self, action_id: str) -> ActionRecord | None:
        row = await self._db.read(t.ACTION, (action_id,))
        return None if row is None else t.action_from_row(row)

    async def open_actions(self) -> list[ActionRecord]:
        """The actions still pending, oldest first."""
        return [t.action_from_row(row) for row in await self._db.read(t.OPEN_ACTIONS)]
