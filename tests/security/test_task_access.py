"""A task is its submitter's: in secure mode only it (or an operator with `tasks`) reads it,
lists it, waits for it, watches it and cancels it, and only the agent it was dispatched to
reports its outcome. Each refusal is permission_denied (unauthenticated for an anonymous
caller) and changes nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

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


async def test_a_task_is_read_and_listed_by_its_submitter_not_by_other_principals(
    tmp_path: Path,
) -> None:
    async with open_secure(tmp_path) as secure:
        await secure.coordinator.registry.register({
            "agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"],
        })  # fmt: skip
        apps = await _submitted(secure, "app")
        mallorys = await _submitted(secure, "mallory")
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
