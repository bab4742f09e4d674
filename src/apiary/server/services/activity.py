"""SchedulerService.PollActivityBuffer / PurgeActivity and apiary.v1.ActivityBufferService.

Entries are checked where they enter (`request_checks`: started_at and finished_at within
the clock-skew window, every id within its limit), and read back through
`float_to_timestamp`, which shows any stored time, so that no entry can fail a read."""

from __future__ import annotations

from apiary.core.activity import ActivityEntry
from apiary.engine.activity import Activity
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp, timestamp_to_float

a = pb.apiary_pb2
s = pb.scheduler_pb2


def _record(entry: ActivityEntry) -> a.ActivityRecord:
    out = a.ActivityRecord(
        agent_id=entry.agent_id, task_id=entry.task_id, repo_id=entry.repo_id,
        worktree_id=entry.worktree_id, branch=entry.branch, description=entry.description,
        started_at=float_to_timestamp(entry.started_at), outcome=entry.outcome,
    )  # fmt: skip
    if entry.finished_at:
        out.finished_at.CopyFrom(float_to_timestamp(entry.finished_at))
    return out


@checked
class ActivityHandler:
    """The canonical reads and purges (SchedulerService)."""

    def __init__(self, activity: Activity, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._activity = activity
        self._checks = checks

    async def poll_activity_buffer(
        self, req: s.PollActivityBufferRequest, ctx: CallContext
    ) -> s.PollActivityBufferResponse:
        entries = self._activity.buffer.active(agent_id=req.agent_id or None)
        return s.PollActivityBufferResponse(
            entries=[
                s.ActivityEntry(
                    task_id=e.task_id, repo_id=e.repo_id, worktree_id=e.worktree_id,
                    branch=e.branch, description=e.description,
                    timestamp=float_to_timestamp(e.started_at).ToJsonString(),
                )
                for e in entries
            ]
        )  # fmt: skip

    async def purge_activity(
        self, req: s.PurgeActivityRequest, ctx: CallContext
    ) -> s.PurgeActivityResponse:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        purged = await self._activity.purge(req.agent_id, list(req.task_ids) or None)
        return s.PurgeActivityResponse(purged=purged)


@checked
class ActivityBufferHandler:
    """Agents register and complete their in-flight work (apiary.v1)."""

    def __init__(self, activity: Activity, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._activity = activity
        self._checks = checks

    async def register(self, req: a.RegisterActivityRequest, ctx: CallContext) -> a.ActivityRecord:
        e = req.entry
        entry = ActivityEntry(
            agent_id=e.agent_id, task_id=e.task_id, repo_id=e.repo_id,
            worktree_id=e.worktree_id, branch=e.branch, description=e.description,
            started_at=timestamp_to_float(e.started_at) if e.HasField("started_at") else 0.0,
        )  # fmt: skip
        return _record(await self._activity.register(entry))

    async def complete(
        self, req: a.CompleteActivityRequest, ctx: CallContext
    ) -> a.CompleteActivityResponse:
        done = await self._activity.complete(req.agent_id, req.task_id, req.outcome or "COMPLETED")
        return a.CompleteActivityResponse(found=done is not None)

    async def list(self, req: a.ListActivityRequest, ctx: CallContext) -> a.ListActivityResponse:
        buffer = self._activity.buffer
        read = buffer.history if req.history else buffer.active
        entries = read(
            agent_id=req.agent_id or None, repo_id=req.repo_id or None,
            worktree_id=req.worktree_id or None, task_id=req.task_id or None,
        )  # fmt: skip
        return a.ListActivityResponse(
            entries=[_record(e) for e in entries], utilization=buffer.utilization
        )
