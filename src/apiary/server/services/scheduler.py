"""sw4rm.scheduler.SchedulerService: tasks, preemption and shutdown (engine/scheduler/scheduler.py);
PollActivityBuffer and PurgeActivity are the activity buffer's (services/activity.py).
apiary.v1.TaskQueryService: what SchedulerService lacks: submissions that answer with their
task and may name a capability or agent type instead of an agent (a shared queue), many of
them to a call (SubmitTasks: each item answered alone, all decided together), results
back to the submitter (WaitTask, WatchTasks, the agent's CompleteTask), reads and
cancellation (docs/scheduler.md, "Results", "Shared queues")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Final

from apiary.core.access.decision import decide, sees_every_row
from apiary.core.access.principal import PrincipalKind
from apiary.core.access.table import LISTING_RULES, METHOD_RULES
from apiary.core.json_reader import check_nesting, read_json
from apiary.core.limits import utf8_size
from apiary.core.records import TaskRecord
from apiary.core.tasks.shared import queue_parts
from apiary.engine.hitl import Hitl
from apiary.engine.scheduler.scheduler import Scheduler, Submission, SubmitResult
from apiary.engine.scheduler.watch import TaskFollower
from apiary.errors import (
    ApiaryError,
    OversizePayloadError,
    PermissionDeniedError,
    ValidationError,
    error_for_code,
)
from apiary.server.context import AGENT_KEY, CallContext
from apiary.server.errormap import answer_for
from apiary.server.services.activity import ActivityHandler
from apiary.server.services.negotiation import caller_name
from apiary.server.services.request_checks import (
    DEFAULT_CHECKS,
    RequestChecks,
    checked,
    checks_inside,
)
from apiary.stopping import stop_tasks
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

s = pb.scheduler_pb2
a = pb.apiary_pb2
SUBMITTER_METADATA = "apiary-submitter"
"""Optional call metadata naming the submitting agent: its communication class is the
task's lane (RFC 7.3)."""
_LIST_TASKS: Final = "/apiary.v1.TaskQueryService/ListTasks"
_SUBMIT_TASK: Final = "/apiary.v1.TaskQueryService/SubmitTask"
_SUBMIT_TASKS: Final = "/apiary.v1.TaskQueryService/SubmitTasks"
_WAIT_TASK: Final = "/apiary.v1.TaskQueryService/WaitTask"
_FOLLOW_TASKS: Final = "/apiary.v1.TaskQueryService/FollowTasks"


def _submitter(ctx: CallContext) -> str:
    """Who submits (and watches its tasks): the authenticated principal; an anonymous
    caller's own say in dev mode (`apiary-submitter`, else the agent `sw4rm-agent-id`
    names)."""
    if ctx.principal.kind is PrincipalKind.ANONYMOUS:
        return ctx.metadata.get(SUBMITTER_METADATA, "") or ctx.agent_id()
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
        result = await _submit(self._scheduler, self._checks, req, ctx)
        reason = result.reason
        if result.task is not None and result.task.task_id != req.task_id:  # one assigned
            reason = f"task {result.task.task_id}: {reason}"
        return s.SubmitTaskResponse(accepted=result.accepted, reason=reason)

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


async def _submit(
    scheduler: Scheduler,
    checks: RequestChecks,
    req: s.SubmitTaskRequest | a.SubmitTaskRequest,
    ctx: CallContext,
) -> SubmitResult:
    return await scheduler.submit(_submission(checks, req, _submitter(ctx)))


def _submission(
    checks: RequestChecks, req: s.SubmitTaskRequest | a.SubmitTaskRequest, submitter: str
) -> Submission:
    check_nesting(req.scope, "scope", checks.limits.json_depth)
    capability = agent_type = ""
    if isinstance(req, a.SubmitTaskRequest):
        capability, agent_type = req.capability, req.agent_type
    return Submission(
        agent_id=req.agent_id, task_id=req.task_id, priority=req.priority,
        params=bytes(req.params), content_type=req.content_type, scope=req.scope,
        submitter=submitter, capability=capability, agent_type=agent_type,
    )  # fmt: skip


