"""A submitted task as its submitter holds it: its status, its result, its cancellation
(docs/sdk.md, "Tasks and their results").

    async with apiary.Client("127.0.0.1:50051") as client:
        handle = await client.submit_task("coder-1", {"fix": "bug-7"}, scope="repo:app")
        try:
            value = await handle.result(timeout=60)   # the JSON value the agent returned
        except TaskFailedError as exc:
            print(exc.error_code, exc.message)        # the agent's code and message
        except TaskHeldError as exc:
            print("held:", exc.reason)                # a duplicate job waiting for HITL

Submitting goes through apiary.v1 TaskQueryService.SubmitTasks, concurrent submissions
sharing calls (sdk/task_submits.py), each answered as its SubmitTask would be: without a
task_id the coordinator assigns one; with one, submitting the same task again returns the same task
(`created` false) and other content under it is `task_id_conflict`. A wait is answered by
the client's one stream of task ends, which all its waiting handles share
(sdk/task_waits.py); where it cannot answer, by WaitTask, in slices, so that a long wait
outlives no proxy's idle timeout. A wait that runs out reads where the task stands with one
WaitTask.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from apiary.core.records import TaskState
from apiary.core.tasks.result import decode_result
from apiary.sdk.errors import TaskFailedError, TaskHeldError, TaskTimeoutError
from apiary.wire import pb
from apiary.wire.convert import timestamp_to_float

if TYPE_CHECKING:
    from apiary.sdk.client import Client

SUBMITTER_METADATA: Final = "apiary-submitter"
"""Call metadata naming the submitter of an anonymous caller (dev mode): an agent's id, whose
communication class is the task's lane. An authenticated caller submits as itself."""
JSON: Final = "application/json"
WAIT_SLICE_S: Final = 60.0
"""The longest one WaitTask call waits; `result()` calls again until its own timeout."""
CALL_MARGIN_S: Final = 10.0
"""A WaitTask call's deadline lies this far past its timeout: the coordinator answers first."""
_ENDED: Final = frozenset({TaskState.COMPLETED.value, TaskState.FAILED.value})


def payload(params: bytes | Any, content_type: str | None) -> tuple[bytes, str]:
    """Params as sent: bytes as they are, anything else as JSON (content type
    application/json unless given)."""
    if isinstance(params, bytes):
        return params, content_type or ""
    return json.dumps(params).encode(), content_type or JSON


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """Where a task stands (TaskQueryService's TaskView, in Python types)."""

    task_id: str
    state: str
    """QUEUED, HELD, DISPATCHED, RUNNING, COMPLETED or FAILED."""
    agent_id: str
    note: str
    """Why it waits or what happened last; a HELD task's reason (its HITL invocation)."""
    error_code: str
    attempts: int
    submitter: str
    updated_at: float
    queue: str = ""
    """The shared queue it was submitted to (`capability:<name>`, `agent_type:<name>`); its
    `agent_id` is then the agent holding it ('' while it waits)."""
    lost_attempts: int = 0
    """Attempts that ended because the agent holding it was lost (it went back to its
    queue)."""

    @property
    def done(self) -> bool:
        """Whether it has ended (COMPLETED or FAILED)."""
        return self.state in _ENDED

    @property
    def held(self) -> bool:
        """Whether it waits for a HITL authorization (a duplicate job, RFC 9.2)."""
        return self.state == TaskState.HELD

    @property
    def reason(self) -> str:
        """Why it is where it is: its note (or its error code when it has no note)."""
        return self.note or self.error_code

    @classmethod
    def of(cls, view: pb.apiary_pb2.TaskView) -> TaskStatus:
        return cls(
            view.task_id, view.state, view.agent_id, view.note, view.error_code,
            int(view.attempts), view.submitter, timestamp_to_float(view.updated_at),
            view.queue, int(view.lost_attempts),
        )  # fmt: skip


