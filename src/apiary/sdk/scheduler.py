"""A typed client of sw4rm.scheduler.SchedulerService: submit tasks, request preemption and
shut agents down (docs/scheduler.md). gRPC failures come back as Apiary exceptions.

    async with SchedulerClient("127.0.0.1:50051") as scheduler:
        accepted, reason = await scheduler.submit_task(
            "coder-1", "task-42", {"steps": 3}, priority=-5, scope="path:src/app/**"
        )
        handle = await scheduler.submit("coder-1", {"steps": 3}, scope="path:src/app/**")
        print(await handle.result(timeout=60))

`submit_task` is the canonical SubmitTask (accepted and a reason); `submit` answers with the
task's handle (`apiary.Client.submit_task`, sdk/task_handle.py).
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Any, NamedTuple

import grpc

from apiary.errors import ValidationError
from apiary.sdk.client import Client
from apiary.sdk.connection import Connection
from apiary.sdk.task_handle import SUBMITTER_METADATA, TaskHandle, payload
from apiary.wire import pb


class SubmitOutcome(NamedTuple):
    """SubmitTask's answer: accepted, and where the task stands or why it was refused."""

    accepted: bool
    reason: str


class SchedulerClient:
    """SchedulerService over a channel (its own when given an address)."""

    def __init__(self, target: grpc.aio.Channel | str, *, submitter: str = "") -> None:
        self._client = Client(target)
        self._stub = self._client.scheduler
        self.submitter = submitter
        """The default submitting agent (apiary-submitter metadata); "" for none."""

    @classmethod
    def for_agent(cls, agent: Connection) -> SchedulerClient:
        """A client over the agent's channel that submits as that agent."""
        return cls(agent.channel, submitter=agent.agent_id)

    async def __aenter__(self) -> SchedulerClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel when this client opened it."""
        await self._client.close()

    async def submit_task(
        self,
        agent_id: str,
        task_id: str,
        params: bytes | Any = b"",
        *,
        priority: int = 0,
        scope: str,
        content_type: str | None = None,
        submitter: str | None = None,
    ) -> SubmitOutcome:
        """Submit a task for `agent_id`. Bytes params go as they are; anything else as JSON
        (content type application/json unless given). Refusals of well-formed requests
        (duplicate_detected, buffer_full) answer accepted=False; malformed ones raise."""
        data, kind = payload(params, content_type)
        request = pb.scheduler_pb2.SubmitTaskRequest(
            agent_id=agent_id, task_id=task_id, priority=priority, params=data,
            content_type=kind, scope=scope,
        )  # fmt: skip
        who = self.submitter if submitter is None else submitter
        metadata = ((SUBMITTER_METADATA, who),) if who else None
        reply = await self._stub.SubmitTask(request, metadata=metadata)
        return SubmitOutcome(bool(reply.accepted), str(reply.reason))

    async def submit(
        self,
        agent_id: str = "",
        params: bytes | Any = b"",
        *,
        scope: str,
        task_id: str = "",
        priority: int = 0,
        content_type: str | None = None,
        submitter: str | None = None,
        capability: str = "",
        agent_type: str = "",
    ) -> TaskHandle:
        """Submit a task and return its handle (`apiary.Client.submit_task`: for an agent,
        or a `capability` or `agent_type` any of whose agents takes it), as this client's
        submitter unless `submitter` is given."""
        who = self.submitter if submitter is None else submitter
        return await self._client.submit_task(
            agent_id, params, scope=scope, task_id=task_id, priority=priority,
            content_type=content_type, submitter=who, capability=capability,
            agent_type=agent_type,
        )  # fmt: skip

    async def request_preemption(self, agent_id: str, task_id: str = "", reason: str = "") -> bool:
        """Start cooperative preemption of the agent's running task (of `task_id` when given);
        False when it runs no such task or a preemption is already under way."""
        request = pb.scheduler_pb2.PreemptRequest(agent_id=agent_id, task_id=task_id, reason=reason)
        reply = await self._stub.RequestPreemption(request)
        return bool(reply.enqueued)

    async def shutdown_agent(self, agent_id: str, grace_s: float | None = None) -> None:
        """Shut the agent down gracefully (RFC 8.4) within `grace_s` seconds (None: the
        coordinator's configured grace)."""
        request = pb.scheduler_pb2.ShutdownAgentRequest(agent_id=agent_id)
        if grace_s is not None:
            if isinstance(grace_s, bool) or not 0 < grace_s < math.inf:
                raise ValidationError.for_field("grace_period", "must be a positive duration")
            seconds = math.floor(grace_s)
            request.grace_period.seconds = seconds
            request.grace_period.nanos = round((grace_s - seconds) * 1e9)
        await self._stub.ShutdownAgent(request)


__all__ = ["SUBMITTER_METADATA", "SchedulerClient", "SubmitOutcome"]
