"""sw4rm.scheduler.SchedulerService: tasks, preemption and shutdown (engine/scheduler.py);
PollActivityBuffer and PurgeActivity are the activity buffer's (services/activity.py)."""

from __future__ import annotations

from apiary.engine.scheduler import Scheduler, Submission
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.activity import ActivityHandler
from apiary.wire import pb

s = pb.scheduler_pb2
a = pb.apiary_pb2
SUBMITTER_METADATA = "apiary-submitter"
"""Optional call metadata naming the submitting agent: its communication class is the
task's lane (RFC 7.3)."""


class SchedulerHandler:
    def __init__(self, scheduler: Scheduler, activity: ActivityHandler) -> None:
        self._scheduler = scheduler
        self.poll_activity_buffer = activity.poll_activity_buffer
        self.purge_activity = activity.purge_activity

    async def submit_task(self, req: s.SubmitTaskRequest, ctx: CallContext) -> s.SubmitTaskResponse:
        result = await self._scheduler.submit(
            Submission(
                agent_id=req.agent_id, task_id=req.task_id, priority=req.priority,
                params=bytes(req.params), content_type=req.content_type, scope=req.scope,
                submitter=ctx.metadata.get(SUBMITTER_METADATA, ""),
            )
        )  # fmt: skip
        return s.SubmitTaskResponse(accepted=result.accepted, reason=result.reason)

    async def request_preemption(
        self, req: s.PreemptRequest, ctx: CallContext
    ) -> s.PreemptResponse:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        enqueued = await self._scheduler.request_preemption(req.agent_id, req.task_id, req.reason)
        return s.PreemptResponse(enqueued=enqueued)

    async def shutdown_agent(
        self, req: s.ShutdownAgentRequest, ctx: CallContext
    ) -> s.ShutdownAgentResponse:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        grace = None
        if req.HasField("grace_period"):
            grace = req.grace_period.seconds + req.grace_period.nanos / 1e9
        await self._scheduler.shutdown_agent(req.agent_id, grace)
        return s.ShutdownAgentResponse(ok=True)


class AgentControlHandler:
    """apiary.v1.AgentControlService: suspend and resume an agent (RFC 8.1)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def suspend(self, req: a.AgentControlRequest, ctx: CallContext) -> a.AgentControlResponse:
        await self._scheduler.suspend_agent(_agent(req.agent_id))
        return self._state(req.agent_id)

    async def resume(self, req: a.AgentControlRequest, ctx: CallContext) -> a.AgentControlResponse:
        await self._scheduler.resume_agent(_agent(req.agent_id))
        return self._state(req.agent_id)

    def _state(self, agent_id: str) -> a.AgentControlResponse:
        state = self._scheduler.lifecycles.state(agent_id)
        return a.AgentControlResponse(agent_id=agent_id, state=state.value if state else "")


def _agent(agent_id: str) -> str:
    if not agent_id:
        raise ValidationError.for_field("agent_id", "is required")
    return agent_id
