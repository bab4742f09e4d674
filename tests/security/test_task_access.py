"""A task is its submitter's: in secure mode only it (or an operator with `tasks`) reads it,
lists it, waits for it, watches it and cancels it, and only the agent it was dispatched to
reports its outcome. Each refusal is permission_denied (unauthenticated for an anonymous
caller) and changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from apiary.errors import NotFoundError, PermissionDeniedError
from apiary.sdk.client import Client
from apiary.wire import pb
from apiary.wire.services import SERVICES, RpcMethod
from tests.security.access_harness import Secure, open_secure

a = pb.apiary_pb2
s = pb.scheduler_pb2
TASKS = {m.name: m for m in SERVICES["apiary.v1.TaskQueryService"]}

pytestmark = pytest.mark.conformance("security.multitenant.authorization")


async def _status(secure: Secure, method: str, request: Message, who: str | None) -> object:
    """The answer, or the refusal's status code."""
    rpc: RpcMethod = TASKS[method]
    try:
        return await secure.call(rpc, request, who)
    except grpc.aio.AioRpcError as exc:
        return exc.code()


async def _submitted(secure: Secure, who: str) -> str:
    request = s.SubmitTaskRequest(agent_id="alice", params=b"{}", scope=f"repo:{who}")
    reply = await secure.call(TASKS["SubmitTask"], request, who)
    assert isinstance(reply, a.SubmitTaskReply) and reply.created
    return str(reply.task.task_id)


async def _two_submitters(secure: Secure) -> tuple[str, str]:
    """A task of the application `app` and one of the agent `mallory`, both for alice."""
    await secure.coordinator.registry.register({
        "agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"],
    })  # fmt: skip
    return await _submitted(secure, "app"), await _submitted(secure, "mallory")


async def _state(secure: Secure, task_id: str) -> str:
    assert secure.coordinator.scheduler is not None
    return str((await secure.coordinator.scheduler.find(task_id)).state)


async def test_only_the_submitter_or_a_tasks_operator_waits_for_and_cancels_a_task(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        await secure.coordinator.registry.register({
            "agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"],
        })  # fmt: skip
        task_id = await _submitted(secure, "app")
        wait = a.WaitTaskRequest(task_id=task_id, timeout_ms=1)
        denied = grpc.StatusCode.PERMISSION_DENIED
        for who, expected in [
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("mallory", denied),
            ("alice", denied),  # the agent that runs it is not its submitter
            ("no-role", denied),
        ]:
            assert await _status(secure, "WaitTask", wait, who) == expected, who
            cancel = a.CancelTaskRequest(task_id=task_id)
            assert await _status(secure, "CancelTask", cancel, who) == expected, who
        assert await _state(secure, task_id) == "QUEUED"  # the refusals changed nothing
        for who in ("app", "root"):
            answer = await _status(secure, "WaitTask", wait, who)
            assert isinstance(answer, a.TaskView) and answer.state == "QUEUED", who
            assert answer.submitter == "ci"  # the application's principal name
        # An agent's own task is its own too.
        own = await _submitted(secure, "mallory")
        found = await _status(
            secure, "WaitTask", a.WaitTaskRequest(task_id=own, timeout_ms=1), "mallory"
        )
        assert isinstance(found, a.TaskView) and found.submitter == "mallory"
        cancelled = await _status(secure, "CancelTask", a.CancelTaskRequest(task_id=task_id), "app")
        assert isinstance(cancelled, a.TaskView) and cancelled.error_code == "cancelled"
        # An unknown task is refused as missing whoever asks (its owner is nobody).
        missing = await _status(secure, "WaitTask", a.WaitTaskRequest(task_id="nope"), "mallory")
        assert missing == grpc.StatusCode.NOT_FOUND


async def test_a_submitter_watches_its_own_tasks_and_no_one_elses(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as secure:
        await secure.coordinator.registry.register({
            "agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"],
        })  # fmt: skip
        task_id = await _submitted(secure, "app")
        mine = await _status(secure, "WatchTasks", a.WatchTasksRequest(), "app")
        assert isinstance(mine, a.TaskView) and mine.task_id == task_id
        named = a.WatchTasksRequest(submitter="ci")
        assert await _status(secure, "WatchTasks", named, "mallory") == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await _status(secure, "WatchTasks", named, "no-role") == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        theirs = await _status(secure, "WatchTasks", named, "root")
        assert isinstance(theirs, a.TaskView) and theirs.task_id == task_id
        # Naming a task that is not the caller's own is answered as a missing one.
        other = a.WatchTasksRequest(task_ids=[task_id])
        assert await _status(secure, "WatchTasks", other, "mallory") == grpc.StatusCode.NOT_FOUND


async def _until_followed(secure: Secure, count: int) -> None:
    scheduler = secure.coordinator.scheduler
    assert scheduler is not None
    async with asyncio.timeout(10):
        while scheduler.watch.waiting() != count:  # noqa: ASYNC110 - no event of its own
            await asyncio.sleep(0.01)


