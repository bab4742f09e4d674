"""The task commands of `RuntimeClient` (sdk/runtime.py): agent tasks an application creates,
starts, pauses, resumes, cancels, retries, reconciles and links, and the actions it decides
(docs/control-plane.md).
Each answers the task as it stands after the command, in the contract's shape (`TaskView`:
its runs as `attempts`; metadata the type does not name, such as `result`, `progress`,
`relationships`, in `extra`).

    task = await runtime.create_task(agent_id="coder", title="Fix bug 7", input={...},
                                     start=True, task_id="fix-7")
    done = await runtime.wait_task("fix-7", timeout=600)
    if done.status == "failed":
        await runtime.retry_task("fix-7", idempotency_key="retry-fix-7-1")
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

from apiary.core.runtime.events import RuntimeEvent, RuntimeEventType
from apiary.core.runtime.snapshot import TaskView
from apiary.errors import DeadlineExceededError

_T = RuntimeEventType
SETTLED: Final = frozenset({"completed", "failed", "cancelled", "paused", "draft"})
"""Task statuses no run moves on its own: `wait_task` returns at them."""
_SETTLING: Final = frozenset(
    {_T.TASK_COMPLETED, _T.TASK_FAILED, _T.TASK_CANCELLED, _T.TASK_PAUSED, _T.TASK_LOST}
)


class RuntimeTaskCommands:
    """The task commands, over `call` (RuntimeClient's)."""

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, session_id: str) -> AsyncIterator[Any]:
        raise NotImplementedError

    async def _task(self, command: str, **params: Any) -> TaskView:
        return TaskView.from_json((await self.call(command, **params))["task"])

    async def create_task(
        self, *, task_id: str = "", agent_id: str = "", capability: str = "",
        session_id: str = "", thread_id: str = "", title: str = "", objective: str = "",
        input: Any = None, task_profile: Mapping[str, Any] | None = None,
        constraints: Mapping[str, Any] | None = None,
        acceptance: Sequence[Mapping[str, Any]] | None = None, priority: int = 0,
        scope: str = "", parent_task_id: str = "", depends_on: Sequence[str] = (),
        start: bool = False, idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        """Create an agent task (a draft; `start` starts its first run). `task_id` is an
        idempotency key: the same request again answers the same task."""
        return await self._task(
            "create_task", task_id=task_id or None, agent_id=agent_id or None,
            capability=capability or None, session_id=session_id or None,
            thread_id=thread_id or None, title=title or None, objective=objective or None,
            input=input, task_profile=task_profile, constraints=constraints,
            acceptance=acceptance, priority=priority or None, scope=scope or None,
            parent_task_id=parent_task_id or None, depends_on=list(depends_on) or None,
            start=start or None, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def update_task(self, task_id: str, **changes: Any) -> TaskView:
        """Change the task's metadata (title, objective, task_profile, constraints,
        acceptance, visibility) or, with no run in hand, input, agent_id, capability, scope,
        priority."""
        return await self._task("update_task", task_id=task_id, **changes)

    async def start_task(
        self, task_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> TaskView:
        """Start a draft task: its first run goes to its agent."""
        return await self._act("start_task", task_id, reason, idempotency_key)

    async def append_task_progress(
        self, task_id: str, *, phase: str = "", summary: str = "", percent: int | None = None,
        counters: Mapping[str, float] | None = None,
        delivery_state: Mapping[str, Any] | None = None,
        output_refs: Sequence[Mapping[str, Any]] | None = None, idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        return await self._task(
            "append_task_progress", task_id=task_id, phase=phase or None,
            summary=summary or None, percent=percent, counters=counters,
            delivery_state=delivery_state, output_refs=output_refs,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def pause_task(
        self, task_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> TaskView:
        return await self._act("pause_task", task_id, reason, idempotency_key)

    async def resume_task(
        self, task_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> TaskView:
        return await self._act("resume_task", task_id, reason, idempotency_key)

    async def retry_task(
        self, task_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> TaskView:
        """Run a failed or cancelled task again as a new attempt (the old ones kept)."""
        return await self._act("retry_task", task_id, reason, idempotency_key)

    async def cancel_task(
        self, task_id: str, *, reason: str = "", propagate: bool = True,
        idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        """Record the intent to cancel, stop the run, cancel the child tasks (`propagate`)."""
        return await self._task(
            "cancel_task", task_id=task_id, reason=reason or None,
            propagate=None if propagate else False, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def _act(self, command: str, task_id: str, reason: str, key: str) -> TaskView:
        return await self._task(
            command, task_id=task_id, reason=reason or None, idempotency_key=key or None
        )

    async def complete_task(
        self, task_id: str, *, result: Any = None, summary: str = "",
        artifacts: Sequence[Mapping[str, Any]] | None = None,
        evidence_refs: Sequence[str] | None = None,
        delivery_state: Mapping[str, Any] | None = None, idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        return await self._task(
            "complete_task", task_id=task_id, result=result, summary=summary or None,
            artifacts=artifacts, evidence_refs=evidence_refs, delivery_state=delivery_state,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def fail_task(
        self, task_id: str, *, error_code: str = "", message: str = "", retryable: bool = True,
        artifacts: Sequence[Mapping[str, Any]] | None = None,
        evidence_refs: Sequence[str] | None = None, idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        return await self._task(
            "fail_task", task_id=task_id, error_code=error_code or None,
            message=message or None, retryable=None if retryable else False,
            artifacts=artifacts, evidence_refs=evidence_refs,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def link_tasks(
        self, task_id: str, target_id: str, *, kind: str = "dependency", reason: str = "",
        idempotency_key: str = "",
    ) -> TaskView:  # fmt: skip
        return await self._task(
            "link_tasks", task_id=task_id, target_id=target_id, kind=kind,
            reason=reason or None, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def unlink_tasks(
        self, task_id: str, target_id: str, *, kind: str = "dependency"
    ) -> TaskView:
        return await self._task("unlink_tasks", task_id=task_id, target_id=target_id, kind=kind)

    async def respond_action(
        self, action_id: str, decision: str, *, rationale: str = "",
        patch: Mapping[str, Any] | None = None, idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Decide an action (`action.required`'s `actionId`): approve, deny, modify (with a
        `patch`) or defer, or one of the decisions it lists. A retry under
        `idempotency_key` answers the first decision."""
        return await self.call(
            "respond_action", action_id=action_id, decision=decision,
            rationale=rationale or None, patch=patch, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def wait_task(
        self,
        task_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> TaskView:
        """The task once no run moves it (completed, failed, cancelled, paused, or a draft),
        following its session's events (DeadlineExceededError after `timeout` seconds)."""

        async def follow() -> TaskView:
            task = await self._task("get_task", task_id=task_id)
            if task.status in SETTLED or not task.session_id:
                return task
            async for item in self.events(task.session_id):
                if isinstance(item, RuntimeEvent):
                    if item.task_id == task_id and item.type in _SETTLING:
                        return await self._task("get_task", task_id=task_id)
                    continue
                task = await self._task("get_task", task_id=task_id)  # the snapshot: read again
                if task.status in SETTLED:
                    return task
            raise DeadlineExceededError(f"the event stream ended before task {task_id} settled")

        try:
            async with asyncio.timeout(timeout):
                return await follow()
        except TimeoutError:
            raise DeadlineExceededError(
                f"task {task_id} did not settle within {timeout} s", {"task_id": task_id}
            ) from None
