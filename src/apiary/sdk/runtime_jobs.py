"""The job commands of `RuntimeClient` (sdk/runtime.py): batches of agent tasks an
application creates, reads and cancels (docs/control-plane.md, create_job / get_job /
cancel_job). Each answers the job as it stands after the command (`JobInfo`); its items are
agent tasks, driven further with the task commands (retry_task of a failed item).

    job = await runtime.create_job([{"input": {...}}, {"input": {...}}], agent_id="coder",
                                   job_id="nightly-42")
    done = await runtime.wait_job("nightly-42", timeout=3600)
    outputs = [item.get("output") for item in done.items]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from apiary.core.runtime.events import RuntimeEvent, RuntimeEventType
from apiary.errors import DeadlineExceededError

_T = RuntimeEventType
ENDED: Final = frozenset({"completed", "partial", "failed", "cancelled"})
"""Job statuses no item moves on its own: `wait_job` returns at them."""
_ENDING: Final = frozenset({_T.JOB_COMPLETED, _T.JOB_FAILED, _T.JOB_CANCELLED})


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as get_job shows it: its own status, its items' counts by status, and each
    item (`jobItemId`, `taskId`, `status`, `attemptCount`, `output` once completed)."""

    job_id: str
    status: str
    session_id: str
    item_count: int
    item_counts: Mapping[str, int]
    items: Sequence[Mapping[str, Any]]
    intent: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Every other property (title, objective, parentTaskId, times, owner)."""

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobInfo:
        known = {"jobId", "status", "sessionId", "itemCount", "itemCounts", "items", "intent"}
        return cls(
            job_id=str(doc["jobId"]), status=str(doc["status"]),
            session_id=str(doc["sessionId"]), item_count=int(doc["itemCount"]),
            item_counts=dict(doc.get("itemCounts") or {}), items=list(doc.get("items") or ()),
            intent=doc.get("intent"), extra={k: v for k, v in doc.items() if k not in known},
        )  # fmt: skip


class RuntimeJobCommands:
    """The job commands, over `call` (RuntimeClient's)."""

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, session_id: str) -> AsyncIterator[Any]:
        raise NotImplementedError

    async def _job(self, command: str, **params: Any) -> JobInfo:
        return JobInfo.from_json((await self.call(command, **params))["job"])

    async def create_job(
        self, items: Sequence[Mapping[str, Any]], *, job_id: str = "", agent_id: str = "",
        capability: str = "", session_id: str = "", title: str = "", objective: str = "",
        priority: int = 0, parent_task_id: str = "", idempotency_key: str = "",
    ) -> JobInfo:  # fmt: skip
        """Create a job of `items` (each: task_id, agent_id or capability, title, objective,
        input), started at once. `job_id` is an idempotency key: the same request again
        answers the same job."""
        return await self._job(
            "create_job", items=[dict(item) for item in items], job_id=job_id or None,
            agent_id=agent_id or None, capability=capability or None,
            session_id=session_id or None, title=title or None, objective=objective or None,
            priority=priority or None, parent_task_id=parent_task_id or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def get_job(self, job_id: str) -> JobInfo:
        return await self._job("get_job", job_id=job_id)

    async def cancel_job(
        self, job_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> JobInfo:
        """Record the intent to cancel, then cancel the items not ended (completed ones
        stay): the job is cancelling until they have stopped."""
        return await self._job(
            "cancel_job", job_id=job_id, reason=reason or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def wait_job(
        self,
        job_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> JobInfo:
        """The job once every item has ended (completed, partial, failed, cancelled),
        following its session's events (DeadlineExceededError after `timeout` seconds)."""

        async def follow() -> JobInfo:
            job = await self.get_job(job_id)
            if job.status in ENDED:
                return job
            async for item in self.events(job.session_id):
                if isinstance(item, RuntimeEvent):
                    if item.extra.get("jobId") == job_id and item.type in _ENDING:
                        return await self.get_job(job_id)
                    continue
                job = await self.get_job(job_id)  # the snapshot: read again
                if job.status in ENDED:
                    return job
            raise DeadlineExceededError(f"the event stream ended before job {job_id} ended")

        try:
            async with asyncio.timeout(timeout):
                return await follow()
        except TimeoutError:
            raise DeadlineExceededError(
                f"job {job_id} did not end within {timeout} s", {"job_id": job_id}
            ) from None
