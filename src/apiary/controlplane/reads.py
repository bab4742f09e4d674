"""The control plane's reads: sessions and threads as their owner may see them, snapshots and
thread reads (core/runtime/views.py), and the Scheduler tasks turns run as.

A session another principal owns answers exactly as a missing one (not_found), as another
tenant's objects do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.core.clock import Clock
from apiary.core.records import TaskRecord
from apiary.core.runtime.job_views import with_jobs
from apiary.core.runtime.records import SessionRecord, ThreadRecord, TurnRecord, TurnState, may_use
from apiary.core.runtime.snapshot import RuntimeSnapshot, TaskView
from apiary.core.runtime.task_views import runtime_task_view, with_tasks
from apiary.core.runtime.views import ThreadState, snapshot, task_view
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import NotFoundError
from apiary.store.protocols import RuntimeStore

PendingRequests = Callable[[str], Awaitable[list[dict[str, Any]]]]


def no_session(session_id: str) -> NotFoundError:
    return NotFoundError(
        f"no session {session_id!r}", {"field": "session_id", "session_id": session_id}
    )


def no_thread(thread_id: str, session_id: str = "") -> NotFoundError:
    where = f" in session {session_id!r}" if session_id else ""
    return NotFoundError(
        f"no thread {thread_id!r}{where}", {"field": "thread_id", "thread_id": thread_id}
    )


def no_turn(turn_id: str) -> NotFoundError:
    return NotFoundError(f"no turn {turn_id!r}", {"field": "turn_id", "turn_id": turn_id})


class Reads:
    """Reads of one control plane's records and tasks (module docstring)."""

    def __init__(
        self,
        store: RuntimeStore,
        scheduler: Scheduler,
        clock: Clock,
        settings: RuntimeSettings,
        runtime_id: str,
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._clock = clock
        self._settings = settings
        self._runtime_id = runtime_id
        self.pending_requests: PendingRequests | None = None
        """A thread's pending requests (the actions waiting on it), once actions are set."""

    async def session(self, caller: Principal, session_id: str) -> SessionRecord:
        """The session when `caller` may use it; not_found otherwise."""
        found = await self._store.session(session_id)
        if found is None or not may_use(caller, found.owner):
            raise no_session(session_id)
        return found

    async def thread(
        self, caller: Principal, thread_id: str, session_id: str = ""
    ) -> tuple[SessionRecord, ThreadRecord]:
        """The thread and its session when `caller` may use them (and the thread is in
        `session_id`, when given); not_found otherwise."""
        thread = await self._store.thread(thread_id)
        if thread is None or (session_id and thread.session_id != session_id):
            raise no_thread(thread_id, session_id)
        owner = await self._store.session(thread.session_id)
        if owner is None or not may_use(caller, owner.owner):
            raise no_thread(thread_id, session_id)
        return owner, thread

    async def turn(
        self, caller: Principal, turn_id: str, thread_id: str = "", session_id: str = ""
    ) -> tuple[TurnRecord, ThreadRecord]:
        turn = await self._store.turn(turn_id)
        if turn is None or (thread_id and turn.thread_id != thread_id):
            raise no_turn(turn_id)
        if session_id and turn.session_id != session_id:
            raise no_turn(turn_id)
        try:
            _, thread = await self.thread(caller, turn.thread_id)
        except NotFoundError:
            raise no_turn(turn_id) from None
        return turn, thread

    async def task_of(self, turn: TurnRecord) -> TaskRecord | None:
        """The turn's task once it was submitted (None before, or if it is gone)."""
        if turn.state == TurnState.QUEUED:
            return None
        try:
            return await self._scheduler.find(turn.task_id)
        except NotFoundError:
            return None

    async def thread_state(self, thread: ThreadRecord, last: int | None = None) -> ThreadState:
        """The thread with its last turns and every open one, and their tasks."""
        shown = {t.turn_id: t for t in await self._store.turns(thread.thread_id, last or 0)}
        for turn in await self._store.open_turns(thread.thread_id):
            shown.setdefault(turn.turn_id, turn)
        turns = sorted(shown.values(), key=lambda t: t.ordinal)
        tasks: dict[str, TaskRecord] = {}
        for turn in turns:
            task = await self.task_of(turn)
            if task is not None:
                tasks[task.task_id] = task
        pending = await self.pending_requests(thread.thread_id) if self.pending_requests else []
        return ThreadState(thread, turns, tasks, pending)

    async def snapshot(
        self,
        session: SessionRecord,
        threads: Sequence[ThreadRecord],
        cursor: int,
        *,
        turns: int | None = None,
        detail: bool = False,
    ) -> RuntimeSnapshot:
        shown = self._settings.turns_shown if turns is None else turns
        states = [await self.thread_state(t, shown) for t in threads]
        found = snapshot(
            session, states, cursor=cursor, runtime_id=self._runtime_id, now=self._clock.now(),
            detail=detail,
        )  # fmt: skip
        if detail:
            return found
        found = with_tasks(found, await self.agent_tasks(session.session_id))
        jobs = await self._store.session_jobs(session.session_id, self._settings.tasks_listed)
        return with_jobs(found, jobs)

    async def agent_tasks(self, session_id: str) -> list[TaskView]:
        """The session's last agent tasks (create_task), with their runs and edges."""
        found: list[TaskView] = []
        for task in await self._store.session_tasks(session_id, self._settings.tasks_listed):
            runs = await self._store.runs(task.task_id)
            links = await self._store.links(task.task_id)
            found.append(runtime_task_view(task, runs, links, result=False))
        return found

    async def tasks(self, threads: Sequence[ThreadRecord]) -> list[TaskView]:
        """The tasks of the threads' last turns, in the threads' and turns' order."""
        found: list[TaskView] = []
        for thread in threads:
            for turn in await self._store.turns(thread.thread_id, self._settings.tasks_listed):
                task = await self.task_of(turn)
                if task is not None:
                    found.append(task_view(task, turn))
        return found

    async def task(self, caller: Principal, task_id: str) -> TaskView:
        """An Apiary task the caller may read: one of its sessions' turns, or one it
        submitted itself (an operator with `tasks` reads any); not_found otherwise."""
        missing = NotFoundError(f"no task {task_id!r}", {"field": "task_id", "task_id": task_id})
        try:
            task = await self._scheduler.find(task_id)
        except NotFoundError:
            raise missing from None
        turn = await self._store.turn_of_task(task_id)
        if turn is not None:
            owner = await self._store.session(turn.session_id)
            if owner is None or not may_use(caller, owner.owner):
                raise missing
        elif not _submitted_by(caller, task):
            raise missing
        return task_view(task, turn, result=True)


def _submitted_by(caller: Principal, task: TaskRecord) -> bool:
    if caller.kind is PrincipalKind.OPERATOR and caller.has_role(Role.TASKS):
        return True
    return bool(task.submitter) and task.submitter == caller.name