def _submitted(
    req: a.SubmitTaskRequest, result: SubmitResult, *, with_result: bool = True
) -> a.SubmitTaskReply:
    """apiary.v1's answer to a submission: its task (its result unless told otherwise), or
    (none: refused) its error."""
    task = result.task
    if task is None:
        code = result.error_code or "internal_error"
        who = {k: v for k, v in (("agent_id", req.agent_id), ("capability", req.capability),
                                 ("agent_type", req.agent_type)) if v}  # fmt: skip
        raise error_for_code(code, result.reason, who)
    view = task_view(task, with_result=with_result)
    return a.SubmitTaskReply(task=view, created=result.created, reason=result.reason)


def _outcome(req: a.SubmitTaskRequest, outcome: SubmitResult | Exception) -> a.SubmitOutcome:
    """One SubmitTasks item's outcome: its task without its result (a task given again may
    have ended: its result's size alone keeps the reply bounded), or its error as the
    transports answer errors (an unknown one is internal_error, its details logged)."""
    try:
        if isinstance(outcome, Exception):
            raise outcome
        return a.SubmitOutcome(submitted=_submitted(req, outcome, with_result=False))
    except Exception as exc:
        answer = answer_for(exc, _SUBMIT_TASKS)
        refused = a.ErrorDetail(error_code=answer.code, message=answer.message)
        refused.details.update(answer.details)
        return a.SubmitOutcome(refused=refused)


def _agent(agent_id: str) -> str:
    if not agent_id:
        raise ValidationError.for_field("agent_id", "is required")
    return agent_id


_PENDING: Final = SubmitResult(False, "not decided")
"""A SubmitTasks item's place until the Scheduler has decided it."""
MAX_TASKS = 1000
"""Tasks per ListTasks answer at most."""
DEADLINE_MARGIN_S: Final = 0.05
"""WaitTask answers this long before the call's deadline, so that the answer arrives."""


def task_view(
    task: TaskRecord, *, with_params: bool = False, with_result: bool = True
) -> a.TaskView:
    """A task as apiary.v1 shows it: its params only when asked (GetTask), its result
    unless told otherwise (ListTasks gives its size alone)."""
    return a.TaskView(
        task_id=task.task_id, agent_id=task.agent_id, priority=task.priority, state=task.state,
        scope=task.scope, lane=task.lane, attempts=task.attempts, message_id=task.message_id,
        error_code=task.error_code, note=task.note,
        submitted_at=float_to_timestamp(task.submitted_at),
        updated_at=float_to_timestamp(task.updated_at), seq=task.seq,
        correlation_id=task.flow_id, content_type=task.content_type,
        params_size=len(task.params), params=task.params if with_params else b"",
        submitter=task.submitter, result_json=task.result if with_result else "",
        result_size=utf8_size(task.result), queue=task.queue, lost_attempts=task.lost_attempts,
    )  # fmt: skip