async def test_a_follower_is_told_of_its_own_tasks_ends_and_refused_the_others(
    tmp_path: Path,
) -> None:
    """FollowTasks decides each task as WaitTask would: one the caller may not wait for is
    refused alone (its WaitTask answers why), and the stream goes on with the others."""
    async with open_secure(tmp_path) as secure:
        apps, mallorys = await _two_submitters(secure)
        follow = TASKS["FollowTasks"]

        def opened(who: str | None) -> grpc.aio.StreamStreamCall[Message, Message]:
            return secure.channel.stream_stream(
                follow.path, follow.request_type.SerializeToString,
                follow.response_type.FromString,
            )(metadata=secure.metadata(who), timeout=10)  # fmt: skip

        mallory = opened("mallory")
        await mallory.write(a.FollowTasksRequest(task_ids=[apps, mallorys, "nope"]))
        first = await mallory.read()
        assert isinstance(first, a.FollowTasksReply)
        assert (list(first.ended), sorted(first.refused)) == ([], sorted([apps, "nope"]))
        # Its own task's end comes on the same stream; the refused one is untouched.
        cancel = a.CancelTaskRequest(task_id=mallorys)
        assert isinstance(await _status(secure, "CancelTask", cancel, "mallory"), a.TaskView)
        ended = await mallory.read()
        assert isinstance(ended, a.FollowTasksReply)
        assert [(v.task_id, v.error_code) for v in ended.ended] == [(mallorys, "cancelled")]
        assert await _state(secure, apps) == "QUEUED"
        await mallory.done_writing()
        assert await mallory.read() == grpc.aio.EOF  # (nothing followed is left)
        # Its submitter and a `tasks` operator are told of it; the anonymous are refused.
        calls = {who: opened(who) for who in ("app", "root")}
        for call in calls.values():
            await call.write(a.FollowTasksRequest(task_ids=[apps]))
        await _until_followed(secure, 2)
        cancel = a.CancelTaskRequest(task_id=apps)
        assert isinstance(await _status(secure, "CancelTask", cancel, "app"), a.TaskView)
        for who, call in calls.items():
            reply = await call.read()
            assert isinstance(reply, a.FollowTasksReply), who
            assert ([v.task_id for v in reply.ended], list(reply.refused)) == ([apps], []), who
            call.cancel()
        anonymous = opened(None)
        await anonymous.write(a.FollowTasksRequest(task_ids=[apps]))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anonymous.read()
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # Each task's decision is the access guard's, recorded as its other decisions are.
        await secure.coordinator.events.flush()
        decided = [
            (e.details["object"], e.details["allowed"], e.details["reason"])
            for e in await secure.coordinator.events.read(after=0, limit=10_000)
            if e.event_type == "access.decided"
            and e.details["action"] == "/apiary.v1.TaskQueryService/FollowTasks"
            and e.details["object"]
        ]
        assert [d[:2] for d in decided].count((apps, False)) == 1  # mallory's
        assert (mallorys, True, "its owner") in decided
        assert [d[:2] for d in decided].count((apps, True)) == 2  # its submitter and root


