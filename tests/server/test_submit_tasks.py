"""TaskQueryService.SubmitTasks over real gRPC sockets: each item is answered in order as its
own SubmitTask call would be (its task, or its own refusal, the others going on), the items
are decided together in one run, and the call is refused as a whole only past its item
limit (validation_error naming `items`, nothing stored)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.core.ids import is_uuid4
from apiary.core.limits import Limits
from apiary.engine.scheduler.jobs import SchedulerJobs
from apiary.engine.settings import SchedulerSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator, register_agent
from apiary.wire import pb
from apiary.wire.errordetail import error_from_trailers

a = pb.apiary_pb2
LIMIT = 4


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    settings = SchedulerSettings(duplicate_jobs="reject")
    limits = Limits(submit_tasks=LIMIT)
    async with open_test_coordinator(
        tmp_path, scheduler_settings=settings, limits=limits
    ) as running:
        await register_agent(running, "idle")
        yield running


@pytest.fixture
async def tasks(coordinator: Coordinator) -> AsyncIterator[pb.apiary_pb2_grpc.TaskQueryServiceStub]:
    async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
        yield pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)


def item(n: int, task_id: str = "", **fields: object) -> a.SubmitTaskRequest:
    given: dict[str, object] = {
        "agent_id": "idle", "task_id": task_id, "params": json.dumps({"n": n}).encode(),
        "content_type": "application/json", "scope": f"repo:r{n}", **fields,
    }  # fmt: skip
    return a.SubmitTaskRequest(**given)  # type: ignore[arg-type]


def refusal(outcome: a.SubmitOutcome) -> tuple[str, str]:
    assert outcome.WhichOneof("outcome") == "refused", outcome
    return outcome.refused.error_code, outcome.refused.details.get("field", "")


async def test_each_item_is_answered_alone_in_order(
    coordinator: Coordinator, tasks: pb.apiary_pb2_grpc.TaskQueryServiceStub
) -> None:
    first = await tasks.SubmitTasks(a.SubmitTasksRequest(items=[item(1, "t-1")]))
    assert [o.submitted.task.task_id for o in first.outcomes] == ["t-1"]
    assert first.outcomes[0].submitted.created
    reply = await tasks.SubmitTasks(
        a.SubmitTasksRequest(
            items=[
                item(1, "t-1"),  # the same submission again: the same task
                item(2, "t-1", scope="repo:r1"),  # other content under its id
                item(3),  # no id: one is assigned
                item(4, "t-4", scope=""),  # malformed: refused naming the field
            ]
        )
    )
    again, conflict, assigned, malformed = reply.outcomes
    assert (again.submitted.task.task_id, again.submitted.created) == ("t-1", False)
    assert again.submitted.reason.startswith("already submitted")
    assert refusal(conflict) == ("task_id_conflict", "task_id")
    assert conflict.refused.details["differs"] == "params"
    assert is_uuid4(assigned.submitted.task.task_id) and assigned.submitted.created
    assert assigned.submitted.task.state == "QUEUED"
    assert refusal(malformed) == ("validation_error", "scope")
    more = await tasks.SubmitTasks(
        a.SubmitTasksRequest(
            items=[
                item(5, "t-5", agent_id="nobody"),  # no such agent
                item(6, "t-6", scope="x" * (2 << 20)),  # past a string limit
                item(1, "t-7"),  # the same job as t-1 (duplicate_jobs = reject)
                item(8, "t-8"),
            ]
        )
    )
    unknown, long, duplicate, fine = more.outcomes
    assert refusal(unknown)[0] == "NOT_FOUND"
    assert refusal(long) == ("validation_error", "scope")
    assert refusal(duplicate)[0] == "duplicate_detected"
    assert "same job as task t-1" in duplicate.refused.message
    assert fine.submitted.task.task_id == "t-8"
    assert coordinator.scheduler is not None
    stored = await coordinator.scheduler.list_tasks(None, None, -1, 100)
    assert sorted(t.task_id for t in stored) == sorted(
        ["t-1", "t-8", assigned.submitted.task.task_id]
    )


async def test_the_items_are_decided_together_in_their_order(
    coordinator: Coordinator,
    tasks: pb.apiary_pb2_grpc.TaskQueryServiceStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[list[str]] = []
    decide = SchedulerJobs.submit_together

    async def counted(self: SchedulerJobs, arrivals: list[object]) -> None:
        runs.append([arrival.record.task_id for arrival in arrivals])  # type: ignore[attr-defined]
        await decide(self, arrivals)  # type: ignore[arg-type]

    monkeypatch.setattr(SchedulerJobs, "submit_together", counted)
    ids = [f"o-{n}" for n in range(LIMIT)]
    reply = await tasks.SubmitTasks(
        a.SubmitTasksRequest(items=[item(n, task_id) for n, task_id in enumerate(ids)])
    )
    assert runs == [ids]
    views = [o.submitted.task for o in reply.outcomes]
    assert [v.task_id for v in views] == ids
    assert [v.seq for v in views] == sorted(v.seq for v in views)


async def test_the_item_limit_and_an_empty_call(
    coordinator: Coordinator, tasks: pb.apiary_pb2_grpc.TaskQueryServiceStub
) -> None:
    at = await tasks.SubmitTasks(
        a.SubmitTasksRequest(items=[item(n, f"at-{n}") for n in range(LIMIT)])
    )
    assert [o.WhichOneof("outcome") for o in at.outcomes] == ["submitted"] * LIMIT
    past = a.SubmitTasksRequest(items=[item(n, f"past-{n}") for n in range(LIMIT + 1)])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tasks.SubmitTasks(past)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    found = error_from_trailers(caught.value.trailing_metadata() or ())
    assert found is not None and found.code == "validation_error"
    assert (found.details["field"], found.details["limit"]) == ("items", str(LIMIT))
    assert "[limits] submit_tasks" in found.message
    assert coordinator.scheduler is not None
    stored = await coordinator.scheduler.list_tasks(None, None, -1, 100)
    assert not [t for t in stored if t.task_id.startswith("past-")]
    empty = await tasks.SubmitTasks(a.SubmitTasksRequest())
    assert list(empty.outcomes) == []


async def test_the_json_gateway_serves_it_too(coordinator: Coordinator) -> None:
    import aiohttp  # noqa: PLC0415

    url = f"http://{coordinator.http_address}/v1/apiary.v1.TaskQueryService/SubmitTasks"
    submission = {"agent_id": "idle", "task_id": "h-1", "scope": "repo:h", "params": "e30=",
                  "content_type": "application/json"}  # fmt: skip
    body = {"items": [submission, {**submission, "task_id": "h-2", "scope": ""}]}
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
        assert answer.status == 200, await answer.text()
        outcomes = (await answer.json())["outcomes"]
    assert outcomes[0]["submitted"]["task"]["task_id"] == "h-1"
    assert outcomes[1]["refused"]["error_code"] == "validation_error"
    assert outcomes[1]["refused"]["details"]["field"] == "scope"
