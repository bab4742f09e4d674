"""A client's submissions sharing SubmitTasks calls (sdk/task_submits.py), against a stand-in
TaskQueryService whose calls the test answers, so that calls end exactly together: a
submission queued as both senders stop (both calls answered at once, the senders' tasks not
yet tidied up) still leaves in a call. The same submissions over real gRPC are tested in
tests/server/test_sdk_submissions.py, and under a database cutting the coordinator's
connections in tests/server/test_tasks_under_cut.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from apiary.sdk.task_submits import IN_FLIGHT, TaskSubmissions
from apiary.wire import pb

WAIT_S = 5.0

a = pb.apiary_pb2


class FakeTaskQuery:
    """SubmitTasks calls held until the test answers them (`answer_all`)."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[list[str]] = asyncio.Queue()
        """The task ids of each call, as it arrives."""
        self._held: list[asyncio.Future[None]] = []

    async def SubmitTasks(  # (the stub's name)
        self, request: a.SubmitTasksRequest, metadata: object = None
    ) -> a.SubmitTasksReply:
        held = asyncio.get_running_loop().create_future()
        self._held.append(held)
        self.calls.put_nowait([item.task_id for item in request.items])
        await held
        return a.SubmitTasksReply(
            outcomes=[
                a.SubmitOutcome(submitted=a.SubmitTaskReply(task=a.TaskView(task_id=item.task_id)))
                for item in request.items
            ]
        )

    def answer_all(self) -> None:
        """Answer every held call in one go (their callers resume in the same turn)."""
        held, self._held = self._held, []
        for call in held:
            call.set_result(None)

    async def next_call(self) -> list[str]:
        return await asyncio.wait_for(self.calls.get(), WAIT_S)


def _request(task_id: str) -> a.SubmitTaskRequest:
    return a.SubmitTaskRequest(agent_id="worker", task_id=task_id, scope=f"repo:{task_id}")


async def test_a_submission_queued_as_both_senders_stop_still_leaves_in_a_call() -> None:
    query = FakeTaskQuery()
    submissions = TaskSubmissions(SimpleNamespace(task_query=query))  # type: ignore[arg-type]

    async def submit(task_id: str) -> str:
        return (await submissions.submit(_request(task_id), "")).task.task_id

    async def twice() -> str:
        """Submit a-1, and a-2 as soon as it is answered (as a loop of submissions does)."""
        await submit("a-1")
        return await submit("a-2")

    one = asyncio.create_task(twice())
    assert await query.next_call() == ["a-1"]
    two = asyncio.create_task(submit("b-1"))
    assert await query.next_call() == ["b-1"]  # IN_FLIGHT calls, one sender each
    assert IN_FLIGHT == 2
    query.answer_all()  # both senders find nothing queued and stop in the same turn
    assert await asyncio.wait_for(two, WAIT_S) == "b-1"
    assert await query.next_call() == ["a-2"]  # (no later submission to carry it along)
    query.answer_all()
    assert await asyncio.wait_for(one, WAIT_S) == "a-2"