async def test_a_client_waits_for_its_own_tasks_and_is_refused_others_as_by_wait_task(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        apps, mallorys = await _two_submitters(secure)
        address = str(secure.coordinator.grpc_address)
        as_mallory = Client(address, metadata=dict(secure.metadata("mallory")))
        async with as_mallory as client:
            with pytest.raises(PermissionDeniedError):
                await client.task(apps).result(timeout=5)
            with pytest.raises(NotFoundError):
                await client.task("nope").result(timeout=5)
            # Its own task's wait, on the same stream, is undisturbed.
            own = asyncio.create_task(client.task(mallorys).wait(timeout=10))
            await _status(secure, "CancelTask", a.CancelTaskRequest(task_id=mallorys), "mallory")
            assert (await own).error_code == "cancelled"
            assert client.task_waits.opened == 1 and client.task_waits.fallback is None
        assert await _state(secure, apps) == "QUEUED"


async def test_a_task_is_read_and_listed_by_its_submitter_not_by_other_principals(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        apps, mallorys = await _two_submitters(secure)
        get = a.GetTaskRequest(task_id=apps)
        denied = grpc.StatusCode.PERMISSION_DENIED
        for who, expected in [
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("mallory", denied),
            ("alice", denied),  # the agent that runs it is not its submitter
            ("no-role", denied),
        ]:
            assert await _status(secure, "GetTask", get, who) == expected, who
        for who in ("app", "root"):
            found = await _status(secure, "GetTask", get, who)
            assert isinstance(found, a.TaskView) and found.params == b"{}", who

        async def listed(who: str, **fields: str) -> list[str]:
            answer = await _status(secure, "ListTasks", a.ListTasksRequest(**fields), who)
            assert isinstance(answer, a.ListTasksResponse), (who, answer)
            return [t.task_id for t in answer.tasks]

        # Each principal lists what it submitted; `tasks` operators list every task.
        assert await listed("app") == [apps]
        assert await listed("mallory") == [mallorys]
        assert await listed("no-role") == []
        assert await listed("alice") == []
        assert await listed("root") == [apps, mallorys]
        # An agent listing its own queue sees the tasks given to it, whoever submitted them;
        # naming another agent lists only what the caller submitted to it.
        assert await listed("alice", agent_id="alice") == [apps, mallorys]
        assert await listed("mallory", agent_id="alice") == [mallorys]
        assert await listed("app", agent_id="alice") == [apps]


async def test_only_the_agent_a_task_was_dispatched_to_reports_its_outcome(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        for agent in ("alice", "bob"):
            await secure.coordinator.registry.register({
                "agent_id": agent, "name": agent, "reasoning_connectors": ["builtin://rules"],
            })  # fmt: skip
        task_id = await _submitted(secure, "app")
        scheduler = secure.coordinator.scheduler
        assert scheduler is not None
        await scheduler.agent_ready("alice")
        assert await _state(secure, task_id) == "DISPATCHED"
        as_alice = a.CompleteTaskRequest(task_id=task_id, agent_id="alice", result_json="1")
        for who in ("mallory", "app", "root"):  # naming alice without being alice
            refused = await _status(secure, "CompleteTask", as_alice, who)
            assert refused == grpc.StatusCode.PERMISSION_DENIED, who
        as_bob = a.CompleteTaskRequest(task_id=task_id, agent_id="bob", result_json="1")
        assert await _status(secure, "CompleteTask", as_bob, "bob") == (
            grpc.StatusCode.PERMISSION_DENIED  # bob as itself, but the task is alice's
        )
        assert await _state(secure, task_id) == "DISPATCHED"
        done = await _status(secure, "CompleteTask", as_alice, "alice")
        assert isinstance(done, a.CompleteTaskResponse) and done.state == "COMPLETED"
        view = await _status(secure, "WaitTask", a.WaitTaskRequest(task_id=task_id), "app")
        assert isinstance(view, a.TaskView) and view.result_json == "1"


async def test_the_agent_a_shared_task_was_taken_back_from_cannot_complete_it(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        for agent in ("alice", "bob"):
            await secure.coordinator.registry.register({
                "agent_id": agent, "name": agent, "reasoning_connectors": ["builtin://rules"],
                "capabilities": ["review"],
            })  # fmt: skip
        scheduler = secure.coordinator.scheduler
        assert scheduler is not None
        await scheduler.agent_ready("alice")
        request = a.SubmitTaskRequest(capability="review", params=b"{}", scope="repo:app")
        reply = await secure.call(TASKS["SubmitTask"], request, "app")
        assert isinstance(reply, a.SubmitTaskReply) and reply.task.agent_id == "alice"
        task_id = reply.task.task_id
        await scheduler.agent_lost("alice", "missed heartbeats")
        await scheduler.agent_ready("bob")
        assert (await scheduler.find(task_id)).agent_id == "bob"
        late = a.CompleteTaskRequest(task_id=task_id, agent_id="alice", result_json='"late"')
        assert await _status(secure, "CompleteTask", late, "alice") == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await _state(secure, task_id) == "DISPATCHED"  # bob's, unchanged
        done = a.CompleteTaskRequest(task_id=task_id, agent_id="bob", result_json='"ok"', attempt=2)
        answer = await _status(secure, "CompleteTask", done, "bob")
        assert isinstance(answer, a.CompleteTaskResponse) and answer.state == "COMPLETED"


async def test_each_submission_of_a_call_is_decided_and_recorded_as_its_own_call(
    tmp_path: Path,
) -> None:
    """SubmitTasks: each item is decided under SubmitTask's rule by the access guard and
    recorded as a decision of SubmitTasks on it; another submitter's task id is refused for
    that item alone (task_id_conflict, its task not shown), the others go on; the anonymous
    are refused the call."""
    async with open_secure(tmp_path) as secure:
        apps, _ = await _two_submitters(secure)
        submit = TASKS["SubmitTasks"]

        def item(task_id: str, scope: str) -> a.SubmitTaskRequest:
            return a.SubmitTaskRequest(agent_id="alice", task_id=task_id, params=b"{}", scope=scope)

        request = a.SubmitTasksRequest(items=[item("m-1", "repo:m1"), item(apps, "repo:app")])
        anonymous = await _status(secure, "SubmitTasks", request, None)
        assert anonymous == grpc.StatusCode.UNAUTHENTICATED
        reply = await secure.call(submit, request, "mallory")
        assert isinstance(reply, a.SubmitTasksReply)
        mine, others = reply.outcomes
        assert (mine.submitted.task.task_id, mine.submitted.task.submitter) == ("m-1", "mallory")
        assert others.refused.error_code == "task_id_conflict"
        assert others.refused.details["differs"] == "submitter"
        assert not others.HasField("submitted")
        assert await _state(secure, apps) == "QUEUED"
        await secure.coordinator.events.flush()
        decided = [
            (e.details["object"], e.details["allowed"])
            for e in await secure.coordinator.events.read(after=0, limit=10_000)
            if e.event_type == "access.decided"
            and e.details["action"] == submit.path
            and e.details["object"]
        ]
        assert decided == [("m-1", True), (apps, True)]
