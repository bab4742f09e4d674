"""The in-memory runtime control-plane store (part of `MemoryStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.runtime.actions import ActionRecord, ActionState
from apiary.core.runtime.records import (
    OPEN_TURN_STATES,
    ChannelRecord,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
    queue_key,
)
from apiary.core.runtime.task_records import (
    CommandKeyRecord,
    RuntimeTaskRecord,
    TaskLinkRecord,
    TaskRunRecord,
)
from apiary.core.runtime.tasks import OPEN_TASK_STATES
from apiary.store.errors import StoreError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.memory.runtime_jobs import MemoryJobs
from apiary.store.sql import runtime_tasks as t
from apiary.store.sql.checks import check_limit
from apiary.store.sql.runtime import (
    channel_from_row,
    session_from_row,
    thread_from_row,
    turn_from_row,
    write_rows,
)


class MemoryRuntimeStore(MemoryJobs):
    """`RuntimeStore` over dicts keyed by id, with the SQL backends' unique indexes on a
    turn's (thread_id, ordinal) and task_id; jobs are `MemoryJobs`'."""

    def __init__(self, log: MemoryEventLog) -> None:
        super().__init__()
        self._sessions: dict[str, SessionRecord] = {}
        self._threads: dict[str, ThreadRecord] = {}
        self._turns: dict[str, TurnRecord] = {}
        self._channels: dict[str, ChannelRecord] = {}
        self._tasks: dict[str, RuntimeTaskRecord] = {}
        self._runs: dict[str, TaskRunRecord] = {}
        self._links: dict[tuple[str, str, str], TaskLinkRecord] = {}
        self._keys: dict[tuple[str, str], CommandKeyRecord] = {}
        self._actions: dict[str, ActionRecord] = {}
        self._log = log

    async def save(self, write: RuntimeWrite, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the records of `write` with `events`, all or nothing."""
        # Through the SQL rows and back: refuses and coerces as the SQL backends do.
        sessions, threads, turns, channels, tasks, job_rows = write_rows(write)
        stored_turns = [turn_from_row(row) for row in turns]
        self._check_unique(stored_turns)
        runs = [t.run_from_row(row) for row in tasks.runs]
        places = {(r.task_id, r.attempt): r.run_id for r in self._runs.values()}
        for new_run in runs:
            holder = places.setdefault((new_run.task_id, new_run.attempt), new_run.run_id)
            if holder != new_run.run_id:
                raise StoreError(f"attempt {new_run.attempt} of {new_run.task_id!r} is {holder!r}")
        keys = [t.key_from_row(row) for row in tasks.keys]
        taken = [(k.owner, k.key) for k in keys]
        if len(set(taken)) != len(taken) or any(key in self._keys for key in taken):
            raise StoreError("a command key is stored already")
        jobs, items = self.check_jobs(job_rows)
        drafts = self._log.checked(events)
        for row in sessions:
            self._sessions[row[0]] = session_from_row(row)
        for row in threads:
            self._threads[row[0]] = thread_from_row(row)
        for turn in stored_turns:
            self._turns[turn.turn_id] = turn
        for row in channels:
            self._channels[row[0]] = channel_from_row(row)
        for row in tasks.tasks:
            self._tasks[row[0]] = t.task_from_row(row)
        for new_run in runs:
            self._runs[new_run.run_id] = new_run
        for row in tasks.links:
            link = t.link_from_row(row)
            self._links[(link.task_id, link.kind, link.target_id)] = link
        for key in keys:
            self._keys[(key.owner, key.key)] = key
        for row in tasks.actions:
            self._actions[row[0]] = t.action_from_row(row)
        self.put_jobs(jobs, items)
        self._log.append_now(drafts)

    def _check_unique(self, turns: list[TurnRecord]) -> None:
        places: dict[object, str] = {
            (t.thread_id, t.ordinal): t.turn_id for t in self._turns.values()
        }
        tasks: dict[object, str] = {t.task_id: t.turn_id for t in self._turns.values()}
        for turn in turns:
            for index, key in ((places, (turn.thread_id, turn.ordinal)), (tasks, turn.task_id)):
                holder = index.get(key)
                if holder is not None and holder != turn.turn_id:
                    raise StoreError(f"{key!r} already belongs to turn {holder!r}")
                index[key] = turn.turn_id

    async def session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    async def thread(self, thread_id: str) -> ThreadRecord | None:
        return self._threads.get(thread_id)

    async def threads(self, session_id: str) -> list[ThreadRecord]:
        found = [t for t in self._threads.values() if t.session_id == session_id]
        return sorted(found, key=lambda t: (t.created_at, t.thread_id))

    async def turn(self, turn_id: str) -> TurnRecord | None:
        return self._turns.get(turn_id)

    async def turn_of_task(self, task_id: str) -> TurnRecord | None:
        return next((t for t in self._turns.values() if t.task_id == task_id), None)

    async def turns(self, thread_id: str, last: int = 100) -> list[TurnRecord]:
        check_limit(last)
        found = sorted(
            (t for t in self._turns.values() if t.thread_id == thread_id), key=lambda t: t.ordinal
        )
        return found[-last:] if last else []

    async def open_turns(self, thread_id: str | None = None) -> list[TurnRecord]:
        found = [
            t for t in self._turns.values()
            if t.state in OPEN_TURN_STATES and (thread_id is None or t.thread_id == thread_id)
        ]  # fmt: skip
        return sorted(found, key=lambda t: (t.thread_id, *queue_key(t)))

    async def channel(self, channel_id: str) -> ChannelRecord | None:
        return self._channels.get(channel_id)

    # ------------------------------------------------------------------ agent tasks

    async def task(self, task_id: str) -> RuntimeTaskRecord | None:
        return self._tasks.get(task_id)

    async def session_tasks(self, session_id: str, last: int = 100) -> list[RuntimeTaskRecord]:
        check_limit(last)
        found = sorted(
            (x for x in self._tasks.values() if x.session_id == session_id),
            key=lambda x: (-x.created_at, x.task_id),
        )[:last]
        return list(reversed(found))

    async def open_tasks(self) -> list[RuntimeTaskRecord]:
        found = [x for x in self._tasks.values() if x.state in OPEN_TASK_STATES]
        return sorted(found, key=lambda x: x.task_id)

    async def runs(self, task_id: str) -> list[TaskRunRecord]:
        return sorted((r for r in self._runs.values() if r.task_id == task_id),
                      key=lambda r: r.attempt)  # fmt: skip

    async def run(self, run_id: str) -> TaskRunRecord | None:
        return self._runs.get(run_id)

    async def links(self, task_id: str) -> list[TaskLinkRecord]:
        found = [x for x in self._links.values() if x.task_id == task_id]
        return sorted(found, key=lambda x: (x.created_at, x.kind, x.target_id))

    async def links_to(self, target_id: str) -> list[TaskLinkRecord]:
        found = [x for x in self._links.values() if x.target_id == target_id]
        return sorted(found, key=lambda x: (x.created_at, x.task_id, x.kind))

    async def command_key(self, owner: str, key: str) -> CommandKeyRecord | None:
        return self._keys.get((owner, key))

    async def action(self, action_id: str) -> ActionRecord | None:
        return self._actions.get(action_id)

    async def open_actions(self) -> list[ActionRecord]:
        found = [a for a in self._actions.values() if a.state == ActionState.PENDING]
        return sorted(found, key=lambda a: (a.created_at, a.action_id))