class TaskHandle:
    """One submitted task (see the module docstring). `created` is false when the submission
    named a task submitted before; `reason` where the submission left it.

    Its waits take a `timeout` rather than running under `asyncio.timeout`: a wait that
    runs out answers where the task stands (HELD and why) instead of only being
    cancelled."""

    def __init__(
        self,
        client: Client,
        task_id: str,
        *,
        created: bool = True,
        reason: str = "",
        view: pb.apiary_pb2.TaskView | None = None,
    ) -> None:
        self._client = client
        self.task_id = task_id
        self.created = created
        self.reason = reason
        self._view = view

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_id!r})"

    @property
    def submitted(self) -> TaskStatus | None:
        """The task as the submission answered it (None for a handle made from an id)."""
        return None if self._view is None else TaskStatus.of(self._view)

    async def status(self) -> TaskStatus:
        """The task as it stands now (GetTask)."""
        request = pb.apiary_pb2.GetTaskRequest(task_id=self.task_id)
        return TaskStatus.of(await self._client.task_query.GetTask(request))

    async def cancel(self, reason: str = "") -> TaskStatus:
        """Cancel the task if it has not started (QUEUED or HELD, or DISPATCHED and waiting
        at its agent unread): it ends FAILED with `cancelled` (a waiting one once its agent
        gives it back: the status answered is DISPATCHED then). One that runs is
        already_in_progress, one that ended ALREADY_COMPLETED."""
        request = pb.apiary_pb2.CancelTaskRequest(task_id=self.task_id, reason=reason)
        return TaskStatus.of(await self._client.task_query.CancelTask(request))

    async def wait(self, timeout: float | None = None) -> TaskStatus:  # noqa: ASYNC109
        """The task once it has ended, or as it stands after `timeout` seconds (None: for
        as long as it takes). Never raises for the task's outcome (see `result`)."""
        return TaskStatus.of(await self._wait(timeout))

    async def result(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """The JSON value the agent returned (None when it returned nothing), once the task
        COMPLETED. A FAILED task raises TaskFailedError with its error code and message;
        no end within `timeout` seconds raises TaskHeldError while the task is HELD (a
        duplicate job waiting for a HITL decision), TaskTimeoutError otherwise."""
        view = await self._wait(timeout)
        details = {"task_id": view.task_id, "state": view.state, "note": view.note}
        if view.state == TaskState.COMPLETED:
            return decode_result(view.result_json)
        if view.state == TaskState.FAILED:
            raise TaskFailedError(view.note, error_code=view.error_code, task_id=view.task_id)
        if view.state == TaskState.HELD:
            raise TaskHeldError(
                f"task {view.task_id} is still HELD after {timeout} s: {view.note}", details
            )
        raise TaskTimeoutError(
            f"task {view.task_id} is still {view.state} after {timeout} s", details
        )

    async def _wait(self, timeout: float | None) -> pb.apiary_pb2.TaskView:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(0.0, timeout)
        ended = await self._client.task_waits.end(self.task_id, timeout)
        if ended is not None:
            return ended
        while True:
            left = WAIT_SLICE_S if deadline is None else deadline - loop.time()
            window = max(0.001, min(WAIT_SLICE_S, left))
            request = pb.apiary_pb2.WaitTaskRequest(
                task_id=self.task_id, timeout_ms=max(1, round(window * 1000))
            )
            view: pb.apiary_pb2.TaskView = await self._client.task_query.WaitTask(
                request, timeout=window + CALL_MARGIN_S
            )
            if view.state in _ENDED or (deadline is not None and loop.time() >= deadline):
                return view


async def submit_task(
    client: Client,
    agent_id: str = "",
    params: bytes | Any = b"",
    *,
    scope: str,
    task_id: str = "",
    priority: int = 0,
    content_type: str | None = None,
    submitter: str = "",
    capability: str = "",
    agent_type: str = "",
) -> TaskHandle:
    """`Client.submit_task`."""
    data, kind = payload(params, content_type)
    request = pb.apiary_pb2.SubmitTaskRequest(
        agent_id=agent_id, task_id=task_id, priority=priority, params=data, content_type=kind,
        scope=scope, capability=capability, agent_type=agent_type,
    )  # fmt: skip
    reply = await client.task_submissions.submit(request, submitter)
    return TaskHandle(
        client, reply.task.task_id, created=reply.created, reason=reply.reason, view=reply.task
    )


__all__ = ["SUBMITTER_METADATA", "TaskHandle", "TaskStatus", "payload", "submit_task"]
