"""sw4rm.scheduler.SchedulerService: tasks, preemption and shutdown (engine/scheduler/scheduler.py);
PollActivityBuffer and PurgeActivity are the activity buffer's (services/activity.py).
apiary.v1.TaskQueryService: the task reads SchedulerService lacks."""

from __future__ import annotations

from apiary.core.access.principal import PrincipalKind
from apiary.core.json_reader import check_nesting
from apiary.core.records import TaskRecord
from apiary.engine.hitl import Hitl
from apiary.engine.scheduler.scheduler import Scheduler, Submission
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.activity import ActivityHandler
from apiary.server.services.negotiation import caller_name
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

s = pb.scheduler_pb2
a = pb.apiary_pb2
SUBMITTER_METADATA = "apiary-submitter"
"""Optional call metadata naming the submitting agent: its communication class is the
task's lane (RFC 7.3)."""


def _submitter(ctx: CallContext) -> str:
    """Who submits: the authenticated principal; an anonymous caller's own say (dev mode)."""
    if ctx.principal.kind is PrincipalKind.ANONYMOUS:
        return ctx.metadata.get(SUBMITTER_METADATA, "")
    return ctx.principal.name


@checked
class SchedulerHandler:
    def __init__(
        self,
        scheduler: Scheduler,
        activity: ActivityHandler,
        checks: RequestChecks = DEFAULT_CHECKS,
    ) -> None:
        self._scheduler = scheduler
        self._checks = checks
        self.poll_activity_buffer = activity.poll_activity_buffer
        self.purge_activity = activity.purge_activity

    async def submit_task(self, req: s.SubmitTaskRequest, ctx: CallContext) -> s.SubmitTaskResponse:
        check_nesting(req.scope, "scope", self._checks.limits.json_depth)
        result = await self._scheduler.submit(
            Submission(
                agent_id=req.agent_id, task_id=req.task_id, priority=req.priority,
                params=bytes(req.params), content_type=req.content_type, scope=req.scope,
                submitter=_submitter(ctx),
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


@checked
class AgentControlHandler:
    """apiary.v1.AgentControlService: suspend and resume an agent (RFC 8.1)."""

    def __init__(self, scheduler: Scheduler, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._scheduler = scheduler
        self._checks = checks

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


MAX_TASKS = 1000
"""Tasks per ListTasks answer at most."""


def task_view(task: TaskRecord, *, with_params: bool = False) -> a.TaskView:
    return a.TaskView(
        task_id=task.task_id, agent_id=task.agent_id, priority=task.priority, state=task.state,
        scope=task.scope, lane=task.lane, attempts=task.attempts, message_id=task.message_id,
        error_code=task.error_code, note=task.note,
        submitted_at=float_to_timestamp(task.submitted_at),
        updated_at=float_to_timestamp(task.updated_at), seq=task.seq,
        correlation_id=task.flow_id, content_type=task.content_type,
        params_size=len(task.params), params=task.params if with_params else b"",
    )  # fmt: skip


@checked
class TaskQueryHandler:
    def __init__(
        self, scheduler: Scheduler, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS
    ) -> None:
        self._scheduler = scheduler
        self._hitl = hitl
        self._checks = checks

    async def list_tasks(self, req: a.ListTasksRequest, ctx: CallContext) -> a.ListTasksResponse:
        states = frozenset(s.strip().upper() for s in req.states) or None
        tasks = await self._scheduler.list_tasks(
            states, req.agent_id or None,
            int(req.after_seq) if req.HasField("after_seq") else -1,
            min(req.limit or 100, MAX_TASKS),
        )  # fmt: skip
        return a.ListTasksResponse(tasks=[task_view(t) for t in tasks])

    async def get_task(self, req: a.GetTaskRequest, ctx: CallContext) -> a.TaskView:
        if not req.task_id:
            raise ValidationError.for_field("task_id", "is required")
        return task_view(await self._scheduler.find(req.task_id), with_params=True)

    async def cancel_task(self, req: a.CancelTaskRequest, ctx: CallContext) -> a.TaskView:
        if not req.task_id:
            raise ValidationError.for_field("task_id", "is required")
        by, _ = caller_name(ctx)
        return task_view(await self._scheduler.cancel(req.task_id, req.reason, by))
