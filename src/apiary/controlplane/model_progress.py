"""Model and reasoning progress from the agents (core/runtime/model_reports.py): a report an
agent sends about a task it holds, through the Scheduler's command channel (which checked
that the agent holds the task), becomes an event of the task's thread: a turn's task
reports on its turn, an agent task's run on its task. The agent reports as itself: the
event's actor and agent are the task's holder."""

from __future__ import annotations

from typing import Any

from apiary.controlplane.facts import FactWriter
from apiary.core.records import TaskRecord
from apiary.core.runtime.log import Fact
from apiary.core.runtime.model_reports import read_report
from apiary.core.runtime.records import RuntimeWrite, TurnState
from apiary.core.runtime.tasks import RuntimeTaskState
from apiary.errors import AlreadyCompletedError, NotFoundError


class ModelProgress:
    """Writes the agents' reports to their threads' events (module docstring)."""

    def __init__(self, facts: FactWriter) -> None:
        self._facts = facts
        self._store = facts.store

    async def report(self, held: TaskRecord, body: dict[str, Any]) -> None:
        """The report `body` of the agent holding `held`; NotFoundError naming `task_id`
        when the task is neither a turn's nor an agent task's run, AlreadyCompletedError
        when its turn or task has ended."""
        report = read_report(body)
        extra = {"modelRequestId": report.model_request_id} if report.model_request_id else {}
        fact = await self._fact(held, report.kind, dict(report.payload), extra)
        await self._facts.commit(RuntimeWrite(), [fact], f"agent:{held.agent_id}")

    async def _fact(
        self, held: TaskRecord, kind: str, payload: dict[str, Any], extra: dict[str, Any]
    ) -> Fact:
        ended = AlreadyCompletedError(
            f"the work of task {held.task_id} has ended: it takes no more reports",
            {"field": "task_id", "task_id": held.task_id},
        )
        turn = await self._store.turn_of_task(held.task_id)
        if turn is not None:
            if TurnState(turn.state).terminal:
                raise ended
            return Fact(
                kind, turn.session_id, turn.thread_id, turn.turn_id, task_id=turn.task_id,
                status=turn.state, payload=payload, agent_id=held.agent_id, extra=extra,
            )  # fmt: skip
        run = await self._store.run(held.task_id)
        task = await self._store.task(run.task_id) if run is not None else None
        if run is None or task is None:
            raise NotFoundError(
                f"task {held.task_id} is neither a runtime turn's nor an agent task's run",
                {"field": "task_id", "task_id": held.task_id},
            )
        if task.current_run_id != run.run_id or RuntimeTaskState(task.state).terminal:
            raise ended
        return Fact(
            kind, task.session_id, task.thread_id, task_id=task.task_id, run_id=run.run_id,
            status=task.state, payload=payload, agent_id=held.agent_id,
            extra={**extra, "attemptId": f"{task.task_id}#{run.attempt}"},
        )  # fmt: skip
