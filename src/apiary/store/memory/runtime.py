"""The in-memory runtime control-plane store (part of `MemoryStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from apiary.core.events import EventDraft
from apiary.core.runtime.records import (
    OPEN_TURN_STATES,
    ChannelRecord,
    RuntimeWrite,
    SessionRecord,
    ThreadRecord,
    TurnRecord,
)
from apiary.store.errors import StoreError
from apiary.store.memory.events import MemoryEventLog
from apiary.store.sql.checks import check_limit
from apiary.store.sql.runtime import (
    channel_from_row,
    session_from_row,
    thread_from_row,
    turn_from_row,
    write_rows,
)


class MemoryRuntimeStore:
    """`RuntimeStore` over dicts keyed by id, with the SQL backends' unique indexes on a
    turn's (thread_id, ordinal) and task_id."""

    def __init__(self, log: MemoryEventLog) -> None:
        self._sessions: dict[str, SessionRecord] = {}
        self._threads: dict[str, ThreadRecord] = {}
        self._turns: dict[str, TurnRecord] = {}
        self._channels: dict[str, ChannelRecord] = {}
        self._log = log

    async def save(self, write: RuntimeWrite, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the records of `write` with `events`, all or nothing."""
        # Through the SQL rows and back: refuses and coerces as the SQL backends do.
        sessions, threads, turns, channels = write_rows(write)
        stored_turns = [turn_from_row(row) for row in turns]
        self._check_unique(stored_turns)
        drafts = self._log.checked(events)
        for row in sessions:
            self._sessions[row[0]] = session_from_row(row)
        for row in threads:
            self._threads[row[0]] = thread_from_row(row)
        for turn in stored_turns:
            self._turns[turn.turn_id] = turn
        for row in channels:
            self._channels[row[0]] = channel_from_row(row)
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
        return sorted(found, key=lambda t: (t.thread_id, t.ordinal))

    async def channel(self, channel_id: str) -> ChannelRecord | None:
        return self._channels.get(channel_id)
