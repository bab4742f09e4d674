"""The trace a task continues (docs/tracing.md): the context it was submitted in, kept in
memory with the live task, and a "dispatch task" span per dispatch, its child, whose context
the task's DATA envelope carries to the agent.

Not stored: a task dispatched after a restart starts a new trace, which names the task
(`apiary.task_id`) as the submission's span does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final

from apiary.core.records import TaskRecord
from apiary.core.trace_context import TraceContext
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.router.router import Router
from apiary.engine.tracing import Tracing
from apiary.errors import ApiaryError

PRUNE_AT: Final = 1024
"""Contexts kept before those of tasks no longer live are looked for (a refused submission's,
whose task never ends)."""


class TaskTraces:
    def __init__(self, tracing: Tracing, live: Callable[[str], bool]) -> None:
        """`live`: whether a task id is a live (open) task's."""
        self._tracing = tracing
        self._live = live
        self._submitted: dict[str, TraceContext] = {}
        self._prune_at = PRUNE_AT

    def submitted(self, task_id: str) -> None:
        """A task admitted in the current context (a SubmitTask call's span, a workflow
        step's): its dispatches continue that trace. A task id given again keeps the trace
        of its first submission."""
        tracing = self._tracing
        context = tracing.current()
        if context is None:
            return
        tracing.annotate({"apiary.task_id": task_id})
        submitted = self._submitted
        submitted.setdefault(task_id, context)
        if len(submitted) >= self._prune_at:
            live = self._live
            for gone in [t for t in submitted if t != task_id and not live(t)]:
                del submitted[gone]
            self._prune_at = max(PRUNE_AT, 2 * len(submitted))

    async def send(
        self, router: Router, task: TaskRecord, item: Outbound, attempt: int
    ) -> SendOutcome:
        """Send `item`, the DATA envelope of dispatch `attempt` of `task`, within a span of
        the dispatch (a child of the submission's context), whose context it carries."""
        span = self._tracing.start(
            "dispatch task",
            self._submitted.get(task.task_id),
            {"apiary.task_id": task.task_id, "apiary.agent_id": item.recipient,
             "apiary.attempt": attempt, "apiary.lane": task.lane,
             "messaging.message.id": item.envelope.message_id},
        )  # fmt: skip
        try:
            (outcome,) = await router.send_many([replace(item, trace=span.context)])
        except BaseException as exc:
            code = exc.code if isinstance(exc, ApiaryError) else "internal_error"
            span.end(code, str(exc))
            raise
        span.end(outcome.error_code, outcome.reason)
        return outcome

    def ended(self, task: TaskRecord) -> None:
        """`task` ended (COMPLETED or FAILED): its context is no longer needed."""
        self._submitted.pop(task.task_id, None)