@checked
class TaskQueryHandler:
    def __init__(
        self, scheduler: Scheduler, hitl: Hitl, checks: RequestChecks = DEFAULT_CHECKS, *,
        secure: bool = False,
    ) -> None:  # fmt: skip
        self._scheduler = scheduler
        self._hitl = hitl
        self._checks = checks
        self._secure = secure
        """Secure mode: who is not trusted with every task sees its own (LISTING_RULES)."""

    async def list_tasks(self, req: a.ListTasksRequest, ctx: CallContext) -> a.ListTasksResponse:
        """The tasks the caller may see: every one under LISTING_RULES, else those it
        submitted, or (an agent listing its own, `agent_id` its name) those given to it."""
        states = frozenset(s.strip().upper() for s in req.states) or None
        if req.queue:
            try:
                queue_parts(req.queue)
            except ValueError:
                raise ValidationError.for_field(
                    "queue", "names a shared queue: capability:<name> or agent_type:<name>"
                ) from None
        principal = ctx.principal
        every = sees_every_row(principal, LISTING_RULES[_LIST_TASKS], secure=self._secure)
        own = every or (principal.kind is PrincipalKind.AGENT and req.agent_id == principal.name)
        tasks = await self._scheduler.list_tasks(
            states, req.agent_id or None,
            int(req.after_seq) if req.HasField("after_seq") else -1,
            min(req.limit or 100, MAX_TASKS), queue=req.queue or None,
            submitter=None if own else principal.name,
        )  # fmt: skip
        return a.ListTasksResponse(tasks=[task_view(t, with_result=False) for t in tasks])

    async def get_task(self, req: a.GetTaskRequest, ctx: CallContext) -> a.TaskView:
        if not req.task_id:
            raise ValidationError.for_field("task_id", "is required")
        return task_view(await self._scheduler.find(req.task_id), with_params=True)

    async def cancel_task(self, req: a.CancelTaskRequest, ctx: CallContext) -> a.TaskView:
        if not req.task_id:
            raise ValidationError.for_field("task_id", "is required")
        by, _ = caller_name(ctx)
        return task_view(await self._scheduler.cancel(req.task_id, req.reason, by))

    async def submit_task(self, req: a.SubmitTaskRequest, ctx: CallContext) -> a.SubmitTaskReply:
        """A refusal is its error (buffer_full, duplicate_detected); a duplicate job held for
        HITL is its HELD task."""
        return _submitted(req, await _submit(self._scheduler, self._checks, req, ctx))

    @checks_inside
    async def submit_tasks(self, req: a.SubmitTasksRequest, ctx: CallContext) -> a.SubmitTasksReply:
        """Each item as its own SubmitTask call would be: checked, authorized (SubmitTask's
        rule, decided by the access guard and recorded as SubmitTasks' decision on the item)
        and answered with its task or its own refusal; the items decided together. The
        count is checked first, before any item is read."""
        items = req.items
        most = self._checks.limits.submit_tasks
        if len(items) > most:
            raise ValidationError.for_field(
                "items", f"carries {len(items)} submissions, more than the {most} one call "
                "may ([limits] submit_tasks): submit them in several calls", limit=str(most),
            )  # fmt: skip
        self._checks.check_metadata(ctx)
        submitter, may_submit = _submitter(ctx), self._may_submit(ctx)
        outcomes: list[SubmitResult | Exception] = []
        admitted: list[tuple[int, Submission]] = []
        for index, item in enumerate(items):
            try:
                self._checks.check(item)
                may_submit(item.task_id or f"items[{index}]")
                admitted.append((index, _submission(self._checks, item, submitter)))
            except ApiaryError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(_PENDING)
        decided = await self._scheduler.submit_many([sub for _, sub in admitted])
        for (index, _), outcome in zip(admitted, decided, strict=True):
            outcomes[index] = outcome
        return a.SubmitTasksReply(outcomes=list(map(_outcome, items, outcomes)))

    def _may_submit(self, ctx: CallContext) -> Callable[[str], None]:
        """Refuse (PermissionDeniedError) an item that SubmitTask's rule does not let the
        caller submit (`_item_rule`, recorded as SubmitTasks' decision on the item)."""
        allowed = self._item_rule(ctx, _SUBMIT_TASKS, _SUBMIT_TASK)

        def check(item: str) -> None:
            if not allowed(item, None):
                raise PermissionDeniedError(
                    f"{ctx.principal.label} may not submit {item}",
                    {"principal": ctx.principal.label, "action": _SUBMIT_TASK},
                )

        return check

    def _item_rule(
        self, ctx: CallContext, action: str, rule_of: str
    ) -> Callable[[str, str | None], bool]:
        """Whether the caller may act on one item of a call (a task, with its owner) under
        the rule of `rule_of`: the access guard's decision, recorded as `action`'s on the
        item; decided here only for a call that did not pass the guard (in-process)."""
        rule = METHOD_RULES[rule_of]
        claimed = ctx.get(AGENT_KEY)
        guard = ctx.allows

        def allowed(item: str, owner: str | None) -> bool:
            if guard is not None:
                return guard(action, rule, item, owner, ctx)
            return decide(
                ctx.principal, rule, owner=owner, secure=self._secure, claimed=claimed
            ).allowed

        return allowed

    async def wait_task(self, req: a.WaitTaskRequest, ctx: CallContext) -> a.TaskView:
        if not req.task_id:
            raise ValidationError.for_field("task_id", "is required")
        windows = [req.timeout_ms / 1000] if req.timeout_ms else []
        remaining = ctx.time_remaining()
        if remaining is not None:
            windows.append(remaining - DEADLINE_MARGIN_S)
        timeout = max(0.0, min(windows)) if windows else None
        return task_view(await self._scheduler.wait(req.task_id, timeout))

    @checks_inside
    async def watch_tasks(
        self, req: a.WatchTasksRequest, ctx: CallContext
    ) -> AsyncIterator[a.TaskView]:
        """The count of task_ids is checked first, before each id is walked."""
        most = self._checks.limits.watch_task_ids
        if len(req.task_ids) > most:
            raise ValidationError.for_field(
                "task_ids",
                f"names {len(req.task_ids)} tasks, more than the {most} one call may watch "
                "([limits] watch_task_ids): watch them in several calls, or all of the "
                "submitter's tasks with none named",
                limit=str(most),
            )
        self._checks.check_metadata(ctx)
        self._checks.check(req)
        submitter = req.submitter or _submitter(ctx)
        async for task in self._scheduler.watch_tasks(submitter, frozenset(req.task_ids)):
            yield task_view(task)

    async def follow_tasks(
        self, frames: AsyncIterator[a.FollowTasksRequest], ctx: CallContext
    ) -> AsyncIterator[a.FollowTasksReply]:
        """The ends of the tasks the frames name, many to a reply. Each task is decided as
        WaitTask's call for it would be (its rule, its submitter as the owner): one the
        caller may not wait for, or that does not exist, is refused alone, the stream goes on."""
        watch = self._scheduler.watch
        with watch.follower() as follower:
            reader = asyncio.create_task(self._follow(frames, follower, self._may_wait(ctx)))
            try:
                while (taken := await follower.next()) is not None:
                    ended, refused = taken
                    yield a.FollowTasksReply(ended=[task_view(t) for t in ended], refused=refused)
            finally:
                await stop_tasks([reader], "FollowTasks' reader of frames")

    async def _follow(
        self,
        frames: AsyncIterator[a.FollowTasksRequest],
        follower: TaskFollower,
        allowed: Callable[[TaskRecord], bool],
    ) -> None:
        watch = self._scheduler.watch
        most = self._checks.limits.watch_task_ids
        try:
            async for frame in frames:
                for name in ("task_ids", "unfollow"):
                    if len(getattr(frame, name)) > most:
                        raise ValidationError.for_field(
                            name, f"names more than the {most} tasks one frame may "
                            "([limits] watch_task_ids): send them in several", limit=str(most),
                        )  # fmt: skip
                watch.unfollow(follower, frame.unfollow)
                follower.refuse(await watch.follow(follower, frame.task_ids, allowed))
        except Exception as exc:
            follower.close(exc)
        else:
            follower.close()

    def _may_wait(self, ctx: CallContext) -> Callable[[TaskRecord], bool]:
        """Whether the caller may wait for a task: WaitTask's rule (`_item_rule`, recorded
        as FollowTasks' decision on the task)."""
        allowed = self._item_rule(ctx, _FOLLOW_TASKS, _WAIT_TASK)
        return lambda task: allowed(task.task_id, task.submitter)

    @checks_inside
    async def complete_task(
        self, req: a.CompleteTaskRequest, ctx: CallContext
    ) -> a.CompleteTaskResponse:
        """The size of result_json is checked first: a result past task_result_bytes fails
        the task (oversize_payload) before the call answers oversize_payload."""
        for name in ("task_id", "agent_id"):
            if not getattr(req, name):
                raise ValidationError.for_field(name, "is required")
        limit = self._checks.limits.task_result_bytes
        size = utf8_size(req.result_json)
        if size > limit and not req.error_code:
            why = (
                f"the result is {size} bytes of JSON, more than the {limit}-byte limit "
                "([limits] task_result_bytes): return a reference to larger results"
            )
            await self._scheduler.complete(
                req.task_id, req.agent_id, error_code=OversizePayloadError.code, message=why,
                attempt=req.attempt,
            )  # fmt: skip
            raise OversizePayloadError(why, {"field": "result_json", "task_id": req.task_id})
        self._checks.check_metadata(ctx)
        self._checks.check(req)
        result = ""
        if req.error_code:
            if req.result_json:
                raise ValidationError.for_field("result_json", "must be empty with error_code")
        elif req.result_json.strip():
            read_json(req.result_json, "result_json", max_bytes=limit,
                      max_depth=self._checks.limits.json_depth)  # fmt: skip
            result = req.result_json.strip()
        task = await self._scheduler.complete(
            req.task_id, req.agent_id, result=result, error_code=req.error_code,
            message=req.message, attempt=req.attempt,
        )  # fmt: skip
        return a.CompleteTaskResponse(
            task_id=task.task_id, state=task.state, error_code=task.error_code
        )
